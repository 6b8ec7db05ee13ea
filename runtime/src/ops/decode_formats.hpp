#pragma once
// Not API: the formats decoded whole (no fused crop or DCT scaling), beside
// JPEG and PNG in decode.cpp: WebP (libwebp), TIFF (libtiff), BMP and binary
// PPM/PGM (stb_image, compiled into this library with only those two
// decoders). Each gives RGB8 as PIL's Image.open(f).convert("RGB") does.
// docs/ops.md says why these libraries.
#include <spindle/ops/image_ops.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

namespace spindle::ops::detail {

// "WebP", "TIFF", "BMP", "PPM/PGM" (and "JPEG", "PNG"): for error messages.
const char* format_name(ImageInfo::Format format) noexcept;

// Throws DecodeError for an empty image or one over kMaxImagePixels, before
// anything is allocated (defined in decode.cpp, shared by every format).
void check_pixels(int64_t height, int64_t width, const char* format);

// The header of a kWebp, kTiff, kBmp or kPnm image (channels as stored).
ImageInfo probe_whole(ImageInfo::Format format, std::span<const std::byte> data);

// The whole image as RGB8 into `out` (its buffer reused). Bad or unsupported
// input throws DecodeError "cannot decode <format>: <the decoder's message>".
void decode_whole(ImageInfo::Format format, std::span<const std::byte> data, Image& out);

}  // namespace spindle::ops::detail
