#pragma once
// Loader: the consumer side of spindle. It owns the shared segment, starts the
// workers, posts batches to the index queue, and hands out finished batches as
// leases on ring slots. The worker side is worker_context.hpp.
//
// Flow control is done by the consumer alone: a batch is posted only into a
// free slot, so the queue can never overflow and a slot a user still holds is
// never rewritten. If the user holds so many batches that no slot would be
// left for the pipeline, the batch being delivered is copied out of the ring
// (counted in copied_out()) so that iteration never deadlocks.

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <spindle/batch_plan.hpp>
#include <spindle/error.hpp>
#include <spindle/launcher.hpp>
#include <spindle/loader_stats.hpp>
#include <spindle/slot_layout.hpp>
#include <spindle/thread_budget.hpp>
#include <spindle/worker_context.hpp>

namespace spindle {

// Adaptive processes (LoaderOptions::adaptive): the most processes the core
// chooses when num_workers is 0, per usable cpu and in all.
inline constexpr int kAutoPerCpu = 8;
inline constexpr int kAutoMax = 64;
// That count for this process's usable cpus (affinity, cgroup cpu.max): the most processes of an
// adaptive loader with num_workers 0, and the logical workers a front end gives adaptive streams
// (their data is defined by them: chosen once, from the machine, never from the moment's load).
int auto_workers(const BudgetSources& sources = {});
// LoaderOptions::max_replacements = kReplaceEachWorker: lost workers replaced per epoch, as many as
// the workers asked (requested_workers(); under "auto" the most processes the core chose), at least
// kMinReplacements. replacement_limit(n) is that count for n processes (a front end that restarts its
// own streams, spindle.grain, counts its losses by it).
inline constexpr int kReplaceEachWorker = -1;
inline constexpr int kMinReplacements = 3;
constexpr int replacement_limit(int num_workers) noexcept {
  return num_workers > kMinReplacements ? num_workers : kMinReplacements;
}
// The processes an adaptive loader starts with: the cores idle this instant (`cpus` less the other
// tasks runnable now, /proc/stat's procs_running, fewest of three readings a millisecond apart),
// at least 1 and at most `cpus`; the controller's "a core is free" at its start.
int idle_cores_now(int cpus);

struct LoaderOptions {
  int num_workers = 1;
  uint32_t batch_capacity = 1;   // max samples per batch
  // Payload bytes reserved per slot up front (0: the 64 KiB minimum). Slots
  // grow in place when a worker needs more, up to max_batch_bytes.
  uint64_t slot_bytes = 0;
  // The largest batch a slot may hold: address space set aside per slot
  // (memory is used only as batches need it).
  uint64_t max_batch_bytes = uint64_t{1} << 30;
  int prefetch_factor = 2;       // batches in flight per worker
  bool in_order = true;          // deliver by batch id; false: as they finish
  // Streams instead of planned batches: no BatchPlan; batch k is asked of
  // worker k mod N (skipping workers whose stream ended, see
  // WorkerContext::exhausted), each up to batch_capacity samples; next()
  // ends when every worker's stream has ended.
  bool round_robin = false;
  // Planned batches: batch k always goes to worker k mod N (as torch assigns
  // them), so per-worker state such as random streams sees the same batches
  // run after run; with in_order false, to the next worker in turn that has
  // fewer than prefetch_factor batches outstanding (torch's rule out of
  // order). Off: the first free worker takes the next batch.
  bool assign_in_turn = false;
  // Planned batches that the consumer feeds as it goes (Loader::feed), the
  // way torch's iterator draws its sampler: the plan given at construction
  // or reset() is only the first batches, and next() ends once end_feed()
  // was called and every batch fed is delivered.
  bool fed = false;
  // Round-robin and assign_in_turn: the data stays defined by num_workers as
  // asked even when the budget starts fewer processes (kShrink). Logical
  // worker l (its stream, or batches k with k mod num_workers == l) is served
  // by process l mod P; items carry l (WorkItem::stream) and the turn goes
  // over the logical workers, so the elements and their order are those of
  // num_workers processes. Off: fewer processes mean fewer streams/turns.
  // The worker body must then run each logical worker's stream in turn
  // (WorkerContext::logical_workers).
  bool logical_workers = false;
  // With logical_workers: the most processes to run the num_workers logical
  // workers on (0: num_workers). A front end that restarts its streams on
  // another count (LoaderOptions::adaptive's advice) sets it; the budget may
  // start fewer still. Adaptive where any worker takes any batch: the
  // processes to start with (0: the cores idle now); a front end sets it to
  // what its last epoch ended on, so each epoch does not find it again.
  int processes = 0;
  int first_worker = 0;  // round-robin: the worker asked for batch 0 (resuming a checkpoint)
  std::chrono::milliseconds timeout{0};  // max wait for one batch; 0 = forever
  std::optional<int64_t> max_threads;    // user cap on tasks the loader adds
  // When fewer tasks are free than num_workers (the live budget less what
  // other loaders leased and have not started, budget_ledger.hpp): run with
  // fewer workers (kShrink; budget_note() says so), wait up to `timeout` for
  // leases to come back (kWait; 0 waits without bound), or throw (kFail).
  BudgetPolicy budget_policy = BudgetPolicy::kShrink;
  // Called between attempts while kWait waits, in place of a 50 ms sleep
  // (BudgetLedger::acquire); may throw to stop waiting (the Python layer
  // sleeps there without the GIL and raises KeyboardInterrupt from it).
  std::function<void()> budget_poll;
  BudgetSources budget_sources;          // where limits are read (tests fake it)
  // Native pipelines with on_error="skip" (PipelineOptions::max_skip_ratio):
  // next() throws SkipRatioError once the samples workers skipped
  // (Batch::skipped()) exceed this share of the samples delivered, judged
  // from the 100th sample on and when the epoch ends. nullopt: no check.
  std::optional<double> max_skip_ratio;
  // Keep statistics (Loader::stats(): the wait histogram, each worker's busy
  // time and samples). Off: next() and the workers measure nothing.
  bool stats = true;
  // When one next() has waited this long, on_stall is called once for that
  // wait with what the workers are doing (0: never).
  std::chrono::milliseconds stall_warning{30000};
  // The stall warning's receiver (empty: one line on stderr). Called from the
  // thread in next(); may throw to leave next() (the loader stays intact).
  std::function<void(const std::string&)> on_stall;
  // A worker process lost mid-epoch (killed by a signal, the OOM killer, an
  // abort, an exit) is started again in its place, and the batch it was
  // producing is posted again, up to this many times per epoch; then, or when
  // the same sample was being produced at two deaths (a poison sample, never
  // retried a third time), WorkerDiedError names the cause. 0: the first death
  // closes the loader with WorkerDiedError. Planned batches only: a stream
  // (round_robin) cannot be taken up where a lost process left it, so there a
  // death is always fatal. The batches and their order are those of a run
  // without the death; per-worker state (a random generator) starts again.
  // kReplaceEachWorker: replacement_limit(the workers asked), resolved at construction.
  int max_replacements = 0;
  // Adaptive processes (Python's num_workers="auto"): num_workers is the most
  // processes (0: the core's choice, kAutoPerCpu per usable cpu, at most
  // kAutoMax, then what the budget grants). It starts as many processes as
  // cores are idle (idle_cores_now, at least one), or `processes`; the loader
  // adds processes while next() waits for data and a core is free, and
  // retires one (at its next claim, never mid-batch) when the workers idle
  // because the consumer sets the pace, or when the user's task budget runs
  // short (loader_autoscale.cpp). Where any worker may take any batch
  // (planned batches, neither round_robin nor assign_in_turn, forked or
  // spawned processes) the loader changes its processes itself: which
  // process produces a batch never changes it. Streams with logical_workers
  // (round_robin) cannot move a stream between processes: there the same
  // decisions are advice (Loader::advised_processes()), and the front end
  // starts its streams again on that many processes from their states, as
  // from a checkpoint; num_workers is then the logical workers, which stay.
  bool adaptive = false;
  // Tasks of the user's budget kept free for the rest of the consumer (its
  // threads, a checkpoint's burst). The start holds them back from the grant
  // (under "shrink", fewer processes; start_holdback in budget_ledger.hpp), and
  // while batches flow, under a finite budget, processes retire when fewer are
  // free and none is added that would leave fewer (loader_autoscale.cpp).
  int64_t reserve_tasks = ThreadBudget::kReserve;
  // Tasks one worker process runs: its own thread and the threads of the
  // runtimes it inherits (the Python front end: the runtime table's worker
  // threads, or the most a worker was seen running). The start grants
  // processes at this rate under "shrink".
  int64_t worker_tasks = 1;
  // One line per change of the processes, with its reason (empty: none).
  // Called from the thread in next().
  std::function<void(const std::string&)> on_resized;
  // One line per replacement (empty: on stderr); called from the thread in
  // next() and may throw to leave it (the replacement has happened).
  std::function<void(const std::string&)> on_replaced;
};

struct RingStorage;  // the segment + ring, shared by the loader and its leases
struct AutoScale;    // adaptive processes' measurements (loader_internal.hpp)
struct LoaderLeases;  // the loader's shares of the arena and of the node's budget
namespace detail {
class WorkerPool;
class ArenaJobs;
}  // namespace detail

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
  std::size_t count() const noexcept { return indices_.size(); }
  // The payload in use: the field blocks (kArrays), the byte string (kBytes),
  // or the slot's first slot_bytes (kRaw).
  std::span<std::byte> data() const noexcept { return data_; }
  PayloadKind kind() const noexcept { return contents_.kind; }
  // kArrays: the layout the worker wrote the batch in, and the front end's
  // structure bytes that came with it.
  const SlotLayout& layout() const noexcept { return contents_.layout; }
  std::string_view structure() const noexcept { return contents_.structure; }
  // Samples of this batch the worker could not read and replaced
  // (on_error="skip" in a native pipeline; SlotHeader::skipped).
  uint32_t skipped() const noexcept { return skipped_; }
  // Round-robin streams: the logical worker whose stream this batch is from
  // (-1: planned batches), and where that stream stands after it
  // (WorkerContext::set_stream_position; 0 if the body does not say).
  int stream() const noexcept { return stream_; }
  uint64_t stream_position() const noexcept { return stream_position_; }
  // Field i as `count()` rows of T (kArrays). Throws std::invalid_argument if
  // T's size is not the field's item size.
  template <class T>
  std::span<T> field(std::size_t i) const {
    check_field(i, sizeof(T));
    const std::size_t per_row = layout().row_bytes(i) / sizeof(T);
    return {reinterpret_cast<T*>(data_.data() + layout().offset(i)), per_row * count()};
  }
  // Byte field i (FieldKind::kBytes: captions, JSON) as `count()` byte
  // strings over the slot; throws if field i is not one, std::runtime_error
  // if the worker's offsets leave the field's block.
  BytesColumn bytes(std::size_t i) const {
    if (kind() != PayloadKind::kArrays || i >= layout().num_fields())
      check_field(i, 1);  // throws: no such field
    return layout().bytes_column(data_, i, count());
  }
  bool copied_out() const noexcept { return !owned_.empty(); }

