// The ledger's table half: the shared file (opened, checked, locked, reclaimed
// and written back per access), the fork protocol around it, and reading it as
// found. The policy on top is budget_ledger.cpp's.
#include "budget_ledger_table.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>

#include <spindle/procfs.hpp>

namespace spindle::detail::ledger {
namespace {

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

}  // namespace

bool valid(const Table& t) {
  const auto& h = t.header;
  if (h.magic != kMagic || h.version != kVersion || h.record_size != sizeof(TableRecord) ||
      h.capacity != BudgetLedger::kCapacity)
    return false;
  for (const auto& r : t.records)
    if (!valid_record(r)) return false;
  return true;
}

std::mutex g_mu;
int g_fd = -1;  // the table's descriptor while an access is in progress (g_mu held)

namespace {

void atfork_prepare() { g_mu.lock(); }
void atfork_parent() { g_mu.unlock(); }
void atfork_child() {
  // g_fd is -1 here (accesses close it before releasing g_mu); closed anyway
  // in case that ever changes, so a child can never keep the parent's lock.
  if (g_fd >= 0) ::close(g_fd);
  g_fd = -1;
  g_mu.unlock();
}

}  // namespace

void install_atfork() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); });
}

uint64_t my_start_time() {
  return process_start_time(getpid()).value_or(0);
}

std::string errno_text(int e) { return std::strerror(e); }

}  // namespace spindle::ledger

namespace spindle {

using namespace detail::ledger;

std::optional<uint64_t> process_start_time(pid_t pid, const std::string& proc_root) {
  // Any failure to read it is "not that process": the record is reclaimed.
  try {
    if (auto st = procfs::read_stat(pid, proc_root)) return st->start_time;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

bool BudgetLedger::Impl::with_table(const std::string& path, const TableFn& fn) {
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

}  // namespace spindle
