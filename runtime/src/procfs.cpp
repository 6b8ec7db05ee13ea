#include <spindle/procfs.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include <spindle/error.hpp>

#include "proc_files.hpp"

namespace spindle::procfs {
namespace files {

// The errors that mean "that process (or thread) is not there (any more)":
// no entry, or, for a file opened before the task exited, ESRCH on read.
bool gone(int e) noexcept { return e == ENOENT || e == ESRCH || e == ENOTDIR; }

namespace {
[[noreturn]] void throw_unreadable(int e, const std::string& path) {
  errno = e;
  SPINDLE_THROW_ERRNO("spindle: cannot read " + path +
                      " (is /proc mounted with hidepid=, or the process another user's?)");
}

}  // namespace

// The whole of a small file; nullopt if it (or its task) is gone, throws
// std::system_error for any other failure.
std::optional<std::string> read_or_gone(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (gone(errno)) return std::nullopt;
    throw_unreadable(errno, path);
  }
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      out.append(buf, static_cast<std::size_t>(n));
    } else if (n == 0) {
      break;
    } else if (errno != EINTR) {
      const int e = errno;
      ::close(fd);
      if (gone(e)) return std::nullopt;
      throw_unreadable(e, path);
    }
  }
  ::close(fd);
  return out;
}

// Cgroup files are advisory (a container may hide any of them): a file that
// cannot be read is as if absent.
std::optional<std::string> read_if_readable(const std::string& path) {
  try {
    return read_or_gone(path);
  } catch (const std::system_error&) {
    return std::nullopt;
  }
}

std::string task_path(pid_t pid, const std::string& proc_root) { return proc_root + "/" + std::to_string(pid); }

}  // namespace files

using namespace files;

namespace {


// A pids.max/pids.current value: nullopt for "max", the number otherwise;
// `ok` false if the file is missing or holds no number.
std::optional<int64_t> read_pids_value(const std::string& path, bool& ok) {
  ok = false;
  auto text = read_if_readable(path);
  if (!text) return std::nullopt;
  std::string word;
  std::istringstream(*text) >> word;
  if (word == "max") {
    ok = true;
    return std::nullopt;
  }
  try {
    const int64_t v = std::stoll(word);
    ok = true;
    return v;
  } catch (...) {
    return std::nullopt;
  }
}

bool parse_pid(const char* name, pid_t& out) noexcept {
  if (*name < '0' || *name > '9') return false;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(name, &end, 10);
  if (errno != 0 || *end != '\0' || v <= 0) return false;
  out = static_cast<pid_t>(v);
  return true;
}

// ---------------------------------------------------------------- parent death

volatile pid_t g_parent = 0;

void on_parent_death(int) {
  if (getppid() != g_parent) _exit(128 + SIGKILL);  // reparented away: the consumer process is gone
}

// 0: armed and the parent is alive; -1: the parent is already gone; else the
// errno of prctl. Async-signal-safe, so it may run in a child of a threaded fork.
int arm(pid_t parent, int signal) noexcept {
  if (::prctl(PR_SET_PDEATHSIG, signal) != 0) return errno;
  return getppid() == parent ? 0 : -1;  // a parent that died before prctl took effect
}

}  // namespace

