#include <spindle/ring_copy.hpp>

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SPINDLE_STREAMING_STORES 1
#endif

namespace spindle {
namespace {
constexpr std::size_t kStreamThreshold = 4096;  // below this, memcpy is as fast
}  // namespace

void copy_into_ring(void* dst, const void* src, std::size_t n) noexcept {
#ifdef SPINDLE_STREAMING_STORES
  if (n >= kStreamThreshold) {
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
    const std::size_t head = (16 - (reinterpret_cast<std::uintptr_t>(d) & 15)) & 15;
    std::memcpy(d, s, head);  // align the destination for _mm_stream_si128
    d += head;
    s += head;
    n -= head;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
    }
    std::memcpy(d, s, n);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

void ring_copy_fence() noexcept {
#ifdef SPINDLE_STREAMING_STORES
  _mm_sfence();
#endif
}

}  // namespace spindle
