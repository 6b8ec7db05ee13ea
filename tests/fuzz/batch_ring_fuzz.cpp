// libFuzzer target: BatchRing layout and the slot state machine, against a model.
//
// The input chooses a small geometry (slots, workers, batch capacity, slot
// bytes, round-robin), lays a ring out in a zeroed buffer of exactly
// bytes_for(g) bytes, and then plays the consumer, up to four workers and the
// user's leases in the order it dictates. Checked:
//   - layout: every region (header, queues, worker records, slot headers,
//     indices, payloads) as the accessors address it is 64-byte aligned
//     (payloads 4096), disjoint from every other and inside bytes_for(g); the
//     header's offsets and total agree with bytes_for; fresh records are idle;
//   - transitions: every state change goes through one table of the legal
//     (role, from, to) edges of batch_ring.hpp, and the ring must be in `from`
//     when its one legal writer makes it;
//   - after every operation every slot header, worker record, queue and the
//     `completed` counter equals the model, and the bytes between regions are
//     unchanged;
//   - a batch's indices and payload reach the consumer as the worker wrote
//     them, an error report as the worker wrote it, and a leased batch stays
//     intact until its lease is dropped (however many other batches pass
//     through the ring meanwhile).
// Uses only batch_ring.hpp and index_queue.hpp; geometry fields are set by
// name so fields added to RingGeometry/SlotHeader keep their defaults here.
//
// Input bytes (see README.md): 5 geometry bytes, then one byte per operation
// (low 3 bits: operation, high 5 bits: its argument).
#include <spindle/detail/batch_ring.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <optional>
#include <vector>

#include "fuzz_support.hpp"

