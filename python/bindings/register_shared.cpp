// The segments under spindle.shared's containers: SharedSegment (made and
// written once by the consumer, then sealed read-only) and SegmentView (the
// read-only mapping a process that did not fork from the maker opens from a
// descriptor). Both are buffers; converting is all this file does, the
// segments' lifetime rules are ShmSegment's (detail/shm_segment.hpp).
#include <memory>

#include <spindle/detail/shm_segment.hpp>

#include "register.hpp"

namespace py = pybind11;

namespace spindle::python {
namespace {

struct SealableSegment {
  std::unique_ptr<ShmSegment> segment;
  bool sealed = false;
};

}  // namespace

void register_shared(py::module_& m) {
  py::class_<SealableSegment>(m, "SharedSegment", py::buffer_protocol(),
                              "A shared memory segment without a name (unlinked at creation: nothing is left in "
                              "/dev/shm whatever ends the process), written once, then sealed read-only. Forked "
                              "processes inherit its mapping; others map it from its descriptor (SegmentView).")
      .def(py::init([](std::size_t bytes, const std::string& what) {
             py::gil_scoped_release release;
             return SealableSegment{std::make_unique<ShmSegment>(bytes, what), false};
           }),
           py::arg("bytes"), py::arg("what"),
           "A segment of `bytes`, backed now; SharedMemoryError (naming `what`) if /dev/shm is too full.")
      .def_buffer([](SealableSegment& s) {
        return py::buffer_info(s.segment->data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(s.segment->size())}, {1}, /*readonly=*/s.sealed);
      })
      .def("seal",
           [](SealableSegment& s) {
             s.segment->seal();
             s.sealed = true;
           },
           "Makes the mapping read-only here and in every process forked later. Buffers taken before stay "
           "writable in name only: a write through them faults.")
      .def_property_readonly("sealed", [](const SealableSegment& s) { return s.sealed; })
      .def_property_readonly("fd", [](const SealableSegment& s) { return s.segment->fd(); },
                             "Its descriptor (close-on-exec), to hand to a process that is not a fork.")
      .def_property_readonly("size", [](const SealableSegment& s) { return s.segment->size(); });

  py::class_<SegmentView>(m, "SegmentView", py::buffer_protocol(),
                          "A read-only mapping of a whole segment, from a descriptor of it (kept duplicated: "
                          "the caller may close theirs).")
      .def(py::init([](int fd) {
             py::gil_scoped_release release;
             return std::make_unique<SegmentView>(fd);
           }),
           py::arg("fd"))
      .def_buffer([](SegmentView& v) {
        return py::buffer_info(const_cast<std::byte*>(v.data()), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(v.size())}, {1}, /*readonly=*/true);
      })
      .def_property_readonly("fd", &SegmentView::fd)
      .def_property_readonly("size", &SegmentView::size);
}

}  // namespace spindle::python
