#pragma once
// Image operations of native pipelines: decode (JPEG fused with its crop and
// DCT-domain downscaling; PNG, WebP, TIFF, BMP, PPM/PGM decoded whole), the crop-box rules of torchvision's
// RandomResizedCrop and CenterCrop, PIL-compatible antialiased bilinear resize,
// horizontal flip, torchvision's ColorJitter and RandomGrayscale, and
// normalization to float32.
//
// Every function is single-threaded, starts no threads, prints nothing and is
// safe to call from many threads at once on different images. Bad input
// (truncated, corrupt, empty, not an image) throws spindle::DecodeError with the
// decoder's own message; misuse (an empty crop, a zero size, spans of the wrong
// length) throws std::invalid_argument. A crop box that leaves the image is
// padded with zeros there, as torchvision pads (fill 0) before it crops.
//
// What each op does, the tolerances and the design decisions: docs/ops.md.

#include <cstddef>
#include <cstdint>
#include <array>
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
  // By magic bytes, whatever the file's name: kPnm is binary PPM (P6) or PGM (P5).
  enum class Format { kJpeg, kPng, kWebp, kTiff, kBmp, kPnm } format = Format::kJpeg;
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
// PNG (libspng), WebP (libwebp), TIFF (libtiff, first page), BMP and binary
// 8-bit PPM/PGM (stb_image): the whole image is decoded, then crop + resize.
// The RGB pixels are those of PIL's Image.open().convert("RGB") (exactly for
// lossless files; docs/ops.md has the cases). A crop that leaves the image is
// padded with zeros where it does (then resized).
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

// torchvision CenterCrop's box (top = round((H - h) / 2), half-to-even). A
// crop larger than the image in a dimension leaves it there, as torchvision's
// pad-then-crop does: top = -((h - H) / 2) (floor), so crop() and decode() of
// this box give torchvision's zero-padded result exactly.
[[nodiscard]] CropBox center_crop_box(int height, int width, Size size);

// Antialiased bilinear resize, the algorithm of PIL's Image.resize(BILINEAR):
// separable triangle filter with support max(1, scale), 22-bit fixed-point
// coefficients, uint8 between the passes, in Pillow 13's pass order. Equal to
// PIL's output (tests/python/test_ops.py checks it against the installed Pillow).
void resize(const Image& in, Size size, Image& out);

// Crops `box` out of `in` into `out` (copy); where the box leaves the image,
// zeros (torchvision's pad with fill 0, then crop).
void crop(const Image& in, const CropBox& box, Image& out);

// Mirrors left-right in place.
void hflip(Image& img) noexcept;

// uint8 HWC -> float32 (x / 255 - mean[c]) / std[c], written to `out`
// (height * width * channels floats) in HWC or CHW order. mean and std have
// `channels` entries.
void normalize(const Image& in, std::span<const float> mean, std::span<const float> std, bool chw,
               std::span<float> out);

// ---- colour (torchvision.transforms ColorJitter, RandomGrayscale) -----------
//
// On RGB uint8 pixels, HWC, in place (`rgb.size()` a multiple of 3), with
// torchvision's tensor formulas (transforms.v2.functional.adjust_*, in float32,
// truncated back to uint8): brightness x*f; contrast and saturation blend
// f*x + (1-f)*g with g the mean (contrast) or the per-pixel value (saturation)
// of the floored grayscale 0.2989 R + 0.587 G + 0.114 B; hue rotates H of
// torchvision's HSV by f (in turns) and converts back with x*255.999. Within
// one level of torchvision's tensors (its float32 sums may round differently
// from these); PIL's ImageEnhance/HSV versions differ by a few levels
// (docs/ops.md has the tolerances).
void adjust_brightness(std::span<uint8_t> rgb, double factor);
void adjust_contrast(std::span<uint8_t> rgb, double factor);
void adjust_saturation(std::span<uint8_t> rgb, double factor);
void adjust_hue(std::span<uint8_t> rgb, double factor);  // factor in [-0.5, 0.5]
// torchvision rgb_to_grayscale(num_output_channels=3): the floored gray in all three channels.
void rgb_to_grayscale(std::span<uint8_t> rgb);

// ColorJitter's ranges; nullopt: that adjustment is never applied (torchvision's None).
struct ColorJitter {
  std::optional<std::pair<double, double>> brightness, contrast, saturation, hue;

  // torchvision's constructor: a number v means [max(0, 1 - v), 1 + v] ([-v, v]
  // for hue), a (min, max) pair is taken as given within the bounds ([0, inf),
  // hue [-0.5, 0.5]); a range equal to the identity ({1, 1}, hue {0, 0})
  // becomes nullopt. Throws std::invalid_argument with torchvision's rule.
  static std::optional<std::pair<double, double>> brightness_range(double v);
  static std::optional<std::pair<double, double>> factor_range(std::pair<double, double> range, const char* name);
  static std::optional<std::pair<double, double>> hue_range(double v);
  static std::optional<std::pair<double, double>> hue_range(std::pair<double, double> range);
};

// One sample's draw, ColorJitter.get_params: the order of the four
// adjustments (a permutation of 0 brightness, 1 contrast, 2 saturation, 3 hue)
// and a factor uniform in each range that is set, drawn from `rng` in that
// sequence (permutation first, then b, c, s, h).
struct ColorJitterDraw {
  std::array<int, 4> order{0, 1, 2, 3};
  std::optional<double> brightness, contrast, saturation, hue;
};
[[nodiscard]] ColorJitterDraw draw_color_jitter(const ColorJitter& jitter, Rng& rng);
// Applies a draw: the set adjustments, in its order.
void apply_color_jitter(std::span<uint8_t> rgb, const ColorJitterDraw& draw);

// RandomGrayscale(p): with probability p (rng.uniform() < p, one draw), rgb_to_grayscale. Returns whether.
bool random_grayscale(std::span<uint8_t> rgb, double p, Rng& rng);

}  // namespace spindle::ops
