// Typed failures: the fields a WorkerDiedError carries for each way a worker
// dies, InternalError (spindle's own bugs) against user-facing errors, the
// failure kind and path/key in a failed slot's record, and max_skip_ratio
// enforced by the Loader for native pipelines in processes and on threads.
#include <spindle/error.hpp>
#include <spindle/loader.hpp>
#include <spindle/pipeline.hpp>
#include <spindle/sources.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <atomic>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_support.hpp"

namespace spindle {
namespace {

using spindle::testing::SharedMapping;
using spindle::testing::spindle_shm_names;
using spindle::testing::TempDir;
using spindle::testing::write_file;

constexpr uint64_t kSampleBytes = 64;
constexpr int64_t kFatal = 77;  // the sample whose worker dies

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::vector<std::vector<int64_t>> batches_of(int64_t n, int64_t batch) { return testing::consecutive_batches(n, batch); }

LoaderOptions two_workers() {
  LoaderOptions o;
  o.num_workers = 2;
  o.batch_capacity = 10;
  o.slot_bytes = kSampleBytes * 10;
  return o;
}

// Runs a loader whose worker meets `die` at sample kFatal (after noting its
// pid), and returns the WorkerDiedError it raises and the dead worker's pid.
template <class Die>
std::pair<WorkerDiedError, pid_t> death_of_a_worker(Die die) {
  SharedMapping note(sizeof(std::atomic<int32_t>));
  auto* pid = new (note.data()) std::atomic<int32_t>(0);
  Loader loader(two_workers(), batches_of(200, 10), Launcher::fork(sample_worker([pid, die](int64_t i, std::span<std::byte> out) {
    if (i == kFatal) {
      pid->store(getpid());
      die();
    }
    std::fill(out.begin(), out.end(), std::byte{1});
  }, kSampleBytes)));
  try {
    while (loader.next()) {
    }
  } catch (const WorkerDiedError& e) {
    // A broken loader raises the same death again, fields and all.
    try {
      (void)loader.next();
      ADD_FAILURE() << "a broken loader stays broken";
    } catch (const WorkerDiedError& again) {
      EXPECT_EQ(again.pid, e.pid);
      EXPECT_EQ(again.signal, e.signal);
      EXPECT_EQ(again.exitcode, e.exitcode);
      EXPECT_EQ(again.sample, e.sample);
    }
    return {e, pid->load()};
  }
  ADD_FAILURE() << "iteration ended without WorkerDiedError";
  return {WorkerDiedError("none"), 0};
}

// The fields every death names: who, and what it was doing.
void expect_who_and_where(const WorkerDiedError& e, pid_t pid) {
  ASSERT_NE(pid, 0) << "the worker never reached the fatal sample";
  EXPECT_EQ(e.pid, pid);
  EXPECT_TRUE(e.worker == 0 || e.worker == 1) << e.worker;
  EXPECT_EQ(e.sample, std::optional<int64_t>(kFatal));
  EXPECT_EQ(e.batch, std::optional<int64_t>(kFatal / 10));
  EXPECT_TRUE(spindle_shm_names(getpid()).empty());
}

// Proves: a worker that SIGKILLs itself raises WorkerDiedError with signal 9, no exit code, its pid, worker, sample and batch.
TEST(TypedErrors, SigkilledWorkerSetsSignalPidSampleAndBatch) {
  auto [e, pid] = death_of_a_worker([] { raise(SIGKILL); });
  EXPECT_EQ(e.signal, std::optional<int>(SIGKILL));
  EXPECT_FALSE(e.exitcode.has_value());
  expect_who_and_where(e, pid);
  EXPECT_TRUE(contains(e.what(), "signal 9")) << e.what();
}

// Proves: a worker that segfaults raises WorkerDiedError with signal 11 and no exit code.
TEST(TypedErrors, SegfaultingWorkerSetsSignal11) {
  auto [e, pid] = death_of_a_worker([] {
    const rlimit no_core{0, 0};
    setrlimit(RLIMIT_CORE, &no_core);  // no core file for a test's crash
    // The default action, not a sanitizer's SEGV handler (ASan reports and exits with 1).
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGSEGV, &dfl, nullptr);
    raise(SIGSEGV);
  });
  EXPECT_EQ(e.signal, std::optional<int>(SIGSEGV));
  EXPECT_FALSE(e.exitcode.has_value());
  expect_who_and_where(e, pid);
}

// Proves: a worker that calls exit(3) raises WorkerDiedError with exitcode 3 and no signal.
TEST(TypedErrors, ExitingWorkerSetsExitcode) {
  auto [e, pid] = death_of_a_worker([] { _exit(3); });
  EXPECT_EQ(e.exitcode, std::optional<int>(3));
  EXPECT_FALSE(e.signal.has_value());
  expect_who_and_where(e, pid);
  EXPECT_TRUE(contains(e.what(), "exited with code 3")) << e.what();
}

// Proves: InternalError is a std::logic_error whose text says it is spindle's bug and where; user errors carry no location.
TEST(TypedErrors, InternalErrorCarriesTheSourceLocationAndUserErrorsDoNot) {
  try {
    SPINDLE_FAIL_INTERNAL("spindle: a state that cannot happen");
  } catch (const std::logic_error& e) {
    EXPECT_NE(dynamic_cast<const InternalError*>(&e), nullptr);
    EXPECT_TRUE(contains(e.what(), "bug in spindle")) << e.what();
    EXPECT_TRUE(contains(e.what(), "typed_errors_test.cpp:")) << e.what();
  }
  LoaderOptions none;
  none.num_workers = 0;
  try {
    Loader loader(none, batches_of(10, 10), Launcher::fork(sample_worker([](int64_t, std::span<std::byte>) {}, kSampleBytes)));
    FAIL() << "num_workers=0 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "num_workers >= 1")) << e.what();
    EXPECT_FALSE(contains(e.what(), ".cpp:")) << "a user-facing error names a source line: " << e.what();
  }
}

// Proves: a failed slot's record carries the failure kind, path and key to BatchFailedError without parsing its text.
TEST(TypedErrors, FailedBatchCarriesKindPathAndKey) {
  Loader loader(two_workers(), batches_of(10, 10), Launcher::fork([](WorkerContext& ctx) {
    while (auto item = ctx.claim())
      ctx.fail(*item, "spindle: cannot decode shard-7.tar:0042", FailureKind::kDecode, "shard-7.tar", "0042");
    return 0;
  }));
  try {
    (void)loader.next();
    FAIL() << "no BatchFailedError";
  } catch (const BatchFailedError& e) {
    EXPECT_EQ(e.kind, FailureKind::kDecode);
    EXPECT_EQ(e.path, "shard-7.tar");
    EXPECT_EQ(e.key, "0042");
    EXPECT_EQ(e.payload, "spindle: cannot decode shard-7.tar:0042");
    EXPECT_EQ(std::string(failure_kind_name(e.kind)), "decode");
  }
}

// Proves: a corrupt tar shard's DataError names the shard in its path field, not only in its text.
TEST(TypedErrors, CorruptShardDataErrorCarriesItsPath) {
  TempDir dir;
  const auto shard = (dir.path() / "bad.tar").string();
  write_file(shard, std::string(1024, 'x'));  // two 512-byte "headers" of garbage: a bad checksum
  try {
    TarReader tar(shard);
    while (tar.next()) {
    }
    FAIL() << "a garbage shard read cleanly";
  } catch (const DataError& e) {
    EXPECT_EQ(e.path, shard);
    EXPECT_TRUE(e.key.empty());
    EXPECT_TRUE(contains(e.what(), "corrupt tar shard")) << e.what();
  }
}

// A 2x2 RGB PNG (written by PIL).
const std::string kPng(
    "\x89\x50\x4e\x47\x0d\x0a\x1a\x0a\x00\x00\x00\x0d\x49\x48\x44\x52\x00\x00\x00\x02\x00\x00\x00\x02\x08\x02\x00"
    "\x00\x00\xfd\xd4\x9a\x73\x00\x00\x00\x16\x49\x44\x41\x54\x78\x9c\x63\xe4\x3a\x21\xc7\xc0\xc0\xc0\xc4\xc0\xc0"
    "\xc0\xc0\xc0\x00\x00\x0b\x56\x00\xf4\x23\x88\x6a\x9b\x00\x00\x00\x00\x49\x45\x4e\x44\xae\x42\x60\x82",
    79);

// An image folder of 50 files, 5 of them not images; a pipeline that skips them.
struct BrokenFolder {
  TempDir dir;
  std::shared_ptr<const Pipeline> pipe;
  explicit BrokenFolder(double max_ratio) {
    for (int i = 0; i < 50; ++i) {
      char name[16];
      std::snprintf(name, sizeof name, "%02d.png", i);
      write_file(dir.path() / "cls" / name, i % 10 == 3 ? std::string("not a png") : kPng);
    }
    PipelineOptions o;
    o.image_folder = dir.path().string();
    o.stages = {stages::decode(), stages::center_crop({2, 2})};
    o.on_error = PipelineOptions::OnError::kSkip;
    o.max_skip_ratio = max_ratio;
    pipe = std::make_shared<const Pipeline>(o);
  }
  // What a C++ user sets; make_pipeline_loader adds slot_bytes and the skip ratio.
  LoaderOptions options() const {
    LoaderOptions o;
    o.num_workers = 2;
    o.batch_capacity = 10;
    return o;
  }
};

std::vector<int64_t> all_of(std::size_t n) {
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  return order;
}

// Runs one epoch; returns the samples skipped by the batches' own count, or
// rethrows what the loader raised.
uint64_t run_epoch(const BrokenFolder& f, bool threads) {
  std::unique_ptr<Loader> loader =
      make_pipeline_loader(f.pipe, PipelineEpoch{.order = all_of(f.pipe->size())}, f.options(),
                           threads ? PipelineMode::kThreads : PipelineMode::kProcesses);
  uint64_t skipped = 0;
  while (auto b = loader->next()) skipped += b->skipped();
  return skipped;
}

void expect_skip_ratio_enforced(bool threads) {
  const BrokenFolder lenient(0.5);
  EXPECT_EQ(run_epoch(lenient, threads), 5u) << "each bad file is counted in its batch's own field";
  const BrokenFolder strict(0.01);
  try {
    (void)run_epoch(strict, threads);
    FAIL() << "5 of 50 skipped with max_skip_ratio=0.01 raised nothing";
  } catch (const SkipRatioError& e) {
    EXPECT_EQ(e.skipped, 5u);
    EXPECT_EQ(e.samples, 50u);
    EXPECT_DOUBLE_EQ(e.max_ratio, 0.01);
    EXPECT_TRUE(contains(e.what(), "5 of 50 samples could not be read")) << e.what();
  }
  EXPECT_TRUE(spindle_shm_names(getpid()).empty());
}

// Proves: make_pipeline_loader wires on_error=kSkip's max_skip_ratio into the Loader, which enforces it on
// the skip counts of forked workers (the caller's LoaderOptions name no ratio).
TEST(TypedErrors, SkipRatioIsEnforcedForProcesses) { expect_skip_ratio_enforced(false); }

// Proves: make_pipeline_loader wires on_error=kSkip's max_skip_ratio into the Loader, which enforces it on
// the skip counts of arena threads (the caller's LoaderOptions name no ratio).
TEST(TypedErrors, SkipRatioIsEnforcedForThreads) { expect_skip_ratio_enforced(true); }

// Proves: with on_error=kRaise make_pipeline_loader sets no ratio check (a ratio left in the caller's
// options is not the pipeline's), and the first bad file fails its batch naming the file.
TEST(TypedErrors, RaisingPipelineLoaderHasNoSkipRatio) {
  TempDir dir;
  for (int i = 0; i < 4; ++i) write_file(dir.path() / "cls" / (std::to_string(i) + ".png"), i == 2 ? "not a png" : kPng);
  PipelineOptions po;
  po.image_folder = dir.path().string();
  po.stages = {stages::decode(), stages::center_crop({2, 2})};
  auto pipe = std::make_shared<const Pipeline>(po);
  LoaderOptions o;
  o.batch_capacity = 2;
  o.max_skip_ratio = 0.5;
  auto loader = make_pipeline_loader(pipe, PipelineEpoch{.order = all_of(4)}, o, PipelineMode::kThreads);
  try {
    while (loader->next()) {
    }
    FAIL() << "a file that is not an image raised nothing with on_error=kRaise";
  } catch (const BatchFailedError& e) {
    EXPECT_TRUE(contains(e.what(), "2.png")) << e.what();
  }
}

}  // namespace
}  // namespace spindle
