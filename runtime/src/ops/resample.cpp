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

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

// Pillow's clip8 (>= 256 << 22 gives 255, <= 0 gives 0, else v >> 22), written
// as a clamp so that the vertical pass's loop vectorizes.
inline uint8_t clip8(int32_t v) { return static_cast<uint8_t>(std::clamp(v >> kPrecisionBits, 0, 255)); }

// One RGB output of the horizontal pass, in scalar code: each channel's sum of
// `n` taps (pixel * weight), rounded and clipped as Pillow does. Every SIMD path
// computes exactly this, and falls back to it where its wide loads could pass
// the buffer's end. Always inlined, so that a compile-time `n` (the templates'
// K) keeps the fixed trip count the unrolled loops rely on.
__attribute__((always_inline)) inline void rgb_taps(const uint8_t* p, const int32_t* k, int n, uint8_t* d) {
  int32_t a0 = 1 << (kPrecisionBits - 1), a1 = a0, a2 = a0;
  for (int x = 0; x < n; ++x) {
    a0 += p[3 * x] * k[x];
    a1 += p[3 * x + 1] * k[x];
    a2 += p[3 * x + 2] * k[x];
  }
  d[0] = clip8(a0);
  d[1] = clip8(a1);
  d[2] = clip8(a2);
}

// Gives every output the same number of taps, ksize, so the horizontal inner
// loop has a fixed trip count (no mispredicted loop exits, unrolled): windows
// are padded with zero weights, moved left where they would pass the right
// edge. Adding zero-weighted samples leaves every sum, so every pixel, unchanged.
// Returns false (nothing changed) when the input is narrower than ksize.
bool pad_to_ksize(int in_size, Coeffs& c) {
  const int out_size = static_cast<int>(c.bounds.size() / 2);
  if (in_size < c.ksize) return false;
  for (int xx = 0; xx < out_size; ++xx) {
    const int xmin = c.bounds[xx * 2], n = c.bounds[xx * 2 + 1];
    const int start = std::min(xmin, in_size - c.ksize);
    const int shift = xmin - start;
    int32_t* k = &c.kk[static_cast<size_t>(xx) * c.ksize];
    if (shift > 0) {
      std::memmove(k + shift, k, sizeof(int32_t) * n);
      std::fill(k, k + shift, 0);
    }
    std::fill(k + shift + n, k + c.ksize, 0);
    c.bounds[xx * 2] = start;
    c.bounds[xx * 2 + 1] = c.ksize;
  }
  return true;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SPINDLE_OPS_SSE41 1
// The same sums as horizontal_rgb_fixed, one pixel's three channels in one
// 4-lane register: each tap loads 4 bytes (R, G, B and the next pixel's R,
// whose lane is ignored), widens them to int32 and adds weight * pixel. Every
// lane computes exactly the scalar sum. The 4-byte load may read one byte past
// a row: inside the buffer except at its very end, which the caller keeps to
// the scalar loop.
template <int K>
__attribute__((target("sse4.1"))) void horizontal_rgb_sse41(const uint8_t* src, size_t stride, int in_w, int row0,
                                                            int rows, const Coeffs& c, int out_w, bool mirror,
                                                            uint8_t* dst) {
  for (int y = 0; y < rows; ++y) {
    const uint8_t* s = src + static_cast<size_t>(row0 + y) * stride;
    uint8_t* row_out = dst + static_cast<size_t>(y) * out_w * 3;
    const bool last_row = y == rows - 1;
    for (int xx = 0; xx < out_w; ++xx) {
      uint8_t* d = row_out + 3 * (mirror ? out_w - 1 - xx : xx);
      const int32_t* k = &c.kk[static_cast<size_t>(xx) * K];
      const int xmin = c.bounds[xx * 2];
      const uint8_t* p = s + static_cast<size_t>(xmin) * 3;
      if (last_row && xmin + K == in_w) {
        rgb_taps(p, k, K, d);
        continue;
      }
      __m128i acc = _mm_set1_epi32(1 << (kPrecisionBits - 1));
      for (int x = 0; x < K; ++x) {
        int32_t four;
        std::memcpy(&four, p + 3 * x, 4);
        const __m128i px = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(four));
        acc = _mm_add_epi32(acc, _mm_mullo_epi32(px, _mm_set1_epi32(k[x])));
      }
      acc = _mm_srai_epi32(acc, kPrecisionBits);
      acc = _mm_min_epi32(_mm_max_epi32(acc, _mm_setzero_si128()), _mm_set1_epi32(255));
      alignas(16) int32_t out[4];
      _mm_store_si128(reinterpret_cast<__m128i*>(out), acc);
      d[0] = static_cast<uint8_t>(out[0]);
      d[1] = static_cast<uint8_t>(out[1]);
      d[2] = static_cast<uint8_t>(out[2]);
    }
  }
}

