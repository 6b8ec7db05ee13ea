// probe() and decode(): JPEG through libjpeg-turbo's libjpeg API (fused crop and
// DCT-domain downscaling), PNG through libspng, the other formats decoded whole
// (decode_formats.cpp). docs/ops.md explains the choices.
#include <spindle/error.hpp>
#include <spindle/ops/image_ops.hpp>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>  // jpeglib.h needs FILE
#include <cstring>
#include <string>

#include <jerror.h>
#include <jpeglib.h>
#include <spng.h>

#include "decode_formats.hpp"
#include "resample.hpp"

namespace spindle::ops {

namespace {

constexpr unsigned char kJpegMagic[] = {0xFF, 0xD8, 0xFF};
constexpr unsigned char kPngMagic[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};

bool starts_with(std::span<const std::byte> data, const unsigned char* magic, size_t n) {
  return data.size() >= n && std::memcmp(data.data(), magic, n) == 0;
}

ImageInfo::Format sniff(std::span<const std::byte> data) {
  using F = ImageInfo::Format;
  if (starts_with(data, kJpegMagic, sizeof kJpegMagic)) return F::kJpeg;
  if (starts_with(data, kPngMagic, sizeof kPngMagic)) return F::kPng;
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  if (data.size() >= 12 && std::memcmp(p, "RIFF", 4) == 0 && std::memcmp(p + 8, "WEBP", 4) == 0) return F::kWebp;
  if (data.size() >= 4 && (std::memcmp(p, "II*\0", 4) == 0 || std::memcmp(p, "MM\0*", 4) == 0 ||
                           std::memcmp(p, "II+\0", 4) == 0 || std::memcmp(p, "MM\0+", 4) == 0))
    return F::kTiff;  // classic and BigTIFF, either byte order
  if (data.size() >= 2 && p[0] == 'B' && p[1] == 'M') return F::kBmp;
  if (data.size() >= 2 && p[0] == 'P' && p[1] >= '1' && p[1] <= '6') return F::kPnm;
  if (data.empty()) SPINDLE_THROW(DecodeError, "cannot decode image: the input is empty (0 bytes)");
  char head[3 * 8 + 1] = {};
  const size_t n = std::min<size_t>(data.size(), 8);
  for (size_t i = 0; i < n; ++i)
    std::snprintf(head + 3 * i, 4, "%02x ", static_cast<unsigned>(std::to_integer<unsigned char>(data[i])));
  SPINDLE_THROW(DecodeError, "cannot decode image: not a JPEG, PNG, WebP, TIFF, BMP or PPM/PGM (" +
                                 std::to_string(data.size()) + " bytes starting " + std::string(head, 3 * n - 1) + ")");
}

bool inside(const CropBox& b, int height, int width) {
  return b.top >= 0 && b.left >= 0 && b.top <= height - b.height && b.left <= width - b.width;
}

}  // namespace

void detail::check_pixels(int64_t height, int64_t width, const char* format) {
  if (height <= 0 || width <= 0)
    SPINDLE_THROW(DecodeError, std::string("cannot decode ") + format + ": empty image (" + std::to_string(height) +
                                   "x" + std::to_string(width) + ")");
  if (height * width > kMaxImagePixels)
    SPINDLE_THROW(DecodeError, std::string("cannot decode ") + format + ": " + std::to_string(height) + "x" +
                                   std::to_string(width) + " exceeds the limit of " +
                                   std::to_string(kMaxImagePixels) + " pixels (a decompression bomb?)");
}

namespace {

using detail::check_pixels;

CropBox checked_crop(const std::optional<CropBox>& crop, int height, int width) {
  if (!crop) return {0, 0, height, width};
  const CropBox& b = *crop;
  if (b.top < 0 || b.left < 0 || b.height <= 0 || b.width <= 0 || b.top > height - b.height ||
      b.left > width - b.width) {
    SPINDLE_THROW(std::invalid_argument, "decode: crop (top " + std::to_string(b.top) + ", left " +
                                             std::to_string(b.left) + ", " + std::to_string(b.height) + "x" +
                                             std::to_string(b.width) + ") is empty or leaves the " +
                                             std::to_string(height) + "x" + std::to_string(width) + " image");
  }
  return b;
}

void check_size(const std::optional<Size>& size) {
  if (size && (size->height <= 0 || size->width <= 0 || int64_t{size->height} * size->width > kMaxImagePixels)) {
    SPINDLE_THROW(std::invalid_argument, "decode: target size " + std::to_string(size->height) + "x" +
                                             std::to_string(size->width) + " must be positive and at most " +
                                             std::to_string(kMaxImagePixels) + " pixels");
  }
}

// ---- JPEG --------------------------------------------------------------------

// libjpeg reports errors through error_exit, whose default calls exit(), and
// prints warnings to stderr. Ours longjmps back to the setjmp in
// JpegDecoder::run with the library's own message, and drops warnings except
// "Premature end of JPEG file", which is an error here (as in PIL, which raises
// for truncated images): a truncated file must not pass as a grey-padded one.
// Other corrupt-data warnings (e.g. extraneous bytes before a marker) are
// ignored like PIL does; libjpeg then decodes what it can.
struct JpegErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void jpeg_error_exit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void jpeg_emit_message(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) jpeg_error_exit(cinfo);
  if (level < 0) cinfo->err->num_warnings++;
}

void jpeg_output_message(j_common_ptr) {}

// All libjpeg calls happen inside run(), between setjmp and the end of the
// function, with no objects that have destructors in that frame: a longjmp out
// of libjpeg skips only C frames and trivially destructible locals. Buffers
// live in the JpegDecoder (the caller's frame) and are freed normally.
class JpegDecoder {
 public:
  JpegDecoder() {
    cinfo_.err = jpeg_std_error(&err_.pub);
    err_.pub.error_exit = jpeg_error_exit;
    err_.pub.emit_message = jpeg_emit_message;
    err_.pub.output_message = jpeg_output_message;
    jpeg_create_decompress(&cinfo_);  // only fails on out-of-memory, through error_exit
    created_ = true;
  }
  ~JpegDecoder() {
    if (created_) jpeg_destroy_decompress(&cinfo_);
  }
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  ImageInfo probe(std::span<const std::byte> data) {
    if (setjmp(err_.jump)) fail();
    start(data);
    return info();
  }

