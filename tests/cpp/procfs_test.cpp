// procfs: the operating-system facts read in one place (stat fields, the
// thread list and names, the cgroup pids levels, parent death), live and from
// fake /proc and cgroup trees.
#include <spindle/procfs.hpp>

#include <poll.h>
#include <stdlib.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>

#include <gtest/gtest.h>

#include "test_support.hpp"

namespace spindle::procfs {
namespace {

using spindle::testing::TempDir;
using spindle::testing::write_file;

// A stat line whose fields 3.. are `rest` after "(<comm>)".
std::string stat_line(pid_t pid, const std::string& comm, char state, pid_t ppid, int threads, uint64_t start) {
  std::string s = std::to_string(pid) + " (" + comm + ") " + state + " " + std::to_string(ppid);
  for (int f = 5; f <= 19; ++f) s += " 0";
  s += " " + std::to_string(threads) + " 0 " + std::to_string(start) + " 4096 100\n";
  return s;
}

// Polls `pred` for up to 5 s.
template <class Pred>
bool eventually(Pred pred) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// Proves: utime and stime (fields 14 and 15) are read, in clock ticks.
TEST(ProcfsStat, ParsesCpuTimes) {
  std::string line = "12 (w) S 1";
  for (int f = 5; f <= 22; ++f) {
    line += ' ';
    line += std::to_string(f == 14 ? 123 : f == 15 ? 45 : f == 20 ? 2 : 0);
  }
  line += " 4096\n";
  const ProcessStat s = parse_stat(line);
  EXPECT_EQ(s.utime, 123u);
  EXPECT_EQ(s.stime, 45u);
  EXPECT_EQ(s.num_threads, 2);
  EXPECT_GT(clock_ticks_per_second(), 0);
}

// Proves: a comm holding spaces and ')' parses, the fields resuming after the last ')'.
TEST(ProcfsStat, ParsesCommWithSpacesAndParentheses) {
  const ProcessStat s = parse_stat(stat_line(4242, "a) b (c) d", 'T', 17, 3, 987654321));
  EXPECT_EQ(s.pid, 4242);
  EXPECT_EQ(s.comm, "a) b (c) d");
  EXPECT_EQ(s.state, 'T');
  EXPECT_EQ(s.ppid, 17);
  EXPECT_EQ(s.num_threads, 3);
  EXPECT_EQ(s.start_time, 987654321u);
}

// Proves: text that is not a stat line is an error, not a process that is gone.
TEST(ProcfsStat, RejectsTextThatIsNotAStatLine) {
  EXPECT_THROW((void)parse_stat("no parentheses here"), std::runtime_error);
  EXPECT_THROW((void)parse_stat("12 (short) S 1 2"), std::runtime_error);
  EXPECT_THROW((void)parse_stat(stat_line(1, "x", 'S', 0, 1, 5).replace(7, 1, "z")), std::runtime_error)
      << "ppid not a number";
}

// Proves: a status file gives its Name, PPid, the real uid (the first of Uid's four) and Threads; one without Uid: is an error.
TEST(ProcfsStatus, ParsesNameParentRealUidAndThreads) {
  const ProcessStatus s =
      parse_status("Name:\tpt_main thread\nUmask:\t0022\nState:\tS (sleeping)\nPPid:\t41\n"
                   "Uid:\t1000\t0\t0\t0\nGid:\t1000\t1000\t1000\t1000\nThreads:\t17\n");
  EXPECT_EQ(s.name, "pt_main thread");
  EXPECT_EQ(s.ppid, 41);
  EXPECT_EQ(s.real_uid, 1000u);
  EXPECT_EQ(s.threads, 17);
  EXPECT_THROW(parse_status("Name:\tx\nThreads:\t1\n"), std::runtime_error);
}

// Proves: our own status agrees with getuid() and our thread list; process_ids lists us; uid_tasks counts at least us.
TEST(ProcfsStatus, OwnStatusAndTheUidsTasks) {
  const auto s = read_status(getpid());
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->real_uid, getuid());
  EXPECT_EQ(s->ppid, getppid());
  EXPECT_EQ(static_cast<std::size_t>(s->threads), thread_ids(getpid())->size());
  const auto pids = process_ids();
  EXPECT_TRUE(std::binary_search(pids.begin(), pids.end(), getpid()));
  EXPECT_GE(uid_tasks(getuid()), s->threads);
  EXPECT_FALSE(read_status(0x3fffffff).has_value());
}

// Proves: a forked child's stat names its ppid and its state, sleeping then a zombie; reaped, it is gone.
TEST(ProcfsStat, ForkedChildNamesItsParentAndState) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    char c;
    (void)!read(fds[0], &c, 1);  // sleeps until the test writes or dies
    _exit(0);
  }
  close(fds[0]);
  std::optional<ProcessStat> st;
  EXPECT_TRUE(eventually([&] { return (st = read_stat(child)) && st->state == 'S'; })) << "never sleeping";
  ASSERT_TRUE(st);
  EXPECT_EQ(st->pid, child);
  EXPECT_EQ(st->ppid, getpid());
  EXPECT_EQ(st->num_threads, 1);
  EXPECT_GT(st->start_time, 0u);
  EXPECT_EQ(read_stat(child)->start_time, st->start_time) << "start time is stable";

  kill(child, SIGKILL);
  EXPECT_TRUE(eventually([&] { return read_stat(child)->state == 'Z'; })) << "not a zombie before it is reaped";
  EXPECT_EQ(describe_state('Z'), "a zombie");
  waitpid(child, nullptr, 0);
  close(fds[1]);
  EXPECT_FALSE(read_stat(child)) << "a reaped process is gone";
}

