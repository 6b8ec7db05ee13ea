// The built-in stages of native pipelines (stage.hpp) and user stages. Each
// factory says what the stage needs, what it does to the image's size and
// what it does to one sample; the pipeline (pipeline.cpp) validates the list
// and fuses decode with the crop that follows it.
#include <spindle/stage.hpp>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <spindle/error.hpp>

namespace spindle {

std::vector<std::byte>& Sample::bytes_field(std::string_view name) {
  auto it = bytes.find(name);
  if (it == bytes.end())
    throw DataError("spindle: " + (id ? id->origin : std::string("a sample")) + " has no byte field '" +
                        std::string(name) + "'",
                    id ? id->path : std::string(), id ? id->key : std::string());
  return it->second;
}

namespace {

void check_size(const char* stage, ops::Size size) {
  if (size.height < 1 || size.width < 1)
    SPINDLE_THROW(std::invalid_argument, std::string("spindle: ") + stage + " needs a size of at least 1x1, not " +
                                             std::to_string(size.height) + "x" + std::to_string(size.width));
}

std::function<std::optional<ops::Size>(std::optional<ops::Size>)> fixed(ops::Size size) {
  return [size](std::optional<ops::Size>) { return std::optional<ops::Size>(size); };
}

// torchvision Resize(int)'s output size for an h x w image.
ops::Size shorter_side_size(int h, int w, int shorter) {
  return h <= w ? ops::Size{shorter, std::max(1, static_cast<int>(int64_t{w} * shorter / h))}
                : ops::Size{std::max(1, static_cast<int>(int64_t{h} * shorter / w)), shorter};
}

}  // namespace

Stage user_stage(UserStage u) {
  if (u.name.empty()) SPINDLE_THROW(std::invalid_argument, "spindle: a user stage needs a name (it names errors)");
  if (!u.fn) SPINDLE_THROW(std::invalid_argument, "spindle: user stage '" + u.name + "' has no function");
  if (u.output_size) check_size(u.name.c_str(), *u.output_size);
  Stage s;
  s.kind = Stage::Kind::kPlain;
  s.name = std::move(u.name);
  s.needs = u.needs;
  if (u.output_size) s.size_after = fixed(*u.output_size);
  s.run = std::move(u.fn);
  s.adds_bytes = std::move(u.adds_bytes);
  return s;
}

namespace stages {

Stage decode() {
  Stage s;
  s.kind = Stage::Kind::kDecode;
  s.name = "decode";
  s.needs = Stage::Needs::kEncoded;
  s.size_after = [](std::optional<ops::Size>) { return std::optional<ops::Size>(); };
  s.run = [](Sample& x, ops::Rng&) {
    ops::decode(x.encoded, std::nullopt, std::nullopt, x.image);
    x.decoded = true;
  };
  return s;
}

Stage random_resized_crop(ops::Size size, std::pair<double, double> scale, std::pair<double, double> ratio) {
  check_size("random_resized_crop", size);
  if (!(scale.first > 0 && scale.first <= scale.second && scale.second <= 1))
    SPINDLE_THROW(std::invalid_argument, "spindle: random_resized_crop needs 0 < scale[0] <= scale[1] <= 1, not (" +
                                             std::to_string(scale.first) + ", " + std::to_string(scale.second) + ")");
  if (!(ratio.first > 0 && ratio.first <= ratio.second && std::isfinite(ratio.second)))
    SPINDLE_THROW(std::invalid_argument, "spindle: random_resized_crop needs 0 < ratio[0] <= ratio[1], not (" +
                                             std::to_string(ratio.first) + ", " + std::to_string(ratio.second) + ")");
  Stage s;
  s.kind = Stage::Kind::kRandomResizedCrop;
  s.name = "random_resized_crop";
  s.size_after = fixed(size);
  s.fused.size = size;
  s.fused.scale = scale;
  s.fused.ratio = ratio;
  s.run = [size, scale, ratio](Sample& x, ops::Rng& rng) {
    const ops::CropBox b = ops::random_resized_crop_box(x.image.height, x.image.width, rng, scale, ratio);
    ops::Image crop;
    ops::crop(x.image, b, crop);
    ops::resize(crop, size, x.image);
  };
  return s;
}

Stage center_crop(ops::Size size) {
  check_size("center_crop", size);
  Stage s;
  s.kind = Stage::Kind::kCenterCrop;
  s.name = "center_crop";
  s.size_after = fixed(size);
  s.fused.size = size;
  s.run = [size](Sample& x, ops::Rng&) {
    if (x.image.height == size.height && x.image.width == size.width) return;
    ops::Image out;
    ops::crop(x.image, ops::center_crop_box(x.image.height, x.image.width, size), out);
    x.image = std::move(out);
  };
  return s;
}

Stage resize_shorter(int shorter) {
  if (shorter < 1)
    SPINDLE_THROW(std::invalid_argument, "spindle: resize needs a size of at least 1, not " + std::to_string(shorter));
  Stage s;
  s.name = "resize";
  s.size_after = [shorter](std::optional<ops::Size> in) -> std::optional<ops::Size> {
    if (!in) return std::nullopt;
    return shorter_side_size(in->height, in->width, shorter);
  };
  s.run = [shorter](Sample& x, ops::Rng&) {
    ops::Image out;
    ops::resize(x.image, shorter_side_size(x.image.height, x.image.width, shorter), out);
    x.image = std::move(out);
  };
  return s;
}

Stage resize(ops::Size size) {
  check_size("resize", size);
  Stage s;
  s.name = "resize";
  s.size_after = fixed(size);
  s.run = [size](Sample& x, ops::Rng&) {
    if (x.image.height == size.height && x.image.width == size.width) return;
    ops::Image out;
    ops::resize(x.image, size, out);
    x.image = std::move(out);
  };
  return s;
}

Stage random_flip(double p) {
  if (!(p >= 0 && p <= 1))
    SPINDLE_THROW(std::invalid_argument, "spindle: random_flip needs 0 <= p <= 1, not " + std::to_string(p));
  Stage s;
  s.kind = Stage::Kind::kFlip;
  s.name = "random_flip";
  s.fused.p = p;
  s.run = [p](Sample& x, ops::Rng& rng) {
    if (p > 0 && rng.uniform() < p) ops::hflip(x.image);
  };
  return s;
}

Stage color_jitter(ops::ColorJitter jitter) {
  // Ranges built by hand (not through ColorJitter's *_range functions) are checked the same way.
  if (jitter.brightness) jitter.brightness = ops::ColorJitter::factor_range(*jitter.brightness, "brightness");
  if (jitter.contrast) jitter.contrast = ops::ColorJitter::factor_range(*jitter.contrast, "contrast");
  if (jitter.saturation) jitter.saturation = ops::ColorJitter::factor_range(*jitter.saturation, "saturation");
  if (jitter.hue) jitter.hue = ops::ColorJitter::hue_range(*jitter.hue);
  Stage s;
  s.name = "color_jitter";
  s.run = [jitter](Sample& x, ops::Rng& rng) {
    ops::apply_color_jitter(x.image.pixels, ops::draw_color_jitter(jitter, rng));
  };
  return s;
}

Stage random_grayscale(double p) {
  if (!(p >= 0 && p <= 1))
    SPINDLE_THROW(std::invalid_argument, "spindle: random_grayscale needs 0 <= p <= 1, not " + std::to_string(p));
  Stage s;
  s.name = "random_grayscale";
  s.run = [p](Sample& x, ops::Rng& rng) { ops::random_grayscale(x.image.pixels, p, rng); };
  return s;
}

Stage normalize(std::array<float, 3> mean, std::array<float, 3> std, bool chw) {
  for (float v : std)
    if (!(v > 0)) SPINDLE_THROW(std::invalid_argument, "spindle: normalize needs std > 0");
  for (float v : mean)
    if (!std::isfinite(v)) SPINDLE_THROW(std::invalid_argument, "spindle: normalize needs finite means");
  Stage s;
  s.kind = Stage::Kind::kNormalize;
  s.name = "normalize";
  s.fused.mean = mean;
  s.fused.std = std;
  s.fused.chw = chw;
  s.run = [](Sample&, ops::Rng&) {};  // done by the pipeline as it writes the batch (pipeline.cpp)
  return s;
}

}  // namespace stages
}  // namespace spindle
