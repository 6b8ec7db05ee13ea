#pragma once
// ColorJitter's arguments as torchvision takes them (a number or a (min, max)
// pair each), turned into ops::ColorJitter by the C++ rules (ColorJitter's
// *_range functions own torchvision's checks). Shared by spindle.ops and the
// pipeline's color_jitter stage.
#include <pybind11/stl.h>

#include <spindle/ops/image_ops.hpp>

#include <optional>
#include <utility>
#include <variant>

namespace spindle::python {

using JitterArg = std::variant<double, std::pair<double, double>>;

inline std::optional<std::pair<double, double>> jitter_factor_range(const JitterArg& a, const char* name) {
  if (const double* v = std::get_if<double>(&a)) return ops::ColorJitter::brightness_range(*v);
  return ops::ColorJitter::factor_range(std::get<std::pair<double, double>>(a), name);
}

inline ops::ColorJitter jitter_of(const JitterArg& b, const JitterArg& c, const JitterArg& s, const JitterArg& h) {
  ops::ColorJitter j;
  j.brightness = jitter_factor_range(b, "brightness");
  j.contrast = jitter_factor_range(c, "contrast");
  j.saturation = jitter_factor_range(s, "saturation");
  if (const double* v = std::get_if<double>(&h)) j.hue = ops::ColorJitter::hue_range(*v);
  else j.hue = ops::ColorJitter::hue_range(std::get<std::pair<double, double>>(h));
  return j;
}

}  // namespace spindle::python
