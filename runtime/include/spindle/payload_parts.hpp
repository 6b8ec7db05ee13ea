#pragma once
// A payload of several parts in one slot: a pickle stream and its out-of-band
// buffers (pickle protocol 5), so that a batch of any structure travels with
// its arrays written once, into the slot, and arrives as views of it. It is a
// PayloadKind::kBytes payload laid out as
//
//   part bytes ... | uint64 offset[count] | uint64 size[count] | uint64 count
//
// The trailer comes last because parts are placed before they are known: a
// collate function stacks a batch's tensors straight into memory of the slot
// (PartsWriter::allocate), and only the pickling that follows says which
// buffers are parts. Every part the writer places starts on a kPartAlign
// boundary of the payload (the payload itself is 64-byte aligned,
// batch_ring.hpp); a part added in place keeps the alignment of the tensor it
// is. The worker writes it (PartsWriter), the consumer reads it back
// (read_parts); nothing else knows the layout.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <spindle/worker_context.hpp>

namespace spindle {

inline constexpr std::size_t kPartAlign = 64;

// Writes one item's parts. Room is handed out from the start of the payload,
// growing the slot as WorkerContext::reserve does (and throwing as it does).
class PartsWriter {
 public:
  PartsWriter(WorkerContext& ctx, WorkItem& item) noexcept : ctx_(ctx), item_(item) {}
  // `bytes` of the slot after everything handed out so far, for the caller to
  // fill (a tensor the batch is stacked into); a part only once add()ed.
  std::span<std::byte> allocate(uint64_t bytes);
  // allocate() for the pieces back to back, copied in (streaming stores for
  // large ones, as every copy into a slot): a batch's samples stacked.
  std::span<std::byte> gather(std::span<const std::span<const std::byte>> pieces);
  // The next part: in place if `bytes` lie in what allocate() handed out,
  // else copied into new room. Throws std::invalid_argument if they straddle
  // its end.
  void add(std::span<const std::byte> bytes);
  // Writes the trailer and the slot's kBytes descriptor; commit() next.
  void finish();

 private:
  WorkerContext& ctx_;
  WorkItem& item_;
  uint64_t used_ = 0;
  std::vector<uint64_t> offsets_;
  std::vector<uint64_t> sizes_;
};

// The parts of a payload a PartsWriter wrote. Throws std::runtime_error if
// the trailer does not fit the payload (a garbled slot).
std::vector<std::span<std::byte>> read_parts(std::span<std::byte> payload);

}  // namespace spindle
