#include <spindle/detail/worker_pool.hpp>

#include <spindle/detail/parent_death.hpp>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <system_error>
#include <thread>

#include <spindle/error.hpp>
#include <spindle/zygote.hpp>

extern "C" char** environ;

namespace spindle {
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

std::string WorkerExit::describe() const {
  if (signaled) {
    const char* name = strsignal(code);
    return "was killed by signal " + std::to_string(code) + " (" + (name ? name : "?") + ")";
  }
  return "exited with code " + std::to_string(code);
}

WorkerPool::WorkerPool(int n, const std::function<int(int)>& child_main, const ForkHooks& hooks) {
  const pid_t parent = getpid();
  for (int w = 0; w < n; ++w) {
    if (hooks.before_fork) {
      try {
        hooks.before_fork();  // may refuse to fork (the interpreter has a signal to raise)
      } catch (...) {
        shutdown(std::chrono::milliseconds(0));
        release_handles();
        throw;
      }
    }
    pid_t pid = fork();
    if (pid == 0) {
      detail::die_with_process(parent);  // with the consumer process, not the forking thread
      for (int fd : pidfds_)  // the earlier workers' handles are the consumer's business
        if (fd >= 0) close(fd);
      if (hooks.after_fork_child) hooks.after_fork_child();
      int rc = 1;
      try {
        rc = child_main(w);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "spindle: worker %d (pid %d) stopped: %s\n", w, getpid(), e.what());
      } catch (...) {
        std::fprintf(stderr, "spindle: worker %d (pid %d) stopped by an unknown exception\n", w, getpid());
      }
      std::fflush(nullptr);
      _exit(rc);
    }
    const int err = errno;
    if (hooks.after_fork_parent) hooks.after_fork_parent();
    if (pid < 0) {
      shutdown(std::chrono::milliseconds(0));
      release_handles();
      errno = err;
      SPINDLE_THROW_ERRNO("spindle: could not start worker " + std::to_string(w) + " of " +
                          std::to_string(n) +
                          (err == EAGAIN ? " (the user's task limit, ulimit -u, or the cgroup's pids.max "
                                           "is reached: lower num_workers or raise the limit)"
                                         : ""));
    }
    add_child(pid);
  }
}

WorkerPool::WorkerPool(int n, Zygote& zygote, const std::string& main, int segment_fd)
    : zygote_(&zygote), zygote_pool_(zygote.open_pool()) {
  for (int w = 0; w < n; ++w) {
    try {
      pids_.push_back(zygote.spawn(zygote_pool_, main, w, segment_fd));
      pidfds_.push_back(-1);  // not our child: the zygote reaps and kills it
      reaped_.push_back(false);
      exits_.emplace_back();
    } catch (...) {
      shutdown(std::chrono::milliseconds(0));
      release_handles();
      throw;
    }
  }
}

WorkerPool::WorkerPool(int n, const SpawnSpec& spec, int segment_fd) {
  if (spec.argv.empty()) SPINDLE_THROW(std::invalid_argument, "spindle: SpawnSpec needs a program");
  const std::string parent = std::to_string(getpid());
  // Move every source above the targets first: a source that already sits on
  // a target number (say the payload on 3) would be overwritten by an earlier
  // dup2 of the same spawn.
  struct Fds {
    std::vector<int> fds;
    ~Fds() {
      for (int fd : fds) close(fd);
    }
  } high;
  auto lift = [&](int fd) {
    int moved = fcntl(fd, F_DUPFD_CLOEXEC, kSpawnSegmentFd + 1 + static_cast<int>(spec.fds.size()));
    if (moved < 0) SPINDLE_THROW_ERRNO("spindle: cannot duplicate descriptor " + std::to_string(fd));
    high.fds.push_back(moved);
    return moved;
  };
  const int segment = lift(segment_fd);
  std::vector<int> sources;
  for (int fd : spec.fds) sources.push_back(lift(fd));
  for (int w = 0; w < n; ++w) {
    std::vector<std::string> args = spec.argv;
    args.insert(args.end(), {"--worker", std::to_string(w), "--parent", parent});
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    // dup2 onto fixed numbers; the copies do not carry FD_CLOEXEC.
    posix_spawn_file_actions_adddup2(&actions, segment, kSpawnSegmentFd);
    for (std::size_t i = 0; i < sources.size(); ++i)
      posix_spawn_file_actions_adddup2(&actions, sources[i], kSpawnSegmentFd + 1 + static_cast<int>(i));
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
      shutdown(std::chrono::milliseconds(0));
      release_handles();
      errno = rc;
      SPINDLE_THROW_ERRNO("spindle: could not spawn worker " + std::to_string(w) + " (" + spec.argv[0] + ")");
    }
    add_child(pid);
  }
}

