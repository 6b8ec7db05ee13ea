#include <spindle/detail/budget_ledger.hpp>

#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <type_traits>
#include <utility>

#include <spindle/error.hpp>
#include <spindle/procfs.hpp>

namespace spindle {
namespace {

// ---------------------------------------------------------------- table layout
//
// The file is a header and kCapacity records, nothing else; its size is fixed
// (kTableBytes) and checked on every open. It is read and written whole with
// pread/pwrite under flock (never mapped: a truncation by another process is
// then a short read, never a SIGBUS). Every field is written only by a process
// of the owning uid holding the lock; every field is validated on every read.
constexpr uint64_t kMagic = 0x4745444c444e5053ull;  // "SPNDLDEG" little-endian
constexpr uint32_t kVersion = 1;

struct TableHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t record_size;  // sizeof(TableRecord)
  uint32_t capacity;     // BudgetLedger::kCapacity
  uint32_t reserved0;
  uint64_t reserved[5];
};

// One lease. pid 0 = free record (and then every other field is 0).
struct TableRecord {
  int32_t pid;
  uint32_t reserved0;
  uint64_t start_time;  // /proc/<pid>/stat field 22: tells a reused pid apart
  uint64_t lease_id;    // per process, never 0
  int64_t tasks;        // granted: workers + arena threads
  int64_t pending;      // of those, not started yet: 0 <= pending <= tasks
  uint64_t reserved1;
};

static_assert(sizeof(TableHeader) == 64 && std::is_trivially_copyable_v<TableHeader>);
static_assert(sizeof(TableRecord) == 48 && std::is_trivially_copyable_v<TableRecord>);
constexpr std::size_t kTableBytes = sizeof(TableHeader) + BudgetLedger::kCapacity * sizeof(TableRecord);

struct Table {
  TableHeader header;
  TableRecord records[BudgetLedger::kCapacity];
};
static_assert(sizeof(Table) == kTableBytes);

constexpr int32_t kMaxPid = 1 << 22;  // PID_MAX_LIMIT on 64-bit Linux

void fresh(Table& t) {
  std::memset(&t, 0, sizeof(t));
  t.header.magic = kMagic;
  t.header.version = kVersion;
  t.header.record_size = sizeof(TableRecord);
  t.header.capacity = BudgetLedger::kCapacity;
}

bool valid_record(const TableRecord& r) {
  if (r.pid == 0)
    return r.start_time == 0 && r.lease_id == 0 && r.tasks == 0 && r.pending == 0;
  return r.pid > 0 && r.pid <= kMaxPid && r.lease_id != 0 && r.tasks >= 0 &&
         r.tasks <= BudgetLedger::kMaxTasks && r.pending >= 0 && r.pending <= r.tasks;
}

bool valid(const Table& t) {
  const auto& h = t.header;
  if (h.magic != kMagic || h.version != kVersion || h.record_size != sizeof(TableRecord) ||
      h.capacity != BudgetLedger::kCapacity)
    return false;
  for (const auto& r : t.records)
    if (!valid_record(r)) return false;
  return true;
}

// ---------------------------------------------------------------- process state

struct Local {
  int64_t tasks = 0;
  int64_t pending = 0;
  int helpers = 0;   // of the tasks, the arena threads for copy-out (plan.arena_threads)
  std::string path;  // the table it was registered in ("" = none)
};

// One mutex for the in-process leases and for every table access in this
// process: one descriptor of the table is open at a time, and a fork waits
// until it is closed again (atfork below), so no child ever holds it or its
// lock.
std::mutex g_mu;
int g_fd = -1;  // the table's descriptor while an access is in progress (g_mu held)

void atfork_prepare() { g_mu.lock(); }
void atfork_parent() { g_mu.unlock(); }
void atfork_child() {
  // g_fd is -1 here (accesses close it before releasing g_mu); closed anyway
  // in case that ever changes, so a child can never keep the parent's lock.
  if (g_fd >= 0) ::close(g_fd);
  g_fd = -1;
  g_mu.unlock();
}

void install_atfork() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); });
}

uint64_t my_start_time() {
  // Read per access: a forked child has its own.
  return process_start_time(getpid()).value_or(0);
}

std::string errno_text(int e) { return std::strerror(e); }

}  // namespace

