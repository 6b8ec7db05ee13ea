// Processes that follow the run: a lost worker replaced (LoaderOptions::max_replacements) with no
// sample lost or repeated, a poison sample named at its second loss, the limit; adaptive processes
// (LoaderOptions::adaptive) growing on waiting samples and giving the same batches; adaptive streams
// advised another count of processes.
#include <spindle/error.hpp>
#include <spindle/loader.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "test_support.hpp"

namespace spindle {
namespace {

using spindle::testing::SharedMapping;
using namespace std::chrono_literals;

constexpr uint64_t kSampleBytes = 16;

void fill(int64_t index, std::span<std::byte> out) {
  for (std::size_t j = 0; j < out.size(); ++j) out[j] = static_cast<std::byte>((index * 7 + static_cast<int64_t>(j)) & 0xff);
}

// Samples whose first read kills the reading worker (`once[i]` set in shared memory), or every read.
struct Deaths {
  SharedMapping flags{4096};
  std::atomic<int32_t>* once(int64_t i) const { return flags.as<std::atomic<int32_t>>() + i; }
};

// Every batch delivered, in order, each sample's bytes its own.
std::vector<int64_t> drain(Loader& loader, std::size_t batches) {
  std::vector<int64_t> seen;
  int64_t expect = 0;
  while (auto b = loader.next()) {
    EXPECT_EQ(b->batch_id(), expect++);
    for (std::size_t i = 0; i < b->count(); ++i) {
      std::vector<std::byte> want(kSampleBytes);
      fill(b->indices()[i], want);
      EXPECT_EQ(0, std::memcmp(b->data().data() + i * kSampleBytes, want.data(), kSampleBytes));
      seen.push_back(b->indices()[i]);
    }
  }
  EXPECT_EQ(static_cast<std::size_t>(expect), batches);
  return seen;
}

// Proves: three samples that each kill their worker at the first read, with 3 workers: every
// sample once, in order, with its bytes; three replacements; the loader's pids are live ones.
TEST(WorkerReplacement, LostWorkersAreReplacedAndNothingIsLostOrRepeated) {
  Deaths deaths;
  for (int64_t i : {5, 77, 140}) deaths.once(i)->store(1);
  const auto batches = testing::consecutive_batches(200, 8);
  LoaderOptions o = testing::fixed_sample_options(3, 8, kSampleBytes);
  o.max_replacements = 3;
  std::vector<std::string> lines;
  o.on_replaced = [&](const std::string& line) { lines.push_back(line); };
  Loader loader(o, batches, Launcher::fork(sample_worker([&deaths](int64_t i, std::span<std::byte> out) {
                  if (deaths.once(i)->exchange(0) == 1) raise(SIGKILL);
                  fill(i, out);
                }, kSampleBytes)));
  const auto seen = drain(loader, batches.size());
  std::vector<int64_t> all(200);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(seen, all);
  EXPECT_EQ(loader.replaced(), 3);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_NE(lines[0].find("was killed by signal 9"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("at sample index 5; started again as pid"), std::string::npos) << lines[0];
  for (pid_t pid : loader.worker_pids()) EXPECT_EQ(kill(pid, 0), 0) << pid;
}

// Proves: a sample that kills every worker reading it is tried twice, then WorkerDiedError names it.
TEST(WorkerReplacement, APoisonSampleIsNamedAtItsSecondLoss) {
  const auto batches = testing::consecutive_batches(100, 10);
  LoaderOptions o = testing::fixed_sample_options(2, 10, kSampleBytes);
  o.max_replacements = 5;
  o.on_replaced = [](const std::string&) {};
  Loader loader(o, batches, Launcher::fork(sample_worker([](int64_t i, std::span<std::byte> out) {
                  if (i == 42) raise(SIGKILL);
                  fill(i, out);
                }, kSampleBytes)));
  try {
    while (loader.next()) {
    }
    FAIL() << "a poison sample must end the epoch";
  } catch (const WorkerDiedError& e) {
    EXPECT_EQ(e.sample, 42);
    EXPECT_NE(std::string(e.what()).find("Sample index 42 was being produced at an earlier loss too"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(loader.replaced(), 1);
  EXPECT_TRUE(loader.closed());
}

// Spins until this process has used `ns` more CPU.
void burn_cpu(uint64_t ns) {
  for (const uint64_t until = process_cpu_ns(getpid()) + ns; process_cpu_ns(getpid()) < until;) {
  }
}

// Adaptive processes, at most 8, batches of 4 samples, a budget of `cpus`; each change's line into `lines`.
LoaderOptions adaptive_options(int cpus, std::vector<std::string>& lines) {
  LoaderOptions o = testing::fixed_sample_options(8, 4, kSampleBytes);
  o.adaptive = true;
  o.budget_sources.cpus = cpus;
  o.on_resized = [&lines](const std::string& line) { lines.push_back(line); };
  return o;
}

// Proves: adaptive processes start at the idle cores (one: a budget of one cpu), grow while next()
// waits on slow samples, and deliver the same batches in the same order.
TEST(AdaptiveProcesses, GrowOnWaitingSamplesWithTheSameBatches) {
  const auto batches = testing::consecutive_batches(400, 4);
  std::vector<std::string> lines;
  const LoaderOptions o = adaptive_options(1, lines);
  Loader loader(o, batches, Launcher::fork(sample_worker([](int64_t i, std::span<std::byte> out) {
                  std::this_thread::sleep_for(5ms);
                  fill(i, out);
                }, kSampleBytes)));
  EXPECT_EQ(loader.processes(), 1);
  EXPECT_EQ(loader.worker_pids().size(), 1u);
  const auto seen = drain(loader, batches.size());
  std::vector<int64_t> all(400);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(seen, all);
  EXPECT_GT(loader.processes(), 1);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0].rfind("spindle: 1 -> ", 0), 0u) << lines[0];
  EXPECT_EQ(loader.stats().processes, loader.processes());
  EXPECT_EQ(loader.stats().max_processes, 8);
}

// Proves: what a process costs its start (imports, the dataset's setup: here 150 ms of CPU before its
// first claim) is not what it uses: processes that then wait on I/O (10 ms a sample) grow to all 8 in one
// change, not in steps sized by their start's CPU; the batches are those of a fixed run.
TEST(AdaptiveProcesses, CountAProcessFromItsFirstClaimNotItsStart) {
  const auto batches = testing::consecutive_batches(480, 4);
  std::vector<std::string> lines;
  const LoaderOptions o = adaptive_options(2, lines);
  WorkerMain body = sample_worker([](int64_t i, std::span<std::byte> out) {
    std::this_thread::sleep_for(10ms);
    fill(i, out);
  }, kSampleBytes);
  Loader loader(o, batches, Launcher::fork([body](WorkerContext& ctx) {
                  burn_cpu(150'000'000);
                  return body(ctx);
                }));
  const auto seen = drain(loader, batches.size());
  std::vector<int64_t> all(480);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(seen, all);
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines[0].find(" -> 8 worker processes"), std::string::npos) << lines[0];
  EXPECT_EQ(loader.processes(), 8);
}

// Proves: with no core free (every core spun by a process at nice 19), processes that use little CPU
// are not grown: they may be starved of CPU rather than waiting on I/O (here they sleep 5 ms a sample;
// in the bench's two consumers, PIL workers starved on 2 cores grew 2 -> 5 -> 7 -> 13 -> 16).
TEST(AdaptiveProcesses, NoGrowthWithoutACoreFree) {
  struct Hogs {
    std::vector<pid_t> pids;
    ~Hogs() {
      for (const pid_t p : pids) kill(p, SIGKILL);
      for (const pid_t p : pids) waitpid(p, nullptr, 0);
    }
  } hogs;
  const int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 0; i <= cpus; ++i) {
    const pid_t p = fork();
    ASSERT_GE(p, 0);
    if (p == 0) {
      (void)nice(19);
      for (;;) {
      }
    }
    hogs.pids.push_back(p);
  }
  std::this_thread::sleep_for(50ms);  // spinning
  const auto batches = testing::consecutive_batches(240, 4);
  std::vector<std::string> lines;
  const LoaderOptions o = adaptive_options(cpus, lines);
  Loader loader(o, batches, Launcher::fork(sample_worker([](int64_t i, std::span<std::byte> out) {
                  std::this_thread::sleep_for(5ms);
                  fill(i, out);
                }, kSampleBytes)));
  const auto seen = drain(loader, batches.size());
  EXPECT_EQ(seen.size(), 240u);
  EXPECT_TRUE(lines.empty()) << lines.front();
}

// Proves: the early look (kEarlyWindow: 20 ms from the first next(), while next() waits on every
// batch) tells workers that burn CPU (8 ms a sample) from workers that wait on I/O: they are grown no
// further than the 2 cores hold (at most 4 processes, with a start's rounding), never to all 8 at once.
TEST(AdaptiveProcesses, AnEarlyLookKnowsBusyWorkersFromWaitingOnes) {
  const auto batches = testing::consecutive_batches(240, 4);
  std::vector<std::string> lines;
  const LoaderOptions o = adaptive_options(2, lines);
  Loader loader(o, batches, Launcher::fork(sample_worker([](int64_t i, std::span<std::byte> out) {
                  burn_cpu(8'000'000);
                  fill(i, out);
                }, kSampleBytes)));
  const auto seen = drain(loader, batches.size());
  std::vector<int64_t> all(240);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(seen, all);
  for (const std::string& line : lines) {  // "spindle: 1 -> 2 worker processes ..."
    const auto arrow = line.find(" -> ");
    ASSERT_NE(arrow, std::string::npos) << line;
    EXPECT_LE(std::stoi(line.substr(arrow + 4)), 4) << line;
  }
}

// Proves: no process is added for the epoch's tail: with every batch already posted to the processes
// running (2 of 4 batches each), next() waits on slow samples with a core free, yet none is added
// (it would find nothing to do, and the next epoch would start on it).
TEST(AdaptiveProcesses, NoGrowthForTheEpochsTail) {
  std::vector<std::string> lines;
  LoaderOptions o = adaptive_options(2, lines);
  o.processes = 2;
  o.prefetch_factor = 2;
  const auto batches = testing::consecutive_batches(16, 4);
  Loader loader(o, batches, Launcher::fork(sample_worker([](int64_t i, std::span<std::byte> out) {
                  std::this_thread::sleep_for(30ms);
                  fill(i, out);
                }, kSampleBytes)));
  ASSERT_EQ(loader.processes(), 2);
  const auto seen = drain(loader, batches.size());
  EXPECT_EQ(seen.size(), 16u);
  EXPECT_TRUE(lines.empty()) << lines.front();
  EXPECT_EQ(loader.processes(), 2);
}

// Proves: process_cpu_ns reads another process's CPU (all its threads) to the ns, and 0 once it is gone.
TEST(ProcessCpu, ReadsAChildsCpuAndNothingOnceItIsGone) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    timespec t{};
    for (;;) {  // 30 ms of CPU, then sleeps until killed
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
      if (t.tv_sec * 1'000'000'000LL + t.tv_nsec >= 30'000'000LL) pause();
    }
  }
  const auto until = std::chrono::steady_clock::now() + 5s;
  uint64_t cpu = 0;
  while ((cpu = process_cpu_ns(child)) < 30'000'000 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(5ms);
  EXPECT_GE(cpu, 30'000'000u);
  EXPECT_LT(cpu, 5'000'000'000u);
  EXPECT_NE(cpu % 10'000'000, 0u) << "not rounded to ticks";
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_EQ(process_cpu_ns(child), 0u);
}

// Proves: adaptive streams need logical workers (without them the data depends on the processes) and
// their count (the front end knows the logical workers its data is defined by).
TEST(AdaptiveProcesses, RefuseStreamsWithoutLogicalWorkers) {
  LoaderOptions o = testing::fixed_sample_options(4, 4, kSampleBytes);
  o.adaptive = true;
  o.round_robin = true;
  EXPECT_THROW(Loader(o, {}, Launcher::fork([](WorkerContext&) { return 0; })), std::invalid_argument);
  o.logical_workers = true;
  o.num_workers = 0;
  EXPECT_THROW(Loader(o, {}, Launcher::fork([](WorkerContext&) { return 0; })), std::invalid_argument);
}

// Logical worker l's stream: 24 elements l * 1000 + k, each after 4 ms (a remote read); a process keeps
// a position per logical worker it serves.
int slow_logical_streams(WorkerContext& ctx) {
  std::vector<int> done(static_cast<std::size_t>(ctx.logical_workers()), 0);
  while (auto item = ctx.claim()) {
    int& k = done[static_cast<std::size_t>(item->stream)];
    if (k == 24) {
      ctx.exhausted(*item);
      continue;
    }
    std::this_thread::sleep_for(4ms);
    const int32_t value = item->stream * 1000 + k++;
    std::memcpy(item->out.data(), &value, sizeof value);
    ctx.commit(*item, 1);
  }
  return 0;
}

// Proves: adaptive processes start with a process per idle core, at least one and at most the cpus
// (idle_cores_now); adaptive streams with no processes chosen start the same count.
TEST(AdaptiveProcesses, StartWithTheIdleCores) {
  EXPECT_EQ(idle_cores_now(1), 1);
  const int cpus = static_cast<int>(std::thread::hardware_concurrency());
  const int idle = idle_cores_now(cpus);
  EXPECT_GE(idle, 1);
  EXPECT_LE(idle, cpus);
  LoaderOptions o = testing::fixed_sample_options(8, 4, kSampleBytes);
  o.adaptive = true;
  Loader loader(o, testing::consecutive_batches(8, 4), Launcher::fork(sample_worker(fill, kSampleBytes)));
  EXPECT_GE(loader.processes(), 1);
  EXPECT_LE(loader.processes(), cpus);
  o.round_robin = true;
  o.logical_workers = true;
  o.batch_capacity = 1;
  Loader streams(o, {}, Launcher::fork([](WorkerContext& ctx) {
                   while (auto item = ctx.claim()) ctx.exhausted(*item);
                   return 0;
                 }));
  EXPECT_GE(streams.plan().num_workers, 1);
  EXPECT_LE(streams.plan().num_workers, cpus);
  EXPECT_EQ(streams.num_logical_workers(), 8);
}

// Proves: an adaptive loader given `processes` (a front end's last epoch ended there) starts on that
// many, not on the cores idle now, at most num_workers; and still follows the load from there (here
// the consumer sets the pace: it retires processes).
TEST(AdaptiveProcesses, StartWhereTheLastEpochEnded) {
  std::vector<std::string> lines;
  LoaderOptions o = adaptive_options(2, lines);
  o.processes = 6;
  const auto batches = testing::consecutive_batches(4000, 4);
  Loader loader(o, batches, Launcher::fork(sample_worker(fill, kSampleBytes)));
  EXPECT_EQ(loader.processes(), 6);
  EXPECT_EQ(loader.worker_pids().size(), 6u);
  std::size_t seen = 0;
  while (auto b = loader.next()) {
    ++seen;
    std::this_thread::sleep_for(1ms);  // the consumer sets the pace
  }
  EXPECT_EQ(seen, batches.size());
  EXPECT_LT(loader.processes(), 6) << (lines.empty() ? "no change" : lines.back());
  o.processes = 20;
  Loader capped(o, testing::consecutive_batches(8, 4), Launcher::fork(sample_worker(fill, kSampleBytes)));
  EXPECT_EQ(capped.processes(), 8);
}

// Proves: adaptive streams with logical workers start on the processes given (LoaderOptions::processes);
// while next() waits on slow elements the controller advises more (one on_resized line, "from their
// states") and changes nothing itself: one process goes on giving the elements of 8 logical workers in
// turn, as a fixed run does. Once advised, a next() that finds no element ready stops waiting with
// ProcessesAdvised (the front end would start again now) and a later one still gets the next element.
TEST(AdaptiveProcesses, StreamsAreAdvisedMoreProcessesAndKeepTheirElements) {
  LoaderOptions o;
  o.num_workers = 8;
  o.batch_capacity = 1;
  o.slot_bytes = sizeof(int32_t);
  o.round_robin = true;
  o.logical_workers = true;
  o.adaptive = true;
  o.processes = 1;
  std::vector<std::string> lines;
  o.on_resized = [&](const std::string& line) { lines.push_back(line); };
  Loader loader(o, {}, Launcher::fork(slow_logical_streams));
  EXPECT_EQ(loader.processes(), 1);
  EXPECT_EQ(loader.num_logical_workers(), 8);
  EXPECT_EQ(loader.advised_processes(), 0);
  std::vector<int32_t> seen;
  int stopped = 0;
  for (;;) {
    try {
      auto b = loader.next();
      if (!b) break;
      seen.push_back(*reinterpret_cast<const int32_t*>(b->data().data()));
    } catch (const ProcessesAdvised& e) {
      ++stopped;
      EXPECT_GT(loader.advised_processes(), 1);
      EXPECT_NE(std::string(e.what()).find(std::to_string(loader.advised_processes()) + " worker processes advised"),
                std::string::npos) << e.what();
      std::this_thread::sleep_for(1ms);  // this caller does not start again: it asks for the element later
    }
  }
  EXPECT_GT(stopped, 0);
  ASSERT_EQ(seen.size(), 8u * 24u);
  for (std::size_t i = 0; i < seen.size(); ++i)
    ASSERT_EQ(seen[i], static_cast<int32_t>((i % 8) * 1000 + i / 8)) << "element " << i;
  EXPECT_GT(loader.advised_processes(), 1);
  EXPECT_LE(loader.advised_processes(), 8);
  EXPECT_EQ(loader.processes(), 1);
  ASSERT_EQ(lines.size(), 1u);  // advised once: the controller waits for the front end
  EXPECT_EQ(lines[0].rfind("spindle: 1 -> " + std::to_string(loader.advised_processes()) + " worker processes (at most 8)", 0), 0u)
      << lines[0];
  EXPECT_NE(lines[0].find("from their states"), std::string::npos) << lines[0];
  EXPECT_EQ(loader.stats().max_processes, 8);
  EXPECT_EQ(loader.resize_reason(), lines[0]);
}

}  // namespace
}  // namespace spindle
