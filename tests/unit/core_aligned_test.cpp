// core/aligned.h: the scratch containers the kernels load whole vectors from start on a cache line.
// (A plain std::vector starts 16 bytes into one about as often as not, and every 64-byte load from it
// then touches two lines: the q4 decode GEMV lost a quarter of its speed that way.)
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/aligned.h"

namespace mm3 {
namespace {

bool on_line(const void* p) { return reinterpret_cast<uintptr_t>(p) % kCacheLine == 0; }

TEST(Aligned, VectorStartsOnACacheLineAtEverySize) {
  std::vector<aligned_vector<int8_t>> keep;  // alive together, so the heap hands out fresh addresses
  for (size_t n : {1, 3, 16, 17, 63, 64, 65, 1000, 8192, 100003}) {
    keep.emplace_back(n, int8_t(1));
    EXPECT_TRUE(on_line(keep.back().data())) << "n = " << n;
    keep.back().resize(3 * n + 5);  // a reallocation keeps the alignment
    EXPECT_TRUE(on_line(keep.back().data())) << "n = " << n << " resized";
    EXPECT_EQ(keep.back()[0], 1);
  }
  aligned_vector<float> f(7, 2.5f);
  EXPECT_TRUE(on_line(f.data()));
  EXPECT_EQ(f[6], 2.5f);
}

TEST(Aligned, BufferStartsOnACacheLine) {
  std::vector<aligned_buffer<float>> keep;
  for (size_t n : {1, 5, 16, 33, 4097}) {
    keep.push_back(make_aligned_buffer<float>(n));
    ASSERT_NE(keep.back(), nullptr);
    EXPECT_TRUE(on_line(keep.back().get())) << "n = " << n;
    keep.back()[n - 1] = 1.f;  // writable to its end (ASan checks the extent)
  }
}

}  // namespace
}  // namespace mm3
