// Loader (consumer side), Lease (a delivered batch) and WorkerContext (the
// worker side). Lambdas here convert types and release the GIL, nothing else.
#include <Python.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <thread>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <spindle/loader.hpp>
#include <spindle/detail/batch_ring.hpp>
#include <spindle/detail/budget_ledger.hpp>
#include <spindle/detail/ring_copy.hpp>

#include "register.hpp"
#include "sample_rows.hpp"

namespace py = pybind11;

namespace spindle::python {

// The interpreter's own fork protocol: takes the import lock and the GIL's
// internals around fork and re-initializes threading state in the child,
// exactly as os.fork() does.
//
// Signals are blocked from before each fork until its hooks have run, in both
// processes: the interpreter runs Python at-fork callbacks there (logging's,
// concurrent.futures'), and a signal handler that ran inside one would have
// its exception printed and dropped (a Ctrl-C lost). A signal that arrives
// meanwhile is delivered when the mask is restored; one already pending is
// handled first, and its exception (KeyboardInterrupt) stops the start.
ForkHooks interpreter_fork_hooks() {
  struct Masks {
    sigset_t blocked;  // what the hooks block (and unblock again): not what was blocked before
  };
  auto masks = std::make_shared<Masks>();
  auto unblock = [masks] { pthread_sigmask(SIG_UNBLOCK, &masks->blocked, nullptr); };
  return ForkHooks{[masks] {
                     sigset_t all, before;
                     sigfillset(&all);
                     for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS})
                       sigdelset(&all, sig);  // faults are raised synchronously; blocked, they kill
                     pthread_sigmask(SIG_BLOCK, &all, &before);
                     sigemptyset(&masks->blocked);
                     for (int sig = 1; sig < NSIG; ++sig)
                       if (sigismember(&all, sig) == 1 && sigismember(&before, sig) == 0)
                         sigaddset(&masks->blocked, sig);
                     if (PyErr_CheckSignals() != 0) {
                       pthread_sigmask(SIG_UNBLOCK, &masks->blocked, nullptr);
                       throw py::error_already_set();
                     }
                     PyOS_BeforeFork();
                   },
                   [unblock] {
                     PyOS_AfterFork_Parent();
                     unblock();
                   },
                   [unblock] {
                     PyOS_AfterFork_Child();
                     unblock();
                   }};
}

std::chrono::milliseconds timeout_ms(double timeout) {
  if (std::isnan(timeout) || timeout < 0)
    throw py::value_error("spindle: timeout must be a non-negative number of seconds (0 or inf: wait forever)");
  if (std::isinf(timeout) || timeout * 1000.0 >= 9e15) return std::chrono::milliseconds(0);  // forever
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(timeout * 1000.0)));
}

