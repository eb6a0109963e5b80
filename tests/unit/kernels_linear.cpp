// kernels_linear.cpp — kern::linear and kern::gemm_f32 against their ref twins (ref/ref_kernels.h),
// torch bf16 linear bit patterns, and the determinism contract (kernels.h; ARCHITECTURE.md habit 11).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <tuple>
#include <vector>

#include "core/aligned.h"
#include "kernels/cpu/gemm_nt.h"
#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "kernels/ref/ref_kernels.h"
#include "kernels/tuning.h"
#include "kernels_util.h"

namespace mm3 {
namespace {

using test::Guarded;
using test::Rng;

struct LinCase {
  int64_t M, K, N;
};

// Builds a LinearWeight [N, K] of the given dtype (values bf16-representable either way when
// bf16_values, so an F32 and a BF16 weight can hold the same numbers).
kern::LinearWeight make_weight(Rng& rng, int64_t N, int64_t K, DType wdt, bool with_bias, DType bdt) {
  std::vector<float> w = rng.vec(static_cast<size_t>(N * K), -1.f, 1.f, true);
  Tensor wt = Tensor::from_f32(w, {N, K});
  if (wdt == DType::BF16) wt = wt.to(DType::BF16);
  Tensor bt;
  if (with_bias) {
    bt = Tensor::from_f32(rng.vec(static_cast<size_t>(N), -1.f, 1.f, true), {N});
    if (bdt == DType::BF16) bt = bt.to(DType::BF16);
  }
  return kern::LinearWeight(wt, bt);
}

float weight_value(const kern::LinearWeight& w, int64_t i) {
  return w.weight().dtype() == DType::BF16 ? bf16_bits_to_f32(static_cast<const uint16_t*>(w.weight().raw())[i])
                                           : w.weight().data<float>()[i];
}

void check_linear(const ThreadPool& pool, const LinCase& c, DType wdt, DType store, bool with_bias, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "M=" << c.M << " K=" << c.K << " N=" << c.N << " w=" << dtype_name(wdt)
                                    << " store=" << test::store_name(store) << " bias=" << with_bias);
  Rng rng(seed);
  const kern::LinearWeight w = make_weight(rng, c.N, c.K, wdt, with_bias, wdt);
  const int64_t ldx = c.K + 3, ldy = c.N + 5;
  // bf16 computations take bf16-valued inputs (kernels.h); fp32 ones take arbitrary floats.
  std::vector<float> x = rng.vec(static_cast<size_t>(c.M * ldx), -2.f, 2.f, store == DType::BF16);
  Guarded y(c.M, c.N, ldy);
  kern::linear(pool, x.data(), c.M, ldx, w, y.data(), ldy, store);
  std::vector<float> ref(static_cast<size_t>(c.M * c.N));
  ref::linear(pool, x.data(), c.M, ldx, w, ref.data(), c.N, store);