WorkerPool::~WorkerPool() {
  shutdown(std::chrono::milliseconds(1000));
  release_handles();
}

void WorkerPool::add_child(pid_t pid) {
  pids_.push_back(pid);
  reaped_.push_back(false);
  exits_.emplace_back();
  pidfds_.push_back(open_pidfd(pid));
}

void WorkerPool::release_handles() noexcept {
  for (int& fd : pidfds_) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  if (zygote_ && zygote_pool_ != 0) zygote_->close_pool(zygote_pool_);
  zygote_pool_ = 0;
}

std::optional<int> WorkerPool::try_reap(std::size_t w) {
  const pid_t pid = pids_[w];
  if (zygote_) {
    while (auto e = zygote_->next_exit(zygote_pool_)) reported_[e->first] = e->second;
    if (auto it = reported_.find(pid); it != reported_.end()) {
      int status = it->second;
      reported_.erase(it);
      return status;
    }
    // A dead zygote reports nothing more; its workers died with it.
    if (!zygote_->alive()) return -1;
    return std::nullopt;
  }
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
    auto status = try_reap(w);
    if (!status) continue;
    record_exit(w, *status);
    return exits_[w];
  }
  return std::nullopt;
}

void WorkerPool::shutdown(std::chrono::milliseconds grace) noexcept {
  auto reap_all = [&](std::chrono::steady_clock::time_point deadline) {
    for (;;) {
      bool all = true;
      for (std::size_t w = 0; w < pids_.size(); ++w) {
        if (reaped_[w]) continue;
        if (auto status = try_reap(w)) record_exit(w, *status);
        else all = false;
      }
      if (all || std::chrono::steady_clock::now() >= deadline) return all;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  };
  if (reap_all(std::chrono::steady_clock::now() + grace)) return;
  if (zygote_) {
    // The zygote reaps them, so only it can tell a live worker from a pid
    // already handed to someone else: it kills those it has not reaped, and
    // reports them within its poll period.
    try {
      zygote_->kill_pool(zygote_pool_);
    } catch (...) {
      // The zygote is gone, and its workers with it; try_reap says so.
    }
    reap_all(std::chrono::steady_clock::now() + std::chrono::seconds(2));
    return;
  }
  for (std::size_t w = 0; w < pids_.size(); ++w) {
    if (reaped_[w]) continue;
    int status = 0;
    if (int fd = pidfds_[w]; fd >= 0) {
      // Through the pidfd: if the worker was reaped elsewhere meanwhile, the
      // kernel answers ESRCH/ECHILD and nobody else is signaled.
      if (pidfd_kill(fd) == 0 || errno == ESRCH) {
        siginfo_t info{};
        int r = 0;
        while ((r = waitid(P_PIDFD, static_cast<id_t>(fd), &info, WEXITED)) < 0 && errno == EINTR) {
        }
        record_exit(w, r == 0 ? wait_status(info) : -1);
        continue;
      }
      // ENOSYS/EPERM (no pidfd_send_signal) or EINVAL: the pid below. The
      // worker is unreaped (try_reap just said so), so its pid is still its own.
    }
    kill(pids_[w], SIGKILL);
    pid_t r = 0;
    while ((r = waitpid(pids_[w], &status, 0)) < 0 && errno == EINTR) {
    }
    record_exit(w, r == pids_[w] ? status : -1);
  }
}

}  // namespace spindle
