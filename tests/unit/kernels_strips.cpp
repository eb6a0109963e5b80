// kernels_strips.cpp — the strip form of a BF16 weight (kern::bf16_strips, kernels/cpu/strips.h): its
// packing, and `linear` on it giving every output the plain weight's bits (the row-major bf16 GEMV's for
// M <= 4 in a bf16 computation, the GEMM's otherwise).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <vector>

#include "kernels/cpu/simd.h"
#include "kernels/cpu/strips.h"
#include "kernels/kernels.h"
#include "kernels/ref/ref_kernels.h"
#include "kernels/tuning.h"
#include "kernels_util.h"

namespace mm3 {
namespace {

using test::Rng;

// Values spread over 2^-12..2^12, so that any other summation order changes bits.
std::vector<float> spread(Rng& rng, size_t n) {
  std::vector<float> v = rng.vec(n, -1.f, 1.f, true);
  for (auto& e : v) e = std::ldexp(e, static_cast<int>(rng.int_in(-12, 12)));
  return v;
}

struct Sizes {
  int64_t N, K;
};
// Partial last strips (N % 32), odd K (a padded last pair), K below and above a GEMM K block.
const Sizes kSizes[] = {{70, 517}, {33, 96}, {1, 3}, {100, 1031}};

#define MM3_NEEDS_STRIPS() \
  if (!kern::bf16_strips_offered()) GTEST_SKIP() << "the strip form needs AVX512-BF16, which this CPU lacks"

// The form holds W[n, k] where strips.h says, and zeros in the pads (rows past N, k = K of an odd K).
// RED: packing the pair halves swapped fails.
TEST(KernelsStrips, FormHoldsTheWeightAndZeroPads) {
  MM3_NEEDS_STRIPS();
  Rng rng(5);
  for (const Sizes& z : kSizes) {
    SCOPED_TRACE(::testing::Message() << "N=" << z.N << " K=" << z.K);
    const Tensor w = Tensor::from_f32(spread(rng, size_t(z.N * z.K)), {z.N, z.K}).to(DType::BF16);
    const auto* wb = static_cast<const uint16_t*>(w.raw());
    std::vector<uint16_t> form(static_cast<size_t>(kern::detail::strips_size(z.N, z.K)), 0xFFFF);
    kern::detail::strips_pack_part(wb, z.K, z.N, z.K, 0, kern::detail::strips_count(z.N), form.data());
    int64_t bad = 0;
    for (int64_t n = 0; n < kern::detail::strips_count(z.N) * 32; ++n)
      for (int64_t k = 0; k < 2 * kern::detail::strips_pairs(z.K); ++k) {
        const uint16_t want = n < z.N && k < z.K ? wb[n * z.K + k] : uint16_t(0);
        bad += kern::detail::strips_at(form.data(), z.K, n, k) != want;
      }
    EXPECT_EQ(bad, 0);
  }
}

// For every M (the GEMV for M <= 4, the GEMM above), both stores, with and without bias, on 1 and 2
// threads, linear on the strip form writes bitwise what linear on the plain weight writes by the same
// order: with bf16 products and M <= 4 the row-major bf16 GEMV (16-lane chains by pair residue, then
// _mm512_reduce_add_ps's tree; strips.h); otherwise the GEMM (one chain per output over k: the rows of a
// 6-row call whose first rows are x). The plain results lie within the fp32 summation bound of the exact
// sums (ref twin), so neither side is wrong in the same way.
// RED: the residue partials summed in order 0..15 instead of the tree fails every bf16 GEMV case; the
// fp32 GEMV's FMA of k = 2p + 1 before k = 2p fails every fp32 one.
TEST(KernelsStrips, LinearEqualsThePlainWeightsOrder) {
  MM3_NEEDS_STRIPS();
  ThreadPool p1(1), p2(2);
  Rng rng(17);
  for (const Sizes& z : kSizes)
    for (bool with_bias : {false, true})
      for (DType store : {DType::BF16, DType::F32})
        for (int64_t M : {1, 2, 3, 4, 7}) {
          SCOPED_TRACE(::testing::Message() << "N=" << z.N << " K=" << z.K << " bias=" << with_bias
                                            << " store=" << test::store_name(store) << " M=" << M);
          const int64_t Mg = std::max<int64_t>(M, 6);  // rows of the GEMM call (M > 4)
          std::vector<float> x = spread(rng, size_t(Mg * z.K));
          if (store == DType::BF16)  // a bf16 computation's x is bf16-valued
            for (auto& v : x) v = round_bf16(v);
          // Each weight row's last 3 values cancel its sum against x's first row almost exactly, so that
          // another summation order changes bits even through a bf16 store.
          std::vector<float> wv = spread(rng, size_t(z.N * z.K));
          for (int64_t n = 0; n < z.N; ++n) {
            double part = 0;
            for (int64_t k = 0; k < z.K; ++k) {
              float& e = wv[size_t(n * z.K + k)];
              e = round_bf16(k < z.K - 3 ? e : static_cast<float>(-part / x[size_t(k)]));
              part += double(x[size_t(k)]) * e;
            }
          }
          const Tensor w = Tensor::from_f32(wv, {z.N, z.K}).to(DType::BF16);
          const Tensor bias = with_bias ? Tensor::from_f32(spread(rng, size_t(z.N)), {z.N}) : Tensor();
          const kern::LinearWeight plain(w, bias);
          const kern::LinearWeight strips =
              kern::bf16_strips(static_cast<const uint16_t*>(w.raw()), z.K, z.N, z.K, &p2, bias);
          ASSERT_EQ(strips.gemm_kind(), kern::GemmKind::Bf16Strips);
          ASSERT_TRUE(strips.weight().raw() == nullptr) << "the plain tensor is not kept";
          std::vector<float> want(size_t(Mg * z.N), -7.f);
          kern::linear(p2, x.data(), Mg, z.K, plain, want.data(), z.N, store);
          const bool gemv_order = M <= 4 && store == DType::BF16;
          std::vector<float> want_gemv(size_t(M * z.N), -7.f);
          if (gemv_order) kern::linear(p2, x.data(), M, z.K, plain, want_gemv.data(), z.N, store);
          for (const ThreadPool* pool : {&p1, &p2}) {
            std::vector<float> got(size_t(M * z.N), -7.f);
            kern::linear(*pool, x.data(), M, z.K, strips, got.data(), z.N, store);
            EXPECT_EQ(std::memcmp(got.data(), (gemv_order ? want_gemv : want).data(), got.size() * 4), 0)
                << pool->size() << " thread(s), " << (gemv_order ? "the row-major GEMV's order" : "the GEMM's");
          }
          std::vector<float> ref(size_t(M * z.N));
          ref::linear(p1, x.data(), M, z.K, plain, ref.data(), z.N, store);
          const float* b = plain.bias_f32();
          const auto* wb = static_cast<const uint16_t*>(w.raw());
          int64_t off = 0;
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < z.N; ++n) {
              double mag = b ? std::fabs(double(b[n])) : 0.0;
              for (int64_t k = 0; k < z.K; ++k)
                mag += std::fabs(double(x[size_t(m * z.K + k)]) * double(bf16_bits_to_f32(wb[n * z.K + k])));
              double tol = (z.K + 2) * 0.5 * test::kEps32 * mag;  // fp32 summation bound (kernels_linear.cpp)
              if (store == DType::BF16) tol += test::bf16_ulp(ref[size_t(m * z.N + n)]);
              off += !(std::fabs(double(want[size_t(m * z.N + n)]) - double(ref[size_t(m * z.N + n)])) <= tol);
            }
          EXPECT_EQ(off, 0) << "outputs outside the fp32 summation bound";
        }
}

// linear_multi over strip-form weights (one pass over their concatenated strips) writes bitwise what
// linear() on each writes, into one fused output buffer. RED: a segment's strips offset by its start
// (g0 instead of g0 - starts[i]) fails.
TEST(KernelsStrips, MultiEqualsSeparateLinears) {
  MM3_NEEDS_STRIPS();
  ThreadPool p1(1), p2(2);
  Rng rng(23);
  const int64_t K = 517, Ns[3] = {37, 130, 9}, total = 37 + 130 + 9, ldy = total + 3;
  std::vector<Tensor> plain;
  std::vector<kern::LinearWeight> ws;
  for (int i = 0; i < 3; ++i) {
    plain.push_back(Tensor::from_f32(spread(rng, size_t(Ns[i] * K)), {Ns[i], K}).to(DType::BF16));
    const Tensor bias = i == 1 ? Tensor() : Tensor::from_f32(spread(rng, size_t(Ns[i])), {Ns[i]});
    ws.push_back(kern::bf16_strips(static_cast<const uint16_t*>(plain.back().raw()), K, Ns[i], K, &p2, bias));
  }
  for (DType store : {DType::F32, DType::BF16})
    for (int64_t M : {1, 2, 4, 6}) {
      SCOPED_TRACE(::testing::Message() << "store=" << test::store_name(store) << " M=" << M);
      std::vector<float> x = spread(rng, size_t(M * K));
      if (store == DType::BF16)
        for (auto& v : x) v = round_bf16(v);
      std::vector<float> want(size_t(M * ldy), -7.f);
      for (int64_t i = 0, off = 0; i < 3; off += Ns[i], ++i)
        kern::linear(p2, x.data(), M, K, ws[size_t(i)], want.data() + off, ldy, store);
      for (const ThreadPool* pool : {&p1, &p2}) {
        std::vector<float> got(want.size(), -7.f);
        const kern::LinearOut outs[3] = {
            {&ws[0], got.data(), ldy}, {&ws[1], got.data() + Ns[0], ldy}, {&ws[2], got.data() + Ns[0] + Ns[1], ldy}};
        kern::linear_multi(*pool, x.data(), M, K, outs, store);
        EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0) << pool->size() << " thread(s)";
      }
    }
}