ProcessStat parse_stat(std::string_view text) {
  const auto open = text.find('(');
  const auto close = text.rfind(')');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open)
    SPINDLE_THROW(std::runtime_error, "spindle: not a /proc/<pid>/stat line (no \"(comm)\"): \"" +
                                          std::string(text.substr(0, 80)) + "\"");
  ProcessStat s;
  s.comm = std::string(text.substr(open + 1, close - open - 1));
  // Fields resume after the last ')': field 3 (state) is the first word there.
  std::istringstream head{std::string(text.substr(0, open))};
  std::istringstream rest{std::string(text.substr(close + 1))};
  std::vector<std::string> fields;  // fields[i] is field i + 3
  for (std::string w; fields.size() < 20 && rest >> w;) fields.push_back(std::move(w));
  long long pid = 0;
  if (!(head >> pid) || fields.size() < 20 || fields[0].size() != 1)
    SPINDLE_THROW(std::runtime_error, "spindle: a /proc/<pid>/stat line with too few fields: \"" +
                                          std::string(text.substr(0, 80)) + "\"");
  try {
    s.pid = static_cast<pid_t>(pid);
    s.state = fields[0][0];
    s.ppid = static_cast<pid_t>(std::stol(fields[4 - 3]));
    s.utime = std::stoull(fields[14 - 3]);
    s.stime = std::stoull(fields[15 - 3]);
    s.num_threads = std::stoll(fields[20 - 3]);
    s.start_time = std::stoull(fields[22 - 3]);
  } catch (const std::logic_error&) {
    SPINDLE_THROW(std::runtime_error, "spindle: a /proc/<pid>/stat line with a field that is not a number: \"" +
                                          std::string(text.substr(0, 80)) + "\"");
  }
  return s;
}

std::optional<ProcessStat> read_stat(pid_t pid, const std::string& proc_root) {
  auto text = read_or_gone(proc_root + "/" + std::to_string(pid) + "/stat");
  if (!text) return std::nullopt;
  return parse_stat(*text);
}

ProcessStatus parse_status(std::string_view text) {
  ProcessStatus s;
  bool uid = false, threads = false;
  while (!text.empty()) {
    const std::size_t end = std::min(text.find('\n'), text.size());
    const std::string_view line = text.substr(0, end);
    text.remove_prefix(std::min(end + 1, text.size()));
    const std::size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    const std::string_view key = line.substr(0, colon);
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
    auto number = [&](auto& out) {
      const auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
      if (ec != std::errc())
        SPINDLE_THROW(std::runtime_error, "spindle: a /proc/<pid>/status line that is not a number: \"" +
                                              std::string(line.substr(0, 80)) + "\"");
    };
    if (key == "Name") {
      s.name = std::string(value);
    } else if (key == "PPid") {
      number(s.ppid);
    } else if (key == "Uid") {
      number(s.real_uid);
      uid = true;
    } else if (key == "Threads") {
      number(s.threads);
      threads = true;
    }
  }
  if (!uid || !threads) SPINDLE_THROW(std::runtime_error, "spindle: a /proc/<pid>/status without Uid: or Threads:");
  return s;
}

std::optional<ProcessStatus> read_status(pid_t pid, const std::string& proc_root) {
  auto text = read_or_gone(proc_root + "/" + std::to_string(pid) + "/status");
  if (!text) return std::nullopt;
  return parse_status(*text);
}

MemoryRollup parse_smaps_rollup(std::string_view text) {
  MemoryRollup m;
  bool rss = false, pss = false;
  while (!text.empty()) {
    const std::size_t end = std::min(text.find('\n'), text.size());
    const std::string_view line = text.substr(0, end);
    text.remove_prefix(std::min(end + 1, text.size()));
    const std::size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;  // the first line names the address range
    const std::string_view key = line.substr(0, colon);
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
    uint64_t kb = 0;
    const auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), kb);
    if (ec != std::errc())
      SPINDLE_THROW(std::runtime_error, "spindle: a /proc/<pid>/smaps_rollup line that is not a number: \"" +
                                            std::string(line.substr(0, 80)) + "\"");
    const uint64_t bytes = kb * 1024;
    if (key == "Rss") {
      m.rss = bytes;
      rss = true;
    } else if (key == "Pss") {
      m.pss = bytes;
      pss = true;
    } else if (key == "Private_Clean" || key == "Private_Dirty") {
      m.uss += bytes;
    } else if (key == "Swap") {
      m.swap = bytes;
    }
  }
  if (!rss || !pss) SPINDLE_THROW(std::runtime_error, "spindle: a /proc/<pid>/smaps_rollup without Rss: or Pss:");
  return m;
}

