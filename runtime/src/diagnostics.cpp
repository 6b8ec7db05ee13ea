// The tools' readers (diagnostics.hpp): limits, command lines, sysctls, maps, a thread's
// stack pointer and another process's memory. The file reading is procfs's (proc_files.hpp).
#include <spindle/diagnostics.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include <spindle/error.hpp>

#include "proc_files.hpp"

namespace spindle::diagnostics {

using procfs::files::gone;
using procfs::files::read_if_readable;
using procfs::files::read_or_gone;
using procfs::files::task_path;

namespace {

std::optional<uint64_t> limit_value(const std::string& word, std::string_view line) {
  if (word == "unlimited") return std::nullopt;
  uint64_t v = 0;
  const auto [p, ec] = std::from_chars(word.data(), word.data() + word.size(), v);
  if (ec != std::errc() || p != word.data() + word.size())
    SPINDLE_THROW(std::runtime_error, "spindle: a /proc/<pid>/limits line whose value is neither a number nor "
                                      "\"unlimited\": \"" + std::string(line.substr(0, 80)) + "\"");
  return v;
}

}  // namespace

std::vector<ResourceLimit> parse_limits(std::string_view text) {
  // "Limit                     Soft Limit           Hard Limit           Units": the value columns
  // start where the header's "Soft Limit" does; names hold spaces, units may be absent.
  std::vector<ResourceLimit> out;
  std::size_t column = std::string_view::npos;
  while (!text.empty()) {
    const std::size_t end = std::min(text.find('\n'), text.size());
    const std::string_view line = text.substr(0, end);
    text.remove_prefix(std::min(end + 1, text.size()));
    if (column == std::string_view::npos) {
      column = line.find("Soft Limit");
      if (column == std::string_view::npos)
        SPINDLE_THROW(std::runtime_error, "spindle: a /proc/<pid>/limits without its header line");
      continue;
    }
    if (line.size() <= column) continue;
    std::string_view name = line.substr(0, column);
    while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
    std::istringstream values{std::string(line.substr(column))};
    std::string soft, hard;
    if (!(values >> soft >> hard)) continue;
    out.push_back({std::string(name), limit_value(soft, line), limit_value(hard, line)});
  }
  return out;
}

std::optional<std::vector<ResourceLimit>> read_limits(pid_t pid, const std::string& proc_root) {
  auto text = read_or_gone(task_path(pid, proc_root) + "/limits");
  if (!text) return std::nullopt;
  return parse_limits(*text);
}

std::optional<std::vector<std::string>> read_cmdline(pid_t pid, const std::string& proc_root) {
  auto text = read_or_gone(task_path(pid, proc_root) + "/cmdline");
  if (!text) return std::nullopt;
  std::vector<std::string> out;
  for (std::size_t at = 0; at < text->size();) {
    const std::size_t nul = std::min(text->find('\0', at), text->size());
    out.emplace_back(*text, at, nul - at);
    at = nul + 1;
  }
  return out;
}

std::optional<int64_t> read_sysctl_int(const std::string& name, const std::string& proc_root) {
  std::string relative = name;
  std::replace(relative.begin(), relative.end(), '.', '/');
  auto text = read_if_readable(proc_root + "/sys/" + relative);
  if (!text) return std::nullopt;
  int64_t v = 0;
  const auto [p, ec] = std::from_chars(text->data(), text->data() + text->size(), v);
  if (ec != std::errc()) return std::nullopt;
  return v;
}

std::vector<Mapping> parse_maps(std::string_view text) {
  std::vector<Mapping> out;
  while (!text.empty()) {
    const std::size_t end = std::min(text.find('\n'), text.size());
    const std::string_view line = text.substr(0, end);
    text.remove_prefix(std::min(end + 1, text.size()));
    if (line.empty()) continue;
    // start-end perms offset dev inode [path]; the path may hold spaces.
    Mapping m;
    const char* p = line.data();
    const char* const last = line.data() + line.size();
    auto r1 = std::from_chars(p, last, m.start, 16);
    if (r1.ec != std::errc() || r1.ptr == last || *r1.ptr != '-')
      SPINDLE_THROW(std::runtime_error, "spindle: a /proc/<pid>/maps line without an address range: \"" +
                                            std::string(line.substr(0, 80)) + "\"");
    auto r2 = std::from_chars(r1.ptr + 1, last, m.end, 16);
    if (r2.ec != std::errc())
      SPINDLE_THROW(std::runtime_error, "spindle: a /proc/<pid>/maps line without an address range: \"" +
                                            std::string(line.substr(0, 80)) + "\"");
    std::string_view rest(r2.ptr, static_cast<std::size_t>(last - r2.ptr));
    auto word = [&rest]() {
      while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
      const std::size_t n = std::min(rest.find(' '), rest.size());
      std::string_view w = rest.substr(0, n);
      rest.remove_prefix(n);
      return w;
    };
    m.perms = std::string(word());
    word();  // offset
    word();  // dev
    word();  // inode
    while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
    m.path = std::string(rest);
    out.push_back(std::move(m));
  }
  return out;
}

std::optional<std::vector<Mapping>> read_maps(pid_t pid, const std::string& proc_root) {
  auto text = read_or_gone(task_path(pid, proc_root) + "/maps");
  if (!text) return std::nullopt;
  return parse_maps(*text);
}

ThreadSyscall parse_syscall(std::string_view text) {
  std::istringstream in{std::string(text)};
  std::vector<std::string> fields;
  for (std::string w; in >> w;) fields.push_back(std::move(w));
  ThreadSyscall out;
  if (fields.size() < 3) {  // "running"
    out.running = true;
    return out;
  }
  const std::string& sp = fields[fields.size() - 2];
  const std::size_t skip = sp.rfind("0x", 0) == 0 ? 2 : 0;
  uint64_t v = 0;
  const auto [p, ec] = std::from_chars(sp.data() + skip, sp.data() + sp.size(), v, 16);
  if (ec != std::errc())
    SPINDLE_THROW(std::runtime_error, "spindle: a /proc/<pid>/task/<tid>/syscall whose stack pointer is not a "
                                      "number: \"" + std::string(text.substr(0, 80)) + "\"");
  out.stack_pointer = v;
  return out;
}

std::optional<ThreadSyscall> read_thread_syscall(pid_t pid, pid_t tid, const std::string& proc_root) {
  auto text = read_or_gone(task_path(pid, proc_root) + "/task/" + std::to_string(tid) + "/syscall");
  if (!text) return std::nullopt;
  return parse_syscall(*text);
}

std::optional<std::string> read_memory(pid_t pid, uint64_t address, std::size_t length,
                                       const std::string& proc_root) {
  const std::string path = task_path(pid, proc_root) + "/mem";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (gone(errno)) return std::nullopt;
    SPINDLE_THROW_ERRNO("spindle: cannot read " + path + " (reading another process's memory needs ptrace "
                        "access: the same uid and kernel.yama.ptrace_scope 0, or root)");
  }
  std::string out(length, '\0');
  std::size_t got = 0;
  int error = 0;  // of the read that stopped short
  while (got < length) {
    const ssize_t n = ::pread(fd, out.data() + got, length - got, static_cast<off_t>(address + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error = n < 0 ? errno : 0;
      break;
    }
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  if (got == 0 && error != 0) {  // past the first byte, a failure is the range running into unmapped memory
    if (gone(error)) return std::nullopt;
    errno = error;
    SPINDLE_THROW_ERRNO("spindle: cannot read " + std::to_string(length) + " bytes at " + std::to_string(address) +
                        " from " + path);
  }
  out.resize(got);
  return out;
}

}  // namespace spindle::diagnostics
