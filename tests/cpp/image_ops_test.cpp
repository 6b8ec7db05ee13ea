// spindle::ops without Python: JPEG/PNG decode (fused crop, DCT scaling),
// resize, crop boxes, flip, normalize, and bad input. Test images are encoded
// here with libjpeg and libspng; the comparisons with PIL itself are in
// tests/python/test_ops.py.
#include <spindle/error.hpp>
#include <spindle/ops/image_ops.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <spng.h>

#include "jpeg_encode.hpp"

namespace spindle::ops {
namespace {

using Bytes = std::vector<std::byte>;

// A smooth, photo-like RGB image with some hard edges and noise.
Image synthetic(int h, int w, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> noise(0, 4);
  Image img{h, w, 3, std::vector<uint8_t>(static_cast<size_t>(h) * w * 3)};
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) {
        double v = 128 + 60 * std::sin(0.03 * (c + 1) * x + 0.02 * y) + 40 * std::cos(0.05 * y - 0.01 * c * x);
        if ((x / 40 + y / 50) % 3 == c) v += 50;
        img.pixels[(static_cast<size_t>(y) * w + x) * 3 + c] =
            static_cast<uint8_t>(std::clamp(v + noise(gen), 0.0, 255.0));
      }
  return img;
}

using spindle::testing::encode_jpeg;

Bytes encode_png(const Image& img) {
  spng_ctx* ctx = spng_ctx_new(SPNG_CTX_ENCODER);
  spng_set_option(ctx, SPNG_ENCODE_TO_BUFFER, 1);
  spng_ihdr ihdr{};
  ihdr.width = img.width;
  ihdr.height = img.height;
  ihdr.bit_depth = 8;
  ihdr.color_type = img.channels == 1 ? SPNG_COLOR_TYPE_GRAYSCALE : SPNG_COLOR_TYPE_TRUECOLOR;
  spng_set_ihdr(ctx, &ihdr);
  EXPECT_EQ(spng_encode_image(ctx, img.pixels.data(), img.pixels.size(), SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE), 0);
  size_t len = 0;
  int err = 0;
  void* png = spng_get_png_buffer(ctx, &len, &err);
  Bytes out(static_cast<std::byte*>(png), static_cast<std::byte*>(png) + len);
  std::free(png);
  spng_ctx_free(ctx);
  return out;
}

Image decoded(const Bytes& b, std::optional<CropBox> crop = std::nullopt, std::optional<Size> size = std::nullopt) {
  Image out;
  decode(b, crop, size, out);
  return out;
}

double mean_abs_diff(const Image& a, const Image& b) {
  EXPECT_EQ(a.pixels.size(), b.pixels.size());
  double s = 0;
  for (size_t i = 0; i < a.pixels.size(); ++i) s += std::abs(int(a.pixels[i]) - int(b.pixels[i]));
  return s / a.pixels.size();
}

// Proves: probe reads size, stored channels and format from the headers.
TEST(ImageOps, ProbeReadsHeaders) {
  const Bytes jpeg = encode_jpeg(synthetic(333, 451, 1));
  const ImageInfo j = probe(jpeg);
  EXPECT_EQ(std::tie(j.height, j.width, j.channels), std::make_tuple(333, 451, 3));
  EXPECT_EQ(j.format, ImageInfo::Format::kJpeg);
  const ImageInfo p = probe(encode_png(synthetic(40, 30, 2)));
  EXPECT_EQ(std::tie(p.height, p.width, p.channels), std::make_tuple(40, 30, 3));
  EXPECT_EQ(p.format, ImageInfo::Format::kPng);
}

// Proves: decoding a region (skip_scanlines + crop_scanline, any alignment, 4:2:0 and 4:4:4) equals the full decode's crop.
TEST(ImageOps, CroppedDecodeEqualsFullDecodeThenCrop) {
  for (bool subsample : {true, false}) {
    const Image src = synthetic(401, 377, 3);
    const Bytes jpeg = encode_jpeg(src, 90, subsample);
    const Image full = decoded(jpeg);
    ASSERT_EQ(full.height, 401);
    EXPECT_LT(mean_abs_diff(full, src), 4.0) << "q90 round trip";
    Rng rng(7, 0, 0);
    std::vector<CropBox> boxes = {{0, 0, 1, 1}, {400, 376, 1, 1}, {16, 16, 100, 100}, {17, 1, 33, 99}, {0, 0, 401, 377}};
    for (int i = 0; i < 40; ++i) boxes.push_back(random_resized_crop_box(401, 377, rng));
    for (const CropBox& b : boxes) {
      Image want;
      crop(full, b, want);
      const Image got = decoded(jpeg, b);
      ASSERT_EQ(got.pixels, want.pixels) << b.top << "," << b.left << " " << b.height << "x" << b.width;
    }
  }
}

// Proves: crop + resize below the DCT threshold equals resize(crop(full decode)) exactly.
TEST(ImageOps, CropResizeWithoutDctScalingEqualsResizeOfCrop) {
  const Bytes jpeg = encode_jpeg(synthetic(400, 400, 4));
  const Image full = decoded(jpeg);
  Rng rng(1, 2, 3);
  for (int i = 0; i < 30; ++i) {
    const CropBox b = random_resized_crop_box(400, 400, rng);
    if (b.height >= 448 || b.width >= 448) continue;
    Image c, want;
    crop(full, b, c);
    resize(c, {224, 224}, want);
    EXPECT_EQ(decoded(jpeg, b, Size{224, 224}).pixels, want.pixels);
  }
}

// Proves: with DCT-domain downscaling (1/2, 1/4, 1/8) the result stays within 2 levels mean abs of the exact path.
TEST(ImageOps, DctScaledDecodeIsCloseToExactResize) {
  const Bytes jpeg = encode_jpeg(synthetic(480, 500, 5));
  const Image full = decoded(jpeg);
  for (Size s : {Size{224, 224}, Size{100, 120}, Size{50, 50}, Size{21, 30}}) {
    for (CropBox b : {CropBox{0, 0, 480, 500}, CropBox{13, 27, 450, 460}, CropBox{100, 3, 240, 250}}) {
      if (b.height < 2 * s.height || b.width < 2 * s.width) continue;
      Image c, want;
      crop(full, b, c);
      resize(c, s, want);
      const Image got = decoded(jpeg, b, s);
      ASSERT_EQ(got.height, s.height);
      ASSERT_EQ(got.width, s.width);
      EXPECT_LT(mean_abs_diff(got, want), 2.0) << s.height << "x" << s.width << " from " << b.height << "x" << b.width;
    }
  }
}

// Proves: a PNG decodes to its exact pixels (RGB and gray replicated), also cropped.
TEST(ImageOps, PngDecodesExactly) {
  const Image src = synthetic(123, 77, 6);
  EXPECT_EQ(decoded(encode_png(src)).pixels, src.pixels);
  Image want;
  crop(src, {10, 5, 50, 60}, want);
  EXPECT_EQ(decoded(encode_png(src), CropBox{10, 5, 50, 60}).pixels, want.pixels);
  Image gray{2, 2, 1, {0, 50, 200, 255}};
  EXPECT_EQ(decoded(encode_png(gray)).pixels, (std::vector<uint8_t>{0, 0, 0, 50, 50, 50, 200, 200, 200, 255, 255, 255}));
}

// Proves: resize keeps constants constant, copies at the same size, and averages a 2:1 reduction as PIL does.
TEST(ImageOps, ResizeMatchesPilOnKnownValues) {
  Image two{1, 2, 1, {10, 20}}, out;
  resize(two, {1, 1}, out);
  EXPECT_EQ(out.pixels, std::vector<uint8_t>{15});
  Image flat{37, 23, 3, std::vector<uint8_t>(37 * 23 * 3, 77)};
  for (Size s : {Size{5, 9}, Size{100, 3}, Size{37, 23}, Size{80, 80}}) {
    resize(flat, s, out);
    EXPECT_EQ(out.pixels, std::vector<uint8_t>(static_cast<size_t>(s.height) * s.width * 3, 77));
  }
  const Image src = synthetic(20, 30, 8);
  resize(src, {20, 30}, out);
  EXPECT_EQ(out.pixels, src.pixels);
}

// Proves: boxes lie in the image, with area fraction in [0.08, 1] and ratio in [3/4, 4/3] up to rounding, or the center fallback.
TEST(ImageOps, RandomResizedCropFollowsTorchvisionRule) {
  const int h = 375, w = 500;
  double mean_frac = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    Rng rng(11, 0, i);
    const CropBox b = random_resized_crop_box(h, w, rng);
    ASSERT_GE(b.top, 0);
    ASSERT_GE(b.left, 0);
    ASSERT_LE(b.top + b.height, h);
    ASSERT_LE(b.left + b.width, w);
    const double frac = double(b.height) * b.width / (double(h) * w), ratio = double(b.width) / b.height;
    EXPECT_GE(frac, 0.08 * 0.97);
    EXPECT_LE(frac, 1.0);
    EXPECT_GE(ratio, 0.75 - 1.5 / b.height);
    EXPECT_LE(ratio, 4.0 / 3 + 1.5 / b.height);
    mean_frac += frac / n;
  }
  // torchvision's rule on 375x500 (restated in tests/python/test_ops.py, 100k draws):
  // mean area fraction 0.4325 (standard error 0.0007); large tries often do not fit.
  EXPECT_NEAR(mean_frac, 0.4325, 0.01);
  // No try fits a 20x1000 strip with scale >= 0.99: center crop at ratio 4/3.
  Rng rng(1, 0, 0);
  const CropBox f = random_resized_crop_box(20, 1000, rng, {0.99, 1.0});
  EXPECT_EQ(std::tie(f.top, f.left, f.height, f.width), std::make_tuple(0, (1000 - 27) / 2, 20, 27));
}

