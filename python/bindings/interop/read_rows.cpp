#include "read_rows.hpp"

#include <Python.h>

#include <span>
#include <string>
#include <vector>

#include <spindle/ring_copy.hpp>

#include "routed_dataset.hpp"

namespace py = pybind11;

namespace spindle::python {
namespace {

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
        const int64_t reading = ctx_.current_sample();
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

// The exception PyIter_Next left set, as an object carrying its traceback.
py::object fetch_exception() {
  PyObject *type, *value, *trace;
  PyErr_Fetch(&type, &value, &trace);
  PyErr_NormalizeException(&type, &value, &trace);
  if (trace != nullptr) PyException_SetTraceback(value, trace);
  Py_XDECREF(type);
  Py_XDECREF(trace);
  return py::reinterpret_steal<py::object>(value);
}

// dataset[item.indices[i]], the crash record naming the index first; a
// RoutedDataset (spindle.mix) is read through its schedule, without a Python
// call of its own.
py::object read_one(WorkerContext& ctx, const WorkItem& item, std::size_t i, py::handle dataset,
                    const RoutedDataset* routed) {
  const int64_t index = item.indices[i];
  ctx.set_sample(index);
  if (routed != nullptr) return routed->get(index);
  const auto key = py::reinterpret_steal<py::object>(PyLong_FromLongLong(index));
  if (!key) throw py::error_already_set();
  PyObject* sample = PyObject_GetItem(dataset.ptr(), key.ptr());
  if (sample == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(sample);
}

}  // namespace

py::object read_sample(WorkerContext& ctx, const WorkItem& item, std::size_t i, py::handle dataset) {
  return read_one(ctx, item, i, dataset, as_routed(dataset));
}

std::pair<py::list, std::vector<int64_t>> read_samples(WorkerContext& ctx, const WorkItem& item, py::handle dataset, py::object first) {
  // dataset[i] for each index, as a Python loop would call it, with the
  // crash record naming the sample being read.
  const std::size_t n = item.indices.size();
  const RoutedDataset* routed = as_routed(dataset);
  py::list samples(n);
  for (std::size_t i = 0; i < n; ++i) {
    py::object sample = i == 0 && !first.is_none() ? first : read_one(ctx, item, i, dataset, routed);
    PyList_SET_ITEM(samples.ptr(), static_cast<Py_ssize_t>(i), sample.release().ptr());
  }
  return {std::move(samples), std::vector<int64_t>(item.indices.begin(), item.indices.end())};
}

py::object read_rows(WorkerContext& ctx, WorkItem& item, py::handle dataset, const SampleRows& rows,
                     py::object first) {
  RowsAsRead batch(ctx, item, &rows);
  const RoutedDataset* routed = as_routed(dataset);
  for (std::size_t i = 0; i < item.indices.size(); ++i)
    batch.add(i == 0 && !first.is_none() ? std::move(first) : read_one(ctx, item, i, dataset, routed));
  if (batch.written() == item.indices.size()) return py::none();
  return py::make_tuple(batch.written(), batch.kinds(), batch.rest());
}

py::tuple read_stream_rows(WorkerContext& ctx, WorkItem& item, py::handle stream, py::object first,
                           std::size_t count, int64_t position, const SampleRows* rows) {
  RowsAsRead batch(ctx, item, rows);
  bool ended = false;
  py::object error = py::none();
  batch.add(std::move(first));
  for (std::size_t i = 1; i < count; ++i) {
    ctx.set_sample(position + static_cast<int64_t>(i));
    PyObject* got = PyIter_Next(stream.ptr());
    if (got == nullptr) {
      if (PyErr_Occurred())
        error = fetch_exception();  // the stream raised: handed back, with its traceback
      else
        ended = true;
      break;
    }
    batch.add(py::reinterpret_steal<py::object>(got));
  }
  return py::make_tuple(batch.read(), ended, error, batch.written(), batch.kinds(), batch.rest());
}

bool put_samples(WorkerContext& ctx, WorkItem& item, const SampleRows& rows, const py::list& samples) {
  SampleRows::Gathered gathered;  // released after the copy, with the GIL
  if (!rows.gather(samples, gathered)) return false;
  py::gil_scoped_release release;  // may reserve memory (fallocate)
  ctx.put_rows(item, rows.layout(), rows.structure(), gathered.rows);
  return true;
}

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

}  // namespace spindle::python
