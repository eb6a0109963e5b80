// kernels_conv_snake.cpp — the vector Snake row (cpu/conv_snake.cpp) behind kern::snake and the
// convolutions' fused Snake: its sine against double-precision sin over the vocoder's range and past
// it (|alpha x| > 8192 takes std::sin), next to multiples of pi/2 (where the argument reduction must
// be exact), on inf and NaN, and on row lengths that end in partial vectors; a value does not depend
// on where it sits in the row.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/conv_detail.h"
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

}  // namespace
}  // namespace mm3