  EXPECT_EQ(y.touched_outside(), 0) << "wrote outside y's rows / guards";
  EXPECT_EQ(y.untouched_inside(), 0) << "left outputs unwritten";
  const float* bias = w.bias_f32();
  const int64_t bad = test::count_violations(
      "linear", y.data(), ldy, ref.data(), c.M, c.N, [&](int64_t m, int64_t n, float e) {
        // fp32 summation error bound: K/2 ulps of sum |terms| (worst-case recursive summation),
        // plus one bf16 spacing when the stored result may round the other way.
        double s = bias ? std::fabs(bias[n]) : 0.0;
        for (int64_t k = 0; k < c.K; ++k) s += std::fabs(double(x[m * ldx + k]) * weight_value(w, n * c.K + k));
        double t = (c.K + 2) * 0.5 * test::kEps32 * s;
        if (store == DType::BF16) t += test::bf16_ulp(e);
        return t;
      });
  EXPECT_EQ(bad, 0);
  if (store == DType::BF16) {
    EXPECT_EQ(test::count_non_bf16(y.data(), ldy, c.M, c.N), 0) << "bf16 store left unrounded values";
    // Rounding flips need a near-tie: most outputs must be bit-identical to the exact-then-round twin.
    EXPECT_LE(test::count_bit_diffs(y.data(), ldy, ref.data(), c.M, c.N), c.M * c.N / 10 + 1);
  }
}

const LinCase kCases[] = {{1, 37, 29}, {2, 37, 29}, {3, 37, 29}, {4, 64, 33},  {3, 1, 5},     {1, 15, 3},
                          {4, 97, 7},  {5, 37, 29}, {7, 100, 3}, {37, 129, 65}, {1, 512, 17}, {64, 300, 130},
                          {6, 1, 9},   {2, 33, 1}};

TEST(KernelsLinear, MatchesRefAllPathsAndDtypes) {
  ThreadPool pool(2);
  uint64_t seed = 1;
  for (const auto& c : kCases)
    for (DType wdt : {DType::F32, DType::BF16})
      for (DType store : {DType::F32, DType::BF16})
        for (bool bias : {false, true}) check_linear(pool, c, wdt, store, bias, seed++);
}

TEST(KernelsLinear, SingleThreadMatchesRef) {
  ThreadPool pool(1);
  uint64_t seed = 1000;
  for (const auto& c : {LinCase{3, 37, 29}, LinCase{37, 129, 65}})
    for (DType wdt : {DType::F32, DType::BF16})
      for (DType store : {DType::F32, DType::BF16}) check_linear(pool, c, wdt, store, true, seed++);
}

// torch 1.13 (CPU, mkldnn bf16): F.linear(x.bfloat16(), W.bfloat16(), b.bfloat16()) with
// x = [[1, 2^-8, 0, 0], [1, 3*2^-8, 0, 0], [1, 2^-8, 2^-16, 0]],
// W = [[1, 1, 1, 0], [1, -1, 1, 0], [-1, 1, -1, 0], [0.5, 1, 1, 1]], b = [0, 0, 0, 2^-9].
// The exact sums sit on bf16 ties (1 + 2^-8 -> 1, 1 + 3*2^-8 -> 1 + 2^-6) or just past one
// (1 + 2^-8 + 2^-16 -> 1 + 2^-7): fp32 accumulation, bias before rounding, ties to even.
TEST(KernelsLinear, Bf16TieRoundingMatchesTorch) {
  const uint16_t want[12] = {0x3f80, 0x3f7f, 0xbf7f, 0x3f02, 0x3f82, 0x3f7d,
                             0xbf7d, 0x3f04, 0x3f81, 0x3f7f, 0xbf7f, 0x3f02};
  const std::vector<float> x = {1, 1.f / 256, 0, 0, 1, 3.f / 256, 0, 0, 1, 1.f / 256, 1.f / 65536, 0};
  const std::vector<float> w = {1, 1, 1, 0, 1, -1, 1, 0, -1, 1, -1, 0, 0.5f, 1, 1, 1};
  const std::vector<float> b = {0, 0, 0, 1.f / 512};
  ThreadPool pool(2);
  for (DType wdt : {DType::F32, DType::BF16}) {
    Tensor wt = Tensor::from_f32(w, {4, 4}), bt = Tensor::from_f32(b, {4});
    if (wdt == DType::BF16) wt = wt.to(DType::BF16), bt = bt.to(DType::BF16);
    kern::LinearWeight lw(wt, bt);
    // 3 rows take the GEMV path; the same rows repeated to 6 take the GEMM path.
    for (int64_t reps : {1, 2}) {
      std::vector<float> xs;
      for (int r = 0; r < reps; ++r) xs.insert(xs.end(), x.begin(), x.end());
      const int64_t M = 3 * reps;
      std::vector<float> y(static_cast<size_t>(M * 4));
      kern::linear(pool, xs.data(), M, 4, lw, y.data(), 4, DType::BF16);
      for (int64_t i = 0; i < M * 4; ++i)
        EXPECT_EQ(f32_to_bf16_bits(y[i]), want[i % 12])
            << "w=" << dtype_name(wdt) << " M=" << M << " at " << i << " got " << y[i];
    }
  }
}

// Same call twice is bitwise equal, and so is the result with 1 and 2 threads, on both paths.
// N = 250: the 2-thread row chunks (125 each) do not split into the GEMV's 4-row groups the way
// one chunk does, so a row computed alone must give the same bits as inside a group.
// The data make summation order visible even through a bf16 store: magnitudes spread over
// 2^-12..2^12, and for x row 0 the last three weights of every row cancel the exact sum down to
// ~2^-24 of its terms, so the output is dominated by fp32 rounding of the partial sums (with plain
// [-1, 1] data most sums are exact, and any order would give the same bits).
// x [M, K] with magnitudes over 2^-12..2^12 and W [N, K] whose last 3 weights of each row (bf16 values)
// cancel its sum against x's first row almost exactly, so that another summation order, or a block
// taken from the wrong bytes, changes bits even through a bf16 store.
void cancelling_gemv_data(Rng& rng, int64_t M, int64_t N, int64_t K, std::vector<float>& x, std::vector<float>& wv) {
  x = rng.vec(static_cast<size_t>(M * K), -1.f, 1.f, true);
  for (auto& v : x) v = std::ldexp(v, static_cast<int>(rng.int_in(-12, 12)));
  wv = rng.vec(static_cast<size_t>(N * K), -1.f, 1.f, true);
  for (int64_t n = 0; n < N; ++n) {
    double part = 0;
    for (int64_t k = 0; k < K - 3; ++k) part += double(x[k]) * wv[n * K + k];
    for (int64_t k = K - 3; k < K; ++k) {
      wv[n * K + k] = round_bf16(static_cast<float>(-part / x[k]));
      part += double(x[k]) * wv[n * K + k];
    }
  }
}

TEST(KernelsLinear, DeterministicAndThreadCountIndependent) {
  ThreadPool p1(1), p2(2);
  Rng rng(77);
  const int64_t N = 250, K = 517;
  for (DType wdt : {DType::F32, DType::BF16})
    for (DType store : {DType::F32, DType::BF16})
      for (int64_t M : {1, 3, 4, 6, 40}) {
        SCOPED_TRACE(::testing::Message() << "w=" << dtype_name(wdt) << " store=" << test::store_name(store)
                                          << " M=" << M);
        std::vector<float> x, wv;
        cancelling_gemv_data(rng, M, N, K, x, wv);
        Tensor wt = Tensor::from_f32(wv, {N, K});
        if (wdt == DType::BF16) wt = wt.to(DType::BF16);
        const kern::LinearWeight w(wt);
        std::vector<float> a(static_cast<size_t>(M * N)), b(a.size()), c(a.size());
        kern::linear(p2, x.data(), M, K, w, a.data(), N, store);
        kern::linear(p2, x.data(), M, K, w, b.data(), N, store);
        kern::linear(p1, x.data(), M, K, w, c.data(), N, store);
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "two identical calls differ";
        EXPECT_EQ(std::memcmp(a.data(), c.data(), a.size() * 4), 0) << "1 and 2 threads differ";
      }
}

// A bf16 weight used in place from a safetensors file starts wherever the file's header put it (the
// synthetic full checkpoint: 16 or 48 bytes past a cache line). Its GEMV (M <= 4) builds each block
// from the aligned lines it overlaps when that offset is whole 4-byte units and K a multiple of 32
// (linear.cpp, gemv_rows_bf16; AVX512-BF16 CPUs, elsewhere the contract holds trivially): the outputs
// must be bitwise those of the same weight on a line, for every offset. The data are
// DeterministicAndThreadCountIndependent's (cancelling sums), so a block taken from the wrong bytes or
// summed in another order changes bits even through the bf16 store. RED: shifting the permute's index
// by one element pair (idx base SH - 1) fails 120 cases (every 4-byte offset, K 96 and 64, M 1-4).
TEST(KernelsLinear, Bf16GemvSameBitsWhereverTheWeightSitsInALine) {
  ThreadPool pool(2);
  Rng rng(123);
  const int64_t N = 13;
  for (int64_t K : {96, 64, 517})
    for (int64_t M : {1, 2, 3, 4}) {
      std::vector<float> x, wv;
      cancelling_gemv_data(rng, M, N, K, x, wv);
      const Tensor plain = Tensor::from_f32(wv, {N, K}).to(DType::BF16);
      std::vector<float> want(static_cast<size_t>(M * N));
      kern::linear(pool, x.data(), M, K, kern::LinearWeight(plain), want.data(), N, DType::BF16);
      for (int64_t at = 2; at < 64; at += 2) {  // bytes past a cache line
        SCOPED_TRACE(::testing::Message() << "K=" << K << " M=" << M << " weight at line + " << at << " B");
        auto buf = std::make_shared<aligned_vector<uint16_t>>(static_cast<size_t>(N * K + 64), uint16_t(0xFFC1));
        uint16_t* w = buf->data() + at / 2;
        std::memcpy(w, plain.raw(), plain.nbytes());
        const Tensor placed = Tensor::borrow(DType::BF16, {N, K}, w, buf);
        std::vector<float> got(want.size(), -7.f);
        kern::linear(pool, x.data(), M, K, kern::LinearWeight(placed), got.data(), N, DType::BF16);
        EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0);
      }
    }
}

