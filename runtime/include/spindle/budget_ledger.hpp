#pragma once
// BudgetLedger: who holds which share of the thread budget, within this
// process and across the processes of one uid on one node.
//
// ThreadBudget reads what the kernel counts now (/proc, pids.current). That
// misses tasks a loader was granted but has not started yet: two loaders (in
// one process, or in 8 ranks started at the same moment) would both be given
// the same headroom. The ledger records each grant as a lease of `tasks`
// (workers + arena threads), of which `pending` are not started yet, and the
// budget a new loader may use is
//
//   available = ThreadBudget(now).budget() − Σ pending over every live lease
//
// (its own process's and the others'). A lease is pending in full when taken;
// once its workers exist (Loader forked them) it marks them started, and they
// are counted by /proc from then on, not by the ledger. The arena threads stay
// pending for the lease's lifetime: TBB starts them lazily, so they may or may
// not be in /proc; counting them twice is the safe side (at most cpus − 1 per
// process).
//
// Across processes the leases live in one file per uid, /dev/shm/spindle-ledger.<uid>
// (see "The node budget ledger" in docs/architecture.md for why this one name
// outlives its loaders and how it is kept safe). Every access opens the file,
// takes flock(LOCK_EX) on that descriptor, reclaims the leases of dead
// processes, re-registers this process's live leases if they are missing,
// reads or changes, and closes it again: no descriptor (and so no lock) is
// kept, and a fork in another thread during the access closes the child's copy
// at once (pthread_atfork). A grant is computed and recorded under that one
// lock, so racing starts serialize and never hand out the same headroom twice.
//
// The file is never trusted: a foreign owner, a mode other than 0600, a
// symlink, or a lock that cannot be had within a few seconds makes the ledger
// warn once (LedgerStatus::warning) and fall back to this process's leases
// only; a bad magic, version, size or an impossible field rebuilds it empty.
//
// SPINDLE_LEDGER=off disables the shared table (per-process budgeting only);
// SPINDLE_LEDGER_PATH=<file> puts it elsewhere (tests).

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <spindle/thread_budget.hpp>

namespace spindle {

// BudgetPolicy (what a loader does when the budget is short) is public: thread_budget.hpp.

// One lease as stored in the node table (for `spindle doctor` and tests).
struct LeaseInfo {
  pid_t pid = 0;
  uint64_t start_time = 0;  // /proc/<pid>/stat field 22 (clock ticks since boot)
  uint64_t lease_id = 0;
  int64_t tasks = 0;        // workers + arena threads granted
  int64_t pending = 0;      // of those, not started yet
  bool alive = false;       // pid exists with the same start time
};

class BudgetLedger;

// A share of the budget, held for as long as its tasks live (a Loader holds
// one). Move-only; the destructor gives the share back. A forked copy gives
// nothing back (the lease is its parent's).
class LedgerLease {
 public:
  LedgerLease() noexcept = default;
  LedgerLease(LedgerLease&& o) noexcept;
  LedgerLease& operator=(LedgerLease&& o) noexcept;
  ~LedgerLease();
  LedgerLease(const LedgerLease&) = delete;
  LedgerLease& operator=(const LedgerLease&) = delete;

  // `n` of the leased tasks now exist (and so are counted by /proc).
  void started(int64_t n) noexcept;
  void reset() noexcept;
  bool held() const noexcept { return id_ != 0; }
  uint64_t id() const noexcept { return id_; }

