#pragma once
// Launcher: how a Loader starts its workers. One value, made by one of four
// named factories, so that a Loader has one constructor whatever the kind:
//
//   fork     each worker is a fork of this process with one thread, running
//            a WorkerMain (the default; ForkHooks keep an embedding runtime
//            sane across fork).
//   zygote   each worker is forked by a Zygote, a process started before this
//            one had threads, running one of its named mains (zygote.hpp).
//   spawn    each worker is a new program (posix_spawn), for a process that
//            must not be forked (e.g. CUDA initialized); see SpawnSpec.
//   threads  each worker is a thread of this process's one arena: the same
//            ring, protocol and batches, counted against the same budget. For
//            native worker bodies that need no isolation from a crashing
//            decoder: a worker cannot be killed (close() waits for the batches
//            being filled) and a crash in it is a crash of this process.
//
// Forked and spawned workers ask the kernel to SIGKILL them when the consumer
// dies (PR_SET_PDEATHSIG) and also poll getppid() while idle, so no worker
// outlives its consumer.

#include <sys/types.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <spindle/worker_context.hpp>

namespace spindle {

class Zygote;

struct ForkHooks {
  // May throw: that worker is not forked, the ones before it are stopped and
  // reaped, and the exception leaves the Loader constructor.
  std::function<void()> before_fork;
  std::function<void()> after_fork_parent;
  std::function<void()> after_fork_child;
};

// A worker started as a new program (posix_spawn) instead of a fork, for
// callers whose process must not be forked (e.g. CUDA initialized). Worker w
// runs `argv` + ["--worker", w, "--parent", <consumer pid>] with the segment
// on descriptor 3 and `fds[i]` on descriptor 4 + i, in this process's
// environment with `env` set over it; it attaches with an AttachedWorker
// (worker_context.hpp).
struct SpawnSpec {
  std::vector<std::string> argv;  // argv[0] is the program path
  std::vector<int> fds;           // extra descriptors the program reads
  // "NAME=value" entries, in the environment from the program's first
  // instruction (a Python program's site hooks import libraries that read
  // their thread counts at load).
  std::vector<std::string> env;
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

class Launcher {
 public:
  enum class Kind { kFork, kZygote, kSpawn, kThreads };

  // Worker w is a fork of this process running `main`; `hooks` run around
  // each fork (the Python bindings pass the interpreter's protocol).
  static Launcher fork(WorkerMain main, ForkHooks hooks = {});
  // Worker w is forked by `zygote` and runs its main named `main` (for a
  // caller that is already multithreaded). The zygote must outlive the loader.
  static Launcher zygote(Zygote& zygote, std::string main);
  // Worker w is a new program (see SpawnSpec).
  static Launcher spawn(SpawnSpec spec);
  // Worker w runs `main` on an arena thread of this process.
  static Launcher threads(WorkerMain main);

  Kind kind() const noexcept { return kind_; }
  // kFork, kThreads: the worker body.
  const WorkerMain& main() const noexcept { return main_; }
  // kFork: the hooks around each fork.
  const ForkHooks& hooks() const noexcept { return hooks_; }
  // kZygote: the zygote and the name of its main.
  Zygote* zygote() const noexcept { return zygote_; }
  const std::string& zygote_main() const noexcept { return zygote_main_; }
  // kSpawn: the program.
  const SpawnSpec& spawn_spec() const noexcept { return spawn_; }

 private:
  friend class Loader;  // moves the worker body out instead of copying it
  explicit Launcher(Kind kind) noexcept : kind_(kind) {}

  Kind kind_;
  WorkerMain main_;
  ForkHooks hooks_;
  Zygote* zygote_ = nullptr;
  std::string zygote_main_;
  SpawnSpec spawn_;
};

inline Launcher Launcher::fork(WorkerMain main, ForkHooks hooks) {
  Launcher l(Kind::kFork);
  l.main_ = std::move(main);
  l.hooks_ = std::move(hooks);
  return l;
}

inline Launcher Launcher::zygote(Zygote& zygote, std::string main) {
  Launcher l(Kind::kZygote);
  l.zygote_ = &zygote;
  l.zygote_main_ = std::move(main);
  return l;
}

inline Launcher Launcher::spawn(SpawnSpec spec) {
  Launcher l(Kind::kSpawn);
  l.spawn_ = std::move(spec);
  return l;
}

inline Launcher Launcher::threads(WorkerMain main) {
  Launcher l(Kind::kThreads);
  l.main_ = std::move(main);
  return l;
}

}  // namespace spindle
