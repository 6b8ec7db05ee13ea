// IndexQueue: the single-producer, many-claimer work queue in shared memory.
// Items are plain uint32 slot numbers, so instead of lifetime-tracking
// elements, exactly-once delivery is proven by counting every claim of every
// item: each count must end at 1.
#include <spindle/detail/index_queue.hpp>

#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "test_support.hpp"

namespace spindle {
using detail::IndexQueue;
using detail::kCacheLine;
namespace {

using spindle::testing::SharedMapping;

// A lost or duplicated item needs a claimer to be overtaken by the producer
// in a window of a few instructions, so the plain builds run many items to
// catch it; ThreadSanitizer flags the unordered accesses on far fewer, and
// runs every item many times slower.
#if defined(__SANITIZE_THREAD__)
constexpr uint32_t kThreadItems = 100000, kForkItems = 100000;
#elif defined(__SANITIZE_ADDRESS__)
constexpr uint32_t kThreadItems = 300000, kForkItems = 300000;
#else
constexpr uint32_t kThreadItems = 1000000, kForkItems = 300000;
#endif
using namespace std::chrono_literals;

// Claim tallies: a count of claims of items never posted, then one count per item.
struct Tally {
  alignas(kCacheLine) std::atomic<uint32_t> bad_items{0};

  static std::size_t bytes_for(uint32_t n) { return sizeof(Tally) + sizeof(std::atomic<uint32_t>) * n; }
  std::atomic<uint32_t>& count(uint32_t item) { return reinterpret_cast<std::atomic<uint32_t>*>(this + 1)[item]; }
  void record(uint32_t item, uint32_t n) {
    if (item < n) count(item).fetch_add(1, std::memory_order_relaxed);
    else bad_items.fetch_add(1, std::memory_order_relaxed);
  }
};

// One queue followed by its tally, in one MAP_SHARED mapping so that forked
// claimers share both with the test.
class SharedQueue {
 public:
  SharedQueue(uint32_t capacity, uint32_t items, uint32_t first_item = 0)
      : items_(items),
        tally_offset_((IndexQueue::bytes_for(capacity) + kCacheLine - 1) / kCacheLine * kCacheLine),
        map_(tally_offset_ + Tally::bytes_for(items)),
        queue_(IndexQueue::create(map_.data(), capacity, first_item)) {}

  IndexQueue& queue() const { return *queue_; }
  Tally& tally() const { return *map_.as<Tally>(tally_offset_); }
  uint32_t items() const { return items_; }

  // The producer: posts 0..items-1, never more than capacity outstanding, then closes.
  void post_all_then_close() const {
    for (uint32_t i = 0; i < items_; ++i) {
      while (queue_->outstanding() >= queue_->capacity()) std::this_thread::yield();
      queue_->post(i);
    }
    queue_->close();
  }

  // A claimer: claims until the queue is closed and drained; returns its claims.
  uint64_t claim_until_closed() const {
    uint64_t mine = 0;
    for (;;) {
      if (auto item = queue_->try_claim()) {
        tally().record(*item, items_);
        ++mine;
        continue;
      }
      if (queue_->is_closed()) {
        // The last posts may land between our empty try_claim and seeing `closed`.
        while (auto item = queue_->try_claim()) {
          tally().record(*item, items_);
          ++mine;
        }
        return mine;
      }
      queue_->wait(1ms);
    }
  }

  // Every item claimed exactly once, and nothing else claimed.
  void expect_each_item_claimed_once() const {
    EXPECT_EQ(tally().bad_items.load(), 0u) << "claims of items that were never posted";
    uint32_t lost = 0, duplicated = 0, first_bad = items_;
    for (uint32_t i = 0; i < items_; ++i) {
      const uint32_t c = tally().count(i).load();
      if (c == 0) ++lost;
      if (c > 1) ++duplicated;
      if (c != 1 && first_bad == items_) first_bad = i;
    }
    EXPECT_EQ(lost, 0u) << "items never claimed (first bad item " << first_bad << ")";
    EXPECT_EQ(duplicated, 0u) << "items claimed more than once (first bad item " << first_bad << ")";
    EXPECT_EQ(queue_->outstanding(), 0u);
  }

