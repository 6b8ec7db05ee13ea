// SlotLayout and slot descriptors: the one owner of the payload format. Field
// offsets and sizes, dtype validation, the descriptor round trip and its
// refusal of corrupt input, and typed batches end to end through a Loader
// whose slots grow as batches do.
#include <spindle/loader.hpp>
#include <spindle/payload_parts.hpp>
#include <spindle/slot_layout.hpp>

#include <cstring>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

namespace spindle {
namespace {

// Proves: blocks are [capacity, *shape] in order, each on a 64-byte line, and bytes() covers them.
TEST(SlotLayout, BlocksAreOrderedAlignedAndSizedByShapeAndCapacity) {
  SlotLayout l({{"|u1", {3, 5}}, {"<f8", {}}, {"<i2", {7}}}, 10);
  EXPECT_EQ(l.offset(0), 0u);
  EXPECT_EQ(l.row_bytes(0), 15u);
  EXPECT_EQ(l.offset(1), 192u) << "150 bytes rounded up to the next 64-byte line";
  EXPECT_EQ(l.row_bytes(1), 8u);
  EXPECT_EQ(l.offset(2), 192u + 128u);
  EXPECT_EQ(l.row_bytes(2), 14u);
  EXPECT_EQ(l.bytes(), 192u + 128u + 192u);
  for (std::size_t i = 0; i < l.num_fields(); ++i) EXPECT_EQ(l.offset(i) % SlotLayout::kAlign, 0u);
}

// Proves: only plain numeric/bool numpy type strings are accepted, with an error naming the dtype.
TEST(SlotLayout, RefusesDtypesThatCannotBeShared) {
  EXPECT_EQ(SlotLayout::dtype_itemsize("<c16"), 16u);
  EXPECT_EQ(SlotLayout::dtype_itemsize("|b1"), 1u);
  for (const char* bad : {"|O8", "<U4", "|S3", "<M8", "f4", "<f", "<f0", "", "|V16"})
    EXPECT_THROW(SlotLayout::dtype_itemsize(bad), std::invalid_argument) << bad;
  try {
    SlotLayout({{"|O8", {}}}, 4);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'|O8'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(SlotLayout({{"<f4", {-1}}}, 4), std::invalid_argument);
  EXPECT_THROW(SlotLayout({{"<f4", {1 << 30, 1 << 30, 1 << 30}}}, 1 << 20), std::invalid_argument) << "overflow";
}

// Proves: a written descriptor reads back as the same layout and structure; a corrupt one is refused.
TEST(SlotDescriptor, RoundTripsAndRefusesCorruptOrOversizedLayouts) {
  std::vector<std::byte> desc(kDescriptorBytes);
  SlotLayout l({{"<f4", {3, 8, 8}}, {"<i8", {}}}, 16);
  write_arrays_descriptor(desc.data(), l, "tree");
  SlotContents c = read_descriptor(desc.data(), l.bytes());
  ASSERT_EQ(c.kind, PayloadKind::kArrays);
  EXPECT_EQ(c.layout.num_fields(), 2u);
  EXPECT_EQ(c.layout.field(0).shape, (std::vector<int64_t>{3, 8, 8}));
  EXPECT_EQ(c.structure, "tree");
  EXPECT_THROW(read_descriptor(desc.data(), l.bytes() - 1), std::runtime_error) << "fields past the slot";
  auto* rec = reinterpret_cast<FieldRecord*>(desc.data() + sizeof(SlotDescriptor));
  rec[1].offset += 64;
  EXPECT_THROW(read_descriptor(desc.data(), 1 << 20), std::runtime_error) << "offsets the consumer did not derive";
  std::memset(desc.data(), 0, 4);
  EXPECT_THROW(read_descriptor(desc.data(), 1 << 20), std::runtime_error) << "bad magic";
  write_bytes_descriptor(desc.data(), 70000);
  EXPECT_THROW(read_descriptor(desc.data(), 65536), std::runtime_error) << "byte string longer than the slot";
  EXPECT_THROW(write_arrays_descriptor(desc.data(), l, std::string(SlotLayout::kMaxStructureBytes + 1, 'x')),
               std::invalid_argument);
}

// Proves: a byte field is capacity + 1 offsets then a values buffer in one aligned block; rows of
// any length round-trip through put_bytes / bytes_column and the descriptor; values that do not
// fit are refused (not cut), and offsets leaving the block are refused on the consumer's side.
TEST(SlotLayout, ByteFieldsHoldRowsOfAnyLengthAndRefuseWhatDoesNotFit) {
  SlotLayout l({{"<i8", {}}, FieldSpec::bytes(100)}, 4);
  EXPECT_TRUE(l.is_bytes(1));
  EXPECT_EQ(l.offset(1), 64u);
  EXPECT_EQ(l.bytes(), 64u + 64u + 128u) << "5 offsets on one line, then 100 value bytes rounded up";
  std::vector<std::byte> payload(l.bytes());
  const std::string a = "a caption", b, c(90, 'x');
  std::vector<std::span<const std::byte>> rows{std::as_bytes(std::span(a)), std::as_bytes(std::span(b)),
                                               std::as_bytes(std::span(c))};
  l.put_bytes(payload, 1, rows);
  std::vector<std::byte> desc(kDescriptorBytes);
  write_arrays_descriptor(desc.data(), l, "");
  const SlotContents back = read_descriptor(desc.data(), l.bytes());
  ASSERT_TRUE(back.layout.is_bytes(1));
  EXPECT_EQ(back.layout.field(1).value_bytes, 100u);
  const BytesColumn col = back.layout.bytes_column(payload, 1, 3);
  ASSERT_EQ(col.size(), 3u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(col[0].data()), col[0].size()), a);
  EXPECT_EQ(col[1].size(), 0u);
  EXPECT_EQ(col[2].size(), 90u);
  EXPECT_THROW(l.view<uint8_t>(payload, 1), std::invalid_argument) << "a byte field is not an array";
  const std::string d(11, 'y');
  rows.push_back(std::as_bytes(std::span(d)));
  try {
    l.put_bytes(payload, 1, rows);
    FAIL() << "101 bytes went into 100";
  } catch (const std::length_error& e) {
    EXPECT_NE(std::string(e.what()).find("needs 110 bytes; the slot holds 100 (row 3"), std::string::npos) << e.what();
  }
  reinterpret_cast<uint64_t*>(payload.data() + l.offset(1))[2] = 1000;
  EXPECT_THROW(l.bytes_column(payload, 1, 3), std::runtime_error) << "an offset past the values";
}

// Proves: workers write typed fields whose size changes from batch to batch (growing
// slots from 64 KiB to several MiB); the consumer reads each batch's own layout, and
// kept batches keep their values while later ones grow other slots.
TEST(SlotLayout, TypedBatchesOfGrowingSizeArriveIntactThroughALoader) {
  LoaderOptions o;
  o.num_workers = 2;
  o.batch_capacity = 4;
  std::vector<std::vector<int64_t>> batches;
  for (int64_t b = 0; b < 12; ++b) batches.push_back({4 * b, 4 * b + 1, 4 * b + 2, 4 * b + 3});
  auto body = [](WorkerContext& ctx) {
    while (auto item = ctx.claim()) {
      const int64_t width = 1000 * (item->batch_id + 1) * (item->batch_id + 1);  // up to 144,000 floats
      SlotLayout layout({{"<f4", {width}}, {"<i8", {}}}, 4);
      std::span<std::byte> out = ctx.begin_arrays(*item, layout, "w=" + std::to_string(width));
      auto values = layout.view<float>(out, 0);
      auto ids = layout.view<int64_t>(out, 1);
      for (std::size_t i = 0; i < item->indices.size(); ++i) {
        std::fill_n(values.begin() + static_cast<std::ptrdiff_t>(i * width), width,
                    static_cast<float>(item->indices[i]));
        ids[i] = item->indices[i];
      }
      ctx.commit(*item);
    }
    return 0;
  };
  Loader loader(o, batches, Launcher::fork(body));
  std::vector<Batch> kept;
  while (auto b = loader.next()) {
    const int64_t width = 1000 * (b->batch_id() + 1) * (b->batch_id() + 1);
    ASSERT_EQ(b->kind(), PayloadKind::kArrays);
    EXPECT_EQ(b->structure(), "w=" + std::to_string(width));
    EXPECT_EQ(b->layout().field(0).shape, std::vector<int64_t>{width});
    auto values = b->field<float>(0);
    ASSERT_EQ(values.size(), static_cast<std::size_t>(4 * width));
    for (std::size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(b->field<int64_t>(1)[i], b->indices()[i]);
      EXPECT_EQ(values[i * width], static_cast<float>(b->indices()[i]));
      EXPECT_EQ(values[(i + 1) * width - 1], static_cast<float>(b->indices()[i]));
    }
    EXPECT_THROW(b->field<double>(0), std::invalid_argument) << "wrong item size";
    if (b->batch_id() % 3 == 0) kept.push_back(std::move(*b));
  }
  for (const Batch& b : kept)
    EXPECT_EQ(b.field<float>(0).back(), static_cast<float>(b.indices().back())) << "kept batch " << b.batch_id();
}

// Proves: a payload of parts holds room the worker filled before knowing it is a part (added
// in place, not copied: the consumer's part starts where the room did) and bytes copied in;
// a span straddling the room's end is refused, and so is a trailer naming bytes past the payload.
TEST(PayloadParts, RoomFilledInPlaceAndCopiedBytesArriveAsPartsOfTheSlot) {
  LoaderOptions o;
  o.num_workers = 1;
  o.batch_capacity = 1;
  auto body = [](WorkerContext& ctx) {
    while (auto item = ctx.claim()) {
      PartsWriter parts(ctx, *item);
      std::span<std::byte> room = parts.allocate(3 << 20);  // grows the slot
      std::memset(room.data(), static_cast<int>(item->indices[0]), room.size());
      std::string refused = "no";
      try {
        parts.add(std::span<const std::byte>(room.data() + 8, room.size()));
      } catch (const std::invalid_argument&) {
        refused = "yes";
      }
      const std::string head = "head of " + std::to_string(item->indices[0]);
      parts.add(std::as_bytes(std::span(head)));
      parts.add(room);
      parts.add(std::as_bytes(std::span(refused)));
      parts.finish();
      ctx.commit(*item);
    }
    return 0;
  };
  Loader loader(o, std::vector<std::vector<int64_t>>{{7}, {9}}, Launcher::fork(body));
  int seen = 0;
  while (auto b = loader.next()) {
    ++seen;
    ASSERT_EQ(b->kind(), PayloadKind::kBytes);
    const auto parts = read_parts(b->data());
    ASSERT_EQ(parts.size(), 3u);
    const auto as_text = [](std::span<std::byte> p) { return std::string(reinterpret_cast<char*>(p.data()), p.size()); };
    EXPECT_EQ(as_text(parts[0]), "head of " + std::to_string(b->indices()[0]));
    EXPECT_EQ(parts[1].data(), b->data().data()) << "the room, in place at the payload's start";
    ASSERT_EQ(parts[1].size(), 3u << 20);
    EXPECT_EQ(static_cast<int>(parts[1].back()), b->indices()[0]);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(parts[0].data()) % kPartAlign, 0u) << "a copied part is aligned";
    EXPECT_EQ(as_text(parts[2]), "yes") << "a span past the room is refused";
    std::vector<std::byte> garbled(b->data().begin(), b->data().end());
    const uint64_t huge = 1u << 30;
    std::memcpy(garbled.data() + garbled.size() - 16, &huge, sizeof(huge));  // the last part's size
    EXPECT_THROW(read_parts(garbled), std::runtime_error);
  }
  EXPECT_EQ(seen, 2);
}

// The samples of the put_rows / put_row tests: a float row of kWidth values
// (index + an offset) and an int64 (-index), batches of up to 4.
constexpr int64_t kWidth = 3000;  // 12 KB rows: the streaming-store path

SlotLayout sample_layout() { return SlotLayout({{"<f4", {kWidth}}, {"<i8", {}}}, 4); }

LoaderOptions one_worker_of_4() {
  LoaderOptions o;
  o.num_workers = 1;
  o.batch_capacity = 4;
  return o;
}

// Checks a batch of those samples.
void expect_sample_rows(const Batch& b, std::string_view structure, float offset) {
  ASSERT_EQ(b.kind(), PayloadKind::kArrays);
  EXPECT_EQ(b.structure(), structure);
  auto values = b.field<float>(0);
  auto ids = b.field<int64_t>(1);
  const auto w = static_cast<std::size_t>(kWidth);
  for (std::size_t i = 0; i < b.count(); ++i) {
    EXPECT_EQ(values[i * w], static_cast<float>(b.indices()[i]) + offset);
    EXPECT_EQ(values[(i + 1) * w - 1], static_cast<float>(b.indices()[i]) + offset);
    EXPECT_EQ(ids[i], -b.indices()[i]);
  }
}

// Proves: put_rows copies row r of field f from rows[r * fields + f] into the
// layout's blocks (large rows by streaming stores, small ones by memcpy), the
// count taken from the rows given (a short batch), and refuses a row count that
// is not whole samples or more samples than the item holds.
TEST(SlotLayout, PutRowsCopiesSampleMajorRowsIntoTheFieldBlocks) {
  const LoaderOptions o = one_worker_of_4();
  auto body = [](WorkerContext& ctx) {
    const SlotLayout layout = sample_layout();
    while (auto item = ctx.claim()) {
      const std::size_t n = item->indices.size() - (item->batch_id == 1 ? 1 : 0);  // batch 1: one row short
      std::vector<std::vector<float>> values;
      std::vector<int64_t> ids(n);
      std::vector<const std::byte*> rows;
      for (std::size_t i = 0; i < n; ++i) {
        values.emplace_back(kWidth, static_cast<float>(item->indices[i]) + 0.5f);
        ids[i] = -item->indices[i];
      }
      for (std::size_t i = 0; i < n; ++i) {
        rows.push_back(reinterpret_cast<const std::byte*>(values[i].data()));
        rows.push_back(reinterpret_cast<const std::byte*>(&ids[i]));
      }
      std::vector<const std::byte*> odd(rows.begin(), rows.end() - 1), more(rows);
      more.insert(more.end(), rows.begin(), rows.end());
      EXPECT_THROW(ctx.put_rows(*item, layout, "s", odd), std::invalid_argument) << "half a sample";
      EXPECT_THROW(ctx.put_rows(*item, layout, "s", more), std::invalid_argument) << "more samples than the item";
      ctx.put_rows(*item, layout, "rows", rows);
      ctx.commit(*item, static_cast<uint32_t>(n));
    }
    return 0;
  };
  const std::vector<std::vector<int64_t>> batches{{0, 1, 2, 3}, {4, 5, 6, 7}};
  Loader loader(o, batches, Launcher::fork(body));
  std::size_t seen = 0;
  while (auto b = loader.next()) {
    EXPECT_EQ(b->count(), b->batch_id() == 1 ? 3u : 4u);
    expect_sample_rows(*b, "rows", 0.5f);
    seen += b->count();
  }
  EXPECT_EQ(seen, 7u);
}

// Proves: put_row copies one sample's rows (field f from field_rows[f]) into
// row r of each field's block, rows written in any order, each sample's
// buffer free to be reused once put_row returns (as a worker copying each
// sample as it reads it does); it refuses a wrong field count or a row past
// the layout's capacity.
TEST(SlotLayout, PutRowCopiesOneSampleIntoItsRowOfEveryField) {
  const LoaderOptions o = one_worker_of_4();
  auto body = [](WorkerContext& ctx) {
    const SlotLayout layout = sample_layout();
    std::vector<float> value(kWidth);  // one buffer, refilled for every sample
    int64_t id = 0;
    while (auto item = ctx.claim()) {
      std::span<std::byte> out = ctx.begin_arrays(*item, layout, "row");
      const std::vector<const std::byte*> rows{reinterpret_cast<const std::byte*>(value.data()),
                                               reinterpret_cast<const std::byte*>(&id)};
      EXPECT_THROW(ctx.put_row(layout, out, 0, std::span(rows).first(1)), std::invalid_argument) << "one field";
      EXPECT_THROW(ctx.put_row(layout, out, 4, rows), std::invalid_argument) << "row past the capacity";
      for (std::size_t i = item->indices.size(); i-- > 0;) {  // last row first
        std::fill(value.begin(), value.end(), static_cast<float>(item->indices[i]) + 0.25f);
        id = -item->indices[i];
        ctx.put_row(layout, out, i, rows);
      }
      ctx.commit(*item);
    }
    return 0;
  };
  const std::vector<std::vector<int64_t>> batches{{0, 1, 2, 3}, {4, 5, 6}};
  Loader loader(o, batches, Launcher::fork(body));
  std::size_t seen = 0;
  while (auto b = loader.next()) {
    expect_sample_rows(*b, "row", 0.25f);
    seen += b->count();
  }
  EXPECT_EQ(seen, 7u);
}

}  // namespace
}  // namespace spindle
