// The worker side: WorkItem (a batch to produce), WorkerExit (how a worker
// ended), WorkerContext (what a worker main is handed) and AttachedWorker (a
// spawned worker's). Lambdas here convert types and release the GIL, nothing
// else; the row readers are interop/read_rows, the routed dataset
// (spindle.mix's schedule, read by them) interop/routed_dataset.
#include <span>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <spindle/loader.hpp>
#include <spindle/payload_parts.hpp>
#include <spindle/worker_context.hpp>

#include "interop/convert.hpp"
#include "interop/read_rows.hpp"
#include "interop/routed_dataset.hpp"
#include "register.hpp"

namespace py = pybind11;

namespace spindle::python {

void register_worker(py::module_& m) {
  py::class_<WorkItem>(m, "WorkItem")
      .def_readonly("slot", &WorkItem::slot)
      .def_readonly("batch_id", &WorkItem::batch_id)
      .def_property_readonly("count", [](const WorkItem& w) { return w.indices.size(); })
      .def_property_readonly("indices",
                             [](const WorkItem& w) {
                               return std::vector<int64_t>(w.indices.begin(), w.indices.end());
                             },
                             "The sample indices of this batch, in order.")
      .def_readonly("new_stream", &WorkItem::new_stream,
                    "Round-robin: the first item of a new epoch of this worker's stream (Loader.reset_streams): "
                    "start the stream again before producing it.")
      .def_property_readonly("message",
                             [](const WorkItem& w) {
                               return py::bytes(reinterpret_cast<const char*>(w.message.data()), w.message.size());
                             },
                             "With new_stream: the consumer's start message for this worker (b'' if none), "
                             "copied out of the slot.")
      .def_readonly("stream", &WorkItem::stream,
                    "The logical worker this item is for (round-robin or assign_in_turn); -1 for a batch any "
                    "worker may take.");

  py::class_<RoutedDataset>(m, "RoutedDataset",
                            "A map-style dataset whose element i is getters[sources[i]](indices[i]): spindle.mix's "
                            "schedule as the workers' row readers read it, without a Python call of the mix's own "
                            "per sample. The arrays are viewed (buffer protocol), not copied.")
      .def(py::init<const py::buffer&, const py::buffer&, const py::list&, std::vector<std::string>, std::string>(),
           py::arg("sources"), py::arg("indices"), py::arg("getters"), py::arg("names"), py::arg("about"),
           "sources: each element's source (1-D uint8 or uint32); indices: its index there (1-D int32 or int64); "
           "getters[j]: source j's bound __getitem__; names[j]: how errors name source j; about: what an "
           "IndexError adds after the length.")
      .def("__len__", &RoutedDataset::size)
      .def("__getitem__", &RoutedDataset::get, py::arg("i"),
           "Element i (negative: from the end); an exception from the source carries a note naming i, the "
           "source and its index; IndexError if i is out of range.")
      .def("locate", &RoutedDataset::locate, py::arg("i"), "(source, index in that source) of element i.")
      .def("describe", &RoutedDataset::describe, py::arg("i"),
           "The note an exception from element i's source gets: where in the mix element i is.");

  py::class_<WorkerExit>(m, "WorkerExit", "How a worker process ended.")
      .def_readonly("worker_id", &WorkerExit::worker_id)
      .def_readonly("pid", &WorkerExit::pid)
      .def_readonly("signaled", &WorkerExit::signaled, "True: killed by signal `code`; else exited with `code`.")
      .def_readonly("code", &WorkerExit::code, "The signal number if signaled, else the exit status (-1: unknown).")
      .def("describe", &WorkerExit::describe);

  py::class_<PartsWriter>(m, "PartsWriter", "Writes one item's payload of parts (WorkerContext.begin_parts).")
      .def(
          "allocate",
          [](py::object self, uint64_t bytes) {
            PartsWriter& writer = self.cast<PartsWriter&>();
            std::span<std::byte> room;
            {
              py::gil_scoped_release release;  // may reserve memory (fallocate)
              room = writer.allocate(bytes);
            }
            return py::array(py::dtype("|u1"), {static_cast<py::ssize_t>(room.size())}, {1}, room.data(), self);
          },
          py::arg("bytes"),
          "`bytes` of the slot after those handed out so far (64-byte aligned, the slot grown to hold them), "
          "as a uint8 array to fill; a part only once add()ed.")
      .def(
          "gather",
          [](py::object self, const std::vector<py::buffer>& pieces) {
            PartsWriter& writer = self.cast<PartsWriter&>();
            std::vector<py::buffer_info> infos;
            std::vector<std::span<const std::byte>> bytes;
            infos.reserve(pieces.size());
            bytes.reserve(pieces.size());
            for (const py::buffer& piece : pieces) {
              infos.push_back(piece.request());
              bytes.push_back(contiguous_bytes(infos.back(), "gather"));
            }
            std::span<std::byte> room;
            {
              py::gil_scoped_release release;
              room = writer.gather(bytes);
            }
            return py::array(py::dtype("|u1"), {static_cast<py::ssize_t>(room.size())}, {1}, room.data(), self);
          },
          py::arg("pieces"),
          "allocate() for the pieces back to back, copied in: a batch's samples stacked, as a uint8 array.")
      .def(
          "add",
          [](PartsWriter& writer, const py::buffer& data) {
            py::buffer_info info = data.request();
            const std::span<const std::byte> bytes = contiguous_bytes(info, "add");
            py::gil_scoped_release release;
            writer.add(bytes);
          },
          py::arg("data"),
          "The next part: in place if `data` lies in what allocate() handed out, else copied into the slot.")
      .def("finish", &PartsWriter::finish, "Writes the parts' trailer and the slot's descriptor; commit next.");

  py::class_<WorkerContext>(m, "WorkerContext")
      .def_property_readonly("worker_id", &WorkerContext::worker_id)
      .def_property_readonly("num_workers", &WorkerContext::num_workers)
      .def_property_readonly("logical_workers", &WorkerContext::logical_workers,
                             "The workers the data is defined by (>= num_workers); this process serves those l "
                             "with l % num_workers == worker_id.")
      .def("claim", &WorkerContext::claim, py::call_guard<py::gil_scoped_release>())
      .def("set_sample", &WorkerContext::set_sample, py::arg("index"))
      .def("begin_arrays",
           [](py::object self, WorkItem& item, const SlotLayout& layout, const py::bytes& structure) {
             WorkerContext& ctx = self.cast<WorkerContext&>();
             const std::string_view st(structure);
             std::span<std::byte> out;
             {
               py::gil_scoped_release release;  // may reserve memory (fallocate)
               out = ctx.begin_arrays(item, layout, st);
             }
             return field_arrays(layout, out.data(), layout.capacity(), self);
           },
           py::arg("item"), py::arg("layout"), py::arg("structure"),
           "Lays out the item's slot for `layout` (growing it if needed) and returns one full-capacity "
           "array per field, viewing the slot: write rows 0..count-1, then commit.")
      .def("read_sample",
           [](WorkerContext& ctx, const WorkItem& item, py::handle dataset) {
             return read_sample(ctx, item, 0, dataset);
           },
           py::arg("item"), py::arg("dataset"),
           "dataset[i] for the item's first index, stored in the crash record before it is read.")
      .def("read_samples", &read_samples,
           py::arg("item"), py::arg("dataset"), py::arg("first") = py::none(),
           "([dataset[i] for i in item.indices], item.indices), each index stored in the crash record before it "
           "is read; `first`, if given, is sample 0, already read (read_sample). An exception from dataset[i] "
           "propagates as it is (the record still names i).")
      .def("read_rows", &read_rows,
           py::arg("item"), py::arg("dataset"), py::arg("rows"), py::arg("first") = py::none(),
           "dataset[i] for each of the item's indices (the crash record naming each; `first`, if given, is "
           "sample 0, already read), copying every sample into the slot as it is read while they all match "
           "`rows` exactly (as put_samples takes them). None if the whole batch was written (commit it); else "
           "(written, kinds, rest): samples 0..written-1 are in the slot with `rows`' layout (kinds: a byte per "
           "field of each, what its leaf was: 0 array, 1 int, 2 float, 3 bool, 4 numpy scalar) and `rest` holds "
           "the others, from the first that does not match. An exception from dataset[i] propagates as it is.")
      .def("read_stream_rows", &read_stream_rows,
           py::arg("item"), py::arg("stream"), py::arg("first"), py::arg("count"), py::arg("position"),
           py::arg("rows").none(true),
           "A stream's batch: `first` (already read, at stream position `position`) and up to count - 1 more "
           "samples from next(stream) (the crash record naming each position), copied into the slot as read "
           "while they match `rows` exactly (None: kept, none copied). Returns (read, ended, error, written, "
           "kinds, rest): samples read; whether the stream ended; the exception the stream raised (None), "
           "which ends the read; then as read_rows: samples 0..written-1 in the slot, the kind of each of "
           "their leaves, and the samples kept from the first that did not match.")
      .def("put_samples", &put_samples,
           py::arg("item"), py::arg("rows"), py::arg("samples"),
           "Writes `samples` as the item's array batch if every one matches `rows` exactly (its containers; "
           "C-contiguous arrays of each field's dtype and shape; a Python bool/int/float or numpy scalar for a "
           "0-d field); False, writing nothing, if any does not (the caller's general path then names it).")
      .def("put_bytes",
           [](WorkerContext& ctx, WorkItem& item, const py::buffer& data) {
             py::buffer_info info = data.request();
             const std::span<const std::byte> bytes = contiguous_bytes(info, "put_bytes");
             py::gil_scoped_release release;
             ctx.put_bytes(item, bytes);
           },
           py::arg("item"), py::arg("data"), "Stores one byte string (e.g. a pickled batch) as the item's payload.")
      .def(
          "begin_parts", [](WorkerContext& ctx, WorkItem& item) { return PartsWriter(ctx, item); },
          py::arg("item"), py::keep_alive<0, 1>(), py::keep_alive<0, 2>(),
          "Starts the item's payload of parts (a pickle stream and its out-of-band buffers, "
          "payload_parts.hpp): allocate() room to stack tensors into, add() each part, finish(), then commit.")
      .def("sample_record",
           [](py::object self) {
             WorkerContext& ctx = self.cast<WorkerContext&>();
             std::atomic<int64_t>& word = ctx.sample_record();
             static_assert(sizeof(word) == sizeof(int64_t) && std::atomic<int64_t>::is_always_lock_free);
             return py::array(py::dtype("<i8"), {py::ssize_t{1}}, {py::ssize_t{8}},
                              reinterpret_cast<int64_t*>(&word), self);
           },
           "This worker's crash record (one int64: the sample being produced), as an array a loop can "
           "update with a plain store; the consumer reports it if the worker dies.")
      .def("commit", py::overload_cast<const WorkItem&>(&WorkerContext::commit), py::arg("item"))
      .def("commit", py::overload_cast<const WorkItem&, uint32_t>(&WorkerContext::commit), py::arg("item"),
           py::arg("count"))
      .def("exhausted", &WorkerContext::exhausted, py::arg("item"))
      .def("fail",
           [](WorkerContext& ctx, const WorkItem& item, py::bytes report) {
             ctx.fail(item, std::string_view(report), FailureKind::kPython);  // a pickled exception
           },
           py::arg("item"), py::arg("report"));

  py::class_<AttachedWorker>(m, "AttachedWorker",
                             "A spawned worker's mapping of the loader segment and its WorkerContext.")
      .def(py::init<int, int, pid_t>(), py::arg("segment_fd"), py::arg("worker_id"), py::arg("parent"))
      .def_property_readonly("context", &AttachedWorker::context, py::return_value_policy::reference_internal);
}

}  // namespace spindle::python