// Proves: the draws depend only on (seed, epoch, index): same box from any thread or order, different for another epoch.
TEST(ImageOps, RngIsCounterBased) {
  auto box = [](uint64_t e, uint64_t i) {
    Rng rng(42, e, i);
    const CropBox b = random_resized_crop_box(300, 400, rng);
    return std::make_tuple(b.top, b.left, b.height, b.width);
  };
  std::vector<std::tuple<int, int, int, int>> here, there(500);
  for (int i = 0; i < 500; ++i) here.push_back(box(3, i));
  std::thread t([&] {
    for (int i = 499; i >= 0; --i) there[i] = box(3, i);
  });
  t.join();
  EXPECT_EQ(here, there);
  int same = 0;
  for (int i = 0; i < 500; ++i) same += here[i] == box(4, i);
  EXPECT_LT(same, 10);
  Rng u(0, 0, 0);
  for (int i = 0; i < 10000; ++i) {
    const double x = u.uniform();
    ASSERT_GE(x, 0.0);
    ASSERT_LT(x, 1.0);
  }
}

// Proves: center_crop_box rounds like torchvision and, for a crop larger than the image, starts at
// -((crop - side) // 2) as torchvision's pad-then-crop does (per dimension).
TEST(ImageOps, CenterCropBox) {
  const CropBox a = center_crop_box(375, 500, {224, 224});
  EXPECT_EQ(std::tie(a.top, a.left, a.height, a.width), std::make_tuple(76, 138, 224, 224));
  const CropBox b = center_crop_box(100, 80, {224, 224});
  EXPECT_EQ(std::tie(b.top, b.left, b.height, b.width), std::make_tuple(-62, -72, 224, 224));
  const CropBox c = center_crop_box(100, 300, {225, 224});
  EXPECT_EQ(std::tie(c.top, c.left, c.height, c.width), std::make_tuple(-62, 38, 225, 224));
}

