#pragma once
// Not API, and private to runtime/src: the node budget ledger's shared lease
// table and this process's side of it, shared by its two halves.
//
//   budget_ledger_table.cpp  the table: layout checks, open/lock/reclaim/write
//                            (Impl::with_table), the fork protocol, and reading
//                            it as found (leases(), status())
//   budget_ledger.cpp        the policy: acquire (shrink/wait/fail), reserve,
//                            available, leases given back and marked started
//
// The design (why one file per uid, why flock per access, why it is never
// trusted) is in <spindle/budget_ledger.hpp>.

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <type_traits>

#include <spindle/budget_ledger.hpp>

namespace spindle::detail::ledger {

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
extern std::mutex g_mu;
extern int g_fd;  // the table's descriptor while an access is in progress (g_mu held)

// Registers the fork protocol above, once per process.
void install_atfork();
// This process's /proc start time (read per access: a forked child has its own).
uint64_t my_start_time();
std::string errno_text(int e);
// The header is this version's and every record is possible (else the table is rebuilt).
bool valid(const Table& t);

}  // namespace spindle::detail::ledger

namespace spindle {

struct BudgetLedger::Impl {
  using Local = detail::ledger::Local;
  using Table = detail::ledger::Table;
  using TableRecord = detail::ledger::TableRecord;
  // fn(table, pending of the other processes, our pid, our start time): true if it changed the table.
  using TableFn = std::function<bool(Table&, int64_t, pid_t, uint64_t)>;

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
  bool with_table(const std::string& path, const TableFn& fn);
};

}  // namespace spindle
