// WorkerPool and pids: shutdown never signals a pid that may have been reaped
// and handed to another process, for forked, spawned and zygote workers.
//
// Pid reuse is made deterministic inside a private pid namespace
// (testing::run_in_pid_namespace), where the test is the only process that
// allocates pids, so a reaped worker's pid can be given to a sleeper on purpose.
#include <spindle/detail/batch_ring.hpp>
#include <spindle/shm_segment.hpp>
#include <spindle/worker_context.hpp>
#include <spindle/detail/worker_pool.hpp>
#include <spindle/zygote.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "test_support.hpp"

namespace spindle {
using namespace detail;  // the pool and the ring are what this test is about
namespace {

using namespace std::chrono_literals;
using spindle::testing::eventually;
using spindle::testing::fork_sleeper_with_pid;
using spindle::testing::run_in_pid_namespace;

// Waits for child `pid` to exit without reaping it.
void wait_exited(pid_t pid) {
  siginfo_t info{};
  while (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT) < 0 && errno == EINTR) {
  }
}

// Gives the sleeper `impostor` back and says whether it was still untouched.
std::string check_and_remove(pid_t impostor, pid_t expected) {
  if (impostor != expected)
    return "the namespace handed out pid " + std::to_string(impostor) + ", not " + std::to_string(expected);
  int status = 0;
  const bool untouched = waitpid(impostor, &status, WNOHANG) == 0;
  kill(impostor, SIGKILL);
  while (waitpid(impostor, &status, 0) < 0 && errno == EINTR) {
  }
  return untouched ? "" : "shutdown signaled pid " + std::to_string(impostor) +
                              ", which belonged to another process by then";
}

// A direct child exits, other code in the process reaps it (as a stray
// waitpid(-1) would), and its pid goes to a new process before shutdown.
std::string reaped_elsewhere_then_reused(WorkerPool& pool) {
  const pid_t pid = pool.pids().at(0);
  wait_exited(pid);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const pid_t impostor = fork_sleeper_with_pid(pid);
  pool.shutdown(0ms);
  return check_and_remove(impostor, pid);
}

void expect_ok(const std::optional<std::string>& result) {
  if (!result) GTEST_SKIP() << "needs CAP_SYS_ADMIN for a private pid namespace";
  EXPECT_EQ(*result, "");
}

// Without pidfds (Linux < 5.3, or a seccomp filter) the pool falls back to
// pids, which these tests show to be unsafe.
bool kernel_has_pidfds() {
  const long fd = syscall(SYS_pidfd_open, getpid(), 0);
  if (fd < 0) return false;
  close(static_cast<int>(fd));
  return true;
}

// The worker mains of the zygote tests: one returns at once, one serves until
// the queue closes.
std::map<std::string, WorkerMain> quit_and_idle() {
  return {{"quit", [](WorkerContext&) { return 0; }},
          {"idle", [](WorkerContext& ctx) {
             while (ctx.claim()) {
             }
             return 0;
           }}};
}

// A segment with a ring for `workers` workers, for the zygote's workers to attach to.
struct TestRing {
  explicit TestRing(uint32_t workers)
      : geometry{4, workers, 1, 64, false},
        segment(BatchRing::bytes_for(geometry), "the test ring"),
        ring(BatchRing::create(segment.data(), geometry)) {}
  RingGeometry geometry;
  ShmSegment segment;
  BatchRing ring;
};

// Proves: shutdown does not signal a forked worker's pid after another part of
// the process reaped the worker and the pid went to a new process.
TEST(WorkerPoolPids, ShutdownSparesTheReusedPidOfAForkedWorker) {
  if (!kernel_has_pidfds()) GTEST_SKIP() << "no pidfd_open here: the pool uses pids";
  expect_ok(run_in_pid_namespace([] {
    WorkerPool pool(1, forked_workers([](int) { return 0; }, ForkHooks{}));
    return reaped_elsewhere_then_reused(pool);
  }));
}

// Proves: the same for a worker started with posix_spawn.
TEST(WorkerPoolPids, ShutdownSparesTheReusedPidOfASpawnedWorker) {
  if (!kernel_has_pidfds()) GTEST_SKIP() << "no pidfd_open here: the pool uses pids";
  expect_ok(run_in_pid_namespace([] {
    const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    WorkerPool pool(1, spawned_workers(SpawnSpec{{"/bin/true"}, {}, {}}, fd));
    close(fd);
    return reaped_elsewhere_then_reused(pool);
  }));
}

// Proves: a zygote worker's exit goes to its own pool even when another pool
// on the same zygote polls first, and shutdown never signals its pid after the
// zygote reaped it and the pid went to a new process.
TEST(WorkerPoolPids, ZygotePoolSparesTheReusedPidOfItsReapedWorker) {
  expect_ok(run_in_pid_namespace([]() -> std::string {
    Zygote zygote(quit_and_idle());
    TestRing test(2);
    WorkerPool quitting(1, zygote_workers(zygote, "quit", test.segment.fd()));
    WorkerPool idle(1, zygote_workers(zygote, "idle", test.segment.fd()));
    const pid_t pid = quitting.pids().at(0);
    if (!eventually(5s, [&] { return kill(pid, 0) != 0 && errno == ESRCH; }))
      return "the zygote did not reap its worker";
    // The other pool polls while the exit report is on its way.
    (void)eventually(100ms, [&] { return idle.poll_exit().has_value(); });
    const pid_t impostor = fork_sleeper_with_pid(pid);
    quitting.shutdown(0ms);
    std::string result = check_and_remove(impostor, pid);
    test.ring.queue(0).close();
    idle.shutdown(1s);
    return result;
  }));
}

// Proves: the zygote signals only the workers of the pool asked for that it
// has not reaped yet, and each exit is reported to its own pool only.
TEST(ZygotePools, KillReachesOnlyUnreapedWorkersOfThatPool) {
  Zygote zygote(quit_and_idle());
  TestRing test(2);
  const uint32_t quitting = zygote.open_pool(), idle = zygote.open_pool();
  const pid_t quit_pid = zygote.spawn(quitting, "quit", 0, test.segment.fd());
  std::optional<std::pair<pid_t, int>> exit;
  ASSERT_TRUE(eventually(5s, [&] { return (exit = zygote.next_exit(quitting)).has_value(); }));
  EXPECT_EQ(exit->first, quit_pid);
  EXPECT_TRUE(WIFEXITED(exit->second) && WEXITSTATUS(exit->second) == 0);
  EXPECT_EQ(zygote.kill_pool(quitting), 0) << "a reaped worker must not be signaled";

  const pid_t idle_pid = zygote.spawn(idle, "idle", 1, test.segment.fd());
  EXPECT_EQ(zygote.kill_pool(quitting), 0) << "another pool's worker must not be signaled";
  EXPECT_EQ(zygote.kill_pool(idle), 1);
  ASSERT_TRUE(eventually(5s, [&] { return (exit = zygote.next_exit(idle)).has_value(); }));
  EXPECT_EQ(exit->first, idle_pid);
  EXPECT_TRUE(WIFSIGNALED(exit->second) && WTERMSIG(exit->second) == SIGKILL);
  EXPECT_FALSE(zygote.next_exit(quitting).has_value()) << "an exit went to the wrong pool";
  EXPECT_TRUE(zygote.alive());
  zygote.close_pool(quitting);
  zygote.close_pool(idle);
}

// Proves: a before_fork hook that throws (the Python bindings' does when a
// signal is pending) stops the start: that worker is not forked, the ones
// forked before it are stopped and reaped, and the exception reaches the caller.
TEST(WorkerPoolStart, ABeforeForkHookThatThrowsStopsTheWorkersAlreadyStarted) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  std::vector<pid_t> started;  // each worker's pid, read before the next fork
  int calls = 0;
  ForkHooks hooks;
  hooks.before_fork = [&] {
    if (calls++ > 0) {  // the last worker forked has said its pid: it is running
      pid_t pid = 0;
      ASSERT_EQ(read(fds[0], &pid, sizeof(pid)), static_cast<ssize_t>(sizeof(pid)));
      started.push_back(pid);
    }
    if (started.size() == 2) throw std::runtime_error("a signal to raise");
  };
  const auto child = [&fds](int) {
    const pid_t me = getpid();
    (void)!write(fds[1], &me, sizeof(me));
    pause();
    return 0;
  };
  EXPECT_THROW(WorkerPool(4, forked_workers(child, hooks)), std::runtime_error);
  close(fds[0]);
  close(fds[1]);
  ASSERT_EQ(started.size(), 2u);
  for (pid_t pid : started) {
    int status = 0;
    EXPECT_EQ(waitpid(pid, &status, WNOHANG), -1) << "worker " << pid << " was not reaped";
    EXPECT_EQ(errno, ECHILD);
  }
}

// Proves: a spawned worker starts in this process's environment with SpawnSpec::env set over it
// (an entry of a name this process has replaces it; the other names are kept).
TEST(WorkerPoolSpawn, TheProgramStartsWithSpecEnvOverThisProcesssEnvironment) {
  setenv("SPINDLE_TEST_KEPT", "kept", 1);
  setenv("SPINDLE_TEST_SET", "old", 1);
  const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  WorkerPool pool(1, spawned_workers(SpawnSpec{{"/bin/sh", "-c", "test \"$SPINDLE_TEST_SET\" = new && test \"$SPINDLE_TEST_KEPT\" = kept", "sh"},
                                               {},
                                               {"SPINDLE_TEST_SET=new"}},
                                     fd));
  close(fd);
  std::optional<WorkerExit> exit;
  ASSERT_TRUE(eventually(10s, [&] { return (exit = pool.poll_exit()).has_value(); })) << "the program did not end";
  EXPECT_FALSE(exit->signaled);
  EXPECT_EQ(exit->code, 0) << "the program saw another environment";
  unsetenv("SPINDLE_TEST_KEPT");
  unsetenv("SPINDLE_TEST_SET");
}

}  // namespace
}  // namespace spindle
