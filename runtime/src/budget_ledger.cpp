#include "budget_ledger_table.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cerrno>
#include <thread>
#include <utility>

#include <spindle/error.hpp>

// The ledger's policy half: how a lease is granted, reserved, given back and
// marked started. The table itself is budget_ledger_table.cpp's.
namespace spindle {

namespace {

// "budget_policy should be one of 'shrink', 'wait', 'fail', but got 'x'", `source` naming where x came from.
[[noreturn]] void refuse_policy(const std::string& source, const std::string& name) {
  std::string allowed;
  for (const char* n : kBudgetPolicyNames) allowed += std::string(allowed.empty() ? "'" : ", '") + n + "'";
  SPINDLE_THROW(std::invalid_argument,
                "spindle: " + source + " should be one of " + allowed + ", but got '" + name + "'");
}

}  // namespace

BudgetPolicy parse_budget_policy(const std::string& name) {
  for (std::size_t i = 0; i < kBudgetPolicyNames.size(); ++i)
    if (name == kBudgetPolicyNames[i]) return static_cast<BudgetPolicy>(i);
  refuse_policy("budget_policy", name);
}

const char* budget_policy_name(BudgetPolicy p) noexcept {
  const auto i = static_cast<std::size_t>(p);
  return i < kBudgetPolicyNames.size() ? kBudgetPolicyNames[i] : "?";
}

BudgetPolicy resolve_budget_policy(const std::optional<std::string>& name) {
  if (name) return parse_budget_policy(*name);
  const char* env = std::getenv(kBudgetPolicyVariable);
  if (env == nullptr || *env == '\0') return BudgetPolicy::kShrink;
  try {
    return parse_budget_policy(env);
  } catch (const std::invalid_argument&) {
    refuse_policy(std::string("$") + kBudgetPolicyVariable, env);
  }
}

}  // namespace spindle