// VDPBF16PS's step on one lane as the FMA forms compute it (strips.cpp gemv_bf16fma_g): the high
// halves' (odd k's) product added, then the low halves', each rounded once, denormal operands read as
// zero and denormal results flushed (DAZ, FTZ), spelled out here without MXCSR.
float flush(float v) { return std::fpclassify(v) == FP_SUBNORMAL ? std::copysign(0.f, v) : v; }
float pair_step(float acc, float x_even, float x_odd, float w_even, float w_odd) {
  const float r = flush(std::fma(flush(x_odd), flush(w_odd), flush(acc)));
  return flush(std::fma(flush(x_even), flush(w_even), r));
}
// The row-major bf16 GEMV's order for output (m, n) (strips.h): lane q a chain over the pairs p = q
// (mod 16), then the tree of _mm512_reduce_add_ps (plain fp32 adds), then the bf16 store.
float gemv_twin(const std::vector<float>& x, const std::vector<float>& w, int64_t K, int64_t m, int64_t n) {
  const int64_t P = (K + 1) / 2;
  auto at = [K](const std::vector<float>& v, int64_t row, int64_t k) { return k < K ? v[size_t(row * K + k)] : 0.f; };
  float lane[16];
  for (int q = 0; q < 16; ++q) {
    float acc = 0.f;
    for (int64_t p = q; p < P; p += 16)
      acc = pair_step(acc, at(x, m, 2 * p), at(x, m, 2 * p + 1), at(w, n, 2 * p), at(w, n, 2 * p + 1));
    lane[q] = acc;
  }
  float t3[8], t6[4];
  for (int i = 0; i < 8; ++i) t3[i] = lane[8 + i] + lane[i];
  for (int i = 0; i < 4; ++i) t6[i] = t3[4 + i] + t3[i];
  return round_bf16((t6[0] + t6[2]) + (t6[1] + t6[3]));
}

