// WebP, TIFF, BMP and PPM/PGM decoding (decode_formats.hpp). None of these
// decoders starts a thread (libwebp's worker threads are opt-in per call and
// left off; libtiff and stb_image have none: tests/cpp/image_ops_test.cpp
// counts the process's threads around decoding every format), and none
// prints: libtiff's messages go to per-handle handlers, never to stderr.
#include "decode_formats.hpp"

#include <spindle/error.hpp>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <tiffio.h>
#include <webp/decode.h>

// stb_image, from Debian's libstb-dev header, compiled here with only its BMP
// and PNM decoders, every function static (a program that links its own
// stb_image beside spindle gets no duplicate symbols), reading from memory
// only. Its failure reason is thread-local in this version.
#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_STATIC
#define STBI_ONLY_BMP
#define STBI_ONLY_PNM
#define STBI_NO_STDIO
#define STBI_NO_LINEAR
#define STBI_NO_HDR
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wunused-but-set-variable"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#include <stb_image.h>
#pragma GCC diagnostic pop

namespace spindle::ops::detail {

namespace {

[[noreturn]] void fail(ImageInfo::Format f, const std::string& why) {
  SPINDLE_THROW(DecodeError, std::string("cannot decode ") + format_name(f) + ": " + why);
}

// ---- WebP ----------------------------------------------------------------------

const char* webp_status(VP8StatusCode s) {
  switch (s) {
    case VP8_STATUS_OUT_OF_MEMORY: return "out of memory";
    case VP8_STATUS_INVALID_PARAM: return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR: return "bitstream error (corrupt data)";
    case VP8_STATUS_UNSUPPORTED_FEATURE: return "unsupported feature";
    case VP8_STATUS_SUSPENDED: return "suspended";
    case VP8_STATUS_USER_ABORT: return "aborted";
    case VP8_STATUS_NOT_ENOUGH_DATA: return "not enough data (truncated file)";
    default: return "unknown error";
  }
}

WebPBitstreamFeatures webp_features(std::span<const std::byte> data) {
  WebPBitstreamFeatures f{};
  const VP8StatusCode s = WebPGetFeatures(reinterpret_cast<const uint8_t*>(data.data()), data.size(), &f);
  if (s != VP8_STATUS_OK) fail(ImageInfo::Format::kWebp, std::string("libwebp: ") + webp_status(s));
  return f;
}

void decode_webp(std::span<const std::byte> data, Image& out) {
  WebPDecoderConfig config;
  if (!WebPInitDecoderConfig(&config)) fail(ImageInfo::Format::kWebp, "libwebp: version mismatch");
  config.input = webp_features(data);
  if (config.input.has_animation)
    fail(ImageInfo::Format::kWebp, "animated WebP is not supported (libwebp's still-image decoder reads no animation)");
  check_pixels(config.input.height, config.input.width, "WebP");
  out.height = config.input.height;
  out.width = config.input.width;
  out.channels = 3;
  out.pixels.resize(static_cast<size_t>(out.height) * out.width * 3);
  // RGB straight into our buffer; alpha, if any, dropped as convert("RGB") does.
  config.output.colorspace = MODE_RGB;
  config.output.is_external_memory = 1;
  config.output.u.RGBA.rgba = out.pixels.data();
  config.output.u.RGBA.stride = out.width * 3;
  config.output.u.RGBA.size = out.pixels.size();
  const VP8StatusCode s = WebPDecode(reinterpret_cast<const uint8_t*>(data.data()), data.size(), &config);
  WebPFreeDecBuffer(&config.output);
  if (s != VP8_STATUS_OK) fail(ImageInfo::Format::kWebp, std::string("libwebp: ") + webp_status(s));
}

// ---- TIFF ----------------------------------------------------------------------

// libtiff reads through these callbacks from memory; no file, no mapping.
struct TiffSource {
  const uint8_t* data;
  toff_t size;
  toff_t pos = 0;
  std::string error;  // libtiff's first error message
};

tmsize_t tiff_read(thandle_t h, void* buf, tmsize_t n) {
  auto* s = static_cast<TiffSource*>(h);
  const toff_t left = s->pos < s->size ? s->size - s->pos : 0;
  const toff_t k = std::min<toff_t>(left, static_cast<toff_t>(n));
  std::memcpy(buf, s->data + s->pos, k);
  s->pos += k;
  return static_cast<tmsize_t>(k);
}
tmsize_t tiff_write(thandle_t, void*, tmsize_t) { return 0; }
toff_t tiff_seek(thandle_t h, toff_t off, int whence) {
  auto* s = static_cast<TiffSource*>(h);
  toff_t base = whence == SEEK_CUR ? s->pos : whence == SEEK_END ? s->size : 0;
  s->pos = base + off;  // past the end is allowed; reads there return 0 bytes
  return s->pos;
}
int tiff_close(thandle_t) { return 0; }
toff_t tiff_size(thandle_t h) { return static_cast<TiffSource*>(h)->size; }
int tiff_map(thandle_t, void**, toff_t*) { return 0; }
void tiff_unmap(thandle_t, void*, toff_t) {}

int tiff_on_error(TIFF*, void* user, const char* module, const char* fmt, va_list ap) {
  auto* s = static_cast<TiffSource*>(user);
  if (s->error.empty()) {
    char msg[512];
    std::vsnprintf(msg, sizeof msg, fmt, ap);
    s->error = std::string(module ? module : "libtiff") + ": " + msg;
  }
  return 1;  // handled: libtiff's process-wide handler (stderr) is not called
}
int tiff_on_warning(TIFF*, void*, const char*, const char*, va_list) { return 1; }  // dropped, as PIL does

class TiffFile {
 public:
  explicit TiffFile(std::span<const std::byte> data)
      : src_{reinterpret_cast<const uint8_t*>(data.data()), static_cast<toff_t>(data.size()), 0, {}} {
    TIFFOpenOptions* opts = TIFFOpenOptionsAlloc();
    if (!opts) throw std::bad_alloc();
    TIFFOpenOptionsSetErrorHandlerExtR(opts, tiff_on_error, &src_);
    TIFFOpenOptionsSetWarningHandlerExtR(opts, tiff_on_warning, &src_);
    TIFFOpenOptionsSetMaxSingleMemAlloc(opts, tmsize_t{1} << 30);  // a hostile tag cannot ask for more
    tif_ = TIFFClientOpenExt("image.tiff", "rm", &src_, tiff_read, tiff_write, tiff_seek, tiff_close, tiff_size,
                             tiff_map, tiff_unmap, opts);
    TIFFOpenOptionsFree(opts);
    if (!tif_) fail_here("cannot open");
  }
  ~TiffFile() {
    if (tif_) TIFFClose(tif_);
  }
  TiffFile(const TiffFile&) = delete;
  TiffFile& operator=(const TiffFile&) = delete;

