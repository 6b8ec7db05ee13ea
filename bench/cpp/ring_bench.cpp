// Ring handoff benchmarks.
//
//   BM_QueueThroughput<Capacity>  one producer posts, N-1 claimer threads claim
//                                 (ThreadRange: thread 0 posts, the rest claim);
//                                 items/s through a queue of Capacity entries.
//   BM_QueuePingPong<Waiter>      post -> claim -> reply round trip between two
//                                 threads; Waiter spins or sleeps on the futex.
//   BM_LoaderEpoch                Loader + sample_worker end to end: one epoch of
//                                 64x64x3 uint8 samples in batches of 256, per
//                                 worker count; bytes/s and samples/s.
//
// Queues live in a MAP_SHARED anonymous mapping, as in the loader's segment.
// Read items_per_second (and bytes_per_second): with ThreadRange the Time
// column is divided by the iterations of all threads, producer included.
#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>

#include <spindle/detail/index_queue.hpp>
#include <spindle/loader.hpp>

namespace {

using namespace std::chrono_literals;

// A queue in its own shared anonymous mapping.
class SharedQueue {
 public:
  explicit SharedQueue(uint32_t capacity) : bytes_(spindle::detail::IndexQueue::bytes_for(capacity)) {
    mem_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mem_ == MAP_FAILED) throw std::runtime_error("mmap failed");
    queue_ = spindle::detail::IndexQueue::create(mem_, capacity);
  }
  ~SharedQueue() { munmap(mem_, bytes_); }
  SharedQueue(const SharedQueue&) = delete;
  SharedQueue& operator=(const SharedQueue&) = delete;
  spindle::detail::IndexQueue& operator*() const { return *queue_; }
  spindle::detail::IndexQueue* operator->() const { return queue_; }

 private:
  std::size_t bytes_;
  void* mem_;
  spindle::detail::IndexQueue* queue_;
};

// Claims one item, sleeping on the futex while the queue is empty (a worker's way).
uint32_t claim_one(spindle::detail::IndexQueue& q) {
  for (;;) {
    if (auto item = q.try_claim()) return *item;
    q.wait(10ms);
  }
}

// Posts one item, yielding while the queue is full (the consumer's flow control
// guarantees room; a benchmark producer has to wait for it).
void post_one(spindle::detail::IndexQueue& q, uint32_t item) {
  while (q.outstanding() >= q.capacity()) std::this_thread::yield();
  q.post(item);
}

// Shared by the threads of one BM_QueueThroughput run; set up by thread 0
// before the start barrier, torn down by it after the stop barrier.
SharedQueue* g_queue = nullptr;

template <uint32_t Capacity>
void BM_QueueThroughput(benchmark::State& state) {
  const int claimers = state.threads() - 1;
  if (state.thread_index() == 0) g_queue = new SharedQueue(Capacity);
  if (state.thread_index() == 0) {
    // Producer: one item per claimer per iteration, so totals match exactly.
    uint32_t n = 0;
    for (auto _ : state)
      for (int c = 0; c < claimers; ++c) post_one(**g_queue, n++);
    state.SetItemsProcessed(state.iterations() * claimers);
  } else {
    for (auto _ : state) benchmark::DoNotOptimize(claim_one(**g_queue));
  }
  if (state.thread_index() == 0) {
    delete g_queue;
    g_queue = nullptr;
  }
}
BENCHMARK_TEMPLATE(BM_QueueThroughput, 4)->ThreadRange(2, 4)->UseRealTime()->MinTime(0.2);
BENCHMARK_TEMPLATE(BM_QueueThroughput, 64)->ThreadRange(2, 4)->UseRealTime()->MinTime(0.2);

struct SpinWaiter {
  static uint32_t claim(spindle::detail::IndexQueue& q) {
    for (;;) {
      if (auto item = q.try_claim()) return *item;
      std::this_thread::yield();
    }
  }
};
struct FutexWaiter {
  static uint32_t claim(spindle::detail::IndexQueue& q) { return claim_one(q); }
};

// Round trip: the benchmark thread posts to `request`, an echo thread claims it
// and posts it back on `reply`. Half of it is the one-way handoff latency.
template <class Waiter>
void BM_QueuePingPong(benchmark::State& state) {
  SharedQueue request(4), reply(4);
  std::thread echo([&] {
    for (;;) {
      const uint32_t item = Waiter::claim(*request);
      if (item == UINT32_MAX) return;
      reply->post(item);
    }
  });
  uint32_t n = 0;
  for (auto _ : state) {
    request->post(n);
    if (Waiter::claim(*reply) != n) {
      state.SkipWithError("echo returned the wrong item");
      break;
    }
    ++n;
  }
  request->post(UINT32_MAX);
  echo.join();
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK_TEMPLATE(BM_QueuePingPong, SpinWaiter)->UseRealTime()->MinTime(0.2);
BENCHMARK_TEMPLATE(BM_QueuePingPong, FutexWaiter)->UseRealTime()->MinTime(0.2);

constexpr uint64_t kSampleBytes = 64 * 64 * 3;
constexpr uint32_t kBatch = 256;
constexpr int64_t kSamplesPerEpoch = 64 * kBatch;

// One epoch per iteration: the loader is built (workers forked), every batch
// delivered and touched, and the loader closed.
void BM_LoaderEpoch(benchmark::State& state) {
  std::vector<std::vector<int64_t>> batches;
  for (int64_t i = 0; i < kSamplesPerEpoch; i += kBatch) {
    batches.emplace_back();
    for (int64_t j = i; j < i + kBatch; ++j) batches.back().push_back(j);
  }
  spindle::LoaderOptions opt;
  opt.num_workers = static_cast<int>(state.range(0));
  opt.batch_capacity = kBatch;
  opt.slot_bytes = kSampleBytes * kBatch;
  auto make_image = [](int64_t index, std::span<std::byte> out) {
    std::memset(out.data(), static_cast<int>(index % 251), out.size());
  };
  for (auto _ : state) {
    spindle::Loader loader(opt, batches, spindle::Launcher::fork(spindle::sample_worker(make_image, kSampleBytes)));
    while (auto b = loader.next()) {
      const auto expect = static_cast<std::byte>(b->indices().back() % 251);
      if (b->data()[(b->indices().size()) * kSampleBytes - 1] != expect) {
        state.SkipWithError("corrupt batch");
        break;
      }
      benchmark::DoNotOptimize(b->data().data());
    }
  }
  state.SetItemsProcessed(state.iterations() * kSamplesPerEpoch);
  state.SetBytesProcessed(state.iterations() * kSamplesPerEpoch * static_cast<int64_t>(kSampleBytes));
}
BENCHMARK(BM_LoaderEpoch)->ArgName("workers")->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);

}  // namespace