 private:
  friend class Loader;
  Batch(std::shared_ptr<RingStorage> ring, uint32_t slot);
  void copy_out();
  void release() noexcept;
  void check_field(std::size_t i, std::size_t item) const;

  std::shared_ptr<RingStorage> ring_;
  uint32_t slot_ = 0;
  int64_t batch_id_ = -1;
  uint32_t skipped_ = 0;
  int stream_ = -1;
  uint64_t stream_position_ = 0;
  std::span<const int64_t> indices_;
  std::span<std::byte> data_;
  SlotContents contents_;
  std::vector<std::byte> owned_;
  std::vector<int64_t> owned_indices_;
  std::vector<std::byte> owned_descriptor_;
};

class Loader {
 public:
  // Checks the thread budget, creates the ring, starts the workers as
  // `launcher` says (forks, zygote forks, new programs or arena threads; see
  // launcher.hpp). `batches` holds the sample indices of every batch, in
  // delivery order. With Launcher::threads a worker cannot be killed: close()
  // waits for the batches being filled, and a crash in the worker body is a
  // crash of this process.
  Loader(const LoaderOptions& options, BatchPlan batches, Launcher launcher);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The next batch, or nullopt after the last one or once the loader is
  // closed (also by close() from another thread while this waits). Throws
  // BatchFailedError (iteration may continue after it), WorkerDiedError or
  // LoaderTimeoutError (the loader is closed after those); adaptive streams
  // throw ProcessesAdvised when advice comes while no batch is ready (the
  // loader intact: the front end closes it and starts again). `poll`, if given,
  // is called every supervision period (~50 ms) while waiting; whatever it
  // throws (e.g. the Python layer's KeyboardInterrupt) leaves next() with the
  // loader intact. Calls from several threads are serialized.
  std::optional<Batch> next(const std::function<void()>& poll = {});
  // Starts a new epoch of `batches` on the same ring and workers (persistent
  // workers). Batches of the previous epoch not yet claimed by a worker are
  // taken back, those being filled are waited for; both are discarded.
  // Throws like next() if the loader failed.
  void reset(BatchPlan batches);
  // Fed loaders (LoaderOptions::fed): batches after those posted so far,
  // and the end of the epoch's batches. next() on a fed loader whose batches
  // are all delivered and whose feed has not ended throws std::logic_error
  // (it would wait forever). Both throw std::logic_error on a loader that is
  // not fed or whose feed has ended, and like next() if the loader failed.
  void feed(BatchPlan more);
  void end_feed();
  // Round-robin loaders: starts a new epoch of every worker's stream on the
  // same workers (nothing is forked). Items of the old epoch not yet claimed
  // are taken back, those being filled are waited for; both are discarded.
  // Then every stream counts as open again, batch 0 is asked of
  // `first_worker`, and the first item each worker claims carries
  // WorkItem::new_stream with `messages[w]` (none if `messages` is empty): the
  // worker main starts its stream again before producing it. Throws like
  // next() if the loader failed; std::invalid_argument for a bad worker or
  // message count, or a message larger than max_batch_bytes.
  void reset_streams(int first_worker = 0, std::vector<std::string> messages = {});
  // Stops and reaps the workers: idle ones exit at once, busy ones get
  // `grace` to finish their batch before SIGKILL. Delivered batches stay
  // valid. The loader's leases (ledger and arena) are given back before it
  // returns. Idempotent and safe from any thread: a next() waiting elsewhere
  // returns nullopt at once.
  void close(std::chrono::milliseconds grace = std::chrono::milliseconds(1000)) noexcept;
  bool closed() const noexcept { return closing_.load(std::memory_order_acquire); }