namespace spindle {

using namespace detail::ledger;

// ---------------------------------------------------------------- leases

LedgerLease::LedgerLease(LedgerLease&& o) noexcept
    : ledger_(std::exchange(o.ledger_, nullptr)), id_(std::exchange(o.id_, 0)), pid_(o.pid_) {}

LedgerLease& LedgerLease::operator=(LedgerLease&& o) noexcept {
  if (this != &o) {
    reset();
    ledger_ = std::exchange(o.ledger_, nullptr);
    id_ = std::exchange(o.id_, 0);
    pid_ = o.pid_;
  }
  return *this;
}

LedgerLease::~LedgerLease() { reset(); }

void LedgerLease::reset() noexcept {
  if (id_ != 0 && ledger_) ledger_->release(id_, pid_);
  id_ = 0;
  ledger_ = nullptr;
}

void LedgerLease::started(int64_t n) noexcept {
  if (id_ != 0 && ledger_) ledger_->mark_started(id_, pid_, n);
}

// ---------------------------------------------------------------- ledger

BudgetLedger& BudgetLedger::global() {
  static BudgetLedger* ledger = new BudgetLedger(std::nullopt);  // never destroyed: leases may outlive statics
  return *ledger;
}

BudgetLedger::BudgetLedger(std::optional<std::string> path) : impl_(new Impl) {
  impl_->fixed_path = std::move(path);
  install_atfork();
}

BudgetLedger::~BudgetLedger() { delete impl_; }

std::string BudgetLedger::default_path() { return "/dev/shm/spindle-ledger." + std::to_string(::getuid()); }

int64_t start_holdback(int64_t free, int num_workers, BudgetPolicy policy, const StartNeeds& needs) noexcept {
  if (free == kUnlimited || free <= 0 || num_workers < 1) return 0;
  const int64_t each = std::max<int64_t>(1, needs.worker_tasks);
  const int64_t wanted = std::max<int64_t>(0, needs.reserve) + (each - 1) * num_workers;
  if (policy != BudgetPolicy::kShrink) return std::max<int64_t>(0, std::min(wanted, free - num_workers));
  const int64_t fit = std::max<int64_t>(1, std::min<int64_t>(num_workers, (free - std::max<int64_t>(0, needs.reserve)) / each));
  return fit < num_workers ? free - fit : std::min(wanted, free - fit);
}

LedgerGrant BudgetLedger::acquire(int num_workers, BudgetPolicy policy, std::chrono::milliseconds timeout,
                                  const std::function<ThreadBudget()>& read_budget,
                                  const std::function<void()>& poll, const StartNeeds& needs) {
  if (num_workers < 1)
    SPINDLE_THROW(std::invalid_argument, "spindle: a lease needs num_workers >= 1 (got " + std::to_string(num_workers) + ")");
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    std::optional<LedgerGrant> grant;
    std::string refusal;
    bool settling = false;
    {
      std::lock_guard lock(g_mu);
      impl_->adopt();
      const std::string path = impl_->path();
      // Decides and records under the table's lock (or, without a table,
      // under g_mu alone): what /proc shows and what is pending are read and
      // the new lease written in one critical section.
      auto decide = [&](int64_t others) {
        const int64_t leased = others + impl_->local_pending();
        const int held = impl_->local_helpers();
        const ThreadBudget budget = read_budget();
        // A cap of the user's own below the request is a contradiction in
        // the arguments, not a shortage: refused under every policy.
        if (num_workers > budget.user_cap()) (void)budget.plan(num_workers, leased);  // throws
        // What the consumer and the workers' runtimes need is counted as pending: off the node's
        // headroom, as another lease's tasks are.
        const int64_t kept = start_holdback(budget.budget(leased), num_workers, policy, needs);
        const int64_t pending = leased + kept;
        const int64_t avail = budget.budget(pending);
        int workers = num_workers;
        std::string note;
        if (workers > avail) {
          if (policy == BudgetPolicy::kShrink && avail < 1 && others > 0) {
            // Nothing free, but other processes hold pending tasks: they may
            // be forking right now (a worker is in /proc a moment before its
            // lease marks it started). Retried for kSettle before refusing.
            settling = true;
          }
          if (policy == BudgetPolicy::kShrink && avail >= 1) {
            workers = static_cast<int>(avail);
            note = "spindle: " + std::to_string(num_workers) + " workers asked, " + std::to_string(workers) +
                   " started: the thread budget has " + std::to_string(avail) + " tasks left (" +
                   budget.describe() + "; " + std::to_string(leased) +
                   " tasks leased to other loaders of this uid and not started yet" +
                   (kept > 0 ? "; " + std::to_string(kept) + " kept for the consumer's threads (" +
                                   std::to_string(needs.reserve) + ") and the workers' runtimes (" +
                                   std::to_string(std::max<int64_t>(1, needs.worker_tasks)) + " tasks a worker)"
                             : std::string()) +
                   "). Policy \"shrink\"; pass budget_policy=\"wait\" or \"fail\" to change that.";
          } else {
            // budget.plan throws the full message; kWait retries it.
            try {
              (void)budget.plan(num_workers, pending);
            } catch (const ThreadBudgetError& e) {
              refusal = e.what();
            }
            if (refusal.empty()) refusal = "spindle: no task of the thread budget is free";
            return std::optional<LedgerGrant>();
          }
        }
        LedgerGrant g;
        g.plan = budget.plan(workers, pending, held);
        g.requested = num_workers;
        g.live_budget = budget.budget();
        g.pending_seen = leased;
        g.held_back = kept;
        g.note = std::move(note);
        return std::optional<LedgerGrant>(std::move(g));
      };
      uint64_t id = 0;
      auto record = [&](LedgerGrant& g) {
        const int64_t tasks = g.plan.num_workers + g.plan.arena_threads;
        id = impl_->record(tasks, tasks, g.plan.arena_threads);
      };
      bool decided = false;  // the table was read and the decision made under its lock
      const bool shared = impl_->with_table(path, [&](Table& t, int64_t others, pid_t me, uint64_t my_start) {
        decided = true;
        grant = decide(others);
        if (!grant) return false;
        record(*grant);
        return impl_->enter(t, id, path, me, my_start);
      });
      if (!shared && !decided) {  // no usable table: this process's leases only
        grant = decide(0);
        if (grant) record(*grant);
      }
      if (grant) {
        grant->shared = shared && !impl_->leases[id].path.empty();
        grant->lease = LedgerLease(this, id, getpid());
        return std::move(*grant);
      }
    }
    // Short and not shrinking (or shrinking to nothing while others settle).
    const auto waited = std::chrono::steady_clock::now() - start;
    const bool retry = policy == BudgetPolicy::kWait ? timeout.count() == 0 || waited < timeout
                                                     : settling && waited < kSettle;
    if (!retry) {
      if (policy == BudgetPolicy::kWait)
        refusal += " Waited " + std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()) +
                   " ms for leases to be given back (policy \"wait\", the loader's timeout).";
      else if (policy == BudgetPolicy::kShrink)
        refusal += " Policy \"shrink\" needs at least 1 free task.";
      SPINDLE_THROW(ThreadBudgetError, refusal);
    }
    if (poll)
      poll();  // paces the wait itself (the Python layer sleeps there without the GIL)
    else
      std::this_thread::sleep_for(kPollPeriod);
  }
}