std::optional<uint64_t> process_start_time(pid_t pid, const std::string& proc_root) {
  // Any failure to read it is "not that process": the record is reclaimed.
  try {
    if (auto st = procfs::read_stat(pid, proc_root)) return st->start_time;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

BudgetPolicy parse_budget_policy(const std::string& name) {
  if (name == "shrink") return BudgetPolicy::kShrink;
  if (name == "wait") return BudgetPolicy::kWait;
  if (name == "fail") return BudgetPolicy::kFail;
  SPINDLE_THROW(std::invalid_argument,
                "spindle: budget_policy must be \"shrink\", \"wait\" or \"fail\" (got \"" + name + "\")");
}

const char* budget_policy_name(BudgetPolicy p) noexcept {
  switch (p) {
    case BudgetPolicy::kShrink: return "shrink";
    case BudgetPolicy::kWait: return "wait";
    case BudgetPolicy::kFail: return "fail";
  }
  return "?";
}

struct BudgetLedger::Impl {
  std::optional<std::string> fixed_path;  // nullopt: from the environment
  pid_t owner = 0;                        // the process `leases` belongs to
  uint64_t next_id = 1;
  std::map<uint64_t, Local> leases;
  std::set<std::string> warned;           // one warning per path and reason
  std::string last_warning;

  std::string path() const {
    if (fixed_path) return *fixed_path;
    const char* mode = std::getenv("SPINDLE_LEDGER");
    if (mode && (std::strcmp(mode, "off") == 0 || std::strcmp(mode, "0") == 0)) return "";
    const char* p = std::getenv("SPINDLE_LEDGER_PATH");
    if (p && *p) return p;
    return BudgetLedger::default_path();
  }

  // A fork inherited the parent's leases: they are the parent's, forgotten here.
  void adopt() {
    const pid_t me = getpid();
    if (owner == me) return;
    leases.clear();
    owner = me;
  }

  void warn(const std::string& path, const std::string& why) {
    last_warning = "spindle: the node budget ledger " + path + " is not used (" + why +
                   "); loaders of this process budget on their own, as if no other process "
                   "held leases. Remove the file if it is stale, or set SPINDLE_LEDGER=off to "
                   "silence this.";
    if (warned.insert(path + "\n" + why).second) {
      // One line on stderr, once: the core has no logger, and this must be seen.
      std::string line = last_warning + "\n";
      (void)!::write(2, line.data(), line.size());
    }
  }

  int64_t local_pending(uint64_t except = 0) const {
    int64_t sum = 0;
    for (const auto& [id, l] : leases)
      if (id != except) sum += l.pending;
    return sum;
  }

  int local_helpers() const {
    int sum = 0;
    for (const auto& [id, l] : leases) sum += l.helpers;
    return sum;
  }

  // Records a new lease of this process (enter() puts it in the table).
  uint64_t record(int64_t tasks, int64_t pending, int helpers) {
    const uint64_t id = next_id++;
    leases[id] = Local{tasks, pending, helpers, ""};
    return id;
  }

  // Puts lease `id` into the table `t` (under its lock); false if it is full
  // (the lease is then known to this process only).
  bool enter(Table& t, uint64_t id, const std::string& path, pid_t me, uint64_t my_start) {
    auto& l = leases[id];
    for (auto& r : t.records) {
      if (r.pid != 0) continue;
      r = TableRecord{me, 0, my_start, id, l.tasks, l.pending, 0};
      l.path = path;
      return true;
    }
    return false;
  }

  // Opens, checks, locks, reads (rebuilding if invalid), reclaims dead leases
  // and re-registers ours; then fn(table, others_pending) may change it, and it
  // is written back. Returns false (after a one-time warning) if the table
  // cannot be used. g_mu is held by the caller.
  template <class Fn>
  bool with_table(const std::string& path, Fn&& fn) {
    if (path.empty()) return false;
    int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 && errno == ENOENT) {
      fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
      if (fd < 0 && errno == EEXIST) fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
      if (fd >= 0) (void)::fchmod(fd, 0600);  // whatever the umask
    }
    if (fd < 0) {
      const int e = errno;
      warn(path, e == ELOOP ? "it is a symbolic link" : "cannot open it: " + errno_text(e));
      return false;
    }
    g_fd = fd;
    struct Closer {
      int fd;
      ~Closer() {
        ::close(fd);  // also drops the flock
        g_fd = -1;
      }
    } closer{fd};

    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      warn(path, "fstat failed: " + errno_text(errno));
      return false;
    }
    if (!S_ISREG(st.st_mode)) {
      warn(path, "not a regular file");
      return false;
    }
    if (st.st_uid != ::geteuid()) {
      warn(path, "owned by uid " + std::to_string(st.st_uid) + ", not by this uid " + std::to_string(::geteuid()));
      return false;
    }
    if ((st.st_mode & 07777) != 0600) {
      std::ostringstream m;
      m << "mode " << std::oct << (st.st_mode & 07777) << ", not 600";
      warn(path, m.str());
      return false;
    }
    // The lock dies with its holder (the kernel drops a flock when the last
    // descriptor of the open file goes), so only a live, stuck holder can
    // keep it; that is waited for a few seconds, never forever.
    const auto give_up = std::chrono::steady_clock::now() + kLockTimeout;
    while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR) {
        warn(path, "flock failed: " + errno_text(errno));
        return false;
      }
      if (std::chrono::steady_clock::now() >= give_up) {
        warn(path, "its lock was held for more than 5 s by another process of this uid");
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }

    Table t;
    bool dirty = false;
    // The size as it is now, under the lock (the one above may predate the
    // creator's first write).
    if (::fstat(fd, &st) != 0) {
      warn(path, "fstat failed: " + errno_text(errno));
      return false;
    }
    const ssize_t got = ::pread(fd, &t, sizeof(t), 0);
    if (got != static_cast<ssize_t>(sizeof(t)) || st.st_size != static_cast<off_t>(sizeof(t)) || !valid(t)) {
      // New, truncated, grown or scribbled on: start afresh. Live processes
      // re-register their leases below, each on its next access.
      fresh(t);
      if (::ftruncate(fd, static_cast<off_t>(sizeof(t))) != 0) {
        warn(path, "cannot size it: " + errno_text(errno));
        return false;
      }
      dirty = true;
    }

    // Reclaim: a record whose pid is gone, or now belongs to another process
    // (start time differs), is freed. Ours are checked against our own map.
    const pid_t me = getpid();
    const uint64_t my_start = my_start_time();
    std::set<uint64_t> present;
    for (auto& r : t.records) {
      if (r.pid == 0) continue;
      bool keep;
      if (r.pid == me) {
        auto it = leases.find(r.lease_id);
        keep = r.start_time == my_start && it != leases.end() && it->second.path == path;
        if (keep) {
          present.insert(r.lease_id);
          if (r.pending != it->second.pending || r.tasks != it->second.tasks) {
            r.tasks = it->second.tasks;
            r.pending = it->second.pending;
            dirty = true;
          }
        }
      } else {
        auto st_time = process_start_time(r.pid);
        keep = st_time && *st_time == r.start_time;
      }
      if (!keep) {
        std::memset(&r, 0, sizeof(r));
        dirty = true;
      }
    }
    // Re-register ours that are missing (table rebuilt meanwhile).
    for (const auto& [id, l] : leases) {
      if (l.path != path || present.count(id)) continue;
      for (auto& r : t.records) {
        if (r.pid != 0) continue;
        r = TableRecord{me, 0, my_start, id, l.tasks, l.pending, 0};
        dirty = true;
        break;
      }  // table full: the lease stays in this process only
    }
    int64_t others = 0;
    for (const auto& r : t.records)
      if (r.pid != 0 && r.pid != me) others += r.pending;

    dirty |= fn(t, others, me, my_start);
    if (dirty && ::pwrite(fd, &t, sizeof(t), 0) != static_cast<ssize_t>(sizeof(t))) {
      warn(path, "cannot write it: " + errno_text(errno));
      return false;
    }
    return true;
  }
};

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