  // False (nothing decoded) when `crop` leaves the image: the caller pads.
  bool decode(std::span<const std::byte> data, const std::optional<CropBox>& crop, const std::optional<Size>& size,
              Image& out) {
    if (setjmp(err_.jump)) fail();
    start(data);
    const ImageInfo in = info();
    check_pixels(in.height, in.width, "JPEG");
    if (crop && !inside(*crop, in.height, in.width)) return false;
    const CropBox box = checked_crop(crop, in.height, in.width);
    const Region r = begin_region(box, size);
    const int comps = cinfo_.output_components;
    row_.resize(static_cast<size_t>(cinfo_.output_width) * comps);

    Image& region = (size || r.denom != 1) ? region_ : out;
    region.height = r.y1 - r.y0;
    region.width = r.x1 - r.x0;
    region.channels = 3;
    region.pixels.resize(static_cast<size_t>(region.height) * region.width * 3);
    const bool adobe_inverted = r.cmyk && cinfo_.saw_Adobe_marker;
    for (int y = 0; y < region.height; ++y) {
      JSAMPROW rows[1] = {row_.data()};
      if (jpeg_read_scanlines(&cinfo_, rows, 1) != 1)
        SPINDLE_THROW(DecodeError, "cannot decode JPEG: no scanline " + std::to_string(r.y0 + y));
      uint8_t* dst = region.pixels.data() + static_cast<size_t>(y) * region.width * 3;
      const uint8_t* src = row_.data() + static_cast<size_t>(r.skip) * comps;
      if (!r.cmyk) {
        std::memcpy(dst, src, static_cast<size_t>(region.width) * 3);
      } else {
        cmyk_to_rgb(src, region.width, adobe_inverted, dst);
      }
    }
    // The rows below the crop are never decoded; abort instead of finishing.
    jpeg_abort_decompress(&cinfo_);

    if (size || r.denom != 1) {
      const Size target = size ? *size : Size{box.height, box.width};
      detail::resample(region.pixels.data(), region.height, region.width, 3, crop_in_region(box, r), target, out);
    }
    return true;
  }