namespace {

using spindle::detail::BatchRing;
using spindle::detail::IndexQueue;
using spindle::detail::kCacheLine;
using spindle::detail::RingGeometry;
using spindle::detail::RingHeader;
using spindle::detail::SlotHeader;
using spindle::detail::SlotState;
using spindle::detail::WorkerRecord;
using spindle::fuzz::ByteReader;
using spindle::fuzz::ZeroedMapping;

constexpr uint32_t kMaxSlots = 8;
constexpr uint32_t kMaxWorkers = 4;
// Around the 4 KiB page and the 64 KiB minimum stride, plus odd sizes; the
// input adds -128..127.
constexpr uint64_t kSlotBytes[8] = {0, 1, 4096, 65536, 65536 + 4096, 8000, 131072, 200000};

enum Op : uint8_t {
  kConsumerPost = 0,     // a free slot (arg picks which) gets a batch, posted to a queue
  kConsumerDeliver = 1,  // a ready/failed slot (arg picks which) is delivered or raised
  kLeaseDrop = 2,        // the user drops a lease (arg picks which)
  kWorkerClaim = 3,      // worker arg % N claims from its queue
  kWorkerSample = 4,     // worker arg % N writes its next sample
  kWorkerCommit = 5,     // worker commits (arg: lower the count / stream exhausted)
  kWorkerFail = 6,       // worker fails with a report (arg: its length)
  kCloseOrIdle = 7,      // arg == 0: consumer closes the queues; else worker arg % N waits (0 timeout)
};

constexpr const char* kOpNames[8] = {"consumer post", "consumer deliver", "lease drop",   "worker claim",
                                     "worker sample", "worker commit",    "worker fail", "close or idle"};
constexpr const char* kStateNames[6] = {"kFree", "kPosted", "kFilling", "kReady", "kFailed", "kLeased"};

enum class Role { kConsumer, kWorker, kLease };
const char* role_name(Role r) {
  return r == Role::kConsumer ? "consumer" : r == Role::kWorker ? "worker" : "lease";
}

// The state machine of batch_ring.hpp: each edge and the one role that may take it.
struct Edge {
  SlotState from, to;
  Role writer;
};
constexpr Edge kEdges[] = {
    {SlotState::kFree, SlotState::kPosted, Role::kConsumer},    // consumer posts a batch
    {SlotState::kPosted, SlotState::kFilling, Role::kWorker},   // the worker that won the claim
    {SlotState::kFilling, SlotState::kReady, Role::kWorker},    // commit (or stream exhausted)
    {SlotState::kFilling, SlotState::kFailed, Role::kWorker},   // fail
    {SlotState::kReady, SlotState::kLeased, Role::kConsumer},   // deliver
    {SlotState::kReady, SlotState::kFree, Role::kConsumer},     // skip an exhausted answer
    {SlotState::kFailed, SlotState::kFree, Role::kConsumer},    // raise the error
    {SlotState::kLeased, SlotState::kFree, Role::kLease},       // last lease dropped
};

struct ModelSlot {
  SlotState state = SlotState::kFree;
  int64_t batch_id = -1;
  int32_t worker = -1;
  uint32_t count = 0;
  uint32_t error_bytes = 0;
  uint32_t flags = 0;
  uint32_t posted_count = 0;  // indices the consumer wrote (a worker may lower `count` later)
  uint32_t queue = 0;         // the queue its batch was posted to
  uint32_t written = 0;  // samples the worker wrote
};

struct ModelWorker {
  int32_t pid = 0;
  int32_t slot = -1;
  int64_t batch_id = -1;
  int64_t sample_index = -1;
  bool ended = false;  // answered "exhausted": the consumer addresses it no more
};

// Byte patterns: sample i of a batch, the rest of a committed payload, an error report.
uint8_t sample_byte(int64_t batch, uint32_t i) { return static_cast<uint8_t>(batch * 131 + i * 7 + 1); }
uint8_t rest_byte(int64_t batch) { return static_cast<uint8_t>(~(batch * 29)); }
uint8_t report_byte(int64_t batch) { return static_cast<uint8_t>(batch * 53 + 0x5A); }
int64_t sample_index_of(int64_t batch, uint32_t i) { return batch * 1000 + i; }

// memcmp against a block of `v`: one sanitizer range check per 4 KiB instead of one per byte.
bool all_bytes(const std::byte* p, std::size_t n, uint8_t v) {
  std::byte block[4096];
  std::memset(block, v, sizeof block);
  for (std::size_t off = 0; off < n; off += sizeof block)
    if (std::memcmp(p + off, block, std::min(n - off, sizeof block)) != 0) return false;
  return true;
}

struct Region {
  const char* name;
  uint32_t index;
  uint64_t begin, end;
  uint64_t align;
};

class Run {
 public:
  Run(const RingGeometry& g, std::byte* base, std::size_t total)
      : g_(g), base_(base), total_(total), ring_(BatchRing::create(base, g)), slots_(g.num_slots),
        workers_(g.num_workers), queues_(1 + g.num_workers) {
    check_layout();
    for (uint32_t w = 0; w < g_.num_workers; ++w) {  // what the worker pool writes at fork
      workers_[w].pid = static_cast<int32_t>(1000 + w);
      ring_.worker(w).pid.store(workers_[w].pid);
    }
    check_model();
  }

  void step(uint8_t b) {
    const uint32_t arg = b >> 3;
    SPINDLE_FUZZ_TRACE("op %zu: %s, arg %u", op_, kOpNames[b & 7], arg);
    switch (static_cast<Op>(b & 7)) {
      case kConsumerPost: consumer_post(arg); break;
      case kConsumerDeliver: consumer_deliver(arg); break;
      case kLeaseDrop: lease_drop(arg); break;
      case kWorkerClaim: worker_claim(arg); break;
      case kWorkerSample: worker_sample(arg); break;
      case kWorkerCommit: worker_commit(arg); break;
      case kWorkerFail: worker_fail(arg); break;
      case kCloseOrIdle: arg == 0 ? consumer_close() : worker_idle(arg); break;
    }
    check_model();
    ++op_;
  }