// The bf16 GEMV walks rows one after another, or 4, 8 or 12 side by side (12 on Zen 4 for M <= 2, 8
// for M = 3, 4) where the M bf16 rows of x outgrow a quarter of the L1D (linear.cpp, gemv_bf16_span);
// rows past the last group of 12 go 8, then 4 side by side, then alone. Every row must come out bitwise
// as a one-row weight of it gives it, in both regimes (K below and above the threshold, K a multiple of
// 32 and not); ctest runs this with each gemv_rows value forced as well (kernels_bf16_gemv_rows_{1,4,8,12}).
// RED: the 4-row body's masked tail into chain 1 fails the long-K cases; so does the same slip for rows
// 4-7 of the 8-row body only, under MM3_GEMV_ROWS=8 and by default on Zen 4 (M = 1, K = 4133); and the
// 12-row body keeping two chains per (row, m) for M = 2 (the old count) fails under MM3_GEMV_ROWS=12
// and by default on Zen 4.
TEST(KernelsLinear, Bf16GemvRowsSideBySideSameBitsAsAlone) {
  ThreadPool p1(1), p2(2);  // one thread: all N rows in one chunk; two: chunks split them differently
  Rng rng(321);
  // In one chunk: 12 and 8 side by side, then 3 alone (gemv_rows 8: 8, 8, 4, 3; 4: five groups of 4, 3).
  const int64_t N = 23;
  const int64_t l1d = kern::detail::cpu_l1d_bytes();
  for (int64_t M : {1, 2, 3, 4})
    for (int64_t K : {int64_t(96), int64_t(517), l1d / (8 * M) / 32 * 32 + 64, l1d / (8 * M) + 37}) {
      SCOPED_TRACE(::testing::Message() << "M=" << M << " K=" << K << " (L1D " << l1d << " B)");
      std::vector<float> x, wv;
      cancelling_gemv_data(rng, M, N, K, x, wv);
      const Tensor w = Tensor::from_f32(wv, {N, K}).to(DType::BF16);
      for (const ThreadPool* pool : {&p1, &p2}) {
        std::vector<float> all(static_cast<size_t>(M * N), -7.f);
        kern::linear(*pool, x.data(), M, K, kern::LinearWeight(w), all.data(), N, DType::BF16);
        for (int64_t n = 0; n < N; ++n) {
          auto row = std::make_shared<aligned_vector<uint16_t>>(static_cast<size_t>(K));
          std::memcpy(row->data(), static_cast<const uint16_t*>(w.raw()) + n * K, size_t(K) * 2);
          const Tensor one = Tensor::borrow(DType::BF16, {1, K}, row->data(), row);
          std::vector<float> got(static_cast<size_t>(M), -7.f);
          kern::linear(*pool, x.data(), M, K, kern::LinearWeight(one), got.data(), 1, DType::BF16);
          for (int64_t m = 0; m < M; ++m)
            EXPECT_EQ(std::memcmp(&got[size_t(m)], &all[size_t(m * N + n)], 4), 0)
                << "row " << n << " m " << m << ", " << pool->size() << " thread(s)";
        }
      }
    }
}

// The AVX2 decode GEMV (CPUs without AVX-512; ctest's kernels_baseline_isa_avx2 runs it on any
// machine): one output in the order linear.cpp (gemv_rows_avx2) states, computed here value by value.
// 8 lanes; per whole 16 k: F32 weights, lane j of chain 0 takes k + j and of chain 1 k + 8 + j; BF16
// weights, lane j of the one chain takes k + 2j, then k + 2j + 1. Then the lanes reduced (chain 1 added
// first), j + 4, then + 2, then + 1, and the K % 16 tail (one FMA chain from 0) added last.
float avx2_gemv_order(const float* x, const float* w, int64_t K, bool bf16_weights) {
  float c0[8] = {}, c1[8] = {};
  int64_t k = 0;
  for (; k + 16 <= K; k += 16)
    for (int j = 0; j < 8; ++j) {
      if (bf16_weights) {
        c0[j] = std::fma(x[k + 2 * j], w[k + 2 * j], c0[j]);
        c0[j] = std::fma(x[k + 2 * j + 1], w[k + 2 * j + 1], c0[j]);
      } else {
        c0[j] = std::fma(x[k + j], w[k + j], c0[j]);
        c1[j] = std::fma(x[k + 8 + j], w[k + 8 + j], c1[j]);
      }
    }
  float tail = 0.f;
  for (; k < K; ++k) tail = std::fma(x[k], w[k], tail);
  float s[8];
  for (int j = 0; j < 8; ++j) s[j] = bf16_weights ? c0[j] : c0[j] + c1[j];
  float h[4];
  for (int j = 0; j < 4; ++j) h[j] = s[j] + s[j + 4];
  const float r = (h[0] + h[2]) + (h[1] + h[3]);
  return r + tail;
}

// Every form of the AVX2 body (1-8 weight rows side by side, for bf16 weights x from its bf16 copy or
// split, each prefetch) gives exactly that order's bits: every M, K below and above 16 and long ones,
// F32 and BF16 weights and stores, one and two threads; and an x off the bf16 grid in a bf16
// computation (a caller breaking the convention) is not rounded into the copy.
// RED: the bf16 weights' odd half summed into a second chain (the F32 order), the 6-row body's tail of
// row 5 taken from row 4's weights, and the bf16 copy taken without its exactness check each fail here.
TEST(KernelsLinear, Avx2GemvEveryFormInItsStatedOrder) {
  if (!kern::detail::cpu_has_avx2_fma() || kern::detail::cpu_has_avx512())
    GTEST_SKIP() << "the decode GEMV dispatches to " << (kern::detail::cpu_has_avx512() ? "AVX-512" : "scalar")
                 << " here, not AVX2 (ctest's kernels_baseline_isa_avx2 runs this under MM3_ISA=avx2)";
  using kern::tuning::Knob;
  const Knob knobs[] = {Knob::Avx2GemvRows, Knob::Avx2GemvXb, Knob::GemvPrefetch};
  int before[3];
  for (int i = 0; i < 3; ++i) before[i] = kern::tuning::forced(knobs[i]);
  ThreadPool p1(1), p2(2);
  Rng rng(555);
  const int64_t N = 23;  // e.g. M = 2: 6, 6, 6, 4, then 1 (rows 6); 3 x 3 ... (rows 3)
  for (int64_t M : {1, 2, 3, 4})
    for (int64_t K : {int64_t(7), int64_t(16), int64_t(37), int64_t(517), int64_t(4133)})
      for (DType wdt : {DType::F32, DType::BF16})
        for (DType store : {DType::F32, DType::BF16})
          for (bool bf16_x : {true, false}) {
            if (store == DType::F32 && bf16_x) continue;  // an fp32 computation: arbitrary x
            SCOPED_TRACE(::testing::Message() << "M=" << M << " K=" << K << " w=" << dtype_name(wdt)
                                              << " store=" << test::store_name(store) << " bf16 x=" << bf16_x);
            std::vector<float> x, wv;
            cancelling_gemv_data(rng, M, N, K, x, wv);
            if (!bf16_x)  // values off the bf16 grid
              for (int64_t i = 0; i < M * K; i += 5) x[size_t(i)] *= 1.0f + 1.0f / 1024;
            Tensor wt = Tensor::from_f32(wv, {N, K});
            if (wdt == DType::BF16) wt = wt.to(DType::BF16);
            const kern::LinearWeight w(wt);
            std::vector<float> want(static_cast<size_t>(M * N));
            for (int64_t m = 0; m < M; ++m)
              for (int64_t n = 0; n < N; ++n)
                want[size_t(m * N + n)] =
                    round_store(avx2_gemv_order(x.data() + m * K, wv.data() + n * K, K, wdt == DType::BF16), store);
            for (int rows : {1, 2, 3, 4, 6, 8})
              for (int xb : {0, 1})
                for (int pf : {-1, 0, 1})
                  for (const ThreadPool* pool : {&p1, &p2}) {
                    if (pf >= 0 && (rows != 6 || pool != &p2)) continue;  // the prefetch changes no value
                    kern::tuning::force(Knob::Avx2GemvRows, rows);
                    kern::tuning::force(Knob::Avx2GemvXb, xb);
                    kern::tuning::force(Knob::GemvPrefetch, pf);
                    std::vector<float> got(want.size(), -7.f);
                    kern::linear(*pool, x.data(), M, K, w, got.data(), N, store);
                    EXPECT_EQ(test::count_bit_diffs(got.data(), N, want.data(), M, N), 0)
                        << "avx2_gemv_rows=" << rows << " avx2_gemv_xb=" << xb << " gemv_prefetch=" << pf << ", "
                        << pool->size() << " thread(s)";
                  }
          }
  for (int i = 0; i < 3; ++i) kern::tuning::force(knobs[i], before[i]);
}

