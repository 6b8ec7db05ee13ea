#pragma once
// Image operations of native pipelines: decode (JPEG fused with its crop and
// DCT-domain downscaling, PNG), the crop-box rules of torchvision's
// RandomResizedCrop and CenterCrop, PIL-compatible antialiased bilinear resize,
// horizontal flip and normalization to float32.
//
// Every function is single-threaded, starts no threads, prints nothing and is
// safe to call from many threads at once on different images. Bad input
// (truncated, corrupt, empty, not an image) throws spindle::DecodeError with the
// decoder's own message; misuse (a crop outside the image, a zero size, spans of
// the wrong length) throws std::invalid_argument.
//
// What each op does, the tolerances and the design decisions: docs/ops.md.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace spindle::ops {

struct Size {
  int height = 0, width = 0;
};

// A rectangle in source-image pixels.
struct CropBox {
  int top = 0, left = 0, height = 0, width = 0;
};

struct ImageInfo {
  int height = 0, width = 0, channels = 0;  // channels as stored (1 gray, 3 RGB, 4 CMYK/RGBA, ...)
  enum class Format { kJpeg, kPng } format = Format::kJpeg;
};

// HWC uint8 RGB image owning its pixels (pixels.size() == height * width * channels).
struct Image {
  int height = 0, width = 0, channels = 3;
  std::vector<uint8_t> pixels;
};

// Counter-based generator: draw n of stream (seed, epoch, index) is a pure
// function of those four numbers, so the same sample gets the same draws in any
// process, thread, worker count or order. Not cryptographic.
class Rng {
 public:
  Rng(uint64_t seed, uint64_t epoch, uint64_t index) noexcept;
  uint64_t next_u64() noexcept;
  double uniform() noexcept;                      // [0, 1), 53 random bits
  double uniform(double a, double b) noexcept;    // [a, b)
  int64_t randint(int64_t lo, int64_t hi) noexcept;  // [lo, hi), hi > lo; like torch.randint

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
};

// Pixels above this (PIL's decompression-bomb limit, 2 * 89478485) are refused
// with DecodeError before anything is allocated.
inline constexpr int64_t kMaxImagePixels = 178956970;

// Reads the headers only (format chosen by magic bytes).
[[nodiscard]] ImageInfo probe(std::span<const std::byte> encoded);

// Decodes `crop` of the image (whole image if nullopt) to RGB and resizes it to
// `size` (no resize if nullopt). `out` is resized to fit; its buffer is reused.
// JPEG: only the crop's rows and iMCU columns are decoded; when the crop is at
// least twice `size` in both dimensions, libjpeg scales it down in the DCT
// domain by 1/2, 1/4 or 1/8 first (never below `size`), and the rest is done
// by resize(). Without DCT scaling the pixels equal PIL's
// Image.open().crop(box).resize(size, BILINEAR) exactly.
// PNG: libspng decodes the whole image, then crop + resize.
void decode(std::span<const std::byte> encoded, const std::optional<CropBox>& crop,
            const std::optional<Size>& size, Image& out);

// What a pipeline does to one sample, chosen once the image's size is known.
struct CropPlan {
  CropBox box;
  bool mirror = false;  // horizontal flip of the result
};

// A pipeline's whole per-sample step in one call, with nothing allocated once
// a thread has warmed up: reads the header once, asks `plan` for the crop and
// flip (given the image's height and width), decodes only that crop as
// decode() does (same DCT-scaling rule), resizes it to `size`, mirrors it when
// asked (inside the resize's horizontal pass) and writes size.height x
// size.width x 3 bytes to `out`. The pixels are those of decode(crop, size)
// followed by hflip, bit for bit. `plan` may throw; it runs once.
void decode_resized(std::span<const std::byte> encoded, const std::function<CropPlan(int height, int width)>& plan,
                    Size size, std::span<uint8_t> out);

// torchvision.transforms.RandomResizedCrop.get_params: up to 10 tries of an
// area fraction uniform in `scale` and a log-uniform aspect ratio (w/h) in
// `ratio`, sides rounded half-to-even; then the center crop clamped to the ratio
// range. The draws come from `rng` (not torch's generator, so the boxes follow the
// same distribution, not the same values).
[[nodiscard]] CropBox random_resized_crop_box(int height, int width, Rng& rng,
                                              std::pair<double, double> scale = {0.08, 1.0},
                                              std::pair<double, double> ratio = {3.0 / 4, 4.0 / 3});

// torchvision CenterCrop's box (top = round((H - h) / 2), half-to-even). Where
// torchvision pads a crop larger than the image with zeros, this clamps the
// crop to the image instead (the box never leaves the image).
[[nodiscard]] CropBox center_crop_box(int height, int width, Size size);

// Antialiased bilinear resize, the algorithm of PIL's Image.resize(BILINEAR):
// separable triangle filter with support max(1, scale), 22-bit fixed-point
// coefficients, uint8 between the passes, in Pillow 13's pass order. Equal to
// PIL's output (tests/python/test_ops.py checks it against the installed Pillow).
void resize(const Image& in, Size size, Image& out);

// Crops `box` out of `in` into `out` (copy).
void crop(const Image& in, const CropBox& box, Image& out);

// Mirrors left-right in place.
void hflip(Image& img) noexcept;

// uint8 HWC -> float32 (x / 255 - mean[c]) / std[c], written to `out`
// (height * width * channels floats) in HWC or CHW order. mean and std have
// `channels` entries.
void normalize(const Image& in, std::span<const float> mean, std::span<const float> std, bool chw,
               std::span<float> out);

}  // namespace spindle::ops
