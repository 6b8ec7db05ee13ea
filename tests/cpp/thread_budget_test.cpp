// ThreadBudget: the task budget computed from fake /proc and cgroup trees
// (RLIMIT_NPROC headroom from per-uid thread counts, cgroup v1/v2 pids.max,
// the user's cap) and the plan cut from it.
#include <spindle/error.hpp>
#include <spindle/thread_budget.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "test_support.hpp"

namespace spindle {
namespace {

using spindle::testing::TempDir;
using spindle::testing::write_file;

constexpr uint32_t kUid = 1000;

// A fake /proc and /sys/fs/cgroup under one temp dir.
class FakeSystem : public ::testing::Test {
 protected:
  std::string proc() const { return (dir_.path() / "proc").string(); }
  std::string cgroup() const { return (dir_.path() / "cgroup").string(); }
  const std::filesystem::path& dir_path() const { return dir_.path(); }

  // /proc/<pid>/status with the real and effective uid and a thread count.
  void add_process(const std::string& pid, uint32_t real_uid, uint32_t eff_uid, int threads) {
    write_file(dir_.path() / "proc" / pid / "status",
               "Name:\tfake\nState:\tS (sleeping)\nUid:\t" + std::to_string(real_uid) + "\t" +
                   std::to_string(eff_uid) + "\t" + std::to_string(eff_uid) + "\t" + std::to_string(eff_uid) +
                   "\nGid:\t0\t0\t0\t0\nThreads:\t" + std::to_string(threads) + "\nVmRSS:\t100 kB\n");
  }
  void set_self_cgroup(const std::string& text) { write_file(dir_.path() / "proc" / "self" / "cgroup", text); }
  // pids.max / pids.current of the cgroup directory `rel` (below the cgroup root).
  void set_pids(const std::string& rel, const std::string& max, const std::string& current) {
    write_file(dir_.path() / "cgroup" / rel / "pids.max", max + "\n");
    write_file(dir_.path() / "cgroup" / rel / "pids.current", current + "\n");
  }
  // Sources that read only the fake tree: uid 1000, not exempt, 8 CPUs.
  BudgetSources sources(std::optional<int64_t> nproc_limit = kUnlimited) const {
    BudgetSources s;
    s.proc_root = proc();
    s.cgroup_root = cgroup();
    s.uid = kUid;
    s.nproc_limit = nproc_limit;
    s.nproc_exempt = false;
    s.cpus = 8;
    return s;
  }