 private:
  // --- the one door for state changes -------------------------------------
  void transition(Role who, uint32_t s, SlotState from, SlotState to) {
    bool legal = false;
    for (const Edge& e : kEdges) legal |= e.from == from && e.to == to && e.writer == who;
    SPINDLE_FUZZ_CHECK(legal, "op %zu: %s moves slot %u %u -> %u, not an edge of the state machine", op_,
                       role_name(who), s, static_cast<unsigned>(from), static_cast<unsigned>(to));
    SPINDLE_FUZZ_CHECK(ring_.state(s) == from && slots_[s].state == from,
                       "op %zu: %s moves slot %u from %u, but the ring has it in %u (model %u)", op_,
                       role_name(who), s, static_cast<unsigned>(from), static_cast<unsigned>(ring_.state(s)),
                       static_cast<unsigned>(slots_[s].state));
    SPINDLE_FUZZ_TRACE("  %s: slot %u (batch %lld) %s -> %s", role_name(who), s,
                       static_cast<long long>(slots_[s].batch_id), kStateNames[static_cast<unsigned>(from)],
                       kStateNames[static_cast<unsigned>(to)]);
    if (who == Role::kWorker && to != SlotState::kFilling) {
      ring_.publish(s, to);  // the worker's commit/fail: state, then `completed`
      ++completed_;
    } else {
      ring_.set_state(s, to);
    }
    slots_[s].state = to;
  }

  std::vector<uint32_t> slots_in(SlotState a, std::optional<SlotState> b = std::nullopt) const {
    std::vector<uint32_t> v;
    for (uint32_t s = 0; s < g_.num_slots; ++s)
      if (slots_[s].state == a || (b && slots_[s].state == *b)) v.push_back(s);
    return v;
  }
  IndexQueue& queue_of_worker(uint32_t w) const { return ring_.queue_of(w); }
  uint32_t model_queue_of(uint32_t w) const { return g_.round_robin ? 1 + w : 0; }

  // --- consumer -------------------------------------------------------------
  void consumer_post(uint32_t arg) {
    if (closed_) return;
    const std::vector<uint32_t> free = slots_in(SlotState::kFree);
    if (free.empty()) return;  // every slot is in flight or leased: the consumer waits
    uint32_t q = 0;
    if (g_.round_robin) {  // addressed to a worker whose stream has not ended, from arg on
      std::optional<uint32_t> target;
      for (uint32_t i = 0; i < g_.num_workers && !target; ++i)
        if (!workers_[(arg + i) % g_.num_workers].ended) target = (arg + i) % g_.num_workers;
      if (!target) return;
      q = 1 + *target;
    }
    const uint32_t s = free[arg % free.size()];
    ModelSlot& m = slots_[s];
    m.batch_id = next_batch_++;
    m.count = m.posted_count = g_.batch_capacity - arg % g_.batch_capacity;
    m.worker = -1;
    m.error_bytes = 0;
    m.flags = 0;
    m.queue = q;
    m.written = 0;
    SlotHeader& h = ring_.slot(s);
    h.batch_id = m.batch_id;
    h.count = m.count;
    h.worker = -1;
    h.error_bytes = 0;
    h.flags = 0;
    for (uint32_t i = 0; i < m.count; ++i) ring_.indices(s)[i] = sample_index_of(m.batch_id, i);
    transition(Role::kConsumer, s, SlotState::kFree, SlotState::kPosted);
    // The wrap-around rule's precondition: never more than num_slots outstanding.
    SPINDLE_FUZZ_CHECK(ring_.queue(q).outstanding() < g_.num_slots, "op %zu: queue %u already holds %u items",
                       op_, q, ring_.queue(q).outstanding());
    ring_.queue(q).post(s);
    queues_[q].push_back(s);
  }

