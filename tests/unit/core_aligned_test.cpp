// core/aligned.h: the scratch containers the kernels load whole vectors from start on a cache line.
// (A plain std::vector starts 16 bytes into one about as often as not, and every 64-byte load from it
// then touches two lines: the q4 decode GEMV lost a quarter of its speed that way.)
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/aligned.h"
#include "core/tensor.h"

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

// From 4 MiB up, buffers and aligned vectors (and Tensor storage: all share alloc_storage) start on a 2 MiB
// boundary, so the huge pages advised for them can back them from their first byte (the int8 DiT's 2.4 GB
// of packed weights faulted in 4 KiB pages took 8-11 s to prepare, 2.4-2.9 s on THP). Zero bytes still
// give a distinct, freeable pointer. (RED: the previous operator new[] with a 64-byte alignment.)
TEST(Aligned, LargeStorageStartsOnAHugePageBoundary) {
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  std::vector<aligned_buffer<int8_t>> keep;
  for (size_t n : {size_t(4) << 20, (size_t(4) << 20) + 1, size_t(9) << 20, (size_t(33) << 20) + 12345}) {
    keep.push_back(make_aligned_buffer<int8_t>(n));
    ASSERT_NE(keep.back(), nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(keep.back().get()) % kHuge, 0u) << "n = " << n;
    keep.back()[0] = 1, keep.back()[n - 1] = 2;
  }
  const Tensor t = Tensor::empty(DType::F32, {3, 1 << 20});  // 12 MiB
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % kHuge, 0u);
  aligned_vector<float> v(size_t(2) << 20, 1.5f);  // 8 MiB (the DiT's activation buffers are these)
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % kHuge, 0u);
  EXPECT_EQ(v.back(), 1.5f);
  void* z = alloc_storage(0);
  ASSERT_NE(z, nullptr);
  EXPECT_TRUE(on_line(z));
  free_storage(z);
}

}  // namespace
}  // namespace mm3