// bf16-valued x [M, K] and weights [N, K] for the pair-dot tests: spread over 2^-12..2^12, or (tiny) that
// times 2^-60 with every 7th x value a bf16 denormal, so that products and partial sums are denormal.
// Each weight row's last 3 values cancel its sum against x's first row almost exactly, so that a
// rounding step done otherwise shows through the bf16 store (LinearEqualsThePlainWeightsOrder).
void pair_data(Rng& rng, int64_t M, int64_t N, int64_t K, bool tiny, std::vector<float>& x, std::vector<float>& wv) {
  x = spread(rng, size_t(M * K));
  wv = spread(rng, size_t(N * K));
  for (auto& v : x) v = round_bf16(tiny ? std::ldexp(v, -60) : v);
  if (tiny)
    for (size_t i = 0; i < x.size(); i += 7) x[i] = round_bf16(std::ldexp(x[i], -60));
  for (int64_t n = 0; n < N; ++n) {
    double part = 0;
    for (int64_t k = 0; k < K; ++k) {
      float& e = wv[size_t(n * K + k)];
      const double xk = x[size_t(k)];
      e = round_bf16(k < K - 3 || xk == 0 ? (tiny ? std::ldexp(e, -60) : e) : static_cast<float>(-part / xk));
      part += xk * e;
    }
  }
}

