#pragma once
// A payload of several parts in one slot: a pickle stream and its out-of-band
// buffers (pickle protocol 5), so that a batch of any structure travels with
// its arrays copied once, into the slot, and arrives as views of it. It is a
// PayloadKind::kBytes payload laid out as
//
//   uint64 count | uint64 size[count] | part 0 | part 1 | ...
//
// with every part starting on a kPartAlign boundary of the payload (the
// payload itself is 64-byte aligned, batch_ring.hpp), so a part can be viewed
// as an array of any element type. The worker writes it (begin_parts), the
// consumer reads it back (read_parts); nothing else knows the layout.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <spindle/worker_context.hpp>

namespace spindle {

inline constexpr std::size_t kPartAlign = 64;

// Reserves the item's slot for parts of `sizes` bytes, writes the header and
// the slot's kBytes descriptor, and returns each part's bytes for the caller
// to fill before commit(). Throws as WorkerContext::reserve.
std::vector<std::span<std::byte>> begin_parts(WorkerContext& ctx, WorkItem& item, std::span<const uint64_t> sizes);

// The parts of a payload begin_parts laid out. Throws std::runtime_error if
// the header does not fit the payload (a garbled slot).
std::vector<std::span<std::byte>> read_parts(std::span<std::byte> payload);

}  // namespace spindle
