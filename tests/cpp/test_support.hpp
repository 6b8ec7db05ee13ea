#pragma once
// Helpers shared by the spindle C++ tests: temporary directories, fake files,
// shared anonymous mappings, and process/shared-memory inspection. Not part of
// the runtime; nothing here is used by it.

#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

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

}  // namespace spindle::testing
