// Loader end to end with sample_worker: delivery (every sample once, right
// bytes, in or out of order), kept batches, failing samples, supervision of
// dying and hanging workers, no orphaned workers, one thread per worker, and
// the thread budget checked before anything is forked.
#include <spindle/error.hpp>
#include <spindle/loader.hpp>
#include <spindle/thread_budget.hpp>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "test_support.hpp"

namespace spindle {
namespace {

using spindle::testing::SharedMapping;
using spindle::testing::spindle_shm_names;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kSampleBytes = 100;  // deliberately not a multiple of 8 or 64

std::byte sample_byte(int64_t index, std::size_t j) {
  return static_cast<std::byte>((index * 131 + (index >> 8) * 7 + static_cast<int64_t>(j) * 17) & 0xff);
}

void fill_sample(int64_t index, std::span<std::byte> out) {
  for (std::size_t j = 0; j < out.size(); ++j) out[j] = sample_byte(index, j);
}

// `n` samples in a fixed shuffled order, cut into batches of `batch` (the last
// one shorter), so that positions and sample indices differ.
std::vector<std::vector<int64_t>> make_batches(int64_t n, uint32_t batch) {
  std::vector<int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(12345));
  std::vector<std::vector<int64_t>> out;
  for (std::size_t i = 0; i < order.size(); i += batch)
    out.emplace_back(order.begin() + static_cast<std::ptrdiff_t>(i),
                     order.begin() + static_cast<std::ptrdiff_t>(std::min(order.size(), i + batch)));
  return out;
}

LoaderOptions options(int workers, uint32_t batch) {
  return testing::fixed_sample_options(workers, batch, kSampleBytes);
}

// The batch holds exactly `expected` samples, each with its own bytes.
::testing::AssertionResult batch_is_intact(const Batch& b, const std::vector<int64_t>& expected) {
  if (!std::equal(b.indices().begin(), b.indices().end(), expected.begin(), expected.end()))
    return ::testing::AssertionFailure() << "batch " << b.batch_id() << " has the wrong indices";
  if (b.data().size() < expected.size() * kSampleBytes)
    return ::testing::AssertionFailure() << "batch " << b.batch_id() << " is too short";
  for (std::size_t i = 0; i < expected.size(); ++i)
    for (std::size_t j = 0; j < kSampleBytes; ++j)
      if (b.data()[i * kSampleBytes + j] != sample_byte(expected[i], j))
        return ::testing::AssertionFailure() << "batch " << b.batch_id() << " sample " << expected[i]
                                             << " byte " << j << " is corrupt";
  return ::testing::AssertionSuccess();
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A pipe whose read end waits with a deadline; workers inherit the write end.
class Pipe {
 public:
  Pipe() {
    if (pipe(fds_) != 0) throw std::runtime_error("pipe failed");
  }
  ~Pipe() {
    close(fds_[0]);
    close(fds_[1]);
  }
  void send(pid_t pid) const { (void)!write(fds_[1], &pid, sizeof(pid)); }
  // The next pid written, or 0 if none arrives within `timeout`.
  pid_t receive(std::chrono::milliseconds timeout) const {
    pollfd p{fds_[0], POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(timeout.count())) != 1) return 0;
    pid_t pid = 0;
    return read(fds_[0], &pid, sizeof(pid)) == sizeof(pid) ? pid : 0;
  }

 private:
  int fds_[2];
};

// Where a worker notes when and as whom it killed itself (shared with the test).
struct DeathNote {
  std::atomic<int64_t> at_ns{0};  // steady_clock (CLOCK_MONOTONIC: same in every process)
  std::atomic<int32_t> pid{0};
};

// Every worker pid has been reaped by the loader.
void expect_workers_reaped(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids) {
    errno = 0;
    EXPECT_TRUE(kill(pid, 0) != 0 && errno == ESRCH) << "worker " << pid << " still exists";
  }
}