  ImageInfo info() const {
    uint32_t w = 0, h = 0;
    uint16_t spp = 1;
    TIFFGetField(tif_, TIFFTAG_IMAGEWIDTH, &w);
    TIFFGetField(tif_, TIFFTAG_IMAGELENGTH, &h);
    TIFFGetFieldDefaulted(tif_, TIFFTAG_SAMPLESPERPIXEL, &spp);
    return {static_cast<int>(std::min<uint32_t>(h, INT32_MAX)), static_cast<int>(std::min<uint32_t>(w, INT32_MAX)),
            spp, ImageInfo::Format::kTiff};
  }

  // The first page (PIL's Image.open reads the first too).
  void decode(Image& out) {
    const ImageInfo in = info();
    check_pixels(in.height, in.width, "TIFF");
    uint16_t bps = 1, spp = 1, photometric = 0, planar = PLANARCONFIG_CONTIG, sample_format = SAMPLEFORMAT_UINT;
    TIFFGetFieldDefaulted(tif_, TIFFTAG_BITSPERSAMPLE, &bps);
    TIFFGetFieldDefaulted(tif_, TIFFTAG_SAMPLESPERPIXEL, &spp);
    TIFFGetFieldDefaulted(tif_, TIFFTAG_PLANARCONFIG, &planar);
    TIFFGetFieldDefaulted(tif_, TIFFTAG_SAMPLEFORMAT, &sample_format);
    if (!TIFFGetField(tif_, TIFFTAG_PHOTOMETRIC, &photometric)) photometric = PHOTOMETRIC_MINISBLACK;
    out.height = in.height;
    out.width = in.width;
    out.channels = 3;
    out.pixels.resize(static_cast<size_t>(in.height) * in.width * 3);
    const bool rgb = photometric == PHOTOMETRIC_RGB && spp >= 3, gray = photometric == PHOTOMETRIC_MINISBLACK;
    if (bps == 8 && sample_format == SAMPLEFORMAT_UINT && planar == PLANARCONFIG_CONTIG && !TIFFIsTiled(tif_) &&
        (rgb || gray)) {
      // The common 8-bit files, scanline by scanline as stored: extra samples
      // (alpha) dropped unchanged, gray replicated, as convert("RGB") does.
      // (libtiff's RGBA interface would premultiply unassociated alpha.)
      std::vector<uint8_t> row(static_cast<size_t>(TIFFScanlineSize(tif_)));
      if (row.size() < static_cast<size_t>(in.width) * spp) fail_here("scanline shorter than the image width");
      for (int y = 0; y < in.height; ++y) {
        if (TIFFReadScanline(tif_, row.data(), static_cast<uint32_t>(y), 0) != 1) fail_here("cannot read row");
        uint8_t* dst = out.pixels.data() + static_cast<size_t>(y) * in.width * 3;
        for (int x = 0; x < in.width; ++x) {
          const uint8_t* p = row.data() + static_cast<size_t>(x) * spp;
          dst[3 * x] = p[0];
          dst[3 * x + 1] = rgb ? p[1] : p[0];
          dst[3 * x + 2] = rgb ? p[2] : p[0];
        }
      }
      return;
    }
    // Everything else libtiff knows (palette, bilevel, 16-bit, YCbCr, CMYK,
    // tiles, planar) through its RGBA interface.
    char why[1024] = {};
    if (!TIFFRGBAImageOK(tif_, why)) fail_here(why);
    std::vector<uint32_t> raster(static_cast<size_t>(in.height) * in.width);
    if (!TIFFReadRGBAImageOriented(tif_, static_cast<uint32_t>(in.width), static_cast<uint32_t>(in.height),
                                   raster.data(), ORIENTATION_TOPLEFT, 1))
      fail_here("cannot read the image");
    for (size_t i = 0; i < raster.size(); ++i) {
      out.pixels[3 * i] = static_cast<uint8_t>(TIFFGetR(raster[i]));
      out.pixels[3 * i + 1] = static_cast<uint8_t>(TIFFGetG(raster[i]));
      out.pixels[3 * i + 2] = static_cast<uint8_t>(TIFFGetB(raster[i]));
    }
  }

