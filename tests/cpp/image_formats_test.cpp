// The whole-image formats beside JPEG and PNG (WebP, TIFF, BMP, PPM/PGM):
// lossless files decode to exactly the pixels written, each library's errors
// come back as DecodeError with its own message, no decoder starts a thread
// (pthread_create is interposed here and counted), and crops that leave the
// image are zero-padded as torchvision pads. The comparisons with PIL itself
// are in tests/python/test_formats.py.
#include <spindle/error.hpp>
#include <spindle/ops/image_ops.hpp>
#include <spindle/thread_budget.hpp>

#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <tiffio.h>
#include <webp/encode.h>

// Every thread this process starts goes through here (the decoders are shared
// libraries or code of this binary, so their calls bind to this definition).
static std::atomic<int> g_threads_created{0};
extern "C" int pthread_create(pthread_t* thread, const pthread_attr_t* attr, void* (*start)(void*), void* arg) {
  using Real = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  static Real real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "pthread_create"));
  g_threads_created.fetch_add(1);
  return real(thread, attr, start, arg);
}

namespace spindle::ops {
namespace {

using Bytes = std::vector<std::byte>;

Image pattern(int h, int w) {
  Image img{h, w, 3, std::vector<uint8_t>(static_cast<size_t>(h) * w * 3)};
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        img.pixels[(static_cast<size_t>(y) * w + x) * 3 + c] = static_cast<uint8_t>((x * 7 + y * 13 + c * 80) & 0xff);
  return img;
}

Bytes bytes_of(const std::string& s) {
  return Bytes(reinterpret_cast<const std::byte*>(s.data()), reinterpret_cast<const std::byte*>(s.data()) + s.size());
}

void put_le(std::string& s, uint32_t v, int n) {
  for (int i = 0; i < n; ++i) s += static_cast<char>((v >> (8 * i)) & 0xff);
}

// 24-bit bottom-up BMP, rows padded to 4 bytes, BGR.
Bytes encode_bmp(const Image& img) {
  const uint32_t row = (static_cast<uint32_t>(img.width) * 3 + 3) & ~3u, data = row * img.height;
  std::string s = "BM";
  put_le(s, 54 + data, 4);
  put_le(s, 0, 4);
  put_le(s, 54, 4);
  put_le(s, 40, 4);
  put_le(s, img.width, 4);
  put_le(s, img.height, 4);
  put_le(s, 1, 2);
  put_le(s, 24, 2);
  for (int i = 0; i < 6; ++i) put_le(s, 0, 4);
  for (int y = img.height - 1; y >= 0; --y) {
    std::string r;
    for (int x = 0; x < img.width; ++x)
      for (int c = 2; c >= 0; --c) r += static_cast<char>(img.pixels[(static_cast<size_t>(y) * img.width + x) * 3 + c]);
    r.resize(row, '\0');
    s += r;
  }
  return bytes_of(s);
}

Bytes encode_pnm(const Image& img, bool gray) {
  std::string s = std::string(gray ? "P5" : "P6") + "\n# a comment\n" + std::to_string(img.width) + " " +
                  std::to_string(img.height) + "\n255\n";
  for (size_t i = 0; i < img.pixels.size(); i += 3)
    if (gray) s += static_cast<char>(img.pixels[i]);
    else s.append(reinterpret_cast<const char*>(img.pixels.data() + i), 3);
  return bytes_of(s);
}

Bytes encode_webp_lossless(const Image& img) {
  uint8_t* out = nullptr;
  const size_t n = WebPEncodeLosslessRGB(img.pixels.data(), img.width, img.height, img.width * 3, &out);
  Bytes b(reinterpret_cast<std::byte*>(out), reinterpret_cast<std::byte*>(out) + n);
  WebPFree(out);
  return b;
}

Bytes encode_tiff(const Image& img, uint16_t compression) {
  const std::string path = ::testing::TempDir() + "/spindle-format-" + std::to_string(getpid()) + ".tif";
  TIFF* t = TIFFOpen(path.c_str(), "w");
  TIFFSetField(t, TIFFTAG_IMAGEWIDTH, img.width);
  TIFFSetField(t, TIFFTAG_IMAGELENGTH, img.height);
  TIFFSetField(t, TIFFTAG_SAMPLESPERPIXEL, 3);
  TIFFSetField(t, TIFFTAG_BITSPERSAMPLE, 8);
  TIFFSetField(t, TIFFTAG_PHOTOMETRIC, PHOTOMETRIC_RGB);
  TIFFSetField(t, TIFFTAG_PLANARCONFIG, PLANARCONFIG_CONTIG);
  TIFFSetField(t, TIFFTAG_COMPRESSION, compression);
  TIFFSetField(t, TIFFTAG_ROWSPERSTRIP, 4);
  for (int y = 0; y < img.height; ++y)
    TIFFWriteScanline(t, const_cast<uint8_t*>(img.pixels.data()) + static_cast<size_t>(y) * img.width * 3, y, 0);
  TIFFClose(t);
  std::ifstream f(path, std::ios::binary);
  const std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::filesystem::remove(path);
  return bytes_of(s);
}

Image gray_of(const Image& img) {
  Image g = img;
  for (size_t i = 0; i < g.pixels.size(); i += 3) g.pixels[i + 1] = g.pixels[i + 2] = g.pixels[i];
  return g;
}

std::string decode_error(const Bytes& b) {
  try {
    Image out;
    decode(b, std::nullopt, std::nullopt, out);
  } catch (const DecodeError& e) {
    return e.what();
  }
  return "";
}

struct Case {
  const char* name;
  ImageInfo::Format format;
  Bytes bytes;
  Image want;
};

std::vector<Case> lossless_cases() {
  const Image img = pattern(37, 53);
  return {{"webp", ImageInfo::Format::kWebp, encode_webp_lossless(img), img},
          {"tiff-raw", ImageInfo::Format::kTiff, encode_tiff(img, COMPRESSION_NONE), img},
          {"tiff-lzw", ImageInfo::Format::kTiff, encode_tiff(img, COMPRESSION_LZW), img},
          {"bmp", ImageInfo::Format::kBmp, encode_bmp(img), img},
          {"ppm", ImageInfo::Format::kPnm, encode_pnm(img, false), img},
          {"pgm", ImageInfo::Format::kPnm, encode_pnm(img, true), gray_of(img)}};
}

// Proves: lossless WebP, TIFF (raw, LZW), BMP, PPM and PGM decode to exactly the pixels written, with the
// format and size read from the header, and a crop + resize equals crop() + resize() of the whole decode.
TEST(ImageFormats, LosslessFilesDecodeExactly) {
  for (const Case& c : lossless_cases()) {
    const ImageInfo info = probe(c.bytes);
    EXPECT_EQ(info.format, c.format) << c.name;
    EXPECT_EQ(info.height, 37) << c.name;
    EXPECT_EQ(info.width, 53) << c.name;
    Image out;
    decode(c.bytes, std::nullopt, std::nullopt, out);
    EXPECT_EQ(out.pixels, c.want.pixels) << c.name;
    Image part, want_part, want;
    decode(c.bytes, CropBox{3, 5, 20, 30}, Size{11, 17}, part);
    crop(c.want, CropBox{3, 5, 20, 30}, want_part);
    resize(want_part, Size{11, 17}, want);
    EXPECT_EQ(part.pixels, want.pixels) << c.name;
  }
}

// Proves: decoding every format (and JPEG/PNG paths' padded crops) starts no thread: no pthread_create call
// during 20 rounds, and the process's thread count is unchanged.
TEST(ImageFormats, NoDecoderStartsAThread) {
  const std::vector<Case> cases = lossless_cases();
  const int threads_before = count_process_threads(getpid());
  const int created_before = g_threads_created.load();
  for (int round = 0; round < 20; ++round)
    for (const Case& c : cases) {
      Image out;
      decode(c.bytes, std::nullopt, std::nullopt, out);
      decode(c.bytes, center_crop_box(37, 53, {64, 64}), Size{16, 16}, out);
      (void)probe(c.bytes);
    }
  EXPECT_EQ(g_threads_created.load(), created_before) << "a decoder called pthread_create";
  EXPECT_EQ(count_process_threads(getpid()), threads_before);
}

// Proves: truncated or corrupt files of each format fail with DecodeError naming the format and carrying the
// library's own message (BMP/PNM: the truncation check stb_image lacks); unsupported variants (plain-text PNM, maxval 65535) say what is read instead.
TEST(ImageFormats, CorruptAndUnsupportedFilesNameTheDecodersMessage) {
  for (const Case& c : lossless_cases()) {
    Bytes truncated(c.bytes.begin(), c.bytes.begin() + static_cast<std::ptrdiff_t>(c.bytes.size() / 2));
    const std::string msg = decode_error(truncated);
    EXPECT_NE(msg.find("cannot decode"), std::string::npos) << c.name << ": " << msg;
    // stb_image reads past the end as zeros: the truncation check before it says so.
    const char* lib = c.format == ImageInfo::Format::kWebp   ? "libwebp: "
                      : c.format == ImageInfo::Format::kTiff ? "libtiff: "
                                                             : "truncated: ";
    EXPECT_NE(msg.find(lib), std::string::npos) << c.name << ": " << msg;
    Bytes garbage = c.bytes;
    for (size_t i = 8; i < garbage.size(); ++i) garbage[i] = static_cast<std::byte>(0xff);
    garbage.resize(std::min<size_t>(garbage.size(), 64));
    EXPECT_NE(decode_error(garbage).find("cannot decode"), std::string::npos) << c.name;
  }
  EXPECT_NE(decode_error(bytes_of("P3\n2 1\n255\n0 0 0 255 255 255\n")).find("plain text"), std::string::npos);
  EXPECT_NE(decode_error(bytes_of("P5\n1 1\n65535\n\x01\x02")).find("maxval 65535"), std::string::npos);
  EXPECT_NE(decode_error(bytes_of("GIF89a....")).find("not a JPEG, PNG, WebP, TIFF, BMP or PPM/PGM"),
            std::string::npos);
}

// Proves: a crop larger than the image is torchvision's pad-then-crop: the image at offset
// ((crop - side) // 2) in a zero canvas, for crop(), for decode() of a whole-image format, and with a resize
// equal to resize() of that canvas.
TEST(ImageFormats, CropLeavingTheImageIsZeroPadded) {
  const Image img = pattern(10, 12);
  const CropBox box = center_crop_box(10, 12, {32, 31});
  EXPECT_EQ(box.top, -11);
  EXPECT_EQ(box.left, -9);
  Image canvas{32, 31, 3, std::vector<uint8_t>(32 * 31 * 3, 0)};
  for (int y = 0; y < 10; ++y)
    std::memcpy(canvas.pixels.data() + ((y + 11) * 31 + 9) * 3, img.pixels.data() + y * 12 * 3, 12 * 3);
  Image cropped;
  crop(img, box, cropped);
  EXPECT_EQ(cropped.pixels, canvas.pixels);
  Image decoded, resized, want;
  decode(encode_bmp(img), box, std::nullopt, decoded);
  EXPECT_EQ(decoded.pixels, canvas.pixels);
  decode(encode_bmp(img), box, Size{16, 16}, resized);
  resize(canvas, Size{16, 16}, want);
  EXPECT_EQ(resized.pixels, want.pixels);
}

}  // namespace
}  // namespace spindle::ops
