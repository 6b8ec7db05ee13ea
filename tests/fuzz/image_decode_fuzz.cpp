// libFuzzer target: spindle::ops::probe and decode on untrusted bytes.
//
// Input: byte 0 picks the crop (bits 0-1: none, random-resized, center, a corner
// pixel) and byte 1 the output size (0: none; else 1 + b % 64 square, which
// reaches the DCT-scaled path for crops of 2x that and more); the rest is the
// encoded image. Checked: every failure is spindle::DecodeError (anything else
// escapes and libFuzzer reports it), a success has exactly the size asked for,
// and ASan/UBSan see no bad access in libjpeg-turbo, libspng, libwebp, libtiff,
// stb_image (BMP, PPM/PGM) or our code. Center crops larger than the image
// reach the zero-padded path.
#include <spindle/error.hpp>
#include <spindle/ops/image_ops.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "fuzz_support.hpp"

using namespace spindle::ops;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t mode = data[0], size_byte = data[1];
  const std::span<const std::byte> encoded(reinterpret_cast<const std::byte*>(data + 2), size - 2);
  ImageInfo info;
  try {
    info = probe(encoded);
  } catch (const spindle::DecodeError&) {
    return 0;
  }
  SPINDLE_FUZZ_CHECK(info.height > 0 && info.width > 0, "probe returned %dx%d", info.height, info.width);
  // Keep one input well under a millisecond-ish: real decoding of big images
  // is the GoogleTests' job; the limit itself is tested there.
  if (int64_t{info.height} * info.width > (int64_t{1} << 20)) return 0;

  std::optional<CropBox> crop;
  Rng rng(size, mode, size_byte);
  switch (mode & 3) {
    case 1: crop = random_resized_crop_box(info.height, info.width, rng); break;
    case 2: crop = center_crop_box(info.height, info.width, {1 + size_byte % 64, 1 + mode % 64}); break;
    case 3: crop = CropBox{info.height - 1, info.width - 1, 1, 1}; break;
    default: break;
  }
  std::optional<Size> out_size;
  if (size_byte != 0) out_size = Size{1 + size_byte % 64, 1 + size_byte % 64};

  Image out;
  try {
    decode(encoded, crop, out_size, out);
  } catch (const spindle::DecodeError&) {
    return 0;
  }
  const int want_h = out_size ? out_size->height : crop ? crop->height : info.height;
  const int want_w = out_size ? out_size->width : crop ? crop->width : info.width;
  SPINDLE_FUZZ_CHECK(out.height == want_h && out.width == want_w && out.channels == 3 &&
                         out.pixels.size() == static_cast<size_t>(want_h) * want_w * 3,
                     "decoded %dx%dx%d (%zu bytes), wanted %dx%dx3", out.height, out.width, out.channels,
                     out.pixels.size(), want_h, want_w);
  if (out.height > 0) hflip(out);
  return 0;
}