 private:
  [[noreturn]] void fail_here(const std::string& what) {
    fail(ImageInfo::Format::kTiff, "libtiff: " + (src_.error.empty() ? what : src_.error));
  }

  TiffSource src_;
  TIFF* tif_ = nullptr;
};

// ---- BMP, PPM/PGM (stb_image) ------------------------------------------------------

// The checks stb_image does not make. It reads past the end of its input as
// zeros, so a truncated BMP or PNM would decode as a partly black image: the
// pixel data must all be there (PIL raises "image file is truncated" too).
// And for PNM (P5/P6: magic, width, height, maxval, with # comments, one
// whitespace byte, then the samples), stb keeps 8-bit samples as stored where
// PIL scales a maxval below 255 to 0..255, and 16-bit samples differ too: only
// maxval 255 gives PIL's pixels, so only that is read.
void check_pnm(std::span<const std::byte> data) {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  const size_t n = data.size();
  if (n < 2 || p[0] != 'P') fail(ImageInfo::Format::kPnm, "no P1..P6 magic");
  if (p[1] != '5' && p[1] != '6')
    fail(ImageInfo::Format::kPnm, std::string("only binary P5 (PGM) and P6 (PPM) files are read, this one is P") +
                                      static_cast<char>(p[1]) + (p[1] == '4' ? " (bitmap)" : " (plain text)"));
  size_t i = 2;
  uint64_t values[3] = {0, 0, 0};  // width, height, maxval
  for (uint64_t& v : values) {
    for (;;) {  // whitespace and comments
      while (i < n && (p[i] == ' ' || (p[i] >= '\t' && p[i] <= '\r'))) ++i;
      if (i < n && p[i] == '#') {
        while (i < n && p[i] != '\n') ++i;
        continue;
      }
      break;
    }
    if (i >= n || p[i] < '0' || p[i] > '9') fail(ImageInfo::Format::kPnm, "truncated or malformed header");
    while (i < n && p[i] >= '0' && p[i] <= '9' && v < 1000000000) v = v * 10 + (p[i++] - '0');
  }
  if (values[2] != 255)
    fail(ImageInfo::Format::kPnm, "maxval " + std::to_string(values[2]) +
                                      " is not read (only 8-bit files with maxval 255; PIL rescales others)");
  const uint64_t need = i + 1 + values[0] * values[1] * (p[1] == '6' ? 3 : 1);
  if (values[0] * values[1] <= static_cast<uint64_t>(kMaxImagePixels) && n < need)
    fail(ImageInfo::Format::kPnm, "truncated: " + std::to_string(n) + " bytes, the header says " +
                                      std::to_string(need));
}

uint32_t le32(const unsigned char* p) { return p[0] | p[1] << 8 | p[2] << 16 | static_cast<uint32_t>(p[3]) << 24; }

// An uncompressed BMP (BI_RGB, BI_BITFIELDS) holds all its rows after the pixel offset.
void check_bmp(std::span<const std::byte> data, int height, int width) {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  if (data.size() < 30) fail(ImageInfo::Format::kBmp, "truncated header");
  const uint32_t offset = le32(p + 10), header = le32(p + 14);
  if (header < 40 || data.size() < 34) return;  // OS/2 v1 headers: stb checks those
  const unsigned bpp = p[28] | p[29] << 8;
  const uint32_t compression = le32(p + 30);
  if (compression != 0 && compression != 3) return;  // RLE and others: stb refuses them
  const uint64_t row = (static_cast<uint64_t>(bpp) * width + 31) / 32 * 4;
  const uint64_t need = offset + row * static_cast<uint64_t>(height);
  if (data.size() < need)
    fail(ImageInfo::Format::kBmp, "truncated: " + std::to_string(data.size()) + " bytes, the header says " +
                                      std::to_string(need));
}

ImageInfo stb_info(ImageInfo::Format f, std::span<const std::byte> data) {
  if (f == ImageInfo::Format::kPnm) check_pnm(data);
  int w = 0, h = 0, comp = 0;
  if (data.size() > static_cast<size_t>(INT32_MAX)) fail(f, "file larger than 2 GiB");
  if (!stbi_info_from_memory(reinterpret_cast<const stbi_uc*>(data.data()), static_cast<int>(data.size()), &w, &h,
                             &comp))
    fail(f, std::string("stb_image: ") + stbi_failure_reason());
  return {h, w, comp, f};
}

void decode_stb(ImageInfo::Format f, std::span<const std::byte> data, Image& out) {
  const ImageInfo in = stb_info(f, data);
  check_pixels(in.height, in.width, format_name(f));
  if (f == ImageInfo::Format::kBmp) check_bmp(data, in.height, in.width);
  int w = 0, h = 0, comp = 0;
  stbi_uc* px = stbi_load_from_memory(reinterpret_cast<const stbi_uc*>(data.data()), static_cast<int>(data.size()),
                                      &w, &h, &comp, 3);
  if (!px) fail(f, std::string("stb_image: ") + stbi_failure_reason());
  out.height = h;
  out.width = w;
  out.channels = 3;
  out.pixels.assign(px, px + static_cast<size_t>(h) * w * 3);
  stbi_image_free(px);
}

}  // namespace

const char* format_name(ImageInfo::Format format) noexcept {
  switch (format) {
    case ImageInfo::Format::kJpeg: return "JPEG";
    case ImageInfo::Format::kPng: return "PNG";
    case ImageInfo::Format::kWebp: return "WebP";
    case ImageInfo::Format::kTiff: return "TIFF";
    case ImageInfo::Format::kBmp: return "BMP";
    case ImageInfo::Format::kPnm: return "PPM/PGM";
  }
  return "image";
}

ImageInfo probe_whole(ImageInfo::Format format, std::span<const std::byte> data) {
  ImageInfo info;
  switch (format) {
    case ImageInfo::Format::kWebp: {
      const WebPBitstreamFeatures f = webp_features(data);
      info = {f.height, f.width, f.has_alpha ? 4 : 3, format};
      break;
    }
    case ImageInfo::Format::kTiff: info = TiffFile(data).info(); break;
    case ImageInfo::Format::kBmp:
    case ImageInfo::Format::kPnm: info = stb_info(format, data); break;
    default: SPINDLE_THROW(std::logic_error, "probe_whole: not a whole-image format");
  }
  // A header may say 0 rows or columns (stb_image's info accepts a BMP of height 0).
  if (info.height <= 0 || info.width <= 0)
    fail(format, "empty image (" + std::to_string(info.height) + "x" + std::to_string(info.width) + ")");
  return info;
}

void decode_whole(ImageInfo::Format format, std::span<const std::byte> data, Image& out) {
  switch (format) {
    case ImageInfo::Format::kWebp: decode_webp(data, out); return;
    case ImageInfo::Format::kTiff: TiffFile(data).decode(out); return;
    case ImageInfo::Format::kBmp:
    case ImageInfo::Format::kPnm: decode_stb(format, data, out); return;
    default: SPINDLE_THROW(std::logic_error, "decode_whole: not a whole-image format");
  }
}

}  // namespace spindle::ops::detail
