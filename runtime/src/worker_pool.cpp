#include <spindle/worker_pool.hpp>

#include <signal.h>
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

WorkerPool::~WorkerPool() { shutdown(std::chrono::milliseconds(1000)); }

std::optional<WorkerExit> WorkerPool::poll_exit() {
  for (std::size_t w = 0; w < pids_.size(); ++w) {
    if (reaped_[w]) continue;
    int status = 0;
    pid_t r = waitpid(pids_[w], &status, WNOHANG);
    if (r == pids_[w] || (r < 0 && errno == ECHILD)) {
      reaped_[w] = true;
      WorkerExit e;
      e.worker_id = static_cast<int>(w);
      e.pid = pids_[w];
      if (r > 0 && WIFSIGNALED(status)) {
        e.signaled = true;
        e.code = WTERMSIG(status);
      } else {
        e.code = r > 0 ? WEXITSTATUS(status) : -1;
      }
      return e;
    }
  }
  return std::nullopt;
}

void WorkerPool::shutdown(std::chrono::milliseconds grace) noexcept {
  const auto deadline = std::chrono::steady_clock::now() + grace;
  for (;;) {
    bool all = true;
    for (std::size_t w = 0; w < pids_.size(); ++w) {
      if (reaped_[w]) continue;
      int status = 0;
      pid_t r = waitpid(pids_[w], &status, WNOHANG);
      if (r == pids_[w] || (r < 0 && errno == ECHILD)) reaped_[w] = true;
      else all = false;
    }
    if (all) return;
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (std::size_t w = 0; w < pids_.size(); ++w) {
    if (reaped_[w]) continue;
    kill(pids_[w], SIGKILL);
    int status = 0;
    while (waitpid(pids_[w], &status, 0) < 0 && errno == EINTR) {
    }
    reaped_[w] = true;
  }
}

}  // namespace spindle
