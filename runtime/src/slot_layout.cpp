#include <spindle/slot_layout.hpp>

#include <cstring>
#include <limits>
#include <stdexcept>

#include <spindle/error.hpp>

namespace spindle {
namespace {

constexpr uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// a * b, or nullopt-like failure through the flag.
bool mul_overflows(uint64_t a, uint64_t b, uint64_t& out) { return __builtin_mul_overflow(a, b, &out); }
bool add_overflows(uint64_t a, uint64_t b, uint64_t& out) { return __builtin_add_overflow(a, b, &out); }

// Bytes of one sample of a field; false on overflow or a negative dimension.
bool sample_bytes(std::size_t itemsize, std::span<const int64_t> shape, uint64_t& out) {
  uint64_t n = itemsize;
  for (int64_t d : shape) {
    if (d < 0 || mul_overflows(n, static_cast<uint64_t>(d), n)) return false;
  }
  out = n;
  return true;
}

}  // namespace

std::size_t SlotLayout::dtype_itemsize(std::string_view dtype) {
  // Byte order, kind, size: "<f4", "|u1", "=i8", ">c16". Only kinds whose
  // bytes mean the same in every process (no objects, no Python strings).
  auto bad = [&] {
    SPINDLE_THROW(std::invalid_argument,
                  "spindle: dtype '" + std::string(dtype) +
                      "' cannot be stored in shared memory; fields must be bool, integer, float or complex "
                      "numbers (numpy type strings such as '<f4', '|u1')");
  };
  if (dtype.size() < 3 || dtype.size() > 7) bad();
  if (std::string_view("<>|=").find(dtype[0]) == std::string_view::npos) bad();
  if (std::string_view("biufc").find(dtype[1]) == std::string_view::npos) bad();
  std::size_t n = 0;
  for (char c : dtype.substr(2)) {
    if (c < '0' || c > '9') bad();
    n = n * 10 + static_cast<std::size_t>(c - '0');
  }
  if (n == 0 || n > 32) bad();
  return n;
}

SlotLayout::SlotLayout(std::vector<FieldSpec> fields, uint32_t capacity)
    : fields_(std::move(fields)), capacity_(capacity) {
  if (capacity_ == 0) SPINDLE_THROW(std::invalid_argument, "spindle: a slot layout needs capacity >= 1");
  if (fields_.size() > kMaxFields)
    SPINDLE_THROW(std::invalid_argument, "spindle: a batch has " + std::to_string(fields_.size()) +
                                             " array fields; at most " + std::to_string(kMaxFields) +
                                             " fit a slot's descriptor. Combine fields into fewer arrays.");
  uint64_t offset = 0;
  for (std::size_t i = 0; i < fields_.size(); ++i) {
    const FieldSpec& f = fields_[i];
    const std::size_t item = dtype_itemsize(f.dtype);
    if (f.shape.size() > kMaxDims)
      SPINDLE_THROW(std::invalid_argument, "spindle: field " + std::to_string(i) + " has " +
                                               std::to_string(f.shape.size()) + " dimensions; at most " +
                                               std::to_string(kMaxDims) + " are supported");
    uint64_t row = 0, block = 0, end = 0;
    if (!sample_bytes(item, f.shape, row) || mul_overflows(row, capacity_, block) ||
        add_overflows(offset, align_up(block, kAlign), end) || align_up(block, kAlign) < block)
      SPINDLE_THROW(std::invalid_argument, "spindle: field " + std::to_string(i) +
                                               " has a negative dimension or is too large to lay out");
    itemsize_.push_back(item);
    row_bytes_.push_back(row);
    offsets_.push_back(offset);
    offset = end;
  }
  bytes_ = offset;
}

void SlotLayout::check_view(std::size_t payload_bytes, std::size_t i, std::size_t item) const {
  if (i >= fields_.size())
    SPINDLE_THROW(std::invalid_argument, "spindle: the layout has no field " + std::to_string(i));
  if (itemsize_[i] != item)
    SPINDLE_THROW(std::invalid_argument, "spindle: field " + std::to_string(i) + " holds '" + fields_[i].dtype +
                                             "' items of " + std::to_string(itemsize_[i]) + " bytes, not " +
                                             std::to_string(item));
  if (payload_bytes < bytes_)
    SPINDLE_THROW(std::invalid_argument, "spindle: a payload of " + std::to_string(payload_bytes) +
                                             " bytes is smaller than its layout (" + std::to_string(bytes_) + ")");
}

void write_arrays_descriptor(std::byte* desc, const SlotLayout& layout, std::string_view structure) {
  if (structure.size() > SlotLayout::kMaxStructureBytes)
    SPINDLE_THROW(std::invalid_argument, "spindle: the batch's structure description takes " +
                                             std::to_string(structure.size()) + " bytes; at most " +
                                             std::to_string(SlotLayout::kMaxStructureBytes) + " fit a slot");
  auto* d = reinterpret_cast<SlotDescriptor*>(desc);
  auto* records = reinterpret_cast<FieldRecord*>(desc + sizeof(SlotDescriptor));
  for (std::size_t i = 0; i < layout.num_fields(); ++i) {
    FieldRecord r;
    const FieldSpec& f = layout.field(i);
    std::memcpy(r.dtype, f.dtype.data(), f.dtype.size());  // <= 7 chars, checked by SlotLayout
    r.ndim = static_cast<uint32_t>(f.shape.size());
    for (std::size_t k = 0; k < f.shape.size(); ++k) r.shape[k] = f.shape[k];
    r.offset = layout.offset(i);
    r.row_bytes = layout.row_bytes(i);
    records[i] = r;
  }
  std::byte* s = desc + sizeof(SlotDescriptor) + layout.num_fields() * sizeof(FieldRecord);
  if (!structure.empty()) std::memcpy(s, structure.data(), structure.size());
  SlotDescriptor head;
  head.magic = SlotDescriptor::kMagic;
  head.kind = static_cast<uint32_t>(PayloadKind::kArrays);
  head.capacity = layout.capacity();
  head.num_fields = static_cast<uint32_t>(layout.num_fields());
  head.structure_bytes = static_cast<uint32_t>(structure.size());
  head.data_bytes = layout.bytes();
  *d = head;
}

void write_bytes_descriptor(std::byte* desc, uint64_t n) noexcept {
  SlotDescriptor head;
  head.magic = SlotDescriptor::kMagic;
  head.kind = static_cast<uint32_t>(PayloadKind::kBytes);
  head.data_bytes = n;
  *reinterpret_cast<SlotDescriptor*>(desc) = head;
}

void write_raw_descriptor(std::byte* desc) noexcept {
  SlotDescriptor head;
  head.magic = SlotDescriptor::kMagic;
  head.kind = static_cast<uint32_t>(PayloadKind::kRaw);
  *reinterpret_cast<SlotDescriptor*>(desc) = head;
}

SlotContents read_descriptor(const std::byte* desc, uint64_t payload_bytes) {
  auto corrupt = [](const std::string& what) {
    SPINDLE_THROW(std::runtime_error, "spindle: a worker wrote an invalid batch descriptor (" + what +
                                          "); this is a bug in the worker code that filled the slot");
  };
  SlotDescriptor head;
  std::memcpy(&head, desc, sizeof head);
  if (head.magic != SlotDescriptor::kMagic) corrupt("bad magic");
  SlotContents out;
  switch (static_cast<PayloadKind>(head.kind)) {
    case PayloadKind::kRaw:
      out.kind = PayloadKind::kRaw;
      out.data_bytes = payload_bytes;
      return out;
    case PayloadKind::kBytes:
      if (head.data_bytes > payload_bytes) corrupt("byte string longer than the slot");
      out.kind = PayloadKind::kBytes;
      out.data_bytes = head.data_bytes;
      return out;
    case PayloadKind::kArrays:
      break;
    default:
      corrupt("unknown payload kind " + std::to_string(head.kind));
  }
  if (head.num_fields > SlotLayout::kMaxFields) corrupt("too many fields");
  if (head.structure_bytes > SlotLayout::kMaxStructureBytes) corrupt("structure too large");
  if (head.capacity == 0) corrupt("capacity 0");
  std::vector<FieldSpec> fields;
  fields.reserve(head.num_fields);
  const std::byte* rec = desc + sizeof(SlotDescriptor);
  for (uint32_t i = 0; i < head.num_fields; ++i) {
    FieldRecord r;
    std::memcpy(&r, rec + i * sizeof(FieldRecord), sizeof r);
    if (r.ndim > SlotLayout::kMaxDims) corrupt("field with too many dimensions");
    FieldSpec f;
    f.dtype.assign(r.dtype, strnlen(r.dtype, sizeof r.dtype));
    f.shape.assign(r.shape, r.shape + r.ndim);
    fields.push_back(std::move(f));
  }
  try {
    out.layout = SlotLayout(std::move(fields), head.capacity);
  } catch (const std::invalid_argument& e) {
    corrupt(e.what());
  }
  // The consumer trusts only what it recomputed; the worker's offsets must agree.
  for (uint32_t i = 0; i < head.num_fields; ++i) {
    FieldRecord r;
    std::memcpy(&r, rec + i * sizeof(FieldRecord), sizeof r);
    if (r.offset != out.layout.offset(i) || r.row_bytes != out.layout.row_bytes(i)) corrupt("field offsets disagree");
  }
  if (out.layout.bytes() > payload_bytes || head.data_bytes != out.layout.bytes())
    corrupt("fields larger than the slot");
  out.kind = PayloadKind::kArrays;
  out.data_bytes = out.layout.bytes();
  out.structure = std::string_view(
      reinterpret_cast<const char*>(rec + head.num_fields * sizeof(FieldRecord)), head.structure_bytes);
  return out;
}

}  // namespace spindle
