#pragma once
// Not API: PIL's bilinear resampler over a (possibly fractional) source box,
// shared by resize() and the JPEG decoder (whose DCT-scaled crop is fractional).
#include <spindle/ops/image_ops.hpp>

#include <cstddef>
#include <cstdint>

namespace spindle::ops::detail {

// A source rectangle in (fractional) pixels of the input.
struct BoxF {
  double top = 0, left = 0, height = 0, width = 0;
};

// Resamples `box` of the HWC image at `src` (height x width x channels) to
// `size` into `out`, exactly as Pillow's ImagingResample(BILINEAR, box) does.
void resample(const uint8_t* src, int height, int width, int channels, BoxF box, Size size, Image& out);

// The same from rows `stride` bytes apart into `dst` (size.height rows of
// size.width * channels bytes), each output row mirrored when `mirror` (the
// horizontal flip, free inside the horizontal pass). Scratch buffers are kept
// per thread between calls.
void resample_into(const uint8_t* src, std::size_t stride, int height, int width, int channels, BoxF box, Size size,
                   bool mirror, uint8_t* dst);

}  // namespace spindle::ops::detail
