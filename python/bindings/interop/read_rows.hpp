#pragma once
// A worker reading its batch's samples from a Python dataset (dataset[i]) or
// stream (next(it)) and writing them into its slot: the loops behind
// WorkerContext.read_sample / read_samples / read_rows / read_stream_rows /
// put_samples, with the crash record naming the sample being read. A dataset
// that is a RoutedDataset (spindle.mix) is read through its schedule.
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include <pybind11/pybind11.h>

#include <spindle/worker_context.hpp>

#include "sample_rows.hpp"

namespace spindle::python {

// dataset[item.indices[i]], the crash record naming the index first.
pybind11::object read_sample(WorkerContext& ctx, const WorkItem& item, std::size_t i, pybind11::handle dataset);

// ([dataset[i] for i in item.indices], item.indices); `first`, if not None,
// is sample 0, already read.
std::pair<pybind11::list, std::vector<int64_t>> read_samples(WorkerContext& ctx, const WorkItem& item,
                                                             pybind11::handle dataset, pybind11::object first);

// read_samples and put_samples in one pass (RowsAsRead): None if the whole
// batch was written, else (written, kinds, rest).
pybind11::object read_rows(WorkerContext& ctx, WorkItem& item, pybind11::handle dataset, const SampleRows& rows,
                           pybind11::object first);

// read_rows for a stream: `first` (stream position `position`) was read by
// the caller, up to count - 1 more come from next(stream). Returns (read,
// ended, error, written, kinds, rest).
pybind11::tuple read_stream_rows(WorkerContext& ctx, WorkItem& item, pybind11::handle stream, pybind11::object first,
                                 std::size_t count, int64_t position, const SampleRows* rows);

// Writes `samples` as the item's array batch if every one matches `rows`
// exactly; false, writing nothing, if any does not.
bool put_samples(WorkerContext& ctx, WorkItem& item, const SampleRows& rows, const pybind11::list& samples);

// Copies each of `rows` (C-contiguous buffers of exactly row_bytes) into
// consecutive rows of `dst`. Returns false, copying nothing, if a row is not
// such a buffer (the caller then takes its general path).
bool gather_rows(const pybind11::buffer& dst, const pybind11::list& rows, std::size_t row_bytes);

}  // namespace spindle::python