// The AVX-512 body for bf16 weights where the CPU lacks AVX512-BF16 (gemv_rows_split512: Skylake-SP,
// Cascade Lake, Ice Lake; ctest's kernels_linear_isa_avx512 runs this under MM3_ISA=avx512 on any
// AVX-512 machine), in a bf16 computation with x on the bf16 grid: one output in the order linear.cpp
// states, computed here value by value. 16 lanes; per whole 32 k lane j takes k + 2j, then k + 2j + 1;
// the lanes reduced j + 8, then + 4, + 2, + 1; the K % 32 tail (one FMA chain from 0) added last.
float split512_order(const float* x, const float* w, int64_t K) {
  float c[16] = {};
  int64_t k = 0;
  for (; k + 32 <= K; k += 32)
    for (int j = 0; j < 16; ++j) {
      c[j] = std::fma(x[k + 2 * j], w[k + 2 * j], c[j]);
      c[j] = std::fma(x[k + 2 * j + 1], w[k + 2 * j + 1], c[j]);
    }
  float tail = 0.f;
  for (; k < K; ++k) tail = std::fma(x[k], w[k], tail);
  float a[8], b[4];
  for (int j = 0; j < 8; ++j) a[j] = c[j] + c[j + 8];
  for (int j = 0; j < 4; ++j) b[j] = a[j] + a[j + 4];
  return ((b[0] + b[2]) + (b[1] + b[3])) + tail;
}

// Every form (1-12 rows side by side through the knob gemv_rows, each prefetch choice, one and two
// threads) gives exactly that order's bits, for M 1-4 and K below and above 32 and long; an x off the
// bf16 grid takes gemv_avx512 instead (checked only to stay within the fp32 bound of the reference).
// RED: the odd half summed before the even one, the 12-row body's tail of row 11 from row 10's weights,
// and the copy taken without its exactness check each fail here.
TEST(KernelsLinear, Split512GemvEveryFormInItsStatedOrder) {
  if (!kern::detail::cpu_has_avx512() || kern::detail::cpu_has_avx512bf16())
    GTEST_SKIP() << "bf16 decode GEMVs take " << (kern::detail::cpu_has_avx512() ? "AVX512-BF16" : "no AVX-512")
                 << " here, not the AVX-512 fp32 body (ctest's kernels_linear_isa_avx512 runs this under "
                    "MM3_ISA=avx512)";
  using kern::tuning::Knob;
  const int rows_before = kern::tuning::forced(Knob::GemvRows), pf_before = kern::tuning::forced(Knob::GemvPrefetch);
  ThreadPool p1(1), p2(2);
  Rng rng(556);
  const int64_t N = 27;  // M <= 2: 12, 12, then 2 + 1 (rows 12); 8, 8, 8, 2, 1 (rows 8)
  for (int64_t M : {1, 2, 3, 4})
    for (int64_t K : {int64_t(7), int64_t(32), int64_t(45), int64_t(517), int64_t(4133)})
      for (bool bf16_x : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "M=" << M << " K=" << K << " bf16 x=" << bf16_x);
        std::vector<float> x, wv;
        cancelling_gemv_data(rng, M, N, K, x, wv);
        if (!bf16_x)
          for (int64_t i = 0; i < M * K; i += 5) x[size_t(i)] *= 1.0f + 1.0f / 1024;
        const kern::LinearWeight w(Tensor::from_f32(wv, {N, K}).to(DType::BF16));
        // bf16 x: the stated order's bits. Off the grid: NOT the stated order on the rounded copy (what
        // skipping the exactness check gives), and within the fp32 bound of the exact sum.
        std::vector<float> xr(x.size());
        for (size_t i = 0; i < x.size(); ++i) xr[i] = round_bf16(x[i]);
        std::vector<float> want(static_cast<size_t>(M * N));
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n)
            want[size_t(m * N + n)] = round_bf16(split512_order(xr.data() + m * K, wv.data() + n * K, K));
        for (int rows : {1, 4, 8, 12})
          for (int pf : {-1, 0, 1})
            for (const ThreadPool* pool : {&p1, &p2}) {
              if (pf >= 0 && (rows != 12 || pool != &p2)) continue;  // the prefetch changes no value
              kern::tuning::force(Knob::GemvRows, rows);
              kern::tuning::force(Knob::GemvPrefetch, pf);
              std::vector<float> got(want.size(), -7.f);
              kern::linear(*pool, x.data(), M, K, w, got.data(), N, DType::BF16);
              const int64_t diffs = test::count_bit_diffs(got.data(), N, want.data(), M, N);
              if (bf16_x) {
                EXPECT_EQ(diffs, 0) << "gemv_rows=" << rows << " gemv_prefetch=" << pf << ", " << pool->size()
                                    << " thread(s)";
              } else {
                EXPECT_GT(diffs, 0) << "an x off the bf16 grid went through its rounded copy";
                for (int64_t m = 0; m < M; ++m)
                  for (int64_t n = 0; n < N; ++n) {
                    double exact = 0, mag = 0;
                    for (int64_t k = 0; k < K; ++k) {
                      exact += double(x[size_t(m * K + k)]) * wv[size_t(n * K + k)];
                      mag += std::fabs(double(x[size_t(m * K + k)]) * wv[size_t(n * K + k)]);
                    }
                    const float g = got[size_t(m * N + n)];
                    EXPECT_LE(std::fabs(g - exact), (K + 2) * 0.5 * test::kEps32 * mag + test::bf16_ulp(g))
                        << "m " << m << " n " << n;
                  }
              }
            }
      }
  kern::tuning::force(Knob::GemvRows, rows_before);
  kern::tuning::force(Knob::GemvPrefetch, pf_before);
}

