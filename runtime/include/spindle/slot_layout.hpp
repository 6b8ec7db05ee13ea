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
// A variable-length byte field (FieldKind::kBytes: captions, JSON; one byte
// string per sample) is one block too: `capacity + 1` uint64 offsets, then, on
// the next 64-byte line, a flat values buffer of the field's `value_bytes`.
// Row r's bytes are values[offsets[r], offsets[r + 1]); offsets[0] is 0. The
// worker writes the whole column at once (put_bytes) after its rows are final;
// a batch whose values do not fit is refused with std::length_error (never
// truncated); the consumer checks the offsets (bytes_column) before it makes a
// view.
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

// What a field holds: one fixed-shape array per sample, or one byte string
// per sample (of any length, the batch's together at most value_bytes).
enum class FieldKind : uint32_t { kFixed = 0, kBytes = 1 };

struct FieldSpec {
  std::string dtype;           // numpy array-interface type string: "<f4", "|u1", "|b1", ...
  std::vector<int64_t> shape;  // of one sample
  FieldKind kind = FieldKind::kFixed;
  uint64_t value_bytes = 0;    // kBytes: room for the values of a whole batch

  // A variable-length byte field with room for `value_bytes` bytes per batch.
  static FieldSpec bytes(uint64_t value_bytes) { return FieldSpec{"|u1", {}, FieldKind::kBytes, value_bytes}; }
};

// A byte field of one batch, as the consumer reads it (offsets checked).
struct BytesColumn {
  std::span<const uint64_t> offsets;  // count + 1 entries, offsets[0] == 0, non-decreasing
  std::span<const std::byte> values;  // offsets[count] bytes
  std::size_t size() const noexcept { return offsets.empty() ? 0 : offsets.size() - 1; }
  std::span<const std::byte> operator[](std::size_t row) const {
    return values.subspan(offsets[row], offsets[row + 1] - offsets[row]);
  }
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
  bool is_bytes(std::size_t i) const { return fields_.at(i).kind == FieldKind::kBytes; }
  // Bytes of one sample of field i (0 for a byte field), and where its block
  // starts in the payload.
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

  // Byte field i: writes `rows` (one byte string per sample, in row order) as
  // its offsets and values. Throws std::length_error naming the field, the
  // first row that does not fit and the bytes needed if the values exceed the
  // field's value_bytes (nothing is truncated); std::invalid_argument if i is
  // not a byte field or there are more rows than capacity().
  void put_bytes(std::span<std::byte> payload, std::size_t i, std::span<const std::span<const std::byte>> rows) const;
  // Byte field i of a batch of `count` rows, its offsets checked against the
  // layout (std::runtime_error if a worker wrote offsets that leave the block).
  BytesColumn bytes_column(std::span<const std::byte> payload, std::size_t i, std::size_t count) const;

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
  uint32_t kind = 0;          // FieldKind; kBytes: ndim 0 and shape[0] = value_bytes
  int64_t shape[SlotLayout::kMaxDims] = {};
  uint64_t offset = 0;
  uint64_t row_bytes = 0;
};

// Bytes of the descriptor region of one slot.
inline constexpr std::size_t kDescriptorBytes = 8192;

// The least payload a slot starts with, however small its batches: room for a failed batch's
// report (a Python traceback, say). Python: _core.MIN_SLOT_BYTES.
inline constexpr std::size_t kMinSlotBytes = 64 * 1024;
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
