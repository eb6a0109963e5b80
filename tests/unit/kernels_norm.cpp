// kernels_norm.cpp — kern::embedding, rms_norm, layer_norm against their ref twins (ref/ref_kernels.h):
// odd dims, strided rows, guard zones, both store dtypes, tolerances scaled to the data.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/ref/ref_kernels.h"
#include "kernels_util.h"

namespace mm3 {
namespace {

using test::Guarded;
using test::Rng;

TEST(KernelsEmbedding, CopiesRowsExactly) {
  Rng rng(3);
  const int64_t V = 50, H = 37, n = 9, ldo = H + 3;
  std::vector<float> t = rng.vec(static_cast<size_t>(V * H), -3, 3, true);
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor table = Tensor::from_f32(t, {V, H});
    if (dt == DType::BF16) table = table.to(DType::BF16);
    std::vector<int64_t> ids = {0, V - 1, 17, 17, 3, 49, 1, 25, 0};
    Guarded out(n, H, ldo);
    kern::embedding(table, ids.data(), n, out.data(), ldo);
    EXPECT_EQ(out.touched_outside(), 0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < H; ++j) ASSERT_EQ(out.at(i, j), t[ids[i] * H + j]) << dtype_name(dt) << " " << i;
  }
}

TEST(KernelsEmbedding, RejectsOutOfRangeIds) {
  Tensor table = Tensor::zeros(DType::F32, {4, 3});
  std::vector<float> out(3);
  for (int64_t bad : {int64_t(-1), int64_t(4)}) EXPECT_THROW(kern::embedding(table, &bad, 1, out.data(), 3), InvalidInput);
}

struct NormCase {
  int64_t rows, dim;
  float lo, hi;  // input range
};

// Includes rows small enough that eps dominates var, and large-magnitude rows.
const NormCase kNorm[] = {{3, 37, -2, 2}, {1, 1, -1, 1}, {4, 128, -0.5, 3}, {2, 4096, -1, 1},
                          {3, 64, -1e-3f, 1e-3f}, {2, 33, -300, 300}};

TEST(KernelsRmsNorm, MatchesRef) {
  Rng rng(11);
  for (const auto& c : kNorm)
    for (DType store : {DType::F32, DType::BF16})
      for (bool with_w : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "rows=" << c.rows << " dim=" << c.dim << " range=" << c.hi
                                          << " store=" << test::store_name(store) << " weight=" << with_w);
        const bool bf = store == DType::BF16;
        const int64_t ldx = c.dim + 2, ldy = c.dim + 3;
        const float eps = 1e-6f;
        std::vector<float> x = rng.vec(static_cast<size_t>(c.rows * ldx), c.lo, c.hi, bf);
        std::vector<float> w = rng.vec(static_cast<size_t>(c.dim), -2, 2, bf);
        const float* wp = with_w ? w.data() : nullptr;
        Guarded y(c.rows, c.dim, ldy);
        kern::rms_norm(x.data(), c.rows, c.dim, ldx, wp, eps, y.data(), ldy, store);
        std::vector<float> ref(static_cast<size_t>(c.rows * c.dim));
        ref::rms_norm(x.data(), c.rows, c.dim, ldx, wp, eps, ref.data(), c.dim, store);
        EXPECT_EQ(y.touched_outside(), 0);
        EXPECT_EQ(y.untouched_inside(), 0);
        EXPECT_EQ(test::count_violations("rms_norm", y.data(), ldy, ref.data(), c.rows, c.dim,
                                         [&](int64_t, int64_t i, float e) {
                                           // fp32: var and rsqrt carry a few ulps; bf16: a flip of
                                           // xn (scaled by |w|) and of the product.
                                           const double wi = with_w ? std::fabs(w[i]) : 1.0;
                                           return bf ? 2.0 * test::bf16_ulp(e) + wi * test::bf16_ulp(e / wi)
                                                     : 6.0 * test::kEps32 * std::fabs(e);
                                         }),
                  0);
        if (bf) {
          EXPECT_EQ(test::count_non_bf16(y.data(), ldy, c.rows, c.dim), 0);
          EXPECT_LE(test::count_bit_diffs(y.data(), ldy, ref.data(), c.rows, c.dim), c.rows * c.dim / 50 + 1);
        }
      }
}