// The GEMM path (M > 4) with fp32 products (F32 weights, or BF16 weights with an F32 store) keeps every
// output ONE sequential fp32 FMA chain over k = 0..K-1 (gemm_nt.h), whatever the ISA (AVX-512, AVX2,
// portable), the blocking (K blocks of 256, 8-row x 32-column tiles, AVX2 sub-tiles of 4 x 16) or
// the thread count: bitwise equal to that chain computed here. Magnitudes spread over 2^-12..2^12 so
// that another summation order (two accumulators, a K block folded differently) changes bits.
TEST(KernelsLinear, GemmIsOneSequentialFmaChain) {
  ThreadPool pool(2);
  Rng rng(31);
  for (auto [M, K, N] : {std::tuple<int64_t, int64_t, int64_t>{5, 1, 3},
                         {8, 255, 33},
                         {9, 256, 31},
                         {13, 257, 64},
                         {37, 700, 130},
                         {6, 513, 17},
                         {10, 129, 40},  // row tails of 4 for the 6-row AVX2 tile
                         {22, 136, 47},
                         {7, 2100, 40}})  // K over 2 blocks of every tile (1024; AVX2: 256)
    for (DType wdt : {DType::F32, DType::BF16})
      for (DType store : {DType::F32, DType::BF16}) {
        if (wdt == DType::BF16 && store == DType::BF16) continue;  // bf16 pair dots where the CPU has them
        for (bool with_bias : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "M=" << M << " K=" << K << " N=" << N << " w=" << dtype_name(wdt)
                                            << " store=" << test::store_name(store) << " bias=" << with_bias);
          const kern::LinearWeight w = make_weight(rng, N, K, wdt, with_bias, DType::F32);
          const int64_t ldx = K + 1, ldy = N + 2;
          std::vector<float> x = rng.vec(static_cast<size_t>(M * ldx), -1.f, 1.f);
          for (auto& v : x) v = std::ldexp(v, static_cast<int>(rng.int_in(-12, 12)));
          Guarded y(M, N, ldy);
          kern::linear(pool, x.data(), M, ldx, w, y.data(), ldy, store);
          EXPECT_EQ(y.touched_outside(), 0);
          const float* bias = w.bias_f32();
          int64_t diffs = 0;
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) {
              float acc = 0.f;
              for (int64_t k = 0; k < K; ++k) acc = std::fma(x[size_t(m * ldx + k)], weight_value(w, n * K + k), acc);
              const float want = round_store(bias ? acc + bias[n] : acc, store);
              diffs += std::memcmp(&want, y.data() + m * ldy + n, 4) != 0;
            }
          EXPECT_EQ(diffs, 0);
        }
      }
}

// gemm_only_f32's panels form (onednn = false; kernels_linear_dnnl.cpp tests the oneDNN form): the
// weight packed once in the tile's panels. Every M (the GEMV's M <= 4 too) takes
// the GEMM on those panels, so each output is the same one sequential FMA chain as above, on 1 and 2
// threads; sizes cross panels (128 columns), strips (32) and K blocks (256, or the AVX2 tiles' 128).
TEST(KernelsLinear, PrepackedF32IsOneSequentialFmaChain) {
  ThreadPool p1(1), p2(2);
  Rng rng(57);
  for (auto [M, K, N] : {std::tuple<int64_t, int64_t, int64_t>{1, 700, 130},
                         {2, 257, 33},
                         {4, 129, 300},
                         {5, 1, 3},
                         {13, 513, 161},
                         {37, 300, 256},
                         {3, 2100, 70}})
    for (bool with_bias : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "M=" << M << " K=" << K << " N=" << N << " bias=" << with_bias);
      const kern::LinearWeight plain = make_weight(rng, N, K, DType::F32, with_bias, DType::F32);
      const kern::LinearWeight w = kern::gemm_only_f32(plain, p2, /*onednn=*/false);
      ASSERT_TRUE(w.f32_packed());
      ASSERT_EQ(w.gemm_kind(), kern::GemmKind::F32Panels);
      EXPECT_FALSE(w.gemm_packed());
      EXPECT_EQ(w.weight().raw(), nullptr) << "the plain tensor is not kept";
      EXPECT_EQ(w.out_features(), N);
      EXPECT_EQ(w.in_features(), K);
      const int64_t ldx = K + 1, ldy = N + 2;
      std::vector<float> x = rng.vec(static_cast<size_t>(M * ldx), -1.f, 1.f);
      for (auto& v : x) v = std::ldexp(v, static_cast<int>(rng.int_in(-12, 12)));
      for (const ThreadPool* pool : {&p1, &p2})
        for (DType store : {DType::F32, DType::BF16}) {
          Guarded y(M, N, ldy);
          kern::linear(*pool, x.data(), M, ldx, w, y.data(), ldy, store);
          EXPECT_EQ(y.touched_outside(), 0);
          EXPECT_EQ(y.untouched_inside(), 0);
          const float* bias = plain.bias_f32();
          int64_t diffs = 0;
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) {
              float acc = 0.f;
              for (int64_t k = 0; k < K; ++k) acc = std::fma(x[size_t(m * ldx + k)], weight_value(plain, n * K + k), acc);
              const float want = round_store(bias ? acc + bias[n] : acc, store);
              diffs += std::memcmp(&want, y.data() + m * ldy + n, 4) != 0;
            }
          EXPECT_EQ(diffs, 0) << "threads=" << pool->size() << " store=" << test::store_name(store);
        }
    }
}

