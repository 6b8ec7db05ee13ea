// Fuzzes the consumer's parser of slot descriptors (read_descriptor in
// runtime/src/slot_layout.cpp): bytes a worker wrote, which the consumer must
// never trust. Input: 8 bytes of the slot's reserved payload size (what the
// consumer knows), then the descriptor itself, copied into an exact-size
// buffer of kDescriptorBytes.
//
// Checks: read_descriptor either throws std::runtime_error or returns contents
// whose every field block lies inside the reserved payload, whose blocks are
// 64-byte aligned, ordered and disjoint, whose structure bytes lie inside the
// descriptor, and which write_arrays_descriptor reproduces exactly
// (round trip). Any other exception, crash or sanitizer report fails.

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include <spindle/slot_layout.hpp>

#include "fuzz_support.hpp"

using namespace spindle;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  fuzz::ByteReader in(data, size);
  uint64_t reserved = 0;
  for (int i = 0; i < 8; ++i) reserved = (reserved << 8) | in.next();
  reserved &= (uint64_t{1} << 40) - 1;  // up to 1 TiB of payload: any size the consumer could hold
  fuzz::AlignedBuffer desc(kDescriptorBytes, 64);
  const std::size_t n = size > 8 ? std::min<std::size_t>(size - 8, kDescriptorBytes) : 0;
  if (n) std::memcpy(desc.data(), data + 8, n);

  SlotContents c;
  try {
    c = read_descriptor(desc.data(), reserved);
  } catch (const std::runtime_error&) {
    return 0;  // refused: the documented outcome for a bad descriptor
  }
  SPINDLE_FUZZ_CHECK(c.data_bytes <= reserved, "data_bytes %llu > reserved %llu",
                     static_cast<unsigned long long>(c.data_bytes), static_cast<unsigned long long>(reserved));
  if (c.kind != PayloadKind::kArrays) return 0;
  const SlotLayout& l = c.layout;
  uint64_t end = 0;
  for (std::size_t i = 0; i < l.num_fields(); ++i) {
    const uint64_t block = l.row_bytes(i) * l.capacity();
    SPINDLE_FUZZ_CHECK(l.offset(i) % SlotLayout::kAlign == 0, "field %zu at %llu", i,
                       static_cast<unsigned long long>(l.offset(i)));
    SPINDLE_FUZZ_CHECK(l.offset(i) >= end, "field %zu overlaps the one before", i);
    SPINDLE_FUZZ_CHECK(l.row_bytes(i) == 0 || block / l.row_bytes(i) == l.capacity(), "block of field %zu overflows", i);
    SPINDLE_FUZZ_CHECK(l.offset(i) + block <= reserved, "field %zu ends past the slot", i);
    end = l.offset(i) + block;
  }
  SPINDLE_FUZZ_CHECK(l.bytes() <= reserved, "layout of %llu bytes in a slot of %llu",
                     static_cast<unsigned long long>(l.bytes()), static_cast<unsigned long long>(reserved));
  const auto* base = reinterpret_cast<const char*>(desc.data());
  SPINDLE_FUZZ_CHECK(c.structure.data() >= base && c.structure.data() + c.structure.size() <= base + kDescriptorBytes,
                     "structure bytes outside the descriptor");
  // Round trip: what the worker side writes for this layout parses to the same.
  fuzz::AlignedBuffer again(kDescriptorBytes, 64);
  write_arrays_descriptor(again.data(), l, c.structure);
  const SlotContents d = read_descriptor(again.data(), reserved);
  SPINDLE_FUZZ_CHECK(d.layout.num_fields() == l.num_fields() && d.layout.bytes() == l.bytes() &&
                         d.structure == c.structure,
                     "round trip changed the layout");
  return 0;
}