// The same sums with pmaddwd, two taps per instruction: a 22-bit weight k
// does not fit 16 bits, so it is split as k = hi * 2^11 + lo (hi = k >> 11,
// lo = k & 2047, both 16-bit) and sum(p * k) = (sum(p * hi) << 11) + sum(p * lo),
// exact in int32 (|sums| < 2^31). Per pair of taps one 8-byte load holds both
// pixels; pshufb spreads them to int16 lanes (R R G G B B 0 0) for pmaddwd
// against weights laid out beforehand by madd_weights. K is rounded up to
// even taps with a zero weight. Two outputs go through one 256-bit register
// (AVX2); an odd last output, and the last row (whose 8-byte loads, up to 5
// bytes past the last tap's pixel, could pass the buffer's end), one at a time.
//
// Weights: per pair of outputs q and pair of taps j, 64 int16: the hi vector
// of output 2q (8 lanes: R R G G B B 0 0), of output 2q + 1, then the lo
// vectors likewise.
constexpr int kMaddPairBlock = 32;  // int16 per (output pair, tap pair) and hi/lo half

const int16_t* madd_weights(const Coeffs& c, int out_w, std::vector<int16_t>& storage) {
  const int K = c.ksize, pairs = (K + 1) / 2, out_pairs = (out_w + 1) / 2;
  storage.assign(static_cast<size_t>(out_pairs) * pairs * 2 * kMaddPairBlock + 16, 0);
  auto* base = reinterpret_cast<int16_t*>((reinterpret_cast<uintptr_t>(storage.data()) + 31) & ~uintptr_t{31});
  for (int xx = 0; xx < out_w; ++xx)
    for (int j = 0; j < pairs; ++j) {
      int16_t* v = base + (static_cast<size_t>(xx / 2) * pairs + j) * 2 * kMaddPairBlock + (xx % 2) * 8;
      for (int t = 0; t < 2; ++t) {
        const int x = 2 * j + t;
        const int32_t k = x < K ? c.kk[static_cast<size_t>(xx) * K + x] : 0;
        for (int ch = 0; ch < 3; ++ch) {
          v[2 * ch + t] = static_cast<int16_t>(k >> 11);                    // hi
          v[kMaddPairBlock / 2 + 2 * ch + t] = static_cast<int16_t>(k & 2047);  // lo
        }
      }
    }
  return base;
}

