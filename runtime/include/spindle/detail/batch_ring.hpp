#pragma once
// BatchRing: the loader's shared-memory segment — header, work queue, worker
// records and a fixed set of batch slots. Consumer and workers both view the
// same bytes through this class; it owns nothing.
//
// Memory layout (offsets computed once by the consumer, stored in the header;
// every region starts on a 64-byte line, payloads on a 4096-byte page):
//
//   RingHeader                      geometry + `completed` futex word
//   (IndexQueue + entries[num_slots]) x (1 + num_workers)
//                                   work items: slot numbers (index_queue.hpp);
//                                   queue 0 shared, 1 + w for worker w
//   WorkerRecord[num_workers]       what each worker is doing (for crash reports)
//   SlotHeader[num_slots]           per-slot state machine and batch metadata
//   int64 indices[num_slots][batch_capacity]   sample indices of each batch
//   descriptor[num_slots][kDescriptorBytes]    how each slot's payload is laid
//                                              out (slot_layout.hpp)
//   payload[num_slots][slot_stride]            the batch bytes
//
// Payloads grow in place. Each slot owns a window of `slot_stride` bytes of
// address space (the largest batch it may ever hold), but only the first
// `SlotHeader::reserved` bytes of it are backed by memory: the segment is a
// sparse file, and the worker that needs more room for a batch reserves it
// (posix_fallocate, so a full /dev/shm is an error, never a SIGBUS) before
// writing. Offsets never move, so a batch the user holds stays valid while
// other slots grow. Every slot starts with at least kMinSlotStride reserved:
// room for an error report.
//
// Slot state machine (one writer per transition, so no CAS is needed):
//
//   kFree --consumer posts batch--> kPosted --worker claims--> kFilling
//   kFilling --worker commit--> kReady    kFilling --worker fail--> kFailed
//   kReady --consumer delivers--> kLeased --last lease dropped--> kFree
//   kFailed --consumer raises the error--> kFree
//   kPosted --consumer takes the item back (Loader::reset*)--> kFree
//
// Taking an item back: the consumer claims it from the queue itself (the
// queues allow any number of claimers); winning that CAS makes the slot its
// own exactly as a worker's win would, so no worker ever sees it.
//
// A slot is written only by the worker that claimed it, and is handed to a
// new batch only from kFree, i.e. after the consumer released it: a batch the
// user keeps can never be overwritten. A worker that dies in kFilling leaves
// the slot in kFilling; the consumer notices the death (waitpid), reads the
// worker's record and reports it. No mutex, no allocator: nothing for a dead
// worker to leave poisoned.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>

#include <spindle/detail/index_queue.hpp>
#include <spindle/slot_layout.hpp>

namespace spindle::detail {

enum class SlotState : uint32_t {
  kFree = 0,     // owned by the consumer, not in use
  kPosted = 1,   // batch id + indices written, item in the queue
  kFilling = 2,  // a worker claimed it and is writing the payload
  kReady = 3,    // payload complete
  kFailed = 4,   // payload holds an error report of `error_bytes` (and the failure record's path and key)
  kLeased = 5,   // delivered; user code holds views of the payload
};

struct alignas(kCacheLine) SlotHeader {
  std::atomic<uint32_t> state{0};  // SlotState; see the state machine above
  int32_t worker = -1;             // written by the claiming worker
  int64_t batch_id = -1;           // written by the consumer before posting
  uint32_t count = 0;              // samples in the batch; consumer before posting, worker may lower it
  uint32_t error_bytes = 0;        // worker, before kFailed
  // Consumer before posting: kSlotNewStream; the worker before kReady: kSlotExhausted.
  uint32_t flags = 0;
  // Consumer before posting, with kSlotNewStream: bytes of its start message
  // at the head of the payload (read by the worker before it writes there).
  uint32_t message_bytes = 0;
  // Payload bytes backed by memory; only grows. Written by create(), by the
  // consumer in kFree (room for a start message) and by the worker holding
  // the slot in kFilling (one writer at a time; the state transitions order
  // it for the next holder and the consumer).
  uint64_t reserved = 0;
  // The failure record of a kFailed slot, written by the worker (in
  // WorkerContext::fail) before it publishes kFailed, read by the consumer
  // after it sees kFailed; reset by the consumer before posting. `failure` is
  // a FailureKind (error.hpp): what failed, so the consumer raises the right
  // type without reading the report. The payload of a failed slot holds the
  // report (`error_bytes`), then the input's path (`failure_path_bytes`), then
  // the sample's key (`failure_key_bytes`): the file or shard and the key the
  // failure names, empty where the worker did not know them.
  uint32_t failure = 0;
  uint32_t failure_path_bytes = 0;
  uint32_t failure_key_bytes = 0;
  // Samples of a kReady batch that on_error="skip" replaced (native pipeline):
  // written by the worker before kReady, read by the consumer for
  // max_skip_ratio (LoaderOptions); reset by the consumer before posting.
  uint32_t skipped = 0;
  // Consumer before posting: the logical worker whose turn this item is
  // (round-robin or assign_in_turn: the item's stream or batch turn; see
  // LoaderOptions::logical_workers), -1 when batches go to whoever is free.
  // The worker that claims it runs that logical worker's stream.
  int32_t stream = -1;
  // Round-robin streams: where the item's stream stands after this batch, in
  // its worker body's own terms (WorkerContext::set_stream_position; a native
  // WebDataset stream: its shard and sample). Written by the worker before
  // kReady, read with the batch (Batch::stream_position), reset by the
  // consumer before posting. A front end starts the stream again there.
  uint64_t stream_position = 0;
};
static_assert(sizeof(SlotHeader) % kCacheLine == 0, "slot headers on their own cache lines");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "slot states are shared across processes");

