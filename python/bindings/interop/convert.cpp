#include "convert.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include <pybind11/numpy.h>

namespace py = pybind11;

namespace spindle::python {
namespace {
bool c_contiguous(const py::buffer_info& info) {
  return PyBuffer_IsContiguous(static_cast<Py_buffer*>(info.view()), 'C') != 0;
}
}  // namespace

std::chrono::milliseconds timeout_ms(double timeout) {
  if (std::isnan(timeout) || timeout < 0)
    throw py::value_error("spindle: timeout must be a non-negative number of seconds (0 or inf: wait forever)");
  if (std::isinf(timeout) || timeout * 1000.0 >= 9e15) return std::chrono::milliseconds(0);  // forever
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(timeout * 1000.0)));
}

double timeout_seconds(std::chrono::milliseconds timeout) noexcept {
  return static_cast<double>(timeout.count()) / 1000.0;
}

std::chrono::milliseconds grace_ms(double grace) noexcept {
  return std::chrono::milliseconds(static_cast<int64_t>(std::clamp(grace, 0.0, 3600.0) * 1000));
}

std::span<const std::byte> contiguous_bytes(const py::buffer_info& info, const char* what) {
  if (!c_contiguous(info))
    throw py::value_error(std::string("spindle: ") + what + " needs a contiguous buffer");
  return {static_cast<const std::byte*>(info.ptr), static_cast<std::size_t>(info.size * info.itemsize)};
}

std::vector<int64_t> int64_vector(const py::buffer& buf, const char* name) {
  py::buffer_info info = buf.request();
  if (info.ndim != 1 || info.itemsize != 8 || (info.format != "l" && info.format != "q") ||
      !c_contiguous(info))
    throw py::value_error(std::string("spindle: ") + name + " must be a contiguous 1-D int64 array, got format '" +
                          info.format + "' with " + std::to_string(info.ndim) + " dimensions");
  const auto* p = static_cast<const int64_t*>(info.ptr);
  return std::vector<int64_t>(p, p + info.shape[0]);
}

BatchPlan plan_from(const py::buffer& order, std::size_t batch_size, bool drop_last, const py::object& starts) {
  std::vector<int64_t> indices = int64_vector(order, "order");
  if (starts.is_none()) return BatchPlan::chunked(std::move(indices), batch_size, drop_last);
  std::vector<int64_t> s = int64_vector(starts, "starts");
  return BatchPlan(std::move(indices), std::vector<std::size_t>(s.begin(), s.end()));
}

std::vector<FieldSpec> field_specs(const std::vector<std::pair<std::string, std::vector<int64_t>>>& fields) {
  std::vector<FieldSpec> specs;
  specs.reserve(fields.size());
  for (const auto& [dtype, shape] : fields) specs.push_back(FieldSpec{dtype, shape});
  return specs;
}

py::list field_arrays(const SlotLayout& layout, std::byte* payload, std::size_t rows, py::handle owner) {
  py::list out;
  for (std::size_t i = 0; i < layout.num_fields(); ++i) {
    const FieldSpec& f = layout.field(i);
    if (f.kind == FieldKind::kBytes) {  // (values, offsets): the flat buffer and rows + 1 offsets
      const BytesColumn c = layout.bytes_column({payload, static_cast<std::size_t>(layout.bytes())}, i, rows);
      auto* values = const_cast<std::byte*>(c.values.data());
      auto* offsets = const_cast<uint64_t*>(c.offsets.data());
      out.append(py::make_tuple(
          py::array(py::dtype("|u1"), {static_cast<py::ssize_t>(c.values.size())}, {1}, values, owner),
          py::array(py::dtype("<u8"), {static_cast<py::ssize_t>(c.offsets.size())}, {8}, offsets, owner)));
      continue;
    }
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

std::string describe(const LoaderOptions& o) {
  std::ostringstream s;
  const auto opt = [&s](const auto& v) -> std::ostringstream& {
    if (v) s << *v;
    else s << "None";
    return s;
  };
  const auto flag = [](bool b) { return b ? "True" : "False"; };
  s << "LoaderOptions(num_workers=" << o.num_workers << ", batch_capacity=" << o.batch_capacity
    << ", slot_bytes=" << o.slot_bytes << ", max_batch_bytes=" << o.max_batch_bytes
    << ", prefetch_factor=" << o.prefetch_factor << ", in_order=" << flag(o.in_order)
    << ", timeout=" << timeout_seconds(o.timeout) << ", max_threads=";
  opt(o.max_threads) << ", round_robin=" << flag(o.round_robin) << ", assign_in_turn=" << flag(o.assign_in_turn)
                     << ", fed=" << flag(o.fed) << ", first_worker=" << o.first_worker << ", budget_policy='"
                     << budget_policy_name(o.budget_policy) << "', max_skip_ratio=";
  opt(o.max_skip_ratio) << ")";
  return s.str();
}

}  // namespace spindle::python