TEST(KernelsLayerNorm, MatchesRef) {
  Rng rng(12);
  for (const auto& c : kNorm)
    for (DType store : {DType::F32, DType::BF16})
      for (int affine = 0; affine < 3; ++affine) {  // 0: w and b, 1: w only, 2: neither
        SCOPED_TRACE(::testing::Message() << "rows=" << c.rows << " dim=" << c.dim << " range=" << c.hi
                                          << " store=" << test::store_name(store) << " affine=" << affine);
        const bool bf = store == DType::BF16;
        const int64_t ldx = c.dim + 1, ldy = c.dim + 4;
        const float eps = 1e-5f;
        std::vector<float> x = rng.vec(static_cast<size_t>(c.rows * ldx), c.lo, c.hi, bf);
        // An offset row mean stresses the variance computation.
        for (auto& v : x) v = bf ? round_bf16(v + 4 * c.hi) : v + 4 * c.hi;
        std::vector<float> w = rng.vec(static_cast<size_t>(c.dim), -2, 2, bf);
        std::vector<float> b = rng.vec(static_cast<size_t>(c.dim), -1, 1, bf);
        const float* wp = affine < 2 ? w.data() : nullptr;
        const float* bp = affine < 1 ? b.data() : nullptr;
        Guarded y(c.rows, c.dim, ldy);
        kern::layer_norm(x.data(), c.rows, c.dim, ldx, wp, bp, eps, y.data(), ldy, store);
        std::vector<float> ref(static_cast<size_t>(c.rows * c.dim));
        ref::layer_norm(x.data(), c.rows, c.dim, ldx, wp, bp, eps, ref.data(), c.dim, store);
        EXPECT_EQ(y.touched_outside(), 0);
        EXPECT_EQ(y.untouched_inside(), 0);
        EXPECT_EQ(test::count_violations("layer_norm", y.data(), ldy, ref.data(), c.rows, c.dim,
                                         [&](int64_t r, int64_t i, float e) {
                                           double mean = 0, var = 0;
                                           for (int64_t j = 0; j < c.dim; ++j) mean += x[r * ldx + j];
                                           mean /= double(c.dim);
                                           for (int64_t j = 0; j < c.dim; ++j)
                                             var += (x[r * ldx + j] - mean) * (x[r * ldx + j] - mean);
                                           const double rstd = 1.0 / std::sqrt(var / double(c.dim) + eps);
                                           const double wi = wp ? std::fabs(w[i]) : 1.0, bi = bp ? std::fabs(b[i]) : 0;
                                           // mean rounded to fp32 shifts x - mean by ~eps*|mean|.
                                           const double t = 6.0 * test::kEps32 *
                                                            ((std::fabs(x[r * ldx + i]) + std::fabs(mean)) * rstd * wi + bi);
                                           return bf ? t + test::bf16_ulp(e) : t;
                                         }),
                  0);
        if (bf) {
          EXPECT_EQ(test::count_non_bf16(y.data(), ldy, c.rows, c.dim), 0);
        }
      }
}

// layer_norm_bf16 writes layer_norm(..., BF16)'s values as bf16 bits, bit for bit (odd dims, strided
// rows, the offset means above; every affine form). Row-wise, so any row split gives the same bits.
TEST(KernelsLayerNorm, Bf16BitsAreLayerNormsValues) {
  Rng rng(13);
  for (const auto& c : kNorm)
    for (int affine = 0; affine < 3; ++affine) {
      SCOPED_TRACE(::testing::Message() << "rows=" << c.rows << " dim=" << c.dim << " affine=" << affine);
      const int64_t ldx = c.dim + 1, ldy = c.dim + 4;
      std::vector<float> x = rng.vec(static_cast<size_t>(c.rows * ldx), c.lo, c.hi, true);
      for (auto& v : x) v = round_bf16(v + 4 * c.hi);
      const std::vector<float> w = rng.vec(static_cast<size_t>(c.dim), -2, 2, true);
      const std::vector<float> b = rng.vec(static_cast<size_t>(c.dim), -1, 1, true);
      const float* wp = affine < 2 ? w.data() : nullptr;
      const float* bp = affine < 1 ? b.data() : nullptr;
      std::vector<float> want(static_cast<size_t>(c.rows * ldy));
      kern::layer_norm(x.data(), c.rows, c.dim, ldx, wp, bp, 1e-5f, want.data(), ldy, DType::BF16);
      const uint16_t guard = 0xBEEF;  // not a value layer_norm writes here (a negative ~-0.47 in bf16)
      std::vector<uint16_t> got(static_cast<size_t>(c.rows * ldy), guard);
      kern::layer_norm_bf16(x.data(), c.rows, c.dim, ldx, wp, bp, 1e-5f, got.data(), ldy);
      int64_t diffs = 0, guards_touched = 0;
      for (int64_t r = 0; r < c.rows; ++r)
        for (int64_t i = 0; i < ldy; ++i) {
          const uint16_t g = got[static_cast<size_t>(r * ldy + i)];
          if (i >= c.dim)
            guards_touched += g != guard;
          else
            diffs += g != f32_to_bf16_bits(want[static_cast<size_t>(r * ldy + i)]) ||
                     bf16_bits_to_f32(g) != want[static_cast<size_t>(r * ldy + i)];
        }
      EXPECT_EQ(diffs, 0);
      EXPECT_EQ(guards_touched, 0);
    }
}

}  // namespace
}  // namespace mm3
