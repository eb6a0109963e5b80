// kernels_linear_dnnl.cpp — kern::gemm_only_bf16 weights (oneDNN's blocked bf16 matmul, cpu/gemm_dnnl.cpp)
// through kern::linear, against ref::linear on the same bf16 weight:
// * odd sizes (M = 1 .. 130 incl. M <= 4 and M other than the packing M, N and K not multiples of any
//   block, K = 1), with and without bias, strided x / y with guard zones;
// * the fp32 summation bound plus one bf16 spacing, every output bf16-valued, at most 10% of outputs
//   off the exact-then-round twin by a rounding flip (a transposed weight or a lost bias fails all);
// * bitwise equal on 1 and 2 threads for the DiT's shapes scaled down, and run to run;
// * the blocked form replaces the plain tensor (weight() empty), and store F32 is refused.
// Skips (loudly) where oneDNN has no blocked bf16 kernel on this CPU (no AVX512-BF16 / AMX): then
// gemm_only_bf16 returns the plain weight and kernels_linear.cpp covers it.
// gemm_only_f32's oneDNN form (F32*): the same odd sizes and strides against ref::linear in fp32
// (summation bound; with store BF16 plus one bf16 spacing and every output bf16-valued), thread-count
// independence and determinism at the DiT's shapes scaled down, onednn = false giving gemm_nt's panels.
// Skips (loudly) where oneDNN has no fp32 brgemm here (no AVX-512) and no JIT sgemm either. ctest also
// runs the F32Form tests with oneDNN and our dispatch capped at AVX2 (kernels_f32_onednn_avx2), where the
// form is oneDNN's gemm:jit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/ref/ref_kernels.h"
#include "kernels/tuning.h"
#include "kernels_util.h"

