// Loader (consumer side), Lease (a delivered batch) and WorkerContext (the
// worker side). Lambdas here convert types and release the GIL, nothing else.
#include <Python.h>
#include <cstddef>
#include <pybind11/stl.h>

#include <spindle/loader.hpp>
#include <spindle/ring_copy.hpp>

#include "register.hpp"

namespace py = pybind11;

namespace spindle::python {
namespace {

// The interpreter's own fork protocol: takes the import lock and the GIL's
// internals around fork and re-initializes threading state in the child,
// exactly as os.fork() does.
ForkHooks interpreter_fork_hooks() {
  return ForkHooks{[] { PyOS_BeforeFork(); }, [] { PyOS_AfterFork_Parent(); },
                   [] { PyOS_AfterFork_Child(); }};
}

WorkerMain python_worker_main(py::function fn) {
  return [fn = std::move(fn)](WorkerContext& ctx) -> int {
    // Runs in the forked child, which holds the GIL: fork happened while
    // the constructing thread held it.
    try {
      py::object rc = fn(py::cast(&ctx, py::return_value_policy::reference));
      return rc.is_none() ? 0 : rc.cast<int>();
    } catch (py::error_already_set& e) {
      e.restore();
      PyErr_Print();
      return 1;
    }
  };
}

// An epoch's sample order (any 1-D buffer of int64, e.g. a numpy array) cut
// into batches.
std::vector<int64_t> int64_vector(const py::buffer& buf, const char* name) {
  py::buffer_info info = buf.request();
  if (info.ndim != 1 || info.itemsize != 8 || (info.format != "l" && info.format != "q") ||
      (info.shape[0] > 1 && info.strides[0] != 8))
    throw py::value_error(std::string("spindle: ") + name + " must be a contiguous 1-D int64 array, got format '" +
                          info.format + "' with " + std::to_string(info.ndim) + " dimensions");
  const auto* p = static_cast<const int64_t*>(info.ptr);
  return std::vector<int64_t>(p, p + info.shape[0]);
}

// An epoch's sample order cut into batches: of batch_size each, or where
// `starts` (batch b = order[starts[b]:starts[b+1]]) says.
BatchPlan plan_from(const py::buffer& order, std::size_t batch_size, bool drop_last, const py::object& starts) {
  std::vector<int64_t> indices = int64_vector(order, "order");
  if (starts.is_none()) return BatchPlan::chunked(std::move(indices), batch_size, drop_last);
  std::vector<int64_t> s = int64_vector(starts, "starts");
  return BatchPlan(std::move(indices), std::vector<std::size_t>(s.begin(), s.end()));
}

// Copies each of `rows` (C-contiguous buffers of exactly row_bytes) into
// consecutive rows of `dst`. Returns false, copying nothing, if a row is not
// such a buffer (the caller then takes its general path).
bool gather_rows(const py::buffer& dst, const py::list& rows, std::size_t row_bytes) {
  py::buffer_info out = dst.request(/*writable=*/true);
  const std::size_t n = rows.size();
  if (static_cast<std::size_t>(out.size * out.itemsize) < n * row_bytes) return false;
  std::vector<Py_buffer> views(n);
  std::size_t taken = 0;
  bool ok = true;
  for (; taken < n; ++taken) {
    if (PyObject_GetBuffer(rows[taken].ptr(), &views[taken], PyBUF_C_CONTIGUOUS) != 0) {
      PyErr_Clear();
      ok = false;
      break;
    }
    if (static_cast<std::size_t>(views[taken].len) != row_bytes) {
      ++taken;
      ok = false;
      break;
    }
  }
  if (ok) {
    py::gil_scoped_release release;
    auto* base = static_cast<char*>(out.ptr);
    for (std::size_t i = 0; i < n; ++i) copy_into_ring(base + i * row_bytes, views[i].buf, row_bytes);
    ring_copy_fence();
  }
  for (std::size_t i = 0; i < taken; ++i) PyBuffer_Release(&views[i]);
  return ok;
}

}  // namespace

void register_loader(py::module_& m) {
  py::class_<Batch>(m, "Lease", py::buffer_protocol(),
                    "A delivered batch: its bytes stay valid, and its ring slot reserved, while this "
                    "object or any buffer made from it lives.")
      .def_buffer([](Batch& b) {
        return py::buffer_info(b.data().data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.data().size())}, {1}, /*readonly=*/false);
      })
      .def_property_readonly("batch_id", &Batch::batch_id)
      .def_property_readonly("count", [](const Batch& b) { return b.indices().size(); })
      .def_property_readonly("indices",
                             [](const Batch& b) { return std::vector<int64_t>(b.indices().begin(), b.indices().end()); })
      .def_property_readonly("copied_out", &Batch::copied_out);

  m.def("gather_rows", &gather_rows, py::arg("dst"), py::arg("rows"), py::arg("row_bytes"),
        "Copies C-contiguous buffers of row_bytes each into consecutive rows of dst with streaming "
        "stores; False (nothing copied) if a row is not such a buffer.");

  py::class_<WorkItem>(m, "WorkItem")
      .def_readonly("slot", &WorkItem::slot)
      .def_readonly("batch_id", &WorkItem::batch_id)
      .def_property_readonly("count", [](const WorkItem& w) { return w.indices.size(); });

  py::class_<WorkerContext>(m, "WorkerContext")
      .def_property_readonly("worker_id", &WorkerContext::worker_id)
      .def_property_readonly("num_workers", &WorkerContext::num_workers)
      .def("claim", &WorkerContext::claim, py::call_guard<py::gil_scoped_release>())
      .def("set_sample", &WorkerContext::set_sample, py::arg("index"))
      .def("commit", py::overload_cast<const WorkItem&>(&WorkerContext::commit), py::arg("item"))
      .def("commit", py::overload_cast<const WorkItem&, uint32_t>(&WorkerContext::commit), py::arg("item"),
           py::arg("count"))
      .def("exhausted", &WorkerContext::exhausted, py::arg("item"))
      .def("fail",
           [](WorkerContext& ctx, const WorkItem& item, py::bytes report) {
             ctx.fail(item, std::string_view(report));
           },
           py::arg("item"), py::arg("report"))
      .def("memory",
           [](WorkerContext& ctx) {
             RingHeader& h = ctx.ring().header();
             return py::memoryview::from_memory(static_cast<void*>(&h), static_cast<py::ssize_t>(h.total_bytes),
                                                /*readonly=*/false);
           },
           "The whole shared segment, writable.")
      .def("layout", [](WorkerContext& ctx) -> py::dict {
        const RingHeader& h = ctx.ring().header();
        py::dict d;
        d["indices_offset"] = h.indices_offset;
        d["payload_offset"] = h.payload_offset;
        d["slot_stride"] = h.slot_stride;
        d["slot_bytes"] = h.geometry.slot_bytes;
        d["batch_capacity"] = h.geometry.batch_capacity;
        // Where this worker records the sample it is producing (int64), so the
        // Python loop can update it with a plain store instead of a call.
        d["sample_record_offset"] = h.workers_offset +
                                    sizeof(WorkerRecord) * static_cast<uint64_t>(ctx.worker_id()) +
                                    offsetof(WorkerRecord, sample_index);
        return d;
      });

  py::class_<AttachedWorker>(m, "AttachedWorker",
                             "A spawned worker's mapping of the loader segment and its WorkerContext.")
      .def(py::init<int, int, pid_t>(), py::arg("segment_fd"), py::arg("worker_id"), py::arg("parent"))
      .def_property_readonly("context", &AttachedWorker::context, py::return_value_policy::reference_internal);

  py::class_<Loader>(m, "Loader")
      .def(py::init([](const py::buffer& order, bool drop_last, const py::object& starts, py::function worker_main,
                       int num_workers,
                       uint32_t batch_capacity, uint64_t slot_bytes, int prefetch_factor, bool in_order,
                       double timeout, std::optional<int64_t> max_threads, bool round_robin,
                       bool assign_in_turn, int first_worker, std::optional<std::vector<std::string>> spawn_argv,
                       std::vector<int> spawn_fds) {
             LoaderOptions o;
             o.num_workers = num_workers;
             o.batch_capacity = batch_capacity;
             o.slot_bytes = slot_bytes;
             o.prefetch_factor = prefetch_factor;
             o.in_order = in_order;
             o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout * 1000.0));
             o.max_threads = max_threads;
             o.round_robin = round_robin;
             o.assign_in_turn = assign_in_turn;
             o.first_worker = first_worker;
             if (spawn_argv)  // workers are new programs: nothing is forked, worker_main is unused
               return new Loader(o, plan_from(order, batch_capacity, drop_last, starts),
                                 SpawnSpec{*spawn_argv, std::move(spawn_fds)});
             // The GIL stays held: the fork hooks require it.
             return new Loader(o, plan_from(order, batch_capacity, drop_last, starts),
                               python_worker_main(std::move(worker_main)), interpreter_fork_hooks());
           }),
           py::kw_only(), py::arg("order"), py::arg("drop_last") = false, py::arg("starts") = py::none(),
           py::arg("worker_main"), py::arg("num_workers"),
           py::arg("batch_capacity"), py::arg("slot_bytes"), py::arg("prefetch_factor") = 2,
           py::arg("in_order") = true, py::arg("timeout") = 0.0, py::arg("max_threads") = py::none(),
           py::arg("round_robin") = false, py::arg("assign_in_turn") = false, py::arg("first_worker") = 0, py::arg("spawn_argv") = py::none(),
           py::arg("spawn_fds") = std::vector<int>{})
      .def("next",
           [](Loader& l) -> py::object {
             std::optional<Batch> b;
             {
               py::gil_scoped_release release;
               b = l.next();
             }
             if (!b) return py::none();
             return py::cast(std::move(*b));
           })
      .def("reset",
           [](Loader& l, const py::buffer& order, bool drop_last, const py::object& starts) {
             BatchPlan plan = plan_from(order, l.batch_capacity(), drop_last, starts);
             py::gil_scoped_release release;
             l.reset(std::move(plan));
           },
           py::kw_only(), py::arg("order"), py::arg("drop_last") = false, py::arg("starts") = py::none())
      .def("close", &Loader::close, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("plan", &Loader::plan)
      .def_property_readonly("worker_pids", &Loader::worker_pids)
      .def_property_readonly("num_batches", &Loader::num_batches)
      .def_property_readonly("num_slots", &Loader::num_slots)
      .def_property_readonly("copied_out", &Loader::copied_out);
}

}  // namespace spindle::python
