#include <spindle/thread_budget.hpp>

#include <dirent.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>

#include <spindle/error.hpp>
#include <spindle/procfs.hpp>

namespace spindle {
namespace {

int64_t budget_of(int64_t room, int64_t pending) {
  return room == kUnlimited ? kUnlimited : std::max<int64_t>(0, room - pending);
}

std::string fmt(int64_t v) { return v == kUnlimited ? "unlimited" : std::to_string(v); }

struct CgroupPids {
  int64_t limit = kUnlimited;
  int64_t current = 0;
  int64_t headroom = kUnlimited;
  std::string path;
};

// The tightest level of our cgroup's pids limits binds (procfs walks them).
CgroupPids read_cgroup_pids(const std::string& proc_root, const std::string& cgroup_root) {
  CgroupPids out;
  for (const auto& level : procfs::cgroup_pids_levels(std::nullopt, proc_root, cgroup_root)) {
    if (!level.max) continue;  // "max": no limit at this level
    int64_t room = std::max<int64_t>(0, *level.max - level.current);
    if (room < out.headroom) out = {*level.max, level.current, room, level.path};
  }
  return out;
}

int affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}


}  // namespace

int64_t count_uid_tasks(const std::string& proc_root, uint32_t uid) { return procfs::uid_tasks(uid, proc_root); }

int count_process_threads(int pid, const std::string& proc_root) {
  auto tids = procfs::thread_ids(pid, proc_root);
  return tids ? static_cast<int>(tids->size()) : 0;
}

ThreadBudget::ThreadBudget(const BudgetSources& s) {
  uint32_t uid = s.uid.value_or(getuid());
  if (s.nproc_limit) {
    nproc_limit_ = *s.nproc_limit;
  } else {
    rlimit rl{};
    if (getrlimit(RLIMIT_NPROC, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
      nproc_limit_ = static_cast<int64_t>(rl.rlim_cur);
  }
  nproc_exempt_ = s.nproc_exempt.value_or(uid == 0);
  uid_tasks_ = count_uid_tasks(s.proc_root, uid);
  auto pids = read_cgroup_pids(s.proc_root, s.cgroup_root);
  cgroup_limit_ = pids.limit;
  cgroup_current_ = pids.current;
  cgroup_headroom_ = pids.headroom;
  cgroup_path_ = pids.path;
  cpus_ = s.cpus.value_or(affinity_cpus());
  if (!s.cpus) {
    if (auto quota = procfs::cgroup_cpu_limit(std::nullopt, s.proc_root, s.cgroup_root)) cpus_ = std::min(cpus_, *quota);
  }
  if (s.user_cap) {
    if (*s.user_cap < 0) SPINDLE_THROW(std::invalid_argument, "spindle: max_threads must be >= 0");
    user_cap_ = *s.user_cap;
  }
}

int64_t ThreadBudget::nproc_headroom() const noexcept {
  if (nproc_exempt_ || nproc_limit_ == kUnlimited) return kUnlimited;
  return std::max<int64_t>(0, nproc_limit_ - uid_tasks_);
}

int64_t ThreadBudget::budget() const noexcept {
  return std::min({nproc_headroom(), cgroup_headroom_, user_cap_});
}

int64_t ThreadBudget::budget(int64_t pending) const noexcept {
  return std::min({budget_of(nproc_headroom(), pending), budget_of(cgroup_headroom_, pending), user_cap_});
}

ThreadPlan ThreadBudget::plan(int num_workers, int64_t pending, int arena_held) const {
  if (num_workers < 0) SPINDLE_THROW(std::invalid_argument, "spindle: num_workers must be >= 0");
  if (pending < 0) SPINDLE_THROW(std::invalid_argument, "spindle: pending tasks must be >= 0");
  if (arena_held < 0) SPINDLE_THROW(std::invalid_argument, "spindle: arena_held must be >= 0");
  const int64_t b = budget(pending);
  if (num_workers > b) {
    std::string which = b == user_cap_ ? "max_threads (your cap)"
                        : b == budget_of(cgroup_headroom_, pending) ? "the cgroup's pids.max (" + cgroup_path_ + ")"
                                                : "ulimit -u (RLIMIT_NPROC)";
    std::string leased = pending > 0 ? "; " + std::to_string(pending) +
                                           " tasks are leased to other loaders of this uid and not started yet"
                                     : "";
    SPINDLE_THROW(ThreadBudgetError,
                  "spindle: " + std::to_string(num_workers) + " workers do not fit the thread budget of " +
                      std::to_string(b) + " tasks, bound by " + which + ". " + describe() + leased +
                      ". Use at most " + std::to_string(b) +
                      " workers, or raise the limit (ulimit -u / pids.max / max_threads), or stop "
                      "processes of this user that hold threads.");
  }
  ThreadPlan p;
  p.num_workers = num_workers;
  p.budget = b;
  int64_t left = b == kUnlimited ? kUnlimited : b - num_workers - kReserve;
  // The calling thread is one of the arena's slots, so cpus-1 extra threads
  // give the arena full use of the CPUs.
  p.arena_limit = std::max(0, cpus_ - 1);
  p.arena_threads = static_cast<int>(std::clamp<int64_t>(left, 0, std::max(0, p.arena_limit - arena_held)));
  return p;
}

std::string ThreadBudget::describe() const {
  std::ostringstream os;
  os << "budget=" << fmt(budget()) << " tasks (RLIMIT_NPROC soft=" << fmt(nproc_limit_)
     << (nproc_exempt_ ? " [uid exempt]" : "") << ", tasks of this uid=" << uid_tasks_
     << ", headroom=" << fmt(nproc_headroom()) << "; cgroup pids.max=" << fmt(cgroup_limit_)
     << " current=" << cgroup_current_ << " headroom=" << fmt(cgroup_headroom_)
     << "; cpus=" << cpus_ << "; max_threads=" << fmt(user_cap_) << ")";
  return os.str();
}

}  // namespace spindle
