// kernels_attention.cpp — kern::attention (GQA, causal with q_pos0, F32 / BF16 KV) and
// kern::softmax_rows against their ref twins, with strided rows, guards and data-scaled tolerances.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <vector>

#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"
#include "kernels/ref/ref_kernels.h"
#include "kernels_util.h"

namespace mm3 {
namespace {

using test::Guarded;
using test::Rng;

struct AttnCase {
  int64_t Sq, Skv;
  int Hq, Hkv, D;
  bool causal;
  int64_t q_pos0;
};

const AttnCase kAttn[] = {
    {1, 1, 4, 2, 16, true, 0},    // first token
    {5, 5, 4, 2, 16, true, 0},    // prefill, GQA 2:1
    {3, 11, 4, 2, 16, true, 8},   // chunk appended to a cache: q_pos0 = Skv - Sq
    {4, 10, 4, 2, 16, true, 3},   // keys past the causal limit exist and must be masked
    {1, 17, 8, 2, 64, true, 16},  // decode, GQA 4:1
    {7, 13, 4, 4, 24, false, 0},  // bidirectional, Hq == Hkv
    {6, 9, 2, 1, 33, false, 0},   // odd head dim, MQA
    {2, 40, 3, 3, 256, true, 38}, // depth-decoder head dim
    // >= 16 rows per KV head take the transposed-K path (the cases above take direct dot products)
    {20, 20, 4, 2, 16, true, 0},   // prefill
    {9, 33, 8, 2, 24, true, 24},   // chunk after a cache, GQA 4:1
    {17, 70, 2, 2, 40, false, 0},  // bidirectional, keys span two 64-key blocks
    {16, 130, 4, 1, 33, true, 114}, // odd D, three key blocks
};

void check_attention(const ThreadPool& pool, const AttnCase& c, DType kv_dt, DType store, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "Sq=" << c.Sq << " Skv=" << c.Skv << " Hq=" << c.Hq << " Hkv=" << c.Hkv
                                    << " D=" << c.D << " causal=" << c.causal << " q_pos0=" << c.q_pos0
                                    << " kv=" << dtype_name(kv_dt) << " store=" << test::store_name(store));
  Rng rng(seed);
  const bool bf = store == DType::BF16;
  const int64_t ldq = int64_t(c.Hq) * c.D + 3, ldkv = int64_t(c.Hkv) * c.D + 5, ldo = int64_t(c.Hq) * c.D + 7;
  std::vector<float> q = rng.vec(static_cast<size_t>(c.Sq * ldq), -1.5f, 1.5f, bf);
  // K/V values are bf16-representable so the F32 and BF16 KV runs see the same numbers.
  std::vector<float> kf = rng.vec(static_cast<size_t>(c.Skv * ldkv), -1.5f, 1.5f, true);
  std::vector<float> vf = rng.vec(static_cast<size_t>(c.Skv * ldkv), -2.f, 2.f, true);
  std::vector<uint16_t> kh(kf.size()), vh(vf.size());
  f32_to_bf16(kf.data(), kh.data(), kf.size());
  f32_to_bf16(vf.data(), vh.data(), vf.size());
  const void* k = kv_dt == DType::BF16 ? static_cast<const void*>(kh.data()) : kf.data();
  const void* v = kv_dt == DType::BF16 ? static_cast<const void*>(vh.data()) : vf.data();
  const float scale = 1.0f / std::sqrt(float(c.D));
  Guarded out(c.Sq, int64_t(c.Hq) * c.D, ldo);
  kern::attention(pool, q.data(), ldq, k, v, ldkv, kv_dt, out.data(), ldo, c.Sq, c.Skv, c.Hq, c.Hkv, c.D, scale,
                  c.causal, c.q_pos0, store);
  const int64_t W = int64_t(c.Hq) * c.D;
  std::vector<float> ref(static_cast<size_t>(c.Sq * W));
  ref::attention(pool, q.data(), ldq, k, v, ldkv, kv_dt, ref.data(), W, c.Sq, c.Skv, c.Hq, c.Hkv, c.D, scale,
                 c.causal, c.q_pos0, store);
  EXPECT_EQ(out.touched_outside(), 0);
  EXPECT_EQ(out.untouched_inside(), 0);
  const int group = c.Hq / c.Hkv;
  EXPECT_EQ(test::count_violations(
                "attention", out.data(), ldo, ref.data(), c.Sq, W,
                [&](int64_t i, int64_t col, float e) {
                  // |error| <= eps * sum_j p_j |v_j| * (D * max_j sum|q k| * scale + 2 * nk + 4): dot
                  // products perturb the scores, exp and the weighted sum add a few ulps per key.
                  const int h = int(col / c.D), d = int(col % c.D), hk = h / group;
                  const int64_t nk = c.causal ? std::min<int64_t>(c.Skv, c.q_pos0 + i + 1) : c.Skv;
                  std::vector<double> s(static_cast<size_t>(nk));
                  double mx = -INFINITY, smax = 0, sum = 0, pv = 0;
                  for (int64_t j = 0; j < nk; ++j) {
                    double dot = 0, absdot = 0;
                    for (int e2 = 0; e2 < c.D; ++e2) {
                      const double t = double(q[i * ldq + h * c.D + e2]) * kf[j * ldkv + hk * c.D + e2];
                      dot += t, absdot += std::fabs(t);
                    }
                    s[j] = dot * scale, mx = std::max(mx, s[j]), smax = std::max(smax, absdot * scale);
                  }
                  for (int64_t j = 0; j < nk; ++j) sum += std::exp(s[j] - mx);
                  for (int64_t j = 0; j < nk; ++j) pv += std::exp(s[j] - mx) / sum * std::fabs(vf[j * ldkv + hk * c.D + d]);
                  const double t = test::kEps32 * pv * (c.D * smax + 2.0 * nk + 4.0);
                  return bf ? t + test::bf16_ulp(e) : t;
                }),
            0);
  if (bf) {
    EXPECT_EQ(test::count_non_bf16(out.data(), ldo, c.Sq, W), 0);
  }
}

TEST(KernelsAttention, MatchesRef) {
  ThreadPool pool(2);
  uint64_t seed = 100;
  for (const auto& c : kAttn)
    for (DType kv : {DType::F32, DType::BF16})
      for (DType store : {DType::F32, DType::BF16}) check_attention(pool, c, kv, store, seed++);
}

TEST(KernelsAttention, ThreadCountIndependent) {
  ThreadPool p1(1), p2(2);
  Rng rng(7);
  const AttnCase c{9, 21, 4, 2, 32, true, 12};
  const int64_t ld = 4 * 32, ldkv = 2 * 32;
  std::vector<float> q = rng.vec(static_cast<size_t>(c.Sq * ld), -1, 1);
  std::vector<float> k = rng.vec(static_cast<size_t>(c.Skv * ldkv), -1, 1), v = rng.vec(k.size(), -1, 1);
  std::vector<float> a(q.size()), b(q.size());
  kern::attention(p1, q.data(), ld, k.data(), v.data(), ldkv, DType::F32, a.data(), ld, c.Sq, c.Skv, c.Hq, c.Hkv, c.D,
                  0.2f, true, c.q_pos0, DType::F32);
  kern::attention(p2, q.data(), ld, k.data(), v.data(), ldkv, DType::F32, b.data(), ld, c.Sq, c.Skv, c.Hq, c.Hkv, c.D,
                  0.2f, true, c.q_pos0, DType::F32);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
}

#if defined(__AVX512F__)
// The attention kernel's vector exp (kernels/cpu/simd.h): within 2 ulps of exp in double over the
// range softmax feeds it (s - max <= 0, down to the fp32 underflow), exact 0 below, NaN kept.
TEST(KernelsAttention, VectorExpAccuracy) {
  Rng rng(9);
  std::vector<float> xs = rng.vec(4096, -103.f, 0.f);
  for (float v : {0.f, -1e-8f, -0.5f, -0.34657359f, -87.3f, -88.f, -1.f, -10.f}) xs.push_back(v);
  while (xs.size() % 16) xs.push_back(-2.f);
  int64_t worst = 0;
  for (size_t i = 0; i < xs.size(); i += 16) {
    float out[16];
    _mm512_storeu_ps(out, kern::detail::exp_v(_mm512_loadu_ps(xs.data() + i)));
    for (int l = 0; l < 16; ++l) {
      const float want = static_cast<float>(std::exp(double(xs[i + l])));
      const float got = out[l];
      if (want >= 1.17549435e-38f) {
        const int64_t d = std::llabs(int64_t(f32_bits(got)) - int64_t(f32_bits(want)));
        worst = std::max(worst, d);
        EXPECT_LE(d, 2) << "exp(" << xs[i + l] << ") got " << got << " want " << want;
      } else {  // denormal results: absolute error of a couple of denormal steps
        EXPECT_LE(std::fabs(double(got) - double(want)), 3e-45) << "exp(" << xs[i + l] << ")";
      }
    }
  }
  float in[16], out[16];
  for (int l = 0; l < 16; ++l) in[l] = -200.f;
  in[1] = NAN;
  in[2] = -INFINITY;
  _mm512_storeu_ps(out, kern::detail::exp_v(_mm512_loadu_ps(in)));
  EXPECT_EQ(out[0], 0.f);
  EXPECT_TRUE(std::isnan(out[1]));
  EXPECT_EQ(out[2], 0.f);
  RecordProperty("worst_ulps", static_cast<int>(worst));
}
#endif

TEST(KernelsSoftmax, MatchesRefIncludingLargeLogits) {
  Rng rng(8);
  for (auto [rows, cols, range] : {std::tuple<int64_t, int64_t, float>{3, 37, 4.f}, {1, 1, 1.f}, {2, 1000, 120.f}}) {
    SCOPED_TRACE(::testing::Message() << "rows=" << rows << " cols=" << cols << " range=" << range);
    // Logits up to +-120: exp overflows fp32 unless the row max is subtracted first.
    std::vector<float> x = rng.vec(static_cast<size_t>(rows * cols), -range, range);
    std::vector<float> got = x, want = x;
    kern::softmax_rows(got.data(), rows, cols);
    ref::softmax_rows(want.data(), rows, cols);
    EXPECT_EQ(test::count_violations("softmax", got.data(), cols, want.data(), rows, cols,
                                     [&](int64_t, int64_t, float e) {
                                       return (cols + 6) * test::kEps32 * std::fabs(e) + 3e-45;
                                     }),
              0);
  }
}

}  // namespace
}  // namespace mm3
