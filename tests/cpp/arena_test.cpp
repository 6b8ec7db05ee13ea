// The process's one TBB arena: leases add up and give their share back, the
// TBB cap is installed even for 0 extra threads, two loaders keep what they
// were granted within one cpus - 1, close() gives the shares back, threads-mode
// workers are their loader's share, a running call survives a resize, and
// reading the size does not race with leasing.
#include <spindle/detail/arena.hpp>
#include <spindle/budget_ledger.hpp>
#include <spindle/loader.hpp>
#include <spindle/thread_budget.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>

#include <oneapi/tbb/global_control.h>

#include <gtest/gtest.h>

#include "test_support.hpp"

namespace spindle {
using detail::ArenaLease;
using detail::Arena;
namespace {

using namespace std::chrono_literals;

static_assert(!std::is_copy_constructible_v<ArenaLease> && !std::is_copy_assignable_v<ArenaLease>,
              "a lease is one share: copying it would give the share back twice");
static_assert(std::is_nothrow_move_constructible_v<ArenaLease> && std::is_nothrow_move_assignable_v<ArenaLease>);

std::size_t tbb_cap() {
  return tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism);
}

std::vector<std::vector<int64_t>> batches(int64_t n) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t i = 0; i < n; ++i) out.push_back({i});
  return out;
}

// A loader whose plan is fixed by the numbers given, not by this machine: no
// uid or cgroup limit (the fake /proc holds neither), `cpus` CPUs, and
// max_threads chosen so that the arena gets `arena_threads`.
LoaderOptions options_for(const testing::TempDir& fake_proc, int cpus, int arena_threads) {
  LoaderOptions o;
  o.num_workers = 1;
  o.batch_capacity = 1;
  o.slot_bytes = 64;
  o.budget_sources.proc_root = fake_proc.path().string();
  o.budget_sources.cgroup_root = fake_proc.path().string();
  o.budget_sources.nproc_exempt = true;
  o.budget_sources.cpus = cpus;
  o.max_threads = o.num_workers + ThreadBudget::kReserve + arena_threads;
  return o;
}

WorkerMain zeros() {
  return sample_worker([](int64_t, std::span<std::byte> out) { std::memset(out.data(), 0, out.size()); }, 64);
}

// Proves: a loader granted 0 extra threads still caps TBB in the whole process
// at 1 thread while it lives, and the cap goes when the loader does.
TEST(ArenaCap, LoaderWithZeroExtraThreadsCapsTbbAtOne) {
  const std::size_t uncapped = tbb_cap();
  testing::TempDir fake_proc;
  {
    Loader loader(options_for(fake_proc, 4, 0), batches(4), Launcher::fork(zeros()));
    ASSERT_EQ(loader.plan().arena_threads, 0);
    EXPECT_EQ(Arena::global().extra_threads(), 0);
    EXPECT_EQ(tbb_cap(), 1u);
    while (loader.next()) {
    }
  }
  EXPECT_EQ(tbb_cap(), uncapped);
}

// Proves: the arena runs the sum of the live leases, the TBB cap follows it,
// and dropping a lease shrinks both again.
TEST(ArenaLeases, LeasesAddUpAndShrinkWhenDropped) {
  const std::size_t uncapped = tbb_cap();
  ArenaLease a = Arena::global().lease(1);
  ArenaLease b = Arena::global().lease(2);
  EXPECT_EQ(Arena::global().extra_threads(), 3);
  EXPECT_EQ(tbb_cap(), 4u);
  a.reset();
  EXPECT_EQ(Arena::global().extra_threads(), 2);
  EXPECT_EQ(tbb_cap(), 3u);
  ArenaLease none = Arena::global().lease(0);
  b.reset();
  EXPECT_EQ(Arena::global().extra_threads(), 0);
  EXPECT_EQ(tbb_cap(), 1u) << "a lease of 0 extra threads still caps TBB at the calling thread";
  none.reset();
  EXPECT_EQ(tbb_cap(), uncapped);
}

// Proves: a negative request counts as 0 extra threads.
TEST(ArenaLeases, NegativeRequestCountsAsZero) {
  ArenaLease a = Arena::global().lease(2);
  ArenaLease negative = Arena::global().lease(-5);
  EXPECT_EQ(negative.extra_threads(), 0);
  EXPECT_EQ(Arena::global().extra_threads(), 2);
}

// Proves: moving a lease moves the share; the moved-from lease gives nothing back.
TEST(ArenaLeases, MovingALeaseMovesTheShare) {
  ArenaLease a = Arena::global().lease(2);
  ArenaLease b = std::move(a);
  EXPECT_FALSE(a.held());
  a.reset();
  EXPECT_EQ(Arena::global().extra_threads(), 2);
  ArenaLease c;
  c = std::move(b);
  EXPECT_EQ(Arena::global().extra_threads(), 2);
  c.reset();
  EXPECT_EQ(Arena::global().extra_threads(), 0);
}

