// BatchRing: the shared segment's layout (alignment, no overlap, header
// offsets), the slot state machine as WorkerContext drives it, and slots
// filled by concurrent worker threads while the consumer releases them.
#include <spindle/detail/batch_ring.hpp>
#include <spindle/loader.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "test_support.hpp"

namespace spindle {
using detail::SlotState;
using detail::SlotHeader;
using detail::WorkerRecord;
using detail::RingGeometry;
using detail::RingHeader;
using detail::BatchRing;
using detail::IndexQueue;
using detail::kCacheLine;
namespace {

using spindle::testing::SharedMapping;
using namespace std::chrono_literals;

// A ring in its own zeroed, page-aligned shared mapping.
struct TestRing {
  explicit TestRing(const RingGeometry& g) : map(BatchRing::bytes_for(g)), ring(BatchRing::create(map.data(), g)) {}
  SharedMapping map;
  BatchRing ring;
};

struct Region {
  const char* name;
  uint64_t begin, end;
};

class BatchRingLayout : public ::testing::TestWithParam<RingGeometry> {};

// Proves: regions 64-byte aligned, payloads page-aligned, in order, disjoint, all within bytes_for.
TEST_P(BatchRingLayout, RegionsAreAlignedOrderedDisjointAndCovered) {
  const RingGeometry g = GetParam();
  TestRing t(g);
  const RingHeader& h = t.ring.header();
  const std::size_t total = BatchRing::bytes_for(g);

  EXPECT_EQ(h.magic, RingHeader::kMagic);
  EXPECT_EQ(h.total_bytes, total);
  EXPECT_EQ(h.geometry.num_slots, g.num_slots);
  EXPECT_EQ(h.geometry.num_workers, g.num_workers);
  EXPECT_EQ(h.geometry.batch_capacity, g.batch_capacity);
  EXPECT_EQ(h.geometry.slot_bytes, g.slot_bytes);
  // Stride: the payload rounded up to a page, and at least kMinSlotStride (room
  // for an error report).
  const uint64_t min_stride = std::max<uint64_t>(g.slot_bytes, BatchRing::kMinSlotStride);
  EXPECT_GE(h.slot_stride, min_stride);
  EXPECT_EQ(h.slot_stride % BatchRing::kPayloadAlign, 0u);
  EXPECT_LT(h.slot_stride, min_stride + BatchRing::kPayloadAlign) << "stride over-padded";
  EXPECT_EQ(t.ring.report_capacity(), h.slot_stride);
  EXPECT_EQ(h.slot_reserve, h.slot_stride) << "with no slot_window, a slot is what it reserves up front";

  const std::vector<Region> regions = {
      {"header", 0, sizeof(RingHeader)},
      {"queue", h.queue_offset, h.queue_offset + IndexQueue::bytes_for(g.num_slots)},
      {"workers", h.workers_offset, h.workers_offset + sizeof(WorkerRecord) * g.num_workers},
      {"slots", h.slots_offset, h.slots_offset + sizeof(SlotHeader) * g.num_slots},
      {"indices", h.indices_offset,
       h.indices_offset + sizeof(int64_t) * uint64_t{g.batch_capacity} * g.num_slots},
      {"descriptors", h.descriptors_offset, h.descriptors_offset + kDescriptorBytes * g.num_slots},
      {"payload", h.payload_offset, h.payload_offset + h.slot_stride * g.num_slots},
  };
  for (std::size_t i = 0; i < regions.size(); ++i) {
    const Region& r = regions[i];
    EXPECT_EQ(r.begin % kCacheLine, 0u) << r.name << " is not on a cache line";
    EXPECT_LE(r.end, total) << r.name << " ends beyond bytes_for";
    if (i > 0) {
      EXPECT_GE(r.begin, regions[i - 1].end) << r.name << " overlaps " << regions[i - 1].name;
    }
  }
  EXPECT_EQ(h.payload_offset % BatchRing::kPayloadAlign, 0u);
  EXPECT_EQ(regions.back().end, total) << "bytes_for should end at the last payload byte";

  // The accessors point into those regions, with the base address page-aligned.
  ASSERT_EQ(reinterpret_cast<uintptr_t>(t.map.data()) % BatchRing::kPayloadAlign, 0u);
  for (uint32_t s = 0; s < g.num_slots; ++s) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.ring.payload(s)) % BatchRing::kPayloadAlign, 0u) << "slot " << s;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(&t.ring.slot(s)) % kCacheLine, 0u) << "slot " << s;
    EXPECT_EQ(t.ring.payload_span(s).size(), h.slot_reserve);
    EXPECT_EQ(t.ring.descriptor(s), t.map.data() + h.descriptors_offset + kDescriptorBytes * s);
    EXPECT_EQ(reinterpret_cast<std::byte*>(t.ring.indices(s)),
              t.map.data() + h.indices_offset + sizeof(int64_t) * g.batch_capacity * s);
    EXPECT_EQ(t.ring.state(s), SlotState::kFree);
    EXPECT_EQ(t.ring.slot(s).worker, -1);
    EXPECT_EQ(t.ring.slot(s).batch_id, -1);
  }
  for (uint32_t w = 0; w < g.num_workers; ++w) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(&t.ring.worker(w)) % kCacheLine, 0u) << "worker " << w;
    EXPECT_EQ(t.ring.worker(w).slot.load(), -1);
    EXPECT_EQ(t.ring.worker(w).batch_id.load(), -1);
    EXPECT_EQ(t.ring.worker(w).sample_index.load(), -1);
  }
  EXPECT_EQ(t.ring.queue().capacity(), g.num_slots);
  EXPECT_EQ(t.ring.queue().outstanding(), 0u);

  // Writing every payload byte of every slot must not disturb any metadata.
  for (uint32_t s = 0; s < g.num_slots; ++s)
    std::memset(t.ring.payload(s), 0xAB, h.slot_stride);
  EXPECT_EQ(h.magic, RingHeader::kMagic);
  for (uint32_t s = 0; s < g.num_slots; ++s) EXPECT_EQ(t.ring.slot(s).batch_id, -1);
}

