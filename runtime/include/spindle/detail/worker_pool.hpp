#pragma once
// WorkerPool: starts the worker processes and supervises them.
//
// Workers are either forked here (the default) or forked by a Zygote (for a
// native caller that is already multithreaded; see zygote.hpp).
//
// Each worker is a fork of the consumer with exactly one thread (fork copies
// only the calling thread). The child asks the kernel to SIGKILL it when the
// consumer dies (PR_SET_PDEATHSIG) and also polls getppid() while idle, so no
// worker outlives its consumer. ForkHooks let an embedding runtime keep its
// own state sane across fork; the Python bindings pass the interpreter's
// protocol (PyOS_BeforeFork / PyOS_AfterFork_Parent / PyOS_AfterFork_Child).
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
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace spindle {

class Zygote;

struct ForkHooks {
  // May throw: that worker is not forked, the ones before it are stopped and
  // reaped, and the exception leaves the WorkerPool constructor.
  std::function<void()> before_fork;
  std::function<void()> after_fork_parent;
  std::function<void()> after_fork_child;
};

// A worker started as a new program (posix_spawn) instead of a fork, for
// callers whose process must not be forked (e.g. CUDA initialized). Worker w
// runs `argv` + ["--worker", w, "--parent", <consumer pid>] with the segment
// on descriptor 3 and `fds[i]` on descriptor 4 + i; it attaches with
// attach_worker() (worker_context.hpp).
struct SpawnSpec {
  std::vector<std::string> argv;  // argv[0] is the program path
  std::vector<int> fds;           // extra descriptors the program reads
};
inline constexpr int kSpawnSegmentFd = 3;

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
  // Has `zygote` fork `n` workers running its main `main` over `segment_fd`.
  WorkerPool(int n, Zygote& zygote, const std::string& main, int segment_fd);
  // Starts `n` workers as new programs (see SpawnSpec).
  WorkerPool(int n, const SpawnSpec& spec, int segment_fd);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Non-blocking: reports a worker that has exited since the last call.
  std::optional<WorkerExit> poll_exit();
  // Waits up to `grace` for every worker to exit, then SIGKILLs the rest and
  // reaps them. Idempotent.
  void shutdown(std::chrono::milliseconds grace) noexcept;

  const std::vector<pid_t>& pids() const noexcept { return pids_; }
  // How each worker ended; nullopt while it has not been reaped.
  const std::vector<std::optional<WorkerExit>>& exits() const noexcept { return exits_; }
  int size() const noexcept { return static_cast<int>(pids_.size()); }

 private:
  // The wait status of worker w if it has exited (-1: exited, status unknown).
  std::optional<int> try_reap(std::size_t w);
  // Marks worker w reaped with wait status `status` (-1: unknown) and records how it ended.
  void record_exit(std::size_t w, int status) noexcept;
  // Records a started child, with a pidfd for it if the kernel gives one.
  void add_child(pid_t pid);
  // Closes the pidfds and gives the zygote pool back (after shutdown).
  void release_handles() noexcept;

  std::vector<pid_t> pids_;
  std::vector<int> pidfds_;           // per worker; -1: none (zygote worker, or no pidfd support)
  std::vector<bool> reaped_;
  std::vector<std::optional<WorkerExit>> exits_;  // per worker, set when reaped
  Zygote* zygote_ = nullptr;          // set when the zygote forked the workers
  uint32_t zygote_pool_ = 0;          // our pool id on the zygote
  std::map<pid_t, int> reported_;     // exits the zygote reported, not yet matched
};

}  // namespace spindle