 private:
  TempDir dir_;
};

// Proves: tasks are summed over processes whose REAL uid matches; non-pid entries are skipped.
TEST_F(FakeSystem, CountsThreadsOnlyOfProcessesWithMatchingRealUid) {
  add_process("100", kUid, kUid, 5);
  add_process("101", kUid, kUid, 3);
  add_process("102", 0, kUid, 7);       // setuid to us, but the real uid is root: not ours
  add_process("103", kUid, 0, 2);       // real uid is ours: counts against our RLIMIT_NPROC
  add_process("104", 1001, 1001, 11);   // another user
  add_process("self", kUid, kUid, 50);  // not a pid directory
  write_file(dir_path() / "proc" / "105" / "cmdline", "no status file: exited meanwhile");
  EXPECT_EQ(count_uid_tasks(proc(), kUid), 5 + 3 + 2);
  EXPECT_EQ(count_uid_tasks(proc(), 1001), 11);
  EXPECT_EQ(count_uid_tasks(proc(), 4242), 0);
  EXPECT_EQ(ThreadBudget(sources()).uid_tasks(), 10);
}

// Proves: RLIMIT_NPROC headroom is the limit minus our tasks, never below zero.
TEST_F(FakeSystem, NprocHeadroomIsLimitMinusUidTasks) {
  add_process("1", kUid, kUid, 12);
  ThreadBudget b(sources(50));
  EXPECT_EQ(b.nproc_limit(), 50);
  EXPECT_FALSE(b.nproc_exempt());
  EXPECT_EQ(b.nproc_headroom(), 38);
  EXPECT_EQ(b.budget(), 38);
  EXPECT_EQ(b.cgroup_headroom(), kUnlimited) << "no /proc/self/cgroup: no cgroup limit";

  EXPECT_EQ(ThreadBudget(sources(5)).nproc_headroom(), 0) << "over the limit already";
  EXPECT_EQ(ThreadBudget(sources(kUnlimited)).nproc_headroom(), kUnlimited);
}

// Proves: an exempt uid has no RLIMIT_NPROC bound, and uid 0 is exempt by default.
TEST_F(FakeSystem, NprocExemptUidHasUnlimitedHeadroom) {
  add_process("1", kUid, kUid, 12);
  add_process("2", 0, 0, 40);
  BudgetSources s = sources(10);
  s.nproc_exempt = true;
  EXPECT_EQ(ThreadBudget(s).nproc_headroom(), kUnlimited);
  EXPECT_EQ(ThreadBudget(s).budget(), kUnlimited);

  s.uid = 0;
  s.nproc_exempt.reset();  // default: exempt because uid == 0
  ThreadBudget root(s);
  EXPECT_TRUE(root.nproc_exempt());
  EXPECT_EQ(root.uid_tasks(), 40);
  EXPECT_EQ(root.nproc_headroom(), kUnlimited);

  s.uid = kUid;
  EXPECT_FALSE(ThreadBudget(s).nproc_exempt()) << "a non-root uid is not exempt by default";
}

// Proves: cgroup v2 levels up to and including the root are read; here the root's limit binds.
TEST_F(FakeSystem, CgroupV2LevelsUpToTheRootAreAllConsulted) {
  set_self_cgroup("0::/a/b/c\n");
  set_pids("a/b/c", "max", "3");  // "max": no limit at this level
  set_pids("a/b", "100", "40");   // headroom 60
  set_pids("a", "50", "45");      // headroom 5
  set_pids("", "20", "19");       // headroom 1: binds
  ThreadBudget b(sources());
  EXPECT_EQ(b.cgroup_limit(), 20);
  EXPECT_EQ(b.cgroup_current(), 19);
  EXPECT_EQ(b.cgroup_headroom(), 1);
  EXPECT_EQ(b.cgroup_path(), cgroup());
  EXPECT_EQ(b.budget(), 1);
}

// Proves: our own cgroup binds when it is the tightest, and its path is reported.
TEST_F(FakeSystem, CgroupV2LeafBindsWhenTightest) {
  set_self_cgroup("0::/a/b\n");
  set_pids("a/b", "10", "7");   // headroom 3: binds
  set_pids("a", "1000", "500");
  ThreadBudget b(sources(100));
  EXPECT_EQ(b.cgroup_limit(), 10);
  EXPECT_EQ(b.cgroup_current(), 7);
  EXPECT_EQ(b.cgroup_headroom(), 3);
  EXPECT_EQ(b.cgroup_path(), cgroup() + "/a/b");
  EXPECT_EQ(b.budget(), 3);
}

// Proves: a middle ancestor tighter than its child and parent binds, and is named.
TEST_F(FakeSystem, CgroupV2MiddleAncestorBinds) {
  set_self_cgroup("0::/a/b/c\n");
  set_pids("a/b/c", "max", "3");
  set_pids("a/b", "100", "40");
  set_pids("a", "50", "45");
  ThreadBudget b(sources(1000));
  EXPECT_EQ(b.cgroup_headroom(), 5);
  EXPECT_EQ(b.cgroup_limit(), 50);
  EXPECT_EQ(b.cgroup_path(), cgroup() + "/a");
  EXPECT_EQ(b.budget(), 5);
}

// Proves: "max" at every level means no cgroup limit; a cgroup over its limit has zero headroom.
TEST_F(FakeSystem, CgroupV2MaxMeansUnlimitedAndOverLimitMeansZero) {
  set_self_cgroup("0::/a/b\n");
  set_pids("a/b", "max", "3");
  set_pids("a", "max", "9");
  ThreadBudget unlimited(sources(30));
  EXPECT_EQ(unlimited.cgroup_limit(), kUnlimited);
  EXPECT_EQ(unlimited.cgroup_headroom(), kUnlimited);
  EXPECT_EQ(unlimited.budget(), 30);

  set_pids("a", "8", "9");
  EXPECT_EQ(ThreadBudget(sources(30)).cgroup_headroom(), 0);
  EXPECT_EQ(ThreadBudget(sources(30)).budget(), 0);
}

// Proves: cgroup v1 reads <root>/pids/<path>, which wins over the v2 line of a hybrid system.
TEST_F(FakeSystem, CgroupV1PidsControllerIsRead) {
  set_self_cgroup("12:cpu,cpuacct:/x\n5:pids:/x/y\n1:name=systemd:/x\n0::/v2\n");
  set_pids("pids/x/y", "20", "12");  // headroom 8
  set_pids("pids/x", "max", "12");
  set_pids("v2", "3", "0");          // the v2 tree has no pids controller here
  ThreadBudget b(sources());
  EXPECT_EQ(b.cgroup_limit(), 20);
  EXPECT_EQ(b.cgroup_headroom(), 8);
  EXPECT_EQ(b.cgroup_path(), cgroup() + "/pids/x/y");
  EXPECT_EQ(b.budget(), 8);
}

// Proves: the user's cap binds when smallest, and a negative cap is refused.
TEST_F(FakeSystem, UserCapBindsWhenSmallest) {
  add_process("1", kUid, kUid, 10);
  set_self_cgroup("0::/a\n");
  set_pids("a", "100", "50");
  BudgetSources s = sources(40);  // nproc headroom 30, cgroup headroom 50
  EXPECT_EQ(ThreadBudget(s).budget(), 30);
  s.user_cap = 4;
  EXPECT_EQ(ThreadBudget(s).user_cap(), 4);
  EXPECT_EQ(ThreadBudget(s).budget(), 4);
  s.user_cap = 1000;
  EXPECT_EQ(ThreadBudget(s).budget(), 30);
  s.user_cap = -1;
  EXPECT_THROW(ThreadBudget{s}, std::invalid_argument);
}

struct PlanCase {
  int64_t budget;  // kUnlimited: exempt uid, no cgroup
  int workers;
  int cpus;
  int arena_threads;  // expected: clamp(budget - workers - kReserve, 0, cpus - 1)
};

class ThreadPlanArithmetic : public FakeSystem, public ::testing::WithParamInterface<PlanCase> {};

// Proves: arena_threads = clamp(budget - workers - kReserve, 0, cpus - 1), and
// the plan carries cpus - 1 as the limit of the process's whole arena.
TEST_P(ThreadPlanArithmetic, ArenaGetsBudgetLeftAfterWorkersAndReserve) {
  const PlanCase c = GetParam();
  BudgetSources s = sources(c.budget);
  s.cpus = c.cpus;
  if (c.budget == kUnlimited) s.nproc_exempt = true;
  const ThreadPlan p = ThreadBudget(s).plan(c.workers);
  EXPECT_EQ(p.num_workers, c.workers);
  EXPECT_EQ(p.budget, c.budget);
  EXPECT_EQ(p.arena_threads, c.arena_threads);
  EXPECT_EQ(p.arena_limit, c.cpus - 1);
  if (c.budget != kUnlimited) {
    EXPECT_EQ(p.arena_threads,
              std::clamp<int64_t>(c.budget - c.workers - ThreadBudget::kReserve, 0, c.cpus - 1));
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, ThreadPlanArithmetic,
                         ::testing::Values(PlanCase{100, 4, 8, 7},        // CPUs bind
                                           PlanCase{10, 4, 8, 4},         // budget binds
                                           PlanCase{7, 4, 8, 1},          //
                                           PlanCase{6, 4, 8, 0},          // only the reserve left
                                           PlanCase{5, 4, 8, 0},          // less than the reserve
                                           PlanCase{4, 4, 8, 0},          // workers use it all
                                           PlanCase{0, 0, 8, 0},          //
                                           PlanCase{100, 0, 1, 0},        // one CPU: caller only
                                           PlanCase{kUnlimited, 4, 8, 7},  // unlimited budget
                                           PlanCase{kUnlimited, 64, 2, 1}));

// Proves: arena threads the process's live loaders hold already come off the
// limit (cpus - 1), never below 0, whatever the budget leaves.
TEST_F(FakeSystem, PlanKeepsTheArenaWithinOneLimitForTheProcess) {
  const ThreadBudget b(sources(100));
  EXPECT_EQ(b.plan(4, 0, 0).arena_threads, 7);
  EXPECT_EQ(b.plan(4, 0, 5).arena_threads, 2);
  EXPECT_EQ(b.plan(4, 0, 7).arena_threads, 0);
  EXPECT_EQ(b.plan(4, 0, 9).arena_threads, 0);
  EXPECT_EQ(b.plan(4, 92, 5).arena_threads, 2) << "the budget (4 left after the workers) binds first: 2";
  EXPECT_EQ(b.plan(4, 93, 5).arena_threads, 1);
  EXPECT_THROW((void)b.plan(4, 0, -1), std::invalid_argument);
}

// Proves: too many workers give a ThreadBudgetError with the numbers and the binding limit.
TEST_F(FakeSystem, PlanThrowsWithTheNumbersWhenWorkersExceedBudget) {
  add_process("1", kUid, kUid, 10);
  auto message = [](const ThreadBudget& b, int workers) -> std::string {
    try {
      (void)b.plan(workers);
    } catch (const ThreadBudgetError& e) {
      return e.what();
    }
    return "<no ThreadBudgetError>";
  };

  const std::string nproc = message(ThreadBudget(sources(13)), 5);  // headroom 3
  EXPECT_NE(nproc.find("5 workers"), std::string::npos) << nproc;
  EXPECT_NE(nproc.find("budget of 3 tasks"), std::string::npos) << nproc;
  EXPECT_NE(nproc.find("RLIMIT_NPROC"), std::string::npos) << nproc;
  EXPECT_NE(nproc.find("soft=13"), std::string::npos) << nproc;
  EXPECT_NE(nproc.find("tasks of this uid=10"), std::string::npos) << nproc;
  EXPECT_NE(nproc.find("at most 3 workers"), std::string::npos) << nproc;

  set_self_cgroup("0::/job\n");
  set_pids("job", "16", "14");  // headroom 2
  const std::string cg = message(ThreadBudget(sources(1000)), 4);
  EXPECT_NE(cg.find("4 workers"), std::string::npos) << cg;
  EXPECT_NE(cg.find("budget of 2 tasks"), std::string::npos) << cg;
  EXPECT_NE(cg.find("pids.max"), std::string::npos) << cg;
  EXPECT_NE(cg.find(cgroup() + "/job"), std::string::npos) << cg;
  EXPECT_NE(cg.find("pids.max=16 current=14"), std::string::npos) << cg;

  BudgetSources capped = sources(1000);
  capped.user_cap = 1;
  const std::string cap = message(ThreadBudget(capped), 2);
  EXPECT_NE(cap.find("2 workers"), std::string::npos) << cap;
  EXPECT_NE(cap.find("budget of 1 tasks"), std::string::npos) << cap;
  EXPECT_NE(cap.find("max_threads"), std::string::npos) << cap;

  EXPECT_NO_THROW((void)ThreadBudget(capped).plan(1)) << "exactly the budget fits";
  EXPECT_THROW((void)ThreadBudget(capped).plan(-1), std::invalid_argument);
}

// Proves: count_process_threads counts /proc/<pid>/task entries, fake and live.
TEST_F(FakeSystem, CountsThreadsOfOneProcess) {
  for (const char* tid : {"77", "78", "79"}) write_file(dir_path() / "proc" / "77" / "task" / tid / "stat", "x");
  EXPECT_EQ(count_process_threads(77, proc()), 3);
  EXPECT_EQ(count_process_threads(78, proc()), 0) << "no such process";

  const int before = count_process_threads(getpid());
  ASSERT_GE(before, 1);
  std::atomic<bool> stop{false};
  std::atomic<bool> started{false};
  std::thread extra([&] {
    started = true;
    while (!stop) std::this_thread::yield();
  });
  while (!started) std::this_thread::yield();
  EXPECT_EQ(count_process_threads(getpid()), before + 1);
  stop = true;
  extra.join();
}

}  // namespace
}  // namespace spindle