  // decode(crop, size) + hflip into `out`, the crop chosen by `plan` from the
  // header read once. The scanlines go straight into one reused buffer (rows
  // of the cropped scanline's width) and the resampler reads the crop's
  // columns from it in place: no row copies, no allocation once warm.
  // False (nothing decoded; the plan in `planned`) when the planned box
  // leaves the image: the caller pads.
  bool decode_resized(std::span<const std::byte> data, const std::function<CropPlan(int, int)>& plan, Size size,
                      std::span<uint8_t> out, CropPlan& planned) {
    if (setjmp(err_.jump)) fail();
    start(data);
    const ImageInfo in = info();
    check_pixels(in.height, in.width, "JPEG");
    const CropPlan p = plan(in.height, in.width);
    planned = p;
    if (!inside(p.box, in.height, in.width)) return false;
    const CropBox box = checked_crop(p.box, in.height, in.width);
    const Region r = begin_region(box, size);
    const int comps = cinfo_.output_components;
    const size_t stride = static_cast<size_t>(cinfo_.output_width) * comps;
    const int rows = r.y1 - r.y0, width = r.x1 - r.x0;
    // One spare byte: the resampler's 4-byte loads may read one past the last pixel.
    buffer_.resize(stride * rows + 1);
    row_pointers_.resize(static_cast<size_t>(rows));
    for (int y = 0; y < rows; ++y) row_pointers_[y] = buffer_.data() + y * stride;
    for (int done = 0; done < rows;) {
      const JDIMENSION n = jpeg_read_scanlines(&cinfo_, row_pointers_.data() + done, static_cast<JDIMENSION>(rows - done));
      if (n == 0) SPINDLE_THROW(DecodeError, "cannot decode JPEG: no scanline " + std::to_string(r.y0 + done));
      done += static_cast<int>(n);
    }
    jpeg_abort_decompress(&cinfo_);  // the rows below the crop are never decoded

    const uint8_t* src = buffer_.data() + static_cast<size_t>(r.skip) * comps;
    size_t src_stride = stride;
    if (r.cmyk) {
      region_.pixels.resize(static_cast<size_t>(rows) * width * 3 + 1);
      for (int y = 0; y < rows; ++y)
        cmyk_to_rgb(src + y * stride, width, cinfo_.saw_Adobe_marker, region_.pixels.data() + y * width * 3);
      src = region_.pixels.data();
      src_stride = static_cast<size_t>(width) * 3;
    }
    detail::resample_into(src, src_stride, rows, width, 3, crop_in_region(box, r), size, p.mirror, out.data());
    return true;
  }

 private:
  // The decoded region: scaled pixels [y0, y1) x [x0, x1) of the crop, the
  // DCT scale 1/denom, and `skip` columns of the cropped scanline before x0.
  struct Region {
    int denom = 1, x0 = 0, y0 = 0, x1 = 0, y1 = 0, skip = 0;
    bool cmyk = false;
  };

