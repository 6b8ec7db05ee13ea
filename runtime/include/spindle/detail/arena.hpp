#pragma once
// Arena: the one pool of threads a loader tree may use for parallel native
// work, a oneTBB task_arena in the consumer process sized from the thread
// budget. TBB is hidden behind this interface so that nothing else in the
// runtime can start a pool of its own.
//
// The size comes from leases, not from whichever loader was built last: each
// live loader holds one ArenaLease, and the arena runs the sum of the live
// leases. What a loader's lease holds is decided where its tasks are granted
// (BudgetLedger::acquire, under the ledger's lock): its ThreadPlan's
// arena_threads, which the plan keeps within cpus − 1 less what the process's
// other live loaders hold, plus, in threads mode, one thread per worker (the
// workers are arena threads). So every arena thread belongs to exactly one
// lease in the ledger, a train and an eval loader in one process together
// never run more copy-out threads than one loader could, and a closed loader
// gives its share back at once (Loader::close).
//
// While any lease lives, TBB is capped process-wide at that size plus the
// calling thread (tbb::global_control), also at 0 extra threads, so no other
// TBB use in this process exceeds the budget either. With no lease alive the
// cap is removed and parallel calls run on the calling thread alone.
//
// Only the process that took the leases may run parallel work in the arena:
// forked workers inherit the object but not its threads, so a worker calling
// in throws. A forked child that takes a lease of its own starts afresh (the
// inherited leases are its parent's and give nothing back there).

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

namespace spindle::detail {

class Arena;

// A share of the arena, held for as long as the threads are needed (a loader
// holds one for its lifetime). Move-only; the destructor gives the share back.
class ArenaLease {
 public:
  ArenaLease() noexcept = default;  // holds nothing
  ArenaLease(ArenaLease&& o) noexcept;
  ArenaLease& operator=(ArenaLease&& o) noexcept;
  ~ArenaLease();
  ArenaLease(const ArenaLease&) = delete;
  ArenaLease& operator=(const ArenaLease&) = delete;

  // Gives the share back now; the lease then holds nothing.
  void reset() noexcept;
  bool held() const noexcept { return id_ != 0; }
  // The extra threads this lease asked for (clamped at 0).
  int extra_threads() const noexcept { return extra_; }

 private:
  friend class Arena;
  ArenaLease(uint64_t id, pid_t pid, int extra) noexcept : id_(id), pid_(pid), extra_(extra) {}

  uint64_t id_ = 0;  // 0: holds nothing
  pid_t pid_ = 0;    // the process that took it: a forked copy gives nothing back
  int extra_ = 0;
};

// Long-running bodies started on the arena's threads (Arena::start); the
// destructor waits for them.
class ArenaJobs {
 public:
  ~ArenaJobs();
  ArenaJobs(const ArenaJobs&) = delete;
  ArenaJobs& operator=(const ArenaJobs&) = delete;
  // Blocks until every body has returned.
  void wait() noexcept;

 private:
  friend class Arena;
  struct Shared;
  explicit ArenaJobs(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<void> arena_;  // the tbb::task_arena the jobs run in
};

class Arena {
 public:
  // The process-wide arena.
  static Arena& global();

  // Adds `extra_threads` (beyond the calling thread; negative counts as 0) to
  // the arena for the lease's lifetime (take them from a ThreadPlan: the
  // arena does not check them against the budget). Installs the
  // process-wide TBB cap at once. A running parallel call keeps the arena it
  // started in; the new size takes effect for the next call.
  [[nodiscard]] ArenaLease lease(int extra_threads);
  // Extra threads the arena runs now: the sum of the live leases.
  int extra_threads() const noexcept;

  // Splits [0, n) into chunks and runs body(begin, end) across the arena.
  void parallel_for(std::size_t n, std::size_t grain,
                    const std::function<void(std::size_t, std::size_t)>& body);
  // memcpy across the arena, in chunks of at least 1 MiB.
  void parallel_copy(void* dst, const void* src, std::size_t bytes);
  // Runs body(0) .. body(n - 1) at once, each on its own arena thread, and
  // returns; they may run for long (a loader's workers in threads mode).
  // Throws std::logic_error if the arena has fewer than n extra threads (take
  // a lease for them first). Exceptions a body throws are swallowed: a body
  // reports its own errors.
  [[nodiscard]] std::unique_ptr<ArenaJobs> start(int n, std::function<void(int)> body);

 private:
  friend class ArenaLease;
  Arena() = default;
  void release(const ArenaLease& lease) noexcept;
};

}  // namespace spindle::detail