 private:
  uint32_t items_;
  std::size_t tally_offset_;
  SharedMapping map_;
  IndexQueue* queue_;
};

// Proves: items come out in post order across wrap-around, and outstanding() counts them.
TEST(IndexQueue, ClaimsInPostOrderAndCountsOutstanding) {
  SharedQueue sq(4, 0);
  IndexQueue& q = sq.queue();
  EXPECT_EQ(q.capacity(), 4u);
  EXPECT_FALSE(q.try_claim().has_value());
  for (uint32_t round = 0; round < 5; ++round) {  // 5 rounds of 4 wrap around the entries
    for (uint32_t i = 0; i < 4; ++i) q.post(100 * round + i);
    EXPECT_EQ(q.outstanding(), 4u);
    for (uint32_t i = 0; i < 4; ++i) {
      auto item = q.try_claim();
      ASSERT_TRUE(item.has_value());
      EXPECT_EQ(*item, 100 * round + i);
    }
    EXPECT_EQ(q.outstanding(), 0u);
    EXPECT_FALSE(q.try_claim().has_value());
  }
}

// Proves: a queue numbered from just below UINT32_MAX counts and orders items exactly across the wrap.
TEST(IndexQueue, CountsAndOrdersItemsAcrossCounterWrapAround) {
  SharedQueue sq(4, 0, UINT32_MAX - 5);
  IndexQueue& q = sq.queue();
  EXPECT_EQ(q.outstanding(), 0u);
  uint32_t next = 0;
  for (uint32_t round = 0; round < 4; ++round) {  // item numbers UINT32_MAX-5 .. 10
    for (uint32_t i = 0; i < 4; ++i) q.post(next + i);
    EXPECT_EQ(q.outstanding(), 4u);
    for (uint32_t i = 0; i < 4; ++i) EXPECT_EQ(q.try_claim(), std::optional<uint32_t>(next + i));
    EXPECT_EQ(q.outstanding(), 0u);
    EXPECT_FALSE(q.try_claim().has_value());
    next += 4;
  }
}

// Proves: with a capacity that is not a power of two, items posted around the uint32 wrap come out once each, in order.
TEST(IndexQueue, NonPowerOfTwoCapacityKeepsEveryItemAcrossCounterWrapAround) {
  // Regression (found by tests/fuzz/index_queue_fuzz): entries were indexed by
  // n % capacity, which jumps at the wrap unless capacity divides 2^32; with
  // capacity 3, items 2^32-1 and 2^32 (= 0) shared entry 0, so a full queue
  // lost one item and handed out another twice. Rings have S = N*prefetch + 2
  // slots, rarely a power of two.
  for (const uint32_t capacity : {3u, 5u, 6u, 7u, 11u, 18u, 66u}) {
    for (uint32_t before_wrap = 1; before_wrap <= capacity; ++before_wrap) {
      SharedQueue sq(capacity, 0, 0u - before_wrap);
      IndexQueue& q = sq.queue();
      for (uint32_t i = 0; i < capacity; ++i) q.post(1000 + i);  // full, straddling the wrap
      EXPECT_EQ(q.outstanding(), capacity);
      for (uint32_t i = 0; i < capacity; ++i)
        ASSERT_EQ(q.try_claim(), std::optional<uint32_t>(1000 + i))
            << "capacity " << capacity << ", " << before_wrap << " item(s) before the wrap";
      EXPECT_FALSE(q.try_claim().has_value());
    }
  }
}

// Proves: close() is visible to claimers and leaves posted items claimable.
TEST(IndexQueue, CloseKeepsPostedItemsClaimable) {
  SharedQueue sq(2, 0);
  IndexQueue& q = sq.queue();
  q.post(7);
  EXPECT_FALSE(q.is_closed());
  q.close();
  EXPECT_TRUE(q.is_closed());
  EXPECT_EQ(q.try_claim(), std::optional<uint32_t>(7));
  EXPECT_FALSE(q.try_claim().has_value());
}

// Proves: wait() returns at once when work is posted or the queue closed, else sleeps its timeout.
TEST(IndexQueue, WaitReturnsAtOnceWhenThereIsWorkOrTheQueueIsClosed) {
  SharedQueue sq(2, 0);
  IndexQueue& q = sq.queue();
  auto timed_wait = [&](std::chrono::milliseconds t) {
    const auto t0 = std::chrono::steady_clock::now();
    q.wait(t);
    return std::chrono::steady_clock::now() - t0;
  };
  EXPECT_GE(timed_wait(20ms), 15ms) << "an empty queue should sleep";
  q.post(1);
  EXPECT_LT(timed_wait(5s), 1s) << "a posted item should end the wait";
  ASSERT_TRUE(q.try_claim().has_value());
  q.close();
  EXPECT_LT(timed_wait(5s), 1s) << "a closed queue should end the wait";
}

// The producer, run from a SIGTRAP handler: posts the next item when there is room.
IndexQueue* g_trap_queue = nullptr;
uint32_t g_trap_next_item = 0;
std::atomic<int> g_traps{0};  // lock-free: safe to touch in a signal handler
void post_from_trap(int, siginfo_t*, void*) {
  g_traps.fetch_add(1);
  if (g_trap_queue->outstanding() < g_trap_queue->capacity()) g_trap_queue->post(g_trap_next_item++);
}

// Proves: try_claim returns the item its CAS won even when the producer reuses that entry at once.
TEST(IndexQueue, ClaimReturnsTheItemItWonWhenTheProducerRefillsTheEntryAtOnce) {
  // The deterministic form of the race the concurrency tests below hunt for: a
  // hardware watchpoint on the `claimed` counter traps right after the
  // claimer's CAS, and the trap handler plays the producer, which may post
  // item n + capacity into entry n % capacity as soon as item n is claimed.
  SharedQueue sq(4, 0);
  IndexQueue& q = sq.queue();
  // Find the `claimed` counter: the one word of the queue a claim changes.
  q.post(1000);
  std::vector<std::byte> before(sizeof(IndexQueue));
  std::memcpy(before.data(), &q, before.size());
  ASSERT_EQ(q.try_claim(), std::optional<uint32_t>(1000));
  std::size_t claimed_offset = sizeof(IndexQueue);
  for (std::size_t off = 0; off + 4 <= sizeof(IndexQueue); off += 4)
    if (std::memcmp(before.data() + off, reinterpret_cast<std::byte*>(&q) + off, 4) != 0) claimed_offset = off;
  ASSERT_LT(claimed_offset, sizeof(IndexQueue));

  perf_event_attr attr{};
  attr.type = PERF_TYPE_BREAKPOINT;
  attr.size = sizeof(attr);
  attr.bp_type = HW_BREAKPOINT_W;
  attr.bp_addr = reinterpret_cast<uint64_t>(reinterpret_cast<std::byte*>(&q) + claimed_offset);
  attr.bp_len = HW_BREAKPOINT_LEN_4;
  attr.sample_period = 1;
  attr.sigtrap = 1;  // SIGTRAP to this thread right after the write (Linux >= 5.13)
  attr.remove_on_exec = 1;
  attr.exclude_kernel = 1;
  attr.exclude_hv = 1;
  attr.disabled = 1;
  const int fd = static_cast<int>(syscall(SYS_perf_event_open, &attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC));
  if (fd < 0) GTEST_SKIP() << "no hardware watchpoints here (perf_event_open: " << std::strerror(errno) << ")";
  struct sigaction trap {}, old_trap{};
  trap.sa_sigaction = post_from_trap;
  trap.sa_flags = SA_SIGINFO;
  sigaction(SIGTRAP, &trap, &old_trap);

  for (uint32_t i = 1; i <= 4; ++i) q.post(i);  // full: items 1..4
  g_trap_queue = &q;
  g_trap_next_item = 5;
  g_traps = 0;
  ioctl(fd, PERF_EVENT_IOC_ENABLE, 0);
  const auto item = q.try_claim();  // claims item 1; the trap then posts item 5
  ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
  close(fd);
  sigaction(SIGTRAP, &old_trap, nullptr);
  if (g_traps == 0) GTEST_SKIP() << "the watchpoint never fired";

  EXPECT_EQ(g_traps, 1);
  EXPECT_EQ(item, std::optional<uint32_t>(1)) << "item 1 was lost (and the item returned will be claimed twice)";
  std::vector<uint32_t> rest;
  while (auto i = q.try_claim()) rest.push_back(*i);
  EXPECT_EQ(rest, (std::vector<uint32_t>{2, 3, 4, 5}));
}

// Proves: post() wakes a claimer asleep in wait() long before its timeout.
TEST(IndexQueueConcurrency, PostWakesASleepingClaimer) {
  SharedQueue sq(2, 1);
  IndexQueue& q = sq.queue();
  std::atomic<bool> got{false};
  std::chrono::steady_clock::time_point woke;
  std::thread claimer([&] {
    while (!q.try_claim()) q.wait(10s);
    woke = std::chrono::steady_clock::now();
    got.store(true);
  });
  std::this_thread::sleep_for(50ms);  // let it fall asleep
  const auto posted = std::chrono::steady_clock::now();
  q.post(0);
  claimer.join();
  EXPECT_TRUE(got.load());
  EXPECT_LT(woke - posted, 2s);
}

// Proves: competing claimer threads claim every item exactly once while a 4-entry ring wraps.
TEST(IndexQueueConcurrency, ThreadClaimersClaimEveryItemExactlyOnceAcrossWrapAround) {
  constexpr uint32_t kItems = kThreadItems;
  constexpr int kClaimers = 3;
  SharedQueue sq(4, kItems);
  std::atomic<uint64_t> total{0};
  std::vector<std::thread> claimers;
  for (int t = 0; t < kClaimers; ++t)
    claimers.emplace_back([&] { total.fetch_add(sq.claim_until_closed()); });
  sq.post_all_then_close();
  for (auto& t : claimers) t.join();
  EXPECT_EQ(total.load(), kItems);
  sq.expect_each_item_claimed_once();
}

// Proves: the same with claimers in forked processes over a MAP_SHARED mapping, as workers use it.
TEST(IndexQueueConcurrency, ForkedClaimersClaimEveryItemExactlyOnceAcrossWrapAround) {
  constexpr uint32_t kItems = kForkItems;
  constexpr int kClaimers = 3;
  SharedQueue sq(4, kItems);
  std::vector<pid_t> children;
  for (int c = 0; c < kClaimers; ++c) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0) << "fork failed";
    if (pid == 0) {
      (void)sq.claim_until_closed();
      _exit(0);
    }
    children.push_back(pid);
  }
  sq.post_all_then_close();
  for (pid_t pid : children) {
    const int status = spindle::testing::wait_child(pid, 30s);
    EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "claimer process " << pid << " did not exit cleanly (status " << status << ")";
  }
  sq.expect_each_item_claimed_once();
}

}  // namespace
}  // namespace spindle
