// kernels_attention.cpp — kern::attention (GQA, causal with q_pos0, F32 / BF16 KV) and
// kern::softmax_rows against their ref twins, with strided rows, guards and data-scaled tolerances.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
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
    {1, 1, 4, 2, 16, true, 0},     // first token
    {5, 5, 4, 2, 16, true, 0},     // prefill, GQA 2:1
    {3, 11, 4, 2, 16, true, 8},    // chunk appended to a cache: q_pos0 = Skv - Sq
    {4, 10, 4, 2, 16, true, 3},    // keys past the causal limit exist and must be masked
    {1, 17, 8, 2, 64, true, 16},   // decode, GQA 4:1
    {7, 13, 4, 4, 24, false, 0},   // bidirectional, Hq == Hkv
    {6, 9, 2, 1, 33, false, 0},    // odd head dim, MQA
    {2, 40, 3, 3, 256, true, 38},  // depth-decoder head dim
    {1, 50, 12, 2, 32, true, 49},  // GQA 6:1 (the AVX2 decode path's 4 + 2 heads per group)
    {3, 20, 9, 3, 16, true, 17},   // GQA 3:1
    // >= 16 rows per KV head take the transposed-K path (the cases above take direct dot products)
    {20, 20, 4, 2, 16, true, 0},     // prefill
    {9, 33, 8, 2, 24, true, 24},     // chunk after a cache, GQA 4:1
    {17, 70, 2, 2, 40, false, 0},    // bidirectional, keys span two 64-key blocks
    {16, 130, 4, 1, 33, true, 114},  // odd D, three key blocks
    // more than 512 keys: the online softmax's second and third blocks (rescaled partial sums)
    {2, 1100, 4, 2, 16, true, 1098},  // decode rows (direct scores)
    {18, 600, 2, 1, 24, true, 582},   // many rows, row keys 583..600 cross the 512 boundary
    {20, 530, 2, 2, 16, false, 0},    // bidirectional, a short second block
    // bidirectional with >= 64 query rows and keys: the GEMM path (attention_gemm)
    {64, 64, 2, 2, 64, false, 0},    // smallest GEMM case
    {130, 600, 4, 2, 40, false, 0},  // GQA, two query blocks + a partial one, keys in two softmax blocks
    {70, 1100, 2, 1, 33, false, 0},  // MQA, odd D, three softmax blocks
    // ... with Hq == Hkv (as the DiT), keys in two and three softmax blocks
    {100, 700, 3, 3, 40, false, 0},  // odd D, keys in two softmax blocks
    {65, 1030, 2, 2, 64, false, 0},  // three softmax blocks, the last 6 keys wide
    {66, 601, 2, 2, 33, false, 0},   // odd keys and odd D: the bf16 tiles' padded last pairs
};

// K / V of one logical [Skv, Hkv, D] tensor in the layout kern::attention is asked to read: token-major
// rows (key j, head h at j * ldkv + h * D, ldh = 0) or head-major as KvCache holds them (j * ldkv +
// h * ldh, with ldkv and ldh padded so neither is the dense value).
struct KvLayout {
  int64_t ldkv, ldh;
  std::vector<float> k, v;  // in the layout
};

KvLayout lay_out_kv(const AttnCase& c, const std::vector<float>& kf, const std::vector<float>& vf, int64_t ld_src,
                    bool head_major) {
  if (!head_major) return {ld_src, 0, kf, vf};
  KvLayout L;
  L.ldkv = c.D + 3;
  L.ldh = (c.Skv + 2) * L.ldkv + 5;
  L.k.assign(static_cast<size_t>(c.Hkv * L.ldh), -7.f);  // never read
  L.v = L.k;
  for (int64_t j = 0; j < c.Skv; ++j)
    for (int h = 0; h < c.Hkv; ++h)
      for (int d = 0; d < c.D; ++d) {
        L.k[size_t(j * L.ldkv + h * L.ldh + d)] = kf[size_t(j * ld_src + h * c.D + d)];
        L.v[size_t(j * L.ldkv + h * L.ldh + d)] = vf[size_t(j * ld_src + h * c.D + d)];
      }
  return L;
}

