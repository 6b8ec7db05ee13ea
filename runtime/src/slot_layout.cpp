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

// Where a byte field's values start in its block: after capacity + 1
// offsets, on the next line.
constexpr uint64_t bytes_values_at(uint32_t capacity) { return align_up((uint64_t{capacity} + 1) * 8, 64); }

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
    if (f.kind == FieldKind::kBytes) {
      if (f.dtype != "|u1" || !f.shape.empty())
        SPINDLE_THROW(std::invalid_argument, "spindle: byte field " + std::to_string(i) +
                                                 " must be '|u1' with no shape (FieldSpec::bytes)");
      uint64_t end = 0;
      const uint64_t block = bytes_values_at(capacity_) + f.value_bytes;
      if (block < f.value_bytes || add_overflows(offset, align_up(block, kAlign), end) ||
          align_up(block, kAlign) < block)
        SPINDLE_THROW(std::invalid_argument, "spindle: byte field " + std::to_string(i) + " is too large to lay out");
      itemsize_.push_back(1);
      row_bytes_.push_back(0);
      offsets_.push_back(offset);
      offset = end;
      continue;
    }
    if (f.kind != FieldKind::kFixed)
      SPINDLE_THROW(std::invalid_argument, "spindle: field " + std::to_string(i) + " has an unknown kind");
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
  if (fields_[i].kind == FieldKind::kBytes)
    SPINDLE_THROW(std::invalid_argument, "spindle: field " + std::to_string(i) +
                                             " holds variable-length bytes: read it with bytes_column()");
  if (itemsize_[i] != item)
    SPINDLE_THROW(std::invalid_argument, "spindle: field " + std::to_string(i) + " holds '" + fields_[i].dtype +
                                             "' items of " + std::to_string(itemsize_[i]) + " bytes, not " +
                                             std::to_string(item));
  if (payload_bytes < bytes_)
    SPINDLE_THROW(std::invalid_argument, "spindle: a payload of " + std::to_string(payload_bytes) +
                                             " bytes is smaller than its layout (" + std::to_string(bytes_) + ")");
}

void SlotLayout::put_bytes(std::span<std::byte> payload, std::size_t i,
                           std::span<const std::span<const std::byte>> rows) const {
  if (i >= fields_.size() || fields_[i].kind != FieldKind::kBytes)
    SPINDLE_THROW(std::invalid_argument, "spindle: field " + std::to_string(i) + " is not a byte field");
  if (rows.size() > capacity_)
    SPINDLE_THROW(std::invalid_argument, "spindle: " + std::to_string(rows.size()) + " rows for a layout of " +
                                             std::to_string(capacity_));
  if (payload.size() < bytes_)
    SPINDLE_THROW(std::invalid_argument, "spindle: a payload of " + std::to_string(payload.size()) +
                                             " bytes is smaller than its layout (" + std::to_string(bytes_) + ")");
  const uint64_t room = fields_[i].value_bytes;
  uint64_t total = 0;
  std::size_t first_over = rows.size();
  for (std::size_t r = 0; r < rows.size(); ++r) {
    total += rows[r].size();
    if (total > room && first_over == rows.size()) first_over = r;
  }
  if (first_over != rows.size())
    SPINDLE_THROW(std::length_error, "spindle: byte field " + std::to_string(i) + " of a batch of " +
                                         std::to_string(rows.size()) + " rows needs " + std::to_string(total) +
                                         " bytes; the slot holds " + std::to_string(room) + " (row " +
                                         std::to_string(first_over) + " is the first that does not fit)");
  std::byte* block = payload.data() + offsets_[i];
  auto* offsets = reinterpret_cast<uint64_t*>(block);
  std::byte* values = block + bytes_values_at(capacity_);
  uint64_t at = 0;
  offsets[0] = 0;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    if (!rows[r].empty()) std::memcpy(values + at, rows[r].data(), rows[r].size());
    at += rows[r].size();
    offsets[r + 1] = at;
  }
}

BytesColumn SlotLayout::bytes_column(std::span<const std::byte> payload, std::size_t i, std::size_t count) const {
  if (i >= fields_.size() || fields_[i].kind != FieldKind::kBytes)
    SPINDLE_THROW(std::invalid_argument, "spindle: field " + std::to_string(i) + " is not a byte field");
  if (count > capacity_ || payload.size() < bytes_)
    SPINDLE_THROW(std::invalid_argument, "spindle: a batch of " + std::to_string(count) + " rows in " +
                                             std::to_string(payload.size()) + " bytes does not match its layout");
  const std::byte* block = payload.data() + offsets_[i];
  const auto* offsets = reinterpret_cast<const uint64_t*>(block);
  const uint64_t room = fields_[i].value_bytes;
  if (offsets[0] != 0)
    SPINDLE_THROW(std::runtime_error, "spindle: byte field " + std::to_string(i) +
                                          " has invalid offsets (the first is not 0); a bug in the worker that "
                                          "filled the slot");
  for (std::size_t r = 0; r < count; ++r)
    if (offsets[r + 1] < offsets[r] || offsets[r + 1] > room)
      SPINDLE_THROW(std::runtime_error, "spindle: byte field " + std::to_string(i) + " has invalid offsets at row " +
                                            std::to_string(r) + "; a bug in the worker that filled the slot");
  BytesColumn c;
  c.offsets = {offsets, count + 1};
  c.values = {block + bytes_values_at(capacity_), static_cast<std::size_t>(offsets[count])};
  return c;
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
    r.kind = static_cast<uint32_t>(f.kind);
    for (std::size_t k = 0; k < f.shape.size(); ++k) r.shape[k] = f.shape[k];
    if (f.kind == FieldKind::kBytes) r.shape[0] = static_cast<int64_t>(f.value_bytes);
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
    if (r.kind == static_cast<uint32_t>(FieldKind::kBytes)) {
      if (r.ndim != 0 || r.shape[0] < 0) corrupt("byte field with a shape");
      f.kind = FieldKind::kBytes;
      f.value_bytes = static_cast<uint64_t>(r.shape[0]);
    } else if (r.kind != static_cast<uint32_t>(FieldKind::kFixed)) {
      corrupt("unknown field kind " + std::to_string(r.kind));
    }
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
