#pragma once
// WorkerPool: starts the worker processes and supervises them. Not API: a
// Loader builds its pool from the Launcher it was given (launcher.hpp).
//
// How workers are started, reaped and killed is a WorkerProcesses strategy:
// forked here, spawned here (both our children), or forked by a Zygote (its
// children). The pool itself only keeps the pids and how each worker ended.
//
// Each forked worker is a fork of the consumer with exactly one thread (fork
// copies only the calling thread). The child asks the kernel to SIGKILL it
// when the consumer dies (PR_SET_PDEATHSIG) and also polls getppid() while
// idle, so no worker outlives its consumer. ForkHooks let an embedding
// runtime keep its own state sane across fork; the Python bindings pass the
// interpreter's protocol (PyOS_BeforeFork / PyOS_AfterFork_Parent /
// PyOS_AfterFork_Child).
//
// No signal may reach a pid that was reaped and handed to another process.
// Forked and spawned workers are held by pidfd (pidfd_open, Linux >= 5.3):
// waits and kills go through the descriptor, which names the process itself,
// so a worker that other code in the process reaped (a stray waitpid(-1),
// SIGCHLD ignored) answers ESRCH/ECHILD instead of its pid's next owner
// receiving SIGKILL. Where pidfd_open fails (ENOSYS on older kernels, or a
// seccomp filter refusing it) the pool falls back to the pid, which is safe as
// long as only spindle reaps its own children. Zygote workers are killed by
// the zygote, the process that reaps them (zygote.hpp).

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <spindle/launcher.hpp>

namespace spindle {
class Zygote;  // public: spindle/zygote.hpp
}  // namespace spindle

namespace spindle::detail {

// How a pool's workers are started, reaped and killed.
class WorkerProcesses {
 public:
  virtual ~WorkerProcesses() = default;
  // Starts worker w of n and returns its pid; also again, for a worker w that
  // was lost and reaped (WorkerPool::restart). Throws (std::system_error with
  // the errno and the worker) if it cannot; the pool then stops the others.
  virtual pid_t start(int w, int n) = 0;
  // Called once every worker is started (or the start failed).
  virtual void started() noexcept {}
  // The wait status of worker w (pid `pid`) if it has exited (-1: exited,
  // status unknown); nullopt while it runs.
  virtual std::optional<int> try_reap(std::size_t w, pid_t pid) = 0;
  // Kills the workers not reaped yet (`reaped[w]` false). A strategy that can
  // also reap them at once reports each through `record`; the others are
  // reported by try_reap afterwards.
  virtual void kill_unreaped(std::span<const pid_t> pids, const std::vector<bool>& reaped,
                             const std::function<void(std::size_t, int)>& record) noexcept = 0;
  // Gives back what the strategy holds (pidfds, the zygote pool), after shutdown.
  virtual void release() noexcept = 0;
};

// Worker w is a fork running child_main(w) and _exits with its result.
std::unique_ptr<WorkerProcesses> forked_workers(std::function<int(int)> child_main, ForkHooks hooks);
// Worker w is the program of `spec` (see SpawnSpec) with `segment_fd` on kSpawnSegmentFd.
std::unique_ptr<WorkerProcesses> spawned_workers(const SpawnSpec& spec, int segment_fd);
// Worker w is forked by `zygote` and runs its main `main` over `segment_fd`.
std::unique_ptr<WorkerProcesses> zygote_workers(Zygote& zygote, std::string main, int segment_fd);

class WorkerPool {
 public:
  // Starts `n` workers through `processes`. If one cannot be started, those
  // already started are killed and reaped first, then the error leaves here.
  WorkerPool(int n, std::unique_ptr<WorkerProcesses> processes);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Non-blocking: reports a worker that has exited since the last call.
  std::optional<WorkerExit> poll_exit();
  // Starts worker w again, in place of the one poll_exit() reported (its
  // queue, record and id are the new process's). Throws as start() does; the
  // worker then stays reaped.
  void restart(int w);
  // Starts one more worker, numbered size() (of at most `limit`, for the
  // messages); returns its number. Throws as start() does.
  int add(int limit);
  // Waits up to `grace` for every worker to exit, then SIGKILLs the rest and
  // reaps them. Idempotent.
  void shutdown(std::chrono::milliseconds grace) noexcept;

  const std::vector<pid_t>& pids() const noexcept { return pids_; }
  // How each worker ended; nullopt while it has not been reaped.
  const std::vector<std::optional<WorkerExit>>& exits() const noexcept { return exits_; }
  int size() const noexcept { return static_cast<int>(pids_.size()); }

 private:
  // Marks worker w reaped with wait status `status` (-1: unknown) and records how it ended.
  void record_exit(std::size_t w, int status) noexcept;
  // Reaps what has exited until all have or `deadline` passes; true if all have.
  bool reap_all(std::chrono::steady_clock::time_point deadline) noexcept;

  std::unique_ptr<WorkerProcesses> processes_;
  std::vector<pid_t> pids_;
  std::vector<bool> reaped_;
  std::vector<std::optional<WorkerExit>> exits_;  // per worker, set when reaped
};

}  // namespace spindle::detail