  // Picks the DCT scale, starts decompression, and positions the decoder at
  // the crop's first row and (widened) columns. Called from inside the frame
  // that did setjmp; holds nothing with a destructor.
  Region begin_region(const CropBox& box, const std::optional<Size>& size) {
    Region r;
    // DCT-domain downscaling: the largest 1/d (d in 8, 4, 2) that keeps the
    // scaled crop at least the target size in both dimensions.
    if (size) {
      for (int d : {8, 4, 2}) {
        if (box.height >= d * size->height && box.width >= d * size->width) {
          r.denom = d;
          break;
        }
      }
    }
    cinfo_.scale_num = 1;
    cinfo_.scale_denom = static_cast<unsigned>(r.denom);
    r.cmyk = cinfo_.jpeg_color_space == JCS_CMYK || cinfo_.jpeg_color_space == JCS_YCCK;
    cinfo_.out_color_space = r.cmyk ? JCS_CMYK : JCS_RGB;
    cinfo_.dct_method = JDCT_ISLOW;  // what PIL uses: the pixels equal its decode
    jpeg_start_decompress(&cinfo_);

    // The crop in scaled pixels; the region decoded covers it, rounded outward.
    const int out_w = static_cast<int>(cinfo_.output_width), out_h = static_cast<int>(cinfo_.output_height);
    // Scaled pixel i is the DCT-domain reduction of source pixels [i*d, i*d + d),
    // so source coordinate x maps to x / d exactly (not out_w / width, which the
    // rounded-up last column would skew).
    const double s = 1.0 / r.denom;
    const int d = r.denom;
    r.x0 = d == 1 ? box.left : static_cast<int>(std::floor(box.left * s));
    r.y0 = d == 1 ? box.top : static_cast<int>(std::floor(box.top * s));
    r.x1 = d == 1 ? box.left + box.width : std::min(out_w, static_cast<int>(std::ceil((box.left + box.width) * s)));
    r.y1 = d == 1 ? box.top + box.height : std::min(out_h, static_cast<int>(std::ceil((box.top + box.height) * s)));

    // jpeg_crop_scanline moves the left edge down to an iMCU boundary but
    // leaves the right edge where asked, and the fancy upsampler treats both
    // edges of the cropped row as image edges (replicating chroma): asking for
    // kChromaMargin more columns on each side keeps the crop's own columns
    // interior, so they equal a full decode's.
    constexpr int kChromaMargin = 2;
    const int req0 = std::max(0, r.x0 - kChromaMargin), req1 = std::min(out_w, r.x1 + kChromaMargin);
    JDIMENSION xoff = static_cast<JDIMENSION>(req0), cw = static_cast<JDIMENSION>(req1 - req0);
    if (req0 != 0 || req1 != out_w) jpeg_crop_scanline(&cinfo_, &xoff, &cw);
    r.skip = r.x0 - static_cast<int>(xoff);
    if (r.y0 > 0 && jpeg_skip_scanlines(&cinfo_, static_cast<JDIMENSION>(r.y0)) != static_cast<JDIMENSION>(r.y0))
      SPINDLE_THROW(DecodeError, "cannot decode JPEG: could not skip to the crop's first row");
    return r;
  }

  // The crop's exact position inside the decoded region, in scaled pixels:
  // for denom 1 it is the whole region (then the resize equals PIL's exactly).
  static detail::BoxF crop_in_region(const CropBox& box, const Region& r) {
    if (r.denom == 1) return {0, 0, static_cast<double>(r.y1 - r.y0), static_cast<double>(r.x1 - r.x0)};
    const double s = 1.0 / r.denom;
    return {box.top * s - r.y0, box.left * s - r.x0, box.height * s, box.width * s};
  }

  // Reads the headers of `data`; on error longjmps to the caller's setjmp.
  // The decompressor is reused: whatever an earlier call left (an error, an
  // exception between libjpeg calls) is aborted first.
  void start(std::span<const std::byte> data) {
    jpeg_abort_decompress(&cinfo_);
    jpeg_mem_src(&cinfo_, reinterpret_cast<const unsigned char*>(data.data()), static_cast<unsigned long>(data.size()));
    if (jpeg_read_header(&cinfo_, TRUE) != JPEG_HEADER_OK)
      SPINDLE_THROW(DecodeError, "cannot decode JPEG: no image in the data (tables only)");
  }

  ImageInfo info() const {
    return {static_cast<int>(cinfo_.image_height), static_cast<int>(cinfo_.image_width), cinfo_.num_components,
            ImageInfo::Format::kJpeg};
  }

  // CMYK -> RGB as r = (255 - c) * (255 - k) / 255, rounded: Pillow's
  // cmyk2rgb (tests/python/test_ops.py compares). Adobe files store inverted
  // CMYK, which libjpeg passes through.
  static void cmyk_to_rgb(const uint8_t* src, int width, bool inverted, uint8_t* dst) {
    for (int x = 0; x < width; ++x) {
      int c = src[4 * x], m = src[4 * x + 1], yl = src[4 * x + 2], k = src[4 * x + 3];
      if (!inverted) {
        c = 255 - c, m = 255 - m, yl = 255 - yl, k = 255 - k;
      }
      auto mul = [](int a, int b) {  // round(a * b / 255), exact for 0..255
        const int t = a * b + 128;
        return static_cast<uint8_t>((t + (t >> 8)) >> 8);
      };
      dst[3 * x] = mul(c, k);
      dst[3 * x + 1] = mul(m, k);
      dst[3 * x + 2] = mul(yl, k);
    }
  }

