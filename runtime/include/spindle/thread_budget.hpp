#pragma once
// ThreadBudget: how many more tasks (threads or processes) this loader may
// create, computed from the limits the kernel will actually enforce.
//
// The kernel refuses pthread_create/fork with EAGAIN when either
//   - the real uid already has RLIMIT_NPROC tasks (all threads of all its
//     processes count, unless the uid is root or holds CAP_SYS_RESOURCE), or
//   - the cgroup (or any ancestor) reached pids.max.
// The budget is the smallest headroom among those, optionally capped by the
// user. A loader needs one task per worker process; whatever is left (minus a
// small reserve) may become threads of the one TBB arena in the consumer.

#include <array>
#include <cstdint>
#include <optional>
#include <string>

namespace spindle {

// Where the numbers come from. Defaults read the live system; tests point the
// roots at fake trees and set the limits directly.
struct BudgetSources {
  std::string proc_root = "/proc";
  std::string cgroup_root = "/sys/fs/cgroup";
  std::optional<uint32_t> uid;           // default: getuid()
  std::optional<int64_t> nproc_limit;    // default: getrlimit(RLIMIT_NPROC) soft
  std::optional<bool> nproc_exempt;      // default: uid == 0
  std::optional<int> cpus;               // default: sched_getaffinity count
  std::optional<int64_t> user_cap;       // optional cap on tasks the loader adds
};

// What a loader does when fewer tasks are available than it asked for.
enum class BudgetPolicy {
  kShrink,  // run with as many workers as fit (at least 1; with none free, retried for
            // kSettle while other leases are pending), one warning with the numbers
  kWait,    // poll the ledger until enough tasks are free, up to the loader's timeout
  kFail,    // throw ThreadBudgetError at once
};

// The policies' names, in BudgetPolicy's order: the one list (Python: _core.BUDGET_POLICIES).
inline constexpr std::array<const char*, 3> kBudgetPolicyNames = {"shrink", "wait", "fail"};
// Where a policy nobody passed is read from (then "shrink"): every front end's switch.
inline constexpr const char* kBudgetPolicyVariable = "SPINDLE_BUDGET_POLICY";

// Parses "shrink" / "wait" / "fail"; throws std::invalid_argument otherwise.
BudgetPolicy parse_budget_policy(const std::string& name);
const char* budget_policy_name(BudgetPolicy p) noexcept;
// The policy a loader runs with: `name` if given, else $SPINDLE_BUDGET_POLICY if set, else kShrink.
// Throws std::invalid_argument naming where a bad name came from (budget_policy, or the variable)
// and the names allowed. The one resolution: every front end asks here (_core.resolve_budget_policy).
BudgetPolicy resolve_budget_policy(const std::optional<std::string>& name);

// Extra threads the process's one TBB arena may run now: the sum of its live loaders' leases
// (ThreadPlan::arena_threads, and their workers in threads mode). spindle doctor shows it.
int arena_extra_threads() noexcept;

// A quantity that may be unlimited.
inline constexpr int64_t kUnlimited = INT64_MAX;

struct ThreadPlan {
  int num_workers = 0;     // worker processes, one thread each
  // Extra TBB threads this loader adds to the process's one arena (0: the
  // caller only): what the budget leaves after the workers and kReserve, and
  // no more than arena_limit less what the process's live loaders already
  // hold, so that all of them together never exceed arena_limit.
  int arena_threads = 0;
  // The most extra threads the process's one arena runs for copy-out and
  // native ops, for all its loaders together: cpus - 1 (the calling thread is
  // the last slot). Threads-mode workers are counted apart (arena.hpp).
  int arena_limit = 0;
  int64_t budget = 0;      // the budget the plan was cut from
};

class ThreadBudget {
 public:
  // Tasks kept free for the rest of the consumer process (a logging thread,
  // a subprocess) when sizing the arena.
  static constexpr int64_t kReserve = 2;

  explicit ThreadBudget(const BudgetSources& sources = {});

  int64_t nproc_limit() const noexcept { return nproc_limit_; }
  bool nproc_exempt() const noexcept { return nproc_exempt_; }
  int64_t uid_tasks() const noexcept { return uid_tasks_; }
  int64_t nproc_headroom() const noexcept;
  int64_t cgroup_limit() const noexcept { return cgroup_limit_; }
  int64_t cgroup_current() const noexcept { return cgroup_current_; }
  int64_t cgroup_headroom() const noexcept { return cgroup_headroom_; }
  const std::string& cgroup_path() const noexcept { return cgroup_path_; }
  int cpus() const noexcept { return cpus_; }
  int64_t user_cap() const noexcept { return user_cap_; }
  // min(nproc headroom, cgroup headroom, user cap): tasks the loader may add.
  int64_t budget() const noexcept;
  // The same with `pending` tasks, granted to other leases but not started
  // yet (so not in /proc), taken off the node's headroom (not off the user
  // cap, which is per loader): min(nproc − pending, cgroup − pending, cap).
  int64_t budget(int64_t pending) const noexcept;

  // Cuts a plan for `num_workers` workers out of budget(pending), with
  // arena_threads = clamp(budget(pending) − workers − kReserve, 0,
  // arena_limit − arena_held), where `arena_held` is the arena threads the
  // process's live loaders hold already. Throws ThreadBudgetError, with all
  // the numbers and what to change, when the workers do not fit.
  ThreadPlan plan(int num_workers, int64_t pending = 0, int arena_held = 0) const;

  // One line with every number, for errors and logs.
  std::string describe() const;

 private:
  int64_t nproc_limit_ = kUnlimited;
  bool nproc_exempt_ = false;
  int64_t uid_tasks_ = 0;
  int64_t cgroup_limit_ = kUnlimited;
  int64_t cgroup_current_ = 0;
  int64_t cgroup_headroom_ = kUnlimited;
  std::string cgroup_path_;
  int cpus_ = 1;
  int64_t user_cap_ = kUnlimited;
};

// Sums the "Threads:" of every /proc/<pid>/status whose real uid is `uid`
// (procfs::uid_tasks, the one reader).
int64_t count_uid_tasks(const std::string& proc_root, uint32_t uid);

// Counts the threads of one process (/proc/<pid>/task entries).
int count_process_threads(int pid, const std::string& proc_root = "/proc");

}  // namespace spindle