  const ThreadPlan& plan() const noexcept { return plan_; }
  // Workers asked for (plan().num_workers may be fewer under kShrink).
  int requested_workers() const noexcept { return requested_workers_; }
  // Streams / batch turns the data is defined by: requested_workers() with
  // LoaderOptions::logical_workers, else the processes started. Round-robin
  // first_worker and reset_streams' messages count these.
  int num_logical_workers() const noexcept { return static_cast<int>(logical_); }
  // Non-empty when the loader runs with fewer workers than asked: one line
  // with the numbers, for the caller to show once.
  const std::string& budget_note() const noexcept { return budget_note_; }
  std::vector<pid_t> worker_pids() const;
  // How each worker ended, once the loader has reaped it (while supervising,
  // or at close()); nullopt for a worker not reaped yet. Kept after close().
  std::vector<std::optional<WorkerExit>> worker_exits() const;
  std::size_t num_batches() const noexcept { return batches_.size(); }
  uint32_t batch_capacity() const noexcept { return options_.batch_capacity; }
  uint32_t num_slots() const noexcept;
  int64_t copied_out() const noexcept { return copied_out_; }
  // Workers started again in place of lost ones (LoaderOptions::max_replacements), since the loader
  // started; and this epoch.
  int64_t replaced() const noexcept { return replaced_total_; }
  int replaced_this_epoch() const noexcept { return replaced_epoch_; }
  // Processes running now (not retiring); plan().num_workers is the most (LoaderOptions::adaptive).
  int processes() const noexcept { return running_.load(std::memory_order_relaxed); }
  // Adaptive streams (LoaderOptions::adaptive with round_robin): the processes the controller
  // wants the streams on, once it has decided (0: none yet); on_resized has had the line. The
  // loader goes on as it is (a next() waiting with no batch ready throws ProcessesAdvised): the
  // front end closes it and starts a new one with that many.
  int advised_processes() const noexcept { return advised_.load(std::memory_order_relaxed); }
  // The last change of the processes and why ("" before the first).
  std::string resize_reason() const;
  // Counts since the loader started or reset_stats() (loader_stats.hpp), and
  // the ring's and workers' state now. Safe from any thread, also while
  // next() waits, and after close().
  LoaderStats stats() const;
  void reset_stats();

