// Pillow's ImagingResample (libImaging/Resample.c) for 8-bit images and the
// bilinear (triangle) filter, restated: per axis, each output sample is a
// normalized triangle-weighted sum over the input window
// [center - support, center + support), support = max(1, in/out), with the
// weights in 22-bit fixed point; two passes with a uint8 image between them,
// horizontal first unless the height shrinks much more than the width (the
// order Pillow 13 picks), each over only the rows/columns the other needs.
// Keeping every one of these steps is what makes the output byte-equal to PIL's.
#include "resample.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace spindle::ops::detail {

namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;

struct Coeffs {
  int ksize = 0;
  std::vector<int> bounds;   // per output: first input index, tap count
  std::vector<int32_t> kk;   // ksize fixed-point weights per output
};

double triangle(double x) {
  if (x < 0.0) x = -x;
  return x < 1.0 ? 1.0 - x : 0.0;
}

void precompute(int in_size, double in0, double in1, int out_size, Coeffs& c) {
  const double scale = (in1 - in0) / out_size;
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = 1.0 * filterscale;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.bounds.assign(static_cast<size_t>(out_size) * 2, 0);
  c.kk.assign(static_cast<size_t>(out_size) * c.ksize, 0);
  std::vector<double> k(c.ksize);
  const double ss = 1.0 / filterscale;
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = in0 + (xx + 0.5) * scale;
    int xmin = static_cast<int>(center - support + 0.5);  // C truncation, as Pillow
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    if (xmax < 0) xmax = 0;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      k[x] = triangle((x + xmin - center + 0.5) * ss);
      ww += k[x];
    }
    for (int x = 0; x < xmax; ++x) {
      const double v = ww != 0.0 ? k[x] / ww : k[x];
      c.kk[static_cast<size_t>(xx) * c.ksize + x] =
          static_cast<int32_t>(v < 0 ? -0.5 + v * (1 << kPrecisionBits) : 0.5 + v * (1 << kPrecisionBits));
    }
    c.bounds[xx * 2] = xmin;
    c.bounds[xx * 2 + 1] = xmax;
  }
}

inline uint8_t clip8(int32_t v) {
  if (v >= (1 << kPrecisionBits << 8)) return 255;
  if (v <= 0) return 0;
  return static_cast<uint8_t>(v >> kPrecisionBits);
}

// rows [row0, row0 + rows) of src (width `in_w`) -> dst (rows x out_w).
void horizontal(const uint8_t* src, int in_w, int ch, int row0, int rows, const Coeffs& c, int out_w, uint8_t* dst) {
  for (int y = 0; y < rows; ++y) {
    const uint8_t* s = src + static_cast<size_t>(row0 + y) * in_w * ch;
    uint8_t* d = dst + static_cast<size_t>(y) * out_w * ch;
    for (int xx = 0; xx < out_w; ++xx) {
      const int xmin = c.bounds[xx * 2], n = c.bounds[xx * 2 + 1];
      const int32_t* k = &c.kk[static_cast<size_t>(xx) * c.ksize];
      const uint8_t* p = s + static_cast<size_t>(xmin) * ch;
      if (ch == 3) {
        int32_t a0 = 1 << (kPrecisionBits - 1), a1 = a0, a2 = a0;
        for (int x = 0; x < n; ++x) {
          a0 += p[3 * x] * k[x];
          a1 += p[3 * x + 1] * k[x];
          a2 += p[3 * x + 2] * k[x];
        }
        d[3 * xx] = clip8(a0);
        d[3 * xx + 1] = clip8(a1);
        d[3 * xx + 2] = clip8(a2);
      } else {
        for (int cc = 0; cc < ch; ++cc) {
          int32_t a = 1 << (kPrecisionBits - 1);
          for (int x = 0; x < n; ++x) a += p[ch * x + cc] * k[x];
          d[ch * xx + cc] = clip8(a);
        }
      }
    }
  }
}