// SlotHeader::flags: the worker's data stream ended; the slot holds no batch
// (round-robin mode, one stream per worker, e.g. a torch IterableDataset).
inline constexpr uint32_t kSlotExhausted = 1;
// SlotHeader::flags: the first item a worker gets after Loader::reset_streams:
// its stream starts again (from the `message_bytes` start message at the head
// of the payload, if any) before it produces this batch (round-robin mode).
inline constexpr uint32_t kSlotNewStream = 2;

// Written by its worker only; read by the consumer to explain a crash or a
// timeout, and for Loader::stats(). Separate lines: each worker updates its
// own per sample. The statistics are counters that only grow (the consumer
// subtracts a baseline for reset_stats), written only with RingHeader::stats.
struct alignas(kCacheLine) WorkerRecord {
  std::atomic<int32_t> pid{0};
  std::atomic<int32_t> slot{-1};           // -1: idle
  std::atomic<int64_t> batch_id{-1};       // -1: idle
  std::atomic<int64_t> sample_index{-1};   // sample being produced, -1: none
  std::atomic<uint64_t> busy_ns{0};        // claim to publish, summed over its items
  std::atomic<uint64_t> samples{0};        // samples of the batches it published
  std::atomic<uint64_t> bytes_fetched{0};  // bytes its streamed source fetched
  std::atomic<int64_t> busy_since_ns{0};   // CLOCK_MONOTONIC of its current claim; 0: idle
  // Set by the consumer (adaptive processes, Loader::retire): the worker exits at its next claim,
  // never with an item in hand. Cleared by the consumer before it starts another process as w.
  std::atomic<int32_t> retire{0};
  // When its process first asked for an item (CLOCK_MONOTONIC ns; 0: still starting), and the CPU
  // its process had used by then (its process CPU clock, ns: the clock the adaptive controller reads
  // through clock_getcpuclockid, so that the difference has no bias): its start (the fork, imports,
  // the dataset's setup), which the controller leaves out of what a process uses. Written once by
  // the worker (started_ns last, release); cleared by the consumer before it starts another process
  // as this worker.
  std::atomic<int64_t> started_ns{0};
  std::atomic<uint64_t> start_cpu_ns{0};
};
static_assert(sizeof(WorkerRecord) % kCacheLine == 0, "worker records on their own cache lines");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "worker counters are shared across processes");

struct RingGeometry {
  uint32_t num_slots = 0;
  uint32_t num_workers = 0;
  uint32_t batch_capacity = 0;  // max samples per batch
  uint64_t slot_bytes = 0;      // payload bytes reserved per slot up front
  uint64_t slot_window = 0;     // most payload bytes a slot may grow to (0: slot_bytes)
  // false: one shared queue, any worker takes any batch (map-style data).
  // true: each worker has its own queue and the consumer addresses batches to
  // workers in turn (each worker reads its own stream of samples).
  bool round_robin = false;
  // Logical workers the consumer addresses items to (SlotHeader::stream),
  // each served by process `stream mod num_workers`; 0: one per process.
  uint32_t logical_workers = 0;
};