// Proves: in_order=true delivers batches by id, every sample exactly once with its own bytes.
TEST(LoaderDelivery, DeliversEverySampleOnceInOrder) {
  const auto batches = make_batches(1000, 32);  // 31 full batches and one of 8
  LoaderOptions o = options(2, 32);
  Loader loader(o, batches, Launcher::fork(sample_worker(fill_sample, kSampleBytes)));
  EXPECT_EQ(loader.num_batches(), batches.size());
  EXPECT_EQ(loader.plan().num_workers, 2);
  EXPECT_TRUE(spindle_shm_names(getpid()).empty()) << "the ring must have no name while in use";
  std::vector<int> seen(1000, 0);
  int64_t expect_id = 0;
  while (auto b = loader.next()) {
    ASSERT_EQ(b->batch_id(), expect_id) << "in_order=true must deliver by batch id";
    ASSERT_TRUE(batch_is_intact(*b, batches[static_cast<std::size_t>(expect_id)]));
    for (int64_t i : b->indices()) ++seen[static_cast<std::size_t>(i)];
    ++expect_id;
  }
  EXPECT_EQ(expect_id, static_cast<int64_t>(batches.size()));
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 1000) << "every sample exactly once";
  EXPECT_FALSE(loader.next().has_value()) << "an ended loader stays ended";
  EXPECT_EQ(loader.copied_out(), 0) << "batches released at once never need a copy";
}

// Proves: in_order=false delivers every sample once and does not queue ready batches behind a slow one.
TEST(LoaderDelivery, DeliversEverySampleOnceOutOfOrder) {
  const auto batches = make_batches(600, 16);
  const int64_t slow = batches[0][0];  // the first sample of batch 0 takes a while
  LoaderOptions o = options(2, 16);
  o.in_order = false;
  Loader loader(o, batches, Launcher::fork(sample_worker([slow](int64_t i, std::span<std::byte> out) {
    if (i == slow) std::this_thread::sleep_for(500ms);
    fill_sample(i, out);
  }, kSampleBytes)));
  std::vector<int> seen(600, 0), ids(batches.size(), 0);
  std::vector<int64_t> order;
  while (auto b = loader.next()) {
    ASSERT_GE(b->batch_id(), 0);
    ASSERT_LT(b->batch_id(), static_cast<int64_t>(batches.size()));
    ASSERT_TRUE(batch_is_intact(*b, batches[static_cast<std::size_t>(b->batch_id())]));
    ++ids[static_cast<std::size_t>(b->batch_id())];
    order.push_back(b->batch_id());
    for (int64_t i : b->indices()) ++seen[static_cast<std::size_t>(i)];
  }
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), static_cast<long>(batches.size())) << "every batch once";
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 600) << "every sample exactly once";
  ASSERT_FALSE(order.empty());
  EXPECT_NE(order.front(), 0) << "the slow batch 0 should not be delivered first";
}