// src (rows `src_stride` bytes apart; row_len bytes used from each) -> dst
// (out_h x row_len), bounds relative to src row 0.
void vertical(const uint8_t* src, size_t src_stride, size_t row_len, const Coeffs& c, int out_h, uint8_t* dst) {
  std::vector<int32_t> acc(row_len);
  for (int yy = 0; yy < out_h; ++yy) {
    const int ymin = c.bounds[yy * 2], n = c.bounds[yy * 2 + 1];
    const int32_t* k = &c.kk[static_cast<size_t>(yy) * c.ksize];
    std::fill(acc.begin(), acc.end(), 1 << (kPrecisionBits - 1));
    for (int y = 0; y < n; ++y) {
      const uint8_t* s = src + static_cast<size_t>(ymin + y) * src_stride;
      const int32_t w = k[y];
      for (size_t i = 0; i < row_len; ++i) acc[i] += s[i] * w;  // vectorizes
    }
    uint8_t* d = dst + static_cast<size_t>(yy) * row_len;
    for (size_t i = 0; i < row_len; ++i) d[i] = clip8(acc[i]);
  }
}

}  // namespace

void resample(const uint8_t* src, int height, int width, int ch, BoxF box, Size size, Image& out) {
  const int xsize = size.width, ysize = size.height;
  const bool need_h = xsize != width || box.left != 0 || box.width != xsize;
  const bool need_v = ysize != height || box.top != 0 || box.height != ysize;
  out.height = ysize;
  out.width = xsize;
  out.channels = ch;
  out.pixels.resize(static_cast<size_t>(ysize) * xsize * ch);
  if (!need_h && !need_v) {
    std::memcpy(out.pixels.data(), src, out.pixels.size());
    return;
  }
  Coeffs cv, chz;
  precompute(height, box.top, box.top + box.height, ysize, cv);
  precompute(width, box.left, box.left + box.width, xsize, chz);
  const size_t stride = static_cast<size_t>(width) * ch;
  if (!need_h) {
    vertical(src, stride, stride, cv, ysize, out.pixels.data());
    return;
  }
  if (!need_v) {
    horizontal(src, width, ch, 0, height, chz, xsize, out.pixels.data());
    return;
  }
  // Pillow 13 (python-pillow/Pillow#9549) runs the vertical pass first when the
  // height shrinks by more than twice as many pixels as the width; the passes'
  // order decides how the uint8 intermediate rounds, so follow it exactly.
  const bool vertical_first = ysize < box.height && (box.height - ysize) > 2 * (box.width - xsize);
  if (!vertical_first) {
    // Horizontal pass over only the rows the vertical pass reads.
    const int first = cv.bounds[0];
    const int last = cv.bounds[ysize * 2 - 2] + cv.bounds[ysize * 2 - 1];
    for (int i = 0; i < ysize; ++i) cv.bounds[i * 2] -= first;
    std::vector<uint8_t> tmp(static_cast<size_t>(last - first) * xsize * ch);
    horizontal(src, width, ch, first, last - first, chz, xsize, tmp.data());
    vertical(tmp.data(), static_cast<size_t>(xsize) * ch, static_cast<size_t>(xsize) * ch, cv, ysize,
             out.pixels.data());
  } else {
    // Vertical pass over only the columns the horizontal pass reads.
    const int first = chz.bounds[0];
    const int last = chz.bounds[xsize * 2 - 2] + chz.bounds[xsize * 2 - 1];
    for (int i = 0; i < xsize; ++i) chz.bounds[i * 2] -= first;
    const int cols = last - first;
    std::vector<uint8_t> tmp(static_cast<size_t>(ysize) * cols * ch);
    vertical(src + static_cast<size_t>(first) * ch, stride, static_cast<size_t>(cols) * ch, cv, ysize, tmp.data());
    horizontal(tmp.data(), cols, ch, 0, ysize, chz, xsize, out.pixels.data());
  }
}

}  // namespace spindle::ops::detail