 private:
  friend class BudgetLedger;
  LedgerLease(BudgetLedger* ledger, uint64_t id, pid_t pid) noexcept : ledger_(ledger), id_(id), pid_(pid) {}
  BudgetLedger* ledger_ = nullptr;
  uint64_t id_ = 0;
  pid_t pid_ = 0;
};

// What a start keeps free besides its workers' own threads (LoaderOptions::reserve_tasks and
// worker_tasks): the consumer's threads beyond the loader, and the threads each worker's runtimes run.
struct StartNeeds {
  int64_t reserve = 0;       // tasks left free for the rest of the consumer process
  int64_t worker_tasks = 1;  // tasks one worker process runs: its own thread and its runtimes'
};

// Tasks a start holds back from a grant of `num_workers` workers when `free` tasks are free
// (kUnlimited or none free: nothing), so that `needs.reserve` and the workers' threads beyond their
// own (`needs.worker_tasks` - 1 each) stay free. Under kShrink all of it, leaving at least one worker:
// the workers that fit at `worker_tasks` each run. Under kWait and kFail only what leaves
// `num_workers` fitting: the workers asked are the caller's contract, so neither policy refuses or
// waits where it would not without it (what is not held back comes out of the arena).
int64_t start_holdback(int64_t free, int num_workers, BudgetPolicy policy, const StartNeeds& needs) noexcept;

// What acquire() granted.
struct LedgerGrant {
  ThreadPlan plan;            // num_workers may be below the request (kShrink)
  LedgerLease lease;
  int requested = 0;          // workers asked for
  int64_t live_budget = 0;    // ThreadBudget::budget() when granted
  int64_t pending_seen = 0;   // tasks other leases held but had not started
  int64_t held_back = 0;      // tasks kept free for the consumer and the workers' runtimes (start_holdback)
  bool shared = false;        // the node table was used (false: this process only)
  std::string note;           // non-empty when shrunk: one line with the numbers
};

// Where the table is and whether it can be used.
struct LedgerStatus {
  std::string path;           // empty: disabled
  bool usable = false;
  std::string warning;        // why it is not used (foreign owner, bad mode, lock timeout...)
};

class BudgetLedger {
 public:
  // Fixed limits of the node table: at most kCapacity live leases per uid
  // (beyond that a lease is kept in this process only), no lease above
  // kMaxTasks tasks.
  static constexpr uint32_t kCapacity = 256;
  static constexpr int64_t kMaxTasks = int64_t{1} << 22;  // pid_max's ceiling
  static constexpr auto kPollPeriod = std::chrono::milliseconds(50);
  static constexpr auto kLockTimeout = std::chrono::seconds(5);
  // kShrink with nothing free while other processes hold pending tasks
  // retries this long before refusing: they may be between fork and marking
  // the worker started.
  static constexpr auto kSettle = std::chrono::seconds(2);

  // The process's ledger; its table path is read from the environment on
  // every access (SPINDLE_LEDGER, SPINDLE_LEDGER_PATH, default per uid).
  static BudgetLedger& global();
  // A ledger over `path` ("" = this process only), for tests.
  explicit BudgetLedger(std::optional<std::string> path);
  ~BudgetLedger();
  BudgetLedger(const BudgetLedger&) = delete;
  BudgetLedger& operator=(const BudgetLedger&) = delete;

  // Grants `num_workers` workers (+ the arena threads the plan allows, within
  // cpus − 1 less local_arena_threads()) out of
  // read_budget().budget() minus every live lease's pending tasks, less what
  // `needs` keeps free (start_holdback), following `policy` when short.
  // `timeout` bounds kWait (0: no bound). While waiting, `poll` is called
  // between attempts instead of sleeping kPollPeriod: it paces the wait and
  // may throw (e.g. on Ctrl-C). Throws ThreadBudgetError with the numbers
  // when nothing fits.
  LedgerGrant acquire(int num_workers, BudgetPolicy policy, std::chrono::milliseconds timeout,
                      const std::function<ThreadBudget()>& read_budget,
                      const std::function<void()>& poll = {}, const StartNeeds& needs = {});

  // Threads of this process that run now and are about to be stopped and
  // started again by something spindle does (numpy's OpenBLAS pool, which
  // its fork handler stops at each of spindle's forks and which is restarted
  // after them): a lease of `tasks`, pending from now until it is given
  // back, so that no loader of this uid (this process's included) takes
  // their tasks while they are down. Granted without a check: until they
  // stop, /proc counts them, and counting them twice is the safe side. Give
  // it back once they run again (or will not be restarted).
  [[nodiscard]] LedgerLease reserve_stopping(int64_t tasks);
  // Tasks free now for the threads `excluding` holds (pass its lease): the
  // live budget less every other live lease's pending tasks, read under the
  // table's lock as acquire() reads it.
  int64_t available(const LedgerLease& excluding, const std::function<ThreadBudget()>& read_budget = {});

  // The live leases in the node table (dead ones reclaimed first) or, if it is
  // not usable, this process's.
  std::vector<LeaseInfo> leases();
  LedgerStatus status();
  // Σ pending of this process's live leases.
  int64_t local_pending();
  // Σ arena threads (plan.arena_threads) of this process's live leases: what
  // a new plan's arena_threads is kept below arena_limit by.
  int local_arena_threads();

  // The default table path for this uid: /dev/shm/spindle-ledger.<uid>.
  static std::string default_path();

 private:
  friend class LedgerLease;
  struct Impl;
  void release(uint64_t id, pid_t pid) noexcept;
  void mark_started(uint64_t id, pid_t pid, int64_t n) noexcept;
  Impl* impl_;
};

// procfs::read_stat(pid).start_time (stat field 22, clock ticks since boot);
// nullopt if the process is gone or its stat cannot be read.
std::optional<uint64_t> process_start_time(pid_t pid, const std::string& proc_root = "/proc");

}  // namespace spindle