// Proves: a fed loader delivers the batches fed one by one as they are drawn, in order, every sample once,
// ends only after end_feed(), refuses a next() that would wait for a batch never fed, and a new
// epoch (reset) is fed again.
TEST(LoaderDelivery, AFedLoaderDeliversBatchesFedAsTheyAreDrawn) {
  const auto batches = make_batches(500, 16);
  LoaderOptions o = options(2, 16);
  o.fed = true;
  o.assign_in_turn = true;
  const std::size_t first = 4;  // what torch's iterator draws up front: prefetch_factor * num_workers
  Loader loader(o, std::vector<std::vector<int64_t>>(batches.begin(), batches.begin() + first),
                Launcher::fork(sample_worker(fill_sample, kSampleBytes)));
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::size_t fed = first;
    std::vector<int> seen(500, 0);
    int64_t expect_id = 0;
    for (;;) {
      auto b = loader.next();
      if (!b) break;
      ASSERT_EQ(b->batch_id(), expect_id);
      ASSERT_TRUE(batch_is_intact(*b, batches[static_cast<std::size_t>(expect_id)]));
      for (int64_t i : b->indices()) ++seen[static_cast<std::size_t>(i)];
      ++expect_id;
      // One batch drawn per batch delivered, as torch's _process_data does.
      if (fed < batches.size()) loader.feed(std::vector<std::vector<int64_t>>{batches[fed++]});
      else loader.end_feed();
    }
    EXPECT_EQ(expect_id, static_cast<int64_t>(batches.size()));
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 500) << "every sample exactly once";
    EXPECT_THROW(loader.feed(std::vector<std::vector<int64_t>>{batches[0]}), std::logic_error)
        << "feeding after end_feed() is a bug of the caller";
    loader.reset(std::vector<std::vector<int64_t>>(batches.begin(), batches.begin() + first));
  }
  // Epoch 3: the batches fed are delivered, then a next() that would wait forever throws.
  for (std::size_t i = 0; i < first; ++i) ASSERT_TRUE(loader.next().has_value());
  EXPECT_THROW(loader.next(), std::logic_error);
  EXPECT_THROW(loader.feed(std::vector<std::vector<int64_t>>{std::vector<int64_t>(17, 0)}), std::invalid_argument)
      << "a batch over batch_capacity is refused, naming it";
  loader.end_feed();
  EXPECT_FALSE(loader.next().has_value());
}

// Proves: kept batches are never overwritten; with all slots leased the loader copies out instead.
TEST(LoaderDelivery, KeptBatchesAreNeverCorrupted) {
  const auto batches = make_batches(640, 16);  // 40 batches
  std::vector<Batch> kept;
  {
    Loader loader(options(2, 16), batches, Launcher::fork(sample_worker(fill_sample, kSampleBytes)));
    ASSERT_LT(loader.num_slots(), batches.size()) << "the test needs more batches than slots";
    while (auto b = loader.next()) {
      ASSERT_TRUE(batch_is_intact(*b, batches[static_cast<std::size_t>(b->batch_id())]));
      kept.push_back(std::move(*b));
    }
    EXPECT_GT(loader.copied_out(), 0) << "holding every batch must force copies";
    EXPECT_EQ(loader.copied_out(),
              static_cast<int64_t>(std::count_if(kept.begin(), kept.end(), [](const Batch& b) { return b.copied_out(); })));
    EXPECT_LT(loader.copied_out(), static_cast<int64_t>(batches.size())) << "leases come first, copies after";
    ASSERT_EQ(kept.size(), batches.size());
    for (const Batch& b : kept)
      EXPECT_TRUE(batch_is_intact(b, batches[static_cast<std::size_t>(b.batch_id())])) << "after iterating";
  }
  for (const Batch& b : kept)
    EXPECT_TRUE(batch_is_intact(b, batches[static_cast<std::size_t>(b.batch_id())])) << "after the loader is gone";
  EXPECT_TRUE(spindle_shm_names(getpid()).empty());
}

