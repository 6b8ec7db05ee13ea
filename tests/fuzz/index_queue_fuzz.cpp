// libFuzzer target: IndexQueue against a FIFO model.
//
// One producer and up to four logical claimers take turns in one thread, in
// the order the input dictates; after every operation the queue must agree
// with a std::deque of the items posted and not yet claimed:
//   - every posted item is claimed exactly once, in post order (a claim must
//     return the model's front item, or nothing exactly when the model is empty);
//   - nothing is claimed that was not posted;
//   - outstanding() is exact, also when the uint32 counters wrap (the input
//     picks the first item number, near 0, INT32_MAX or UINT32_MAX);
//   - nothing is posted after close(), posted items stay claimable after it,
//     and wait() returns at once while there is work or the queue is closed.
// The queue lives in a buffer of exactly bytes_for(capacity) bytes, so
// AddressSanitizer reports an entry index outside it.
//
// Input bytes (see README.md): capacity, first item, claimers, then one byte
// per operation (low 3 bits: operation, high 5 bits: its argument).
#include <spindle/detail/index_queue.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>

#include "fuzz_support.hpp"

namespace {

using spindle::detail::IndexQueue;
using spindle::fuzz::AlignedBuffer;
using spindle::fuzz::ByteReader;

constexpr uint32_t kMaxCapacity = 64;
constexpr uint32_t kMaxClaimers = 4;

enum Op : uint8_t {
  kPost = 0,         // post one item if there is room
  kPostBurst = 1,    // post up to arg + 1 items while there is room
  kClaim = 2,        // claimer arg % N claims one
  kClaimBurst = 3,   // claimer arg % N claims up to arg + 1
  kWait = 4,         // claimer waits: at once if work/closed, else a 0 timeout
  kPostThenClaim = 5,// post one (if room) and claim one: walks the counters
  kFillThenDrain = 6,// post until full, then claim arg % (capacity + 1)
  kCloseOrIdle = 7,  // arg == 0: close; else a no-op (checks only)
};

constexpr const char* kOpNames[8] = {"post", "post burst", "claim", "claim burst",
                                     "wait", "post then claim", "fill then drain", "close or idle"};

struct Run {
  IndexQueue* q;
  uint32_t capacity;
  uint32_t claimers;
  std::deque<uint32_t> pending;  // posted, not yet claimed, in post order
  uint32_t next_seq = 0;         // items are numbered by post order (model side)
  uint64_t posted = 0, claimed = 0;
  bool closed = false;
  std::size_t op_index = 0;

  // Distinct for distinct seq (an odd multiplier is a bijection mod 2^32), and
  // not simply seq, so an entry that still holds an old item looks different.
  static uint32_t item_for(uint32_t seq) { return seq * 0x9E3779B1u + 0x7F4A7C15u; }

  bool room() const { return pending.size() < capacity; }

  void post() {
    // The consumer's contract: never more than `capacity` outstanding, and
    // nothing after close.
    if (closed || !room()) return;
    const uint32_t item = item_for(next_seq++);
    q->post(item);
    SPINDLE_FUZZ_TRACE("  post item #%u (%u)", next_seq - 1, item);
    pending.push_back(item);
    ++posted;
  }

  void claim(uint32_t who) {
    const std::optional<uint32_t> got = q->try_claim();
    SPINDLE_FUZZ_TRACE("  claimer %u claims %s%u", who, got ? "" : "nothing, model front ", got.value_or(0));
    if (pending.empty()) {
      SPINDLE_FUZZ_CHECK(!got.has_value(),
                         "op %zu: claimer %u got item %u from a queue the model says is empty "
                         "(posted %llu, claimed %llu): an item claimed twice or never posted",
                         op_index, who, got.value_or(0), static_cast<unsigned long long>(posted),
                         static_cast<unsigned long long>(claimed));
      return;
    }
    SPINDLE_FUZZ_CHECK(got.has_value(), "op %zu: claimer %u got nothing, but %zu item(s) are posted and unclaimed",
                       op_index, who, pending.size());
    SPINDLE_FUZZ_CHECK(*got == pending.front(),
                       "op %zu: claimer %u got item %u, expected %u (the oldest unclaimed item; "
                       "posted %llu, claimed %llu, capacity %u): lost, duplicated or out-of-order item",
                       op_index, who, *got, pending.front(), static_cast<unsigned long long>(posted),
                       static_cast<unsigned long long>(claimed), capacity);
    pending.pop_front();
    ++claimed;
  }

