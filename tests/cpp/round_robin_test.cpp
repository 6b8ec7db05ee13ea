// Round-robin (stream) mode: each worker produces its own stream of batches.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <spindle/error.hpp>
#include <spindle/loader.hpp>

#include "test_support.hpp"

namespace {

constexpr uint32_t kCapacity = 4;

// Worker w yields w + 1 batches; sample j of its batch b holds w*100 + b*10 + j.
// Its last batch is short (j < 2), to exercise commit(item, count).
int stream_worker(spindle::WorkerContext& ctx) {
  const int w = ctx.worker_id();
  int produced = 0;
  while (auto item = ctx.claim()) {
    if (produced > w) {
      ctx.exhausted(*item);
      continue;
    }
    const uint32_t count = produced == w ? 2 : kCapacity;
    auto* out = reinterpret_cast<int32_t*>(item->out.data());
    for (uint32_t j = 0; j < count; ++j) out[j] = w * 100 + produced * 10 + static_cast<int32_t>(j);
    ctx.commit(*item, count);
    ++produced;
  }
  return 0;
}

spindle::LoaderOptions options(int workers, int prefetch) {
  spindle::LoaderOptions o;
  o.num_workers = workers;
  o.batch_capacity = kCapacity;
  o.slot_bytes = kCapacity * sizeof(int32_t);
  o.prefetch_factor = prefetch;
  o.round_robin = true;
  return o;
}

// Proves: batches come from workers in turn, skipping workers whose stream
// ended, every batch once, with its own (possibly short) sample count; the
// loader ends when every stream has ended.
TEST(RoundRobin, BatchesAlternateOverLiveWorkersUntilEveryStreamEnds) {
  for (int prefetch : {1, 2, 4}) {
    spindle::Loader loader(options(3, prefetch), spindle::BatchPlan{}, spindle::Launcher::fork(stream_worker));
    std::vector<int32_t> firsts;
    std::vector<std::size_t> counts;
    while (auto b = loader.next()) {
      firsts.push_back(*reinterpret_cast<const int32_t*>(b->data().data()));
      counts.push_back(b->indices().size());
    }
    // worker 0: 1 batch, worker 1: 2, worker 2: 3, taken in turns.
    EXPECT_EQ(firsts, (std::vector<int32_t>{0, 100, 200, 110, 210, 220})) << "prefetch " << prefetch;
    EXPECT_EQ(counts, (std::vector<std::size_t>{2, 4, 4, 2, 4, 2})) << "prefetch " << prefetch;
  }
}

// Proves: a stream loader takes no planned epoch (reset), and a loader of
// planned batches has no streams to restart (reset_streams).
TEST(RoundRobin, EachKindOfResetIsRefusedByTheOtherKindOfLoader) {
  spindle::Loader streams(options(2, 1), spindle::BatchPlan{}, spindle::Launcher::fork(stream_worker));
  EXPECT_THROW(streams.reset(spindle::BatchPlan{}), std::logic_error);
  spindle::LoaderOptions o = options(2, 1);
  o.round_robin = false;
  spindle::Loader planned(o, std::vector<std::vector<int64_t>>{{0}, {1}}, spindle::Launcher::fork(stream_worker));
  EXPECT_THROW(planned.reset_streams(), std::logic_error);
}

// A restartable stream: worker w yields `length` batches of one sample each,
// w*1000 + start + b (start: the number in its start message, 0 without one),
// and counts in sample 1 how many streams this process has started.
int restartable_worker(spindle::WorkerContext& ctx) {
  const int w = ctx.worker_id();
  int produced = 0, start = 0, streams = 1, length = 3;
  while (auto item = ctx.claim()) {
    if (item->new_stream) {
      produced = 0;
      start = 0;
      ++streams;
      const std::string message(reinterpret_cast<const char*>(item->message.data()), item->message.size());
      if (!message.empty()) {
        start = std::stoi(message);
        length = 3 + static_cast<int>(message.size() / 100000);  // a long message: one more batch
      }
    }
    if (produced == length) {
      ctx.exhausted(*item);
      continue;
    }
    auto* out = reinterpret_cast<int32_t*>(ctx.reserve(*item, 2 * sizeof(int32_t)).data());
    out[0] = w * 1000 + start + produced++;
    out[1] = streams;
    ctx.commit(*item, 1);
  }
  return 0;
}

struct Drawn {
  std::vector<int32_t> values;
  std::vector<int32_t> streams;
};

Drawn drain(spindle::Loader& loader, std::size_t most = SIZE_MAX) {
  Drawn d;
  while (d.values.size() < most) {
    auto b = loader.next();
    if (!b) break;
    const auto* v = reinterpret_cast<const int32_t*>(b->data().data());
    d.values.push_back(v[0]);
    d.streams.push_back(v[1]);
  }
  return d;
}

spindle::LoaderOptions restart_options(int workers, int prefetch) {
  spindle::LoaderOptions o = options(workers, prefetch);
  o.batch_capacity = 1;
  o.slot_bytes = 0;
  return o;
}

// Proves: reset_streams starts every worker's stream again on the same
// processes (nothing is forked, a worker's own state carries over: it counts
// its streams), epoch after epoch, after a full epoch or in the middle of one
// (the old epoch's batches are discarded), with batch 0 asked of first_worker.
TEST(RoundRobin, ResetStreamsRestartsEveryStreamOnTheSameWorkers) {
  for (int prefetch : {1, 3}) {
    spindle::Loader loader(restart_options(2, prefetch), spindle::BatchPlan{}, spindle::Launcher::fork(restartable_worker));
    const auto pids = loader.worker_pids();
    const std::vector<int32_t> epoch{0, 1000, 1, 1001, 2, 1002};
    Drawn first = drain(loader);
    EXPECT_EQ(first.values, epoch) << "prefetch " << prefetch;
    EXPECT_EQ(first.streams, std::vector<int32_t>(6, 1));
    loader.reset_streams();
    Drawn second = drain(loader);
    EXPECT_EQ(second.values, epoch);
    EXPECT_EQ(second.streams, std::vector<int32_t>(6, 2));
    loader.reset_streams();
    Drawn partial = drain(loader, 3);  // stop in the middle, with more in flight
    EXPECT_EQ(partial.values, (std::vector<int32_t>{0, 1000, 1}));
    loader.reset_streams(/*first_worker=*/1);
    Drawn resumed = drain(loader);
    EXPECT_EQ(resumed.values, (std::vector<int32_t>{1000, 0, 1001, 1, 1002, 2}));
    EXPECT_EQ(resumed.streams, std::vector<int32_t>(6, 4));
    EXPECT_EQ(loader.worker_pids(), pids) << "the same processes throughout";
    EXPECT_EQ(loader.copied_out(), 0);
  }
}

// Proves: each worker's start message reaches that worker with its first item
// of the new stream, also a message larger than the slot's first 64 KiB (the
// consumer grows the slot first); bad arguments are refused before anything
// changes, and the loader goes on.
TEST(RoundRobin, ResetStreamsHandsEachWorkerItsStartMessage) {
  spindle::LoaderOptions o = restart_options(2, 2);
  o.max_batch_bytes = 1 << 20;
  spindle::Loader loader(o, spindle::BatchPlan{}, spindle::Launcher::fork(restartable_worker));
  drain(loader, 1);
  std::string big = "20";
  big.resize(150000, ' ');  // stoi stops at the first space; 150 kB: one more batch
  loader.reset_streams(0, {"10", big});
  Drawn d = drain(loader);
  EXPECT_EQ(d.values, (std::vector<int32_t>{10, 1020, 11, 1021, 12, 1022, 1023}));
  EXPECT_THROW(loader.reset_streams(2), std::invalid_argument);
  EXPECT_THROW(loader.reset_streams(0, {"1"}), std::invalid_argument);
  EXPECT_THROW(loader.reset_streams(0, {std::string((1 << 20) + 1, 'x'), "1"}), std::invalid_argument);
  loader.reset_streams(0, {"", "5"});
  EXPECT_EQ(drain(loader).values, (std::vector<int32_t>{0, 1005, 1, 1006, 2, 1007}));
  loader.close();
  EXPECT_THROW(loader.reset_streams(), std::logic_error);
}

// Proves: a restart takes back the items no worker has claimed instead of
// having them produced and thrown away: with one slow worker and 4 items in
// flight, only the item being filled is finished before the new stream.
TEST(RoundRobin, ResetStreamsTakesBackUnclaimedItems) {
  spindle::testing::SharedMapping produced(sizeof(std::atomic<int32_t>));
  auto* count = new (produced.data()) std::atomic<int32_t>(0);
  auto slow = [count](spindle::WorkerContext& ctx) {
    while (auto item = ctx.claim()) {
      if (!item->new_stream) usleep(100000);  // the old epoch is slow
      count->fetch_add(1);
      auto* out = reinterpret_cast<int32_t*>(ctx.reserve(*item, sizeof(int32_t)).data());
      *out = item->new_stream ? -1 : 0;
      ctx.commit(*item, 1);
    }
    return 0;
  };
  spindle::Loader loader(restart_options(1, 4), spindle::BatchPlan{}, spindle::Launcher::fork(slow));
  ASSERT_TRUE(loader.next());
  loader.reset_streams();
  const int32_t before = count->load();
  auto b = loader.next();
  ASSERT_TRUE(b);
  EXPECT_EQ(*reinterpret_cast<const int32_t*>(b->data().data()), -1) << "the new stream's first item";
  EXPECT_LE(before, 3) << "items of the old epoch were produced after the restart was asked";
  loader.close();
}

// Proves: the loader records how each worker ended: nothing while they run, an
// exit code of 0 for workers that stopped at close(), the signal for one that
// was killed; the record outlives close().
TEST(RoundRobin, WorkerExitsAreRecordedWhenWorkersAreReaped) {
  spindle::Loader loader(restart_options(2, 1), spindle::BatchPlan{}, spindle::Launcher::fork(restartable_worker));
  drain(loader, 1);
  const auto running = loader.worker_exits();
  ASSERT_EQ(running.size(), 2u);
  EXPECT_FALSE(running[0] || running[1]);
  loader.close();
  const auto done = loader.worker_exits();
  ASSERT_EQ(done.size(), 2u);
  for (const auto& e : done) {
    ASSERT_TRUE(e);
    EXPECT_FALSE(e->signaled);
    EXPECT_EQ(e->code, 0);
  }
  spindle::Loader killed(restart_options(2, 1), spindle::BatchPlan{}, spindle::Launcher::fork(restartable_worker));
  const pid_t victim = killed.worker_pids()[1];
  kill(victim, SIGKILL);
  EXPECT_THROW(drain(killed), spindle::WorkerDiedError);
  const auto after = killed.worker_exits();
  ASSERT_TRUE(after[1]);
  EXPECT_TRUE(after[1]->signaled);
  EXPECT_EQ(after[1]->code, SIGKILL);
  EXPECT_EQ(after[1]->pid, victim);
}

// Proves: with assign_in_turn, planned batch k is produced by worker k mod N
// (torch's assignment), whatever the workers' speeds.
TEST(RoundRobin, AssignInTurnSendsBatchKToWorkerKModN) {
  spindle::LoaderOptions o;
  o.num_workers = 3;
  o.batch_capacity = 2;
  o.slot_bytes = 2 * sizeof(int32_t);
  o.assign_in_turn = true;
  std::vector<std::vector<int64_t>> plan;
  for (int64_t b = 0; b < 20; ++b) plan.push_back({2 * b, 2 * b + 1});
  auto who = [](spindle::WorkerContext& ctx) {
    while (auto item = ctx.claim()) {
      if (ctx.worker_id() == 0) usleep(2000);  // a slow worker must not lose its turn
      *reinterpret_cast<int32_t*>(item->out.data()) = ctx.worker_id();
      ctx.commit(*item);
    }
    return 0;
  };
  spindle::Loader loader(o, plan, spindle::Launcher::fork(who));
  int64_t k = 0;
  while (auto b = loader.next()) {
    EXPECT_EQ(*reinterpret_cast<const int32_t*>(b->data().data()), k % 3) << "batch " << k;
    ++k;
  }
  EXPECT_EQ(k, 20);
}

// Proves: worker_exits() and worker_pids() may be read from another thread
// (a watchdog, a Process-like view) while the iterating thread delivers,
// restarts streams and closes the loader (run under ThreadSanitizer).
TEST(RoundRobinConcurrency, WorkerExitsAreReadableFromAnotherThreadWhileTheLoaderRunsAndCloses) {
  spindle::Loader loader(restart_options(2, 2), spindle::BatchPlan{}, spindle::Launcher::fork(restartable_worker));
  std::atomic<bool> stop{false};
  std::atomic<bool> reading{false};
  std::size_t reads = 0;
  std::thread reader([&] {
    do {
      reads += loader.worker_exits().size() + loader.worker_pids().size();
      reading = true;
    } while (!stop.load());
  });
  // The reader is running before the loader delivers (on a loaded machine it
  // could otherwise first be scheduled after close()).
  while (!reading.load()) std::this_thread::yield();
  for (int epoch = 0; epoch < 3; ++epoch) {
    EXPECT_EQ(drain(loader).values.size(), 6u);
    loader.reset_streams();
  }
  loader.close();
  const auto exits = loader.worker_exits();
  stop = true;
  reader.join();
  EXPECT_GT(reads, 0u);
  for (const auto& e : exits) EXPECT_TRUE(e && !e->signaled && e->code == 0);
}

}  // namespace

