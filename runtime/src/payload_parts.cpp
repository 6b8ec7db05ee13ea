#include <spindle/payload_parts.hpp>

#include <cstring>
#include <stdexcept>
#include <string>

#include <spindle/error.hpp>
#include <spindle/detail/batch_ring.hpp>
#include <spindle/slot_layout.hpp>

namespace spindle {
namespace {

uint64_t align_up(uint64_t n) { return (n + kPartAlign - 1) / kPartAlign * kPartAlign; }

uint64_t header_bytes(uint64_t count) { return align_up((count + 1) * sizeof(uint64_t)); }

}  // namespace

std::vector<std::span<std::byte>> begin_parts(WorkerContext& ctx, WorkItem& item, std::span<const uint64_t> sizes) {
  uint64_t total = header_bytes(sizes.size());
  for (uint64_t s : sizes) total += align_up(s);
  std::span<std::byte> out = ctx.reserve(item, total);
  const uint64_t count = sizes.size();
  std::memcpy(out.data(), &count, sizeof(count));
  if (!sizes.empty()) std::memcpy(out.data() + sizeof(count), sizes.data(), sizes.size_bytes());
  std::vector<std::span<std::byte>> parts;
  parts.reserve(sizes.size());
  uint64_t at = header_bytes(count);
  for (uint64_t s : sizes) {
    parts.push_back(out.subspan(at, s));
    at += align_up(s);
  }
  write_bytes_descriptor(ctx.ring().descriptor(item.slot), total);
  return parts;
}

std::vector<std::span<std::byte>> read_parts(std::span<std::byte> payload) {
  auto garbled = [&](const std::string& why) {
    return std::runtime_error("spindle: a batch's payload parts are garbled (" + why + ", payload of " +
                              std::to_string(payload.size()) + " bytes)");
  };
  uint64_t count = 0;
  if (payload.size() < sizeof(count)) throw garbled("no header");
  std::memcpy(&count, payload.data(), sizeof(count));
  if (count > payload.size() / sizeof(uint64_t) || header_bytes(count) > payload.size())
    throw garbled(std::to_string(count) + " parts");
  std::vector<std::span<std::byte>> parts;
  parts.reserve(count);
  uint64_t at = header_bytes(count);
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t size = 0;
    std::memcpy(&size, payload.data() + sizeof(uint64_t) * (i + 1), sizeof(size));
    if (size > payload.size() || at > payload.size() - size) throw garbled("part " + std::to_string(i) + " overruns");
    parts.push_back(payload.subspan(at, size));
    at += align_up(size);
  }
  return parts;
}

}  // namespace spindle