  [[noreturn]] void fail() { SPINDLE_THROW(DecodeError, std::string("cannot decode JPEG: ") + err_.message); }

  jpeg_decompress_struct cinfo_{};
  JpegErrorManager err_{};
  bool created_ = false;
  std::vector<uint8_t> row_, buffer_;
  std::vector<JSAMPROW> row_pointers_;
  Image region_;
};

// One decoder per thread, reused: no decompressor set-up or buffer
// allocation per image.
JpegDecoder& local_jpeg_decoder() {
  thread_local JpegDecoder decoder;
  return decoder;
}

// ---- PNG ---------------------------------------------------------------------

class PngDecoder {
 public:
  explicit PngDecoder(std::span<const std::byte> data) : ctx_(spng_ctx_new(0)) {
    if (!ctx_) throw std::bad_alloc();
    // Bounds before anything is allocated: the pixel limit, and chunk sizes a
    // real image never needs (text and metadata chunks of a hostile file).
    check(spng_set_image_limits(ctx_, 1u << 30, 1u << 30), "limits");
    check(spng_set_chunk_limits(ctx_, 64u << 20, 64u << 20), "limits");
    check(spng_set_png_buffer(ctx_, data.data(), data.size()), "reading");
  }
  ~PngDecoder() { spng_ctx_free(ctx_); }
  PngDecoder(const PngDecoder&) = delete;
  PngDecoder& operator=(const PngDecoder&) = delete;

  ImageInfo probe() {
    spng_ihdr ihdr{};
    check(spng_get_ihdr(ctx_, &ihdr), "reading the header");
    int channels = 3;
    switch (ihdr.color_type) {
      case SPNG_COLOR_TYPE_GRAYSCALE: channels = 1; break;
      case SPNG_COLOR_TYPE_GRAYSCALE_ALPHA: channels = 2; break;
      case SPNG_COLOR_TYPE_TRUECOLOR_ALPHA: channels = 4; break;
      default: channels = 3;  // truecolor, indexed (palette of RGB)
    }
    return {static_cast<int>(ihdr.height), static_cast<int>(ihdr.width), channels, ImageInfo::Format::kPng};
  }

  // The whole image as RGB8: gray is replicated, the palette expanded, alpha
  // dropped (PIL's convert("RGB")), 16-bit samples reduced to 8 bits by libspng.
  void decode(Image& full) {
    const ImageInfo in = probe();
    check_pixels(in.height, in.width, "PNG");
    size_t bytes = 0;
    check(spng_decoded_image_size(ctx_, SPNG_FMT_RGB8, &bytes), "sizing");
    full.height = in.height;
    full.width = in.width;
    full.channels = 3;
    full.pixels.resize(bytes);
    check(spng_decode_image(ctx_, full.pixels.data(), bytes, SPNG_FMT_RGB8, 0), "decoding");
  }

 private:
  void check(int rc, const char* step) {
    if (rc != 0) SPINDLE_THROW(DecodeError, std::string("cannot decode PNG (") + step + "): " + spng_strerror(rc));
  }

