#pragma once
// Helpers shared by the spindle C++ tests: temporary directories, fake files,
// shared anonymous mappings, and process/shared-memory inspection. Not part of
// the runtime; nothing here is used by it.

#include <dirent.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <spindle/loader.hpp>

namespace spindle::testing {

// A directory under /tmp, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "spindle-test.XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::filesystem::path path_;
};

// Writes `text` to `path`, creating the parent directories.
inline void write_file(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

// A zeroed MAP_SHARED anonymous mapping: forked children see the same bytes,
// and it is page-aligned, so it can hold a BatchRing.
class SharedMapping {
 public:
  explicit SharedMapping(std::size_t bytes) : size_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
    data_ = static_cast<std::byte*>(p);
  }
  ~SharedMapping() { munmap(data_, size_); }
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;
  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  template <class T>
  T* as(std::size_t offset = 0) const noexcept {
    return reinterpret_cast<T*>(data_ + offset);
  }

 private:
  std::byte* data_;
  std::size_t size_;
};

// Names in /dev/shm that belong to process `pid` ("spindle.<pid>.*").
// Threads of this process now (/proc/self/task).
inline std::size_t thread_count() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

inline std::vector<std::string> spindle_shm_names(pid_t pid) {
  const std::string prefix = "spindle." + std::to_string(pid) + ".";
  std::vector<std::string> names;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).rfind(prefix, 0) == 0) names.emplace_back(e->d_name);
    closedir(d);
  }
  return names;
}

// The pid of a process that existed and has been reaped: no live process has it
// (until the kernel's pid counter wraps around, far beyond a test's lifetime).
inline pid_t reaped_pid() {
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  if (pid < 0) throw std::runtime_error("fork failed");
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return pid;
}

// True when `pid` no longer runs: gone entirely, or a zombie nobody reaped yet
// (an orphan's zombie belongs to init, which a container may never run).
inline bool process_gone(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  // "pid (comm) S ...": the state follows the last ')' (comm may hold parentheses).
  const auto paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() &&
         (line[paren + 2] == 'Z' || line[paren + 2] == 'X');
}

// The live children of this process, from /proc/self/task/<tid>/children.
inline std::vector<pid_t> child_pids() {
  std::vector<pid_t> out;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream in(std::string("/proc/self/task/") + e->d_name + "/children");
      for (pid_t pid; in >> pid;) out.push_back(pid);
    }
    closedir(d);
  }
  return out;
}

// Polls `done` every millisecond until it holds or `timeout` passes.
inline bool eventually(std::chrono::milliseconds timeout, const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (done()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Waits up to `timeout` for child `pid`; SIGKILLs and reaps it if it is still
// running then. Returns the wait status, or -1 if it had to be killed.
inline int wait_child(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) return -1;
    if (std::chrono::steady_clock::now() >= deadline) {
      kill(pid, SIGKILL);
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Runs `body` as pid 1 of a new pid namespace (with its own /proc), where
// nothing but the body allocates pids, so a pid can be handed out again on
// purpose (fork_sleeper_with_pid). `body` returns "" on success, else what
// went wrong. nullopt: this process may not create namespaces (it needs
// CAP_SYS_ADMIN); the caller skips.
inline std::optional<std::string> run_in_pid_namespace(const std::function<std::string()>& body) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
  constexpr int kNoNamespace = 77;
  const pid_t helper = fork();
  if (helper < 0) throw std::runtime_error("fork failed");
  if (helper == 0) {
    close(fds[0]);
    if (unshare(CLONE_NEWPID | CLONE_NEWNS) != 0) _exit(kNoNamespace);
    const pid_t init = fork();  // pid 1 of the new namespace
    if (init == 0) {
      std::string result;
      // A private /proc, so /proc/<pid> and /proc/self name our namespace's pids.
      if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
          mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) {
        result = std::string("cannot mount /proc in the namespace: ") + std::strerror(errno);
      } else {
        try {
          result = body();
        } catch (const std::exception& e) {
          result = std::string("threw: ") + e.what();
        }
      }
      (void)!write(fds[1], result.data(), result.size());
      _exit(0);
    }
    int status = 0;
    while (waitpid(init, &status, 0) < 0 && errno == EINTR) {
    }
    _exit(init > 0 && WIFEXITED(status) ? WEXITSTATUS(status) : 1);
  }
  close(fds[1]);
  std::string out;
  char buf[512];
  for (ssize_t n; (n = read(fds[0], buf, sizeof(buf))) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(helper, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == kNoNamespace) return std::nullopt;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return out + " (the namespace's init died)";
  return out;
}

// Inside run_in_pid_namespace: forks a child that sleeps until killed and
// gets pid `pid` (free again after its process was reaped), via ns_last_pid.
// Returns the child's pid, which differs from `pid` only if that failed.
// Options for `workers` workers and batches of up to `batch` samples of
// `sample_bytes` each: slots of exactly the size such a batch needs.
inline LoaderOptions fixed_sample_options(int workers, uint32_t batch, uint64_t sample_bytes) {
  LoaderOptions o;
  o.num_workers = workers;
  o.batch_capacity = batch;
  o.slot_bytes = sample_bytes * batch;
  return o;
}

// Samples 0..n-1 in order, cut into batches of `size` (the last one shorter).
inline std::vector<std::vector<int64_t>> consecutive_batches(int64_t n, int64_t size) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t i = 0; i < n; i += size) {
    out.emplace_back();
    for (int64_t j = i; j < std::min(n, i + size); ++j) out.back().push_back(j);
  }
  return out;
}

inline pid_t fork_sleeper_with_pid(pid_t pid) {
  {
    std::ofstream last("/proc/sys/kernel/ns_last_pid");
    last << (pid - 1);
  }
  const pid_t child = fork();
  if (child < 0) throw std::runtime_error("fork failed");
  if (child == 0) {
    for (;;) pause();
  }
  return child;
}

}  // namespace spindle::testing
