#include <spindle/detail/worker_pool.hpp>

#include <spindle/procfs.hpp>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <string_view>
#include <system_error>
#include <thread>

#include <spindle/error.hpp>
#include <spindle/zygote.hpp>

#include "child_stdio.hpp"

extern "C" char** environ;

namespace spindle {

std::string WorkerExit::describe() const {
  if (signaled) {
    const char* name = strsignal(code);
    return "was killed by signal " + std::to_string(code) + " (" + (name ? name : "?") + ")";
  }
  return "exited with code " + std::to_string(code);
}

}  // namespace spindle

namespace spindle::detail {
namespace {

#ifndef P_PIDFD
constexpr idtype_t P_PIDFD = static_cast<idtype_t>(3);  // Linux 5.4; older glibc headers lack it
#endif

// A descriptor that names child `pid` itself rather than its number, or -1
// where the kernel offers none: ENOSYS before Linux 5.3, or ENOSYS/EPERM from
// a seccomp filter that does not know the call. Taken right after the child
// starts, while only we can reap it, so it cannot name anyone else. It is
// close-on-exec by default.
int open_pidfd(pid_t pid) noexcept {
#ifdef SYS_pidfd_open
  const long fd = syscall(SYS_pidfd_open, pid, 0);
  return fd >= 0 ? static_cast<int>(fd) : -1;
#else
  (void)pid;
  return -1;
#endif
}

int pidfd_kill(int pidfd) noexcept {
#ifdef SYS_pidfd_send_signal
  return static_cast<int>(syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0));
#else
  (void)pidfd;
  errno = ENOSYS;
  return -1;
#endif
}

// waitid's siginfo as the wait status waitpid would have given.
int wait_status(const siginfo_t& info) noexcept {
  switch (info.si_code) {
    case CLD_EXITED: return (info.si_status & 0xff) << 8;
    case CLD_KILLED: return info.si_status & 0x7f;
    case CLD_DUMPED: return (info.si_status & 0x7f) | 0x80;  // WCOREFLAG
    default: return -1;
  }
}

}  // namespace


// ---------------------------------------------------------------- our children

namespace {

// Workers that are children of this process (forked or spawned), held by
// pidfd where the kernel gives one.
class ChildProcesses : public WorkerProcesses {
 public:
  std::optional<int> try_reap(std::size_t w, pid_t pid) override {
    int status = 0;
    if (int& fd = pidfds_[w]; fd >= 0) {
      siginfo_t info{};
      if (waitid(P_PIDFD, static_cast<id_t>(fd), &info, WEXITED | WNOHANG) == 0) {
        if (info.si_pid == 0) return std::nullopt;  // still running
        return wait_status(info);
      }
      if (errno == EINTR) return std::nullopt;
      if (errno == ECHILD) return -1;  // reaped by other code in this process; status unknown
      // EINVAL: a kernel with pidfd_open but without waitid(P_PIDFD) (5.3): use
      // the pid from now on, the child is still unreaped so it is still ours.
      close(fd);
      fd = -1;
    }
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno == ECHILD) return -1;
    return std::nullopt;
  }

  void kill_unreaped(std::span<const pid_t> pids, const std::vector<bool>& reaped,
                     const std::function<void(std::size_t, int)>& record) noexcept override {
    for (std::size_t w = 0; w < pids.size(); ++w) {
      if (reaped[w]) continue;
      int status = 0;
      if (int fd = pidfds_[w]; fd >= 0) {
        // Through the pidfd: if the worker was reaped elsewhere meanwhile, the
        // kernel answers ESRCH/ECHILD and nobody else is signaled.
        if (pidfd_kill(fd) == 0 || errno == ESRCH) {
          siginfo_t info{};
          int r = 0;
          while ((r = waitid(P_PIDFD, static_cast<id_t>(fd), &info, WEXITED)) < 0 && errno == EINTR) {
          }
          record(w, r == 0 ? wait_status(info) : -1);
          continue;
        }
        // ENOSYS/EPERM (no pidfd_send_signal) or EINVAL: the pid below. The
        // worker is unreaped (try_reap just said so), so its pid is still its own.
      }
      kill(pids[w], SIGKILL);
      pid_t r = 0;
      while ((r = waitpid(pids[w], &status, 0)) < 0 && errno == EINTR) {
      }
      record(w, r == pids[w] ? status : -1);
    }
  }

  void release() noexcept override {
    for (int& fd : pidfds_) {
      if (fd >= 0) close(fd);
      fd = -1;
    }
  }

 protected:
  // Records child `pid` as worker w (a new one, or one that replaces a lost
  // worker w), with a pidfd for it if the kernel gives one.
  pid_t add_child(int w, pid_t pid) {
    const auto i = static_cast<std::size_t>(w);
    if (pidfds_.size() <= i) pidfds_.resize(i + 1, -1);
    if (pidfds_[i] >= 0) close(pidfds_[i]);  // the lost worker's, reaped
    pidfds_[i] = open_pidfd(pid);
    return pid;
  }

  std::vector<int> pidfds_;  // per worker; -1: no pidfd support
};