  void consumer_deliver(uint32_t arg) {
    const std::vector<uint32_t> done = slots_in(SlotState::kReady, SlotState::kFailed);
    if (done.empty()) return;
    const uint32_t s = done[arg % done.size()];
    ModelSlot& m = slots_[s];
    check_indices(s);
    if (m.state == SlotState::kFailed) {
      SPINDLE_FUZZ_CHECK(all_bytes(ring_.payload(s), m.error_bytes, report_byte(m.batch_id)),
                         "op %zu: the error report of batch %lld in slot %u is not what its worker wrote", op_,
                         static_cast<long long>(m.batch_id), s);
      transition(Role::kConsumer, s, SlotState::kFailed, SlotState::kFree);
      return;
    }
    if (m.flags & spindle::detail::kSlotExhausted) {  // a stream ended: skipped, its worker gets no more
      SPINDLE_FUZZ_CHECK(m.worker >= 0, "op %zu: exhausted slot %u names no worker", op_, s);
      workers_[static_cast<uint32_t>(m.worker)].ended = true;
      transition(Role::kConsumer, s, SlotState::kReady, SlotState::kFree);
      return;
    }
    check_payload(s, "delivered");
    transition(Role::kConsumer, s, SlotState::kReady, SlotState::kLeased);
  }

  void consumer_close() {
    for (uint32_t q = 0; q < ring_.num_queues(); ++q) ring_.queue(q).close();
    closed_ = true;
  }

  // --- the user's leases ----------------------------------------------------
  void lease_drop(uint32_t arg) {
    const std::vector<uint32_t> leased = slots_in(SlotState::kLeased);
    if (leased.empty()) return;
    const uint32_t s = leased[arg % leased.size()];
    check_indices(s);
    check_payload(s, "kept");  // a kept batch is never overwritten
    transition(Role::kLease, s, SlotState::kLeased, SlotState::kFree);
  }

  // --- workers (as WorkerContext drives the ring) ----------------------------
  std::optional<uint32_t> worker_for(uint32_t arg) const {
    if (g_.num_workers == 0) return std::nullopt;
    return arg % g_.num_workers;
  }

  void worker_claim(uint32_t arg) {
    const auto w = worker_for(arg);
    if (!w || workers_[*w].slot >= 0) return;  // a worker fills one slot at a time
    IndexQueue& q = queue_of_worker(*w);
    if (q.is_closed()) return;  // the worker exits
    std::deque<uint32_t>& mq = queues_[model_queue_of(*w)];
    const std::optional<uint32_t> got = q.try_claim();
    if (mq.empty()) {
      SPINDLE_FUZZ_CHECK(!got, "op %zu: worker %u claimed slot %u from queue %u, which the model says is empty", op_,
                         *w, got.value_or(0), model_queue_of(*w));
      return;
    }
    SPINDLE_FUZZ_CHECK(got && *got == mq.front(), "op %zu: worker %u claimed %s%u from queue %u, expected slot %u",
                       op_, *w, got ? "slot " : "nothing ", got.value_or(0), model_queue_of(*w), mq.front());
    const uint32_t s = *got;
    mq.pop_front();
    SPINDLE_FUZZ_CHECK(s < g_.num_slots, "op %zu: claimed slot %u of %u", op_, s, g_.num_slots);
    SlotHeader& h = ring_.slot(s);
    h.worker = static_cast<int32_t>(*w);
    slots_[s].worker = static_cast<int32_t>(*w);
    WorkerRecord& rec = ring_.worker(*w);
    rec.batch_id.store(h.batch_id);
    rec.sample_index.store(-1);
    rec.slot.store(static_cast<int32_t>(s));
    workers_[*w].batch_id = h.batch_id;
    workers_[*w].sample_index = -1;
    workers_[*w].slot = static_cast<int32_t>(s);
    transition(Role::kWorker, s, SlotState::kPosted, SlotState::kFilling);
  }

  // The slot worker w is filling, if any.
  std::optional<uint32_t> filling(uint32_t arg, uint32_t* w_out) const {
    const auto w = worker_for(arg);
    if (!w || workers_[*w].slot < 0) return std::nullopt;
    *w_out = *w;
    return static_cast<uint32_t>(workers_[*w].slot);
  }

  uint64_t sample_bytes() const { return g_.slot_bytes / g_.batch_capacity; }