 private:
  void record_wait(std::chrono::steady_clock::time_point since, uint32_t count, uint32_t skipped);
  std::string describe_workers() const;
  void prepare(bool threads);
  void launch(Launcher& launcher);
  void check_batches(const BatchPlan& batches) const;
  void rethrow_if_broken() const;
  void start();
  void post_more();
  // Batches remain to be posted (planned ones not yet posted, open streams; with fed_pending, also
  // a fed loader whose feed has not ended).
  bool more_to_post(bool fed_pending) const;
  // The batches kept in flight: workers * prefetch_factor, within the epoch's batches and `room`
  // (the ring's slots less the two kept for the user). The one place the target is computed.
  uint32_t inflight_target(std::size_t room, int workers) const noexcept;
  void drain_inflight();
  void stop_workers(std::chrono::milliseconds grace) noexcept;
  std::optional<uint32_t> wait_for_delivery(const std::function<void()>& poll);
  void check_workers();
  // A lost worker (max_replacements): its batch posted again, a process started in its place.
  void replace_lost(const WorkerExit& e, const std::string& died, std::optional<int64_t> sample, int64_t batch);
  // Slot s's batch (id, count, indices, stream) is written: clears the rest of its header and posts
  // it to its queue. post_again: a lost worker's slot, its batch as planned.
  void post_slot(uint32_t slot);
  // The queue an item of logical worker `stream` goes to (-1: the shared queue 0).
  uint32_t queue_of(int32_t stream) const noexcept;
  void post_again(uint32_t slot);
  void restart(int worker);
  // Adaptive processes (loader_autoscale.cpp): called at each delivery and while next() waits, as
  // often as next_look() asks; adds or retires processes once per window.
  void autoscale();
  // How long a waiting next() may sleep before autoscale() has a window to look at (its early look,
  // or its end).
  std::chrono::nanoseconds next_look(std::chrono::steady_clock::time_point now) const noexcept;
  // More or fewer processes as the controller decides: changed in place, or advised (streams).
  void grow(int n, const std::string& why);
  void shrink(int n, const std::string& why);
  void add_processes(int n, const std::string& why);
  void retire_process(const std::string& why);
  // The one line of a change from `before` processes to `after` (kept as resize_reason, to on_resized).
  void note_resize(int before, int after, const std::string& why);
  bool advises() const noexcept { return options_.adaptive && options_.round_robin; }
  // A retiring worker that exited at its claim: true (not a loss).
  bool retired(const WorkerExit& e);
  // pids_ and exits_ from the pool: the pids of the processes running (adaptive: not those retired).
  void refresh_pids();
  [[noreturn]] void fail_closed(const std::string& message, bool timeout);
  [[noreturn]] void fail_closed(const WorkerDiedError& died);
  void check_skips(bool final);
  std::string describe_holder(uint32_t slot) const;
  // Every worker has written its pid into its record: a spawned one only once
  // its interpreter has started and loaded the payload (seconds).
  bool workers_started() const noexcept;
  std::string describe_batch(std::size_t b) const;