class ForkedWorkers final : public ChildProcesses {
 public:
  ForkedWorkers(std::function<int(int)> child_main, ForkHooks hooks)
      : child_main_(std::move(child_main)), hooks_(std::move(hooks)), parent_(getpid()) {}

  pid_t start(int w, int n) override {
    if (hooks_.before_fork) hooks_.before_fork();  // may refuse to fork (the interpreter has a signal to raise)
    pid_t pid = fork();
    if (pid == 0) {
      detail::drop_inherited_stdio();
      procfs::die_with_process(parent_);  // with the consumer process, not the forking thread
      for (int fd : pidfds_)  // the earlier workers' handles are the consumer's business
        if (fd >= 0) close(fd);
      if (hooks_.after_fork_child) hooks_.after_fork_child();
      int rc = 1;
      try {
        rc = child_main_(w);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "spindle: worker %d (pid %d) stopped: %s\n", w, getpid(), e.what());
      } catch (...) {
        std::fprintf(stderr, "spindle: worker %d (pid %d) stopped by an unknown exception\n", w, getpid());
      }
      detail::flush_own_stdio();
      _exit(rc);
    }
    const int err = errno;
    if (hooks_.after_fork_parent) hooks_.after_fork_parent();
    if (pid < 0) {
      errno = err;
      SPINDLE_THROW_ERRNO("spindle: could not start worker " + std::to_string(w) + " of " +
                          std::to_string(n) +
                          (err == EAGAIN ? " (the user's task limit, ulimit -u, or the cgroup's pids.max "
                                           "is reached: lower num_workers or raise the limit)"
                                         : ""));
    }
    return add_child(w, pid);
  }

 private:
  std::function<int(int)> child_main_;
  ForkHooks hooks_;
  pid_t parent_;
};

class SpawnedWorkers final : public ChildProcesses {
 public:
  SpawnedWorkers(const SpawnSpec& spec, int segment_fd) : spec_(spec), parent_(std::to_string(getpid())) {
    if (spec_.argv.empty()) SPINDLE_THROW(std::invalid_argument, "spindle: SpawnSpec needs a program");
    // Move every source above the targets first: a source that already sits on
    // a target number (say the payload on 3) would be overwritten by an earlier
    // dup2 of the same spawn.
    segment_ = lift(segment_fd);
    for (int fd : spec_.fds) sources_.push_back(lift(fd));
    // This process's environment with spec_.env set over it (an entry of the
    // same name is replaced).
    for (auto& entry : spec_.env) envp_.push_back(entry.data());
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string_view var(*e);
      const std::string_view name = var.substr(0, var.find('='));
      const bool replaced = std::any_of(spec_.env.begin(), spec_.env.end(), [name](const std::string& entry) {
        return entry.size() > name.size() && entry.compare(0, name.size(), name) == 0 && entry[name.size()] == '=';
      });
      if (!replaced) envp_.push_back(*e);
    }
    envp_.push_back(nullptr);
  }

  pid_t start(int w, int /*n*/) override {
    std::vector<std::string> args = spec_.argv;
    args.insert(args.end(), {"--worker", std::to_string(w), "--parent", parent_});
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    // dup2 onto fixed numbers; the copies do not carry FD_CLOEXEC.
    posix_spawn_file_actions_adddup2(&actions, segment_, kSpawnSegmentFd);
    for (std::size_t i = 0; i < sources_.size(); ++i)
      posix_spawn_file_actions_adddup2(&actions, sources_[i], kSpawnSegmentFd + 1 + static_cast<int>(i));
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp_.data());
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
      errno = rc;
      SPINDLE_THROW_ERRNO("spindle: could not spawn worker " + std::to_string(w) + " (" + spec_.argv[0] + ")");
    }
    return add_child(w, pid);
  }

  // The lifted copies are kept until release(): a lost worker is spawned again from them.
  void release() noexcept override {
    ChildProcesses::release();
    high_.close_all();
  }

 private:
  int lift(int fd) {
    int moved = fcntl(fd, F_DUPFD_CLOEXEC, kSpawnSegmentFd + 1 + static_cast<int>(spec_.fds.size()));
    if (moved < 0) SPINDLE_THROW_ERRNO("spindle: cannot duplicate descriptor " + std::to_string(fd));
    high_.fds.push_back(moved);
    return moved;
  }

  struct Fds {
    std::vector<int> fds;
    void close_all() noexcept {
      for (int fd : fds) close(fd);
      fds.clear();
    }
    ~Fds() { close_all(); }
  };

  SpawnSpec spec_;
  std::string parent_;
  Fds high_;  // the lifted copies of the segment and the sources
  int segment_ = -1;
  std::vector<int> sources_;
  std::vector<char*> envp_;  // into spec_.env and environ
};

// ---------------------------------------------------------------- the zygote's children

class ZygoteWorkers final : public WorkerProcesses {
 public:
  ZygoteWorkers(Zygote& zygote, std::string main, int segment_fd)
      : zygote_(zygote), pool_(zygote.open_pool()), main_(std::move(main)), segment_fd_(segment_fd) {}

