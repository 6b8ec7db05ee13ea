// Rng, crop-box rules, resize, crop, flip, normalize (everything but decoding).
#include <spindle/error.hpp>
#include <spindle/ops/image_ops.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "resample.hpp"

namespace spindle::ops {

namespace {

// splitmix64's finalizer: a bijection with full avalanche.
constexpr uint64_t mix(uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

void check_image(const Image& img, const char* what) {
  if (img.height <= 0 || img.width <= 0 || img.channels <= 0 ||
      img.pixels.size() != static_cast<size_t>(img.height) * img.width * img.channels) {
    SPINDLE_THROW(std::invalid_argument,
                  std::string(what) + ": the image is empty or its pixels do not hold height*width*channels bytes (" +
                      std::to_string(img.height) + "x" + std::to_string(img.width) + "x" +
                      std::to_string(img.channels) + ", " + std::to_string(img.pixels.size()) + " bytes)");
  }
}

}  // namespace

// The key hashes the three numbers in turn (each step a bijection of the
// previous state xor the next input), so nearby (epoch, index) pairs give
// unrelated streams; draw n is mix(key + n * golden), splitmix64's sequence.
Rng::Rng(uint64_t seed, uint64_t epoch, uint64_t index) noexcept
    : key_(mix(mix(mix(seed + kGolden) ^ (epoch * 0xd1b54a32d192ed03ULL)) ^ (index * 0xaef17502108ef2d9ULL))) {}

uint64_t Rng::next_u64() noexcept { return mix(key_ + (++counter_) * kGolden); }

double Rng::uniform() noexcept { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

double Rng::uniform(double a, double b) noexcept { return a + (b - a) * uniform(); }

int64_t Rng::randint(int64_t lo, int64_t hi) noexcept {
  // Lemire's multiply-shift: bias below 2^-64 * range, irrelevant for image sides.
  const auto range = static_cast<uint64_t>(hi - lo);
  return lo + static_cast<int64_t>((static_cast<unsigned __int128>(next_u64()) * range) >> 64);
}

CropBox random_resized_crop_box(int height, int width, Rng& rng, std::pair<double, double> scale,
                                std::pair<double, double> ratio) {
  if (height <= 0 || width <= 0) {
    SPINDLE_THROW(std::invalid_argument, "random_resized_crop_box: image size " + std::to_string(height) + "x" +
                                             std::to_string(width) + " is empty");
  }
  if (!(scale.first <= scale.second) || !(ratio.first <= ratio.second) || !(ratio.first > 0)) {
    SPINDLE_THROW(std::invalid_argument,
                  "random_resized_crop_box: scale and ratio must be (min, max) ranges with min <= max and ratio > 0");
  }
  // torchvision.transforms.RandomResizedCrop.get_params, step for step; Python's
  // round() is half-to-even, which is std::nearbyint in the default rounding mode.
  const double area = static_cast<double>(height) * width;
  const double log_lo = std::log(ratio.first), log_hi = std::log(ratio.second);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * rng.uniform(scale.first, scale.second);
    const double aspect = std::exp(rng.uniform(log_lo, log_hi));
    const double wf = std::nearbyint(std::sqrt(target_area * aspect));
    const double hf = std::nearbyint(std::sqrt(target_area / aspect));
    if (0 < wf && wf <= width && 0 < hf && hf <= height) {
      const int w = static_cast<int>(wf), h = static_cast<int>(hf);
      const int top = static_cast<int>(rng.randint(0, height - h + 1));
      const int left = static_cast<int>(rng.randint(0, width - w + 1));
      return {top, left, h, w};
    }
  }
  const double in_ratio = static_cast<double>(width) / height;
  int w = width, h = height;
  if (in_ratio < ratio.first) {
    h = std::max(1, static_cast<int>(std::nearbyint(w / ratio.first)));
  } else if (in_ratio > ratio.second) {
    w = std::max(1, static_cast<int>(std::nearbyint(h * ratio.second)));
  }
  return {(height - h) / 2, (width - w) / 2, h, w};
}

CropBox center_crop_box(int height, int width, Size size) {
  if (height <= 0 || width <= 0 || size.height <= 0 || size.width <= 0) {
    SPINDLE_THROW(std::invalid_argument, "center_crop_box: image " + std::to_string(height) + "x" +
                                             std::to_string(width) + " and crop " + std::to_string(size.height) +
                                             "x" + std::to_string(size.width) + " must be positive");
  }
  // torchvision.transforms.functional.center_crop: a dimension the crop
  // exceeds is first padded by (crop - side) // 2 before (and the rest after),
  // which makes the crop's start there -((crop - side) // 2) in this image.
  auto start = [](int side, int crop) {
    return crop > side ? -((crop - side) / 2) : static_cast<int>(std::nearbyint((side - crop) / 2.0));
  };
  return {start(height, size.height), start(width, size.width), size.height, size.width};
}

void resize(const Image& in, Size size, Image& out) {
  check_image(in, "resize");
  if (size.height <= 0 || size.width <= 0) {
    SPINDLE_THROW(std::invalid_argument, "resize: target size " + std::to_string(size.height) + "x" +
                                             std::to_string(size.width) + " must be positive");
  }
  if (&in == &out) {
    Image tmp;
    detail::resample(in.pixels.data(), in.height, in.width, in.channels,
                     {0, 0, static_cast<double>(in.height), static_cast<double>(in.width)}, size, tmp);
    out = std::move(tmp);
    return;
  }
  detail::resample(in.pixels.data(), in.height, in.width, in.channels,
                   {0, 0, static_cast<double>(in.height), static_cast<double>(in.width)}, size, out);
}

void crop(const Image& in, const CropBox& box, Image& out) {
  check_image(in, "crop");
  if (box.height <= 0 || box.width <= 0 || int64_t{box.height} * box.width > kMaxImagePixels) {
    SPINDLE_THROW(std::invalid_argument, "crop: box " + std::to_string(box.height) + "x" + std::to_string(box.width) +
                                             " must be positive and at most " + std::to_string(kMaxImagePixels) +
                                             " pixels");
  }
  Image tmp;
  Image& dst = (&in == &out) ? tmp : out;
  dst.height = box.height;
  dst.width = box.width;
  dst.channels = in.channels;
  const int c = in.channels;
  // The part of the box inside the image; the rest is zeros.
  const int y0 = std::max(0, box.top), y1 = std::min(in.height, box.top + box.height);
  const int x0 = std::max(0, box.left), x1 = std::min(in.width, box.left + box.width);
  const bool padded = y0 != box.top || x0 != box.left || y1 != box.top + box.height || x1 != box.left + box.width;
  if (padded) {
    dst.pixels.assign(static_cast<size_t>(box.height) * box.width * c, 0);
  } else {
    dst.pixels.resize(static_cast<size_t>(box.height) * box.width * c);
  }
  if (y1 > y0 && x1 > x0) {
    const size_t row = static_cast<size_t>(x1 - x0) * c;
    for (int y = y0; y < y1; ++y) {
      std::memcpy(dst.pixels.data() + (static_cast<size_t>(y - box.top) * box.width + (x0 - box.left)) * c,
                  in.pixels.data() + (static_cast<size_t>(y) * in.width + x0) * c, row);
    }
  }
  if (&in == &out) out = std::move(tmp);
}

void hflip(Image& img) noexcept {
  const int c = img.channels;
  if (img.pixels.size() != static_cast<size_t>(img.height) * img.width * c) return;
  for (int y = 0; y < img.height; ++y) {
    uint8_t* row = img.pixels.data() + static_cast<size_t>(y) * img.width * c;
    if (c == 3) {
      for (int l = 0, r = img.width - 1; l < r; ++l, --r) {
        std::swap(row[3 * l], row[3 * r]);
        std::swap(row[3 * l + 1], row[3 * r + 1]);
        std::swap(row[3 * l + 2], row[3 * r + 2]);
      }
    } else {
      for (int l = 0, r = img.width - 1; l < r; ++l, --r) std::swap_ranges(row + l * c, row + (l + 1) * c, row + r * c);
    }
  }
}

void normalize(const Image& in, std::span<const float> mean, std::span<const float> std, bool chw,
               std::span<float> out) {
  check_image(in, "normalize");
  const int c = in.channels;
  const size_t hw = static_cast<size_t>(in.height) * in.width;
  if (mean.size() != static_cast<size_t>(c) || std.size() != static_cast<size_t>(c) || out.size() != hw * c) {
    SPINDLE_THROW(std::invalid_argument, "normalize: need " + std::to_string(c) + " means and stds and an output of " +
                                             std::to_string(hw * c) + " floats, got " + std::to_string(mean.size()) +
                                             ", " + std::to_string(std.size()) + " and " + std::to_string(out.size()));
  }
  // (x / 255 - m) / s as one multiply-add per value: x * a + b.
  float a[16], b[16];
  if (c > 16) SPINDLE_THROW(std::invalid_argument, "normalize: at most 16 channels");
  for (int k = 0; k < c; ++k) {
    if (!(std[k] != 0.0f)) SPINDLE_THROW(std::invalid_argument, "normalize: std must be non-zero");
    a[k] = 1.0f / (255.0f * std[k]);
    b[k] = -mean[k] / std[k];
  }
  const uint8_t* p = in.pixels.data();
  if (chw) {
    for (int k = 0; k < c; ++k) {
      float* o = out.data() + k * hw;
      for (size_t i = 0; i < hw; ++i) o[i] = static_cast<float>(p[i * c + k]) * a[k] + b[k];
    }
  } else {
    for (size_t i = 0; i < hw; ++i)
      for (int k = 0; k < c; ++k) out[i * c + k] = static_cast<float>(p[i * c + k]) * a[k] + b[k];
  }
}

}  // namespace spindle::ops
