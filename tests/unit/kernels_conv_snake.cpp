// kernels_conv_snake.cpp — the vector Snake row (cpu/conv_snake.cpp) behind kern::snake and the
// convolutions' fused Snake: its sine against double-precision sin over the vocoder's range and past
// it (|alpha x| > 8192 takes std::sin), next to multiples of pi/2 (where the argument reduction must
// be exact), on inf and NaN, and on row lengths that end in partial vectors; a value does not depend
// on where it sits in the row.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <vector>

#include "kernels/cpu/conv_detail.h"
#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"
#include "kernels/ref/ref_kernels.h"
#include "kernels_util.h"

namespace mm3 {
namespace {

// The whole Snake value against the double twin, within a few ulps of |x| + 1/alpha (the bound of
// kernels_elementwise.cpp).
void expect_snake_close(const std::vector<float>& x, float alpha, double ulps) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> got(x.size()), want(x.size());
  kern::snake(x.data(), &alpha, got.data(), 1, n, DType::F32);
  ref::snake(x.data(), &alpha, want.data(), 1, n, DType::F32);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(want[i])) {
      bad += !std::isnan(got[i]);
      continue;
    }
    const double tol = ulps * test::kEps32 * (std::fabs(x[i]) + 1.0 / alpha);
    if (!(std::fabs(double(got[i]) - want[i]) <= tol)) {
      if (bad < 5)
        ADD_FAILURE() << "snake(" << x[i] << ", alpha " << alpha << ") = " << got[i] << ", want " << want[i];
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(KernelsConvSnake, SineAccurateOverTheVectorRange) {
  test::Rng rng(61);
  for (float alpha : {1.0f, 0.37f, 3.1f}) {
    std::vector<float> x = rng.vec(20011, -8192.f / alpha, 8192.f / alpha);
    expect_snake_close(x, alpha, 4);
    std::vector<float> small = rng.vec(5003, -4, 4);
    expect_snake_close(small, alpha, 4);
  }
}

// The sine alone (detail::sin_row), where a Snake value cannot show it (x + sin^2 rounds the periodic
// term away when |x| is large): every float within 4 ulps of k·pi/2 for |x| <= 8192, where the reduced
// argument is tiny and only an exact reduction keeps it accurate, and random x, within 2 ulps of the
// true sine's binade (measured worst 1.52; a reduction that drops its third term of pi/2 is ~700 off).
TEST(KernelsConvSnake, SineWithinTwoUlpsNearMultiplesOfHalfPi) {
  std::vector<float> x;
  for (int k = -5216; k <= 5216; ++k) {
    float v = static_cast<float>(k * (M_PI / 2));
    for (int s = 0; s < 4; ++s) v = std::nextafter(v, -1e9f);
    for (int s = 0; s < 9; ++s, v = std::nextafter(v, 1e9f))
      if (std::fabs(v) <= 8192.f) x.push_back(v);
  }
  test::Rng rng(63);
  for (float v : rng.vec(100003, -8192, 8192)) x.push_back(v);
  std::vector<float> got(x.size());
  kern::detail::sin_row(x.data(), got.data(), int64_t(x.size()));
  int64_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double s = std::sin(double(x[i]));
    const double ulp = s == 0 ? std::ldexp(1.0, -149) : std::ldexp(1.0, std::ilogb(std::fabs(s)) - 23);
    if (!(std::fabs(double(got[i]) - s) <= 2 * ulp)) {
      if (bad < 5) ADD_FAILURE() << "sin(" << x[i] << ") = " << got[i] << ", want " << s;
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0);
}

// The fp32 Snake's sin² (detail::sin2_row: reduced as the sine is, then a polynomial for sin² r and
// 1 − sin² r in the odd quadrants) over the same points: every float within 4 ulps of k·pi/2 for
// |x| <= 8192 (sin² tiny or next to 1) and random x, within 4 ulps of the true square's binade
// (measured worst 3.32; the vector sine squared, torch's order of ops, 3.23: the NOTE line prints both).
// Dropping the polynomial's z^5 term fails it.
TEST(KernelsConvSnake, SineSquaredWithinFourUlps) {
  std::vector<float> x;
  for (int k = -5216; k <= 5216; ++k) {
    float v = static_cast<float>(k * (M_PI / 2));
    for (int s = 0; s < 4; ++s) v = std::nextafter(v, -1e9f);
    for (int s = 0; s < 9; ++s, v = std::nextafter(v, 1e9f))
      if (std::fabs(v) <= 8192.f) x.push_back(v);
  }
  test::Rng rng(64);
  for (float v : rng.vec(100003, -8192, 8192)) x.push_back(v);
  for (float v : rng.vec(10007, -4, 4)) x.push_back(v);
  std::vector<float> got(x.size());
  kern::detail::sin2_row(x.data(), got.data(), int64_t(x.size()));
  int64_t bad = 0;
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double sn = std::sin(double(x[i])), s = sn * sn;
    // fp32's spacing at s (below its normal range, the denormals' 2^-149)
    const double ulp = s == 0 ? std::ldexp(1.0, -149) : std::ldexp(1.0, std::max(std::ilogb(s) - 23, -149));
    worst = std::max(worst, std::fabs(double(got[i]) - s) / ulp);
    if (!(std::fabs(double(got[i]) - s) <= 4 * ulp)) {
      if (bad < 5) ADD_FAILURE() << "sin^2(" << x[i] << ") = " << got[i] << ", want " << s;
      ++bad;
    }
  }
  std::vector<float> sn(x.size());  // torch's order: the sine, then its square
  kern::detail::sin_row(x.data(), sn.data(), int64_t(x.size()));
  double worst_sq = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double t = std::sin(double(x[i])), s = t * t;
    const double ulp = s == 0 ? std::ldexp(1.0, -149) : std::ldexp(1.0, std::max(std::ilogb(s) - 23, -149));
    worst_sq = std::max(worst_sq, std::fabs(double(sn[i] * sn[i]) - s) / ulp);
  }
  std::cout << "[ NOTE     ] sin^2 worst error " << worst << " ulps over " << x.size()
            << " values (the sine squared: " << worst_sq << ")\n";
  EXPECT_EQ(bad, 0);
}

