#include <spindle/worker_pool.hpp>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
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
    if (hooks.before_fork) hooks.before_fork();
    pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);  // consumer died before prctl took effect
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
      errno = err;
      SPINDLE_THROW_ERRNO("spindle: could not start worker " + std::to_string(w) + " of " +
                          std::to_string(n) +
                          (err == EAGAIN ? " (the user's task limit, ulimit -u, or the cgroup's pids.max "
                                           "is reached: lower num_workers or raise the limit)"
                                         : ""));
    }
    pids_.push_back(pid);
    reaped_.push_back(false);
  }
}

WorkerPool::WorkerPool(int n, Zygote& zygote, const std::string& main, int segment_fd) : zygote_(&zygote) {
  for (int w = 0; w < n; ++w) {
    try {
      pids_.push_back(zygote.spawn(main, w, segment_fd));
      reaped_.push_back(false);
    } catch (...) {
      shutdown(std::chrono::milliseconds(0));
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
      errno = rc;
      SPINDLE_THROW_ERRNO("spindle: could not spawn worker " + std::to_string(w) + " (" + spec.argv[0] + ")");
    }
    pids_.push_back(pid);
    reaped_.push_back(false);
  }
}

WorkerPool::~WorkerPool() { shutdown(std::chrono::milliseconds(1000)); }

std::optional<int> WorkerPool::try_reap(std::size_t w) {
  const pid_t pid = pids_[w];
  if (zygote_) {
    while (auto e = zygote_->next_exit(std::chrono::milliseconds(0))) reported_[e->first] = e->second;
    if (auto it = reported_.find(pid); it != reported_.end()) {
      int status = it->second;
      reported_.erase(it);
      return status;
    }
    if (kill(pid, 0) != 0 && errno == ESRCH) return -1;  // gone and reaped elsewhere (zygote died)
    return std::nullopt;
  }
  int status = 0;
  pid_t r = waitpid(pid, &status, WNOHANG);
  if (r == pid) return status;
  if (r < 0 && errno == ECHILD) return -1;
  return std::nullopt;
}

std::optional<WorkerExit> WorkerPool::poll_exit() {
  for (std::size_t w = 0; w < pids_.size(); ++w) {
    if (reaped_[w]) continue;
    auto status = try_reap(w);
    if (!status) continue;
    reaped_[w] = true;
    WorkerExit e;
    e.worker_id = static_cast<int>(w);
    e.pid = pids_[w];
    if (*status >= 0 && WIFSIGNALED(*status)) {
      e.signaled = true;
      e.code = WTERMSIG(*status);
    } else {
      e.code = *status >= 0 ? WEXITSTATUS(*status) : -1;
    }
    return e;
  }
  return std::nullopt;
}

void WorkerPool::shutdown(std::chrono::milliseconds grace) noexcept {
  auto reap_all = [&](std::chrono::steady_clock::time_point deadline) {
    for (;;) {
      bool all = true;
      for (std::size_t w = 0; w < pids_.size(); ++w) {
        if (reaped_[w]) continue;
        if (try_reap(w)) reaped_[w] = true;
        else all = false;
      }
      if (all || std::chrono::steady_clock::now() >= deadline) return all;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  };
  if (reap_all(std::chrono::steady_clock::now() + grace)) return;
  for (std::size_t w = 0; w < pids_.size(); ++w)
    if (!reaped_[w]) kill(pids_[w], SIGKILL);
  if (!zygote_) {
    for (std::size_t w = 0; w < pids_.size(); ++w) {
      if (reaped_[w]) continue;
      int status = 0;
      while (waitpid(pids_[w], &status, 0) < 0 && errno == EINTR) {
      }
      reaped_[w] = true;
    }
    return;
  }
  // The zygote reaps them; its reports arrive within its poll period.
  reap_all(std::chrono::steady_clock::now() + std::chrono::seconds(2));
}

}  // namespace spindle