  void worker_sample(uint32_t arg) {
    uint32_t w = 0;
    const auto s = filling(arg, &w);
    if (!s) return;
    ModelSlot& m = slots_[*s];
    if (m.written >= m.count) return;
    const uint32_t i = m.written++;
    const int64_t index = ring_.indices(*s)[i];
    SPINDLE_FUZZ_CHECK(index == sample_index_of(m.batch_id, i),
                       "op %zu: worker %u reads sample index %lld at position %u of batch %lld, the consumer wrote %lld",
                       op_, w, static_cast<long long>(index), i, static_cast<long long>(m.batch_id),
                       static_cast<long long>(sample_index_of(m.batch_id, i)));
    ring_.worker(w).sample_index.store(index);
    workers_[w].sample_index = index;
    const std::span<std::byte> payload = ring_.payload_span(*s);
    std::memset(payload.data() + i * sample_bytes(), sample_byte(m.batch_id, i), sample_bytes());
  }

  void finish_worker(uint32_t w) {
    WorkerRecord& rec = ring_.worker(w);
    rec.slot.store(-1);
    rec.batch_id.store(-1);
    rec.sample_index.store(-1);
    workers_[w].slot = -1;
    workers_[w].batch_id = -1;
    workers_[w].sample_index = -1;
  }

  void worker_commit(uint32_t arg) {
    uint32_t w = 0;
    const auto s = filling(arg, &w);
    if (!s) return;
    ModelSlot& m = slots_[*s];
    SlotHeader& h = ring_.slot(*s);
    if (g_.round_robin && (arg & 3) == 3) {  // the worker's stream ended: no batch
      h.count = m.count = 0;
      h.flags = m.flags = spindle::detail::kSlotExhausted;
    } else {
      if (arg & 1) {  // a short batch (streams): commit(item, count) may only lower the count
        const uint32_t c = (arg >> 1) % (m.count + 1);
        if (c < m.count) h.count = m.count = c;
      }
      const std::span<std::byte> payload = ring_.payload_span(*s);
      const uint64_t head = m.written * sample_bytes();
      std::memset(payload.data() + head, rest_byte(m.batch_id), payload.size() - head);
    }
    transition(Role::kWorker, *s, SlotState::kFilling, SlotState::kReady);
    finish_worker(w);
  }

  void worker_fail(uint32_t arg) {
    uint32_t w = 0;
    const auto s = filling(arg, &w);
    if (!s) return;
    ModelSlot& m = slots_[*s];
    std::size_t n = 0;
    switch (arg & 3) {
      case 0: n = 0; break;
      case 1: n = 1 + arg; break;
      case 2: n = static_cast<std::size_t>(g_.slot_bytes); break;
      case 3: n = ring_.report_capacity(); break;  // a report that fills the whole stride
    }
    n = std::min(n, ring_.report_capacity());
    std::memset(ring_.payload(*s), report_byte(m.batch_id), n);
    ring_.slot(*s).error_bytes = m.error_bytes = static_cast<uint32_t>(n);
    transition(Role::kWorker, *s, SlotState::kFilling, SlotState::kFailed);
    finish_worker(w);
  }

  void worker_idle(uint32_t arg) {
    const auto w = worker_for(arg);
    if (!w) return;
    IndexQueue& q = queue_of_worker(*w);
    if (!queues_[model_queue_of(*w)].empty() || closed_) {
      const auto t0 = std::chrono::steady_clock::now();
      q.wait(std::chrono::seconds(5));
      const auto took = std::chrono::steady_clock::now() - t0;
      SPINDLE_FUZZ_CHECK(took < std::chrono::seconds(2), "op %zu: worker %u slept in wait() with work posted or closed",
                         op_, *w);
    } else {
      q.wait(std::chrono::microseconds(0));
    }
  }

  // --- checks ---------------------------------------------------------------
  void check_indices(uint32_t s) const {
    const ModelSlot& m = slots_[s];
    for (uint32_t i = 0; i < m.posted_count; ++i) {
      SPINDLE_FUZZ_CHECK(ring_.indices(s)[i] == sample_index_of(m.batch_id, i),
                         "op %zu: slot %u index %u is %lld, the consumer wrote %lld for batch %lld", op_, s, i,
                         static_cast<long long>(ring_.indices(s)[i]),
                         static_cast<long long>(sample_index_of(m.batch_id, i)), static_cast<long long>(m.batch_id));
    }
  }