// Proves: a throwing sample fails only its batch, with a BatchFailedError naming it; iteration goes on.
TEST(LoaderErrors, ThrowingSampleFailsItsBatchAndIterationContinues) {
  const auto batches = make_batches(500, 20);
  constexpr int64_t kBad = 137;
  std::size_t bad_batch = 0;
  for (std::size_t b = 0; b < batches.size(); ++b)
    if (std::count(batches[b].begin(), batches[b].end(), kBad)) bad_batch = b;
  Loader loader(options(2, 20), batches, Launcher::fork(sample_worker([](int64_t i, std::span<std::byte> out) {
    if (i == kBad) throw std::runtime_error("cannot decode this one");
    fill_sample(i, out);
  }, kSampleBytes)));
  const auto pids = loader.worker_pids();

  std::vector<int> seen(500, 0);
  int failures = 0;
  for (;;) {
    try {
      auto b = loader.next();
      if (!b) break;
      ASSERT_TRUE(batch_is_intact(*b, batches[static_cast<std::size_t>(b->batch_id())]));
      for (int64_t i : b->indices()) ++seen[static_cast<std::size_t>(i)];
    } catch (const BatchFailedError& e) {
      ++failures;
      const std::string m = e.what();
      EXPECT_TRUE(contains(m, "sample 137")) << m;
      EXPECT_TRUE(contains(m, "cannot decode this one")) << m;
      EXPECT_TRUE(contains(m, "batch " + std::to_string(bad_batch))) << m;
      EXPECT_EQ(e.batch_id, static_cast<int64_t>(bad_batch));
      EXPECT_TRUE(contains(e.payload, "sample 137: cannot decode this one")) << e.payload;
      ASSERT_TRUE(e.worker_id == 0 || e.worker_id == 1) << e.worker_id;
      EXPECT_EQ(e.pid, pids[static_cast<std::size_t>(e.worker_id)]);
      EXPECT_TRUE(contains(m, "pid " + std::to_string(e.pid))) << m;
    }
  }
  EXPECT_EQ(failures, 1);
  for (int64_t i = 0; i < 500; ++i) {
    const bool in_bad = std::count(batches[bad_batch].begin(), batches[bad_batch].end(), i) > 0;
    ASSERT_EQ(seen[static_cast<std::size_t>(i)], in_bad ? 0 : 1) << "sample " << i;
  }
}

// Proves: a worker that SIGKILLs itself mid-batch is reported within 1 s with pid, batch and sample.
TEST(LoaderSupervision, WorkerThatKillsItselfRaisesWorkerDiedErrorWithinOneSecond) {
  SharedMapping note_map(sizeof(DeathNote));
  auto* note = new (note_map.data()) DeathNote();
  const auto batches = make_batches(1000, 32);
  constexpr int64_t kFatal = 300;
  std::size_t fatal_batch = 0;
  for (std::size_t b = 0; b < batches.size(); ++b)
    if (std::count(batches[b].begin(), batches[b].end(), kFatal)) fatal_batch = b;

  Loader loader(options(2, 32), batches, Launcher::fork(sample_worker([note](int64_t i, std::span<std::byte> out) {
    if (i == kFatal) {
      note->pid.store(getpid());
      note->at_ns.store(Clock::now().time_since_epoch().count());
      raise(SIGKILL);
    }
    fill_sample(i, out);
  }, kSampleBytes)));
  const auto pids = loader.worker_pids();

  std::string message;
  Clock::time_point thrown{};
  try {
    while (auto b = loader.next())
      ASSERT_TRUE(batch_is_intact(*b, batches[static_cast<std::size_t>(b->batch_id())]));
    FAIL() << "iteration ended without WorkerDiedError";
  } catch (const WorkerDiedError& e) {
    thrown = Clock::now();
    message = e.what();
  }
  ASSERT_NE(note->pid.load(), 0) << "the worker never reached the fatal sample";
  const auto died = Clock::time_point(Clock::duration(note->at_ns.load()));
  EXPECT_LT(thrown - died, 1000ms) << "took " << std::chrono::duration_cast<std::chrono::milliseconds>(thrown - died).count() << " ms";
  EXPECT_TRUE(contains(message, "pid " + std::to_string(note->pid.load()))) << message;
  EXPECT_TRUE(contains(message, "signal 9")) << message;
  EXPECT_TRUE(contains(message, "batch " + std::to_string(fatal_batch))) << message;
  EXPECT_TRUE(contains(message, "sample index 300")) << message;
  EXPECT_THROW((void)loader.next(), WorkerDiedError) << "a broken loader stays broken";
  expect_workers_reaped(pids);
  EXPECT_TRUE(spindle_shm_names(getpid()).empty());
}