// The strip GEMV's two bodies for a bf16 computation, VDPBF16PS (bf16_dot=1) and each pair as two FMAs
// (bf16_dot=0: the default where the instruction is slow and computes the same, linear.cpp
// cpu_bf16_dot_slow), and the row-major VDPBF16PS GEMV against the twin above, on values spread over
// 2^-12..2^12 and on tiny ones whose products and partial sums are denormal, over odd strip counts (the
// FMA body takes strips two at a time) and odd K, with and without its prefetches. The FMA body must
// match the twin on every CPU; the instruction's bodies where the CPU's VDPBF16PS computes the twin's
// step (bf16_dot_is_two_fmas; said loudly where it does not).
// RED: the low halves' FMA first fails the spread data; the FMAs without DAZ / FTZ fail the tiny data.
TEST(KernelsStrips, PairsAsTwoFmasGiveTheInstructionsBits) {
  MM3_NEEDS_STRIPS();
  const bool same_op = kern::detail::bf16_dot_is_two_fmas();
  if (!same_op)
    std::cout << "note: this CPU's VDPBF16PS does not compute two FMAs under DAZ / FTZ; only the FMA body is "
                 "checked against the twin (its bodies stay on the instruction)\n";
  ThreadPool p2(2);
  Rng rng(31);
  const Sizes sizes[] = {{70, 517}, {100, 1031}, {31, 64}, {160, 96}};
  struct Restore {
    ~Restore() {
      kern::tuning::force(kern::tuning::Knob::Bf16Dot, -1);
      kern::tuning::force(kern::tuning::Knob::GemvPrefetch, -1);
    }
  } restore;
  for (const Sizes& z : sizes)
    for (bool tiny : {false, true})
      for (int64_t M : {1, 2, 3, 4}) {
        SCOPED_TRACE(::testing::Message() << "N=" << z.N << " K=" << z.K << " tiny=" << tiny << " M=" << M);
        std::vector<float> x, wv;
        pair_data(rng, M, z.N, z.K, tiny, x, wv);
        std::vector<float> want(size_t(M * z.N));
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < z.N; ++n) want[size_t(m * z.N + n)] = gemv_twin(x, wv, z.K, m, n);
        const Tensor w = Tensor::from_f32(wv, {z.N, z.K}).to(DType::BF16);
        const kern::LinearWeight plain(w);
        const kern::LinearWeight strips =
            kern::bf16_strips(static_cast<const uint16_t*>(w.raw()), z.K, z.N, z.K, &p2, Tensor());
        auto same = [&](const std::vector<float>& got) {
          int64_t bad = 0;
          for (size_t i = 0; i < got.size(); ++i)
            bad += std::memcmp(&got[i], &want[i], 4) != 0 && !(std::isnan(got[i]) && std::isnan(want[i]));
          return bad;
        };
        if (same_op) {
          std::vector<float> got(want.size(), -7.f);
          kern::linear(p2, x.data(), M, z.K, plain, got.data(), z.N, DType::BF16);
          EXPECT_EQ(same(got), 0) << "the row-major VDPBF16PS GEMV";
        }
        for (int dot : {0, 1})
          for (int pf : {0, 1}) {
            if (dot == 1 && !same_op) continue;
            kern::tuning::force(kern::tuning::Knob::Bf16Dot, dot);
            kern::tuning::force(kern::tuning::Knob::GemvPrefetch, pf);
            std::vector<float> got(want.size(), -7.f);
            kern::linear(p2, x.data(), M, z.K, strips, got.data(), z.N, DType::BF16);
            EXPECT_EQ(same(got), 0) << "strip form, bf16_dot=" << dot << " gemv_prefetch=" << pf;
          }
      }
}

