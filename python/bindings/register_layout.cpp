// SlotLayout (how a batch's fields sit in a slot), SampleRows (a batch
// structure compiled for the row readers) and gather_rows. Lambdas here
// convert types and release the GIL, nothing else.
#include <pybind11/stl.h>

#include <spindle/slot_layout.hpp>

#include "interop/convert.hpp"
#include "interop/read_rows.hpp"
#include "interop/sample_rows.hpp"
#include "register.hpp"

namespace py = pybind11;

namespace spindle::python {

void register_layout(py::module_& m) {
  m.attr("MIN_SLOT_BYTES") = kMinSlotBytes;

  py::class_<SlotLayout> layout(m, "SlotLayout",
                                "How a batch of fields (dtype, per-sample shape) is laid out in a ring slot: one "
                                "C-contiguous block [capacity, *shape] per field, 64-byte aligned.");
  // The limits of a slot's descriptor, asked for by the front ends (a batch beyond them
  // travels pickled) instead of repeated there.
  layout.attr("MAX_FIELDS") = SlotLayout::kMaxFields;
  layout.attr("MAX_DIMS") = SlotLayout::kMaxDims;
  layout.attr("MAX_STRUCTURE_BYTES") = SlotLayout::kMaxStructureBytes;
  layout
      .def(py::init([](const std::vector<std::pair<std::string, std::vector<int64_t>>>& fields, uint32_t capacity) {
             return SlotLayout(field_specs(fields), capacity);
           }),
           py::arg("fields"), py::arg("capacity"))
      .def_property_readonly("capacity", &SlotLayout::capacity)
      .def_property_readonly("bytes", &SlotLayout::bytes)
      .def_property_readonly("offsets", [](const SlotLayout& l) {
        std::vector<uint64_t> o;
        for (std::size_t i = 0; i < l.num_fields(); ++i) o.push_back(l.offset(i));
        return o;
      })
      .def_static("dtype_itemsize", &SlotLayout::dtype_itemsize, py::arg("dtype"));

  py::class_<SampleRows>(m, "SampleRows",
                         "One batch structure compiled for WorkerContext.read_rows/put_samples: the walk over a "
                         "sample (containers, then leaves as fields in order), the slot layout and the structure "
                         "bytes.")
      .def(py::init<const py::list&, SlotLayout, py::bytes, const py::list&>(), py::arg("walk"), py::arg("layout"),
           py::arg("structure"), py::arg("scalar_types"))
      .def(
          "takes",
          [](const SampleRows& rows, py::handle sample) {
            SampleRows::Gathered one;
            return rows.gather_one(sample.ptr(), one);
          },
          py::arg("sample"), "True if `sample` matches this structure exactly (read_rows would copy it as it is).");

  m.def("gather_rows", &gather_rows, py::arg("dst"), py::arg("rows"), py::arg("row_bytes"),
        "Copies C-contiguous buffers of row_bytes each into consecutive rows of dst with streaming "
        "stores; False (nothing copied) if a row is not such a buffer.");
}

}  // namespace spindle::python