// Proves: hflip mirrors each row and twice is the identity; normalize writes (x/255 - m)/s in HWC and CHW.
TEST(ImageOps, FlipAndNormalize) {
  Image img{1, 3, 3, {1, 2, 3, 4, 5, 6, 7, 8, 9}};
  hflip(img);
  EXPECT_EQ(img.pixels, (std::vector<uint8_t>{7, 8, 9, 4, 5, 6, 1, 2, 3}));
  hflip(img);
  EXPECT_EQ(img.pixels, (std::vector<uint8_t>{1, 2, 3, 4, 5, 6, 7, 8, 9}));
  const float mean[3] = {0.5f, 0.25f, 0.f}, stdv[3] = {0.5f, 0.25f, 1.f};
  std::vector<float> hwc(9), chw(9);
  normalize(img, mean, stdv, false, hwc);
  normalize(img, mean, stdv, true, chw);
  for (int p = 0; p < 3; ++p)
    for (int c = 0; c < 3; ++c) {
      const float want = (img.pixels[p * 3 + c] / 255.f - mean[c]) / stdv[c];
      EXPECT_NEAR(hwc[p * 3 + c], want, 1e-6);
      EXPECT_NEAR(chw[c * 3 + p], want, 1e-6);
    }
  EXPECT_THROW(normalize(img, mean, stdv, false, std::span<float>(hwc).first(8)), std::invalid_argument);
}