// gemm_strassen_f32 (gemm_strassen.cpp): one level of Strassen over gemm_only_f32 forms (panels and,
// where oneDNN has a kernel, oneDNN's), against the exact product in double. Its products multiply sums
// of x's and W's quadrant blocks, so the bound is per output: with X4[j] = the sum of |x| over the
// output's row pair and both K halves at j (j < K/2), and W4[j] the same over its output pair,
// |error| <= 4 (K/2 + 3) eps sum_j X4[j] W4[j] (four products, each a K/2-term fp32 sum of rounded
// operand sums, then their combination), plus a bf16 ulp with a bf16 store. Odd M (a zero padding row),
// ld > width, bias or not, 1 and 2 threads; an odd N or K gets gemm_only_f32's form. RED: a sign flipped
// in one of the seven combinations (y_t2 = P2 - P4) gives errors of the outputs' own size (every case).
TEST(KernelsLinear, StrassenF32WithinItsBound) {
  ThreadPool p1(1), p2(2);
  Rng rng(91);
  for (auto [M, K, N] : {std::tuple<int64_t, int64_t, int64_t>{1, 2, 2},
                         {2, 18, 34},
                         {3, 66, 130},
                         {7, 512, 64},
                         {37, 130, 258},
                         {64, 64, 1024},
                         {130, 300, 96}})
    for (bool onednn : {false, true})
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << "M=" << M << " K=" << K << " N=" << N << " onednn=" << onednn << " bias=" << with_bias);
        const kern::LinearWeight plain = make_weight(rng, N, K, DType::F32, with_bias, DType::F32);
        const kern::LinearWeight w = kern::gemm_strassen_f32(plain, p2, onednn);
        ASSERT_EQ(w.gemm_kind(), kern::GemmKind::F32Strassen);
        EXPECT_EQ(w.weight().raw(), nullptr) << "the plain tensor is not kept";
        EXPECT_EQ(w.out_features(), N);
        EXPECT_EQ(w.in_features(), K);
        const int64_t ldx = K + 3, ldy = N + 5, k = K / 2, mt = (M + 1) / 2, n = N / 2;
        std::vector<float> x = rng.vec(static_cast<size_t>(M * ldx), -1.f, 1.f);
        for (auto& v : x) v = std::ldexp(v, static_cast<int>(rng.int_in(-6, 6)));
        auto xa = [&](int64_t m, int64_t kk) { return m < M ? std::fabs(double(x[size_t(m * ldx + kk)])) : 0.0; };
        auto wa = [&](int64_t r, int64_t kk) { return std::fabs(double(weight_value(plain, r * K + kk))); };
        const float* bias = plain.bias_f32();
        for (const ThreadPool* pool : {&p1, &p2})
          for (DType store : {DType::F32, DType::BF16}) {
            Guarded y(M, N, ldy);
            kern::linear(*pool, x.data(), M, ldx, w, y.data(), ldy, store);
            EXPECT_EQ(y.touched_outside(), 0);
            EXPECT_EQ(y.untouched_inside(), 0);
            int64_t bad = 0;
            for (int64_t m = 0; m < M; ++m)
              for (int64_t c = 0; c < N; ++c) {
                double exact = bias ? double(bias[c]) : 0.0;
                for (int64_t kk = 0; kk < K; ++kk)
                  exact += double(x[size_t(m * ldx + kk)]) * weight_value(plain, c * K + kk);
                const int64_t mr = m % mt, cr = c % n;  // the row pair (mr, mt + mr), the output pair (cr, n + cr)
                double s = 0;
                for (int64_t j = 0; j < k; ++j)
                  s += (xa(mr, j) + xa(mr, k + j) + xa(mt + mr, j) + xa(mt + mr, k + j)) *
                       (wa(cr, j) + wa(cr, k + j) + wa(n + cr, j) + wa(n + cr, k + j));
                double tol = 4.0 * (k + 3) * test::kEps32 * s + (bias ? test::kEps32 * std::fabs(bias[c]) : 0.0);
                const float got = y.data()[m * ldy + c];
                if (store == DType::BF16) tol += test::bf16_ulp(got);
                if (!(std::fabs(double(got) - exact) <= tol) && bad++ < 3)
                  ADD_FAILURE() << "y[" << m << ", " << c << "] = " << got << ", exact " << exact << ", bound " << tol;
              }
            EXPECT_EQ(bad, 0) << "threads=" << pool->size() << " store=" << test::store_name(store);
          }
      }
  // An odd N or K: gemm_only_f32's form.
  const kern::LinearWeight odd = make_weight(rng, 7, 4, DType::F32, false, DType::F32);
  EXPECT_NE(kern::gemm_strassen_f32(odd, p2).gemm_kind(), kern::GemmKind::F32Strassen);
  const kern::LinearWeight oddk = make_weight(rng, 4, 9, DType::F32, false, DType::F32);
  EXPECT_NE(kern::gemm_strassen_f32(oddk, p2).gemm_kind(), kern::GemmKind::F32Strassen);
}

TEST(KernelsLinear, RejectsBadLeadingDims) {
  ThreadPool pool(1);
  Rng rng(5);
  const kern::LinearWeight w = make_weight(rng, 4, 8, DType::F32, false, DType::F32);
  std::vector<float> x(64), y(64);
  EXPECT_THROW(kern::linear(pool, x.data(), 2, 7, w, y.data(), 4, DType::F32), InternalError);
  EXPECT_THROW(kern::linear(pool, x.data(), 2, 8, w, y.data(), 3, DType::F32), InternalError);
}

// linear_multi writes bitwise what linear() on each weight writes, for every kind of weight it
// groups (plain F32, plain BF16 with either store, int8, q4, int8 + q4) and for the mixes it hands
// back to linear() one by one (plain + quantized, M > 4), on 1 and 2 threads, into one fused output
// buffer (ldy > the total, gaps untouched). N = 37, 130, 9 with K = 517 (two quantized superblocks,
// the second padded) put segment borders inside the pool's chunks (and, for the strip form, strips
// with padding rows at every weight's end). RED: passing a chunk's rows of the
// concatenation to a weight without subtracting its start row (n0 instead of n0 - starts[i]) fails.
TEST(KernelsLinear, MultiEqualsSeparateLinears) {
  ThreadPool p1(1), p2(2);
  Rng rng(91);
  const int64_t K = 517, Ns[3] = {37, 130, 9}, total = 37 + 130 + 9, ldy = total + 3;
  const bool biased[3] = {true, false, true};
  enum Kind { F32, BF16, I8, Q4, I8S, Q4S };  // I8S / Q4S: with the strip form (kern::with_strips)
  auto make = [&](Kind kind, int64_t N, bool bias) {
    kern::LinearWeight w = make_weight(rng, N, K, kind == F32 ? DType::F32 : DType::BF16, bias, DType::F32);
    if (kind != F32 && kind != BF16) {
      auto q = kern::quantize_weight(p2, w.weight(),
                                     kind == I8 || kind == I8S ? kern::QuantType::Int8 : kern::QuantType::Q4);
      if (kind == I8S || kind == Q4S) q = kern::with_strips(p2, *q);
      w = kern::LinearWeight(q, w.has_bias() ? w.bias() : Tensor());
    }
    return w;
  };
  std::vector<std::vector<Kind>> groups = {{F32, F32, F32}, {BF16, BF16, BF16}, {I8, I8, I8},    {Q4, Q4, Q4},
                                           {I8, Q4, I8},    {BF16, I8, BF16},   {F32, BF16, F32}};
  // Strip-form weights (split by strips among the threads), and a mix that takes the row bodies.
  if (kern::quant_strips_offered()) groups.insert(groups.end(), {{I8S, I8S, I8S}, {Q4S, I8S, Q4S}, {I8S, I8, Q4S}});
  for (const auto& kinds : groups)
    for (DType store : {DType::F32, DType::BF16})
      for (int64_t M : {1, 2, 3, 4, 6}) {
        SCOPED_TRACE(::testing::Message() << "kinds " << kinds[0] << kinds[1] << kinds[2]
                                          << " store=" << test::store_name(store) << " M=" << M);
        std::vector<kern::LinearWeight> ws;
        for (int i = 0; i < 3; ++i) ws.push_back(make(kinds[size_t(i)], Ns[i], biased[i]));
        std::vector<float> x = rng.vec(static_cast<size_t>(M * K), -1.f, 1.f, true);
        std::vector<float> want(static_cast<size_t>(M * ldy), -7.f);
        for (int64_t i = 0, off = 0; i < 3; off += Ns[i], ++i)
          kern::linear(p2, x.data(), M, K, ws[size_t(i)], want.data() + off, ldy, store);
        for (const ThreadPool* pool : {&p1, &p2}) {
          std::vector<float> got(want.size(), -7.f);
          const kern::LinearOut outs[3] = {
              {&ws[0], got.data(), ldy}, {&ws[1], got.data() + Ns[0], ldy}, {&ws[2], got.data() + Ns[0] + Ns[1], ldy}};
          kern::linear_multi(*pool, x.data(), M, K, outs, store);
          EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0) << pool->size() << " threads";
        }
      }
  // Inputs of different widths are an error, not a silent misread.
  const kern::LinearWeight a = make(F32, 4, false), b = make_weight(rng, 4, 8, DType::F32, false, DType::F32);
  std::vector<float> x(2 * K), y(16);
  const kern::LinearOut bad[2] = {{&a, y.data(), 4}, {&b, y.data() + 8, 4}};
  EXPECT_THROW(kern::linear_multi(p1, x.data(), 2, K, bad, DType::F32), InternalError);
}

