#pragma once
// BatchPlan: the batches of one epoch, as sample indices back to back plus
// where each batch starts. Flat so that a shuffled epoch of millions of
// samples is one array, not a list per batch.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace spindle {

class BatchPlan {
 public:
  BatchPlan() = default;
  // One batch per inner vector (convenient for small, hand-made plans).
  BatchPlan(const std::vector<std::vector<int64_t>>& batches);  // NOLINT: implicit on purpose
  // Batch b is indices[starts[b], starts[b+1]); starts has one more entry
  // than there are batches, starts at 0 and ends at indices.size().
  BatchPlan(std::vector<int64_t> indices, std::vector<std::size_t> starts);
  // `order` cut into batches of `batch_size`; the last one may be shorter
  // unless `drop_last`.
  static BatchPlan chunked(std::vector<int64_t> order, std::size_t batch_size, bool drop_last = false);

  // Adds `more`'s batches after this plan's (a plan fed as the consumer draws it).
  void append(const BatchPlan& more);

  std::size_t size() const noexcept { return starts_.empty() ? 0 : starts_.size() - 1; }
  std::span<const int64_t> batch(std::size_t b) const noexcept {
    return {indices_.data() + starts_[b], starts_[b + 1] - starts_[b]};
  }

 private:
  std::vector<int64_t> indices_;
  std::vector<std::size_t> starts_;  // size() + 1 entries, starts_[0] == 0
};

}  // namespace spindle
