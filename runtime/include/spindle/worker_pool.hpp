#pragma once
// WorkerPool: forks the worker processes and supervises them.
//
// Each worker is a fork of the consumer with exactly one thread (fork copies
// only the calling thread). The child asks the kernel to SIGKILL it when the
// consumer dies (PR_SET_PDEATHSIG) and also polls getppid() while idle, so no
// worker outlives its consumer. ForkHooks let an embedding runtime keep its
// own state sane across fork; the Python bindings pass the interpreter's
// protocol (PyOS_BeforeFork / PyOS_AfterFork_Parent / PyOS_AfterFork_Child).

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace spindle {

struct ForkHooks {
  std::function<void()> before_fork;
  std::function<void()> after_fork_parent;
  std::function<void()> after_fork_child;
};

// How a worker ended.
struct WorkerExit {
  int worker_id = -1;
  pid_t pid = 0;
  bool signaled = false;
  int code = 0;  // signal number if signaled, else exit status
  // "was killed by signal 9 (Killed)" / "exited with code 3"
  std::string describe() const;
};

class WorkerPool {
 public:
  // Forks `n` workers; worker w runs child_main(w) and _exits with its
  // result. Throws std::system_error (with the errno and the worker that could
  // not be started) if fork fails; workers already started are killed first.
  WorkerPool(int n, const std::function<int(int)>& child_main, const ForkHooks& hooks);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Non-blocking: reports a worker that has exited since the last call.
  std::optional<WorkerExit> poll_exit();
  // Waits up to `grace` for every worker to exit, then SIGKILLs the rest and
  // reaps them. Idempotent.
  void shutdown(std::chrono::milliseconds grace) noexcept;

  const std::vector<pid_t>& pids() const noexcept { return pids_; }
  int size() const noexcept { return static_cast<int>(pids_.size()); }

 private:
  std::vector<pid_t> pids_;
  std::vector<bool> reaped_;
};

}  // namespace spindle