namespace {

// This process budgets alone while it lives: the fake budget below is not
// shared with the leases other loaders of the real uid hold on this machine.
class LedgerOff {
 public:
  LedgerOff() { setenv("SPINDLE_LEDGER", "off", 1); }
  ~LedgerOff() { unsetenv("SPINDLE_LEDGER"); }
};

// A budget of about `workers` processes for this loader beside the consumer's
// reserve (what this process's other loaders hold may take some): no uid or
// cgroup limit from the machine (a uid with no tasks, no cgroup), one CPU (no
// arena threads).
spindle::LoaderOptions short_budget(spindle::LoaderOptions o, int workers) {
  o.budget_sources.uid = 4242424;
  o.budget_sources.nproc_limit = workers + o.reserve_tasks;
  o.budget_sources.nproc_exempt = false;
  o.budget_sources.cgroup_root = "/nonexistent";
  o.budget_sources.cpus = 1;
  o.budget_policy = spindle::BudgetPolicy::kShrink;
  o.logical_workers = true;
  return o;
}

// Logical worker l (WorkItem::stream) yields l + 1 batches, as stream_worker's
// worker l does; a process keeps a count per logical worker it serves, and
// writes into the second half of each sample which process it is.
int logical_stream_worker(spindle::WorkerContext& ctx) {
  std::vector<int> produced(static_cast<std::size_t>(ctx.logical_workers()), 0);
  while (auto item = ctx.claim()) {
    const int l = item->stream;
    if (l < 0 || l % ctx.num_workers() != ctx.worker_id()) {
      ctx.fail(*item, "item for logical worker " + std::to_string(l) + " reached process " +
                          std::to_string(ctx.worker_id()));
      continue;
    }
    int& done = produced[static_cast<std::size_t>(l)];
    if (done > l) {
      ctx.exhausted(*item);
      continue;
    }
    const uint32_t count = done == l ? 2 : kCapacity;
    auto* out = reinterpret_cast<int32_t*>(item->out.data());
    for (uint32_t j = 0; j < count; ++j) out[j] = l * 100 + done * 10 + static_cast<int32_t>(j);
    ctx.commit(*item, count);
    ++done;
  }
  return 0;
}

std::vector<int32_t> firsts_of(spindle::Loader& loader, std::size_t limit = SIZE_MAX) {
  std::vector<int32_t> firsts;
  while (firsts.size() < limit) {
    auto b = loader.next();
    if (!b) break;
    firsts.push_back(*reinterpret_cast<const int32_t*>(b->data().data()));
  }
  return firsts;
}

}  // namespace

