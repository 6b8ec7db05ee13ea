// Loader::stats() (loader_stats.hpp): the consumer's counts and wait histogram,
// the workers' counters in shared memory, reset_stats(), the off switch and the
// stall warning, through the C++ API with forked workers.
#include <unistd.h>

#include <chrono>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <spindle/loader.hpp>

#include "test_support.hpp"

namespace spindle {
namespace {

constexpr uint64_t kSampleBytes = 64;

BatchPlan plan(int64_t n, std::size_t batch) {
  std::vector<int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  return BatchPlan::chunked(std::move(order), batch);
}

WorkerMain sleepy(std::chrono::milliseconds per_sample, int64_t only = -1) {
  return sample_worker(
      [=](int64_t i, std::span<std::byte> out) {
        if (only < 0 || i == only) std::this_thread::sleep_for(per_sample);
        out[0] = static_cast<std::byte>(i);
      },
      kSampleBytes);
}

LoaderOptions options(int workers, uint32_t batch) {
  return testing::fixed_sample_options(workers, batch, kSampleBytes);
}

// Proves: batches, samples and waits are counted, the workers' samples add up to the total,
// busy time covers the sleeps, and reset_stats starts every count from zero.
TEST(LoaderStatsTest, CountsBatchesSamplesWaitsAndWorkers) {
  Loader loader(options(2, 4), plan(40, 4), Launcher::fork(sleepy(std::chrono::milliseconds(5))));
  while (loader.next()) {
  }
  const LoaderStats s = loader.stats();
  EXPECT_EQ(s.batches, 10u);
  EXPECT_EQ(s.samples, 40u);
  EXPECT_EQ(s.wait.n, 10u);
  EXPECT_LE(s.wait_p50_ms(), s.wait_max_ms());
  EXPECT_GT(s.wait_s(), 0.0);
  ASSERT_EQ(s.workers.size(), 2u);
  EXPECT_EQ(s.workers[0].samples + s.workers[1].samples, 40u);
  EXPECT_GE(s.workers[0].busy_s + s.workers[1].busy_s, 40 * 0.005);
  EXPECT_EQ(s.ring_ready + s.ring_in_flight + s.ring_leased, 0u);
  loader.reset_stats();
  const LoaderStats z = loader.stats();
  EXPECT_EQ(z.batches, 0u);
  EXPECT_EQ(z.wait.n, 0u);
  EXPECT_EQ(z.workers[0].samples + z.workers[1].samples, 0u);
}

// Proves: with stats off nothing is measured, and the batches still arrive.
TEST(LoaderStatsTest, OffSwitchMeasuresNothing) {
  LoaderOptions o = options(1, 4);
  o.stats = false;
  Loader loader(o, plan(12, 4), Launcher::fork(sleepy(std::chrono::milliseconds(0))));
  int n = 0;
  while (loader.next()) ++n;
  EXPECT_EQ(n, 3);
  const LoaderStats s = loader.stats();
  EXPECT_EQ(s.batches, 0u);
  EXPECT_EQ(s.workers[0].samples, 0u);
  EXPECT_EQ(s.workers[0].busy_s, 0.0);
}

// Proves: a next() that waits past stall_warning calls on_stall once, naming the busy worker and sample.
TEST(LoaderStatsTest, StallWarningNamesTheBusyWorkerOnce) {
  LoaderOptions o = options(1, 1);
  o.stall_warning = std::chrono::milliseconds(200);
  std::vector<std::string> warnings;
  o.on_stall = [&](const std::string& m) { warnings.push_back(m); };
  Loader loader(o, plan(3, 1), Launcher::fork(sleepy(std::chrono::milliseconds(800), 1)));
  while (loader.next()) {
  }
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("worker 0 (pid "), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("in batch 1, sample 1"), std::string::npos) << warnings[0];
}

// Proves: quantiles of the log-scale histogram are within 5% of the value, and merging adds.
TEST(LoaderStatsTest, HistogramQuantilesAndMerge) {
  WaitHistogram h;
  for (int i = 0; i < 99; ++i) h.add(20'000'000);  // 20 ms
  h.add(900'000'000);                              // one 900 ms outlier
  EXPECT_NEAR(h.quantile_ms(0.5), 20.0, 1.0);
  EXPECT_NEAR(h.quantile_ms(0.95), 20.0, 1.0);
  EXPECT_DOUBLE_EQ(static_cast<double>(h.max_ns) / 1e6, 900.0);
  WaitHistogram g;
  g.add(1'000);
  g.merge(h);
  EXPECT_EQ(g.n, 101u);
  EXPECT_EQ(g.total_ns, h.total_ns + 1'000);
}

}  // namespace
}  // namespace spindle
