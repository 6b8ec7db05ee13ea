#pragma once
// What the operating system says about processes, read in one place: a
// process's stat fields, its threads and their names, the cgroup pids limits,
// and dying with the parent. Everything else in the core and the Python
// package asks here instead of parsing /proc itself. What only the tools read
// (spindle doctor, limit_threads' thread attribution, spindle bench: limits,
// command lines, sysctls, maps, a thread's stack) is diagnostics.hpp's.
//
// Errors: "the process is gone" (its /proc entry is missing, or vanished
// while we read it) is a normal answer, std::nullopt, never an exception.
// A real failure (permission refused, a /proc file that does not parse)
// throws std::system_error with errno, or std::runtime_error for a parse.
//
// Every reader takes the /proc root (and the cgroup root) as a parameter so
// tests can point it at a fake tree.

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace spindle::procfs {

inline constexpr const char* kProcRoot = "/proc";
inline constexpr const char* kCgroupRoot = "/sys/fs/cgroup";

// The fields of /proc/<pid>/stat that callers need (proc(5) numbers them).
struct ProcessStat {
  pid_t pid = 0;
  std::string comm;          // field 2, without the parentheses; may hold spaces and ')'
  char state = '?';          // field 3: R S D T t Z X ...
  pid_t ppid = 0;            // field 4
  int64_t num_threads = 0;   // field 20
  uint64_t utime = 0;        // field 14: clock ticks of CPU time in user mode
  uint64_t stime = 0;        // field 15: clock ticks of CPU time in the kernel
  uint64_t start_time = 0;   // field 22: clock ticks after boot; tells a reused pid apart
};

// Clock ticks per second (sysconf(_SC_CLK_TCK)): the unit of utime, stime and start_time.
long clock_ticks_per_second() noexcept;

// The machine's idle CPU time so far, in clock ticks summed over its cpus
// (/proc/stat's "cpu" line: idle + iowait); nullopt if it cannot be read.
// Two readings apart tell how many cores were free between them, whoever
// used the others (adaptive processes, loader_autoscale.cpp).
std::optional<uint64_t> idle_cpu_ticks(const std::string& proc_root = kProcRoot);

// The tasks runnable on the machine this instant, the reader included (/proc/stat's
// procs_running); nullopt if it cannot be read.
std::optional<int> procs_running(const std::string& proc_root = kProcRoot);

// Parses the text of a stat file. comm (field 2) may hold spaces and
// parentheses, so the fields resume after the *last* ')'. Throws
// std::runtime_error if the text is not a stat line.
ProcessStat parse_stat(std::string_view text);

// /proc/<pid>/stat parsed; nullopt if the process is gone. Throws
// std::system_error on any other read failure.
std::optional<ProcessStat> read_stat(pid_t pid, const std::string& proc_root = kProcRoot);

// The fields of /proc/<pid>/status that callers need.
struct ProcessStatus {
  std::string name;       // Name: (comm, with any escapes the kernel wrote)
  pid_t ppid = 0;         // PPid:
  uint32_t real_uid = 0;  // Uid: (the first of its four: the real uid, which RLIMIT_NPROC counts against)
  int64_t threads = 0;    // Threads:
};

// Parses the text of a status file. Throws std::runtime_error if it has no
// "Uid:" or "Threads:" line.
ProcessStatus parse_status(std::string_view text);

// /proc/<pid>/status parsed; nullopt if the process is gone. Throws
// std::system_error on any other read failure.
std::optional<ProcessStatus> read_status(pid_t pid, const std::string& proc_root = kProcRoot);

// A process's memory as /proc/<pid>/smaps_rollup sums it over its mappings, in
// bytes (the file says kB). uss is what the process alone pays: its private
// pages (Private_Clean + Private_Dirty), which copy-on-write turns a forked
// worker's reads of Python objects into; pss splits each shared page among
// the processes that map it, so the pss of a process tree adds up to its
// memory.
struct MemoryRollup {
  uint64_t rss = 0;
  uint64_t pss = 0;
  uint64_t uss = 0;
  uint64_t swap = 0;
};

// Parses the text of a smaps_rollup file. Throws std::runtime_error if it has
// no "Rss:" or "Pss:" line.
MemoryRollup parse_smaps_rollup(std::string_view text);

// /proc/<pid>/smaps_rollup parsed (Linux 4.14+); nullopt if the process is
// gone. Throws std::system_error on any other read failure (EACCES for another
// user's process).
std::optional<MemoryRollup> read_memory(pid_t pid, const std::string& proc_root = kProcRoot);

// Another process's descriptor `fd`, opened anew read-only through /proc/<pid>/fd/<fd> (O_CLOEXEC):
// how a pickled handle to a spindle.shared segment reaches the segment. Returns the new descriptor,
// the caller's to close. Throws std::system_error with errno (ENOENT: the process or its descriptor
// is gone; EACCES: another uid's process).
int open_process_fd(pid_t pid, int fd, const std::string& proc_root = kProcRoot);

// The pids listed in /proc (every process, kernel threads included), ascending.
std::vector<pid_t> process_ids(const std::string& proc_root = kProcRoot);

// What RLIMIT_NPROC counts for `uid`: the threads of every process whose real
// uid it is (the sum of their "Threads:"). A process that exits, or whose
// status cannot be read, while we look is left out.
int64_t uid_tasks(uint32_t uid, const std::string& proc_root = kProcRoot);

// The CPUs the cgroup v2 cpu.max of the process's cgroup (nullopt: this
// process) allows, ceil(quota / period); nullopt where it sets no quota ("max"),
// or there is no v2 cgroup or cpu.max to read.
std::optional<int> cgroup_cpu_limit(std::optional<pid_t> pid = std::nullopt, const std::string& proc_root = kProcRoot,
                                    const std::string& cgroup_root = kCgroupRoot);

// A process state letter in words, for errors ("stopped (SIGSTOP/SIGTSTP)"
// explains a timeout at once).
std::string describe_state(char state);

// The thread ids of a process (entries of /proc/<pid>/task), ascending;
// nullopt if the process is gone.
std::optional<std::vector<pid_t>> thread_ids(pid_t pid, const std::string& proc_root = kProcRoot);

// /proc/<pid>/task/<tid>/comm without its newline; nullopt if that thread is gone.
std::optional<std::string> thread_name(pid_t pid, pid_t tid, const std::string& proc_root = kProcRoot);

struct ThreadEntry {
  pid_t tid = 0;
  std::string name;  // comm: at most 15 bytes, as the thread (or its runtime) set it
};

// Every thread of a process with its name, ascending by tid; nullopt if the
// process is gone. Threads that exit while we look are left out.
std::optional<std::vector<ThreadEntry>> threads(pid_t pid, const std::string& proc_root = kProcRoot);

// One level of the cgroup pids controller, from the process's cgroup up.
struct PidsLevel {
  std::string path;            // the level's directory
  std::optional<int64_t> max;  // pids.max; nullopt: "max" (no limit at this level)
  int64_t current = 0;         // pids.current
};

// pids.max and pids.current of every level from the cgroup of `pid` (nullopt:
// this process) up to the root, in that order: cgroup v2, or the v1 pids
// hierarchy when it is mounted (v1 wins). A level without both files is left
// out; no cgroup file (no /proc/<pid>/cgroup) gives no levels. pids.max of an
// ancestor limits all its descendants together, so each level's headroom is
// its own max minus its own current.
std::vector<PidsLevel> cgroup_pids_levels(std::optional<pid_t> pid = std::nullopt,
                                          const std::string& proc_root = kProcRoot,
                                          const std::string& cgroup_root = kCgroupRoot);

// ---------------------------------------------------------------- parent death
//
// PR_SET_PDEATHSIG fires when the parent *thread* exits, and the kernel ties
// the parent to the thread that forked: a loader created in a thread that then
// exits would lose every worker (SIGKILL) while the process goes on. So the
// core's workers use die_with_process(): the death signal is a real-time
// signal whose handler checks getppid(): if the parent process is still ours
// (only its thread exited; the child was reparented within the same thread
// group), it returns; if the child was reparented to init or a subreaper, the
// consumer is gone and it _exits. The handler is async-signal-safe.

// In a child of `parent`: asks for `signal` when the parent dies, then checks
// the parent did not die before that took effect. Returns false if it had
// (the caller should exit). Throws std::system_error if prctl refuses.
[[nodiscard]] bool arm_parent_death(pid_t parent, int signal);

// The core's death signal: high in the real-time range, which neither glibc
// (it takes the first two) nor Python's signal handling uses.
int parent_death_signal() noexcept;

// In a child just forked or spawned from `parent`: installs the handler above,
// arms parent_death_signal(), and _exits(1) at once if `parent` is already
// gone. Allocates nothing and throws nothing (it runs right after fork).
void die_with_process(pid_t parent) noexcept;

}  // namespace spindle::procfs