TEST(KernelsConvSnake, LargeInfAndNanTakeTheExactSine) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x = {1e4f, -3e5f, 8193.f, 1e30f, 2.5f, inf, -inf, nan, -1.2e7f, 0.f, -0.f, 1e-30f, 7.f};
  const float alpha = 1.0f;
  std::vector<float> got(x.size());
  kern::snake(x.data(), &alpha, got.data(), 1, int64_t(x.size()), DType::F32);
  for (size_t i = 0; i < x.size(); ++i) {
    const float s = std::sin(x[i]);
    const float want = x[i] + 1.0f / (1.0f + 1e-9f) * (s * s);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got[i])) << i;
    } else if (std::fabs(x[i]) > 8192.f || x[i] == 0.f || std::fabs(x[i]) < 1e-20f) {
      EXPECT_EQ(f32_bits(got[i]), f32_bits(want)) << "x = " << x[i];
    } else {
      EXPECT_NEAR(got[i], want, 4 * test::kEps32 * (std::fabs(x[i]) + 1)) << "x = " << x[i];
    }
  }
}

// A value's bits do not depend on its position or on the row length (full vectors vs the masked tail),
// so a convolution's fused Snake (rows cut at chunk edges) equals kern::snake on the whole row.
TEST(KernelsConvSnake, ValueIndependentOfPositionAndLength) {
  test::Rng rng(62);
  const std::vector<float> x = rng.vec(1000, -50, 50);
  const float alpha = 0.8f;
  for (DType store : {DType::F32, DType::BF16}) {
    std::vector<float> whole(x.size());
    kern::snake(x.data(), &alpha, whole.data(), 1, int64_t(x.size()), store);
    for (int64_t off : {0, 1, 5, 15, 16, 17, 333})
      for (int64_t len : {1, 7, 15, 16, 17, 31, 100}) {
        std::vector<float> part(static_cast<size_t>(len));
        kern::snake(x.data() + off, &alpha, part.data(), 1, len, store);
        EXPECT_EQ(test::count_bit_diffs(part.data(), len, whole.data() + off, 1, len), 0)
            << "off " << off << " len " << len << " store " << test::store_name(store);
      }
  }
}

// The fp32 Snake gives the same bits on its AVX-512 and AVX2 paths (the same operations, 16 or 8 lanes
// at a time): a hash of its values on fixed inputs (every in-row position and tail length up to 40,
// arguments over the vector range), pinned from the AVX-512 path. ctest runs this binary's baseline
// build under MM3_ISA=avx2 too (kernels_baseline_isa_avx2). Without AVX2 (std::sin, other bits): skipped.
TEST(KernelsConvSnake, F32BitsEqualOnAvx512AndAvx2) {
  if (!kern::detail::cpu_has_avx2_fma()) GTEST_SKIP() << "the scalar path computes std::sin: other bits by design";
  test::Rng rng(65);
  std::vector<float> x(4000);  // multiples of 1/256 from integers: the same inputs whatever the build's FP flags
  for (float& v : x) v = static_cast<float>(rng.int_in(-3000 * 256, 3000 * 256)) / 256.f;
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the output bits
  for (float alpha : {0.37f, 1.0f, 2.9f})
    for (int64_t len = 1; len <= 40; ++len) {
      std::vector<float> y(static_cast<size_t>(len));
      kern::snake(x.data() + 97 * len, &alpha, y.data(), 1, len, DType::F32);
      for (float v : y) h = (h ^ f32_bits(v)) * 1099511628211ull;
    }
  std::vector<float> y(x.size());
  const float alpha = 0.81f;
  kern::snake(x.data(), &alpha, y.data(), 1, int64_t(x.size()), DType::F32);
  for (float v : y) h = (h ^ f32_bits(v)) * 1099511628211ull;
  EXPECT_EQ(h, 11551896141005283358ull) << "the fp32 Snake's bits changed (or differ between the ISA paths)";
}

}  // namespace
}  // namespace mm3
