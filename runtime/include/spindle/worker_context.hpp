#pragma once
// WorkerContext: the worker side of the loader protocol. A worker claims work
// items (a ring slot listing sample indices), writes the samples into the
// slot's payload and publishes it, or publishes a failure report.

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>

#include <spindle/error.hpp>
#include <spindle/slot_layout.hpp>

namespace spindle {

// The segment's layout (the ring, its slot states) is not API: a WorkerContext
// views it, and only the runtime's own writers reach it (ring()).
namespace detail {
class BatchRing;
enum class SlotState : uint32_t;
}  // namespace detail

// One claimed work item, as a worker sees it.
struct WorkItem {
  uint32_t slot = 0;
  int64_t batch_id = 0;
  std::span<const int64_t> indices;  // the samples to produce, in order
  std::span<std::byte> out;          // the slot's payload reserved now (raw bytes; see reserve())
  // Round-robin: the first item of a new epoch of this worker's stream
  // (Loader::reset_streams). The worker starts its stream again, from
  // `message` if it is not empty, before producing this batch. `message`
  // views the head of the payload: read it before writing the batch there.
  bool new_stream = false;
  std::span<const std::byte> message;
  // The logical worker this item belongs to (LoaderOptions::logical_workers):
  // with round-robin or assign_in_turn, the stream or batch turn it is asked
  // of, which this process serves; -1 for a batch any worker may take.
  int stream = -1;
};

class WorkerContext {
 public:
  // `parent`: the process whose death means this worker must exit (the
  // consumer, or the zygote that forked it). `segment_fd`: the segment, so
  // slots can grow (-1: they cannot; batches must fit what is reserved).
  WorkerContext(const detail::BatchRing& ring, int worker_id, pid_t parent, int segment_fd = -1);
  int worker_id() const noexcept { return worker_id_; }
  int num_workers() const noexcept;
  // The workers the data is defined by (LoaderOptions::logical_workers): at
  // least num_workers(); this process serves logical workers l with
  // l mod num_workers() == worker_id() (WorkItem::stream says which).
  int logical_workers() const noexcept;
  // The most samples a batch holds (LoaderOptions::batch_capacity): a native
  // worker sizes its SlotLayout from it.
  uint32_t batch_capacity() const noexcept;

