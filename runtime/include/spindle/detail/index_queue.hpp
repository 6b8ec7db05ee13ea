#pragma once
// IndexQueue: the work queue in shared memory. One producer (the consumer
// process posts work items), many claimers (worker processes).
//
// Layout (in the loader's segment, written once by the consumer at creation):
//   posted   : count of items ever posted. Written only by the consumer
//              (release) after it wrote the entry; workers sleep on it (futex).
//   claimed  : count of items ever claimed. Workers advance it by CAS; the
//              winner of the CAS from c to c+1 owns entry c.
//   closed   : 0 while running; the consumer sets 1 to make workers exit.
//   entries  : E atomic uint32 items, E = the power of two >= capacity; item n
//              lives at entries[n & (E - 1)], i.e. n mod E.
//              A claimer reads entry c *before* its CAS from c to c+1: after
//              the CAS the consumer may already reuse the entry.
// Wrap-around rule: the consumer never has more than `capacity` <= E items
// posted and unclaimed (an item names a ring slot, and there are `capacity`
// slots), so entry n is always claimed before n + E overwrites it. Counters are
// uint32 and compared by difference, which is exact across wrap-around. E is a
// power of two because it must divide 2^32: then n mod E runs on unbroken when
// n wraps to 0. With n % capacity and, say, capacity 3, items 2^32-1 and 2^32
// (= 0) both landed in entry 0, and a full queue lost one item at the wrap.
// No lock: a worker that dies at any point leaves the counters consistent
// (either it won the CAS and owns the item, or it did not).

#include <atomic>
#include <bit>
#include <chrono>
#include <new>
#include <cstddef>
#include <cstdint>
#include <optional>

#include <spindle/detail/futex.hpp>

namespace spindle::detail {

inline constexpr std::size_t kCacheLine = 64;

class IndexQueue {
 public:
  static std::size_t bytes_for(uint32_t capacity) noexcept {
    return sizeof(IndexQueue) + sizeof(std::atomic<uint32_t>) * entries_for(capacity);
  }

  // Placement-initializes a queue at `mem` (bytes_for(capacity) bytes).
  // Items are numbered from `first_item`: the loader starts at 0; tests and
  // the fuzzer start just below UINT32_MAX to cross the counters' wrap-around
  // in a few posts instead of 2^32.
  static IndexQueue* create(void* mem, uint32_t capacity, uint32_t first_item = 0) noexcept {
    auto* q = new (mem) IndexQueue();
    q->capacity_ = capacity;
    q->mask_ = static_cast<uint32_t>(entries_for(capacity) - 1);
    q->posted_.store(first_item, std::memory_order_relaxed);
    q->claimed_.store(first_item, std::memory_order_relaxed);
    return q;
  }

  // Consumer only. Precondition: fewer than capacity items outstanding.
  void post(uint32_t item) noexcept {
    uint32_t n = posted_.load(std::memory_order_relaxed);
    entries()[n & mask_].store(item, std::memory_order_relaxed);
    posted_.store(n + 1, std::memory_order_release);
    detail::futex_wake(&posted_, 1);
  }

  // Any worker. Returns the next item, or nullopt when none is posted.
  // `announce`, if given, is set to each item before the CAS that may win it:
  // a claimer that dies right after winning has named its item (a lost
  // worker's item is found again; Loader, loader_supervision.cpp).
  [[nodiscard]] std::optional<uint32_t> try_claim(std::atomic<int32_t>* announce = nullptr) noexcept {
    uint32_t c = claimed_.load(std::memory_order_acquire);
    while (c != posted_.load(std::memory_order_acquire)) {
      // Read the entry before the CAS: once claimed_ moves past c the consumer
      // may legally post item c + E (E = mask_ + 1) into this very entry.
      const uint32_t item = entries()[c & mask_].load(std::memory_order_relaxed);
      if (announce) announce->store(static_cast<int32_t>(item), std::memory_order_release);
      if (claimed_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel)) return item;
    }
    return std::nullopt;
  }

  // Consumer only: whether `item` is posted and not claimed yet. A claimer
  // may win it meanwhile; an item that is not held stays so.
  bool holds(uint32_t item) const noexcept {
    const uint32_t p = posted_.load(std::memory_order_acquire);
    for (uint32_t c = claimed_.load(std::memory_order_acquire); c != p; ++c)
      if (entries()[c & mask_].load(std::memory_order_relaxed) == item) return true;
    return false;
  }

  // Sleeps until something is posted, the queue closes, or `timeout` passes.
  void wait(std::chrono::microseconds timeout) noexcept {
    uint32_t p = posted_.load(std::memory_order_acquire);
    if (p != claimed_.load(std::memory_order_acquire) || is_closed()) return;
    detail::futex_wait(&posted_, p, timeout);
  }

  // Wakes every sleeping claimer (one was asked to retire: WorkerRecord::retire).
  void wake_all() noexcept { detail::futex_wake(&posted_); }

  void close() noexcept {
    closed_.store(1, std::memory_order_release);
    // Sleepers wake and see `closed`; a worker that checks just before the
    // store sleeps at most its poll timeout.
    detail::futex_wake(&posted_);
  }
  bool is_closed() const noexcept { return closed_.load(std::memory_order_acquire) != 0; }

  uint32_t outstanding() const noexcept {
    return posted_.load(std::memory_order_acquire) - claimed_.load(std::memory_order_acquire);
  }
  uint32_t capacity() const noexcept { return capacity_; }

 private:
  IndexQueue() = default;
  // A power of two (see the wrap-around rule); up to 2^32 for any uint32 capacity.
  static uint64_t entries_for(uint32_t capacity) noexcept { return std::bit_ceil(uint64_t{capacity}); }
  // Atomic: a claimer may read an entry while the consumer rewrites it (the
  // claimer's CAS then fails and it retries).
  std::atomic<uint32_t>* entries() noexcept { return reinterpret_cast<std::atomic<uint32_t>*>(this + 1); }
  const std::atomic<uint32_t>* entries() const noexcept {
    return reinterpret_cast<const std::atomic<uint32_t>*>(this + 1);
  }

  // Each counter on its own cache line: workers hammer `claimed_` with CAS,
  // the consumer writes `posted_`; sharing a line would make every post and
  // every claim bounce the other's line.
  alignas(kCacheLine) std::atomic<uint32_t> posted_{0};
  alignas(kCacheLine) std::atomic<uint32_t> claimed_{0};
  alignas(kCacheLine) std::atomic<uint32_t> closed_{0};
  uint32_t capacity_ = 0;
  uint32_t mask_ = 0;  // entries - 1; written once, at creation
};

static_assert(sizeof(IndexQueue) % kCacheLine == 0);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

}  // namespace spindle::detail