namespace mm3 {
namespace {

using test::Guarded;
using test::Rng;

kern::LinearWeight plain_bf16(Rng& rng, int64_t N, int64_t K, bool bias) {
  Tensor w = Tensor::from_f32(rng.vec(static_cast<size_t>(N * K), -1.f, 1.f, true), {N, K}).to(DType::BF16);
  Tensor b;
  if (bias) b = Tensor::from_f32(rng.vec(static_cast<size_t>(N), -1.f, 1.f, true), {N}).to(DType::BF16);
  return kern::LinearWeight(w, b);
}

// oneDNN's bf16 form is what the bf16 tests here check. Where the CPU's VDPBF16PS is slow and unforced,
// gemm_only_bf16 keeps the plain weight for gemm_ex's FMA tile (gemm_dnnl.cpp), so these tests force
// the knob bf16_dot to the instruction's forms for their duration.
struct InstructionDots {
  InstructionDots() { kern::tuning::force(kern::tuning::Knob::Bf16Dot, 1); }
  ~InstructionDots() { kern::tuning::force(kern::tuning::Knob::Bf16Dot, -1); }
};

#define MM3_REQUIRE_PACKED(w)                                                                          \
  if (!(w).gemm_packed())                                                                              \
  GTEST_SKIP() << "oneDNN offers no blocked bf16 matmul on this CPU (needs AVX512-BF16 or AMX); "     \
                  "gemm_only_bf16 kept the plain weight, which kernels_linear.cpp tests"

struct Case {
  int64_t M, K, N;
};

TEST(KernelsLinearDnnl, MatchesRefOddSizes) {
  const InstructionDots dots;
  const Case cases[] = {{1, 37, 29},  {2, 64, 33},   {4, 97, 7},    {5, 37, 29},  {7, 100, 3}, {37, 129, 65},
                        {64, 300, 130}, {130, 64, 96}, {3, 1, 5},    {9, 33, 1},   {600, 48, 40}};
  ThreadPool pool(2);
  uint64_t seed = 1;
  for (const Case& c : cases)
    for (bool with_bias : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "M=" << c.M << " K=" << c.K << " N=" << c.N << " bias=" << with_bias);
      Rng rng(seed++);
      const kern::LinearWeight plain = plain_bf16(rng, c.N, c.K, with_bias);
      const kern::LinearWeight w = kern::gemm_only_bf16(plain);
      MM3_REQUIRE_PACKED(w);
      EXPECT_EQ(w.weight().raw(), nullptr) << "the plain tensor must not be kept";
      EXPECT_EQ(w.out_features(), c.N);
      EXPECT_EQ(w.in_features(), c.K);
      const int64_t ldx = c.K + 3, ldy = c.N + 5;
      const std::vector<float> x = rng.vec(static_cast<size_t>(c.M * ldx), -2.f, 2.f, true);
      Guarded y(c.M, c.N, ldy);
      kern::linear(pool, x.data(), c.M, ldx, w, y.data(), ldy, DType::BF16);
      std::vector<float> ref(static_cast<size_t>(c.M * c.N));
      ref::linear(pool, x.data(), c.M, ldx, plain, ref.data(), c.N, DType::BF16);
      EXPECT_EQ(y.touched_outside(), 0) << "wrote outside y's rows / guards";
      EXPECT_EQ(y.untouched_inside(), 0) << "left outputs unwritten";
      const uint16_t* wb = static_cast<const uint16_t*>(plain.weight().raw());
      const float* bias = plain.bias_f32();
      const int64_t bad = test::count_violations(
          "linear(dnnl)", y.data(), ldy, ref.data(), c.M, c.N, [&](int64_t m, int64_t n, float e) {
            double s = bias ? std::fabs(bias[n]) : 0.0;
            for (int64_t k = 0; k < c.K; ++k)
              s += std::fabs(double(x[m * ldx + k]) * bf16_bits_to_f32(wb[n * c.K + k]));
            return (c.K + 2) * 0.5 * test::kEps32 * s + test::bf16_ulp(e);
          });
      EXPECT_EQ(bad, 0);
      EXPECT_EQ(test::count_non_bf16(y.data(), ldy, c.M, c.N), 0) << "bf16 store left unrounded values";
      EXPECT_LE(test::count_bit_diffs(y.data(), ldy, ref.data(), c.M, c.N), c.M * c.N / 10 + 1);
    }
}

// The DiT's GEMMs at a smaller scale (rows 690 / 1380 tokens, K and N multiples of 64 as in
// 2048 / 8192): the bits must not depend on the thread count, nor change run to run.
TEST(KernelsLinearDnnl, ThreadCountIndependentAndDeterministic) {
  const InstructionDots dots;
  const Case cases[] = {{690, 256, 768}, {690, 1024, 256}, {1380, 256, 256}, {689, 256, 128}, {2, 256, 256}};
  ThreadPool one(1), two(2);
  uint64_t seed = 100;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "M=" << c.M << " K=" << c.K << " N=" << c.N);
    Rng rng(seed++);
    const kern::LinearWeight w = kern::gemm_only_bf16(plain_bf16(rng, c.N, c.K, true));
    MM3_REQUIRE_PACKED(w);
    const std::vector<float> x = rng.vec(static_cast<size_t>(c.M * c.K), -2.f, 2.f, true);
    std::vector<float> a(static_cast<size_t>(c.M * c.N)), b(a.size()), r(a.size());
    kern::linear(one, x.data(), c.M, c.K, w, a.data(), c.N, DType::BF16);
    kern::linear(two, x.data(), c.M, c.K, w, b.data(), c.N, DType::BF16);
    kern::linear(two, x.data(), c.M, c.K, w, r.data(), c.N, DType::BF16);
    EXPECT_EQ(test::count_bit_diffs(a.data(), c.N, b.data(), c.M, c.N), 0) << "1 vs 2 threads";
    EXPECT_EQ(test::count_bit_diffs(b.data(), c.N, r.data(), c.M, c.N), 0) << "run to run";
  }
}

std::vector<uint16_t> to_bits(const std::vector<float>& x) {
  std::vector<uint16_t> b(x.size());
  for (size_t i = 0; i < x.size(); ++i) b[i] = f32_to_bf16_bits(x[i]);
  return b;
}

