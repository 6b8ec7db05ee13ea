// The consumer side: LoaderOptions (bound as an option struct), Loader, Batch
// (a delivered batch: a lease on its slot) and CloseOnDrop. Lambdas here
// convert types and release the GIL, nothing else; the fork protocol and the
// Python worker main are interop/.
#include <optional>
#include <string>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <spindle/loader.hpp>
#include <spindle/payload_parts.hpp>

#include "interop/convert.hpp"
#include "interop/fork_protocol.hpp"
#include "interop/python_worker.hpp"
#include "register.hpp"

namespace py = pybind11;

namespace spindle::python {
namespace {

// A Loader the last Python reference lets go of is closed here, in C++, with
// the GIL released while its workers stop, and no Python-level __del__ exists
// to do it: a signal handler (Ctrl-C's KeyboardInterrupt) that runs during a
// Python finalizer is printed and dropped ("Exception ignored in __del__"), so
// the program went on; from here it is raised in the code that dropped the
// loader. The Loader itself is deleted holding the GIL: its worker_main is a
// Python function.
struct CloseWithoutGil {
  void operator()(Loader* l) const {
    {
      py::gil_scoped_release release;
      l->close();
    }
    delete l;
  }
};

// What an owner of a Loader holds when others may share the Loader object:
// torch's `_workers` views keep it to read worker_exits, yet dropping the
// iterator (or a persistent torch DataLoader) must stop the workers. When
// this goes, the loader is closed (GIL released); the Loader object lives on
// while referenced, closed.
class CloseOnDrop {
 public:
  explicit CloseOnDrop(py::object loader) : loader_(std::move(loader)) { (void)loader_.cast<Loader&>(); }
  CloseOnDrop(const CloseOnDrop&) = delete;
  CloseOnDrop& operator=(const CloseOnDrop&) = delete;
  ~CloseOnDrop() {
    Loader& l = loader_.cast<Loader&>();
    py::gil_scoped_release release;
    l.close();
  }

