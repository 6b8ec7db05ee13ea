#pragma once
// Conversions between Python values and the core's types, shared by the
// register_<area> files: each check on a Python value is written once here.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/pybind11.h>

#include <spindle/loader.hpp>
#include <spindle/slot_layout.hpp>

namespace spindle::python {
// Seconds from Python (0 or inf: forever; NaN or negative: ValueError).
std::chrono::milliseconds timeout_ms(double timeout);
// And back: 0 (forever) stays 0.
double timeout_seconds(std::chrono::milliseconds timeout) noexcept;
// close(grace): seconds, clamped to [0, 1 h].
std::chrono::milliseconds grace_ms(double grace) noexcept;

// The bytes of a C-contiguous buffer (any format); ValueError naming `what`
// otherwise. The one contiguity check on a buffer handed to the runtime.
std::span<const std::byte> contiguous_bytes(const pybind11::buffer_info& info, const char* what);
// A contiguous 1-D int64 buffer (e.g. a numpy array) as a vector; ValueError
// naming `name` otherwise.
std::vector<int64_t> int64_vector(const pybind11::buffer& buf, const char* name);
// An epoch's sample order cut into batches: of batch_size each, or where
// `starts` (batch b = order[starts[b]:starts[b+1]]) says.
BatchPlan plan_from(const pybind11::buffer& order, std::size_t batch_size, bool drop_last,
                    const pybind11::object& starts);

// A Python-side (dtype string, shape) list as the core's field specs.
std::vector<FieldSpec> field_specs(const std::vector<std::pair<std::string, std::vector<int64_t>>>& fields);
// Arrays over a payload laid out by `layout`: `rows` rows of each field,
// viewing the memory (no copy), kept alive by `owner`; a byte field is a
// tuple (values uint8 [n bytes], offsets uint64 [rows + 1]).
pybind11::list field_arrays(const SlotLayout& layout, std::byte* payload, std::size_t rows, pybind11::handle owner);

// LoaderOptions as Python shows it (its __repr__).
std::string describe(const LoaderOptions& o);
}  // namespace spindle::python
