// copy_into_ring must equal memcpy for every size and alignment.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include <spindle/ring_copy.hpp>

namespace {

// Proves: streaming and small copies write exactly the source bytes, for
// sizes around the streaming threshold and every destination misalignment,
// and touch nothing outside [dst, dst + n).
TEST(RingCopy, EqualsMemcpyForAllSizesAndAlignments) {
  std::vector<unsigned char> src(20000);
  std::iota(src.begin(), src.end(), 0);
  for (std::size_t n : {0u, 1u, 63u, 64u, 4095u, 4096u, 4097u, 12288u, 12345u, 19000u}) {
    for (std::size_t shift = 0; shift < 17; ++shift) {
      std::vector<unsigned char> dst(n + 64, 0xAB);
      spindle::copy_into_ring(dst.data() + shift, src.data() + 3, n);
      spindle::ring_copy_fence();
      ASSERT_EQ(std::memcmp(dst.data() + shift, src.data() + 3, n), 0) << "n=" << n << " shift=" << shift;
      for (std::size_t i = 0; i < shift; ++i) ASSERT_EQ(dst[i], 0xAB);
      for (std::size_t i = shift + n; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xAB);
    }
  }
}

}  // namespace