INSTANTIATE_TEST_SUITE_P(Geometries, BatchRingLayout,
                         ::testing::Values(RingGeometry{1, 1, 1, 1}, RingGeometry{3, 2, 5, 4095},
                                           RingGeometry{4, 0, 7, 4096}, RingGeometry{6, 3, 256, 4097},
                                           RingGeometry{17, 7, 33, 12288}, RingGeometry{5, 2, 3, 65537},
                                           RingGeometry{10, 8, 256, 1 << 20}),
                         [](const ::testing::TestParamInfo<RingGeometry>& info) {
                           const RingGeometry& g = info.param;
                           return "slots" + std::to_string(g.num_slots) + "_workers" + std::to_string(g.num_workers) +
                                  "_cap" + std::to_string(g.batch_capacity) + "_bytes" + std::to_string(g.slot_bytes);
                         });

// Proves: slot headers, worker records and the `completed` counter each own a full cache line.
TEST(BatchRingLayoutStatic, SharedFieldsOwnTheirCacheLines) {
  EXPECT_EQ(alignof(SlotHeader), kCacheLine);
  EXPECT_EQ(sizeof(SlotHeader) % kCacheLine, 0u);
  EXPECT_EQ(alignof(WorkerRecord), kCacheLine);
  EXPECT_EQ(sizeof(WorkerRecord) % kCacheLine, 0u);
  EXPECT_EQ(offsetof(RingHeader, completed) % kCacheLine, 0u);
  EXPECT_GE(offsetof(RingHeader, completed), offsetof(RingHeader, total_bytes) + sizeof(uint64_t));
  EXPECT_EQ(sizeof(IndexQueue) % kCacheLine, 0u);
}

// Proves: a worker's view of the same bytes finds the geometry and offsets the consumer wrote.
TEST(BatchRingLayoutStatic, ViewOfExistingBytesReadsTheHeader) {
  const RingGeometry g{5, 2, 9, 1000};
  TestRing t(g);
  BatchRing view(t.map.data());
  EXPECT_EQ(view.geometry().num_slots, 5u);
  EXPECT_EQ(view.geometry().batch_capacity, 9u);
  EXPECT_EQ(view.payload(4), t.ring.payload(4));
  EXPECT_EQ(&view.queue(), &t.ring.queue());
  EXPECT_EQ(&view.worker(1), &t.ring.worker(1));
}

// Proves: create() rejects a geometry with no slots or no batch capacity.
TEST(BatchRingLayoutStatic, CreateRejectsEmptyGeometry) {
  SharedMapping map(1 << 16);
  EXPECT_THROW(BatchRing::create(map.data(), RingGeometry{0, 1, 1, 64}), std::invalid_argument);
  EXPECT_THROW(BatchRing::create(map.data(), RingGeometry{2, 1, 0, 64}), std::invalid_argument);
}

// The consumer's half of posting a batch: metadata, then kPosted, then the queue.
void post_batch(const BatchRing& r, uint32_t s, int64_t batch_id, const std::vector<int64_t>& idx) {
  SlotHeader& h = r.slot(s);
  h.batch_id = batch_id;
  h.count = static_cast<uint32_t>(idx.size());
  h.worker = -1;
  h.error_bytes = 0;
  std::copy(idx.begin(), idx.end(), r.indices(s));
  r.set_state(s, SlotState::kPosted);
  r.queue().post(s);
}