// Proves: a worker killed by kill -9 while in a sample is reported within 1 s with pid and sample.
TEST(LoaderSupervision, WorkerKilledWhileSleepingRaisesWorkerDiedErrorWithinOneSecond) {
  const auto batches = make_batches(400, 10);
  const int64_t kSlow = batches[3][4];
  Pipe pipe;
  Loader loader(options(2, 10), batches, Launcher::fork(sample_worker([&pipe, kSlow](int64_t i, std::span<std::byte> out) {
    if (i == kSlow) {
      pipe.send(getpid());
      std::this_thread::sleep_for(30s);
    }
    fill_sample(i, out);
  }, kSampleBytes)));
  const auto pids = loader.worker_pids();
  const pid_t victim = pipe.receive(10s);
  ASSERT_NE(victim, 0) << "no worker reached the slow sample";
  ASSERT_TRUE(std::count(pids.begin(), pids.end(), victim));
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  const auto killed = Clock::now();

  std::string message;
  try {
    while (auto b = loader.next())
      ASSERT_TRUE(batch_is_intact(*b, batches[static_cast<std::size_t>(b->batch_id())]));
    FAIL() << "iteration ended without WorkerDiedError";
  } catch (const WorkerDiedError& e) {
    message = e.what();
  }
  const auto took = Clock::now() - killed;
  EXPECT_LT(took, 1000ms) << "took " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
  EXPECT_TRUE(contains(message, "pid " + std::to_string(victim))) << message;
  EXPECT_TRUE(contains(message, "signal 9")) << message;
  EXPECT_TRUE(contains(message, "batch 3")) << message;
  EXPECT_TRUE(contains(message, "sample index " + std::to_string(kSlow))) << message;
  expect_workers_reaped(pids);
  EXPECT_TRUE(spindle_shm_names(getpid()).empty());
}

// Proves: the 1 s bound holds while the surviving workers are stuck in long samples.
TEST(LoaderSupervision, WorkerDiedErrorIsPromptWhileOtherWorkersAreBusy) {
  const auto batches = make_batches(40, 1);  // every sample sleeps; one per batch
  Pipe pipe;
  Loader loader(options(2, 1), batches, Launcher::fork(sample_worker([&pipe](int64_t i, std::span<std::byte> out) {
    pipe.send(getpid());
    std::this_thread::sleep_for(30s);
    fill_sample(i, out);
  }, kSampleBytes)));
  const auto pids = loader.worker_pids();
  const pid_t first = pipe.receive(10s), second = pipe.receive(10s);
  ASSERT_NE(first, 0);
  ASSERT_NE(second, 0) << "both workers should be asleep in a sample";
  ASSERT_EQ(kill(first, SIGKILL), 0);
  const auto killed = Clock::now();
  EXPECT_THROW((void)loader.next(), WorkerDiedError);
  const auto took = Clock::now() - killed;
  EXPECT_LT(took, 1000ms) << "took " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                          << " ms while the other worker slept in its sample";
  expect_workers_reaped(pids);
}

// Proves: a sample slower than the timeout gives a LoaderTimeoutError naming worker, pid and sample.
TEST(LoaderSupervision, SlowSampleRaisesLoaderTimeoutErrorNamingWorkerAndSample) {
  const auto batches = make_batches(40, 4);
  const int64_t kSlow = batches[1][1];
  LoaderOptions o = options(1, 4);
  o.timeout = 300ms;
  Loader loader(o, batches, Launcher::fork(sample_worker([kSlow](int64_t i, std::span<std::byte> out) {
    if (i == kSlow) std::this_thread::sleep_for(30s);
    fill_sample(i, out);
  }, kSampleBytes)));
  const auto pids = loader.worker_pids();
  auto first = loader.next();
  ASSERT_TRUE(first.has_value());
  EXPECT_TRUE(batch_is_intact(*first, batches[0]));

  std::string message;
  const auto start = Clock::now();
  try {
    (void)loader.next();
    FAIL() << "no LoaderTimeoutError";
  } catch (const LoaderTimeoutError& e) {
    message = e.what();
  }
  EXPECT_GE(Clock::now() - start, 250ms) << "gave up before the timeout";
  EXPECT_TRUE(contains(message, "DataLoader timed out after 0.3 seconds")) << message;
  EXPECT_TRUE(contains(message, "batch 1")) << message;
  EXPECT_TRUE(contains(message, "worker 0 (pid " + std::to_string(pids[0]) + ", sleeping)")) << message;
  EXPECT_TRUE(contains(message, "sample index " + std::to_string(kSlow))) << message;
  EXPECT_THROW((void)loader.next(), LoaderTimeoutError) << "a timed-out loader stays closed";
  expect_workers_reaped(pids);
  EXPECT_TRUE(batch_is_intact(*first, batches[0])) << "a batch delivered before the timeout stays valid";
}

