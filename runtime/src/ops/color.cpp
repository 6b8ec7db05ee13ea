// ColorJitter and RandomGrayscale: torchvision.transforms.v2.functional's
// adjust_brightness/contrast/saturation/hue and rgb_to_grayscale on uint8
// images, step for step in float32 (the dtype torchvision computes uint8
// images in), truncated back to uint8 as its .to(torch.uint8) does.
#include <spindle/error.hpp>
#include <spindle/ops/image_ops.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace spindle::ops {

namespace {

void check_rgb(std::span<uint8_t> rgb, const char* what) {
  if (rgb.size() % 3 != 0)
    SPINDLE_THROW(std::invalid_argument, std::string(what) + ": " + std::to_string(rgb.size()) +
                                             " bytes are not whole RGB pixels (a multiple of 3)");
}

void check_factor(double f, const char* what) {
  if (!(f >= 0) || !std::isfinite(f))
    SPINDLE_THROW(std::invalid_argument, std::string(what) + " (" + std::to_string(f) + ") is not non-negative.");
}

// float -> uint8 as torch's clamp_(0, 255).to(torch.uint8): clamp, then truncate.
inline uint8_t to_u8(float v) { return static_cast<uint8_t>(std::min(255.0f, std::max(0.0f, v))); }

// _rgb_to_grayscale_image(..., preserve_dtype=False).floor_(): 0.2989 R + 0.587 G + 0.114 B, floored.
inline float gray_floor(const uint8_t* p) {
  float l = static_cast<float>(p[0]) * 0.2989f;
  l = l + static_cast<float>(p[1]) * 0.587f;
  l = l + static_cast<float>(p[2]) * 0.114f;
  return std::floor(l);
}

// _blend(image1, image2, ratio): image1 * ratio + image2 * (1 - ratio) (the
// complement taken in double, as Python does), both products in float32.
struct Blend {
  float ratio, rest;
  explicit Blend(double r) : ratio(static_cast<float>(r)), rest(static_cast<float>(1.0 - r)) {}
  uint8_t operator()(uint8_t x, float other) const { return to_u8(static_cast<float>(x) * ratio + other * rest); }
};

}  // namespace

void adjust_brightness(std::span<uint8_t> rgb, double factor) {
  check_rgb(rgb, "adjust_brightness");
  check_factor(factor, "brightness_factor");
  const float f = static_cast<float>(factor);
  for (uint8_t& x : rgb) x = to_u8(static_cast<float>(x) * f);
}

void adjust_contrast(std::span<uint8_t> rgb, double factor) {
  check_rgb(rgb, "adjust_contrast");
  check_factor(factor, "contrast_factor");
  if (rgb.empty()) return;
  double sum = 0;  // torch.mean of the floored grayscale
  for (size_t i = 0; i < rgb.size(); i += 3) sum += gray_floor(&rgb[i]);
  const float mean = static_cast<float>(sum / static_cast<double>(rgb.size() / 3));
  const Blend blend(factor);
  for (uint8_t& x : rgb) x = blend(x, mean);
}

void adjust_saturation(std::span<uint8_t> rgb, double factor) {
  check_rgb(rgb, "adjust_saturation");
  check_factor(factor, "saturation_factor");
  const Blend blend(factor);
  for (size_t i = 0; i < rgb.size(); i += 3) {
    const float g = gray_floor(&rgb[i]);
    rgb[i] = blend(rgb[i], g);
    rgb[i + 1] = blend(rgb[i + 1], g);
    rgb[i + 2] = blend(rgb[i + 2], g);
  }
}

void adjust_hue(std::span<uint8_t> rgb, double factor) {
  check_rgb(rgb, "adjust_hue");
  if (!(factor >= -0.5 && factor <= 0.5))
    SPINDLE_THROW(std::invalid_argument, "hue_factor (" + std::to_string(factor) + ") is not in [-0.5, 0.5].");
  const float shift = static_cast<float>(factor);
  const float to_unit = static_cast<float>(1.0 / 255.0);  // to_dtype(float32, scale=True): x * (1 / 255)
  const float to_byte = 255.0f + 1.0f - 1e-3f;          // back: x * (255 + 1 - eps), truncated
  for (size_t i = 0; i < rgb.size(); i += 3) {
    const float r = static_cast<float>(rgb[i]) * to_unit, g = static_cast<float>(rgb[i + 1]) * to_unit,
                b = static_cast<float>(rgb[i + 2]) * to_unit;
    // _rgb_to_hsv
    const float maxc = std::max(r, std::max(g, b)), minc = std::min(r, std::min(g, b));
    const bool eqc = maxc == minc;
    const float range = maxc - minc;
    const float s = range / (eqc ? 1.0f : maxc);
    const float div = eqc ? 1.0f : range;
    const float rc = (maxc - r) / div, gc = (maxc - g) / div, bc = (maxc - b) / div;
    float h;
    if (maxc == r) h = bc - gc;
    else if (maxc == g) h = (rc + 2.0f) - bc;
    else h = (gc + 4.0f) - rc;
    h = std::fmod(h * (1.0f / 6.0f) + 1.0f, 1.0f);
    // h.add_(hue_factor).remainder_(1.0)
    h = h + shift;
    h = h - std::floor(h);
    // _hsv_to_rgb
    const float v = maxc;
    const float h6 = h * 6.0f;
    const float fi = std::floor(h6);
    const float f = h6 - fi;
    int sector = static_cast<int>(fi) % 6;
    if (sector < 0) sector += 6;
    const float sxf = s * f, one_minus_s = 1.0f - s;
    const float q = std::clamp((1.0f - sxf) * v, 0.0f, 1.0f);
    const float t = std::clamp((sxf + one_minus_s) * v, 0.0f, 1.0f);
    const float p = std::clamp(one_minus_s * v, 0.0f, 1.0f);
    float ro, go, bo;
    switch (sector) {
      case 0: ro = v, go = t, bo = p; break;
      case 1: ro = q, go = v, bo = p; break;
      case 2: ro = p, go = v, bo = t; break;
      case 3: ro = p, go = q, bo = v; break;
      case 4: ro = t, go = p, bo = v; break;
      default: ro = v, go = p, bo = q; break;
    }
    rgb[i] = static_cast<uint8_t>(ro * to_byte);
    rgb[i + 1] = static_cast<uint8_t>(go * to_byte);
    rgb[i + 2] = static_cast<uint8_t>(bo * to_byte);
  }
}

