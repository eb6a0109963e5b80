// kernels_quant.cpp — the quantized weight formats and kernels (kernels/quant.h) against their scalar
// twins (ref/ref_quant.h): quantizer bytes, dequantization, the decode GEMV (AVX512-VNNI, AVX2 and scalar
// paths, bitwise equal to each other, within fp32 summation error of the double-accumulating twin),
// the prefill path, kern::linear's dispatch, and the determinism contract (thread count, repeat).
// Odd sizes everywhere: K not a multiple of 32 or 512, N not a multiple of the 4-row groups.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "kernels/ref/ref_quant.h"
#include "kernels_util.h"

namespace mm3 {
namespace {

using kern::QuantMatrix;
using kern::QuantType;
using kern::detail::QuantIsa;
using test::Guarded;
using test::Rng;

constexpr QuantType kTypes[] = {QuantType::Int8, QuantType::Q4};

// A weight with a spread of block magnitudes (and an all-zero block, and a constant block) so that
// scales, minima and the zero-scale path are all exercised.
Tensor make_weight(Rng& rng, int64_t N, int64_t K, DType dt) {
  std::vector<float> w(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t b = k / 32;
      float v = rng.uni(-1.f, 1.f) * std::ldexp(1.f, static_cast<int>((n * 7 + b * 3) % 9) - 6);
      if ((n + b) % 11 == 5) v = 0.f;          // zero block
      if ((n + b) % 13 == 7) v = 0.375f;       // constant block (d = 0 for Q4)
      w[size_t(n * K + k)] = v;
    }
  Tensor t = Tensor::from_f32(w, {N, K});
  return dt == DType::BF16 ? t.to(DType::BF16) : t;
}

std::vector<float> make_x(Rng& rng, int64_t M, int64_t ldx, bool bf16) {
  std::vector<float> x = rng.vec(static_cast<size_t>(M * ldx), -2.f, 2.f, bf16);
  // A few zero blocks in the activations (dx = 0 path).
  for (int64_t i = 0; i < std::min<int64_t>(32, M * ldx); ++i) x[size_t(i)] = 0.f;
  return x;
}

bool same_bytes(const QuantMatrix& a, const QuantMatrix& b) {
  return a.qs().nbytes() == b.qs().nbytes() && a.scales().nbytes() == b.scales().nbytes() &&
         std::memcmp(a.qs().raw(), b.qs().raw(), a.qs().nbytes()) == 0 &&
         std::memcmp(a.scales().raw(), b.scales().raw(), a.scales().nbytes()) == 0;
}

// Elements whose bits differ between two outputs of the same layout.
int64_t bit_diffs(const Guarded& a, const Guarded& b, int64_t rows, int64_t cols) {
  int64_t n = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) n += f32_bits(a.at(r, c)) != f32_bits(b.at(r, c));
  return n;
}

struct Size {
  int64_t N, K;
};
const Size kSizes[] = {{1, 1}, {3, 31}, {7, 33}, {29, 100}, {5, 511}, {4, 512}, {9, 513}, {17, 1037}, {2, 1536}};

TEST(KernelsQuant, QuantizerMatchesRefBytes) {
  ThreadPool pool(2);
  Rng rng(3);
  for (QuantType t : kTypes)
    for (DType dt : {DType::F32, DType::BF16})
      for (const Size& s : kSizes) {
        SCOPED_TRACE(::testing::Message() << kern::quant_name(t) << " " << dtype_name(dt) << " N=" << s.N << " K=" << s.K);
        const Tensor w = make_weight(rng, s.N, s.K, dt);
        auto q = kern::quantize_weight(pool, w, t);
        auto r = ref::quantize_weight(w, t);
        ASSERT_EQ(q->rows(), s.N);
        ASSERT_EQ(q->cols(), s.K);
        ASSERT_EQ(q->padded_cols() % 512, 0);
        EXPECT_TRUE(same_bytes(*q, *r)) << "quantizer bytes differ from the ref twin";
      }
}

// The stored values: the reference decode, QuantMatrix::value and dequantize_rows agree exactly; an
// int8 value is within half a quantization step of the weight; a q4 block's squared error is at most
// that of the plain min/max parameters (the refits only ever improve on it).
TEST(KernelsQuant, DequantizeMatchesRefAndErrorBound) {
  ThreadPool pool(2);
  Rng rng(4);
  for (QuantType t : kTypes)
    for (const Size& s : kSizes) {
      SCOPED_TRACE(::testing::Message() << kern::quant_name(t) << " N=" << s.N << " K=" << s.K);
      const Tensor w = make_weight(rng, s.N, s.K, DType::F32);
      const float* wf = w.data<float>();
      auto q = kern::quantize_weight(pool, w, t);
      const int64_t ld = s.K + 3;
      Guarded out(s.N, s.K, ld);
      kern::dequantize_rows(*q, 0, s.N, out.data(), ld);
      EXPECT_EQ(out.touched_outside(), 0);
      int64_t bad = 0;
      for (int64_t n = 0; n < s.N && t == QuantType::Q4; ++n)
        for (int64_t b = 0; b * 32 < s.K; ++b) {
          const int64_t k0 = b * 32, k1 = std::min<int64_t>(s.K, k0 + 32);
          float lo = wf[n * s.K + k0], hi = lo;
          for (int64_t k = k0; k < k1; ++k) lo = std::min(lo, wf[n * s.K + k]), hi = std::max(hi, wf[n * s.K + k]);
          const float m = f16_bits_to_f32(f32_to_f16_bits(lo)), d = f16_bits_to_f32(f32_to_f16_bits((hi - m) / 15.f));
          double e_minmax = 0, e_ours = 0;
          for (int64_t k = k0; k < k1; ++k) {
            const float x = wf[n * s.K + k];
            const float q0 = d == 0.f ? 0.f : std::min(std::max(std::nearbyint((x - m) / d), 0.f), 15.f);
            e_minmax += std::pow(double(x) - double(d * q0 + m), 2);
            e_ours += std::pow(double(x) - double(q->value(n, k)), 2);
          }
          if (e_ours > e_minmax * (1 + 1e-6) + 1e-30) {
            if (bad < 5) ADD_FAILURE() << "q4 block (" << n << ", " << b << "): " << e_ours << " > min/max " << e_minmax;
            ++bad;
          }
        }
      for (int64_t n = 0; n < s.N; ++n)
        for (int64_t k = 0; k < s.K; ++k) {
          const float v = ref::quant_value(*q, n, k);
          bad += f32_bits(out.at(n, k)) != f32_bits(v) || f32_bits(q->value(n, k)) != f32_bits(v);
          if (t == QuantType::Q4) continue;
          // half a step: step = amax/127 of the block, plus fp16 rounding.
          double lo = 1e30, hi = -1e30, amax = 0;
          for (int64_t j = (k / 32) * 32; j < std::min<int64_t>(s.K, (k / 32) * 32 + 32); ++j) {
            lo = std::min<double>(lo, wf[n * s.K + j]);
            hi = std::max<double>(hi, wf[n * s.K + j]);
            amax = std::max<double>(amax, std::fabs(wf[n * s.K + j]));
          }
          const double step = t == QuantType::Int8 ? amax / 127 : (hi - lo) / 15;
          const double tol = 0.5 * step * (1 + 2e-3) + 1e-3 * amax + 1e-7;
          if (std::fabs(double(v) - wf[n * s.K + k]) > tol) {
            if (bad < 5) ADD_FAILURE() << "w[" << n << "," << k << "]=" << wf[n * s.K + k] << " stored " << v;
            ++bad;
          }
        }
      EXPECT_EQ(bad, 0);
    }
}

// The activation quantizer's vector and scalar loops produce the same bytes (odd K, zero blocks,
// values at the rounding ties of x * 127 / amax).
TEST(KernelsQuant, ActivationQuantizerPathsAgree) {
  Rng rng(9);
  for (int64_t K : {1, 15, 16, 17, 31, 32, 33, 100, 511, 513, 1037}) {
    for (int64_t M : {1, 4}) {
      SCOPED_TRACE(::testing::Message() << "K=" << K << " M=" << M);
      const int64_t ldx = K + 2;
      std::vector<float> x = make_x(rng, M, ldx, true);
      for (int64_t i = 40; i < std::min<int64_t>(M * ldx, 60); ++i) x[size_t(i)] = float(i % 5) * 0.25f;  // ties
      kern::detail::QuantActs a, b;
      kern::detail::quantize_acts(x.data(), M, ldx, K, a, false);
      kern::detail::quantize_acts(x.data(), M, ldx, K, b, true);
      EXPECT_EQ(a.xq, b.xq);
      EXPECT_EQ(a.corr, b.corr);
      EXPECT_EQ(std::memcmp(a.dx.data(), b.dx.data(), a.dx.size() * 4), 0);
      EXPECT_EQ(std::memcmp(a.sxdx.data(), b.sxdx.data(), a.sxdx.size() * 4), 0);
    }
  }
}

// The decode bodies load the quantized activations 64 bytes at a time: their buffers start on a cache
// line (core/aligned.h), whatever M and K. (With std::vector storage they began 16 bytes into a line
// and the q4 AR frame ran 287 instead of 222 ms.)
TEST(KernelsQuant, ActivationBuffersStartOnCacheLines) {
  Rng rng(10);
  std::vector<kern::detail::QuantActs> keep(12);  // alive together, so each gets fresh heap addresses
  size_t i = 0;
  for (int64_t K : {17, 512, 4096, 6144, 12288, 1037})
    for (int64_t M : {1, 2}) {
      const std::vector<float> x = make_x(rng, M, K, false);
      kern::detail::QuantActs& a = keep[i++];
      kern::detail::quantize_acts(x.data(), M, K, K, a);
      for (const void* p : {static_cast<const void*>(a.xq.data()), static_cast<const void*>(a.dx.data()),
                            static_cast<const void*>(a.corr.data()), static_cast<const void*>(a.sxdx.data())})
        EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << "K=" << K << " M=" << M;
    }
}

// fp32 summation bound of the decode product: each lane is an FMA chain over S superblocks plus a
// 4-level tree, the integer part is exact; a few ulps of sum |terms| per step.
double gemv_tol(const QuantMatrix& q, const float* xr, int64_t n, double e, DType store, bool prefill) {
  double s = 0;
  for (int64_t k = 0; k < q.cols(); ++k) s += std::fabs(double(q.value(n, k)) * xr[k]) * (1 + 1.0 / 64);
  const double steps = prefill ? double(q.cols()) : double(q.superblocks() * 2 + 8);
  double t = (steps + 4) * test::kEps32 * s + 1e-30;
  if (store == DType::BF16) t += test::bf16_ulp(static_cast<float>(e));
  return t;
}

void check_gemv(const ThreadPool& pool, QuantType t, int64_t M, const Size& s, DType store, bool with_bias, Rng& rng) {
  SCOPED_TRACE(::testing::Message() << kern::quant_name(t) << " M=" << M << " N=" << s.N << " K=" << s.K
                                    << " store=" << test::store_name(store) << " bias=" << with_bias);
  const Tensor w = make_weight(rng, s.N, s.K, DType::BF16);
  auto q = kern::quantize_weight(pool, w, t);
  const int64_t ldx = s.K + 5, ldy = s.N + 3;
  const std::vector<float> x = make_x(rng, M, ldx, store == DType::BF16);
  std::vector<float> bias = rng.vec(static_cast<size_t>(s.N), -1.f, 1.f, true);
  const float* b = with_bias ? bias.data() : nullptr;
  std::vector<float> ref(static_cast<size_t>(M * s.N));
  ref::quant_linear(x.data(), M, ldx, *q, b, ref.data(), s.N, store);

  std::vector<Guarded> outs;
  std::vector<QuantIsa> isas = {QuantIsa::Scalar};
  for (QuantIsa isa : {QuantIsa::Avx512Vnni, QuantIsa::Avx2, QuantIsa::AvxVnni})
    if (kern::detail::quant_isa_available(isa)) isas.push_back(isa);
  for (QuantIsa isa : isas) {
    outs.emplace_back(M, s.N, ldy);
    Guarded& y = outs.back();
    if (M <= 4)
      kern::detail::quant_gemv(pool, x.data(), M, ldx, *q, b, y.data(), ldy, store, isa);
    else
      kern::detail::quant_gemm(pool, x.data(), M, ldx, *q, b, y.data(), ldy, store);
    EXPECT_EQ(y.touched_outside(), 0);
    EXPECT_EQ(y.untouched_inside(), 0);
    const int64_t bad = test::count_violations("quant linear", y.data(), ldy, ref.data(), M, s.N,
                                               [&](int64_t m, int64_t n, float e) {
                                                 return gemv_tol(*q, x.data() + m * ldx, n, e, store, M > 4) +
                                                        (b ? test::kEps32 * std::fabs(b[n]) : 0.0);
                                               });
    EXPECT_EQ(bad, 0) << "isa " << int(isa);
    if (store == DType::BF16) {
      EXPECT_EQ(test::count_non_bf16(y.data(), ldy, M, s.N), 0);
    }
  }
  // The strip form (AVX512-VNNI): the same bits as the row form's paths (the prefill dequantizes from it).
  std::shared_ptr<const QuantMatrix> qs;
  if (kern::quant_strips_offered()) {
    qs = kern::with_strips(pool, *q);
    Guarded ys(M, s.N, ldy);
    if (M <= 4)
      kern::detail::quant_gemv(pool, x.data(), M, ldx, *qs, b, ys.data(), ldy, store, QuantIsa::Avx512Vnni);
    else
      kern::detail::quant_gemm(pool, x.data(), M, ldx, *qs, b, ys.data(), ldy, store);
    EXPECT_EQ(ys.touched_outside(), 0) << "strip form";
    EXPECT_EQ(ys.untouched_inside(), 0) << "strip form";
    EXPECT_EQ(bit_diffs(outs.back(), ys, M, s.N), 0) << "the strip form and the row form must give the same bits";
    outs.push_back(std::move(ys));
    isas.push_back(QuantIsa::Avx512Vnni);
  }
  if (M <= 4) {
    for (size_t i = 1; i < outs.size(); ++i) {
      EXPECT_EQ(bit_diffs(outs[0], outs[i], M, s.N), 0)
          << "the scalar path and isa " << int(isas[i])
          << " (2 AVX512-VNNI, 3 AVX2, 4 AVX-VNNI; the last AVX512-VNNI on the strip form) must give the same bits";
    }
  }
  // kern::linear with a quantized LinearWeight dispatches to these paths.
  const kern::LinearWeight lw(qs ? qs : q, with_bias ? Tensor::from_f32(bias, {s.N}) : Tensor());
  Guarded z(M, s.N, ldy);
  kern::linear(pool, x.data(), M, ldx, lw, z.data(), ldy, store);
  EXPECT_EQ(bit_diffs(z, outs.back(), M, s.N), 0) << "kern::linear dispatch";
}

// The strip form holds the row form's bytes where quant.h says: byte 64g + 4r + i of block (l, s) of
// strip j is byte 64g + 4l + i of row 16j + r's superblock s, the scales likewise, and the rows past N
// are codes of value 0 with d = m = 0. N = 37 (a strip of 5 real rows), K = 1037 (3 superblocks).
// RED: a pack writing row r's words at 4l instead of 4r fails the bytes; one leaving the padding's
// codes 0 for int8 (value −128, not 0) fails the padding.
TEST(KernelsQuant, StripFormHoldsTheRowFormsBytes) {
  if (!kern::quant_strips_offered()) GTEST_SKIP() << "no AVX512-VNNI on this CPU: the strip form has no GEMV here";
  ThreadPool pool(2);
  Rng rng(12);
  const int64_t N = 37, K = 1037;
  for (QuantType t : kTypes) {
    SCOPED_TRACE(kern::quant_name(t));
    auto q = kern::quantize_weight(pool, make_weight(rng, N, K, DType::F32), t);
    auto qs = kern::with_strips(pool, *q);
    const kern::QuantStrips* st = qs->strips();
    ASSERT_NE(st, nullptr);
    EXPECT_TRUE(same_bytes(*q, *qs)) << "the row form stays as it was";
    const bool i8 = t == QuantType::Int8;
    const int64_t S = q->superblocks(), B = i8 ? 512 : 256, E = i8 ? 16 : 32;
    ASSERT_EQ(st->strips, 3);
    ASSERT_EQ(st->S, S);
    int64_t bad_bytes = 0, bad_scales = 0, bad_pad = 0;
    for (int64_t j = 0; j < st->strips; ++j)
      for (int64_t l = 0; l < 16; ++l)
        for (int64_t s = 0; s < S; ++s)
          for (int64_t r = 0; r < 16; ++r) {
            const int64_t n = 16 * j + r;
            const uint8_t* blk = st->block(j, l) + s * B;
            const uint16_t* sc = st->block_scales_at(j, l) + s * E;
            for (int64_t g = 0; g < B / 64; ++g)
              for (int64_t i = 0; i < 4; ++i) {
                const uint8_t got = blk[64 * g + 4 * r + i];
                if (n < N)
                  bad_bytes += got != q->qs_row(n)[s * B + 64 * g + 4 * l + i];
                else
                  bad_pad += got != (i8 ? 128 : 0);
              }
            for (int64_t e = 0; e < (i8 ? 1 : 2); ++e) {
              const uint16_t got = sc[16 * e + r];
              if (n < N)
                bad_scales += got != q->scales_row(n)[E * s + 16 * e + l];
              else
                bad_pad += got != 0;
            }
          }
    EXPECT_EQ(bad_bytes, 0);
    EXPECT_EQ(bad_scales, 0);
    EXPECT_EQ(bad_pad, 0);
  }
}

TEST(KernelsQuant, GemvMatchesRefEveryIsa) {
  ThreadPool pool(2);
  Rng rng(5);
  // K up to 5121: 1..11 superblocks for every M (the VNNI body's chain splits C = 4 / 4 / 2 / 2 for M =
  // 1..4, 2 / 1 side by side); the 4-rows-side-by-side body runs where M <= 2 rows of
  // quantized activations fill more than half the L1D (quant.cpp): K = 8200 (17 superblocks) at M = 2
  // on a 32 KiB L1D, and K_long at M = 1 and 2 on any; N = 7 runs its one-row tail as well.
  const int64_t k_long = kern::detail::cpu_l1d_bytes() / 2 + 700;
  for (QuantType t : kTypes)
    for (int64_t M : {1, 2, 3, 4})
      for (const Size& s : {Size{1, 1}, Size{3, 31}, Size{29, 100}, Size{9, 513}, Size{33, 1037}, Size{6, 2048},
                            Size{5, 3583}, Size{3, 4608}, Size{2, 5121}, Size{7, 8200}, Size{7, k_long}})
        for (DType store : {DType::F32, DType::BF16}) check_gemv(pool, t, M, s, store, (M + s.N) % 2 == 0, rng);
}

TEST(KernelsQuant, PrefillMatchesRef) {
  ThreadPool pool(2);
  Rng rng(6);
  for (QuantType t : kTypes)
    for (int64_t M : {5, 7, 37})
      for (const Size& s : {Size{3, 31}, Size{29, 100}, Size{130, 513}, Size{300, 64}})
        for (DType store : {DType::F32, DType::BF16}) check_gemv(pool, t, M, s, store, M == 7, rng);
}

// Same call twice is bitwise equal, and so is the result with 1 and 2 threads, on every path. N = 250
// (2-thread chunks of 125 rows do not split into 4-row groups as one chunk does). The data make the
// fp32 order visible: the activations of each row span 2^-12..2^12 across blocks, and the last
// superblock's lanes nearly cancel the sum of the first ones.
TEST(KernelsQuant, DeterministicAndThreadCountIndependent) {
  ThreadPool p1(1), p2(2);
  Rng rng(77);
  const int64_t N = 250, K = 1037;
  for (QuantType t : kTypes) {
    const Tensor w = make_weight(rng, N, K, DType::F32);
    auto q = kern::quantize_weight(p2, w, t);
    auto q1 = kern::quantize_weight(p1, w, t);
    EXPECT_TRUE(same_bytes(*q, *q1)) << "quantizer depends on the thread count";
    const kern::LinearWeight lw(q);
    for (int64_t M : {1, 2, 3, 4, 6, 40}) {
      SCOPED_TRACE(::testing::Message() << kern::quant_name(t) << " M=" << M);
      std::vector<float> x = rng.vec(static_cast<size_t>(M * K), -1.f, 1.f, true);
      for (int64_t i = 0; i < M * K; ++i) x[size_t(i)] = std::ldexp(x[size_t(i)], int((i / 32) % 25) - 12);
      for (DType store : {DType::F32, DType::BF16}) {
        std::vector<float> a(static_cast<size_t>(M * N)), b(a.size()), c(a.size());
        kern::linear(p2, x.data(), M, K, lw, a.data(), N, store);
        kern::linear(p2, x.data(), M, K, lw, b.data(), N, store);
        kern::linear(p1, x.data(), M, K, lw, c.data(), N, store);
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "two identical calls differ";
        EXPECT_EQ(std::memcmp(a.data(), c.data(), a.size() * 4), 0) << "1 and 2 threads differ";
        if (M <= 4) {
          std::vector<float> d(a.size());
          kern::detail::quant_gemv(p1, x.data(), M, K, *q, nullptr, d.data(), N, store, QuantIsa::Scalar);
          EXPECT_EQ(std::memcmp(a.data(), d.data(), a.size() * 4), 0) << "scalar path differs";
        }
      }
    }
  }
}

// The approximation itself: against the exact fp32 product of the original weights, int8 stays
// within ~1 % and q4 within ~10 % relative RMS on Gaussian-like data (smoke bound, not a gate).
TEST(KernelsQuant, ApproximatesTheDenseProduct) {
  ThreadPool pool(2);
  Rng rng(8);
  const int64_t N = 64, K = 4096, M = 2;
  std::vector<float> wv(static_cast<size_t>(N * K));
  for (auto& v : wv) v = (rng.uni(-1, 1) + rng.uni(-1, 1) + rng.uni(-1, 1)) * 0.02f;
  const Tensor w = Tensor::from_f32(wv, {N, K});
  std::vector<float> x(static_cast<size_t>(M * K));
  for (auto& v : x) v = round_bf16(rng.uni(-1, 1) + rng.uni(-1, 1));
  std::vector<double> exact(static_cast<size_t>(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += double(x[size_t(m * K + k)]) * wv[size_t(n * K + k)];
      exact[size_t(m * N + n)] = s;
    }
  for (QuantType t : kTypes) {
    const kern::LinearWeight lw(kern::quantize_weight(pool, w, t));
    std::vector<float> y(static_cast<size_t>(M * N));
    kern::linear(pool, x.data(), M, K, lw, y.data(), N, DType::F32);
    double se = 0, sr = 0;
    for (size_t i = 0; i < y.size(); ++i) se += (y[i] - exact[i]) * (y[i] - exact[i]), sr += exact[i] * exact[i];
    const double rel = std::sqrt(se / sr);
    EXPECT_LT(rel, t == QuantType::Int8 ? 0.01 : 0.10) << kern::quant_name(t);
    std::printf("[          ] %s rel_rms vs dense fp32: %.4g\n", kern::quant_name(t), rel);
  }
}

TEST(KernelsQuant, RejectsMismatchedTensors) {
  Tensor qs = Tensor::zeros(DType::I32, {3, 512 / 4});
  Tensor sc = Tensor::zeros(DType::F16, {3, 16});
  EXPECT_NO_THROW(QuantMatrix(QuantType::Int8, 3, 100, qs, sc));
  EXPECT_THROW(QuantMatrix(QuantType::Q4, 3, 100, qs, sc), InternalError);     // q4 rows are 256 bytes
  EXPECT_THROW(QuantMatrix(QuantType::Int8, 4, 100, qs, sc), InternalError);   // rows
  EXPECT_THROW(QuantMatrix(QuantType::Int8, 3, 600, qs, sc), InternalError);   // Kp 1024
  EXPECT_THROW(QuantMatrix(QuantType::Int8, 3, 100, qs, Tensor::zeros(DType::F32, {3, 16})), InternalError);
  ThreadPool pool(1);
  std::vector<float> bad = {1.f, NAN, 0.f, 2.f};
  EXPECT_THROW(kern::quantize_weight(pool, Tensor::from_f32(bad, {2, 2}), QuantType::Int8), InvalidInput);
  EXPECT_EQ(kern::quant_from_name("q4"), QuantType::Q4);
  EXPECT_EQ(kern::quant_from_name("int8"), QuantType::Int8);
  EXPECT_FALSE(kern::quant_from_name("int3").has_value());
}

}  // namespace
}  // namespace mm3