// linear_bf16_in (x as bf16 bits, the DiT's bf16 activations) writes linear()'s bits, on oneDNN's
// blocked form and on every other weight form (which widen x and call linear); strided x and y.
// With round_y = false a blocked weight may leave y unrounded: rounding it then gives linear()'s bits.
TEST(KernelsLinearDnnl, Bf16InputWritesLinearsBits) {
  const InstructionDots dots;
  const Case cases[] = {{1, 37, 29}, {5, 37, 29}, {37, 129, 65}, {130, 64, 96}, {690, 256, 768}, {9, 33, 1}};
  ThreadPool pool(2);
  uint64_t seed = 300;
  bool saw_packed = false;
  for (const Case& c : cases)
    for (bool with_bias : {false, true}) {
      Rng rng(seed++);
      const kern::LinearWeight plain = plain_bf16(rng, c.N, c.K, with_bias);
      const kern::LinearWeight plain_f32(plain.weight().to(DType::F32),
                                         with_bias ? plain.bias().to(DType::F32) : Tensor());
      const kern::LinearWeight packed = kern::gemm_only_bf16(plain);
      saw_packed = saw_packed || packed.gemm_packed();
      const int64_t ldx = c.K + 5, ldy = c.N + 3;
      const std::vector<float> x = rng.vec(static_cast<size_t>(c.M * ldx), -2.f, 2.f, true);
      const std::vector<uint16_t> xb = to_bits(x);
      for (const kern::LinearWeight* w : {&packed, &plain, &plain_f32})
        for (bool round_y : {true, false}) {
          SCOPED_TRACE(::testing::Message()
                       << "M=" << c.M << " K=" << c.K << " N=" << c.N << " bias=" << with_bias
                       << " packed=" << w->gemm_packed() << " weight="
                       << (w->gemm_packed() ? "blocked" : dtype_name(w->weight().dtype())) << " round_y=" << round_y);
          Guarded want(c.M, c.N, ldy), got(c.M, c.N, ldy);
          kern::linear(pool, x.data(), c.M, ldx, *w, want.data(), ldy, DType::BF16);
          kern::linear_bf16_in(pool, xb.data(), c.M, ldx, *w, got.data(), ldy, round_y);
          EXPECT_EQ(got.touched_outside(), 0);
          EXPECT_EQ(got.untouched_inside(), 0);
          if (!round_y)
            for (int64_t m = 0; m < c.M; ++m)
              round_to_store(got.data() + m * ldy, static_cast<size_t>(c.N), DType::BF16);
          int64_t diffs = 0;
          for (int64_t m = 0; m < c.M; ++m)
            for (int64_t n = 0; n < c.N; ++n) diffs += f32_bits(got.at(m, n)) != f32_bits(want.at(m, n));
          EXPECT_EQ(diffs, 0);
        }
    }
  if (!saw_packed)
    GTEST_SKIP() << "oneDNN offers no blocked bf16 matmul on this CPU (needs AVX512-BF16 or AMX): only the "
                    "plain-weight forms of linear_bf16_in were checked";
}

kern::LinearWeight plain_f32(Rng& rng, int64_t N, int64_t K, bool bias) {
  Tensor w = Tensor::from_f32(rng.vec(static_cast<size_t>(N * K), -1.f, 1.f), {N, K});
  Tensor b;
  if (bias) b = Tensor::from_f32(rng.vec(static_cast<size_t>(N), -1.f, 1.f), {N});
  return kern::LinearWeight(w, b);
}

// MM3_TEST_EXPECT_F32_DNNL (set by ctest's capped run): the form must be there, a skip would hide its loss.
#define MM3_REQUIRE_F32_DNNL(w)                                                                                \
  if ((w).gemm_kind() != kern::GemmKind::F32Dnnl) {                                                            \
    if (std::getenv("MM3_TEST_EXPECT_F32_DNNL")) FAIL() << "gemm_only_f32 gave no oneDNN form under this cap"; \
    GTEST_SKIP() << "oneDNN offers no fp32 brgemm or JIT sgemm on this CPU; gemm_only_f32 took "               \
                    "gemm_nt's panels, which kernels_linear.cpp tests";                                        \
  }