void rgb_to_grayscale(std::span<uint8_t> rgb) {
  check_rgb(rgb, "rgb_to_grayscale");
  for (size_t i = 0; i < rgb.size(); i += 3) rgb[i] = rgb[i + 1] = rgb[i + 2] = static_cast<uint8_t>(gray_floor(&rgb[i]));
}

// torchvision ColorJitter._check_input.
std::optional<std::pair<double, double>> ColorJitter::brightness_range(double v) {
  if (!(v >= 0) || !std::isfinite(v))
    SPINDLE_THROW(std::invalid_argument, "color_jitter: if brightness/contrast/saturation is a single number, it "
                                         "must be non negative (got " + std::to_string(v) + ")");
  return factor_range({std::max(0.0, 1.0 - v), 1.0 + v}, "brightness/contrast/saturation");
}

std::optional<std::pair<double, double>> ColorJitter::factor_range(std::pair<double, double> r, const char* name) {
  if (!(0 <= r.first && r.first <= r.second && std::isfinite(r.second)))
    SPINDLE_THROW(std::invalid_argument, std::string("color_jitter: ") + name + " values should be between (0, inf), "
                                         "but got (" + std::to_string(r.first) + ", " + std::to_string(r.second) + ")");
  if (r.first == 1.0 && r.second == 1.0) return std::nullopt;
  return r;
}

std::optional<std::pair<double, double>> ColorJitter::hue_range(double v) {
  if (!(v >= 0))
    SPINDLE_THROW(std::invalid_argument, "color_jitter: if hue is a single number, it must be non negative (got " +
                                             std::to_string(v) + ")");
  return hue_range({-v, v});
}

std::optional<std::pair<double, double>> ColorJitter::hue_range(std::pair<double, double> r) {
  if (!(-0.5 <= r.first && r.first <= r.second && r.second <= 0.5))
    SPINDLE_THROW(std::invalid_argument, "color_jitter: hue values should be between (-0.5, 0.5), but got (" +
                                             std::to_string(r.first) + ", " + std::to_string(r.second) + ")");
  if (r.first == 0.0 && r.second == 0.0) return std::nullopt;
  return r;
}

ColorJitterDraw draw_color_jitter(const ColorJitter& jitter, Rng& rng) {
  ColorJitterDraw d;
  // torch.randperm(4)'s distribution: Fisher-Yates, each permutation 1/24.
  for (int i = 3; i > 0; --i) std::swap(d.order[i], d.order[static_cast<size_t>(rng.randint(0, i + 1))]);
  auto factor = [&rng](const std::optional<std::pair<double, double>>& r) -> std::optional<double> {
    if (!r) return std::nullopt;
    return rng.uniform(r->first, r->second);
  };
  d.brightness = factor(jitter.brightness);
  d.contrast = factor(jitter.contrast);
  d.saturation = factor(jitter.saturation);
  d.hue = factor(jitter.hue);
  return d;
}

void apply_color_jitter(std::span<uint8_t> rgb, const ColorJitterDraw& d) {
  for (int op : d.order) {
    if (op == 0 && d.brightness) adjust_brightness(rgb, *d.brightness);
    if (op == 1 && d.contrast) adjust_contrast(rgb, *d.contrast);
    if (op == 2 && d.saturation) adjust_saturation(rgb, *d.saturation);
    if (op == 3 && d.hue) adjust_hue(rgb, *d.hue);
  }
}

bool random_grayscale(std::span<uint8_t> rgb, double p, Rng& rng) {
  if (!(p >= 0 && p <= 1))
    SPINDLE_THROW(std::invalid_argument, "random_grayscale: p must be in [0, 1], got " + std::to_string(p));
  if (!(rng.uniform() < p)) return false;
  rgb_to_grayscale(rgb);
  return true;
}

}  // namespace spindle::ops