struct RingHeader {
  static constexpr uint64_t kMagic = 0x31454c444e495053ULL;  // "SPINDLE1"
  uint64_t magic = kMagic;
  RingGeometry geometry;
  uint64_t slot_stride = 0;      // the window of each slot (address space, mostly unbacked)
  uint64_t slot_reserve = 0;     // payload bytes each slot starts with (>= kMinSlotStride)
  uint64_t queue_offset = 0, queue_stride = 0, workers_offset = 0, slots_offset = 0;
  uint64_t indices_offset = 0, descriptors_offset = 0, payload_offset = 0, total_bytes = 0;
  // Consumer, before any worker starts: workers keep their WorkerRecord
  // statistics (LoaderOptions::stats). Read-only afterwards.
  uint32_t stats = 1;
  // Workers bump it after every kReady/kFailed; the consumer sleeps on it.
  // Own line: written by all workers, read in the consumer's wait loop.
  alignas(kCacheLine) std::atomic<uint32_t> completed{0};
};

class BatchRing {
 public:
  static constexpr std::size_t kPayloadAlign = 4096;
  // A slot is at least this big so that a failed batch can carry its error
  // report (a Python traceback, say) even when batches are tiny (slot_layout.hpp).
  static constexpr std::size_t kMinSlotStride = kMinSlotBytes;

  // Bytes a segment needs for this geometry (every slot's whole window).
  static std::size_t bytes_for(const RingGeometry& g) noexcept;
  // Bytes before the first payload (header, queues, records, descriptors).
  static std::size_t fixed_bytes_for(const RingGeometry& g) noexcept;
  // Lays out and initializes a ring in `mem` (bytes_for(g) bytes, zeroed).
  static BatchRing create(std::byte* mem, const RingGeometry& g);
  // Views an existing ring (a worker's side).
  explicit BatchRing(std::byte* mem) noexcept : base_(mem) {}
  BatchRing() = default;

  RingHeader& header() const noexcept { return *reinterpret_cast<RingHeader*>(base_); }
  const RingGeometry& geometry() const noexcept { return header().geometry; }
  // Queue 0 is the shared one; queue 1 + w belongs to worker w (round-robin).
  IndexQueue& queue(uint32_t q = 0) const noexcept {
    return *at<IndexQueue>(header().queue_offset + q * header().queue_stride);
  }
  uint32_t num_queues() const noexcept { return 1 + geometry().num_workers; }
  // The queue worker w takes its work from.
  IndexQueue& queue_of(uint32_t w) const noexcept { return queue(geometry().round_robin ? 1 + w : 0); }
  WorkerRecord& worker(uint32_t w) const noexcept { return at<WorkerRecord>(header().workers_offset)[w]; }
  SlotHeader& slot(uint32_t s) const noexcept { return at<SlotHeader>(header().slots_offset)[s]; }
  SlotState state(uint32_t s) const noexcept {
    return static_cast<SlotState>(slot(s).state.load(std::memory_order_acquire));
  }
  void set_state(uint32_t s, SlotState st) const noexcept {
    slot(s).state.store(static_cast<uint32_t>(st), std::memory_order_release);
  }
  // The slot's payload descriptor (kDescriptorBytes; see slot_layout.hpp).
  std::byte* descriptor(uint32_t s) const noexcept {
    return base_ + header().descriptors_offset + static_cast<std::size_t>(s) * kDescriptorBytes;
  }
  int64_t* indices(uint32_t s) const noexcept {
    return at<int64_t>(header().indices_offset) + static_cast<std::size_t>(s) * geometry().batch_capacity;
  }
  std::byte* payload(uint32_t s) const noexcept {
    return base_ + header().payload_offset + static_cast<std::size_t>(s) * header().slot_stride;
  }
  // The payload bytes of slot s backed by memory now.
  std::span<std::byte> payload_span(uint32_t s) const noexcept {
    return {payload(s), static_cast<std::size_t>(slot(s).reserved)};
  }
  // Room for an error report in a failed slot: what every slot starts with.
  std::size_t report_capacity() const noexcept { return static_cast<std::size_t>(header().slot_reserve); }
  // Bytes from the start of the segment to the first payload: the part that
  // is reserved in full when the segment is created.
  std::size_t fixed_bytes() const noexcept { return static_cast<std::size_t>(header().payload_offset); }
  // Worker side: publish a finished (or failed) slot and wake the consumer.
  void publish(uint32_t s, SlotState st) const noexcept {
    set_state(s, st);
    header().completed.fetch_add(1, std::memory_order_release);
    detail::futex_wake(&header().completed, 1);
  }

 private:
  template <class T>
  T* at(uint64_t off) const noexcept {
    return reinterpret_cast<T*>(base_ + off);
  }
  std::byte* base_ = nullptr;
};

}  // namespace spindle::detail