// gemm_ex's bf16 tile (the GEMM of a bf16 computation, M > 4: the LM prefill) in its two forms,
// VDPBF16PS (bf16_dot=1) and each pair as two FMAs (bf16_dot=0, gemm_nt.cpp tile_bf16fma_avx512),
// against the GEMM's order spelled out: one chain per output over the pairs in order, pair_step each
// (the partial sums of K blocks go through C as fp32, which changes no bit), then the bf16 store. On
// the plain weight and the strip form, row counts around the 8-row tile, N around the 32-column strips,
// K over two K blocks and odd. As the GEMV test: the FMA form everywhere, the instruction's where it
// computes the same step.
// RED: the tile's low halves' FMA first fails the spread data; its FMAs without DAZ / FTZ the tiny data.
TEST(KernelsStrips, GemmPairsAsTwoFmasGiveTheInstructionsBits) {
  MM3_NEEDS_STRIPS();
  const bool same_op = kern::detail::bf16_dot_is_two_fmas();
  ThreadPool p2(2);
  Rng rng(37);
  struct Restore {
    ~Restore() { kern::tuning::force(kern::tuning::Knob::Bf16Dot, -1); }
  } restore;
  const Sizes sizes[] = {{70, 517}, {33, 2101}};
  for (const Sizes& z : sizes)
    for (bool tiny : {false, true})
      for (int64_t M : {5, 8, 13}) {
        SCOPED_TRACE(::testing::Message() << "N=" << z.N << " K=" << z.K << " tiny=" << tiny << " M=" << M);
        std::vector<float> x, wv;
        pair_data(rng, M, z.N, z.K, tiny, x, wv);
        const int64_t P = (z.K + 1) / 2;
        auto at = [&z](const std::vector<float>& v, int64_t row, int64_t k) {
          return k < z.K ? v[size_t(row * z.K + k)] : 0.f;
        };
        std::vector<float> want(size_t(M * z.N));
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < z.N; ++n) {
            float acc = 0.f;
            for (int64_t p = 0; p < P; ++p)
              acc = pair_step(acc, at(x, m, 2 * p), at(x, m, 2 * p + 1), at(wv, n, 2 * p), at(wv, n, 2 * p + 1));
            want[size_t(m * z.N + n)] = round_bf16(acc);
          }
        const Tensor w = Tensor::from_f32(wv, {z.N, z.K}).to(DType::BF16);
        const kern::LinearWeight plain(w);
        const kern::LinearWeight strips =
            kern::bf16_strips(static_cast<const uint16_t*>(w.raw()), z.K, z.N, z.K, &p2, Tensor());
        for (int dot : {0, 1}) {
          if (dot == 1 && !same_op) continue;
          kern::tuning::force(kern::tuning::Knob::Bf16Dot, dot);
          for (const kern::LinearWeight* lw : {&plain, &strips}) {
            std::vector<float> got(want.size(), -7.f);
            kern::linear(p2, x.data(), M, z.K, *lw, got.data(), z.N, DType::BF16);
            int64_t bad = 0;
            for (size_t i = 0; i < got.size(); ++i)
              bad += std::memcmp(&got[i], &want[i], 4) != 0 && !(std::isnan(got[i]) && std::isnan(want[i]));
            EXPECT_EQ(bad, 0) << (lw == &plain ? "plain" : "strip form") << ", bf16_dot=" << dot;
          }
        }
      }
}

}  // namespace
}  // namespace mm3