  pid_t start(int w, int /*n*/) override {
    return zygote_.spawn(pool_, main_, w, segment_fd_);  // not our child: the zygote reaps and kills it
  }

  std::optional<int> try_reap(std::size_t /*w*/, pid_t pid) override {
    while (auto e = zygote_.next_exit(pool_)) reported_[e->first] = e->second;
    if (auto it = reported_.find(pid); it != reported_.end()) {
      int status = it->second;
      reported_.erase(it);
      return status;
    }
    // A dead zygote reports nothing more; its workers died with it.
    if (!zygote_.alive()) return -1;
    return std::nullopt;
  }

  void kill_unreaped(std::span<const pid_t>, const std::vector<bool>&,
                     const std::function<void(std::size_t, int)>&) noexcept override {
    // The zygote reaps them, so only it can tell a live worker from a pid
    // already handed to someone else: it kills those it has not reaped, and
    // reports them within its poll period.
    try {
      zygote_.kill_pool(pool_);
    } catch (...) {
      // The zygote is gone, and its workers with it; try_reap says so.
    }
  }

  void release() noexcept override {
    if (pool_ != 0) zygote_.close_pool(pool_);
    pool_ = 0;
  }

 private:
  Zygote& zygote_;
  uint32_t pool_ = 0;             // our pool id on the zygote
  std::string main_;
  int segment_fd_;
  std::map<pid_t, int> reported_;  // exits the zygote reported, not yet matched
};

}  // namespace

std::unique_ptr<WorkerProcesses> forked_workers(std::function<int(int)> child_main, ForkHooks hooks) {
  return std::make_unique<ForkedWorkers>(std::move(child_main), std::move(hooks));
}

std::unique_ptr<WorkerProcesses> spawned_workers(const SpawnSpec& spec, int segment_fd) {
  return std::make_unique<SpawnedWorkers>(spec, segment_fd);
}

std::unique_ptr<WorkerProcesses> zygote_workers(Zygote& zygote, std::string main, int segment_fd) {
  return std::make_unique<ZygoteWorkers>(zygote, std::move(main), segment_fd);
}

// ---------------------------------------------------------------- the pool

WorkerPool::WorkerPool(int n, std::unique_ptr<WorkerProcesses> processes) : processes_(std::move(processes)) {
  for (int w = 0; w < n; ++w) {
    try {
      pids_.push_back(processes_->start(w, n));
    } catch (...) {
      shutdown(std::chrono::milliseconds(0));
      processes_->started();
      processes_->release();
      throw;
    }
    reaped_.push_back(false);
    exits_.emplace_back();
  }
  processes_->started();
}

WorkerPool::~WorkerPool() {
  shutdown(std::chrono::milliseconds(1000));
  processes_->release();
}

void WorkerPool::record_exit(std::size_t w, int status) noexcept {
  reaped_[w] = true;
  WorkerExit e;
  e.worker_id = static_cast<int>(w);
  e.pid = pids_[w];
  if (status >= 0 && WIFSIGNALED(status)) {
    e.signaled = true;
    e.code = WTERMSIG(status);
  } else {
    e.code = status >= 0 ? WEXITSTATUS(status) : -1;
  }
  exits_[w] = e;
}

std::optional<WorkerExit> WorkerPool::poll_exit() {
  for (std::size_t w = 0; w < pids_.size(); ++w) {
    if (reaped_[w]) continue;
    auto status = processes_->try_reap(w, pids_[w]);
    if (!status) continue;
    record_exit(w, *status);
    return exits_[w];
  }
  return std::nullopt;
}

void WorkerPool::restart(int w) {
  const auto i = static_cast<std::size_t>(w);
  if (i >= pids_.size() || !reaped_[i])
    SPINDLE_FAIL_INTERNAL("spindle: restart of worker " + std::to_string(w) + ", which is not reaped");
  pids_[i] = processes_->start(w, size());
  reaped_[i] = false;
  exits_[i].reset();
}

int WorkerPool::add(int limit) {
  const int w = size();
  pids_.push_back(processes_->start(w, limit));  // nothing recorded if it throws
  reaped_.push_back(false);
  exits_.emplace_back();
  return w;
}

bool WorkerPool::reap_all(std::chrono::steady_clock::time_point deadline) noexcept {
  for (;;) {
    bool all = true;
    for (std::size_t w = 0; w < pids_.size(); ++w) {
      if (reaped_[w]) continue;
      if (auto status = processes_->try_reap(w, pids_[w])) record_exit(w, *status);
      else all = false;
    }
    if (all || std::chrono::steady_clock::now() >= deadline) return all;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void WorkerPool::shutdown(std::chrono::milliseconds grace) noexcept {
  if (reap_all(std::chrono::steady_clock::now() + grace)) return;
  processes_->kill_unreaped(pids_, reaped_, [this](std::size_t w, int status) { record_exit(w, status); });
  // Children killed above are reaped already; the zygote reports its own
  // within its poll period.
  reap_all(std::chrono::steady_clock::now() + std::chrono::seconds(2));
}

}  // namespace spindle::detail
