// kernels_conv_bf16.cpp — the two bf16 forms of a packed convolution weight, through kern::conv_packed
// with store BF16, against the fp32 direct kernel on the same bf16-rounded weight (its scalar-exact
// twin, kernels_conv_direct.cpp): "gemm" = kern::conv_gemm_bf16 (a Conv1d as oneDNN bf16 GEMMs over
// im2col column chunks, a ConvTranspose1d as a GEMM + col2im) and "pairs" = kern::conv_dpbf16 (the
// direct kernel on bf16 channel pairs with vdpbf16ps; cpu/conv_direct.cpp). For each:
// * odd channel counts and lengths, taps 1 / 3 / 7, dilation 1 / 3 / 9 with its padding, lengths longer
//   than one column chunk, with and without bias, Snake and the residual (in place, as the vocoder);
// * every output bf16-valued and within one bf16 spacing (plus the fp32 summation bound) of the direct
//   kernel, and at most 10% of outputs differing at all (a shifted im2col column, a lost bias or
//   residual, a transposed weight fail nearly every output);
// * ConvTranspose1d (stride 2..8, kernel 2·stride, the vocoder's padding) the same way;
// * store F32 ignores the form (the direct kernel's bits exactly).
// Skips (loudly) where the form is not available here (no AVX512-BF16; for "gemm" also MM3_ONEDNN=0).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "kernels_util.h"

namespace mm3 {
namespace {

using test::Rng;

// The form under test, or the unchanged weight when this CPU has none (then *why says so).
kern::ConvWeight bf16_form(const kern::ConvWeight& direct, const std::string& form, std::string* why) {
  if (form == "gemm") {
    kern::ConvWeight g = kern::conv_gemm_bf16(direct);
    if (!g.gemm) *why = "oneDNN offers no bf16 matmul here (needs AVX512-BF16; or MM3_ONEDNN=0): conv_gemm_bf16 "
                        "kept the direct weight, which kernels_conv_direct.cpp tests";
    return g;
  }
  kern::ConvWeight p = kern::conv_dpbf16(direct);
  if (!p.pairs) *why = "no AVX512-BF16 here: conv_dpbf16 kept the direct weight, which kernels_conv_direct.cpp tests";
  return p;
}

class KernelsConvBf16 : public ::testing::TestWithParam<std::string> {};

struct Case {
  int64_t Cin, Cout, L;
  int K, dil;
  bool bias, snake, residual;
};

TEST_P(KernelsConvBf16, MatchesDirectKernel) {
  const Case cases[] = {
      {37, 29, 500, 7, 3, true, true, false},    // dilated, Snake, bias
      {64, 48, 1000, 1, 1, true, true, true},    // 1-tap (one GEMM over the length), residual in place
      {20, 33, 130, 7, 9, false, false, false},  // padding wider than half the input at the edges
      {16, 70, 70000, 7, 1, true, true, false},  // more columns than one chunk (2 MiB / (16 * 7))
      {11, 5, 9, 3, 1, true, false, true},       // tiny
      {301, 13, 200, 7, 1, true, true, true},    // deeper than one slab (pairs: 256 channels), odd last slab
      {1601, 7, 300, 1, 1, false, true, false},  // 1-tap deeper than one slab (pairs: 1536)
  };
  ThreadPool pool(2);
  uint64_t seed = 11;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "Cin=" << c.Cin << " Cout=" << c.Cout << " L=" << c.L << " K=" << c.K
                                      << " dil=" << c.dil << " bias=" << c.bias << " snake=" << c.snake
                                      << " residual=" << c.residual);
    Rng rng(seed++);
    const int pad = (c.K / 2) * c.dil;
    const std::vector<float> w = rng.vec(static_cast<size_t>(c.Cout * c.Cin * c.K), -0.5f, 0.5f, true);
    const std::vector<float> b = rng.vec(static_cast<size_t>(c.Cout), -1.f, 1.f, true);
    const std::vector<float> x = rng.vec(static_cast<size_t>(c.Cin * c.L), -2.f, 2.f, true);
    const std::vector<float> alpha = rng.vec(static_cast<size_t>(c.Cin), 0.2f, 2.f, true);
    const kern::ConvWeight direct =
        kern::ConvWeight::conv1d(w.data(), c.bias ? b.data() : nullptr, c.Cout, c.Cin, c.K, pad, c.dil)
            .rounded(DType::BF16);
    std::string why;
    const kern::ConvWeight fast = bf16_form(direct, GetParam(), &why);
    if (!why.empty()) GTEST_SKIP() << why;
    const int64_t Lout = direct.out_len(c.L);
    ASSERT_EQ(Lout, c.L);
    // The residual is the output buffer itself (y = y + conv), as the vocoder's residual units run it.
    const std::vector<float> res0 = rng.vec(static_cast<size_t>(c.Cout * Lout), -1.f, 1.f, true);
    std::vector<float> want = res0, got = res0;
    kern::ConvFusion fw, fg;
    if (c.snake) fw.snake_alpha = fg.snake_alpha = alpha.data();
    if (c.residual) fw.residual = want.data(), fg.residual = got.data();
    kern::conv_packed(pool, direct, x.data(), c.L, want.data(), DType::BF16, fw);
    kern::conv_packed(pool, fast, x.data(), c.L, got.data(), DType::BF16, fg);
    int64_t off = 0, diff = 0;
    for (int64_t co = 0; co < c.Cout; ++co)
      for (int64_t t = 0; t < Lout; ++t) {
        const size_t i = static_cast<size_t>(co * Lout + t);
        // fp32 sums of Cin·K exact products in another order: ~Cin·K·eps·sum|terms| (bounded by the
        // value scale here), then the output's own rounding: one bf16 spacing of the larger value.
        const float tol = test::bf16_ulp(std::max(std::fabs(want[i]), std::fabs(got[i]))) +
                          float(c.Cin * c.K) * 1.2e-7f * 4.f;
        if (got[i] != want[i]) ++diff;
        if (std::fabs(got[i] - want[i]) > tol || !test::is_bf16_value(got[i])) ++off;
      }
    EXPECT_EQ(off, 0);
    EXPECT_LE(diff, c.Cout * Lout / 10) << diff << " of " << c.Cout * Lout << " outputs differ";
  }
}