// Proves: WorkerContext walks a slot kFree->kPosted->kFilling->kReady and keeps its record in step.
TEST(BatchRingStateMachine, ClaimFillCommitWalksTheSlotThroughItsStates) {
  TestRing t(RingGeometry{2, 2, 4, 64});
  const BatchRing& r = t.ring;
  post_batch(r, 1, 42, {7, 8, 9});
  EXPECT_EQ(r.state(1), SlotState::kPosted);

  WorkerContext ctx(r, 1, getppid());
  auto item = ctx.claim();
  ASSERT_TRUE(item.has_value());
  EXPECT_EQ(item->slot, 1u);
  EXPECT_EQ(item->batch_id, 42);
  EXPECT_EQ(std::vector<int64_t>(item->indices.begin(), item->indices.end()), (std::vector<int64_t>{7, 8, 9}));
  EXPECT_EQ(item->out.data(), r.payload(1));
  EXPECT_EQ(item->out.size(), BatchRing::kMinSlotStride) << "every slot starts with the minimum reserved";
  EXPECT_EQ(r.state(1), SlotState::kFilling);
  EXPECT_EQ(r.slot(1).worker, 1);
  EXPECT_EQ(r.worker(1).slot.load(), 1);
  EXPECT_EQ(r.worker(1).batch_id.load(), 42);

  ctx.set_sample(8);
  EXPECT_EQ(r.worker(1).sample_index.load(), 8);
  const uint32_t completed = r.header().completed.load();
  ctx.commit(*item);
  EXPECT_EQ(r.state(1), SlotState::kReady);
  EXPECT_EQ(r.header().completed.load(), completed + 1);
  EXPECT_EQ(r.worker(1).slot.load(), -1);
  EXPECT_EQ(r.worker(1).batch_id.load(), -1);
  EXPECT_EQ(r.worker(1).sample_index.load(), -1);
  EXPECT_EQ(r.state(0), SlotState::kFree) << "the other slot must be untouched";
}

// Proves: kFilling->kFailed carries the whole report up to report_capacity(), even past slot_bytes.
TEST(BatchRingStateMachine, FailPublishesTheReportUpToTheReportCapacity) {
  TestRing t(RingGeometry{1, 1, 1, 16});
  const BatchRing& r = t.ring;
  WorkerContext ctx(r, 0, getppid());
  auto report_in_slot = [&] {
    return std::string(reinterpret_cast<const char*>(r.payload(0)), r.slot(0).error_bytes);
  };

  post_batch(r, 0, 3, {11});
  auto item = ctx.claim();
  ASSERT_TRUE(item.has_value());
  const uint32_t completed = r.header().completed.load();
  ctx.fail(*item, "short");
  EXPECT_EQ(r.state(0), SlotState::kFailed);
  EXPECT_EQ(r.header().completed.load(), completed + 1);
  EXPECT_EQ(report_in_slot(), "short");
  EXPECT_EQ(r.worker(0).slot.load(), -1) << "a failed worker is idle again";

  r.set_state(0, SlotState::kFree);  // kFailed -> kFree: the consumer raised the error
  post_batch(r, 0, 4, {12});
  item = ctx.claim();
  ASSERT_TRUE(item.has_value());
  const std::string traceback(1000, 't');  // far beyond slot_bytes = 16
  ctx.fail(*item, traceback);
  EXPECT_EQ(report_in_slot(), traceback) << "a report that fits the stride must arrive whole";

  r.set_state(0, SlotState::kFree);
  post_batch(r, 0, 5, {13});
  item = ctx.claim();
  ASSERT_TRUE(item.has_value());
  const std::string huge(r.report_capacity() + 100, 'h');
  ctx.fail(*item, huge);
  EXPECT_EQ(r.slot(0).error_bytes, r.report_capacity());
  EXPECT_EQ(report_in_slot(), huge.substr(0, r.report_capacity()));
}

// Proves: claim() returns nullopt once the queue is closed, so workers exit.
TEST(BatchRingStateMachine, ClaimReturnsNothingOnceClosed) {
  TestRing t(RingGeometry{2, 1, 1, 8});
  t.ring.queue().close();
  WorkerContext ctx(t.ring, 0, getppid());
  EXPECT_FALSE(ctx.claim().has_value());
}

// Bytes a test worker writes for sample `index` of batch `batch`.
std::byte pattern(int64_t batch, int64_t index, std::size_t j) {
  return static_cast<std::byte>((batch * 31 + index * 7 + static_cast<int64_t>(j)) & 0xff);
}

