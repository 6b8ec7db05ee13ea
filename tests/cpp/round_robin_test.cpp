// Round-robin (stream) mode: each worker produces its own stream of batches.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <vector>

#include <spindle/loader.hpp>

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
    spindle::Loader loader(options(3, prefetch), spindle::BatchPlan{}, stream_worker);
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

// Proves: a stream loader cannot be reset (its workers' streams cannot restart).
TEST(RoundRobin, ResetIsRefused) {
  spindle::Loader loader(options(2, 1), spindle::BatchPlan{}, stream_worker);
  EXPECT_THROW(loader.reset(spindle::BatchPlan{}), std::logic_error);
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
  spindle::Loader loader(o, plan, who);
  int64_t k = 0;
  while (auto b = loader.next()) {
    EXPECT_EQ(*reinterpret_cast<const int32_t*>(b->data().data()), k % 3) << "batch " << k;
    ++k;
  }
  EXPECT_EQ(k, 20);
}

}  // namespace