struct TCase {
  int64_t Cin, Cout, L;
  int stride;
  bool bias, snake;
};

// ConvTranspose1d, kernel 2·stride, padding ceil(stride / 2) (the vocoder's upsamplers), lengths
// spanning several output chunks for the larger ones.
TEST_P(KernelsConvBf16, TransposedMatchesDirectKernel) {
  const TCase cases[] = {
      {24, 12, 37, 8, true, true},     // block-0-like, odd length
      {40, 19, 3000, 4, true, true},   // several chunks
      {9, 5, 1, 2, false, false},      // one input column
      {16, 8, 20000, 2, true, false},  // many chunks, no Snake
      {301, 9, 40, 8, true, true},     // deeper than one slab, odd channel count
  };
  ThreadPool pool(2);
  uint64_t seed = 41;
  for (const TCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "Cin=" << c.Cin << " Cout=" << c.Cout << " L=" << c.L
                                      << " stride=" << c.stride << " bias=" << c.bias << " snake=" << c.snake);
    Rng rng(seed++);
    const int K = 2 * c.stride, pad = (c.stride + 1) / 2;
    const std::vector<float> w = rng.vec(static_cast<size_t>(c.Cin * c.Cout * K), -0.5f, 0.5f, true);
    const std::vector<float> b = rng.vec(static_cast<size_t>(c.Cout), -1.f, 1.f, true);
    const std::vector<float> x = rng.vec(static_cast<size_t>(c.Cin * c.L), -2.f, 2.f, true);
    const std::vector<float> alpha = rng.vec(static_cast<size_t>(c.Cin), 0.2f, 2.f, true);
    const kern::ConvWeight direct = kern::ConvWeight::conv_transpose1d(w.data(), c.bias ? b.data() : nullptr, c.Cin,
                                                                       c.Cout, K, c.stride, pad, 0)
                                        .rounded(DType::BF16);
    std::string why;
    const kern::ConvWeight fast = bf16_form(direct, GetParam(), &why);
    if (!why.empty()) GTEST_SKIP() << why;
    const int64_t Lout = direct.out_len(c.L);
    ASSERT_EQ(Lout, c.stride * c.L);
    std::vector<float> want(static_cast<size_t>(c.Cout * Lout), -7.f), got = want;
    kern::ConvFusion f;
    if (c.snake) f.snake_alpha = alpha.data();
    kern::conv_packed(pool, direct, x.data(), c.L, want.data(), DType::BF16, f);
    kern::conv_packed(pool, fast, x.data(), c.L, got.data(), DType::BF16, f);
    int64_t off = 0, diff = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const float tol = test::bf16_ulp(std::max(std::fabs(want[i]), std::fabs(got[i])));
      if (got[i] != want[i]) ++diff;
      if (std::fabs(got[i] - want[i]) > tol || !test::is_bf16_value(got[i])) ++off;
    }
    EXPECT_EQ(off, 0);
    EXPECT_LE(diff, int64_t(want.size()) / 10) << diff << " of " << want.size() << " outputs differ";
  }
}

TEST_P(KernelsConvBf16, StoreF32IgnoresTheForm) {
  ThreadPool pool(2);
  Rng rng(5);
  const int64_t Cin = 13, Cout = 9, L = 77;
  const std::vector<float> w = rng.vec(static_cast<size_t>(Cout * Cin * 7), -0.5f, 0.5f, true);
  const std::vector<float> x = rng.vec(static_cast<size_t>(Cin * L), -2.f, 2.f, true);
  const kern::ConvWeight direct = kern::ConvWeight::conv1d(w.data(), nullptr, Cout, Cin, 7, 3, 1);
  std::string why;
  const kern::ConvWeight fast = bf16_form(direct, GetParam(), &why);
  if (!why.empty()) GTEST_SKIP() << why;
  std::vector<float> a(static_cast<size_t>(Cout * L)), b(a.size());
  kern::conv_packed(pool, direct, x.data(), L, a.data(), DType::F32);
  kern::conv_packed(pool, fast, x.data(), L, b.data(), DType::F32);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(Forms, KernelsConvBf16, ::testing::Values("gemm", "pairs"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace mm3
