#pragma once
// A JPEG encoder for test and benchmark images (libjpeg), shared by
// tests/cpp/image_ops_test.cpp and bench/cpp/image_ops_bench.cpp so both decode
// files made the same way. Not part of the runtime; nothing here is used by it.

#include <spindle/ops/image_ops.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <jpeglib.h>

namespace spindle::testing {

// `img` (1 or 3 channels) as a baseline JPEG of `quality`; 3-channel images use
// libjpeg's default 4:2:0 chroma subsampling unless `subsample` is false (4:4:4).
inline std::vector<std::byte> encode_jpeg(const ops::Image& img, int quality = 90, bool subsample = true) {
  jpeg_compress_struct cinfo{};
  jpeg_error_mgr jerr{};
  cinfo.err = jpeg_std_error(&jerr);
  jpeg_create_compress(&cinfo);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buf, &size);
  cinfo.image_width = img.width;
  cinfo.image_height = img.height;
  cinfo.input_components = img.channels;
  cinfo.in_color_space = img.channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  if (!subsample && img.channels == 3) cinfo.comp_info[0].h_samp_factor = cinfo.comp_info[0].v_samp_factor = 1;
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(img.pixels.data()) +
                   static_cast<size_t>(cinfo.next_scanline) * img.width * img.channels;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::vector<std::byte> out(reinterpret_cast<std::byte*>(buf), reinterpret_cast<std::byte*>(buf) + size);
  std::free(buf);
  return out;
}

}  // namespace spindle::testing