namespace {

// The exit status sys.exit(code) asks for: None -> 0, an int -> it, anything
// else is printed to stderr -> 1 (Python's own rule).
int system_exit_code(const py::object& exc) {
  try {
    py::object code = exc.attr("code");
    if (code.is_none()) return 0;
    if (py::isinstance<py::int_>(code)) return code.cast<int>();
    py::print(code, py::arg("file") = py::module_::import("sys").attr("stderr"));
  } catch (py::error_already_set&) {
    PyErr_Clear();
  }
  return 1;
}

WorkerMain python_worker_main(py::function fn) {
  return [fn = std::move(fn)](WorkerContext& ctx) -> int {
    // Runs in the forked child, which holds the GIL: fork happened while
    // the constructing thread held it.
    try {
      py::object rc = fn(py::cast(&ctx, py::return_value_policy::reference));
      return rc.is_none() ? 0 : rc.cast<int>();
    } catch (py::error_already_set& e) {
      // sys.exit() in dataset code: the worker exits with its code, as a
      // multiprocessing child does. Not through PyErr_Print, which would call
      // Py_Exit and finalize the interpreter in a forked child (the consumer's
      // objects and atexit handlers run there; a Loader inherited from the
      // consumer crashed in its destructor).
      if (e.matches(PyExc_SystemExit)) return system_exit_code(e.value());
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

// dataset[item.indices[i]], the crash record naming the index first.
py::object read_sample(WorkerContext& ctx, const WorkItem& item, std::size_t i, py::handle dataset) {
  const int64_t index = item.indices[i];
  ctx.set_sample(index);
  const auto key = py::reinterpret_steal<py::object>(PyLong_FromLongLong(index));
  if (!key) throw py::error_already_set();
  PyObject* sample = PyObject_GetItem(dataset.ptr(), key.ptr());
  if (sample == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(sample);
}

// A batch written sample by sample as a worker reads it (read_rows,
// read_stream_rows): each sample that `rows` takes exactly is copied into
// its slot row at once and let go once the next one is read — freed right
// after the copy, the allocator's lock would wait for the copy's streaming
// stores to reach memory; a sample later lets them drain behind dataset[i+1].
// From the first sample it does not take (or with no `rows`), the samples
// are kept, for the general path.
class RowsAsRead {
 public:
  RowsAsRead(WorkerContext& ctx, WorkItem& item, const SampleRows* rows) : ctx_(ctx), item_(item), rows_(rows) {}

  void add(py::object sample) {
    const std::size_t i = written_ + static_cast<std::size_t>(py::len(rest_));
    copied_ = py::object();
    if (rest_.empty() && rows_ != nullptr && rows_->gather_one(sample.ptr(), one_)) {
      if (i == 0) {
        const int64_t reading =
            ctx_.ring().worker(static_cast<uint32_t>(ctx_.worker_id())).sample_index.load(std::memory_order_relaxed);
        ctx_.set_sample(-1);  // an error laying out the slot is the batch's, not a sample's
        {
          py::gil_scoped_release release;  // may reserve memory (fallocate)
          out_ = ctx_.begin_arrays(item_, rows_->layout(), rows_->structure());
        }
        ctx_.set_sample(reading);
      }
      ctx_.put_row(rows_->layout(), out_, i, one_.rows);
      kinds_.append(reinterpret_cast<const char*>(one_.kinds.data()), one_.kinds.size());
      ++written_;
      copied_ = std::move(sample);
    } else {
      rest_.append(sample);
    }
  }
  std::size_t read() const { return written_ + static_cast<std::size_t>(py::len(rest_)); }
  std::size_t written() const noexcept { return written_; }
  // SampleRows::Leaf of each written sample's fields, sample-major.
  py::bytes kinds() const { return py::bytes(kinds_); }
  py::list rest() const { return rest_; }

 private:
  WorkerContext& ctx_;
  WorkItem& item_;
  const SampleRows* rows_;
  SampleRows::Gathered one_;
  std::span<std::byte> out_;
  std::size_t written_ = 0;
  std::string kinds_;
  py::list rest_;
  py::object copied_;  // the last sample copied
};

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

// Arrays over a payload laid out by `layout`: `rows` rows of each field,
// viewing the memory (no copy), kept alive by `owner`.
py::list field_arrays(const SlotLayout& layout, std::byte* payload, std::size_t rows, py::handle owner) {
  py::list out;
  for (std::size_t i = 0; i < layout.num_fields(); ++i) {
    const FieldSpec& f = layout.field(i);
    std::vector<py::ssize_t> shape{static_cast<py::ssize_t>(rows)};
    shape.insert(shape.end(), f.shape.begin(), f.shape.end());
    std::vector<py::ssize_t> strides(shape.size());
    py::ssize_t step = static_cast<py::ssize_t>(layout.itemsize(i));
    for (std::size_t k = shape.size(); k-- > 0;) {
      strides[k] = step;
      step *= shape[k];
    }
    out.append(py::array(py::dtype(f.dtype), shape, strides, payload + layout.offset(i), owner));
  }
  return out;
}

// A Python-side (dtype string, shape) list as the core's field specs.
std::vector<FieldSpec> field_specs(const std::vector<std::pair<std::string, std::vector<int64_t>>>& fields) {
  std::vector<FieldSpec> specs;
  specs.reserve(fields.size());
  for (const auto& [dtype, shape] : fields) specs.push_back(FieldSpec{dtype, shape});
  return specs;
}

}  // namespace

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

std::function<void()> budget_poll() {
  return [] {
    {
      py::gil_scoped_release release;
      std::this_thread::sleep_for(BudgetLedger::kPollPeriod);
    }
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  };
}

void register_loader(py::module_& m) {
  m.attr("MIN_SLOT_BYTES") = BatchRing::kMinSlotStride;

  py::class_<SlotLayout>(m, "SlotLayout",
                         "How a batch of fields (dtype, per-sample shape) is laid out in a ring slot: one "
                         "C-contiguous block [capacity, *shape] per field, 64-byte aligned.")
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
      .def_property_readonly("copied_out", &Batch::copied_out);

  m.def("gather_rows", &gather_rows, py::arg("dst"), py::arg("rows"), py::arg("row_bytes"),
        "Copies C-contiguous buffers of row_bytes each into consecutive rows of dst with streaming "
        "stores; False (nothing copied) if a row is not such a buffer.");

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
                             "copied out of the slot.");

  py::class_<WorkerExit>(m, "WorkerExit", "How a worker process ended.")
      .def_readonly("worker_id", &WorkerExit::worker_id)
      .def_readonly("pid", &WorkerExit::pid)
      .def_readonly("signaled", &WorkerExit::signaled, "True: killed by signal `code`; else exited with `code`.")
      .def_readonly("code", &WorkerExit::code, "The signal number if signaled, else the exit status (-1: unknown).")
      .def("describe", &WorkerExit::describe);

  py::class_<WorkerContext>(m, "WorkerContext")
      .def_property_readonly("worker_id", &WorkerContext::worker_id)
      .def_property_readonly("num_workers", &WorkerContext::num_workers)
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
      .def("read_samples",
           [](WorkerContext& ctx, const WorkItem& item, py::handle dataset, py::object first) {
             // dataset[i] for each index, as a Python loop would call it, with
             // the crash record naming the sample being read.
             const std::size_t n = item.indices.size();
             py::list samples(n);
             for (std::size_t i = 0; i < n; ++i) {
               py::object sample = i == 0 && !first.is_none() ? first : read_sample(ctx, item, i, dataset);
               PyList_SET_ITEM(samples.ptr(), static_cast<Py_ssize_t>(i), sample.release().ptr());
             }
             return py::make_tuple(std::move(samples), std::vector<int64_t>(item.indices.begin(), item.indices.end()));
           },
           py::arg("item"), py::arg("dataset"), py::arg("first") = py::none(),
           "([dataset[i] for i in item.indices], item.indices), each index stored in the crash record before it "
           "is read; `first`, if given, is sample 0, already read (read_sample). An exception from dataset[i] "
           "propagates as it is (the record still names i).")
      .def("read_rows",
           [](WorkerContext& ctx, WorkItem& item, py::handle dataset, const SampleRows& rows,
              py::object first) -> py::object {
             // read_samples and put_samples in one pass (RowsAsRead).
             RowsAsRead batch(ctx, item, &rows);
             for (std::size_t i = 0; i < item.indices.size(); ++i)
               batch.add(i == 0 && !first.is_none() ? std::move(first) : read_sample(ctx, item, i, dataset));
             if (batch.written() == item.indices.size()) return py::none();
             return py::make_tuple(batch.written(), batch.kinds(), batch.rest());
           },
           py::arg("item"), py::arg("dataset"), py::arg("rows"), py::arg("first") = py::none(),
           "dataset[i] for each of the item's indices (the crash record naming each; `first`, if given, is "
           "sample 0, already read), copying every sample into the slot as it is read while they all match "
           "`rows` exactly (as put_samples takes them). None if the whole batch was written (commit it); else "
           "(written, kinds, rest): samples 0..written-1 are in the slot with `rows`' layout (kinds: a byte per "
           "field of each, what its leaf was: 0 array, 1 int, 2 float, 3 bool, 4 numpy scalar) and `rest` holds "
           "the others, from the first that does not match. An exception from dataset[i] propagates as it is.")
      .def("read_stream_rows",
           [](WorkerContext& ctx, WorkItem& item, py::handle stream, py::object first, std::size_t count,
              int64_t position, const SampleRows* rows) -> py::tuple {
             // read_rows for a stream: `first` (stream position `position`)
             // was read by the caller, up to count - 1 more come from
             // next(stream).
             RowsAsRead batch(ctx, item, rows);
             bool ended = false;
             py::object error = py::none();
             batch.add(std::move(first));
             for (std::size_t i = 1; i < count; ++i) {
               ctx.set_sample(position + static_cast<int64_t>(i));
               PyObject* got = PyIter_Next(stream.ptr());
               if (got == nullptr) {
                 if (PyErr_Occurred()) {  // the stream raised: handed back, with its traceback
                   PyObject *type, *value, *trace;
                   PyErr_Fetch(&type, &value, &trace);
                   PyErr_NormalizeException(&type, &value, &trace);
                   if (trace != nullptr) PyException_SetTraceback(value, trace);
                   Py_XDECREF(type);
                   Py_XDECREF(trace);
                   error = py::reinterpret_steal<py::object>(value);
                 } else {
                   ended = true;
                 }
                 break;
               }
               batch.add(py::reinterpret_steal<py::object>(got));
             }
             return py::make_tuple(batch.read(), ended, error, batch.written(), batch.kinds(), batch.rest());
           },
           py::arg("item"), py::arg("stream"), py::arg("first"), py::arg("count"), py::arg("position"),
           py::arg("rows").none(true),
           "A stream's batch: `first` (already read, at stream position `position`) and up to count - 1 more "
           "samples from next(stream) (the crash record naming each position), copied into the slot as read "
           "while they match `rows` exactly (None: kept, none copied). Returns (read, ended, error, written, "
           "kinds, rest): samples read; whether the stream ended; the exception the stream raised (None), "
           "which ends the read; then as read_rows: samples 0..written-1 in the slot, the kind of each of "
           "their leaves, and the samples kept from the first that did not match.")
      .def("put_samples",
           [](WorkerContext& ctx, WorkItem& item, const SampleRows& rows, const py::list& samples) {
             SampleRows::Gathered gathered;  // released after the copy, with the GIL
             if (!rows.gather(samples, gathered)) return false;
             py::gil_scoped_release release;  // may reserve memory (fallocate)
             ctx.put_rows(item, rows.layout(), rows.structure(), gathered.rows);
             return true;
           },
           py::arg("item"), py::arg("rows"), py::arg("samples"),
           "Writes `samples` as the item's array batch if every one matches `rows` exactly (its containers; "
           "C-contiguous arrays of each field's dtype and shape; a Python bool/int/float or numpy scalar for a "
           "0-d field); False, writing nothing, if any does not (the caller's general path then names it).")
      .def("put_bytes",
           [](WorkerContext& ctx, WorkItem& item, const py::buffer& data) {
             py::buffer_info info = data.request();
             if (!PyBuffer_IsContiguous(static_cast<Py_buffer*>(info.view()), 'C'))
               throw py::value_error("spindle: put_bytes needs a contiguous buffer");
             const std::span<const std::byte> bytes(static_cast<const std::byte*>(info.ptr),
                                                    static_cast<std::size_t>(info.size * info.itemsize));
             py::gil_scoped_release release;
             ctx.put_bytes(item, bytes);
           },
           py::arg("item"), py::arg("data"), "Stores one byte string (e.g. a pickled batch) as the item's payload.")
      .def("sample_record",
           [](py::object self) {
             WorkerContext& ctx = self.cast<WorkerContext&>();
             auto& rec = ctx.ring().worker(static_cast<uint32_t>(ctx.worker_id()));
             static_assert(sizeof(rec.sample_index) == sizeof(int64_t));
             return py::array(py::dtype("<i8"), {py::ssize_t{1}}, {py::ssize_t{8}},
                              reinterpret_cast<int64_t*>(&rec.sample_index), self);
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

  py::class_<Loader, std::unique_ptr<Loader, CloseWithoutGil>>(m, "Loader")
      .def(py::init([](const py::buffer& order, bool drop_last, const py::object& starts, py::function worker_main,
                       int num_workers,
                       uint32_t batch_capacity, uint64_t slot_bytes, std::optional<uint64_t> max_batch_bytes,
                       int prefetch_factor, bool in_order,
                       double timeout, std::optional<int64_t> max_threads, bool round_robin,
                       bool assign_in_turn, int first_worker, std::optional<std::vector<std::string>> spawn_argv,
                       std::vector<int> spawn_fds, const std::string& budget_policy) {
             LoaderOptions o;
             o.budget_policy = parse_budget_policy(budget_policy);
             o.budget_poll = budget_poll();
             o.num_workers = num_workers;
             o.batch_capacity = batch_capacity;
             o.slot_bytes = slot_bytes;
             if (max_batch_bytes) o.max_batch_bytes = *max_batch_bytes;
             o.prefetch_factor = prefetch_factor;
             o.in_order = in_order;
             o.timeout = timeout_ms(timeout);
             o.max_threads = max_threads;
             o.round_robin = round_robin;
             o.assign_in_turn = assign_in_turn;
             o.first_worker = first_worker;
             if (spawn_argv)  // workers are new programs: nothing is forked, worker_main is unused
               return new Loader(o, plan_from(order, batch_capacity, drop_last, starts),
                                 Launcher::spawn(SpawnSpec{*spawn_argv, std::move(spawn_fds)}));
             // The GIL stays held: the fork hooks require it.
             return new Loader(o, plan_from(order, batch_capacity, drop_last, starts),
                               Launcher::fork(python_worker_main(std::move(worker_main)), interpreter_fork_hooks()));
           }),
           py::kw_only(), py::arg("order"), py::arg("drop_last") = false, py::arg("starts") = py::none(),
           py::arg("worker_main"), py::arg("num_workers"),
           py::arg("batch_capacity"), py::arg("slot_bytes") = 0, py::arg("max_batch_bytes") = py::none(),
           py::arg("prefetch_factor") = 2,
           py::arg("in_order") = true, py::arg("timeout") = 0.0, py::arg("max_threads") = py::none(),
           py::arg("round_robin") = false, py::arg("assign_in_turn") = false, py::arg("first_worker") = 0, py::arg("spawn_argv") = py::none(),
           py::arg("spawn_fds") = std::vector<int>{}, py::arg("budget_policy") = "shrink")
      .def("next",
           [](Loader& l) -> py::object {
             std::optional<Batch> b;
             {
               py::gil_scoped_release release;
               // While waiting, let Python's signal handlers run (Ctrl-C
               // raises KeyboardInterrupt here, within one supervision period).
               b = l.next([] {
                 py::gil_scoped_acquire gil;
                 if (PyErr_CheckSignals() != 0) throw py::error_already_set();
               });
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
             l.close(std::chrono::milliseconds(static_cast<int64_t>(std::clamp(grace, 0.0, 3600.0) * 1000)));
           },
           py::arg("grace") = 1.0, py::call_guard<py::gil_scoped_release>(),
           "Stops the workers (busy ones get `grace` seconds before SIGKILL); safe from any thread (a "
           "next() waiting elsewhere returns None).")
      .def_property_readonly("closed", &Loader::closed)
      .def_property_readonly("plan", &Loader::plan)
      .def_property_readonly("requested_workers", &Loader::requested_workers,
                             "Workers asked for (plan.num_workers may be fewer under budget_policy=\"shrink\").")
      .def_property_readonly("budget_note", &Loader::budget_note,
                             "One line with the numbers when the loader runs with fewer workers than asked, else ''.")
      .def_property_readonly("worker_pids", [](const Loader& l) { return l.worker_pids(); })
      .def_property_readonly("worker_exits", [](const Loader& l) { return l.worker_exits(); },
                             "How each worker ended (a WorkerExit), or None while it has not been reaped; kept "
                             "after close().")
      .def_property_readonly("num_batches", &Loader::num_batches)
      .def_property_readonly("num_slots", &Loader::num_slots)
      .def_property_readonly("copied_out", &Loader::copied_out);

  py::class_<CloseOnDrop>(m, "CloseOnDrop",
                          "Closes `loader` when this object goes (no Python __del__: a signal handled in a "
                          "finalizer would be lost). Held by what owns a Loader that views may share.")
      .def(py::init<py::object>(), py::arg("loader"));
}

}  // namespace spindle::python