  void check_payload(uint32_t s, const char* what) const {
    const ModelSlot& m = slots_[s];
    const std::span<std::byte> payload = ring_.payload_span(s);
    for (uint32_t i = 0; i < m.written; ++i)
      SPINDLE_FUZZ_CHECK(all_bytes(payload.data() + i * sample_bytes(), sample_bytes(), sample_byte(m.batch_id, i)),
                         "op %zu: sample %u of %s batch %lld in slot %u was overwritten", op_, i, what,
                         static_cast<long long>(m.batch_id), s);
    const uint64_t head = m.written * sample_bytes();
    SPINDLE_FUZZ_CHECK(all_bytes(payload.data() + head, payload.size() - head, rest_byte(m.batch_id)),
                       "op %zu: payload of %s batch %lld in slot %u was overwritten", op_, what,
                       static_cast<long long>(m.batch_id), s);
  }

  void check_model() const {
    for (uint32_t s = 0; s < g_.num_slots; ++s) {
      const ModelSlot& m = slots_[s];
      const SlotHeader& h = ring_.slot(s);
      SPINDLE_FUZZ_CHECK(ring_.state(s) == m.state, "op %zu: slot %u is in state %u, the model says %u", op_, s,
                         static_cast<unsigned>(ring_.state(s)), static_cast<unsigned>(m.state));
      SPINDLE_FUZZ_CHECK(h.batch_id == m.batch_id && h.worker == m.worker && h.count == m.count &&
                             h.error_bytes == m.error_bytes && h.flags == m.flags,
                         "op %zu: slot %u header (batch %lld, worker %d, count %u, error_bytes %u, flags %u) differs "
                         "from the model (batch %lld, worker %d, count %u, error_bytes %u, flags %u)",
                         op_, s, static_cast<long long>(h.batch_id), h.worker, h.count, h.error_bytes, h.flags,
                         static_cast<long long>(m.batch_id), m.worker, m.count, m.error_bytes, m.flags);
    }
    for (uint32_t w = 0; w < g_.num_workers; ++w) {
      const ModelWorker& m = workers_[w];
      const WorkerRecord& r = ring_.worker(w);
      SPINDLE_FUZZ_CHECK(r.pid.load() == m.pid && r.slot.load() == m.slot && r.batch_id.load() == m.batch_id &&
                             r.sample_index.load() == m.sample_index,
                         "op %zu: worker %u record (pid %d, slot %d, batch %lld, sample %lld) differs from the model "
                         "(pid %d, slot %d, batch %lld, sample %lld)",
                         op_, w, r.pid.load(), r.slot.load(), static_cast<long long>(r.batch_id.load()),
                         static_cast<long long>(r.sample_index.load()), m.pid, m.slot,
                         static_cast<long long>(m.batch_id), static_cast<long long>(m.sample_index));
    }
    for (uint32_t q = 0; q < ring_.num_queues(); ++q) {
      const IndexQueue& iq = ring_.queue(q);
      SPINDLE_FUZZ_CHECK(iq.outstanding() == queues_[q].size() && iq.capacity() == g_.num_slots &&
                             iq.is_closed() == closed_,
                         "op %zu: queue %u (outstanding %u, capacity %u, closed %d) differs from the model (%zu, %u, %d)",
                         op_, q, iq.outstanding(), iq.capacity(), iq.is_closed(), queues_[q].size(), g_.num_slots,
                         closed_);
    }
    SPINDLE_FUZZ_CHECK(ring_.header().completed.load() == completed_, "op %zu: completed is %u, %u publishes were made",
                       op_, ring_.header().completed.load(), completed_);
    for (std::size_t i = 0; i < gaps_.size(); ++i)
      SPINDLE_FUZZ_CHECK(std::memcmp(base_ + gaps_[i].begin, gap_bytes_[i].data(), gap_bytes_[i].size()) == 0,
                         "op %zu: bytes [%llu, %llu) between regions changed", op_,
                         static_cast<unsigned long long>(gaps_[i].begin), static_cast<unsigned long long>(gaps_[i].end));
  }