std::optional<MemoryRollup> read_memory(pid_t pid, const std::string& proc_root) {
  auto text = read_or_gone(proc_root + "/" + std::to_string(pid) + "/smaps_rollup");
  // A process that has released its memory (exiting, a zombie) reads as an empty file.
  if (!text || text->empty()) return std::nullopt;
  return parse_smaps_rollup(*text);
}

std::vector<pid_t> process_ids(const std::string& proc_root) {
  std::vector<pid_t> out;
  DIR* dir = ::opendir(proc_root.c_str());
  if (!dir) throw_unreadable(errno, proc_root);
  while (dirent* e = ::readdir(dir)) {
    pid_t pid = 0;
    if (parse_pid(e->d_name, pid)) out.push_back(pid);
  }
  ::closedir(dir);
  std::sort(out.begin(), out.end());
  return out;
}

int64_t uid_tasks(uint32_t uid, const std::string& proc_root) {
  std::vector<pid_t> pids;
  try {
    pids = process_ids(proc_root);
  } catch (const std::system_error&) {
    return 0;  // no /proc to read: nothing counted, as before there was one reader
  }
  int64_t total = 0;
  for (pid_t pid : pids) {
    try {
      if (auto s = read_status(pid, proc_root); s && s->real_uid == uid) total += s->threads;
    } catch (const std::exception&) {
      // hidden (hidepid=) or half-written: not ours to count
    }
  }
  return total;
}

