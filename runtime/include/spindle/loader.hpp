#pragma once
// Loader: the consumer side of spindle. It owns the shared segment, forks the
// workers, posts batches to the index queue, and hands out finished batches as
// leases on ring slots. WorkerContext is the worker side of the same protocol.
//
// Flow control is done by the consumer alone: a batch is posted only into a
// free slot, so the queue can never overflow and a slot a user still holds is
// never rewritten. If the user holds so many batches that no slot would be
// left for the pipeline, the batch being delivered is copied out of the ring
// (counted in copied_out()) so that iteration never deadlocks.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <spindle/batch_ring.hpp>
#include <spindle/thread_budget.hpp>
#include <spindle/worker_pool.hpp>

namespace spindle {

struct LoaderOptions {
  int num_workers = 1;
  uint32_t batch_capacity = 1;   // max samples per batch
  uint64_t slot_bytes = 0;       // payload bytes per batch
  int prefetch_factor = 2;       // batches in flight per worker
  bool in_order = true;          // deliver by batch id; false: as they finish
  std::chrono::milliseconds timeout{0};  // max wait for one batch; 0 = forever
  std::optional<int64_t> max_threads;    // user cap on tasks the loader adds
  BudgetSources budget_sources;          // where limits are read (tests fake it)
};

// One claimed work item, as a worker sees it.
struct WorkItem {
  uint32_t slot = 0;
  int64_t batch_id = 0;
  std::span<const int64_t> indices;  // the samples to produce, in order
  std::span<std::byte> out;          // the slot's payload
};

class WorkerContext {
 public:
  WorkerContext(BatchRing ring, int worker_id, pid_t consumer);
  int worker_id() const noexcept { return worker_id_; }
  int num_workers() const noexcept { return static_cast<int>(ring_.geometry().num_workers); }

  // Blocks until an item is posted. nullopt: the loader closed, or the
  // consumer process is gone; the worker should return.
  std::optional<WorkItem> claim();
  // Records the sample being produced (shown if this worker crashes).
  void set_sample(int64_t index) noexcept {
    ring_.worker(worker_id_).sample_index.store(index, std::memory_order_relaxed);
  }
  // Publishes the item's payload as complete.
  void commit(const WorkItem& item) noexcept;
  // Publishes the item as failed; `report` (truncated to report_capacity()) is
  // handed to the consumer in BatchFailedError::payload.
  void fail(const WorkItem& item, std::string_view report) noexcept;
  const BatchRing& ring() const noexcept { return ring_; }

 private:
  void finish(const WorkItem& item, SlotState st) noexcept;
  BatchRing ring_;
  int worker_id_;
  pid_t consumer_;
};

using WorkerMain = std::function<int(WorkerContext&)>;

// Producer of one sample: writes sample `index` into `out` (sample_bytes).
using SampleFn = std::function<void(int64_t index, std::span<std::byte> out)>;

// A WorkerMain for fixed-size samples laid out back to back in the slot.
// Exceptions from `fn` fail the batch with "sample <i>: <what>".
WorkerMain sample_worker(SampleFn fn, uint64_t sample_bytes);

struct RingStorage;  // the segment + ring, shared by the loader and its leases

// A delivered batch: a lease on a ring slot (or, if copied out, its own
// buffer). The slot returns to the ring when the Batch is destroyed, even if
// the Loader is gone by then.
class Batch {
 public:
  Batch(Batch&&) noexcept;
  Batch& operator=(Batch&&) noexcept;
  ~Batch();

  int64_t batch_id() const noexcept { return batch_id_; }
  std::span<const int64_t> indices() const noexcept { return indices_; }
  std::span<std::byte> data() const noexcept { return data_; }
  bool copied_out() const noexcept { return !owned_.empty(); }

 private:
  friend class Loader;
  Batch(std::shared_ptr<RingStorage> ring, uint32_t slot);
  void copy_out();
  void release() noexcept;

  std::shared_ptr<RingStorage> ring_;
  uint32_t slot_ = 0;
  int64_t batch_id_ = -1;
  std::span<const int64_t> indices_;
  std::span<std::byte> data_;
  std::vector<std::byte> owned_;
  std::vector<int64_t> owned_indices_;
};

class Loader {
 public:
  // Checks the thread budget, creates the ring, forks the workers. `batches`
  // lists the sample indices of every batch, in delivery order.
  Loader(const LoaderOptions& options, std::vector<std::vector<int64_t>> batches, WorkerMain worker_main,
         const ForkHooks& hooks = {});
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The next batch, or nullopt after the last one. Throws BatchFailedError
  // (iteration may continue after it), WorkerDiedError or LoaderTimeoutError
  // (the loader is closed after those).
  std::optional<Batch> next();
  // Stops and reaps the workers. Delivered batches stay valid. Idempotent.
  void close() noexcept;

  const ThreadPlan& plan() const noexcept { return plan_; }
  std::vector<pid_t> worker_pids() const;
  std::size_t num_batches() const noexcept { return batches_.size(); }
  uint32_t num_slots() const noexcept;
  int64_t copied_out() const noexcept { return copied_out_; }

 private:
  void post_more();
  void stop_workers(std::chrono::milliseconds grace) noexcept;
  uint32_t wait_for_delivery();
  void check_workers();
  [[noreturn]] void fail_closed(const std::string& message, bool timeout);
  std::string describe_holder(uint32_t slot) const;

  LoaderOptions options_;
  ThreadPlan plan_;
  std::vector<std::vector<int64_t>> batches_;
  std::shared_ptr<RingStorage> ring_;
  std::unique_ptr<WorkerPool> pool_;
  std::vector<uint32_t> inflight_;  // slots posted and not yet delivered, by batch id
  std::size_t next_post_ = 0;
  std::size_t delivered_ = 0;
  uint32_t inflight_target_ = 0;
  int64_t copied_out_ = 0;
  std::chrono::steady_clock::time_point last_check_{};
  std::string broken_;  // set once a fatal error closed the loader
  bool broken_timeout_ = false;
};

}  // namespace spindle
