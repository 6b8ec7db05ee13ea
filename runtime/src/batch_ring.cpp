#include <spindle/detail/batch_ring.hpp>

#include <new>
#include <stdexcept>

#include <spindle/error.hpp>

namespace spindle::detail {
namespace {

constexpr uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

struct Offsets {
  uint64_t queue, queue_stride, workers, slots, indices, descriptors, payload, stride, reserve, total;
};

Offsets offsets_for(const RingGeometry& g) {
  Offsets o{};
  o.queue = align_up(sizeof(RingHeader), kCacheLine);
  o.queue_stride = align_up(IndexQueue::bytes_for(g.num_slots), kCacheLine);
  o.workers = o.queue + o.queue_stride * (1 + static_cast<uint64_t>(g.num_workers));
  o.slots = align_up(o.workers + sizeof(WorkerRecord) * g.num_workers, kCacheLine);
  o.indices = align_up(o.slots + sizeof(SlotHeader) * g.num_slots, kCacheLine);
  o.descriptors = align_up(o.indices + sizeof(int64_t) * g.batch_capacity * g.num_slots, kCacheLine);
  o.payload = align_up(o.descriptors + kDescriptorBytes * g.num_slots, BatchRing::kPayloadAlign);
  o.reserve = align_up(std::max<uint64_t>(g.slot_bytes, BatchRing::kMinSlotStride), BatchRing::kPayloadAlign);
  o.stride = std::max(o.reserve, align_up(g.slot_window, BatchRing::kPayloadAlign));
  o.total = o.payload + o.stride * g.num_slots;
  return o;
}

}  // namespace

std::size_t BatchRing::bytes_for(const RingGeometry& g) noexcept { return offsets_for(g).total; }
std::size_t BatchRing::fixed_bytes_for(const RingGeometry& g) noexcept { return offsets_for(g).payload; }

BatchRing BatchRing::create(std::byte* mem, const RingGeometry& g) {
  if (g.num_slots == 0 || g.batch_capacity == 0)
    SPINDLE_THROW(std::invalid_argument, "spindle: a ring needs at least one slot and batch_capacity >= 1");
  const Offsets o = offsets_for(g);
  auto* h = new (mem) RingHeader();
  h->geometry = g;
  h->slot_stride = o.stride;
  h->slot_reserve = o.reserve;
  h->queue_offset = o.queue;
  h->queue_stride = o.queue_stride;
  h->workers_offset = o.workers;
  h->slots_offset = o.slots;
  h->indices_offset = o.indices;
  h->descriptors_offset = o.descriptors;
  h->payload_offset = o.payload;
  h->total_bytes = o.total;
  for (uint32_t q = 0; q <= g.num_workers; ++q) IndexQueue::create(mem + o.queue + q * o.queue_stride, g.num_slots);
  for (uint32_t w = 0; w < g.num_workers; ++w) new (mem + o.workers + w * sizeof(WorkerRecord)) WorkerRecord();
  for (uint32_t s = 0; s < g.num_slots; ++s) {
    auto* slot = new (mem + o.slots + s * sizeof(SlotHeader)) SlotHeader();
    slot->reserved = o.reserve;
    write_raw_descriptor(mem + o.descriptors + s * kDescriptorBytes);
  }
  return BatchRing(mem);
}

}  // namespace spindle::detail