LedgerGrant BudgetLedger::acquire(int num_workers, BudgetPolicy policy, std::chrono::milliseconds timeout,
                                  const std::function<ThreadBudget()>& read_budget,
                                  const std::function<void()>& poll) {
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
        const int64_t pending = others + impl_->local_pending();
        const int held = impl_->local_helpers();
        const ThreadBudget budget = read_budget();
        // A cap of the user's own below the request is a contradiction in
        // the arguments, not a shortage: refused under every policy.
        if (num_workers > budget.user_cap()) (void)budget.plan(num_workers, pending);  // throws
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
                   budget.describe() + "; " + std::to_string(pending) +
                   " tasks leased to other loaders of this uid and not started yet). Policy \"shrink\"; "
                   "pass budget_policy=\"wait\" or \"fail\" to change that.";
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
        g.pending_seen = pending;
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

std::vector<LeaseInfo> BudgetLedger::leases() {
  std::lock_guard lock(g_mu);
  impl_->adopt();
  std::vector<LeaseInfo> out;
  // Read as found (dead leases included, marked), under a shared lock, and
  // changed by nothing: this is what `spindle doctor` shows.
  const std::string path = impl_->path();
  bool shared = false;
  if (!path.empty()) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd >= 0) {
      g_fd = fd;
      struct stat st {};
      Table t;
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      bool locked = false;
      if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() && (st.st_mode & 07777) == 0600) {
        while (!(locked = ::flock(fd, LOCK_SH | LOCK_NB) == 0) && std::chrono::steady_clock::now() < give_up)
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      if (locked && ::pread(fd, &t, sizeof(t), 0) == static_cast<ssize_t>(sizeof(t)) && valid(t)) {
        shared = true;
        for (const auto& r : t.records) {
          if (r.pid == 0) continue;
          auto now = process_start_time(r.pid);
          out.push_back({r.pid, r.start_time, r.lease_id, r.tasks, r.pending, now && *now == r.start_time});
        }
      }
      ::close(fd);
      g_fd = -1;
    }
  }
  if (!shared) {
    const uint64_t mine = my_start_time();
    for (const auto& [id, l] : impl_->leases) out.push_back({getpid(), mine, id, l.tasks, l.pending, true});
  }
  return out;
}

LedgerStatus BudgetLedger::status() {
  std::lock_guard lock(g_mu);
  impl_->adopt();
  LedgerStatus s;
  s.path = impl_->path();
  impl_->last_warning.clear();
  struct stat st {};
  if (!s.path.empty() && ::lstat(s.path.c_str(), &st) != 0 && errno == ENOENT) {
    s.usable = true;  // created by the first lease; looking does not create it
    return s;
  }
  s.usable = impl_->with_table(s.path, [](Table&, int64_t, pid_t, uint64_t) { return false; });
  if (!s.usable) s.warning = s.path.empty() ? "disabled (SPINDLE_LEDGER=off)" : impl_->last_warning;
  return s;
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
