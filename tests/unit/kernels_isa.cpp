// MM3_ISA, the dispatch cap: ctest runs test_kernels_baseline (the kernel tests built for plain x86-64)
// under MM3_ISA=avx2 and MM3_ISA=scalar, so an AVX-512 machine also tests the AVX2 and scalar kernels.
// This test makes those runs mean something: if the cap were ignored they would silently test the
// runtime-dispatched native paths twice more.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "kernels/cpu/simd.h"

namespace mm3::kern::detail {
namespace {

TEST(KernelsIsa, CapIsHonoured) {
  const char* e = std::getenv("MM3_ISA");
  const std::string cap = e ? e : "";
  std::printf("[          ] MM3_ISA=%s -> dispatch level %s\n", cap.empty() ? "(unset)" : cap.c_str(), isa_name());
  if (cap == "scalar") {
    EXPECT_FALSE(cpu_has_avx2_fma());
    EXPECT_STREQ(isa_name(), "scalar");
  }
  if (cap == "scalar" || cap == "avx2") {
    EXPECT_FALSE(cpu_has_avx512());
    EXPECT_FALSE(cpu_has_avx512bf16());
    EXPECT_FALSE(cpu_has_amx_bf16());
  }
  if (cap == "avx512") {
    EXPECT_FALSE(cpu_has_avx512bf16());
    EXPECT_FALSE(cpu_has_amx_bf16());
  }
  // The levels nest: a higher one never holds without the lower ones.
  EXPECT_TRUE(!cpu_has_amx_bf16() || cpu_has_avx512bf16());
  EXPECT_TRUE(!cpu_has_avx512bf16() || cpu_has_avx512());
  EXPECT_TRUE(!cpu_has_avx512() || cpu_has_avx2_fma());
}

}  // namespace
}  // namespace mm3::kern::detail
