// The stage model of native pipelines (stage.hpp): stages run in the order
// given and are validated when the pipeline is built; a user-defined stage
// runs next to the built-ins in processes and threads mode with the same
// bytes; byte fields (variable length) reach the batch through SlotLayout.
#include <spindle/loader.hpp>
#include <spindle/pipeline.hpp>
#include <spindle/stage.hpp>

#include <cstring>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "jpeg_encode.hpp"
#include "npy_images.hpp"  // runtime/examples
#include "tar_write.hpp"
#include "test_support.hpp"

namespace spindle {
namespace {

using testing::TempDir;

// A .npy of n images [n, h, w, 3] uint8, a pattern per image (the examples' writer).
std::string write_npy(const TempDir& dir, int n, int h, int w) {
  const std::string path = (dir.path() / "images.npy").string();
  EXPECT_TRUE(spindle_examples::write_npy_images(path, n, h, w, {7, 3, 5})) << path;
  return path;
}

// An image folder of n JPEGs (one class) of varied sizes.
std::string write_folder(const TempDir& dir, int n) {
  for (int i = 0; i < n; ++i) {
    ops::Image img;
    img.height = 40 + 3 * i;
    img.width = 56 + 5 * (i % 4);
    img.pixels.resize(static_cast<std::size_t>(img.height) * img.width * 3);
    for (std::size_t k = 0; k < img.pixels.size(); ++k) img.pixels[k] = static_cast<uint8_t>((k * 31 + i * 17) % 251);
    const auto jpeg = testing::encode_jpeg(img, 90);
    char name[16];
    std::snprintf(name, sizeof name, "%02d.jpg", i);
    testing::write_file(dir.path() / "folder" / "cls" / name, std::string(reinterpret_cast<const char*>(jpeg.data()),
                                                                           jpeg.size()));
  }
  return (dir.path() / "folder").string();
}

// A user stage named `name` running `fn`, needing `needs`.
UserStage user(std::string name, StageFn fn, Stage::Needs needs = Stage::Needs::kPixels) {
  UserStage u;
  u.name = std::move(name);
  u.fn = std::move(fn);
  u.needs = needs;
  return u;
}

// A user stage: a colour transform (invert the green channel, add a random
// offset to red) and a caption of a length that varies per sample.
Stage tint_and_caption() {
  UserStage u;
  u.name = "tint";
  u.adds_bytes = {"caption"};
  u.fn = [](Sample& s, ops::Rng& rng) {
    const auto offset = static_cast<uint8_t>(rng.randint(0, 32));
    for (std::size_t k = 0; k < s.image.pixels.size(); k += 3) {
      s.image.pixels[k] = static_cast<uint8_t>(s.image.pixels[k] + offset);
      s.image.pixels[k + 1] = static_cast<uint8_t>(255 - s.image.pixels[k + 1]);
    }
    std::string text = "label " + std::to_string(s.label) + " offset " + std::to_string(offset);
    text.append(static_cast<std::size_t>(offset), '!');
    auto& caption = s.bytes["caption"];
    caption.resize(text.size());
    std::memcpy(caption.data(), text.data(), text.size());
  };
  return user_stage(std::move(u));
}

struct Epoch {
  std::vector<std::vector<uint8_t>> images;
  std::vector<std::vector<std::string>> captions;
  bool operator==(const Epoch&) const = default;
};

Epoch run(std::shared_ptr<const Pipeline> pipe, bool threads, int workers, uint32_t batch) {
  std::vector<int64_t> order(pipe->size());
  std::iota(order.begin(), order.end(), 0);
  LoaderOptions lo;
  lo.num_workers = workers;
  lo.batch_capacity = batch;
  lo.slot_bytes = pipe->layout(batch).bytes();
  const auto plan = BatchPlan::chunked(order, batch, false);
  WorkerMain body = pipeline_worker(pipe, 5, 1);
  Loader loader(lo, plan, threads ? Launcher::threads(std::move(body)) : Launcher::fork(std::move(body)));
  Epoch out;
  while (auto b = loader.next()) {
    const auto image = b->field<uint8_t>(0);
    out.images.emplace_back(image.begin(), image.end());
    if (b->layout().num_fields() < 3) continue;
    const BytesColumn c = b->bytes(2);
    std::vector<std::string> captions;
    for (std::size_t r = 0; r < c.size(); ++r)
      captions.emplace_back(reinterpret_cast<const char*>(c[r].data()), c[r].size());
    out.captions.push_back(std::move(captions));
  }
  return out;
}

// Proves: a user stage between built-ins, adding a variable-length byte field, gives the same
// bytes in processes and threads mode and with 1, 2 or 3 workers; each caption is the stage's own.
TEST(PipelineStages, UserStageAndCaptionsAreTheSameInBothModesAndAnyWorkerCount) {
  TempDir dir;
  PipelineOptions o;
  o.image_folder = write_folder(dir, 23);
  o.stages = {stages::decode(), stages::random_resized_crop({24, 32}), tint_and_caption(), stages::random_flip(0.5)};
  auto pipe = std::make_shared<const Pipeline>(o);
  ASSERT_EQ(pipe->field_names(), (std::vector<std::string>{"image", "label", "caption"}));
  const Epoch reference = run(pipe, false, 1, 5);
  ASSERT_EQ(reference.images.size(), 5u);
  EXPECT_EQ(reference.images[0].size(), 5u * 24 * 32 * 3);
  EXPECT_EQ(reference.captions.back().size(), 3u) << "a short last batch has its own count of captions";
  std::set<std::size_t> lengths;
  for (const auto& batch : reference.captions)
    for (const auto& c : batch) {
      EXPECT_EQ(c.rfind("label 0 offset ", 0), 0u) << c;
      lengths.insert(c.size());
    }
  EXPECT_GT(lengths.size(), 3u) << "captions of many lengths";
  for (bool threads : {false, true})
    for (int workers : {1, 2, 3})
      EXPECT_EQ(run(pipe, threads, workers, 5), reference) << (threads ? "threads" : "processes") << " x" << workers;
}

// Proves: the stages run in the order given: a marker pixel set before a flip ends up on the
// right, set after it on the left; set before a center crop it is cropped away.
TEST(PipelineStages, StagesRunInTheOrderGiven) {
  TempDir dir;
  PipelineOptions o;
  o.npy = write_npy(dir, 2, 20, 30);
  const Stage mark = user_stage(user("mark", [](Sample& s, ops::Rng&) {
    s.image.pixels[0] = 255;
    s.image.pixels[1] = 1;
  }));
  auto first_row = [&](std::vector<Stage> st) {
    o.stages = std::move(st);
    const Epoch e = run(std::make_shared<const Pipeline>(o), true, 1, 2);
    return e.images.at(0);
  };
  const auto flip_after = first_row({mark, stages::random_flip(1.0)});
  EXPECT_EQ(flip_after[29 * 3 + 1], 1) << "marked, then flipped: the marker is the row's last pixel";
  const auto flip_before = first_row({stages::random_flip(1.0), mark});
  EXPECT_EQ(flip_before[1], 1) << "flipped, then marked: the first pixel";
  const auto crop_after = first_row({mark, stages::center_crop({10, 10})});
  EXPECT_NE(crop_after[1], 1) << "marked, then cropped away";
  const auto crop_before = first_row({stages::center_crop({10, 10}), mark});
  EXPECT_EQ(crop_before[1], 1);
}

std::string invalid(PipelineOptions o) {
  try {
    Pipeline p(std::move(o));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// Proves: a misordered or incomplete stage list is refused when the pipeline is built, naming
// the stage and what to change.
TEST(PipelineStages, OrderErrorsNameTheStageAndTheFix) {
  TempDir dir;
  PipelineOptions folder;
  folder.image_folder = write_folder(dir, 2);
  PipelineOptions arrays;
  arrays.npy = write_npy(dir, 2, 8, 8);
  auto with = [](PipelineOptions o, std::vector<Stage> s) {
    o.stages = std::move(s);
    return o;
  };
  EXPECT_NE(invalid(with(folder, {stages::center_crop({8, 8}), stages::decode()}))
                .find("stage 0 (center_crop) needs decoded pixels: add decode() before it"),
            std::string::npos);
  EXPECT_NE(invalid(with(folder, {stages::decode(), stages::decode(), stages::center_crop({8, 8})}))
                .find("stage 1 (decode)"),
            std::string::npos);
  EXPECT_NE(invalid(with(arrays, {stages::decode()})).find("arrays are already decoded"), std::string::npos);
  EXPECT_NE(invalid(with(folder, {stages::decode(), stages::center_crop({8, 8}),
                                  stages::normalize({0, 0, 0}, {1, 1, 1}), stages::random_flip(0.5)}))
                .find("stage 3 (random_flip) comes after normalize()"),
            std::string::npos);
  EXPECT_NE(invalid(with(folder, {stages::decode()})).find("same size to be batched"), std::string::npos);
  EXPECT_NE(invalid(with(folder, {stages::decode(), stages::resize_shorter(4), stages::random_flip(0.5)}))
                .find("same size to be batched"),
            std::string::npos);
  EXPECT_NE(invalid(with(folder, {})).find("add decode() after the source"), std::string::npos);
  EXPECT_THROW(stages::random_resized_crop({0, 8}), std::invalid_argument);
  EXPECT_THROW(stages::random_flip(1.5), std::invalid_argument);
  EXPECT_THROW(user_stage(user("nameless-fn", nullptr)), std::invalid_argument);
  // A stage that only touches labels and byte fields may come after normalize.
  const UserStage relabel = user("relabel", [](Sample& s, ops::Rng&) { s.label = 1; }, Stage::Needs::kAnything);
  EXPECT_EQ(invalid(with(arrays, {stages::normalize({0, 0, 0}, {1, 1, 1}), user_stage(relabel)})), "");
}

// Proves: a user stage that changes the image's size without declaring it fails its sample
// naming the stage (never a mis-sized batch).
TEST(PipelineStages, UndeclaredSizeChangeNamesTheStage) {
  TempDir dir;
  PipelineOptions o;
  o.npy = write_npy(dir, 2, 8, 8);
  const UserStage shrink = user("shrink", [](Sample& s, ops::Rng&) {
    s.image.width = 4;
    s.image.pixels.resize(8 * 4 * 3);
  });
  o.stages = {user_stage(shrink)};
  Pipeline pipe(o);
  const SlotLayout layout = pipe.layout(1);
  std::vector<std::byte> payload(layout.bytes());
  BatchBytes bytes;
  try {
    pipe.produce(0, 0, 0, layout, payload, 0, bytes);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("stage 0 (shrink) made"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("UserStage::output_size"), std::string::npos) << e.what();
  }
}

// Proves: a batch whose byte fields exceed bytes_per_sample x batch size fails naming the field,
// the sample and the bytes_per_sample that fits; nothing is cut.
TEST(PipelineStages, BytesThatDoNotFitNameTheSampleAndTheSizeToSet) {
  TempDir dir;
  PipelineOptions o;
  o.npy = write_npy(dir, 4, 8, 8);
  o.bytes_per_sample = 10;
  UserStage big = user("big", [](Sample& s, ops::Rng&) { s.bytes["caption"].assign(25, std::byte{'x'}); },
                       Stage::Needs::kAnything);
  big.adds_bytes = {"caption"};
  o.stages = {user_stage(big)};
  auto pipe = std::make_shared<const Pipeline>(o);
  const SlotLayout layout = pipe->layout(4);
  std::vector<std::byte> payload(layout.bytes());
  const std::vector<int64_t> indices{0, 1, 2, 3};
  try {
    fill_batch(*pipe, indices, 0, 0, layout, payload);
    FAIL() << "no error";
  } catch (const std::length_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'caption' fields of a batch of 4 samples take 100 bytes, more than the slot's 40"),
              std::string::npos) << m;
    EXPECT_NE(m.find("sample 1"), std::string::npos) << m;
    EXPECT_NE(m.find("bytes_per_sample to at least 25"), std::string::npos) << m;
  }
  o.bytes_per_sample = 25;
  pipe = std::make_shared<const Pipeline>(o);
  const SlotLayout fits = pipe->layout(4);
  payload.assign(fits.bytes(), std::byte{0});
  fill_batch(*pipe, indices, 0, 0, fits, payload);
  EXPECT_EQ(fits.bytes_column(payload, 2, 4)[3].size(), 25u);
}

// WebDataset shards of 1 to 4 small JPEGs each (key.jpg, key.cls = the shard's number).
std::vector<std::string> write_shards(const TempDir& dir, int count) {
  std::vector<std::string> paths;
  for (int s = 0; s < count; ++s) {
    std::string tar;
    for (int k = 0; k < 1 + s % 4; ++k) {
      ops::Image img;
      img.height = 12 + k;
      img.width = 16;
      img.pixels.assign(static_cast<std::size_t>(img.height) * img.width * 3, static_cast<uint8_t>(20 * s + k));
      const auto jpeg = testing::encode_jpeg(img, 90);
      const std::string key = "s" + std::to_string(s) + "_" + std::to_string(k);
      tar += testing::tar_member(key + ".jpg", std::string(reinterpret_cast<const char*>(jpeg.data()), jpeg.size()));
      tar += testing::tar_member(key + ".cls", std::to_string(s));
    }
    paths.push_back((dir.path() / ("shard-" + std::to_string(s) + ".tar")).string());
    testing::write_file(paths.back(), tar + testing::kTarEnd);
  }
  return paths;
}

struct StreamBatch {
  std::vector<int64_t> labels;
  std::vector<uint8_t> images;
  int stream;
  uint64_t position;
  bool operator==(const StreamBatch&) const = default;
};

// The batches of a stream pipeline whose `logical` workers run on `processes`, started at `starts`
// with batch 0 asked of `first`.
std::vector<StreamBatch> run_stream(std::shared_ptr<const Pipeline> pipe, int logical, int processes,
                                    std::vector<uint64_t> starts = {}, int first = 0) {
  LoaderOptions lo;
  lo.num_workers = logical;
  lo.processes = processes;
  lo.first_worker = first;
  lo.batch_capacity = 3;
  auto loader = make_pipeline_loader(pipe, PipelineEpoch{.seed = 5, .epoch = 2, .stream_starts = std::move(starts)},
                                     lo, PipelineMode::kProcesses);
  std::vector<StreamBatch> out;
  while (auto b = loader->next()) {
    const auto labels = b->field<int64_t>(1);
    const auto images = b->field<uint8_t>(0);
    out.push_back({{labels.begin(), labels.end()}, {images.begin(), images.end()}, b->stream(), b->stream_position()});
  }
  return out;
}

// Proves: a WebDataset stream's logical workers give the same batches on fewer processes; each
// batch says where its stream stands; and streams started from those positions (the last batch's of
// each logical worker), the turn going on after the last batch, give the rest of the epoch exactly:
// what an adaptive stream does on advice. A position past a worker's shards is refused by name.
TEST(PipelineStreams, LogicalWorkersRunOnAnyProcessesAndStartAgainWhereTheirLastBatchLeftThem) {
  TempDir dir;
  PipelineOptions o;
  o.webdataset = write_shards(dir, 11);
  o.stages = {stages::decode(), stages::random_resized_crop({8, 8}), stages::random_flip(0.5)};
  auto pipe = std::make_shared<const Pipeline>(o);
  const std::vector<StreamBatch> reference = run_stream(pipe, 3, 3);
  ASSERT_GE(reference.size(), 8u);
  for (std::size_t k = 0; k < 3; ++k) EXPECT_EQ(reference[k].stream, static_cast<int>(k));
  EXPECT_EQ(run_stream(pipe, 3, 2), reference) << "3 logical workers on 2 processes";
  EXPECT_EQ(run_stream(pipe, 3, 1), reference) << "3 logical workers on 1 process";
  for (std::size_t cut : {1u, 4u, 7u}) {
    std::vector<uint64_t> starts(3, 0);
    for (std::size_t k = 0; k < cut; ++k) starts[static_cast<std::size_t>(reference[k].stream)] = reference[k].position;
    const int first = (reference[cut - 1].stream + 1) % 3;
    const std::vector<StreamBatch> rest(reference.begin() + static_cast<std::ptrdiff_t>(cut), reference.end());
    EXPECT_EQ(run_stream(pipe, 3, 2, starts, first), rest) << "started again after batch " << cut;
  }
  // Shard 20 of a worker that has 4: refused when its first batch is made, naming the reason.
  try {
    run_stream(pipe, 3, 1, {uint64_t{20} << 32, 0, 0});
    ADD_FAILURE() << "a start past the worker's shards was taken";
  } catch (const BatchFailedError& e) {
    EXPECT_NE(std::string(e.what()).find("saved for other shards or workers"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace spindle
