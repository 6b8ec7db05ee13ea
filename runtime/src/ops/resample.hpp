#pragma once
// Not API: PIL's bilinear resampler over a (possibly fractional) source box,
// shared by resize() and the JPEG decoder (whose DCT-scaled crop is fractional).
#include <spindle/ops/image_ops.hpp>

#include <cstdint>

namespace spindle::ops::detail {

// A source rectangle in (fractional) pixels of the input.
struct BoxF {
  double top = 0, left = 0, height = 0, width = 0;
};

// Resamples `box` of the HWC image at `src` (height x width x channels) to
// `size` into `out`, exactly as Pillow's ImagingResample(BILINEAR, box) does.
void resample(const uint8_t* src, int height, int width, int channels, BoxF box, Size size, Image& out);

}  // namespace spindle::ops::detail