template <int K>
__attribute__((target("avx2"), always_inline)) inline uint32_t madd_one(const uint8_t* p, const int16_t* w) {
  constexpr int kPairs = (K + 1) / 2;
  const __m128i spread = _mm_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
  __m128i hi = _mm_setzero_si128(), lo = _mm_setzero_si128();
  for (int j = 0; j < kPairs; ++j) {
    const __m128i px = _mm_shuffle_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 6 * j)), spread);
    const int16_t* wj = w + static_cast<size_t>(j) * 2 * kMaddPairBlock;
    hi = _mm_add_epi32(hi, _mm_madd_epi16(px, _mm_load_si128(reinterpret_cast<const __m128i*>(wj))));
    lo = _mm_add_epi32(lo, _mm_madd_epi16(px, _mm_load_si128(reinterpret_cast<const __m128i*>(wj + kMaddPairBlock / 2))));
  }
  __m128i acc = _mm_add_epi32(_mm_add_epi32(_mm_slli_epi32(hi, 11), lo), _mm_set1_epi32(1 << (kPrecisionBits - 1)));
  acc = _mm_srai_epi32(acc, kPrecisionBits);
  acc = _mm_packus_epi16(_mm_packus_epi32(acc, acc), acc);  // saturating: clip8's clamp
  return static_cast<uint32_t>(_mm_cvtsi128_si32(acc));
}

template <int K>
__attribute__((target("avx2"))) void horizontal_rgb_madd(const uint8_t* src, size_t stride, int in_w, int row0,
                                                         int rows, const Coeffs& c, const int16_t* w, int out_w,
                                                         bool mirror, uint8_t* dst) {
  constexpr int kPairs = (K + 1) / 2;
  const __m256i spread = _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1,
                                          0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
  const __m256i half = _mm256_set1_epi32(1 << (kPrecisionBits - 1));
  const int* bounds = c.bounds.data();
  const int32_t* kk = c.kk.data();
  const int even = out_w & ~1;
  auto at = [&](uint8_t* row_out, int xx) { return row_out + 3 * (mirror ? out_w - 1 - xx : xx); };
  for (int y = 0; y < rows; ++y) {
    const uint8_t* s = src + static_cast<size_t>(row0 + y) * stride;
    uint8_t* row_out = dst + static_cast<size_t>(y) * out_w * 3;
    if (y == rows - 1) {  // one at a time, scalar where the loads could pass the buffer
      for (int xx = 0; xx < out_w; ++xx) {
        const int xmin = bounds[xx * 2];
        const uint8_t* p = s + static_cast<size_t>(xmin) * 3;
        uint8_t* d = at(row_out, xx);
        if (xmin + 2 * kPairs + 1 <= in_w) {
          const uint32_t q = madd_one<K>(p, w + static_cast<size_t>(xx / 2) * kPairs * 2 * kMaddPairBlock + (xx % 2) * 8);
          std::memcpy(d, &q, 3);
          continue;
        }
        const int32_t* k = kk + static_cast<size_t>(xx) * K;
        rgb_taps(p, k, K, d);
      }
      continue;
    }
    for (int xx = 0; xx < even; xx += 2) {
      const uint8_t* p0 = s + static_cast<size_t>(bounds[xx * 2]) * 3;
      const uint8_t* p1 = s + static_cast<size_t>(bounds[xx * 2 + 2]) * 3;
      const int16_t* wq = w + static_cast<size_t>(xx / 2) * kPairs * 2 * kMaddPairBlock;
      __m256i hi = _mm256_setzero_si256(), lo = _mm256_setzero_si256();
      for (int j = 0; j < kPairs; ++j) {
        const __m256i both = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p0 + 6 * j))),
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p1 + 6 * j)), 1);
        const __m256i px = _mm256_shuffle_epi8(both, spread);
        const int16_t* wj = wq + static_cast<size_t>(j) * 2 * kMaddPairBlock;
        hi = _mm256_add_epi32(hi, _mm256_madd_epi16(px, _mm256_load_si256(reinterpret_cast<const __m256i*>(wj))));
        lo = _mm256_add_epi32(
            lo, _mm256_madd_epi16(px, _mm256_load_si256(reinterpret_cast<const __m256i*>(wj + kMaddPairBlock / 2))));
      }
      __m256i acc = _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(hi, 11), lo), half);
      acc = _mm256_srai_epi32(acc, kPrecisionBits);
      acc = _mm256_packus_epi16(_mm256_packus_epi32(acc, acc), acc);
      const uint32_t q0 = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_castsi256_si128(acc)));
      const uint32_t q1 = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_extracti128_si256(acc, 1)));
      std::memcpy(at(row_out, xx), &q0, 3);
      std::memcpy(at(row_out, xx + 1), &q1, 3);
    }
    if (even != out_w) {
      const uint32_t q = madd_one<K>(s + static_cast<size_t>(bounds[even * 2]) * 3,
                                     w + static_cast<size_t>(even / 2) * kPairs * 2 * kMaddPairBlock);
      std::memcpy(at(row_out, even), &q, 3);
    }
  }
}

bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}

bool has_sse41() {
  static const bool yes = __builtin_cpu_supports("sse4.1");
  return yes;
}
#endif

template <int K>
void horizontal_rgb_fixed(const uint8_t* src, size_t stride, int row0, int rows, const Coeffs& c, int out_w,
                          bool mirror, uint8_t* dst) {
  for (int y = 0; y < rows; ++y) {
    const uint8_t* s = src + static_cast<size_t>(row0 + y) * stride;
    uint8_t* row_out = dst + static_cast<size_t>(y) * out_w * 3;
    for (int xx = 0; xx < out_w; ++xx) {
      const int32_t* k = &c.kk[static_cast<size_t>(xx) * K];
      const uint8_t* p = s + static_cast<size_t>(c.bounds[xx * 2]) * 3;
      uint8_t* d = row_out + 3 * (mirror ? out_w - 1 - xx : xx);
      rgb_taps(p, k, K, d);
    }
  }
}

// Scratch buffers of one thread, kept between calls so that a pipeline's
// samples allocate (and page-fault) nothing in the resampler.
struct Scratch {
  Coeffs cv, chz;
  std::vector<uint8_t> tmp;
  std::vector<int32_t> acc;
  std::vector<int16_t> madd;  // horizontal_rgb_madd's weights
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// rows [row0, row0 + rows) of src (width `in_w`, rows `stride` bytes apart) ->
// dst (rows x out_w, contiguous), each row mirrored when `mirror`.
void horizontal(const uint8_t* src, size_t stride, int in_w, int ch, int row0, int rows, Coeffs& c, int out_w,
                bool mirror, uint8_t* dst) {
  if (ch == 3 && c.ksize <= 9 && pad_to_ksize(in_w, c)) {
#ifdef SPINDLE_OPS_SSE41
    if (has_avx2()) {
      const int16_t* w = madd_weights(c, out_w, scratch().madd);
      switch (c.ksize) {
        case 3: return horizontal_rgb_madd<3>(src, stride, in_w, row0, rows, c, w, out_w, mirror, dst);
        case 5: return horizontal_rgb_madd<5>(src, stride, in_w, row0, rows, c, w, out_w, mirror, dst);
        case 7: return horizontal_rgb_madd<7>(src, stride, in_w, row0, rows, c, w, out_w, mirror, dst);
        case 9: return horizontal_rgb_madd<9>(src, stride, in_w, row0, rows, c, w, out_w, mirror, dst);
        default: break;
      }
    }
    if (has_sse41()) {
      switch (c.ksize) {
        case 3: return horizontal_rgb_sse41<3>(src, stride, in_w, row0, rows, c, out_w, mirror, dst);
        case 5: return horizontal_rgb_sse41<5>(src, stride, in_w, row0, rows, c, out_w, mirror, dst);
        case 7: return horizontal_rgb_sse41<7>(src, stride, in_w, row0, rows, c, out_w, mirror, dst);
        case 9: return horizontal_rgb_sse41<9>(src, stride, in_w, row0, rows, c, out_w, mirror, dst);
        default: break;
      }
    }
#endif
    switch (c.ksize) {
      case 3: return horizontal_rgb_fixed<3>(src, stride, row0, rows, c, out_w, mirror, dst);
      case 5: return horizontal_rgb_fixed<5>(src, stride, row0, rows, c, out_w, mirror, dst);
      case 7: return horizontal_rgb_fixed<7>(src, stride, row0, rows, c, out_w, mirror, dst);
      case 9: return horizontal_rgb_fixed<9>(src, stride, row0, rows, c, out_w, mirror, dst);
      default: break;  // ksize is odd: unreachable
    }
  }
  for (int y = 0; y < rows; ++y) {
    const uint8_t* s = src + static_cast<size_t>(row0 + y) * stride;
    uint8_t* row_out = dst + static_cast<size_t>(y) * out_w * ch;
    for (int xx = 0; xx < out_w; ++xx) {
      const int xmin = c.bounds[xx * 2], n = c.bounds[xx * 2 + 1];
      const int32_t* k = &c.kk[static_cast<size_t>(xx) * c.ksize];
      const uint8_t* p = s + static_cast<size_t>(xmin) * ch;
      uint8_t* d = row_out + static_cast<size_t>(mirror ? out_w - 1 - xx : xx) * ch;
      if (ch == 3) {
        rgb_taps(p, k, n, d);
      } else {
        for (int cc = 0; cc < ch; ++cc) {
          int32_t a = 1 << (kPrecisionBits - 1);
          for (int x = 0; x < n; ++x) a += p[ch * x + cc] * k[x];
          d[cc] = clip8(a);
        }
      }
    }
  }
}

// Mirrors each of `rows` rows of `width` pixels of `ch` bytes in place.
void mirror_rows(uint8_t* p, int rows, int width, int ch) {
  for (int y = 0; y < rows; ++y) {
    uint8_t* row = p + static_cast<size_t>(y) * width * ch;
    for (int l = 0, r = width - 1; l < r; ++l, --r)
      for (int c = 0; c < ch; ++c) std::swap(row[l * ch + c], row[r * ch + c]);
  }
}

// src (rows `src_stride` bytes apart; row_len bytes used from each) -> dst
// (out_h x row_len), bounds relative to src row 0.
// Compiled twice, baseline and AVX2 (its 32-bit multiplies vectorize 8 wide;
// the baseline x86-64 build has no pmulld), and picked at run time. Not
// target_clones: its ifunc resolver runs before a sanitizer's runtime is up
// and crashes the sanitizer builds.
// always_inline: the body must be compiled inside each variant, with its target.
template <int kVariant>
__attribute__((always_inline)) inline void vertical_impl(const uint8_t* src, size_t src_stride, size_t row_len, const Coeffs& c, int out_h,
                          uint8_t* dst) {
  std::vector<int32_t>& buffer = scratch().acc;
  buffer.resize(row_len);
  // A plain pointer: through the vector (a thread_local's member) every uint8_t
  // store below might change its data pointer, and the loops would not vectorize.
  int32_t* const acc = buffer.data();
  for (int yy = 0; yy < out_h; ++yy) {
    const int ymin = c.bounds[yy * 2], n = c.bounds[yy * 2 + 1];
    const int32_t* k = &c.kk[static_cast<size_t>(yy) * c.ksize];
    std::fill(acc, acc + row_len, 1 << (kPrecisionBits - 1));
    for (int y = 0; y < n; ++y) {
      const uint8_t* s = src + static_cast<size_t>(ymin + y) * src_stride;
      const int32_t w = k[y];
      for (size_t i = 0; i < row_len; ++i) acc[i] += s[i] * w;  // vectorizes
    }
    uint8_t* d = dst + static_cast<size_t>(yy) * row_len;
    for (size_t i = 0; i < row_len; ++i) d[i] = clip8(acc[i]);
  }
}

void vertical_default(const uint8_t* src, size_t src_stride, size_t row_len, const Coeffs& c, int out_h,
                      uint8_t* dst) {
  vertical_impl<0>(src, src_stride, row_len, c, out_h, dst);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2"))) void vertical_avx2(const uint8_t* src, size_t src_stride, size_t row_len,
                                                   const Coeffs& c, int out_h, uint8_t* dst) {
  vertical_impl<1>(src, src_stride, row_len, c, out_h, dst);
}
#endif

void vertical(const uint8_t* src, size_t src_stride, size_t row_len, const Coeffs& c, int out_h, uint8_t* dst) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return vertical_avx2(src, src_stride, row_len, c, out_h, dst);
#endif
  vertical_default(src, src_stride, row_len, c, out_h, dst);
}

}  // namespace