TEST(KernelsGemm, MatchesRefAllTransposes) {
  ThreadPool pool(2);
  Rng rng(9);
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{3, 29, 37}, {33, 17, 65}, {1, 1, 1}, {70, 40, 9}}) {
        SCOPED_TRACE(::testing::Message() << "ta=" << ta << " tb=" << tb << " M=" << M << " N=" << N << " K=" << K);
        const int64_t lda = (ta ? M : K) + 2, ldb = (tb ? K : N) + 3, ldc = N + 4;
        std::vector<float> A = rng.vec(static_cast<size_t>((ta ? K : M) * lda), -1, 1);
        std::vector<float> B = rng.vec(static_cast<size_t>((tb ? N : K) * ldb), -1, 1);
        Guarded C(M, N, ldc);
        std::vector<float> C0 = rng.vec(static_cast<size_t>(M * N), -1, 1);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n) C.data()[m * ldc + n] = C0[m * N + n];
        std::vector<float> R = C0;
        const float alpha = 0.75f, beta = -0.5f;
        kern::gemm_f32(pool, ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
        ref::gemm_f32(pool, ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, R.data(), N);
        EXPECT_EQ(C.touched_outside(), 0);
        EXPECT_EQ(test::count_violations("gemm", C.data(), ldc, R.data(), M, N,
                                         [&](int64_t m, int64_t n, float) {
                                           double s = std::fabs(beta * C0[m * N + n]);
                                           for (int64_t k = 0; k < K; ++k)
                                             s += std::fabs(alpha * (ta ? A[k * lda + m] : A[m * lda + k]) *
                                                            (tb ? B[n * ldb + k] : B[k * ldb + n]));
                                           return (K + 3) * 0.5 * test::kEps32 * s;
                                         }),
                  0);
      }
}

// Packing by parts (pack_*_panels_part): each part packed alone into a buffer of `sentinel` bits writes
// only its own elements, each with the whole form's value, and the parts together write every element
// the whole writes exactly once. Returns the number of elements at fault (0 when the parts add up).
template <typename T, typename PackPart>
int64_t parts_fault_count(const std::vector<T>& whole, T sentinel, int64_t rows, int64_t step, PackPart pack_part) {
  std::vector<int> writes(whole.size(), 0);
  int64_t faults = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += step) {
    std::vector<T> one(whole.size(), sentinel);
    pack_part(r0, std::min(rows, r0 + step), one.data());
    for (size_t i = 0; i < one.size(); ++i)
      if (std::memcmp(&one[i], &sentinel, sizeof(T)) != 0) {
        ++writes[i];
        faults += std::memcmp(&one[i], &whole[i], sizeof(T)) != 0;
      }
  }
  for (size_t i = 0; i < whole.size(); ++i)
    faults += writes[i] != (std::memcmp(&whole[i], &sentinel, sizeof(T)) != 0 ? 1 : 0);
  return faults;
}

// pack_bf16_panels_from_f32_serial (the DiT attention's K and V, packed for the bf16 tiles straight from
// the fp32 q|k|v rows) against what it stands for: f32_to_bf16 into an n-major copy, then
// pack_bf16_panels_serial. Bitwise, both layouts, odd N and K around the 16-row / 32-column strip, the
// 256-k block and the 128-column panel edges, strided rows; values with rounding ties, NaN, infinities
// and subnormals; and parts of 32 and 96 rows add up to the whole (parts_fault_count). RED: the even /
// odd halves of a pair word swapped; the k-major pad pair's second row read past K; rows past N packed
// from memory instead of zeros; a part's k-major pair range ending one pair short.
TEST(KernelsPack, Bf16PanelsFromF32EqualConvertThenPack) {
  Rng rng(91);
  const std::vector<float> specials = {0.f,     -0.f,     1.00390625f, 1.01171875f, -1.00390625f, 1e-40f,
                                       -3e-39f, INFINITY, -INFINITY,   NAN,         3.4e38f,      65504.f};
  for (const bool kmajor : {false, true})
    for (const int64_t N : {1, 7, 16, 31, 33, 64, 129, 300})
      for (const int64_t K : {1, 2, 3, 30, 33, 64, 255, 256, 258, 513}) {
        SCOPED_TRACE(::testing::Message() << "kmajor=" << kmajor << " N=" << N << " K=" << K);
        const int64_t rows = kmajor ? K : N, cols = kmajor ? N : K, ld = cols + 5;
        std::vector<float> B = rng.vec(static_cast<size_t>(rows * ld + 64), -3.f, 3.f);  // + a tail past the last row
        for (size_t i = 0; i < B.size(); i += 7) B[i] = specials[(i / 7) % specials.size()];
        std::vector<uint16_t> nm(static_cast<size_t>(N * K));
        for (int64_t n = 0; n < N; ++n)
          for (int64_t k = 0; k < K; ++k)
            nm[size_t(n * K + k)] = f32_to_bf16_bits(kmajor ? B[k * ld + n] : B[n * ld + k]);
        const size_t size = static_cast<size_t>(kern::detail::pack_bf16_panels_size(N, K));
        const uint16_t sentinel = 0xFFFF;  // a NaN no rounding produces (f32_to_bf16_bits' NaN is 0x7FC0)
        std::vector<uint16_t> want(size, sentinel), got(size, sentinel);
        kern::detail::pack_bf16_panels_serial(nm.data(), K, N, K, want.data());
        kern::detail::pack_bf16_panels_from_f32_serial(B.data(), ld, kmajor, N, K, got.data());
        ASSERT_EQ(std::memcmp(got.data(), want.data(), size * 2), 0);
        for (const int64_t step : {32, 96})  // the same form from parts of 32 and 96 rows
          ASSERT_EQ(parts_fault_count(want, sentinel, rows, step,
                                      [&](int64_t r0, int64_t r1, uint16_t* out) {
                                        kern::detail::pack_bf16_panels_from_f32_part(B.data(), ld, kmajor, N, K, r0, r1,
                                                                                     out);
                                      }),
                    0)
              << "parts of " << step << " rows";
      }
  std::vector<float> B(64 * 64, 1.f);
  std::vector<uint16_t> out(static_cast<size_t>(kern::detail::pack_bf16_panels_size(64, 64)));
  EXPECT_THROW(kern::detail::pack_bf16_panels_from_f32_part(B.data(), 64, false, 64, 64, 16, 64, out.data()),
               InternalError);  // r0 not a multiple of 32
  EXPECT_THROW(kern::detail::pack_bf16_panels_from_f32_part(B.data(), 64, true, 64, 64, 0, 40, out.data()),
               InternalError);  // r1 neither a multiple of 32 nor the end
}