// Proves: when a consumer is SIGKILLed, all its workers are gone within 2 s.
TEST(LoaderSupervision, NoWorkerOutlivesAKilledConsumer) {
  constexpr int kWorkers = 2;
  Pipe pipe;
  const pid_t consumer = fork();
  ASSERT_GE(consumer, 0);
  if (consumer == 0) {
    try {
      Loader loader(options(kWorkers, 1), make_batches(8, 1), Launcher::fork(sample_worker([](int64_t, std::span<std::byte>) {
        std::this_thread::sleep_for(60s);
      }, kSampleBytes)));
      for (pid_t pid : loader.worker_pids()) pipe.send(pid);
      (void)loader.next();  // blocks until the test kills this process
    } catch (...) {
    }
    _exit(1);
  }
  std::vector<pid_t> workers;
  for (int w = 0; w < kWorkers; ++w)
    if (pid_t pid = pipe.receive(10s)) workers.push_back(pid);
  for (pid_t pid : workers) EXPECT_FALSE(spindle::testing::process_gone(pid)) << "worker " << pid << " died early";
  kill(consumer, SIGKILL);
  const int status = spindle::testing::wait_child(consumer, 10s);
  ASSERT_EQ(workers.size(), static_cast<std::size_t>(kWorkers)) << "the consumer did not report its workers";
  EXPECT_TRUE(status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

  const bool all_gone = spindle::testing::eventually(2s, [&] {
    return std::all_of(workers.begin(), workers.end(), spindle::testing::process_gone);
  });
  for (pid_t pid : workers) {
    EXPECT_TRUE(spindle::testing::process_gone(pid)) << "worker " << pid << " outlived its consumer";
    if (!all_gone) kill(pid, SIGKILL);  // do not leak it past the test
  }
  EXPECT_TRUE(spindle_shm_names(consumer).empty()) << "the killed consumer left its segment's name";
}

// Proves: each worker process runs exactly one thread while it works.
TEST(LoaderProcesses, EachWorkerHasExactlyOneThread) {
  const auto batches = make_batches(400, 8);
  Loader loader(options(2, 8), batches, Launcher::fork(sample_worker([](int64_t i, std::span<std::byte> out) {
    std::this_thread::sleep_for(1ms);
    fill_sample(i, out);
  }, kSampleBytes)));
  auto b = loader.next();  // the workers are up and producing
  ASSERT_TRUE(b.has_value());
  const auto pids = loader.worker_pids();
  ASSERT_EQ(pids.size(), 2u);
  for (pid_t pid : pids) EXPECT_EQ(count_process_threads(pid), 1) << "worker pid " << pid;
  int64_t delivered = 1;
  while (loader.next()) ++delivered;
  EXPECT_EQ(delivered, static_cast<int64_t>(batches.size()));
}

// Proves: workers beyond the budget give ThreadBudgetError before any process or segment exists.
TEST(LoaderProcesses, ThreadBudgetErrorComesBeforeAnyFork) {
  LoaderOptions o = options(4, 8);
  o.max_threads = 2;
  const auto children_before = spindle::testing::child_pids();
  int forks = 0;
  ForkHooks hooks;
  hooks.before_fork = [&forks] { ++forks; };
  std::string message;
  try {
    Loader loader(o, make_batches(64, 8), Launcher::fork(sample_worker(fill_sample, kSampleBytes), hooks));
    FAIL() << "4 workers fit a budget of 2";
  } catch (const ThreadBudgetError& e) {
    message = e.what();
  }
  EXPECT_EQ(forks, 0) << "a worker was forked before the budget check";
  EXPECT_TRUE(contains(message, "4 workers")) << message;
  EXPECT_TRUE(contains(message, "budget of 2")) << message;
  EXPECT_TRUE(contains(message, "max_threads")) << message;
  EXPECT_TRUE(spindle_shm_names(getpid()).empty());
  EXPECT_EQ(spindle::testing::child_pids(), children_before) << "a process was started before the budget check";
}

}  // namespace
}  // namespace spindle