// Proves: with racing worker threads, every batch is produced once, intact, through legal states only.
TEST(BatchRingConcurrency, WorkerThreadsFillSlotsWhileConsumerReleasesThem) {
  constexpr uint32_t kSlots = 4, kWorkers = 3, kCap = 4, kBytes = 256;
  constexpr int64_t kBatches = 4000;
  TestRing t(RingGeometry{kSlots, kWorkers, kCap, kBytes});
  const BatchRing& r = t.ring;

  std::atomic<uint32_t> bad_claims{0};  // a claimed slot not kFilling and marked ours
  std::vector<std::thread> workers;
  for (uint32_t w = 0; w < kWorkers; ++w) {
    workers.emplace_back([&, w] {
      // This thread's parent process stands in for the consumer process.
      WorkerContext ctx(r, static_cast<int>(w), getppid());
      while (auto item = ctx.claim()) {
        if (r.state(item->slot) != SlotState::kFilling || r.slot(item->slot).worker != static_cast<int32_t>(w))
          bad_claims.fetch_add(1);
        for (std::size_t i = 0; i < item->indices.size(); ++i) {
          ctx.set_sample(item->indices[i]);
          const std::size_t per = kBytes / kCap;
          for (std::size_t j = 0; j < per; ++j)
            item->out[i * per + j] = pattern(item->batch_id, item->indices[i], j);
        }
        if (item->batch_id % 97 == 5) ctx.fail(*item, "batch " + std::to_string(item->batch_id));
        else ctx.commit(*item);
      }
    });
  }

  std::vector<int> delivered(kBatches, 0);
  std::vector<uint32_t> inflight;  // slots posted, in batch order
  int64_t next_post = 0, errors = 0, corrupt = 0, wrong_state = 0;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (std::count(delivered.begin(), delivered.end(), 1) + errors < kBatches &&
         std::chrono::steady_clock::now() < deadline) {
    // Post into every free slot.
    for (uint32_t s = 0; s < kSlots && next_post < kBatches; ++s) {
      if (r.state(s) != SlotState::kFree) continue;
      std::vector<int64_t> idx;
      for (uint32_t i = 0; i < 1 + next_post % kCap; ++i) idx.push_back(next_post * 10 + i);
      post_batch(r, s, next_post++, idx);
      inflight.push_back(s);
    }
    // Deliver whatever finished, in any order, then release it.
    const uint32_t seq = r.header().completed.load(std::memory_order_acquire);
    bool any = false;
    for (std::size_t k = 0; k < inflight.size();) {
      const uint32_t s = inflight[k];
      const SlotState st = r.state(s);
      if (st != SlotState::kReady && st != SlotState::kFailed) {
        if (st != SlotState::kPosted && st != SlotState::kFilling) ++wrong_state;
        ++k;
        continue;
      }
      const SlotHeader& h = r.slot(s);
      if (st == SlotState::kFailed) {
        const std::string report(reinterpret_cast<const char*>(r.payload(s)), h.error_bytes);
        if (report != "batch " + std::to_string(h.batch_id)) ++corrupt;
        ++errors;
      } else {
        r.set_state(s, SlotState::kLeased);
        const std::size_t per = kBytes / kCap;
        for (uint32_t i = 0; i < h.count; ++i)
          for (std::size_t j = 0; j < per; ++j)
            if (r.payload(s)[i * per + j] != pattern(h.batch_id, r.indices(s)[i], j)) ++corrupt;
        ++delivered[static_cast<std::size_t>(h.batch_id)];
      }
      r.set_state(s, SlotState::kFree);
      inflight.erase(inflight.begin() + static_cast<std::ptrdiff_t>(k));
      any = true;
    }
    if (!any) detail::futex_wait(&r.header().completed, seq, 10ms);
  }
  r.queue().close();
  for (auto& w : workers) w.join();

  EXPECT_EQ(next_post, kBatches);
  int64_t failed_on_purpose = 0;
  for (int64_t b = 0; b < kBatches; ++b) failed_on_purpose += b % 97 == 5;
  EXPECT_EQ(errors, failed_on_purpose) << "batches failed on purpose (id % 97 == 5)";
  EXPECT_EQ(corrupt, 0) << "payload bytes or error reports that differ from what the worker wrote";
  EXPECT_EQ(wrong_state, 0) << "in-flight slots seen outside kPosted/kFilling/kReady/kFailed";
  EXPECT_EQ(bad_claims.load(), 0u);
  for (int64_t b = 0; b < kBatches; ++b) {
    const int expect = b % 97 == 5 ? 0 : 1;
    ASSERT_EQ(delivered[static_cast<std::size_t>(b)], expect) << "batch " << b;
  }
}

}  // namespace
}  // namespace spindle