  spng_ctx* ctx_;
};

// Every format but JPEG: the whole image, decoded into `full`.
void decode_whole_image(ImageInfo::Format f, std::span<const std::byte> encoded, Image& full) {
  if (f == ImageInfo::Format::kPng) {
    PngDecoder(encoded).decode(full);
    return;
  }
  detail::decode_whole(f, encoded, full);
}

// crop (padded where it leaves the image) + resize of a whole decoded image.
// PIL crops first, so its resize sees no pixels outside the crop: same here.
void finish_whole(Image& full, const std::optional<CropBox>& crop, const std::optional<Size>& size, Image& out) {
  const bool whole = !crop || (crop->top == 0 && crop->left == 0 && crop->height == full.height &&
                               crop->width == full.width);
  if (whole && !size) {
    std::swap(out, full);
    return;
  }
  thread_local Image cropped;
  const Image* src = &full;
  if (!whole) {
    ops::crop(full, *crop, cropped);
    src = &cropped;
  }
  if (size) {
    detail::resample(src->pixels.data(), src->height, src->width, 3,
                     {0, 0, static_cast<double>(src->height), static_cast<double>(src->width)}, *size, out);
  } else {
    out = *src;
  }
}

// A JPEG crop that leaves the image: the part inside decoded as usual, the rest
// zeros (torchvision pads with fill 0, then crops), then the resize.
void decode_jpeg_padded(std::span<const std::byte> encoded, const CropBox& box, const std::optional<Size>& size,
                        Image& out) {
  const ImageInfo in = local_jpeg_decoder().probe(encoded);
  const int top = std::max(0, box.top), left = std::max(0, box.left);
  const int bottom = std::min(in.height, box.top + box.height), right = std::min(in.width, box.left + box.width);
  thread_local Image part, canvas;
  canvas.height = box.height;
  canvas.width = box.width;
  canvas.channels = 3;
  canvas.pixels.assign(static_cast<size_t>(box.height) * box.width * 3, 0);
  if (bottom > top && right > left) {
    local_jpeg_decoder().decode(encoded, CropBox{top, left, bottom - top, right - left}, std::nullopt, part);
    const size_t row = static_cast<size_t>(part.width) * 3;
    for (int y = 0; y < part.height; ++y)
      std::memcpy(canvas.pixels.data() + (static_cast<size_t>(top - box.top + y) * box.width + (left - box.left)) * 3,
                  part.pixels.data() + y * row, row);
  }
  finish_whole(canvas, std::nullopt, size, out);
}

}  // namespace

ImageInfo probe(std::span<const std::byte> encoded) {
  const ImageInfo::Format f = sniff(encoded);
  if (f == ImageInfo::Format::kJpeg) return local_jpeg_decoder().probe(encoded);
  if (f == ImageInfo::Format::kPng) return PngDecoder(encoded).probe();
  return detail::probe_whole(f, encoded);
}

void decode(std::span<const std::byte> encoded, const std::optional<CropBox>& crop, const std::optional<Size>& size,
            Image& out) {
  check_size(size);
  if (crop && (crop->height <= 0 || crop->width <= 0))
    SPINDLE_THROW(std::invalid_argument, "decode: crop " + std::to_string(crop->height) + "x" +
                                             std::to_string(crop->width) + " is empty");
  const ImageInfo::Format f = sniff(encoded);
  if (f == ImageInfo::Format::kJpeg) {
    if (!local_jpeg_decoder().decode(encoded, crop, size, out)) decode_jpeg_padded(encoded, *crop, size, out);
    return;
  }
  thread_local Image full;
  decode_whole_image(f, encoded, full);
  finish_whole(full, crop, size, out);
}

void decode_resized(std::span<const std::byte> encoded, const std::function<CropPlan(int height, int width)>& plan,
                    Size size, std::span<uint8_t> out) {
  check_size(size);
  if (out.size() != static_cast<size_t>(size.height) * size.width * 3)
    SPINDLE_THROW(std::invalid_argument, "decode_resized: out has " + std::to_string(out.size()) + " bytes, not " +
                                             std::to_string(static_cast<size_t>(size.height) * size.width * 3));
  const ImageInfo::Format f = sniff(encoded);
  thread_local Image img;
  CropPlan p;
  if (f == ImageInfo::Format::kJpeg) {
    if (local_jpeg_decoder().decode_resized(encoded, plan, size, out, p)) return;
    decode_jpeg_padded(encoded, p.box, size, img);  // the plan ran once; its box leaves the image
  } else {
    // Decoded whole anyway: decode, then crop + resize, the flip and a copy.
    thread_local Image full;
    decode_whole_image(f, encoded, full);
    p = plan(full.height, full.width);
    finish_whole(full, p.box, size, img);
  }
  if (p.mirror) hflip(img);
  std::memcpy(out.data(), img.pixels.data(), out.size());
}

}  // namespace spindle::ops