TEST(KernelsLinearDnnl, F32FormMatchesRefOddSizes) {
  const Case cases[] = {{1, 37, 29},    {2, 64, 33},   {4, 97, 7}, {5, 37, 29}, {7, 100, 3},  {37, 129, 65},
                        {64, 300, 130}, {130, 64, 96}, {3, 1, 5},  {9, 33, 1},  {600, 48, 40}};
  ThreadPool pool(2);
  uint64_t seed = 500;
  for (const Case& c : cases)
    for (bool with_bias : {false, true}) {
      Rng rng(seed++);
      const kern::LinearWeight plain = plain_f32(rng, c.N, c.K, with_bias);
      const kern::LinearWeight w = kern::gemm_only_f32(plain, pool);
      MM3_REQUIRE_F32_DNNL(w);
      EXPECT_TRUE(w.f32_packed());
      EXPECT_FALSE(w.gemm_packed());
      EXPECT_EQ(w.weight().raw(), nullptr) << "the plain tensor must not be kept";
      EXPECT_EQ(w.out_features(), c.N);
      EXPECT_EQ(w.in_features(), c.K);
      const int64_t ldx = c.K + 3, ldy = c.N + 5;
      std::vector<float> x = rng.vec(static_cast<size_t>(c.M * ldx), -2.f, 2.f);
      for (auto& v : x) v = std::ldexp(v, static_cast<int>(rng.int_in(-6, 6)));
      const float* wf = static_cast<const float*>(plain.weight().raw());
      const float* bias = plain.bias_f32();
      for (DType store : {DType::F32, DType::BF16}) {
        SCOPED_TRACE(::testing::Message() << "M=" << c.M << " K=" << c.K << " N=" << c.N << " bias=" << with_bias
                                          << " store=" << test::store_name(store));
        Guarded y(c.M, c.N, ldy);
        kern::linear(pool, x.data(), c.M, ldx, w, y.data(), ldy, store);
        std::vector<float> ref(static_cast<size_t>(c.M * c.N));
        ref::linear(pool, x.data(), c.M, ldx, plain, ref.data(), c.N, store);
        EXPECT_EQ(y.touched_outside(), 0) << "wrote outside y's rows / guards";
        EXPECT_EQ(y.untouched_inside(), 0) << "left outputs unwritten";
        const int64_t bad = test::count_violations(
            "linear(dnnl f32)", y.data(), ldy, ref.data(), c.M, c.N, [&](int64_t m, int64_t n, float e) {
              double s = bias ? std::fabs(bias[n]) : 0.0;
              for (int64_t k = 0; k < c.K; ++k) s += std::fabs(double(x[m * ldx + k]) * wf[n * c.K + k]);
              return (c.K + 2) * test::kEps32 * s + (store == DType::BF16 ? test::bf16_ulp(e) : 0.0);
            });
        EXPECT_EQ(bad, 0);
        if (store == DType::BF16) {
          EXPECT_EQ(test::count_non_bf16(y.data(), ldy, c.M, c.N), 0) << "bf16 store left unrounded values";
        }
      }
    }
}

// The fp32 DiT's GEMMs at a smaller scale: the bits must not depend on the thread count, nor change
// run to run; onednn = false keeps gemm_nt's panels.
TEST(KernelsLinearDnnl, F32FormThreadCountIndependentAndDeterministic) {
  const Case cases[] = {{690, 256, 768}, {690, 1024, 256}, {1380, 256, 256}, {689, 256, 128}, {2, 256, 256}};
  ThreadPool one(1), two(2);
  uint64_t seed = 600;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "M=" << c.M << " K=" << c.K << " N=" << c.N);
    Rng rng(seed++);
    const kern::LinearWeight plain = plain_f32(rng, c.N, c.K, true);
    EXPECT_EQ(kern::gemm_only_f32(plain, two, /*onednn=*/false).gemm_kind(), kern::GemmKind::F32Panels);
    const kern::LinearWeight w = kern::gemm_only_f32(plain, two);
    MM3_REQUIRE_F32_DNNL(w);
    const std::vector<float> x = rng.vec(static_cast<size_t>(c.M * c.K), -2.f, 2.f);
    std::vector<float> a(static_cast<size_t>(c.M * c.N)), b(a.size()), r(a.size());
    kern::linear(one, x.data(), c.M, c.K, w, a.data(), c.N, DType::F32);
    kern::linear(two, x.data(), c.M, c.K, w, b.data(), c.N, DType::F32);
    kern::linear(two, x.data(), c.M, c.K, w, r.data(), c.N, DType::F32);
    EXPECT_EQ(test::count_bit_diffs(a.data(), c.N, b.data(), c.M, c.N), 0) << "1 vs 2 threads";
    EXPECT_EQ(test::count_bit_diffs(b.data(), c.N, r.data(), c.M, c.N), 0) << "run to run";
  }
}

TEST(KernelsLinearDnnl, RefusesF32Store) {
  const InstructionDots dots;
  Rng rng(7);
  const kern::LinearWeight w = kern::gemm_only_bf16(plain_bf16(rng, 8, 16, false));
  MM3_REQUIRE_PACKED(w);
  ThreadPool pool(1);
  std::vector<float> x(16, 1.f), y(8);
  EXPECT_THROW(kern::linear(pool, x.data(), 1, 16, w, y.data(), 8, DType::F32), InternalError);
}

}  // namespace
}  // namespace mm3