namespace spindle {
namespace {

// Proves: close() from another thread while next() waits on a hung sample makes next()
// return nullopt at once (no crash, no use of a torn-down pool), the workers are reaped,
// and next() after close is nullopt; also while batches flow. Run under TSan too.
TEST(LoaderConcurrency, CloseFromAnotherThreadEndsAWaitingNext) {
  for (int round = 0; round < 5; ++round) {
    const bool hang = round % 2 == 0;
    auto body = sample_worker(
        [hang](int64_t index, std::span<std::byte> out) {
          if (hang && index == 0) std::this_thread::sleep_for(60s);
          fill_sample(index, out);
        },
        kSampleBytes);
    Loader loader(options(2, 4), make_batches(4000, 4), Launcher::fork(body));
    const std::vector<pid_t> pids = loader.worker_pids();
    std::thread closer([&] {
      std::this_thread::sleep_for(hang ? 200ms : 1ms);
      loader.close();
    });
    const auto start = Clock::now();
    int delivered = 0;
    while (auto b = loader.next()) ++delivered;
    const auto waited = Clock::now() - start;
    closer.join();
    EXPECT_LT(waited, 2500ms) << "round " << round;
    if (hang) {
      EXPECT_LT(delivered, 1000) << "stuck at the batch holding sample 0";
    }
    EXPECT_TRUE(loader.closed());
    EXPECT_FALSE(loader.next().has_value()) << "next() after close";
    EXPECT_TRUE(loader.worker_pids().empty());
    expect_workers_reaped(pids);
  }
}

// Proves: an exception thrown by next()'s poll hook (the Python layer's KeyboardInterrupt)
// leaves next() promptly with the loader intact: a later next() delivers the batch.
TEST(LoaderSupervision, APollHookThatThrowsLeavesTheLoaderUsable) {
  auto body = sample_worker(
      [](int64_t index, std::span<std::byte> out) {
        if (index == 0) std::this_thread::sleep_for(400ms);
        fill_sample(index, out);
      },
      kSampleBytes);
  const auto batches = std::vector<std::vector<int64_t>>{{0, 1}, {2, 3}};
  Loader loader(options(1, 2), batches, Launcher::fork(body));
  struct Interrupted {};
  const auto start = Clock::now();
  EXPECT_THROW(loader.next([] { throw Interrupted{}; }), Interrupted);
  EXPECT_LT(Clock::now() - start, 300ms) << "the hook runs every supervision period";
  auto b = loader.next();
  ASSERT_TRUE(b.has_value());
  EXPECT_TRUE(batch_is_intact(*b, batches[0]));
}

}  // namespace
}  // namespace spindle