// Proves: two loaders in one process (train and eval) each keep the threads
// they were granted while both live; a third is granted only what is left of
// cpus - 1 for the whole process (the arena never runs more copy-out threads
// than one loader could), and the arena shrinks back when they go.
TEST(ArenaLeases, TwoLoadersEachKeepWhatTheyWereGrantedWithinOneLimit) {
  testing::TempDir fake_proc;
  Loader train(options_for(fake_proc, 8, 2), batches(4), Launcher::fork(zeros()));
  {
    Loader eval(options_for(fake_proc, 8, 3), batches(4), Launcher::fork(zeros()));
    EXPECT_EQ(train.plan().arena_threads, 2);
    EXPECT_EQ(eval.plan().arena_threads, 3);
    EXPECT_EQ(Arena::global().extra_threads(), 5) << "the last loader built must not resize the other's share";
    EXPECT_EQ(tbb_cap(), 6u);
    Loader third(options_for(fake_proc, 8, 7), batches(4), Launcher::fork(zeros()));
    EXPECT_EQ(third.plan().arena_threads, 2) << "its budget allows 7, but 5 of cpus - 1 = 7 are held";
    EXPECT_EQ(Arena::global().extra_threads(), 7);
    EXPECT_EQ(BudgetLedger::global().local_arena_threads(), 7) << "the ledger holds what the arena runs";
    Loader fourth(options_for(fake_proc, 8, 7), batches(4), Launcher::fork(zeros()));
    EXPECT_EQ(fourth.plan().arena_threads, 0);
    EXPECT_EQ(Arena::global().extra_threads(), 7);
  }
  EXPECT_EQ(Arena::global().extra_threads(), 2);
  EXPECT_EQ(tbb_cap(), 3u);
}

// Proves: close() gives the loader's arena share and its ledger lease back at
// once, while the Loader object still lives (and its delivered batch stays
// valid).
TEST(ArenaLeases, CloseGivesTheLeasesBackAtOnce) {
  const std::size_t uncapped = tbb_cap();
  testing::TempDir fake_proc;
  Loader loader(options_for(fake_proc, 4, 2), batches(4), Launcher::fork(zeros()));
  ASSERT_EQ(Arena::global().extra_threads(), 2);
  ASSERT_GT(BudgetLedger::global().local_pending(), 0);
  auto batch = loader.next();
  ASSERT_TRUE(batch);
  loader.close();
  EXPECT_EQ(Arena::global().extra_threads(), 0);
  EXPECT_EQ(tbb_cap(), uncapped);
  EXPECT_EQ(BudgetLedger::global().local_pending(), 0);
  EXPECT_EQ(BudgetLedger::global().local_arena_threads(), 0);
  EXPECT_EQ(batch->data()[0], std::byte{0});
}

// Proves: a threads-mode loader's workers are arena threads of its own lease,
// on top of the copy-out threads of a processes-mode loader in the same
// process (no special case outside the rule: the arena is the sum of the
// live leases), both deliver every batch, and each close shrinks the arena
// by exactly its loader's share.
TEST(ArenaLeases, ThreadsModeWorkersAreTheirLoadersShare) {
  testing::TempDir fake_proc;
  Loader processes(options_for(fake_proc, 4, 2), batches(8), Launcher::fork(zeros()));
  LoaderOptions o = options_for(fake_proc, 4, 3);
  o.num_workers = 2;
  o.max_threads = 2 + ThreadBudget::kReserve + 3;
  Loader threads(o, batches(8), Launcher::threads(zeros()));
  EXPECT_EQ(threads.plan().num_workers, 2);
  EXPECT_EQ(threads.plan().arena_threads, 1) << "2 of cpus - 1 = 3 copy-out threads are held";
  EXPECT_EQ(Arena::global().extra_threads(), 2 + 1 + 2);
  int got = 0;
  while (threads.next()) ++got;
  while (processes.next()) ++got;
  EXPECT_EQ(got, 16);
  threads.close();
  EXPECT_EQ(Arena::global().extra_threads(), 2);
  processes.close();
  EXPECT_EQ(Arena::global().extra_threads(), 0);
}

// Proves: a parallel call running when the arena is resized finishes every
// chunk in the arena it started in (ASan sees no use of a destroyed arena).
TEST(ArenaLeases, RunningCallKeepsItsArenaWhenResized) {
  ArenaLease lease = Arena::global().lease(1);
  std::atomic<bool> started{false}, resized{false};
  std::atomic<std::size_t> done{0};
  std::thread call([&] {
    Arena::global().parallel_for(64, 1, [&](std::size_t b, std::size_t e) {
      if (b == 0) {
        started = true;
        (void)testing::eventually(10s, [&] { return resized.load(); });
      }
      done += e - b;
    });
  });
  ASSERT_TRUE(testing::eventually(10s, [&] { return started.load(); }));
  lease.reset();  // the arena the call runs in is dropped by its owner ...
  ArenaLease other = Arena::global().lease(0);  // ... and a different size installed
  resized = true;
  call.join();
  EXPECT_EQ(done.load(), 64u);
}

// Proves: reading the arena's size (extra_threads, parallel_for) while another
// thread takes and drops leases is free of data races (run under TSan). The
// leases are of 0 extra threads, so the size is written on every lease and
// drop but TBB never runs tasks: TSan cannot see TBB's own synchronization
// (libtbb is not instrumented) and would report races inside it.
TEST(ArenaConcurrency, SizeReadsDoNotRaceWithLeases) {
  constexpr int kRounds = 20000;
  std::atomic<bool> started{false}, done{false};
  std::thread leaser([&] {
    while (!done) {
      ArenaLease l = Arena::global().lease(0);
      started = true;
    }
  });
  while (!started) {
  }
  std::atomic<std::size_t> work{0};
  int64_t seen = 0;
  for (int i = 0; i < kRounds; ++i) {
    seen += Arena::global().extra_threads();
    Arena::global().parallel_for(4, 1, [&](std::size_t b, std::size_t e) { work += e - b; });
  }
  done = true;
  leaser.join();
  EXPECT_EQ(work.load(), 4u * kRounds);
  EXPECT_EQ(seen, 0);
}

}  // namespace
}  // namespace spindle
