#include <spindle/payload_parts.hpp>

#include <cstring>
#include <stdexcept>
#include <string>

#include <spindle/error.hpp>
#include <spindle/detail/batch_ring.hpp>
#include <spindle/ring_copy.hpp>
#include <spindle/slot_layout.hpp>

namespace spindle {
namespace {

uint64_t align_up(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

}  // namespace

std::span<std::byte> PartsWriter::allocate(uint64_t bytes) {
  const uint64_t at = align_up(used_, kPartAlign);
  std::span<std::byte> out = ctx_.reserve(item_, at + bytes);
  used_ = at + bytes;
  return out.subspan(at, bytes);
}

std::span<std::byte> PartsWriter::gather(std::span<const std::span<const std::byte>> pieces) {
  uint64_t total = 0;
  for (const auto& piece : pieces) total += piece.size();
  std::span<std::byte> room = allocate(total);
  std::byte* at = room.data();
  for (const auto& piece : pieces) {
    copy_into_ring(at, piece.data(), piece.size());
    at += piece.size();
  }
  ring_copy_fence();
  return room;
}

void PartsWriter::add(std::span<const std::byte> bytes) {
  const std::byte* payload = item_.out.data();
  const bool inside = payload != nullptr && bytes.data() >= payload && bytes.data() < payload + used_;
  if (inside) {
    const auto at = static_cast<uint64_t>(bytes.data() - payload);
    if (bytes.size() > used_ - at)
      SPINDLE_THROW(std::invalid_argument, "spindle: a part of batch " + std::to_string(item_.batch_id) +
                                               " starts in the slot's allocated bytes but runs past them");
    offsets_.push_back(at);
  } else {
    std::span<std::byte> room = allocate(bytes.size());
    if (!bytes.empty()) std::memcpy(room.data(), bytes.data(), bytes.size());
    offsets_.push_back(static_cast<uint64_t>(room.data() - item_.out.data()));
  }
  sizes_.push_back(bytes.size());
}

void PartsWriter::finish() {
  const uint64_t count = offsets_.size();
  const uint64_t at = align_up(used_, sizeof(uint64_t));
  const uint64_t total = at + (2 * count + 1) * sizeof(uint64_t);
  std::byte* out = ctx_.reserve(item_, total).data();
  std::memcpy(out + at, offsets_.data(), count * sizeof(uint64_t));
  std::memcpy(out + at + count * sizeof(uint64_t), sizes_.data(), count * sizeof(uint64_t));
  std::memcpy(out + total - sizeof(count), &count, sizeof(count));
  write_bytes_descriptor(ctx_.ring().descriptor(item_.slot), total);
}

std::vector<std::span<std::byte>> read_parts(std::span<std::byte> payload) {
  auto garbled = [&](const std::string& why) {
    return std::runtime_error("spindle: a batch's payload parts are garbled (" + why + ", payload of " +
                              std::to_string(payload.size()) + " bytes)");
  };
  uint64_t count = 0;
  if (payload.size() < sizeof(count)) throw garbled("no trailer");
  std::memcpy(&count, payload.data() + payload.size() - sizeof(count), sizeof(count));
  const uint64_t room = (payload.size() - sizeof(count)) / (2 * sizeof(uint64_t));
  if (count > room) throw garbled(std::to_string(count) + " parts");
  const uint64_t trailer = payload.size() - sizeof(count) - 2 * count * sizeof(uint64_t);
  std::vector<std::span<std::byte>> parts;
  parts.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t offset = 0;
    uint64_t size = 0;
    std::memcpy(&offset, payload.data() + trailer + i * sizeof(uint64_t), sizeof(offset));
    std::memcpy(&size, payload.data() + trailer + (count + i) * sizeof(uint64_t), sizeof(size));
    if (offset > trailer || size > trailer - offset) throw garbled("part " + std::to_string(i) + " overruns");
    parts.push_back(payload.subspan(offset, size));
  }
  return parts;
}

}  // namespace spindle