std::optional<int> cgroup_cpu_limit(std::optional<pid_t> pid, const std::string& proc_root,
                                    const std::string& cgroup_root) {
  auto self = read_if_readable(proc_root + "/" + (pid ? std::to_string(*pid) : std::string("self")) + "/cgroup");
  if (!self) return std::nullopt;
  std::istringstream lines(*self);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("0::", 0) != 0) continue;  // cpu.max is cgroup v2's
    auto text = read_if_readable(cgroup_root + line.substr(3) + "/cpu.max");
    if (!text) return std::nullopt;
    std::string quota;
    int64_t period = 0;
    std::istringstream(*text) >> quota >> period;
    if (quota == "max" || period <= 0) return std::nullopt;
    try {
      return std::max<int>(1, static_cast<int>(std::ceil(std::stod(quota) / static_cast<double>(period))));
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

std::string describe_state(char state) {
  switch (state) {
    case 'R': return "running";
    case 'S': return "sleeping";
    case 'D': return "in uninterruptible sleep (I/O)";
    case 'T': return "stopped (SIGSTOP/SIGTSTP)";
    case 't': return "stopped by a debugger";
    case 'Z': return "a zombie";
    default: return std::string("in state '") + state + "'";
  }
}

std::optional<std::vector<pid_t>> thread_ids(pid_t pid, const std::string& proc_root) {
  const std::string path = proc_root + "/" + std::to_string(pid) + "/task";
  DIR* dir = ::opendir(path.c_str());
  if (!dir) {
    if (gone(errno)) return std::nullopt;
    throw_unreadable(errno, path);
  }
  std::vector<pid_t> out;
  for (;;) {
    errno = 0;
    dirent* e = ::readdir(dir);
    if (!e) break;
    pid_t tid = 0;
    if (parse_pid(e->d_name, tid)) out.push_back(tid);
  }
  const int e = errno;
  ::closedir(dir);
  if (e != 0) {
    if (gone(e)) return std::nullopt;
    throw_unreadable(e, path);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<std::string> thread_name(pid_t pid, pid_t tid, const std::string& proc_root) {
  auto text = read_or_gone(proc_root + "/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/comm");
  if (text && !text->empty() && text->back() == '\n') text->pop_back();
  return text;
}

std::optional<std::vector<ThreadEntry>> threads(pid_t pid, const std::string& proc_root) {
  auto ids = thread_ids(pid, proc_root);
  if (!ids) return std::nullopt;
  std::vector<ThreadEntry> out;
  out.reserve(ids->size());
  for (pid_t tid : *ids)
    if (auto name = thread_name(pid, tid, proc_root)) out.push_back({tid, std::move(*name)});
  return out;
}

std::vector<PidsLevel> cgroup_pids_levels(std::optional<pid_t> pid, const std::string& proc_root,
                                          const std::string& cgroup_root) {
  std::vector<PidsLevel> out;
  auto self = read_if_readable(proc_root + "/" + (pid ? std::to_string(*pid) : std::string("self")) + "/cgroup");
  if (!self) return out;
  std::string base, rel;
  std::istringstream lines(*self);
  for (std::string line; std::getline(lines, line);) {
    auto c1 = line.find(':');
    auto c2 = line.find(':', c1 + 1);
    if (c1 == std::string::npos || c2 == std::string::npos) continue;
    std::string controllers = line.substr(c1 + 1, c2 - c1 - 1);
    std::string path = line.substr(c2 + 1);
    if (line.compare(0, c1, "0") == 0 && controllers.empty()) {
      if (base.empty()) { base = cgroup_root; rel = path; }        // v2
    } else {
      std::istringstream cs(controllers);
      for (std::string c; std::getline(cs, c, ',');)
        if (c == "pids") { base = cgroup_root + "/pids"; rel = path; }  // v1 wins
    }
  }
  if (base.empty()) return out;
  for (std::string p = rel;;) {
    std::string dir = base + (p == "/" ? "" : p);
    bool max_ok = false, cur_ok = false;
    auto max = read_pids_value(dir + "/pids.max", max_ok);
    auto cur = read_pids_value(dir + "/pids.current", cur_ok);
    if (max_ok && cur_ok && cur) out.push_back({dir, max, *cur});
    if (p.empty() || p == "/") break;
    auto slash = p.find_last_of('/');
    p = slash == 0 ? "/" : p.substr(0, slash);
  }
  return out;
}

long clock_ticks_per_second() noexcept { return ::sysconf(_SC_CLK_TCK); }

std::optional<uint64_t> idle_cpu_ticks(const std::string& proc_root) {
  const auto text = read_or_gone(proc_root + "/stat");
  if (!text || text->compare(0, 4, "cpu ") != 0) return std::nullopt;
  // cpu  user nice system idle iowait irq softirq steal ...
  std::istringstream in(text->substr(4, text->find('\n')));
  uint64_t v[5] = {};
  for (uint64_t& x : v)
    if (!(in >> x)) return std::nullopt;
  return v[3] + v[4];
}

std::optional<int> procs_running(const std::string& proc_root) {
  const auto text = read_or_gone(proc_root + "/stat");
  if (!text) return std::nullopt;
  const std::string key = "\nprocs_running ";
  const auto at = text->find(key);
  if (at == std::string::npos) return std::nullopt;
  int n = 0;
  const char* from = text->data() + at + key.size();
  if (std::from_chars(from, text->data() + text->size(), n).ec != std::errc()) return std::nullopt;
  return n;
}

int open_process_fd(pid_t pid, int fd, const std::string& proc_root) {
  const std::string path = task_path(pid, proc_root) + "/fd/" + std::to_string(fd);
  const int mine = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (mine < 0) SPINDLE_THROW_ERRNO("spindle: cannot open " + path);
  return mine;
}

bool arm_parent_death(pid_t parent, int signal) {
  const int r = arm(parent, signal);
  if (r > 0) {
    errno = r;
    SPINDLE_THROW_ERRNO("spindle: prctl(PR_SET_PDEATHSIG, " + std::to_string(signal) + ") failed");
  }
  return r == 0;
}

int parent_death_signal() noexcept { return SIGRTMAX - 2; }

void die_with_process(pid_t parent) noexcept {
  g_parent = parent;
  const int sig = parent_death_signal();
  struct sigaction sa {};
  sa.sa_handler = on_parent_death;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(sig, &sa, nullptr);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  const int r = arm(parent, sig);  // a failed prctl (it cannot, for this signal) still checks the parent
  if (r < 0 || (r > 0 && getppid() != parent)) _exit(1);  // the consumer died before prctl took effect
}

}  // namespace spindle::procfs