  LoaderOptions options_;
  ThreadPlan plan_;
  // Its share of the arena (plan_.arena_threads, + the workers in threads
  // mode) and of the node's budget (pending until the workers are started,
  // then only the arena threads); both given back by close(), once the
  // workers are reaped.
  std::unique_ptr<LoaderLeases> leases_;
  int requested_workers_ = 0;
  std::string budget_note_;
  BatchPlan batches_;
  std::shared_ptr<RingStorage> ring_;
  std::unique_ptr<detail::WorkerPool> pool_;      // worker processes, or
  std::unique_ptr<detail::ArenaJobs> threads_;    // worker threads (Launcher::threads)
  // Forked workers' main, kept to start a replacement; destroyed with the Loader (its owner may
  // need a lock to drop it: the Python binding deletes a Loader holding the GIL), never by close().
  std::shared_ptr<WorkerMain> worker_main_;
  int64_t replaced_total_ = 0;
  int replaced_epoch_ = 0;
  std::vector<std::pair<int64_t, std::string>> deaths_;  // this epoch: the sample at each death (-1: none), its text
  std::vector<int> unstarted_;  // lost workers whose replacement could not start yet (tried again)
  // Adaptive processes: per worker id, 1 while it runs, 2 while it retires, 0 when not running.
  std::vector<uint8_t> live_;
  std::atomic<int> running_{0};
  std::atomic<int> advised_{0};  // advised_processes()
  std::unique_ptr<AutoScale> auto_;  // the controller's window (loader_internal.hpp)
  std::chrono::steady_clock::time_point wait_began_{};  // next() has waited since (epoch: not waiting)
  std::vector<uint32_t> inflight_;  // slots posted and not yet delivered, by batch id
  std::vector<bool> active_;        // round-robin: workers whose stream has not ended
  std::vector<bool> restart_;       // round-robin: workers whose next item starts a new stream
  std::vector<std::string> messages_;  // round-robin: each worker's start message for its new stream
  uint32_t logical_ = 1;            // the logical workers (num_logical_workers()); process of l: l mod num_workers
  uint32_t next_worker_ = 0;        // round-robin, and assigned out of order: the logical worker asked next
  std::vector<uint32_t> outstanding_;  // per worker: batches posted to its queue and not yet delivered
  std::vector<int32_t> assigned_;      // per slot: the logical worker its batch was posted for (-1: shared)
  bool feed_ended_ = false;          // fed: end_feed() was called this epoch
  std::size_t next_post_ = 0;
  std::size_t delivered_ = 0;
  uint32_t inflight_target_ = 0;
  int64_t copied_out_ = 0;
  std::chrono::steady_clock::time_point last_check_{};
  uint64_t samples_seen_ = 0;  // this epoch: samples delivered, and those skipped among them (max_skip_ratio)
  uint64_t samples_skipped_ = 0;
  std::string broken_;  // set once a fatal error closed the loader
  std::optional<WorkerDiedError> broken_died_;  // the death that closed it, raised again with its fields
  bool broken_timeout_ = false;
  // close() may come from any thread: it sets closing_, wakes the waiter,
  // then takes op_mu_ (held by next()/reset() for their whole run) before it
  // stops the workers, so nothing tears down the pool under a waiting next().
  std::atomic<bool> closing_{false};
  std::mutex op_mu_;
  mutable std::mutex pids_mu_;  // guards pids_ and exits_ (read by other threads, e.g. a watchdog)
  std::vector<pid_t> pids_;
  std::vector<std::optional<WorkerExit>> exits_;
  // Statistics (loader_stats.cpp): the consumer's counts, and the workers'
  // counters at the last reset_stats (theirs only grow; one writer each).
  mutable std::mutex stats_mu_;
  LoaderStats counts_;
  std::chrono::steady_clock::time_point stats_since_{};
  struct WorkerBaseline {
    uint64_t busy_ns = 0, samples = 0, bytes_fetched = 0;
  };
  std::vector<WorkerBaseline> baseline_;
};

}  // namespace spindle
