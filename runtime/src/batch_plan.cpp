#include <spindle/batch_plan.hpp>

#include <stdexcept>

#include <spindle/error.hpp>

namespace spindle {

BatchPlan::BatchPlan(const std::vector<std::vector<int64_t>>& batches) {
  starts_.reserve(batches.size() + 1);
  starts_.push_back(0);
  for (const auto& b : batches) {
    indices_.insert(indices_.end(), b.begin(), b.end());
    starts_.push_back(indices_.size());
  }
}

BatchPlan::BatchPlan(std::vector<int64_t> indices, std::vector<std::size_t> starts)
    : indices_(std::move(indices)), starts_(std::move(starts)) {
  bool ok = !starts_.empty() && starts_.front() == 0 && starts_.back() == indices_.size();
  for (std::size_t b = 1; ok && b < starts_.size(); ++b) ok = starts_[b - 1] <= starts_[b];
  if (!ok)
    SPINDLE_THROW(std::invalid_argument, "spindle: batch starts must rise from 0 to the number of indices (" +
                                             std::to_string(indices_.size()) + ")");
}

BatchPlan BatchPlan::chunked(std::vector<int64_t> order, std::size_t batch_size, bool drop_last) {
  if (batch_size == 0) SPINDLE_THROW(std::invalid_argument, "spindle: batch_size must be >= 1");
  BatchPlan p;
  const std::size_t n = drop_last ? order.size() / batch_size * batch_size : order.size();
  order.resize(n);
  p.indices_ = std::move(order);
  p.starts_.reserve(n / batch_size + 2);
  for (std::size_t s = 0; s < n; s += batch_size) p.starts_.push_back(s);
  p.starts_.push_back(n);
  return p;
}

void BatchPlan::append(const BatchPlan& more) {
  if (starts_.empty()) starts_.push_back(0);
  const std::size_t base = indices_.size();
  indices_.insert(indices_.end(), more.indices_.begin(), more.indices_.end());
  for (std::size_t b = 1; b < more.starts_.size(); ++b) starts_.push_back(base + more.starts_[b]);
}

}  // namespace spindle
