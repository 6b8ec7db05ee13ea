#pragma once
// SlotLayout: how a batch is laid out in a ring slot, and the descriptor that
// says so. This is the one owner of the payload format; the Python front ends
// and the C++ API both ask it for offsets instead of computing them.
//
// A batch is structure-of-arrays: for each field, in order, one C-contiguous
// block [capacity, *shape] of the field's dtype, each block starting on a
// 64-byte line (page-aligned slot + 64-byte multiples). A batch of `count`
// samples is the first `count` rows of every block, so a short last batch
// needs no second layout.
//
// Every slot has a fixed-size descriptor beside it (in the segment's
// descriptor region, not in the payload), written by the worker that fills
// the slot before it publishes kReady, read by the consumer after:
//
//   SlotDescriptor   magic, kind, capacity, field count, structure bytes, data bytes
//   FieldRecord[n]   dtype (numpy type string, e.g. "<f4", "|u1"), shape, offset, row bytes
//   structure[m]     opaque bytes for the front end (Python: its nested dict/tuple
//                    structure), at most kMaxStructureBytes
//
// Each batch carries its own layout, so no sample has to be read before the
// workers start (no probe), batches of different shapes can share a ring, and
// a consumer never trusts a layout it did not read from the slot itself: the
// descriptor is validated (bounds, dtype, overflow) before any view is made.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace spindle {

// What a slot's payload holds.
enum class PayloadKind : uint32_t {
  kRaw = 0,     // bytes the C++ API wrote with no descriptor (WorkItem::out)
  kArrays = 1,  // fields laid out by a SlotLayout
  kBytes = 2,   // one opaque byte string (e.g. a pickled batch) of data_bytes
};

struct FieldSpec {
  std::string dtype;           // numpy array-interface type string: "<f4", "|u1", "|b1", ...
  std::vector<int64_t> shape;  // of one sample
};

class SlotLayout {
 public:
  static constexpr std::size_t kAlign = 64;
  static constexpr std::size_t kMaxDims = 8;
  static constexpr std::size_t kMaxFields = 32;
  static constexpr std::size_t kMaxStructureBytes = 4096;

  SlotLayout() = default;
  // Lays out `fields` for batches of up to `capacity` samples. Throws
  // std::invalid_argument naming the field for an unknown dtype, too many
  // dimensions or fields, or a size that overflows.
  SlotLayout(std::vector<FieldSpec> fields, uint32_t capacity);

  uint32_t capacity() const noexcept { return capacity_; }
  std::size_t num_fields() const noexcept { return fields_.size(); }
  const FieldSpec& field(std::size_t i) const { return fields_.at(i); }
  std::size_t itemsize(std::size_t i) const { return itemsize_.at(i); }
  // Bytes of one sample of field i, and where its block starts in the payload.
  uint64_t row_bytes(std::size_t i) const { return row_bytes_.at(i); }
  uint64_t offset(std::size_t i) const { return offsets_.at(i); }
  // Payload bytes a full batch needs.
  uint64_t bytes() const noexcept { return bytes_; }

  // Field i of a payload laid out by this layout, as `capacity()` rows of T
  // (all of its elements). Throws std::invalid_argument if T's size is not
  // the field's item size or the payload is too small.
  template <class T>
  std::span<T> view(std::span<std::byte> payload, std::size_t i) const {
    check_view(payload.size(), i, sizeof(T));
    return {reinterpret_cast<T*>(payload.data() + offsets_[i]), row_bytes_[i] / sizeof(T) * capacity_};
  }

  // Item size of a numpy type string ("<f4" -> 4); throws std::invalid_argument
  // for anything that is not a plain fixed-size numeric/bool type.
  static std::size_t dtype_itemsize(std::string_view dtype);

 private:
  void check_view(std::size_t payload_bytes, std::size_t i, std::size_t item) const;
  std::vector<FieldSpec> fields_;
  std::vector<std::size_t> itemsize_;
  std::vector<uint64_t> row_bytes_, offsets_;
  uint32_t capacity_ = 0;
  uint64_t bytes_ = 0;
};

// The descriptor beside each slot (shared memory; written by the filling
// worker while the slot is kFilling, read by the consumer after kReady).
struct SlotDescriptor {
  static constexpr uint32_t kMagic = 0x544c5053;  // "SPLT"
  uint32_t magic = 0;
  uint32_t kind = 0;          // PayloadKind
  uint32_t capacity = 0;      // rows per block (kArrays)
  uint32_t num_fields = 0;
  uint32_t structure_bytes = 0;
  uint32_t reserved_ = 0;
  uint64_t data_bytes = 0;    // payload bytes in use (kBytes: the byte string's length)
};

struct FieldRecord {
  char dtype[8] = {};         // NUL-padded numpy type string
  uint32_t ndim = 0;
  uint32_t reserved_ = 0;
  int64_t shape[SlotLayout::kMaxDims] = {};
  uint64_t offset = 0;
  uint64_t row_bytes = 0;
};

// Bytes of the descriptor region of one slot.
inline constexpr std::size_t kDescriptorBytes = 8192;
static_assert(sizeof(SlotDescriptor) + SlotLayout::kMaxFields * sizeof(FieldRecord) +
                  SlotLayout::kMaxStructureBytes <= kDescriptorBytes,
              "a full descriptor must fit its region");
static_assert(kDescriptorBytes % 64 == 0, "descriptor regions start on cache lines");

// A slot's payload as the consumer sees it, parsed from its descriptor.
struct SlotContents {
  PayloadKind kind = PayloadKind::kRaw;
  SlotLayout layout;             // kArrays
  std::string_view structure;    // kArrays: the front end's structure bytes
  uint64_t data_bytes = 0;       // kBytes: length; kArrays: layout.bytes()
};

// Writes the descriptor for an array batch into `desc` (kDescriptorBytes).
// Throws std::invalid_argument if `structure` is larger than kMaxStructureBytes.
void write_arrays_descriptor(std::byte* desc, const SlotLayout& layout, std::string_view structure);
// Writes the descriptor for a byte-string payload of `n` bytes.
void write_bytes_descriptor(std::byte* desc, uint64_t n) noexcept;
// Marks a slot as holding raw bytes (no descriptor).
void write_raw_descriptor(std::byte* desc) noexcept;

// Parses and validates a descriptor written by a worker: every field, offset
// and size must lie within `payload_bytes` (the slot's reserved payload).
// Throws std::runtime_error naming what is wrong if it does not; views made
// from the result never reach outside the payload.
SlotContents read_descriptor(const std::byte* desc, uint64_t payload_bytes);

}  // namespace spindle