// Proves: with logical_workers, 8 streams asked under a budget of ~3 processes
// stay 8 streams (logical l on process l mod P, each item naming its logical
// worker), taken in the same turn, skipping ended streams, as 8 processes give
// them; the budget note says "8 logical workers on P processes".
TEST(LogicalWorkers, EightStreamsOnFewerProcessesGiveTheBatchesOfEightWorkers) {
  for (int prefetch : {1, 3}) {
    spindle::Loader full(options(8, prefetch), spindle::BatchPlan{}, spindle::Launcher::fork(logical_stream_worker));
    ASSERT_EQ(full.plan().num_workers, 8);
    const std::vector<int32_t> expected = firsts_of(full);
    ASSERT_EQ(expected.size(), 36u);  // 1 + 2 + ... + 8
    LedgerOff alone;
    spindle::Loader shrunk(short_budget(options(8, prefetch), 3), spindle::BatchPlan{},
                           spindle::Launcher::fork(logical_stream_worker));
    const int processes = shrunk.plan().num_workers;
    ASSERT_TRUE(processes >= 1 && processes < 8) << shrunk.budget_note();
    EXPECT_EQ(shrunk.num_logical_workers(), 8);
    EXPECT_NE(shrunk.budget_note().find("8 logical workers on " + std::to_string(processes) + " processes"),
              std::string::npos)
        << shrunk.budget_note();
    EXPECT_EQ(firsts_of(shrunk), expected) << "prefetch " << prefetch;
  }
}