void check_attention(const ThreadPool& pool, const AttnCase& c, DType kv_dt, DType store, uint64_t seed,
                     bool head_major = false) {
  SCOPED_TRACE(::testing::Message() << "Sq=" << c.Sq << " Skv=" << c.Skv << " Hq=" << c.Hq << " Hkv=" << c.Hkv
                                    << " D=" << c.D << " causal=" << c.causal << " q_pos0=" << c.q_pos0
                                    << " kv=" << dtype_name(kv_dt) << " store=" << test::store_name(store)
                                    << " head_major=" << head_major);
  Rng rng(seed);
  const bool bf = store == DType::BF16;
  const int64_t ldq = int64_t(c.Hq) * c.D + 3, ldkv = int64_t(c.Hkv) * c.D + 5, ldo = int64_t(c.Hq) * c.D + 7;
  std::vector<float> q = rng.vec(static_cast<size_t>(c.Sq * ldq), -1.5f, 1.5f, bf);
  // K/V values are bf16-representable so the F32 and BF16 KV runs see the same numbers.
  std::vector<float> kf = rng.vec(static_cast<size_t>(c.Skv * ldkv), -1.5f, 1.5f, true);
  std::vector<float> vf = rng.vec(static_cast<size_t>(c.Skv * ldkv), -2.f, 2.f, true);
  const KvLayout L = lay_out_kv(c, kf, vf, ldkv, head_major);
  std::vector<uint16_t> kh(L.k.size()), vh(L.v.size());
  f32_to_bf16(L.k.data(), kh.data(), L.k.size());
  f32_to_bf16(L.v.data(), vh.data(), L.v.size());
  const void* k = kv_dt == DType::BF16 ? static_cast<const void*>(kh.data()) : L.k.data();
  const void* v = kv_dt == DType::BF16 ? static_cast<const void*>(vh.data()) : L.v.data();
  const float scale = 1.0f / std::sqrt(float(c.D));
  Guarded out(c.Sq, int64_t(c.Hq) * c.D, ldo);
  kern::attention(pool, q.data(), ldq, k, v, L.ldkv, kv_dt, out.data(), ldo, c.Sq, c.Skv, c.Hq, c.Hkv, c.D, scale,
                  c.causal, c.q_pos0, store, 0, L.ldh);
  const int64_t W = int64_t(c.Hq) * c.D;
  std::vector<float> ref(static_cast<size_t>(c.Sq * W));
  ref::attention(pool, q.data(), ldq, k, v, L.ldkv, kv_dt, ref.data(), W, c.Sq, c.Skv, c.Hq, c.Hkv, c.D, scale,
                 c.causal, c.q_pos0, store, 0, L.ldh);
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
                  double pvmax = 0;
                  for (int64_t j = 0; j < nk; ++j) sum += std::exp(s[j] - mx);
                  for (int64_t j = 0; j < nk; ++j) {
                    const double term = std::exp(s[j] - mx) / sum * std::fabs(vf[j * ldkv + hk * c.D + d]);
                    pv += term, pvmax = std::max(pvmax, term);
                  }
                  const double t = test::kEps32 * pv * (c.D * smax + 2.0 * nk + 4.0);
                  // bf16: the output's own rounding, plus the probabilities': the kernel's bf16-run
                  // exponential (fexp20) is accurate to about a bf16 ulp and its result is rounded
                  // again, so each p may differ from the ref's rounded exact p by up to 2^-7 p.
                  (void)pvmax;
                  return bf ? t + test::bf16_ulp(e) + std::ldexp(pv, -7) : t;
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

// The head-major layout (KvCache's: ldkv = key stride within a head, ldh = head stride) on every case,
// against the ref reading the same layout.
TEST(KernelsAttention, HeadMajorMatchesRef) {
  ThreadPool pool(2);
  uint64_t seed = 300;
  for (const auto& c : kAttn)
    for (DType kv : {DType::F32, DType::BF16})
      for (DType store : {DType::F32, DType::BF16}) check_attention(pool, c, kv, store, seed++, true);
}

// Where both layouts take the same path (every causal case: the GEMM form is for bidirectional rows of
// side-by-side heads only), the same numbers in either layout give the same bits. RED: a kernel that
// reads head hk at hk * D whatever ldh is fails here and in HeadMajorMatchesRef.
TEST(KernelsAttention, HeadMajorSameBitsAsTokenMajor) {
  ThreadPool pool(2);
  Rng rng(41);
  for (const auto& c : kAttn) {
    if (!c.causal) continue;
    for (DType kv_dt : {DType::F32, DType::BF16})
      for (DType store : {DType::F32, DType::BF16}) {
        SCOPED_TRACE(::testing::Message() << "Sq=" << c.Sq << " Skv=" << c.Skv << " Hq=" << c.Hq << " D=" << c.D
                                          << " kv=" << dtype_name(kv_dt) << " store=" << test::store_name(store));
        const int64_t ldq = int64_t(c.Hq) * c.D, ld = int64_t(c.Hkv) * c.D;
        std::vector<float> q = rng.vec(static_cast<size_t>(c.Sq * ldq), -1.5f, 1.5f, true);
        std::vector<float> kf = rng.vec(static_cast<size_t>(c.Skv * ld), -1.5f, 1.5f, true);
        std::vector<float> vf = rng.vec(kf.size(), -2.f, 2.f, true);
        std::vector<float> out[2];
        for (int hm = 0; hm < 2; ++hm) {
          const KvLayout L = lay_out_kv(c, kf, vf, ld, hm == 1);
          std::vector<uint16_t> kh(L.k.size()), vh(L.v.size());
          f32_to_bf16(L.k.data(), kh.data(), L.k.size());
          f32_to_bf16(L.v.data(), vh.data(), L.v.size());
          const bool bf = kv_dt == DType::BF16;
          out[hm].assign(static_cast<size_t>(c.Sq * ldq), 0.f);
          kern::attention(pool, q.data(), ldq, bf ? static_cast<const void*>(kh.data()) : L.k.data(),
                          bf ? static_cast<const void*>(vh.data()) : L.v.data(), L.ldkv, kv_dt, out[hm].data(), ldq,
                          c.Sq, c.Skv, c.Hq, c.Hkv, c.D, 0.125f, true, c.q_pos0, store, 0, L.ldh);
        }
        EXPECT_EQ(std::memcmp(out[0].data(), out[1].data(), out[0].size() * 4), 0);
      }
  }
}

// The direct path (causal, few rows) and the GEMM path (bidirectional, many rows; GQA and Hq == Hkv).
TEST(KernelsAttention, ThreadCountIndependent) {
  ThreadPool p1(1), p2(2);
  Rng rng(7);
  // (1, 300, 32, 8, 64): a decode step, its KV heads one block on one thread and two on two (AVX2 path)
  for (const AttnCase c : {AttnCase{9, 21, 4, 2, 32, true, 12}, AttnCase{1, 300, 32, 8, 64, true, 299},
                           AttnCase{130, 600, 4, 2, 40, false, 0}, AttnCase{100, 700, 3, 3, 40, false, 0}})
    for (DType store : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(::testing::Message() << "Sq=" << c.Sq << " store=" << test::store_name(store));
      const int64_t ld = int64_t(c.Hq) * c.D, ldkv = int64_t(c.Hkv) * c.D;
      const bool bf = store == DType::BF16;
      std::vector<float> q = rng.vec(static_cast<size_t>(c.Sq * ld), -1, 1, bf);
      std::vector<float> k = rng.vec(static_cast<size_t>(c.Skv * ldkv), -1, 1, bf), v = rng.vec(k.size(), -1, 1, bf);
      std::vector<float> a(q.size()), b(q.size());
      kern::attention(p1, q.data(), ld, k.data(), v.data(), ldkv, DType::F32, a.data(), ld, c.Sq, c.Skv, c.Hq, c.Hkv,
                      c.D, 0.2f, c.causal, c.q_pos0, store);
      kern::attention(p2, q.data(), ld, k.data(), v.data(), ldkv, DType::F32, b.data(), ld, c.Sq, c.Skv, c.Hq, c.Hkv,
                      c.D, 0.2f, c.causal, c.q_pos0, store);
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
    }
}

// The softmax contract bit for bit (kernels.h): with one-hot keys the scores are exact (s_j =
// kval_j * scale) and V = identity makes out[j] = e_j * (1/sum) visible directly, so the expected
// bits follow from the contract alone. 509 keys = 15 x 32 + 16 + 13: fp32 run: e = exp20 over
// j < 496 summed in one 16-lane accumulator, std::exp over the last 13; bf16 run: e = fexp20, j < 480
// in two accumulators (j % 32 < 16, >= 16), 480..495 in a third, lanes combined as (a0 + a2) + a1,
// then tree-reduced, and e rounded to bf16 before the product. RED: the kernel before this contract
// (exp_v, fp32 P) fails BF16 at most columns; exp20 instead of fexp20 in the bf16 run fails (the two
// differ by ~1e-4 relative, enough to flip some roundings over 509 keys: 8 and 160 columns). The
// lane grouping of the sum changes it by an fp32 ulp at most, which this test cannot see (a single
// accumulator passes); the e2e golden cases are what pin it.
// wide: scores spread over ~136 below the maximum (0), so the exponentials reach fexp20's clamp and, at
// x = ln(FLT_MIN) exactly, a subnormal numerator (the bf16 path's VCVTNE2PS2BF16 would flush it: its
// fallback keeps the bits; RED with the fallback removed).
TEST(KernelsAttention, ReferenceSoftmaxBits) {
  constexpr int D = 509;  // = Skv
  for (int64_t Sq : {int64_t(1), int64_t(20), int64_t(64)}) {  // direct scores / transposed K / GEMM form
    for (bool wide : {false, true})
      for (DType store : {DType::F32, DType::BF16}) {
        SCOPED_TRACE(::testing::Message() << "Sq=" << Sq << " wide=" << wide << " store=" << test::store_name(store));
        const bool bf = store == DType::BF16;
        Rng rng(31);
        std::vector<float> kval = rng.vec(D, wide ? -200.f : -12.f, wide ? -1.f : 12.f, true);
        // wide: the maximum 0, and -128 · scale = ln(FLT_MIN) (scale = ln(FLT_MIN) / -128, exact)
        const float scale = wide ? kern::detail::exp20_c::bits(kern::detail::exp20_c::kLo) / -128.0f : 0.37f;
        if (wide) {
          kval[0] = 0.f, kval[1] = -128.f, kval[2] = -127.5f;
          const float e1 = kern::detail::fexp20(kval[1] * scale);
          ASSERT_TRUE(e1 > 0.f && e1 < std::numeric_limits<float>::min()) << e1;  // the case is covered
        }
        std::vector<float> q(static_cast<size_t>(Sq * D), 1.0f), k(D * D, 0.f), v(D * D, 0.f), out(Sq * D);
        for (int j = 0; j < D; ++j) k[j * D + j] = kval[j], v[j * D + j] = 1.0f;
        kern::attention(ThreadPool(2), q.data(), D, k.data(), v.data(), D, DType::F32, out.data(), D, Sq, D, 1, 1, D,
                        scale, false, 0, store);
        float mx = -INFINITY, acc[3][16] = {};
        std::vector<float> s(D), e(D);
        for (int j = 0; j < D; ++j) mx = std::max(mx, s[j] = kval[j] * scale);
        constexpr int kV16 = D / 16 * 16, kV32 = D / 32 * 32;
        for (int j = 0; j < kV16; ++j) {
          e[j] = bf ? kern::detail::fexp20(s[j] - mx) : kern::detail::exp20(s[j] - mx);
          acc[bf ? (j < kV32 ? (j / 16) % 2 : 2) : 0][j % 16] += e[j];
        }
        float lanes[16];
        for (int l = 0; l < 16; ++l) lanes[l] = (acc[0][l] + acc[2][l]) + acc[1][l];
        float t8[8];
        for (int i = 0; i < 8; ++i) t8[i] = lanes[i + 8] + lanes[i];
        for (int i = 0; i < 4; ++i) t8[i] = t8[i + 4] + t8[i];
        float sum = (t8[0] + t8[2]) + (t8[1] + t8[3]);
        for (int j = kV16; j < D; ++j) sum += (e[j] = std::exp(s[j] - mx));
        const float inv = 1.0f / sum;
        int bad = 0;
        for (int64_t i = 0; i < Sq; ++i)
          for (int j = 0; j < D; ++j) {
            const float want = round_store(round_store(e[j], store) * inv, store);
            if (f32_bits(out[i * D + j]) != f32_bits(want) && bad++ < 5)
              ADD_FAILURE() << "row " << i << " col " << j << ": got " << out[i * D + j] << " want " << want;
          }
        EXPECT_EQ(bad, 0);
      }
  }
}

// fexp20 (the bf16 run's exponential): scalar and vector twins agree bit for bit; within 2^-8
// relative of exp (about one bf16 ulp) where the result is normal; 0 / inf beyond the clamps.
TEST(KernelsAttention, Fexp20Accuracy) {
  Rng rng(13);
  std::vector<float> xs = rng.vec(4096, -87.f, 5.f);
  for (float x : {0.f, -1e-8f, -0.5f, -1.f, -10.f, -87.3f, -88.f, -200.f, 89.f, NAN, -INFINITY}) xs.push_back(x);
  while (xs.size() % 16) xs.push_back(-3.f);
  double worst = 0;
  for (float x : xs) {
    const float got = kern::detail::fexp20(x);
    if (std::isnan(x)) continue;
    if (x < -87.33654f) {
      EXPECT_EQ(got, 0.f) << x;
    } else if (x > 88.72284f) {
      EXPECT_EQ(got, INFINITY) << x;
    } else if (x > -87.f) {
      const double rel = std::fabs(double(got) / std::exp(double(x)) - 1.0);
      worst = std::max(worst, rel);
      EXPECT_LE(rel, std::ldexp(1.0, -8)) << "fexp20(" << x << ") = " << got;
    }
  }
#if defined(__AVX512F__)
  for (size_t i = 0; i < xs.size(); i += 16) {
    float out[16];
    _mm512_storeu_ps(out, kern::detail::fexp20_v(_mm512_loadu_ps(xs.data() + i)));
    for (int l = 0; l < 16; ++l) EXPECT_EQ(f32_bits(out[l]), f32_bits(kern::detail::fexp20(xs[i + l]))) << xs[i + l];
  }
#endif
  RecordProperty("worst_rel_x1e6", static_cast<int>(worst * 1e6));
}

// kv_span (the reference call's key count) moves the vector/tail split, and only the rounding:
// a chunk of a prefill gives the same bits as the whole prefill's rows.
TEST(KernelsAttention, KvSpanMatchesWholePrefill) {
  const int H = 2, D = 16;
  const int64_t S = 45, c0 = 20;  // rows [20, 45) as a chunk after a 20-token cache
  Rng rng(5);
  std::vector<float> q = rng.vec(size_t(S * H * D), -2, 2, true), k = rng.vec(q.size(), -2, 2, true),
                     v = rng.vec(q.size(), -2, 2, true);
  std::vector<float> whole(q.size()), chunk(q.size());
  ThreadPool pool(2);
  kern::attention(pool, q.data(), H * D, k.data(), v.data(), H * D, DType::F32, whole.data(), H * D, S, S, H, H, D,
                  0.25f, true, 0, DType::BF16);
  kern::attention(pool, q.data() + c0 * H * D, H * D, k.data(), v.data(), H * D, DType::F32,
                  chunk.data() + c0 * H * D, H * D, S - c0, S, H, H, D, 0.25f, true, c0, DType::BF16, S);
  EXPECT_EQ(std::memcmp(whole.data() + c0 * H * D, chunk.data() + c0 * H * D, size_t((S - c0) * H * D) * 4), 0);
  EXPECT_THROW(kern::attention(pool, q.data(), H * D, k.data(), v.data(), H * D, DType::F32, chunk.data(), H * D, 1,
                               S, H, H, D, 0.25f, false, 0, DType::BF16, S - 1),
               Error);
}

// exp20 (the reference's softmax exponential): scalar and vector twins agree bit for bit, within
// 4 ulps of exp down to x = -86, 0 below ln(FLT_MIN).
// The AVX2 twins (simd.h: exp20_v8, fexp20_v8, round_bf16_v8, used by the attention's softmax on CPUs
// without AVX-512) equal the scalar functions bit for bit, special values included.
MM3_SIMD_AVX2 void avx2_twins(const float* x, float* e, float* f, float* r) {
  const __m256 v = _mm256_loadu_ps(x);
  _mm256_storeu_ps(e, kern::detail::exp20_v8(v));
  _mm256_storeu_ps(f, kern::detail::fexp20_v8(v));
  _mm256_storeu_ps(r, kern::detail::round_bf16_v8(v));
}

TEST(KernelsAttention, Avx2ExpTwinsEqualScalar) {
  if (!kern::detail::cpu_has_avx2_fma()) GTEST_SKIP() << "this CPU has no AVX2 + FMA: the AVX2 twins cannot run";
  Rng rng(21);
  std::vector<float> xs = rng.vec(8192, -110.f, 100.f);
  for (float v : rng.vec(4096, -1.f, 1.f)) xs.push_back(v);
  for (float v :
       {0.f,   -0.f,   1e-30f,   -1e-30f,   -87.3365f, -87.3366f, -88.7f,  88.72f,   88.73f,      -104.f,
        200.f, -200.f, INFINITY, -INFINITY, NAN,       -NAN,      3.4e38f, -3.4e38f, 1.00390625f, 1.01171875f})
    xs.push_back(v);
  while (xs.size() % 8) xs.push_back(-3.f);
  int64_t bad = 0;
  for (size_t i = 0; i < xs.size(); i += 8) {
    float e[8], f[8], r[8];
    avx2_twins(xs.data() + i, e, f, r);
    for (int l = 0; l < 8; ++l) {
      const float x = xs[i + l];
      const int d = (f32_bits(e[l]) != f32_bits(kern::detail::exp20(x))) +
                    (f32_bits(f[l]) != f32_bits(kern::detail::fexp20(x))) + (f32_bits(r[l]) != f32_bits(round_bf16(x)));
      if (d && bad < 4) ADD_FAILURE() << "x = " << x << " (bits " << f32_bits(x) << ")";
      bad += d;
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(KernelsAttention, Exp20Accuracy) {
  Rng rng(12);
  std::vector<float> xs = rng.vec(4096, -87.f, 0.f);
  for (float x : {0.f, -1e-8f, -0.5f, -0.34657359f, -87.3f, -1.f, -10.f, -88.f, -200.f}) xs.push_back(x);
  while (xs.size() % 16) xs.push_back(-3.f);
  int64_t worst = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const float got = kern::detail::exp20(xs[i]);
    const double want = std::exp(double(xs[i]));
    if (xs[i] < -87.33654f) {
      EXPECT_EQ(got, 0.f) << xs[i];
    } else if (xs[i] >= -86.f) {  // (between, 2^(n-1) may reach the zero exponent: 0 or denormal-ish)
      // One-part ln2 in the reduction: the error grows with |n| (measured worst 3 ulps at x = -87).
      const int64_t d = std::llabs(int64_t(f32_bits(got)) - int64_t(f32_bits(float(want))));
      worst = std::max(worst, d);
      EXPECT_LE(d, 4) << "exp20(" << xs[i] << ") = " << got << " vs " << want;
    }
  }
#if defined(__AVX512F__)
  for (size_t i = 0; i < xs.size(); i += 16) {
    float out[16];
    _mm512_storeu_ps(out, kern::detail::exp20_v(_mm512_loadu_ps(xs.data() + i)));
    for (int l = 0; l < 16; ++l) EXPECT_EQ(f32_bits(out[l]), f32_bits(kern::detail::exp20(xs[i + l]))) << xs[i + l];
  }
#endif
  EXPECT_EQ(kern::detail::exp20(-INFINITY), 0.f);
  RecordProperty("worst_ulps", static_cast<int>(worst));
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