LedgerLease BudgetLedger::reserve_stopping(int64_t tasks) {
  if (tasks < 0 || tasks > kMaxTasks)
    SPINDLE_THROW(std::invalid_argument, "spindle: reserve_stopping needs 0 <= tasks <= " + std::to_string(kMaxTasks) +
                                             " (got " + std::to_string(tasks) + ")");
  std::lock_guard lock(g_mu);
  impl_->adopt();
  const std::string path = impl_->path();
  const uint64_t id = impl_->record(tasks, tasks, 0);
  (void)impl_->with_table(path, [&](Table& t, int64_t, pid_t me, uint64_t my_start) {
    return impl_->enter(t, id, path, me, my_start);
  });
  return LedgerLease(this, id, getpid());
}

int64_t BudgetLedger::available(const LedgerLease& excluding, const std::function<ThreadBudget()>& read_budget) {
  std::lock_guard lock(g_mu);
  impl_->adopt();
  const uint64_t except = excluding.pid_ == getpid() ? excluding.id_ : 0;
  auto count = [&](int64_t others) {
    const ThreadBudget budget = read_budget ? read_budget() : ThreadBudget();
    return budget.budget(others + impl_->local_pending(except));
  };
  // Under the table's lock, as acquire() decides: nothing is granted in between.
  std::optional<int64_t> result;
  (void)impl_->with_table(impl_->path(), [&](Table&, int64_t others, pid_t, uint64_t) {
    result = count(others);
    return false;
  });
  return result ? *result : count(0);
}

void BudgetLedger::release(uint64_t id, pid_t pid) noexcept {
  try {
    std::lock_guard lock(g_mu);
    if (pid != getpid() || impl_->owner != pid) return;  // a forked copy: the parent's to give back
    auto it = impl_->leases.find(id);
    if (it == impl_->leases.end()) return;
    const std::string path = it->second.path;
    impl_->leases.erase(it);
    // The table drops the record when it finds it missing from our map.
    if (!path.empty()) (void)impl_->with_table(path, [](Table&, int64_t, pid_t, uint64_t) { return false; });
  } catch (...) {
    // The record is reclaimed by whoever reads the table after this process exits.
  }
}

void BudgetLedger::mark_started(uint64_t id, pid_t pid, int64_t n) noexcept {
  try {
    std::lock_guard lock(g_mu);
    if (pid != getpid() || impl_->owner != pid) return;
    auto it = impl_->leases.find(id);
    if (it == impl_->leases.end()) return;
    it->second.pending = std::clamp<int64_t>(it->second.pending - std::max<int64_t>(0, n), 0, it->second.tasks);
    const std::string path = it->second.path;
    if (!path.empty()) (void)impl_->with_table(path, [](Table&, int64_t, pid_t, uint64_t) { return false; });
  } catch (...) {
  }
}

int64_t BudgetLedger::local_pending() {
  std::lock_guard lock(g_mu);
  impl_->adopt();
  return impl_->local_pending();
}

int BudgetLedger::local_arena_threads() {
  std::lock_guard lock(g_mu);
  impl_->adopt();
  return impl_->local_helpers();
}

}  // namespace spindle