// Proves: reset_streams counts logical workers: first_worker and the start
// messages name logical workers 0..7 on fewer processes, and a stream restarted
// in the middle of an epoch resumes at the logical worker asked.
TEST(LogicalWorkers, ResetStreamsNamesLogicalWorkers) {
  LedgerOff alone;
  spindle::Loader loader(short_budget(options(8, 2), 3), spindle::BatchPlan{},
                         spindle::Launcher::fork(logical_stream_worker));
  ASSERT_LT(loader.plan().num_workers, 8);
  firsts_of(loader, 5);
  EXPECT_THROW(loader.reset_streams(8), std::invalid_argument);
  EXPECT_THROW(loader.reset_streams(0, std::vector<std::string>(loader.plan().num_workers)), std::invalid_argument);
  loader.reset_streams(6, std::vector<std::string>(8));
  // The worker keeps its counts (no restart hook): logical 0..4 ended or moved
  // on; the turn starts at logical 6.
  const std::vector<int32_t> rest = firsts_of(loader, 2);
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(rest[0] / 100, 6);
  EXPECT_EQ(rest[1] / 100, 7);
}

// Proves: with assign_in_turn and logical_workers, planned batch k is produced
// for logical worker k mod 8 (WorkItem::stream) by process (k mod 8) mod P
// under a budget of P < 8 processes.
TEST(LogicalWorkers, AssignInTurnSendsBatchKToLogicalWorkerKMod8OnItsProcess) {
  spindle::LoaderOptions o;
  o.num_workers = 8;
  o.batch_capacity = 2;
  o.slot_bytes = 2 * sizeof(int32_t);
  o.assign_in_turn = true;
  std::vector<std::vector<int64_t>> plan;
  for (int64_t b = 0; b < 40; ++b) plan.push_back({2 * b, 2 * b + 1});
  LedgerOff alone;
  auto who = [](spindle::WorkerContext& ctx) {
    while (auto item = ctx.claim()) {
      auto* out = reinterpret_cast<int32_t*>(item->out.data());
      out[0] = item->stream;
      out[1] = ctx.worker_id();
      ctx.commit(*item);
    }
    return 0;
  };
  spindle::Loader loader(short_budget(o, 3), plan, spindle::Launcher::fork(who));
  const int processes = loader.plan().num_workers;
  ASSERT_LT(processes, 8);
  int64_t k = 0;
  while (auto b = loader.next()) {
    const auto* out = reinterpret_cast<const int32_t*>(b->data().data());
    EXPECT_EQ(out[0], k % 8) << "batch " << k;
    EXPECT_EQ(out[1], (k % 8) % processes) << "batch " << k;
    ++k;
  }
  EXPECT_EQ(k, 40);
}