  void wait(uint32_t who) {
    using namespace std::chrono;
    if (!pending.empty() || closed) {
      // Must not sleep at all; a generous bound keeps a loaded machine from
      // failing it, a broken wait() sleeps the full 5 s.
      const auto t0 = steady_clock::now();
      q->wait(seconds(5));
      const auto took = duration_cast<milliseconds>(steady_clock::now() - t0).count();
      SPINDLE_FUZZ_CHECK(took < 2000, "op %zu: claimer %u slept %lld ms in wait() with %zu item(s) posted%s",
                         op_index, who, static_cast<long long>(took), pending.size(),
                         closed ? " on a closed queue" : "");
    } else {
      q->wait(microseconds(0));
    }
  }

  void check() const {
    SPINDLE_FUZZ_CHECK(q->outstanding() == pending.size(), "op %zu: outstanding() is %u, the model has %zu",
                       op_index, q->outstanding(), pending.size());
    SPINDLE_FUZZ_CHECK(q->is_closed() == closed, "op %zu: is_closed() is %d, the model says %d", op_index,
                       q->is_closed(), closed);
    SPINDLE_FUZZ_CHECK(q->capacity() == capacity, "op %zu: capacity() changed to %u from %u", op_index,
                       q->capacity(), capacity);
  }
};

uint32_t first_item_from(uint8_t b, uint32_t capacity) {
  const uint32_t k = b & 63u;
  switch (b >> 6) {
    case 0: return k;                             // the loader's start
    case 1: return UINT32_MAX - k;                // wraps after k + 1 posts
    case 2: return uint32_t{INT32_MAX} - k;       // the signed boundary
    default: return 0u - (k + 1) * capacity;      // wraps after a multiple of capacity posts
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size < 3) return 0;
  ByteReader in(data, size);
  const uint32_t capacity = 1 + in.next() % kMaxCapacity;
  const uint32_t first = first_item_from(in.next(), capacity);
  const uint32_t claimers = 1 + in.next() % kMaxClaimers;

  AlignedBuffer mem(IndexQueue::bytes_for(capacity), spindle::detail::kCacheLine);
  Run r{IndexQueue::create(mem.data(), capacity, first), capacity, claimers, {}};
  SPINDLE_FUZZ_TRACE("capacity %u, first item number %u, %u claimers", capacity, first, claimers);
  r.check();

  while (!in.empty()) {
    const uint8_t b = in.next();
    const uint32_t arg = b >> 3;
    const uint32_t who = arg % claimers;
    SPINDLE_FUZZ_TRACE("op %zu: %s, arg %u", r.op_index, kOpNames[b & 7], arg);
    switch (static_cast<Op>(b & 7)) {
      case kPost: r.post(); break;
      case kPostBurst:
        for (uint32_t i = 0; i <= arg; ++i) r.post();
        break;
      case kClaim: r.claim(who); break;
      case kClaimBurst:
        for (uint32_t i = 0; i <= arg; ++i) r.claim(who);
        break;
      case kWait: r.wait(who); break;
      case kPostThenClaim:
        r.post();
        r.claim(who);
        break;
      case kFillThenDrain:
        while (!r.closed && r.room()) r.post();
        for (uint32_t i = 0; i < arg % (capacity + 1); ++i) r.claim(who);
        break;
      case kCloseOrIdle:
        if (arg == 0) {
          r.q->close();
          r.closed = true;
        }
        break;
    }
    r.check();
    ++r.op_index;
  }

  // Drain: whatever is left comes out in order, then nothing.
  while (!r.pending.empty()) r.claim(0);
  r.claim(0);
  r.check();
  SPINDLE_FUZZ_CHECK(r.posted == r.claimed, "posted %llu items but claimed %llu",
                     static_cast<unsigned long long>(r.posted), static_cast<unsigned long long>(r.claimed));
  return 0;
}
