// Batch: a delivered batch, a lease on a ring slot (or its own copy).
#include <spindle/loader.hpp>

#include <algorithm>
#include <stdexcept>

#include <spindle/detail/arena.hpp>
#include <spindle/error.hpp>

#include "loader_internal.hpp"

namespace spindle {
using detail::SlotState;
using detail::Arena;
using detail::SlotHeader;
using detail::BatchRing;

Batch::Batch(std::shared_ptr<RingStorage> ring, uint32_t slot) : ring_(std::move(ring)), slot_(slot) {
  const BatchRing& r = ring_->ring;
  const SlotHeader& h = r.slot(slot);
  batch_id_ = h.batch_id;
  skipped_ = h.skipped;
  stream_ = h.stream;
  stream_position_ = h.stream_position;
  indices_ = {r.indices(slot), h.count};
  contents_ = read_descriptor(r.descriptor(slot), h.reserved);
  const uint64_t used = contents_.kind == PayloadKind::kRaw
                            ? std::min<uint64_t>(r.geometry().slot_bytes, h.reserved)
                            : contents_.data_bytes;
  data_ = {r.payload(slot), static_cast<std::size_t>(used)};
}

void Batch::check_field(std::size_t i, std::size_t item) const {
  if (kind() != PayloadKind::kArrays || i >= layout().num_fields())
    SPINDLE_THROW(std::invalid_argument, "spindle: batch " + std::to_string(batch_id_) + " has no array field " +
                                             std::to_string(i));
  if (layout().is_bytes(i))
    SPINDLE_THROW(std::invalid_argument, "spindle: field " + std::to_string(i) + " of batch " +
                                             std::to_string(batch_id_) + " holds byte strings: read it with bytes(i)");
  if (layout().itemsize(i) != item)
    SPINDLE_THROW(std::invalid_argument, "spindle: field " + std::to_string(i) + " holds '" +
                                             layout().field(i).dtype + "' items of " +
                                             std::to_string(layout().itemsize(i)) + " bytes, not " +
                                             std::to_string(item));
}

Batch::Batch(Batch&& o) noexcept { *this = std::move(o); }

Batch& Batch::operator=(Batch&& o) noexcept {
  if (this != &o) {
    release();
    ring_ = std::move(o.ring_);
    slot_ = o.slot_;
    batch_id_ = o.batch_id_;
    skipped_ = o.skipped_;
    stream_ = o.stream_;
    stream_position_ = o.stream_position_;
    indices_ = o.indices_;
    data_ = o.data_;
    contents_ = std::move(o.contents_);
    owned_ = std::move(o.owned_);  // moving keeps the buffers, so the spans stay valid
    owned_indices_ = std::move(o.owned_indices_);
    owned_descriptor_ = std::move(o.owned_descriptor_);
  }
  return *this;
}

Batch::~Batch() { release(); }

void Batch::release() noexcept {
  if (ring_ && ring_->in_owner()) ring_->ring.set_state(slot_, SlotState::kFree);
  ring_.reset();
}

void Batch::copy_out() {
  owned_.resize(data_.size());
  Arena::global().parallel_copy(owned_.data(), data_.data(), data_.size());
  owned_indices_.assign(indices_.begin(), indices_.end());
  const std::byte* desc = ring_->ring.descriptor(slot_);
  owned_descriptor_.assign(desc, desc + kDescriptorBytes);
  data_ = owned_;
  indices_ = owned_indices_;
  if (contents_.kind == PayloadKind::kArrays)  // the structure bytes now live in our copy
    contents_.structure = std::string_view(
        reinterpret_cast<const char*>(owned_descriptor_.data()) +
            (contents_.structure.data() - reinterpret_cast<const char*>(desc)),
        contents_.structure.size());
  release();
}

}  // namespace spindle
