#pragma once
// copy_into_ring: memcpy for bytes headed into a ring slot.
//
// A slot is written once by a worker and read later by the consumer on
// another core, so keeping the written lines in the worker's cache buys
// nothing. Large copies use non-temporal (streaming) stores, which skip the
// read-for-ownership of every destination line: on a memory-bound worker
// that is a third less memory traffic. Small copies and non-x86 builds use
// memcpy.

#include <cstddef>

namespace spindle {

// Copies `n` bytes; the caller issues ring_copy_fence() before publishing.
void copy_into_ring(void* dst, const void* src, std::size_t n) noexcept;
// Orders the streaming stores before the release store that publishes a slot.
void ring_copy_fence() noexcept;

}  // namespace spindle