// Proves: our own stat agrees with the thread list, and describe_state has a word for each letter.
TEST(ProcfsStat, OwnStatCountsOurThreads) {
  auto st = read_stat(getpid());
  ASSERT_TRUE(st);
  EXPECT_EQ(st->state, 'R');
  EXPECT_EQ(st->ppid, getppid());
  EXPECT_EQ(static_cast<std::size_t>(st->num_threads), thread_ids(getpid())->size());
  EXPECT_EQ(describe_state('T'), "stopped (SIGSTOP/SIGTSTP)");
  EXPECT_EQ(describe_state('q'), "in state 'q'");
}

// Proves: a process's thread list grows when it starts a thread, and names that thread.
TEST(ProcfsThreads, ListGrowsWithANamedThread) {
  const auto before = threads(getpid());
  ASSERT_TRUE(before);
  ASSERT_GE(before->size(), 1u);
  EXPECT_EQ(before->front().tid, getpid()) << "the main thread's tid is the pid, and comes first";

  std::atomic<bool> named{false}, stop{false};
  std::atomic<pid_t> tid{0};
  std::thread extra([&] {
    tid = gettid();
    pthread_setname_np(pthread_self(), "procfs probe");
    named = true;
    while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  while (!named) std::this_thread::yield();
  const auto during = threads(getpid());
  stop = true;
  extra.join();
  ASSERT_TRUE(during);
  EXPECT_EQ(during->size(), before->size() + 1);
  auto it = std::find_if(during->begin(), during->end(), [&](const ThreadEntry& t) { return t.tid == tid; });
  ASSERT_NE(it, during->end());
  EXPECT_EQ(it->name, "procfs probe");
  EXPECT_EQ(thread_name(getpid(), tid), std::nullopt) << "joined: that thread is gone";
}

// Proves: thread ids and names come from <root>/<pid>/task, sorted, and a missing process is nullopt.
TEST(ProcfsThreads, FakeTreeAndMissingProcess) {
  TempDir dir;
  const auto proc = dir.path().string();
  for (const char* tid : {"78", "7", "77"}) write_file(dir.path() / "7" / "task" / tid / "comm", std::string("w-") + tid + "\n");
  write_file(dir.path() / "7" / "task" / "not-a-tid" / "comm", "x\n");
  EXPECT_EQ(thread_ids(7, proc), (std::vector<pid_t>{7, 77, 78}));
  auto t = threads(7, proc);
  ASSERT_TRUE(t);
  ASSERT_EQ(t->size(), 3u);
  EXPECT_EQ((*t)[2].tid, 78);
  EXPECT_EQ((*t)[2].name, "w-78");
  EXPECT_EQ(thread_ids(8, proc), std::nullopt);
  EXPECT_EQ(threads(8, proc), std::nullopt);
  EXPECT_EQ(thread_name(7, 79, proc), std::nullopt);
  EXPECT_EQ(read_stat(8, proc), std::nullopt);
}

// Proves: a stat that exists but cannot be read is a std::system_error with its errno, not "gone".
TEST(ProcfsStat, UnreadableStatThrowsSystemError) {
  TempDir dir;
  std::filesystem::create_directories(dir.path() / "9" / "stat");  // a directory: read gives EISDIR
  try {
    (void)read_stat(9, dir.path().string());
    FAIL() << "no exception";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().value(), EISDIR);
    EXPECT_NE(std::string(e.what()).find("/9/stat"), std::string::npos) << e.what();
  }
}

// A fake /proc and cgroup root for the pids walk.
class FakeCgroup : public ::testing::Test {
 protected:
  std::string proc() const { return (dir_.path() / "proc").string(); }
  std::string cgroup() const { return (dir_.path() / "cgroup").string(); }
  void cgroup_file(const std::string& pid, const std::string& text) {
    write_file(dir_.path() / "proc" / pid / "cgroup", text);
  }
  void pids(const std::string& rel, const std::string& max, const std::string& current) {
    write_file(dir_.path() / "cgroup" / rel / "pids.max", max + "\n");
    write_file(dir_.path() / "cgroup" / rel / "pids.current", current + "\n");
  }
  TempDir dir_;
};

// Proves: the v2 walk lists every level with both files from the process's cgroup up to the root, "max" as no limit.
TEST_F(FakeCgroup, ListsV2LevelsUpToTheRoot) {
  cgroup_file("self", "0::/a/b/c\n");
  pids("a/b/c", "max", "3");
  pids("a/b", "10", "7");
  write_file(dir_.path() / "cgroup" / "a" / "pids.current", "9\n");  // no pids.max: left out
  pids("", "20", "19");
  const auto levels = cgroup_pids_levels(std::nullopt, proc(), cgroup());
  ASSERT_EQ(levels.size(), 3u);
  EXPECT_EQ(levels[0].path, cgroup() + "/a/b/c");
  EXPECT_EQ(levels[0].max, std::nullopt);
  EXPECT_EQ(levels[0].current, 3);
  EXPECT_EQ(levels[1].path, cgroup() + "/a/b");
  EXPECT_EQ(levels[1].max, 10);
  EXPECT_EQ(levels[2].path, cgroup());
  EXPECT_EQ(levels[2].max, 20);
  EXPECT_EQ(levels[2].current, 19);
}

// Proves: the v1 pids hierarchy wins over v2, another process's cgroup is read by pid, and no cgroup file gives no levels.
TEST_F(FakeCgroup, V1WinsAndOtherPidsAndNoFile) {
  cgroup_file("55", "0::/v2\n4:pids:/job\n3:cpu,cpuacct:/x\n");
  pids("pids/job", "64", "60");
  pids("v2", "5", "1");
  const auto levels = cgroup_pids_levels(55, proc(), cgroup());
  ASSERT_EQ(levels.size(), 1u) << "the v1 root has no files";
  EXPECT_EQ(levels[0].path, cgroup() + "/pids/job");
  EXPECT_EQ(levels[0].max, 64);
  EXPECT_EQ(levels[0].current, 60);
  EXPECT_TRUE(cgroup_pids_levels(std::nullopt, proc(), cgroup()).empty()) << "no /proc/self/cgroup";
  EXPECT_TRUE(cgroup_pids_levels(56, proc(), cgroup()).empty()) << "no such process";
}

// Proves: arm_parent_death is true under a live parent, false for a parent that is not ours, and throws for a bad signal.
TEST(ProcfsParentDeath, ArmChecksTheParent) {
  const pid_t me = getpid();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // no gtest in the child: the exit code says which check failed
    if (!arm_parent_death(me, SIGKILL)) _exit(10);
    if (arm_parent_death(me + 1, SIGKILL)) _exit(11);
    try {
      (void)arm_parent_death(me, 100000);
      _exit(12);
    } catch (const std::system_error& e) {
      if (e.code().value() != EINVAL) _exit(13);
    }
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// Proves: a grandchild that called die_with_process(its parent) dies when that parent is killed.
TEST(ProcfsParentDeath, DiesWithTheParentProcess) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const pid_t parent = getpid();
    if (fork() == 0) {
      close(fds[0]);
      die_with_process(parent);
      (void)!write(fds[1], "r", 1);
      for (;;) pause();  // until the death signal
    }
    close(fds[1]);
    for (;;) pause();  // until the test kills it
  }
  close(fds[1]);
  char c = 0;
  ASSERT_EQ(read(fds[0], &c, 1), 1) << "the grandchild did not arm";
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  pollfd p{fds[0], POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 5000), 1) << "the grandchild outlived its parent";
  EXPECT_EQ(read(fds[0], &c, 1), 0) << "EOF: its end of the pipe closed with it";
  close(fds[0]);
}

// Proves: procs_running reads /proc/stat's runnable-task count (this thread is one of them on the
// real machine), and a stat file without the line, or no file, gives nullopt.
TEST(ProcfsStat, ProcsRunningReadsTheRunnableTasks) {
  const auto real = procs_running();
  ASSERT_TRUE(real.has_value());
  EXPECT_GE(*real, 1);
  char dir[] = "/tmp/spindle-procfs-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string root = dir;
  EXPECT_FALSE(procs_running(root).has_value());  // no stat file
  {
    std::ofstream out(root + "/stat");
    out << "cpu  10 0 5 100 2 0 0 0 0 0\nctxt 99\nprocs_running 3\nprocs_blocked 0\n";
  }
  EXPECT_EQ(procs_running(root), 3);
  {
    std::ofstream out(root + "/stat");
    out << "cpu  10 0 5 100 2 0 0 0 0 0\nctxt 99\n";
  }
  EXPECT_FALSE(procs_running(root).has_value());
  std::remove((root + "/stat").c_str());
  rmdir(dir);
}

}  // namespace
}  // namespace spindle::procfs