namespace spindle {
namespace {

// Proves: Launcher::threads (arena threads) delivers the same batches, bytes for bytes, as forked workers,
// forks nothing (no worker pids), runs its workers on arena threads of this process, and
// close() ends them.
TEST(LoaderThreads, ArenaThreadsDeliverTheSameBatchesAsProcesses) {
  const auto batches = make_batches(3000, 16);
  auto body = sample_worker(fill_sample, kSampleBytes);
  std::vector<std::vector<std::byte>> from_processes, from_threads;
  {
    Loader loader(options(2, 16), batches, Launcher::fork(body));
    while (auto b = loader.next()) from_processes.emplace_back(b->data().begin(), b->data().end());
  }
  const std::size_t threads_before = spindle::testing::thread_count();
  {
    Loader loader(options(2, 16), batches, Launcher::threads(body));
    EXPECT_TRUE(loader.worker_pids().empty());
    std::size_t i = 0;
    while (auto b = loader.next()) {
      EXPECT_TRUE(batch_is_intact(*b, batches[i])) << "batch " << i;
      from_threads.emplace_back(b->data().begin(), b->data().end());
      ++i;
    }
    EXPECT_GE(spindle::testing::thread_count(), threads_before + 2) << "the workers are threads of this process";
  }
  EXPECT_EQ(from_threads, from_processes);
}

}  // namespace
}  // namespace spindle

namespace spindle {
namespace {

// Proves: a Loader created in a thread that then exits keeps its workers (the
// kernel's parent-death signal fires per thread; ours checks the process), and
// they still die with the consumer process (NoWorkerOutlivesAKilledConsumer).
TEST(LoaderProcesses, WorkersSurviveTheExitOfTheThreadThatForkedThem) {
  const auto batches = make_batches(2000, 8);
  std::unique_ptr<Loader> loader;
  std::thread creator([&] { loader = std::make_unique<Loader>(options(2, 8), batches, Launcher::fork(sample_worker(fill_sample, kSampleBytes))); });
  creator.join();  // the forking thread is gone
  std::this_thread::sleep_for(200ms);
  std::size_t i = 0;
  while (auto b = loader->next()) {
    ASSERT_TRUE(batch_is_intact(*b, batches[i])) << "batch " << i;
    ++i;
  }
  EXPECT_EQ(i, batches.size());
}

}  // namespace
}  // namespace spindle

namespace spindle {
namespace {

// Proves: a forked copy of the consumer (a worker of another loader whose collector finalizes
// what it inherited, a user's fork) that closes and destroys its copies of a Loader and of a
// held Batch neither waits (the worker threads exist only in the consumer) nor touches the
// consumer's loader: its queues stay open, its workers run, the held slot stays held.
TEST(LoaderLifecycle, AForkedCopyClosingItsLoaderLeavesTheConsumersRunning) {
  for (bool threads : {false, true}) {
    const auto batches = make_batches(400, 16);
    auto body = sample_worker(fill_sample, kSampleBytes);
    auto loader = std::make_unique<Loader>(options(2, 16), batches, threads ? Launcher::threads(body) : Launcher::fork(body));
    std::optional<Batch> held = loader->next();
    ASSERT_TRUE(held.has_value());
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      held.reset();
      loader->close();
      loader.reset();
      _exit(0);
    }
    int status = -1;
    const auto deadline = Clock::now() + 10s;
    while (waitpid(child, &status, WNOHANG) == 0 && Clock::now() < deadline) std::this_thread::sleep_for(5ms);
    if (!WIFEXITED(status)) {
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      FAIL() << "the forked copy waited in close() (threads=" << threads << ")";
    }
    EXPECT_TRUE(batch_is_intact(*held, batches[0])) << "threads=" << threads;
    std::size_t got = held->indices().size(), i = 1;
    held.reset();
    while (auto b = loader->next()) {
      ASSERT_TRUE(batch_is_intact(*b, batches[i])) << "batch " << i << ", threads=" << threads;
      got += b->indices().size();
      ++i;
    }
    EXPECT_EQ(got, 400u) << "threads=" << threads;
  }
}

}  // namespace
}  // namespace spindle