  uint64_t offset_of(const void* p) const { return static_cast<uint64_t>(static_cast<const std::byte*>(p) - base_); }

  // Regions as the accessors address them, checked once after create().
  void check_layout() {
    const RingHeader& h = ring_.header();
    SPINDLE_FUZZ_CHECK(h.magic == RingHeader::kMagic, "bad magic %llx", static_cast<unsigned long long>(h.magic));
    SPINDLE_FUZZ_CHECK(h.total_bytes == total_, "header total_bytes %llu, bytes_for %zu",
                       static_cast<unsigned long long>(h.total_bytes), total_);
    const RingGeometry& hg = ring_.geometry();
    SPINDLE_FUZZ_CHECK(hg.num_slots == g_.num_slots && hg.num_workers == g_.num_workers &&
                           hg.batch_capacity == g_.batch_capacity && hg.slot_bytes == g_.slot_bytes &&
                           hg.round_robin == g_.round_robin,
                       "the header's geometry differs from the one created");
    const uint64_t stride = h.slot_stride;
    SPINDLE_FUZZ_CHECK(stride % BatchRing::kPayloadAlign == 0 && stride >= g_.slot_bytes &&
                           stride >= BatchRing::kMinSlotStride && ring_.report_capacity() <= stride,
                       "slot stride %llu for slot_bytes %llu (report capacity %zu)",
                       static_cast<unsigned long long>(stride), static_cast<unsigned long long>(g_.slot_bytes),
                       ring_.report_capacity());
    SPINDLE_FUZZ_CHECK(ring_.num_queues() == 1 + g_.num_workers, "%u queues for %u workers", ring_.num_queues(),
                       g_.num_workers);

    std::vector<Region> regions;
    regions.push_back({"header", 0, 0, sizeof(RingHeader), kCacheLine});
    regions.push_back({"completed", 0, offset_of(&h.completed), offset_of(&h.completed) + sizeof(h.completed),
                       kCacheLine});
    for (uint32_t q = 0; q < ring_.num_queues(); ++q) {
      const uint64_t b = offset_of(&ring_.queue(q));
      regions.push_back({"queue", q, b, b + IndexQueue::bytes_for(g_.num_slots), kCacheLine});
    }
    for (uint32_t w = 0; w < g_.num_workers; ++w) {
      const uint64_t b = offset_of(&ring_.worker(w));
      regions.push_back({"worker record", w, b, b + sizeof(WorkerRecord), kCacheLine});
    }
    for (uint32_t s = 0; s < g_.num_slots; ++s) {
      const uint64_t b = offset_of(&ring_.slot(s));
      regions.push_back({"slot header", s, b, b + sizeof(SlotHeader), kCacheLine});
    }
    for (uint32_t s = 0; s < g_.num_slots; ++s) {
      const uint64_t b = offset_of(ring_.indices(s));
      // Each slot's row starts on 8 bytes; the rows together start on a line.
      regions.push_back({"indices", s, b, b + sizeof(int64_t) * g_.batch_capacity, s == 0 ? kCacheLine : 8});
    }
    for (uint32_t s = 0; s < g_.num_slots; ++s) {
      const uint64_t b = offset_of(ring_.descriptor(s));
      regions.push_back({"descriptor", s, b, b + spindle::kDescriptorBytes, kCacheLine});
    }
    for (uint32_t s = 0; s < g_.num_slots; ++s) {
      const uint64_t b = offset_of(ring_.payload(s));
      regions.push_back({"payload", s, b, b + stride, BatchRing::kPayloadAlign});
      // Every slot starts with its reserve backed (>= slot_bytes, >= room for a report), within its window.
      SPINDLE_FUZZ_CHECK(ring_.payload_span(s).data() == ring_.payload(s) &&
                             ring_.payload_span(s).size() == h.slot_reserve && h.slot_reserve >= g_.slot_bytes &&
                             h.slot_reserve <= stride,
                         "payload_span(%u) is not the reserved start of payload(%u)", s, s);
    }
    for (const Region& r : regions) {
      SPINDLE_FUZZ_CHECK(r.begin % r.align == 0 && reinterpret_cast<uintptr_t>(base_ + r.begin) % r.align == 0,
                         "%s %u at offset %llu is not %llu-byte aligned", r.name, r.index,
                         static_cast<unsigned long long>(r.begin), static_cast<unsigned long long>(r.align));
      SPINDLE_FUZZ_CHECK(r.begin <= r.end && r.end <= total_, "%s %u [%llu, %llu) lies outside bytes_for = %zu",
                         r.name, r.index, static_cast<unsigned long long>(r.begin),
                         static_cast<unsigned long long>(r.end), total_);
    }
    // `completed` is inside the header; every other pair is disjoint.
    std::vector<Region> disjoint;
    for (const Region& r : regions)
      if (std::strcmp(r.name, "completed") != 0) disjoint.push_back(r);
    std::sort(disjoint.begin(), disjoint.end(), [](const Region& a, const Region& b) { return a.begin < b.begin; });
    for (std::size_t i = 1; i < disjoint.size(); ++i) {
      const Region& a = disjoint[i - 1];
      const Region& b = disjoint[i];
      SPINDLE_FUZZ_CHECK(a.end <= b.begin, "%s %u [%llu, %llu) overlaps %s %u [%llu, %llu)", a.name, a.index,
                         static_cast<unsigned long long>(a.begin), static_cast<unsigned long long>(a.end), b.name,
                         b.index, static_cast<unsigned long long>(b.begin), static_cast<unsigned long long>(b.end));
      if (a.end < b.begin) gaps_.push_back({"gap", 0, a.end, b.begin, 1});
    }
    if (disjoint.back().end < total_) gaps_.push_back({"gap", 0, disjoint.back().end, total_, 1});
    for (const Region& gap : gaps_)
      gap_bytes_.emplace_back(base_ + gap.begin, base_ + gap.end);  // whatever create() left there

    // Fresh state: every slot free, every worker idle, every queue empty and open.
    for (uint32_t s = 0; s < g_.num_slots; ++s)
      SPINDLE_FUZZ_CHECK(ring_.state(s) == SlotState::kFree, "fresh slot %u is in state %u", s,
                         static_cast<unsigned>(ring_.state(s)));
  }