// gemm_bf16_packed_serial (the DiT attention's bf16 products, on its 6 x 64 tiles) against gemm_ex's bf16
// form (the 8 x 32 tiles): the same pair-dot chain for every output, so the same bits. Odd M around the
// 6-row tile, N around the 32-column strips, strip pairs (a lone last strip) and the 128-column panels,
// odd K and K across the 1024-k blocks (partial sums reloaded), store F32 and BF16; only C's M x N entries
// written (strided C). Skipped without AVX512-BF16. RED: the second strip's pointer one strip off; its
// columns not masked past N (writes outside C); the last k block not flagged (BF16 rounding skipped).
TEST(KernelsGemm, Bf16PackedSerialEqualsTheBf16GemmForm) {
  if (!kern::detail::cpu_has_avx512bf16()) GTEST_SKIP() << "needs AVX512-BF16 (gemm_bf16_packed_serial's only form)";
  Rng rng(17);
  ThreadPool pool(1);
  for (const int64_t M : {1, 5, 6, 7, 13, 128})
    for (const int64_t N : {1, 31, 33, 64, 65, 96, 129, 690})
      for (const int64_t K : {1, 2, 63, 64, 257, 600, 2100})
        for (const DType store : {DType::F32, DType::BF16}) {
          SCOPED_TRACE(::testing::Message()
                       << "M=" << M << " N=" << N << " K=" << K << " store=" << test::store_name(store));
          const int64_t Kp = (K + 1) & ~int64_t(1), lda = Kp + 6, ldc = N + 3;
          std::vector<float> A = rng.vec(static_cast<size_t>(M * lda), -2.f, 2.f, /*bf16=*/true);
          std::vector<float> B = rng.vec(static_cast<size_t>(N * K), -2.f, 2.f, /*bf16=*/true);
          std::vector<uint16_t> A16(A.size()), B16(B.size());
          f32_to_bf16(A.data(), A16.data(), A.size());
          f32_to_bf16(B.data(), B16.data(), B.size());
          for (int64_t m = 0; m < M && Kp > K; ++m) A16[size_t(m * lda + K)] = 0;  // an odd K's pad
          std::vector<uint16_t> panels(static_cast<size_t>(kern::detail::pack_bf16_panels_size(N, K)));
          kern::detail::pack_bf16_panels_from_f32_serial(B.data(), K, /*b_kmajor=*/false, N, K, panels.data());
          Guarded got(M, N, ldc), want(M, N, ldc);
          kern::detail::gemm_bf16_packed_serial(A16.data(), lda, M, panels.data(), N, K, got.data(), ldc, store);
          kern::detail::gemm_ex(pool, A.data(), lda, 1, M, B16.data(), DType::BF16, K, false, N, K, nullptr,
                                want.data(), ldc, store, /*bf16_dot=*/true);
          EXPECT_EQ(got.touched_outside(), 0);
          int bad = 0;
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n)
              if (f32_bits(got.at(m, n)) != f32_bits(want.at(m, n)) && bad++ < 3)
                ADD_FAILURE() << "C[" << m << ", " << n << "] " << got.at(m, n) << " != " << want.at(m, n);
          ASSERT_EQ(bad, 0);
        }
}

// pack_f32_panels_part (the fp32 DiT attention packs K and V by 32-key chunks of whole rows): parts of 32
// and 96 rows add up to pack_f32_panels_serial's whole form (parts_fault_count: each writes only its own
// elements, with the whole's bits), both layouts, odd N and K around strips, the k blocks and the
// 128-column panels, strided rows. RED: the n-major part's strips starting one strip late; the k-major
// rows copied one past the part's end (right values, another part's elements).
TEST(KernelsPack, F32PanelsPartsMakeTheWhole) {
  Rng rng(92);
  for (const bool kmajor : {false, true})
    for (const int64_t N : {1, 7, 31, 33, 64, 129, 300})
      for (const int64_t K : {1, 3, 33, 64, 255, 256, 257, 513, 1100}) {
        SCOPED_TRACE(::testing::Message() << "kmajor=" << kmajor << " N=" << N << " K=" << K);
        const int64_t rows = kmajor ? K : N, cols = kmajor ? N : K, ld = cols + 3;
        const std::vector<float> B = rng.vec(static_cast<size_t>(rows * ld), -3.f, 3.f);
        const size_t size = static_cast<size_t>(kern::detail::pack_f32_panels_size(N, K));
        float sentinel;  // a NaN payload the copies never hold
        const uint32_t sbits = 0xFFFFFFFFu;
        std::memcpy(&sentinel, &sbits, 4);
        std::vector<float> want(size, sentinel);
        kern::detail::pack_f32_panels_serial(B.data(), ld, kmajor, N, K, want.data());
        for (const int64_t step : {32, 96})
          ASSERT_EQ(parts_fault_count(want, sentinel, rows, step,
                                      [&](int64_t r0, int64_t r1, float* out) {
                                        kern::detail::pack_f32_panels_part(B.data(), ld, kmajor, N, K, r0, r1, out);
                                      }),
                    0)
              << "parts of " << step << " rows";
      }
  std::vector<float> B(64 * 64, 1.f), out(static_cast<size_t>(kern::detail::pack_f32_panels_size(64, 64)));
  EXPECT_THROW(kern::detail::pack_f32_panels_part(B.data(), 64, true, 64, 64, 8, 64, out.data()), InternalError);
  EXPECT_THROW(kern::detail::pack_f32_panels_part(B.data(), 64, false, 64, 64, 0, 50, out.data()), InternalError);
}

}  // namespace
}  // namespace mm3
