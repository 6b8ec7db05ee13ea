// Processes that follow the run: a lost worker replaced (LoaderOptions::max_replacements) with no
// sample lost or repeated, a poison sample named at its second loss, the limit; adaptive processes
// (LoaderOptions::adaptive) growing on waiting samples and giving the same batches.
#include <spindle/error.hpp>
#include <spindle/loader.hpp>

#include <signal.h>
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

// Proves: adaptive processes start one, grow while next() waits on slow samples, and deliver the
// same batches in the same order.
TEST(AdaptiveProcesses, GrowOnWaitingSamplesWithTheSameBatches) {
  const auto batches = testing::consecutive_batches(400, 4);
  LoaderOptions o = testing::fixed_sample_options(8, 4, kSampleBytes);
  o.adaptive = true;
  std::vector<std::string> lines;
  o.on_resized = [&](const std::string& line) { lines.push_back(line); };
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

// Proves: adaptive processes refuse streams (their data depends on the worker count).
TEST(AdaptiveProcesses, RefuseStreams) {
  LoaderOptions o = testing::fixed_sample_options(4, 4, kSampleBytes);
  o.adaptive = true;
  o.round_robin = true;
  EXPECT_THROW(Loader(o, {}, Launcher::fork([](WorkerContext&) { return 0; })), std::invalid_argument);
}

}  // namespace
}  // namespace spindle
