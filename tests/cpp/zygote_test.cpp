// Workers forked by a Zygote in a multithreaded native program.
//
// This binary has its own main(): the zygote must be started while the process
// has one thread, so it is created before GoogleTest runs anything.
#include <gtest/gtest.h>

#include <csignal>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include <spindle/error.hpp>
#include <spindle/loader.hpp>
#include <spindle/thread_budget.hpp>
#include <spindle/zygote.hpp>

#include "test_support.hpp"

namespace {

constexpr uint64_t kSampleBytes = 256;

// A lock that another thread of the program holds while loaders start, as a
// logger or a runtime's pool might.
std::timed_mutex g_lock;

// Needs g_lock for a moment, like sample code calling into a library.
void locked_sample(int64_t index, std::span<std::byte> out) {
  std::unique_lock lock(g_lock, std::defer_lock);
  if (!lock.try_lock_for(std::chrono::milliseconds(200)))
    throw std::runtime_error("inherited a lock held by a thread that does not exist in this process");
  std::memset(out.data(), static_cast<int>(index % 251), out.size());
}

void crashing_sample(int64_t index, std::span<std::byte> out) {
  if (index == 42) std::raise(SIGKILL);
  std::memset(out.data(), 0, out.size());
}

// A sample that takes a moment, so the consumer waits (and supervises) often.
void slow_sample(int64_t index, std::span<std::byte> out) {
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  std::memset(out.data(), static_cast<int>(index % 251), out.size());
}

std::unique_ptr<spindle::Zygote> g_zygote;

std::vector<std::vector<int64_t>> batches(int64_t n, int64_t size) { return spindle::testing::consecutive_batches(n, size); }

// Takes every batch `loader` delivers, checks that each sample starts with the
// byte locked_sample and slow_sample write (index % 251), and counts the samples
// in `seen` (an out parameter: ASSERT_* needs a void function).
void drain_checking_samples(spindle::Loader& loader, int64_t& seen) {
  seen = 0;
  while (auto batch = loader.next()) {
    for (std::size_t i = 0; i < batch->indices().size(); ++i)
      ASSERT_EQ(batch->data()[i * kSampleBytes], static_cast<std::byte>(batch->indices()[i] % 251));
    seen += static_cast<int64_t>(batch->indices().size());
  }
}

spindle::LoaderOptions options() {
  spindle::LoaderOptions o;
  o.num_workers = 2;
  o.batch_capacity = 16;
  o.slot_bytes = 16 * kSampleBytes;
  return o;
}

// Another thread holds g_lock for the duration of a test.
struct LockHolder {
  LockHolder() : t([this] {
    std::lock_guard lock(g_lock);
    held.store(true);
    while (!stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }) {
    while (!held.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~LockHolder() {
    stop.store(true);
    t.join();
  }
  std::atomic<bool> held{false}, stop{false};
  std::thread t;
};

// Proves: zygote workers start from the clean image, so a lock another thread
// holds at loader start is free in them and every batch arrives intact.
TEST(Zygote, WorkersDoNotInheritLocksHeldByOtherThreads) {
  LockHolder holder;
  spindle::Loader loader(options(), batches(200, 16), spindle::Launcher::zygote(*g_zygote, "locked"));
  int64_t seen = 0;
  ASSERT_NO_FATAL_FAILURE(drain_checking_samples(loader, seen));
  EXPECT_EQ(seen, 200);
  for (pid_t pid : loader.worker_pids()) EXPECT_NE(pid, 0);
}

// Proves the hazard the zygote exists for: a worker forked directly from this
// multithreaded process inherits g_lock held and cannot produce its batch.
TEST(Zygote, DirectForkInheritsTheHeldLock) {
  LockHolder holder;
  spindle::Loader loader(options(), batches(16, 16), spindle::Launcher::fork(spindle::sample_worker(locked_sample, kSampleBytes)));
  EXPECT_THROW(loader.next(), spindle::BatchFailedError);
}

// Proves: the death of a zygote-forked worker (not our child) is still
// reported within a second with its pid, signal and sample.
TEST(Zygote, DeathOfAZygoteWorkerIsReported) {
  spindle::Loader loader(options(), batches(200, 16), spindle::Launcher::zygote(*g_zygote, "crashing"));
  const auto start = std::chrono::steady_clock::now();
  try {
    while (loader.next()) {
    }
    FAIL() << "expected WorkerDiedError";
  } catch (const spindle::WorkerDiedError& e) {
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
    EXPECT_NE(std::strstr(e.what(), "killed by signal 9"), nullptr) << e.what();
    EXPECT_NE(std::strstr(e.what(), "sample index 42"), nullptr) << e.what();
  }
}

// Proves: two loaders on one zygote each get their own workers' exits: after
// kill -9 of a worker of loader A, A reports that worker's signal 9 while B,
// which polled the zygote in the meantime, delivers every batch untroubled.
TEST(Zygote, TwoLoadersOnOneZygoteEachGetTheirOwnWorkersExits) {
  spindle::Loader a(options(), batches(3200, 16), spindle::Launcher::zygote(*g_zygote, "slow"));
  spindle::Loader b(options(), batches(640, 16), spindle::Launcher::zygote(*g_zygote, "slow"));
  ASSERT_TRUE(a.next().has_value());
  const pid_t victim = a.worker_pids().at(0);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  // The zygote has reaped it (and sent its report) before B polls.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!(kill(victim, 0) != 0 && errno == ESRCH) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));

  int64_t seen = 0;
  ASSERT_NO_FATAL_FAILURE(drain_checking_samples(b, seen));
  EXPECT_EQ(seen, 640);

  std::string message;
  try {
    while (a.next()) {
    }
    FAIL() << "expected WorkerDiedError from loader A";
  } catch (const spindle::WorkerDiedError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("pid " + std::to_string(victim) + ") was killed by signal 9"), std::string::npos)
      << message;
  a.close();
  b.close();
}

// Proves: an unknown worker main is refused with its name.
TEST(Zygote, UnknownMainIsRefusedByName) {
  try {
    spindle::Loader loader(options(), batches(16, 16), spindle::Launcher::zygote(*g_zygote, "nope"));
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::strstr(e.what(), "'nope'"), nullptr) << e.what();
  }
}

// Proves: a zygote cannot be started once the process has several threads.
TEST(Zygote, RefusesToStartInAMultithreadedProcess) {
  LockHolder holder;
  EXPECT_THROW(spindle::Zygote({}), std::logic_error);
}

}  // namespace

int main(int argc, char** argv) {
  g_zygote = std::make_unique<spindle::Zygote>(std::map<std::string, spindle::WorkerMain>{
      {"locked", spindle::sample_worker(locked_sample, kSampleBytes)},
      {"crashing", spindle::sample_worker(crashing_sample, kSampleBytes)},
      {"slow", spindle::sample_worker(slow_sample, kSampleBytes)},
  });
  testing::InitGoogleTest(&argc, argv);
  int rc = RUN_ALL_TESTS();
  g_zygote.reset();
  return rc;
}