  // Blocks until an item is posted. nullopt: the loader closed, or the
  // consumer process is gone; the worker should return.
  std::optional<WorkItem> claim();
  // Records the sample being produced (shown if this worker crashes).
  void set_sample(int64_t index) noexcept;
  // The sample set_sample() recorded last (-1: none).
  int64_t current_sample() const noexcept;
  // The crash record's word itself (in shared memory), for a front end that updates it with plain
  // stores from its own loop (the Python worker); set_sample() stores to it.
  std::atomic<int64_t>& sample_record() noexcept;
  // Counts bytes this worker's streamed source fetched (URL shards), for Loader::stats().
  void add_bytes_fetched(uint64_t bytes) noexcept;
  // Makes sure the item's slot has at least `bytes` of payload backed by
  // memory and returns it (raw; see begin_arrays/put_bytes for typed
  // batches). Throws std::length_error if the batch is larger than the slot
  // window (LoaderOptions::max_batch_bytes), SharedMemoryError if /dev/shm
  // cannot hold it.
  std::span<std::byte> reserve(WorkItem& item, uint64_t bytes);
  // Starts an array batch: reserves layout.bytes(), writes the slot's
  // descriptor, and returns the payload; field i's block starts at
  // layout.offset(i). `structure` is opaque to the runtime (the consumer gets
  // it back with the batch).
  std::span<std::byte> begin_arrays(WorkItem& item, const SlotLayout& layout, std::string_view structure);
  // A whole array batch in one call: begin_arrays, then row r of field f is
  // copied from rows[r * layout.num_fields() + f] (layout.row_bytes(f) bytes
  // there), for rows.size() / num_fields() samples (at most the item's count;
  // a stream's short batch commits its count after). For front ends that
  // gather rows from objects of their own (the Python binding: the samples'
  // buffers).
  void put_rows(WorkItem& item, const SlotLayout& layout, std::string_view structure,
                std::span<const std::byte* const> rows);
  // One sample's rows, as a front end copies each sample as it reads it:
  // field f's row `row` of the payload `out` (from begin_arrays with
  // `layout`) gets layout.row_bytes(f) bytes from field_rows[f].
  void put_row(const SlotLayout& layout, std::span<std::byte> out, std::size_t row,
               std::span<const std::byte* const> field_rows) const;
  // Stores one byte string (e.g. a pickled batch) as the item's payload.
  void put_bytes(WorkItem& item, std::span<const std::byte> bytes);
  // Publishes the item's payload as complete.
  void commit(const WorkItem& item) noexcept;
  // The same, for a batch of only `count` samples (a stream's short last batch).
  void commit(const WorkItem& item, uint32_t count) noexcept;
  // Round-robin mode: where the item's stream stands after this batch, in
  // the body's own terms (0 is its start); call before commit. The consumer
  // gets it with the batch (Batch::stream_position) to start the stream
  // again there on other processes (an adaptive stream's advice).
  void set_stream_position(const WorkItem& item, uint64_t position) noexcept;
  // Round-robin mode: this worker's stream has ended; it gets no more items.
  void exhausted(const WorkItem& item) noexcept;
  // Publishes the item as failed; `report` (truncated to report_capacity(),
  // less the path and key) is handed to the consumer in
  // BatchFailedError::payload, `kind`, `path` and `key` (each truncated to
  // kMaxFailurePathBytes) in its fields of the same names.
  void fail(const WorkItem& item, std::string_view report, FailureKind kind = FailureKind::kOther,
            std::string_view path = {}, std::string_view key = {}) noexcept;
  static constexpr std::size_t kMaxFailurePathBytes = 4096;
  // The ring this worker writes into: for the runtime's own writers (payload
  // parts, pipeline workers), which include detail/batch_ring.hpp; not API.
  detail::BatchRing ring() const noexcept;

 private:
  void finish(const WorkItem& item, detail::SlotState st) noexcept;
  std::byte* segment_;  // the mapped segment, which ring() views
  int worker_id_;
  pid_t parent_;
  int segment_fd_;
};

using WorkerMain = std::function<int(WorkerContext&)>;

// CLOCK_MONOTONIC in nanoseconds: the clock of WorkerRecord::busy_since_ns,
// the same in every process of the machine.
int64_t monotonic_ns() noexcept;
// The CPU a process has used, all its threads (ns; its process CPU clock, through
// clock_getcpuclockid: no /proc read, and no tick rounding). 0 where the process is gone.
uint64_t process_cpu_ns(pid_t pid) noexcept;

// A spawned worker's view of the loader: maps the segment from descriptor
// `segment_fd`, records its pid, and makes the context. The mapping lives as
// long as this object; the process should die with `parent`
// (PR_SET_PDEATHSIG is set here, and getppid() is checked).
class AttachedWorker {
 public:
  AttachedWorker(int segment_fd, int worker_id, pid_t parent);
  ~AttachedWorker();
  AttachedWorker(const AttachedWorker&) = delete;
  AttachedWorker& operator=(const AttachedWorker&) = delete;
  WorkerContext& context() noexcept { return *context_; }

 private:
  void* mem_ = nullptr;
  std::size_t size_ = 0;
  int fd_ = -1;
  std::optional<WorkerContext> context_;
};

// Producer of one sample: writes sample `index` into `out` (sample_bytes).
using SampleFn = std::function<void(int64_t index, std::span<std::byte> out)>;

// A WorkerMain for fixed-size samples laid out back to back in the slot.
// Exceptions from `fn` fail the batch with "sample <i>: <what>".
WorkerMain sample_worker(SampleFn fn, uint64_t sample_bytes);

}  // namespace spindle
