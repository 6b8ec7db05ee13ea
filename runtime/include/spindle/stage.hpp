#pragma once
// The stage model of native pipelines: a pipeline is a source, then
// per-sample stages over a Sample of named, typed fields, then batching.
//
// A Sample's fields:
//   "image"  the encoded bytes until a decode stage, then uint8 HWC RGB pixels
//            (ops::Image); after normalize, float32 (written at batching)
//   "label"  int64 (-1 where the source has none)
//   byte fields, by name: variable-length byte strings (a WebDataset sample's
//            kept members "txt", "json", ...; or what a stage adds)
//
// A Stage is a name, what it needs the image to be (encoded, pixels, or
// anything: a stage that only reads or writes labels and byte fields), what
// it does to the image's size, and a callable over the Sample and the
// sample's Rng. The Rng is the sample's own stream, Rng(seed, epoch, sample),
// shared by all its stages in order: a stage's draws depend only on the
// sample and the stages before it, never on the worker, the thread or the
// mode, so processes and threads give the same bytes.
//
// The pipeline validates the list when it is built (Pipeline's constructor):
// a stage that needs pixels before decode, decode twice, a pixel stage after
// normalize, or an image whose size is not fixed at the end is an
// std::invalid_argument naming the stage and what to change. It fuses where
// the result is the same bytes: decode directly followed by
// random_resized_crop (and random_flip) is one decode_resized call (only the
// crop's rows are decoded, DCT-scaled), decode followed by center_crop
// decodes only the crop, and a final normalize writes straight into the slot.
//
// A user-defined stage (user_stage) is any callable; it runs on whichever
// worker or thread fills the batch, so it must be safe to call from many
// threads at once (no unguarded shared state) and must not start threads. It
// may change the image's pixels in place, the label and the byte fields it
// declared (or the source keeps); it keeps the image's size unless it
// declares the size it makes (UserStage::output_size). It throws
// spindle::DataError (or any std::exception) for a bad sample: on_error
// decides, as for a decoder's error.
//
// Adding a built-in stage: write its factory in runtime/src/stages.cpp
// (name, needs, size_after, run; Stage::Kind::kPlain unless the pipeline
// fuses it), declare it in namespace spindle::stages below, bind it in
// python/bindings/register_pipeline.cpp (the `Stage` class's static methods)
// and give python/spindle/pipeline.py's Pipeline a builder method that
// checks its arguments and appends ("name", args). Nothing else changes.

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string_view>
#include <string>
#include <utility>
#include <vector>

#include <spindle/ops/image_ops.hpp>

namespace spindle {

// A sample's identity in errors: `origin` for the message ("sample 3
// (root/cls/a.jpg)", "shard.tar:key"), `path` and `key` for DecodeError /
// DataError's fields (the file or shard; the WebDataset key, empty otherwise).
struct SampleId {
  std::string origin;
  std::string path;
  std::string key;
};

// One sample going through the stages.
struct Sample {
  std::span<const std::byte> encoded;  // "image" before decode (valid while the sample runs)
  ops::Image image;                    // "image" after decode
  bool decoded = false;
  int64_t label = -1;
  // Variable-length byte fields by name. Only the names the pipeline lays out
  // (the source's keep list and the stages' adds_bytes) reach the batch.
  std::map<std::string, std::vector<std::byte>, std::less<>> bytes;
  const SampleId* id = nullptr;

  // Byte field `name`; throws DataError naming the sample if it has none.
  std::vector<std::byte>& bytes_field(std::string_view name);
};

using StageFn = std::function<void(Sample&, ops::Rng&)>;

struct Stage {
  // What the pipeline may fuse (built-ins only); kPlain stages just run `run`.
  enum class Kind { kPlain, kDecode, kRandomResizedCrop, kCenterCrop, kFlip, kNormalize };
  // What the image must be when the stage runs.
  enum class Needs { kEncoded, kPixels, kAnything };

  Kind kind = Kind::kPlain;
  std::string name;  // in errors: "random_resized_crop", or the user's name
  Needs needs = Needs::kPixels;
  // The image's size after this stage, given the size before it (nullopt: not
  // known until a sample runs). Empty function: the size does not change.
  std::function<std::optional<ops::Size>(std::optional<ops::Size>)> size_after;
  StageFn run;  // the per-sample work (decode and normalize are done by the pipeline itself)
  // Byte fields this stage adds to every sample (laid out in the batch).
  std::vector<std::string> adds_bytes;

  // Parameters of the built-ins the pipeline fuses (read by the pipeline only).
  struct Fused {
    ops::Size size;  // kRandomResizedCrop, kCenterCrop: the output size
    std::pair<double, double> scale{0.08, 1.0}, ratio{3.0 / 4.0, 4.0 / 3.0};
    double p = 0.0;  // kFlip
    std::array<float, 3> mean{}, std{};  // kNormalize
    bool chw = false;
  } fused;
};

// A user-defined stage: `fn` over the sample and its Rng.
struct UserStage {
  std::string name;
  StageFn fn;
  Stage::Needs needs = Stage::Needs::kPixels;
  std::optional<ops::Size> output_size;  // the size it makes, if it changes it
  std::vector<std::string> adds_bytes;   // byte fields it adds
};
Stage user_stage(UserStage stage);

// The built-in stages (what pipeline.py's builder names).
namespace stages {
// Encoded JPEG/PNG -> RGB uint8 pixels.
Stage decode();
// torchvision RandomResizedCrop(size, scale, ratio): a random box, resized to `size`.
Stage random_resized_crop(ops::Size size, std::pair<double, double> scale = {0.08, 1.0},
                          std::pair<double, double> ratio = {3.0 / 4.0, 4.0 / 3.0});
// torchvision CenterCrop(size).
Stage center_crop(ops::Size size);
// torchvision Resize(int): the shorter side to `shorter`, keeping the aspect.
Stage resize_shorter(int shorter);
// torchvision Resize((h, w)): to exactly `size` (antialiased bilinear, as PIL).
Stage resize(ops::Size size);
// Horizontal flip with probability p (one draw per sample).
Stage random_flip(double p = 0.5);
// torchvision ColorJitter: the set adjustments (ops::ColorJitter's ranges) in
// an order, with factors, drawn per sample from its Rng (ops::draw_color_jitter).
Stage color_jitter(ops::ColorJitter jitter);
// torchvision RandomGrayscale(p): the 3-channel grayscale with probability p (one draw).
Stage random_grayscale(double p);
// float32 (x / 255 - mean) / std per channel, [H, W, 3] or [3, H, W] (chw);
// the last stage that touches the image.
Stage normalize(std::array<float, 3> mean, std::array<float, 3> std, bool chw = false);
}  // namespace stages

}  // namespace spindle