  RingGeometry g_;
  std::byte* base_;
  std::size_t total_;
  BatchRing ring_;
  std::vector<ModelSlot> slots_;
  std::vector<ModelWorker> workers_;
  std::vector<std::deque<uint32_t>> queues_;  // slot numbers posted to each queue, not yet claimed
  std::vector<Region> gaps_;
  std::vector<std::vector<std::byte>> gap_bytes_;
  int64_t next_batch_ = 0;
  uint32_t completed_ = 0;
  bool closed_ = false;
  std::size_t op_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size < 5) return 0;
  ByteReader in(data, size);
  RingGeometry g;  // fields by name: fields added later keep their defaults
  g.num_slots = 1 + in.next() % kMaxSlots;
  const uint8_t w = in.next();
  g.num_workers = (w & 7u) % (kMaxWorkers + 1);
  g.round_robin = (w & 0x80u) != 0;
  g.batch_capacity = 1 + in.next();
  const uint64_t base = kSlotBytes[in.next() % 8];
  const int delta = static_cast<int>(in.next()) - 128;
  g.slot_bytes = delta < 0 && base < static_cast<uint64_t>(-delta) ? 0 : base + delta;

  const std::size_t total = BatchRing::bytes_for(g);
  SPINDLE_FUZZ_TRACE("%u slots, %u workers, batch capacity %u, slot_bytes %llu, %s; bytes_for %zu", g.num_slots,
                     g.num_workers, g.batch_capacity, static_cast<unsigned long long>(g.slot_bytes),
                     g.round_robin ? "round-robin" : "shared queue", total);
  ZeroedMapping mem(total);  // page-aligned, as the loader's segment
  Run run(g, mem.data(), total);
  while (!in.empty()) run.step(in.next());
  return 0;
}