void resample_into(const uint8_t* src, size_t stride, int height, int width, int ch, BoxF box, Size size,
                   bool mirror, uint8_t* dst) {
  const int xsize = size.width, ysize = size.height;
  const bool need_h = xsize != width || box.left != 0 || box.width != xsize;
  const bool need_v = ysize != height || box.top != 0 || box.height != ysize;
  const size_t out_row = static_cast<size_t>(xsize) * ch;
  if (!need_h && !need_v) {
    for (int y = 0; y < ysize; ++y) std::memcpy(dst + y * out_row, src + y * stride, out_row);
    if (mirror) mirror_rows(dst, ysize, xsize, ch);
    return;
  }
  Scratch& sc = scratch();
  Coeffs& cv = sc.cv;
  Coeffs& chz = sc.chz;
  precompute(height, box.top, box.top + box.height, ysize, cv);
  precompute(width, box.left, box.left + box.width, xsize, chz);
  if (!need_h) {
    vertical(src, stride, out_row, cv, ysize, dst);
    if (mirror) mirror_rows(dst, ysize, xsize, ch);
    return;
  }
  if (!need_v) {
    horizontal(src, stride, width, ch, 0, height, chz, xsize, mirror, dst);
    return;
  }
  // Pillow 13 (python-pillow/Pillow#9549) runs the vertical pass first when the
  // height shrinks by more than twice as many pixels as the width; the passes'
  // order decides how the uint8 intermediate rounds, so follow it exactly.
  const bool vertical_first = ysize < box.height && (box.height - ysize) > 2 * (box.width - xsize);
  std::vector<uint8_t>& tmp = sc.tmp;
  if (!vertical_first) {
    // Horizontal pass over only the rows the vertical pass reads (mirrored
    // there: the vertical pass treats every column alike).
    const int first = cv.bounds[0];
    const int last = cv.bounds[ysize * 2 - 2] + cv.bounds[ysize * 2 - 1];
    for (int i = 0; i < ysize; ++i) cv.bounds[i * 2] -= first;
    tmp.resize(static_cast<size_t>(last - first) * out_row);
    horizontal(src, stride, width, ch, first, last - first, chz, xsize, mirror, tmp.data());
    vertical(tmp.data(), out_row, out_row, cv, ysize, dst);
  } else {
    // Vertical pass over only the columns the horizontal pass reads.
    const int first = chz.bounds[0];
    const int last = chz.bounds[xsize * 2 - 2] + chz.bounds[xsize * 2 - 1];
    for (int i = 0; i < xsize; ++i) chz.bounds[i * 2] -= first;
    const int cols = last - first;
    tmp.resize(static_cast<size_t>(ysize) * cols * ch);
    vertical(src + static_cast<size_t>(first) * ch, stride, static_cast<size_t>(cols) * ch, cv, ysize, tmp.data());
    horizontal(tmp.data(), static_cast<size_t>(cols) * ch, cols, ch, 0, ysize, chz, xsize, mirror, dst);
  }
}

void resample(const uint8_t* src, int height, int width, int ch, BoxF box, Size size, Image& out) {
  out.height = size.height;
  out.width = size.width;
  out.channels = ch;
  out.pixels.resize(static_cast<size_t>(size.height) * size.width * ch);
  resample_into(src, static_cast<size_t>(width) * ch, height, width, ch, box, size, false, out.pixels.data());
}

}  // namespace spindle::ops::detail