 private:
  py::object loader_;  // released after the body, with the GIL held again
};

py::dict worker_dict(const WorkerStats& w) {
  py::dict d;
  d["worker"] = w.worker;
  d["pid"] = w.pid;
  d["busy_s"] = w.busy_s;
  d["samples"] = w.samples;
  d["bytes_fetched"] = w.bytes_fetched;
  d["batch"] = w.batch;
  d["sample"] = w.sample;
  d["busy_for_s"] = w.busy_for_s;
  return d;
}

// LoaderStats as the fronts' stats() return it: plain numbers, the workers as dicts.
py::dict stats_dict(const LoaderStats& s) {
  py::dict d;
  d["batches"] = s.batches;
  d["samples"] = s.samples;
  d["skipped"] = s.skipped;
  d["elapsed_s"] = s.elapsed_s;
  d["wait_s"] = s.wait_s();
  d["wait_p50_ms"] = s.wait_p50_ms();
  d["wait_p95_ms"] = s.wait_p95_ms();
  d["wait_max_ms"] = s.wait_max_ms();
  d["ring_slots"] = s.ring_slots;
  d["ring_ready"] = s.ring_ready;
  d["ring_in_flight"] = s.ring_in_flight;
  d["ring_leased"] = s.ring_leased;
  d["bytes_fetched"] = s.bytes_fetched;
  d["copied_out"] = s.copied_out;
  d["processes"] = s.processes;
  d["max_processes"] = s.max_processes;
  d["replaced"] = s.replaced;
  d["resize_reason"] = s.resize_reason;
  py::list workers;
  for (const WorkerStats& w : s.workers) workers.append(worker_dict(w));
  d["workers"] = workers;
  return d;
}

void register_stats(py::module_& m) {
  py::class_<LoaderStats>(m, "LoaderStats",
                          "What a Loader has done (loader_stats.hpp); to_dict() is what the fronts' stats() return.")
      .def(py::init<>())
      .def_readonly("batches", &LoaderStats::batches)
      .def_readonly("samples", &LoaderStats::samples)
      .def_readonly("skipped", &LoaderStats::skipped)
      .def_property_readonly("wait_s", &LoaderStats::wait_s)
      .def_property_readonly("wait_p50_ms", &LoaderStats::wait_p50_ms)
      .def_property_readonly("wait_p95_ms", &LoaderStats::wait_p95_ms)
      .def_property_readonly("wait_max_ms", &LoaderStats::wait_max_ms)
      .def("wait_quantile_ms", [](const LoaderStats& s, double q) { return s.wait.quantile_ms(q); }, py::arg("q"))
      .def("merge", &LoaderStats::merge, py::arg("other"),
           "Adds `other`'s counts (an earlier epoch's loader); keeps this one's ring and worker state.")
      .def("to_dict", &stats_dict);
}

}  // namespace

void register_loader(py::module_& m) {
  m.def("auto_workers", [] { return auto_workers(); },
        "The core's count for num_workers=\"auto\" on this process's usable cpus: the most processes of an "
        "adaptive loader, and the logical workers of adaptive streams (spindle.grain, a PipelineLoader's "
        "WebDataset stream).");
  m.attr("REPLACE_EACH_WORKER") = kReplaceEachWorker;
  m.def("replacement_limit", &replacement_limit, py::arg("num_workers"),
        "Lost workers replaced per epoch for a loader of `num_workers` workers (at least 3); what "
        "LoaderOptions.max_replacements = REPLACE_EACH_WORKER resolves to.");
  register_stats(m);  // before Loader, whose stats() returns one
  py::class_<LoaderOptions>(m, "LoaderOptions",
                            "How a Loader runs (loader.hpp): workers, slots, ordering, waiting and the thread "
                            "budget. Set the fields, then pass it to Loader.")
      .def(py::init<>())
      .def_readwrite("num_workers", &LoaderOptions::num_workers)
      .def_readwrite("batch_capacity", &LoaderOptions::batch_capacity, "Max samples per batch.")
      .def_readwrite("slot_bytes", &LoaderOptions::slot_bytes,
                     "Payload bytes reserved per slot up front (0: the minimum); slots grow up to max_batch_bytes.")
      .def_readwrite("max_batch_bytes", &LoaderOptions::max_batch_bytes, "The largest batch a slot may hold.")
      .def_readwrite("prefetch_factor", &LoaderOptions::prefetch_factor, "Batches in flight per worker.")
      .def_readwrite("in_order", &LoaderOptions::in_order, "Deliver by batch id; False: as they finish.")
      .def_property(
          "timeout", [](const LoaderOptions& o) { return timeout_seconds(o.timeout); },
          [](LoaderOptions& o, double seconds) { o.timeout = timeout_ms(seconds); },
          "Max wait for one batch, in seconds (0 or inf: forever).")
      .def_readwrite("max_threads", &LoaderOptions::max_threads, "User cap on tasks the loader adds (None: none).")
      .def_readwrite("round_robin", &LoaderOptions::round_robin,
                     "Streams: batch k is asked of worker k mod N until every worker's stream ends.")
      .def_readwrite("assign_in_turn", &LoaderOptions::assign_in_turn,
                     "Planned batches: batch k always goes to worker k mod N (as torch assigns them).")
      .def_readwrite("fed", &LoaderOptions::fed,
                     "Planned batches fed as the consumer draws them (Loader.feed, Loader.end_feed), as torch's "
                     "iterator draws its sampler.")
      .def_readwrite("logical_workers", &LoaderOptions::logical_workers,
                     "Round-robin and assign_in_turn: the data stays num_workers' as asked when the budget starts "
                     "fewer processes; logical worker l runs on process l mod P (WorkItem.stream).")
      .def_readwrite("first_worker", &LoaderOptions::first_worker, "Round-robin: the worker asked for batch 0.")
      .def_property(
          "budget_policy", [](const LoaderOptions& o) { return std::string(budget_policy_name(o.budget_policy)); },
          [](LoaderOptions& o, const std::string& name) { o.budget_policy = parse_budget_policy(name); },
          "When fewer tasks are free than num_workers: 'shrink', 'wait' or 'fail'.")
      .def_readwrite("max_skip_ratio", &LoaderOptions::max_skip_ratio,
                     "next() raises SkipRatioError once skipped samples exceed this share (None: no check).")
      .def_readwrite("stats", &LoaderOptions::stats,
                     "Keep statistics (Loader.stats()); off: nothing is measured (SPINDLE_STATS=0 for every loader).")
      .def_property(
          "stall_warning", [](const LoaderOptions& o) { return timeout_seconds(o.stall_warning); },
          [](LoaderOptions& o, double seconds) { o.stall_warning = timeout_ms(seconds); },
          "Seconds one next() may wait before a StallWarning names what the workers do (0: never).")
      .def_readwrite("max_replacements", &LoaderOptions::max_replacements,
                     "Lost workers started again per epoch, their batches posted again (0: a death closes the "
                     "loader with WorkerDiedError; REPLACE_EACH_WORKER: replacement_limit(the workers asked); "
                     "planned batches only).")
      .def_readwrite("adaptive", &LoaderOptions::adaptive,
                     "num_workers is the most processes (0: the core's choice); processes are added and "
                     "retired as the consumer waits or the workers idle (planned batches any worker takes). "
                     "Streams with logical workers: the change is advised (Loader.advised_processes).")
      .def_readwrite("processes", &LoaderOptions::processes,
                     "With logical_workers: the most processes to run the num_workers logical workers on "
                     "(0: num_workers). Adaptive where any worker takes any batch: the processes to start "
                     "with (0: the cores idle now).")
      .def_readwrite("reserve_tasks", &LoaderOptions::reserve_tasks,
                     "Tasks of the user's budget kept free for the consumer's own threads: held back from the "
                     "start's grant, and kept free while batches flow (processes retire).")
      .def_readwrite("worker_tasks", &LoaderOptions::worker_tasks,
                     "Tasks one worker process runs (its thread and its runtimes'): the start grants processes "
                     "at this rate under \"shrink\".")
      .def("__repr__", &describe);

  py::class_<Batch>(m, "Batch", py::buffer_protocol(),
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
      .def_property_readonly("kind",
                             [](const Batch& b) {
                               switch (b.kind()) {
                                 case PayloadKind::kArrays: return "arrays";
                                 case PayloadKind::kBytes: return "bytes";
                                 default: return "raw";
                               }
                             },
                             "'arrays' (fields laid out by a SlotLayout), 'bytes' (one byte string) or 'raw'.")
      .def_property_readonly("structure",
                             [](const Batch& b) { return py::bytes(b.structure().data(), b.structure().size()); },
                             "The structure bytes the worker sent with an 'arrays' batch.")
      .def_property_readonly("skipped", &Batch::skipped,
                             "Samples of this batch the worker could not read and replaced (on_error='skip').")
      .def_property_readonly("stream", &Batch::stream,
                             "Round-robin streams: the logical worker whose stream this batch is from (-1: planned).")
      .def_property_readonly("stream_position", &Batch::stream_position,
                             "Round-robin streams: where that stream stands after this batch (opaque; 0: the start). "
                             "A native pipeline starts its streams there again (pipeline_loader's stream_starts).")
      .def("arrays",
           [](py::object self) {
             Batch& b = self.cast<Batch&>();
             if (b.kind() != PayloadKind::kArrays) throw py::value_error("spindle: this batch holds no arrays");
             return field_arrays(b.layout(), b.data().data(), b.count(), self);
           },
           "The batch's fields as numpy arrays of `count` rows viewing the slot (they keep it reserved).")
      .def("bytes",
           [](py::object self) {
             Batch& b = self.cast<Batch&>();
             return py::array(py::dtype("|u1"), {static_cast<py::ssize_t>(b.data().size())}, {1},
                              b.data().data(), self);
           },
           "The payload in use as a uint8 array viewing the slot (a 'bytes' batch: its byte string).")
      .def("parts",
           [](py::object self) {
             Batch& b = self.cast<Batch&>();
             if (b.kind() != PayloadKind::kBytes) throw py::value_error("spindle: this batch holds no parts");
             py::list out;
             for (const auto& p : read_parts(b.data()))
               out.append(py::array(py::dtype("|u1"), {static_cast<py::ssize_t>(p.size())}, {1}, p.data(), self));
             return out;
           },
           "A 'bytes' batch written as parts (WorkerContext.begin_parts): one uint8 array per part, viewing "
           "the slot (they keep it reserved).")
      .def_property_readonly("copied_out", &Batch::copied_out);

  py::class_<Loader, std::unique_ptr<Loader, CloseWithoutGil>>(m, "Loader")
      .def(py::init([](const LoaderOptions& options, const py::buffer& order, bool drop_last, const py::object& starts,
                       std::optional<py::function> worker_main, std::optional<std::vector<std::string>> spawn_argv,
                       std::vector<int> spawn_fds, std::vector<std::string> spawn_env) {
             LoaderOptions o = options;
             o.budget_poll = budget_poll();
             set_python_callbacks(o);
             // The GIL stays held: the fork hooks require it.
             return new Loader(o, plan_from(order, o.batch_capacity, drop_last, starts),
                               python_launcher(std::move(worker_main), std::move(spawn_argv), std::move(spawn_fds),
                                               std::move(spawn_env)));
           }),
           py::arg("options"), py::kw_only(), py::arg("order"), py::arg("drop_last") = false,
           py::arg("starts") = py::none(), py::arg("worker_main") = py::none(), py::arg("spawn_argv") = py::none(),
           py::arg("spawn_fds") = std::vector<int>{}, py::arg("spawn_env") = std::vector<std::string>{},
           "Starts the workers: forked, each running worker_main(ctx), or spawned from spawn_argv (handed "
           "spawn_fds, with the NAME=value entries of spawn_env in their environment; worker_main unused), over `order` cut into batches of options.batch_capacity (or where "
           "`starts` says).")
      .def("next",
           [](Loader& l) -> py::object {
             std::optional<Batch> b;
             {
               py::gil_scoped_release release;
               // While waiting, let Python's signal handlers run (Ctrl-C
               // raises KeyboardInterrupt here, within one supervision period).
               b = l.next(next_poll());
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
      .def("feed",
           [](Loader& l, const py::buffer& order, const py::object& starts) {
             BatchPlan plan = plan_from(order, l.batch_capacity(), false, starts);
             py::gil_scoped_release release;
             l.feed(std::move(plan));
           },
           py::kw_only(), py::arg("order"), py::arg("starts") = py::none(),
           "Fed loaders: more batches of this epoch, after those fed so far (`order` cut where `starts` "
           "says, or into batches of batch_capacity).")
      .def("end_feed", &Loader::end_feed, py::call_guard<py::gil_scoped_release>(),
           "Fed loaders: no more batches this epoch; next() returns None once those fed are delivered.")
      .def("reset_streams",
           [](Loader& l, int first_worker, std::optional<std::vector<py::bytes>> messages) {
             std::vector<std::string> m;
             if (messages)
               for (const py::bytes& b : *messages) m.emplace_back(b);
             py::gil_scoped_release release;
             l.reset_streams(first_worker, std::move(m));
           },
           py::kw_only(), py::arg("first_worker") = 0, py::arg("messages") = py::none(),
           "Round-robin loaders: a new epoch of every worker's stream on the same workers; the first item "
           "each worker claims has new_stream set and carries messages[w].")
      .def("close",
           [](Loader& l, double grace) {
             l.close(grace_ms(grace));
           },
           py::arg("grace") = 1.0, py::call_guard<py::gil_scoped_release>(),
           "Stops the workers (busy ones get `grace` seconds before SIGKILL); safe from any thread (a "
           "next() waiting elsewhere returns None).")
      .def_property_readonly("closed", &Loader::closed)
      .def_property_readonly("plan", &Loader::plan)
      .def_property_readonly("requested_workers", &Loader::requested_workers,
                             "Workers asked for (plan.num_workers may be fewer under budget_policy=\"shrink\").")
      .def_property_readonly("num_logical_workers", &Loader::num_logical_workers,
                             "Streams / batch turns the data is defined by (requested_workers with "
                             "logical_workers, else plan.num_workers); reset_streams counts these.")
      .def_property_readonly("budget_note", &Loader::budget_note,
                             "One line with the numbers when the loader runs with fewer workers than asked, else ''.")
      .def_property_readonly("worker_pids", [](const Loader& l) { return l.worker_pids(); })
      .def_property_readonly("worker_exits", [](const Loader& l) { return l.worker_exits(); },
                             "How each worker ended (a WorkerExit), or None while it has not been reaped; kept "
                             "after close().")
      .def_property_readonly("num_batches", &Loader::num_batches)
      .def_property_readonly("num_slots", &Loader::num_slots)
      .def_property_readonly("copied_out", &Loader::copied_out)
      .def_property_readonly("processes", &Loader::processes,
                             "Worker processes running now (adaptive: between 1 and plan.num_workers).")
      .def_property_readonly("advised_processes", &Loader::advised_processes,
                             "Adaptive streams: the processes the controller wants the streams started again on "
                             "(0: none yet); the loader goes on as it is.")
      .def_property_readonly("replaced", &Loader::replaced,
                             "Workers started again in place of lost ones since the loader started.")
      .def("stats", &Loader::stats, py::call_guard<py::gil_scoped_release>(),
           "Counts since the loader started or reset_stats(), and the ring's and workers' state now "
           "(safe from any thread).")
      .def("reset_stats", &Loader::reset_stats, py::call_guard<py::gil_scoped_release>());

  py::class_<CloseOnDrop>(m, "CloseOnDrop",
                          "Closes `loader` when this object goes (no Python __del__: a signal handled in a "
                          "finalizer would be lost). Held by what owns a Loader that views may share.")
      .def(py::init<py::object>(), py::arg("loader"));
}

}  // namespace spindle::python