void expect_decode_error(const Bytes& b, const std::string& words) {
  try {
    Image out;
    decode(b, std::nullopt, Size{32, 32}, out);
    ADD_FAILURE() << "no DecodeError for " << b.size() << " bytes";
  } catch (const DecodeError& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

// Proves: empty, non-image, truncated and corrupt inputs throw DecodeError with the decoder's message.
TEST(ImageOps, BadInputThrowsDecodeError) {
  const Bytes jpeg = encode_jpeg(synthetic(200, 300, 9));
  const Bytes png = encode_png(synthetic(50, 60, 9));
  expect_decode_error({}, "empty");
  const char text[] = "definitely not an image";
  expect_decode_error(Bytes(reinterpret_cast<const std::byte*>(text), reinterpret_cast<const std::byte*>(text) + 23),
                      "not a JPEG, PNG, WebP, TIFF, BMP or PPM/PGM");
  expect_decode_error(Bytes(jpeg.begin(), jpeg.begin() + jpeg.size() / 2), "Premature end of JPEG file");
  expect_decode_error(Bytes(jpeg.begin(), jpeg.begin() + 3), "cannot decode JPEG");
  expect_decode_error(Bytes(png.begin(), png.begin() + png.size() / 2), "cannot decode PNG");
  expect_decode_error(Bytes(png.begin(), png.begin() + 8), "cannot decode PNG");
  // A header claiming 60000x60000: refused before anything is allocated.
  Bytes bomb = jpeg;
  for (size_t i = 0; i + 8 < bomb.size(); ++i) {
    if (bomb[i] == std::byte{0xFF} && bomb[i + 1] == std::byte{0xC0}) {
      bomb[i + 5] = std::byte{0xEA}, bomb[i + 6] = std::byte{0x60}, bomb[i + 7] = std::byte{0xEA},
      bomb[i + 8] = std::byte{0x60};
      break;
    }
  }
  expect_decode_error(bomb, "exceeds the limit");
}

// Proves: every prefix and many single-byte corruptions of a JPEG and a PNG either decode or throw DecodeError.
TEST(ImageOps, EveryPrefixAndCorruptionFailsCleanly) {
  for (const Bytes& good : {encode_jpeg(synthetic(64, 80, 10)), encode_png(synthetic(40, 30, 10))}) {
    int decoded_ok = 0, failed = 0;
    for (size_t n = 0; n < good.size(); n += 7) {
      try {
        (void)decoded(Bytes(good.begin(), good.begin() + n), CropBox{3, 5, 30, 20}, Size{16, 16});
        ++decoded_ok;
      } catch (const DecodeError&) {
        ++failed;
      }
    }
    EXPECT_GT(failed, 0);
    std::mt19937 gen(1);
    for (int i = 0; i < 300; ++i) {
      Bytes bad = good;
      bad[gen() % bad.size()] ^= std::byte(1 + gen() % 255);
      try {
        (void)decoded(bad);
      } catch (const DecodeError&) {
      }
    }
  }
}

int process_threads() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  char line[256];
  int n = -1;
  while (f && std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "Threads: %d", &n) == 1) break;
  if (f) std::fclose(f);
  return n;
}

// Proves: decode (JPEG, PNG, DCT-scaled) and resize run on the calling thread only: no library starts threads.
TEST(ImageOps, StartsNoThreads) {
  const Bytes jpeg = encode_jpeg(synthetic(300, 400, 13)), png = encode_png(synthetic(100, 120, 13));
  const int before = process_threads();
  ASSERT_GT(before, 0);
  for (uint64_t i = 0; i < 20; ++i) {
    Rng rng(0, 0, i);
    (void)decoded(jpeg, random_resized_crop_box(300, 400, rng), Size{64, 64});
    (void)decoded(png, std::nullopt, Size{50, 50});
  }
  EXPECT_EQ(process_threads(), before);
}

// Proves: an empty crop or an empty size is misuse (std::invalid_argument), not a DecodeError; a JPEG crop
// leaving the image is zero-padded there (torchvision's pad-then-crop), its inside equal to the plain crop.
TEST(ImageOps, MisuseThrowsInvalidArgument) {
  const Bytes jpeg = encode_jpeg(synthetic(50, 60, 12));
  Image out, inside;
  EXPECT_THROW(decode(jpeg, CropBox{10, 0, 0, 10}, std::nullopt, out), std::invalid_argument);
  decode(jpeg, CropBox{40, 0, 20, 10}, std::nullopt, out);
  decode(jpeg, CropBox{40, 0, 10, 10}, std::nullopt, inside);
  ASSERT_EQ(out.height, 20);
  EXPECT_TRUE(std::equal(inside.pixels.begin(), inside.pixels.end(), out.pixels.begin()));
  EXPECT_TRUE(std::all_of(out.pixels.begin() + 10 * 10 * 3, out.pixels.end(), [](uint8_t v) { return v == 0; }));
  EXPECT_THROW(decode(jpeg, std::nullopt, Size{0, 5}, out), std::invalid_argument);
  EXPECT_THROW(resize(Image{}, {2, 2}, out), std::invalid_argument);
}

}  // namespace
}  // namespace spindle::ops
