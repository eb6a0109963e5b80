// kernels_conv_direct.cpp — kern::ConvWeight / kern::conv_packed (cpu/conv_direct.cpp), the direct
// Conv1d (stride 1) and ConvTranspose1d kernel, against the ref twins (ref::conv1d, ref::conv_transpose1d
// with the same ConvFusion):
// * odd sizes: Cout not a multiple of the 6-channel register tile, Cout = 1, L = 1, outputs past one
//   1024-output chunk, more input channels than one slab (128 for multi-tap, 768 for one-tap layers),
//   padding other than "same", every packable stride (1, 2, 4, 8, 16) with 1..3 taps per phase, odd
//   padding, output_padding, and the fallback shapes (stride-2 Conv1d, stride-3 ConvTranspose1d);
// * every fusion (none, Snake, residual, Snake + in-place residual), both store dtypes, with and without
//   bias, guard zones around the output;
// * the numerics kernels.h promises, bit for bit: each output is one FMA chain over (ci, tap) in order
//   from 0, then + bias, one rounding; a fused op gives the bits of the separate kernels; results do not
//   depend on the thread count; ConvWeight::rounded equals packing rounded weights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/ref/ref_kernels.h"
#include "kernels_util.h"

namespace mm3 {
namespace {

using test::Guarded;
using test::Rng;

struct DCase {
  bool tr;  // ConvTranspose1d
  int64_t Cin, Cout, L;
  int K, stride, pad, dil, out_pad;  // Conv1d: stride 1 unless a fallback case; dil only for Conv1d
};

std::vector<DCase> direct_cases() {
  return {
      // Conv1d, stride 1
      {false, 3, 5, 1, 7, 1, 3, 1, 0},        // L = 1
      {false, 7, 13, 100, 7, 1, 9, 3, 0},     // dilation 3, Cout 13 = 2 tiles + 1
      {false, 130, 7, 300, 7, 1, 27, 9, 0},   // two input slabs, dilation 9
      {false, 5, 1, 1500, 7, 1, 3, 1, 0},     // Cout = 1 (conv_out), two output chunks
      {false, 800, 11, 70, 1, 1, 0, 1, 0},    // one tap, two input slabs
      {false, 9, 8, 257, 3, 1, 0, 1, 0},      // no padding: Lout = 255, partial vectors
      {false, 4, 6, 50, 5, 1, 7, 2, 0},       // Lout != L
      // ConvTranspose1d
      {true, 13, 7, 9, 16, 8, 4, 1, 0},       // vocoder block 0/1 shape (k 2s, pad ceil(s/2))
      {true, 6, 5, 300, 8, 4, 2, 1, 0},       // vocoder block 2 shape, two output chunks
      {true, 140, 3, 33, 4, 2, 1, 1, 0},      // vocoder block 3 shape, two input slabs
      {true, 3, 2, 5, 32, 16, 8, 1, 0},       // stride 16
      {true, 5, 4, 20, 3, 1, 1, 1, 0},        // stride 1
      {true, 3, 3, 11, 4, 4, 0, 1, 0},        // one tap per phase
      {true, 4, 5, 17, 6, 2, 2, 1, 1},        // three taps per phase, output_padding
      {true, 3, 7, 4, 16, 8, 3, 1, 0},        // odd padding
      {true, 2, 3, 1, 4, 2, 0, 1, 0},         // L = 1
      // fallbacks (GEMM paths) with fusions
      {false, 6, 5, 40, 3, 2, 1, 1, 0},       // Conv1d stride 2
      {true, 4, 3, 10, 6, 3, 2, 1, 0},        // ConvTranspose1d stride 3
  };
}

int64_t out_len(const DCase& c) {
  return c.tr ? kern::conv_transpose1d_out_len(c.L, c.K, c.stride, c.pad, c.out_pad)
              : kern::conv1d_out_len(c.L, c.K, c.stride, c.pad, c.dil);
}

bool packable(const DCase& c) {
  return c.tr ? kern::ConvWeight::transpose_packable(c.K, c.stride) : c.stride == 1;
}

// Calls fn(weight, ci, src) for every tap of output (co, o) in the order the direct kernel chains them
// (ci ascending, then the taps: ascending k), src = the input index (may be out of range: a zero).
void for_each_tap(const DCase& c, const std::vector<float>& w, int64_t co, int64_t o,
                  const std::function<void(float, int64_t, int64_t)>& fn) {
  for (int64_t ci = 0; ci < c.Cin; ++ci) {
    if (!c.tr) {
      for (int k = 0; k < c.K; ++k) fn(w[(co * c.Cin + ci) * c.K + k], ci, o * c.stride - c.pad + int64_t(k) * c.dil);
    } else {
      const int64_t num = o + c.pad, r = num % c.stride;
      for (int k = static_cast<int>(r); k < c.K; k += c.stride)
        fn(w[(ci * c.Cout + co) * c.K + k], ci, (num - k) / c.stride);
    }
  }
}

void run_kernel(const ThreadPool& pool, const DCase& c, const float* x, const std::vector<float>& w,
                const float* bias, float* y, DType store, const kern::ConvFusion& f) {
  if (c.tr)
    kern::conv_transpose1d(pool, x, c.Cin, c.L, w.data(), bias, c.Cout, c.K, c.stride, c.pad, c.out_pad, y, store, f);
  else
    kern::conv1d(pool, x, c.Cin, c.L, w.data(), bias, c.Cout, c.K, c.stride, c.pad, c.dil, y, store, f);
}

kern::ConvWeight pack(const DCase& c, const std::vector<float>& w, const float* bias) {
  return c.tr ? kern::ConvWeight::conv_transpose1d(w.data(), bias, c.Cin, c.Cout, c.K, c.stride, c.pad, c.out_pad)
              : kern::ConvWeight::conv1d(w.data(), bias, c.Cout, c.Cin, c.K, c.pad, c.dil);
}

void run_ref(const DCase& c, const float* x, const std::vector<float>& w, const float* bias, float* y, DType store,
             const kern::ConvFusion& f) {
  ThreadPool pool(1);
  if (c.tr)
    ref::conv_transpose1d(pool, x, c.Cin, c.L, w.data(), bias, c.Cout, c.K, c.stride, c.pad, c.out_pad, y, store, f);
  else
    ref::conv1d(pool, x, c.Cin, c.L, w.data(), bias, c.Cout, c.K, c.stride, c.pad, c.dil, y, store, f);
}

std::string describe(const DCase& c) {
  return fmt::format("{} Cin={} Cout={} L={} K={} s={} p={} d={} op={}", c.tr ? "convT" : "conv1d", c.Cin, c.Cout,
                     c.L, c.K, c.stride, c.pad, c.dil, c.out_pad);
}

struct Data {
  std::vector<float> x, w, b, alpha, res;
};

Data make_data(const DCase& c, Rng& rng, bool bf) {
  Data d;
  d.x = rng.vec(size_t(c.Cin * c.L), -2, 2, bf);
  d.w = rng.vec(size_t(c.Cin * c.Cout * c.K), -1, 1, bf);
  d.b = rng.vec(size_t(c.Cout), -1, 1, bf);
  d.alpha = rng.vec(size_t(c.Cin), 0.2f, 2.f, bf);
  d.res = rng.vec(size_t(c.Cout * out_len(c)), -2, 2, bf);
  return d;
}

enum class Fuse { none, snake, residual, snake_residual_in_place };
const Fuse kFusions[] = {Fuse::none, Fuse::snake, Fuse::residual, Fuse::snake_residual_in_place};
const char* fuse_name(Fuse f) {
  switch (f) {
    case Fuse::none: return "none";
    case Fuse::snake: return "snake";
    case Fuse::residual: return "residual";
    default: return "snake+residual(in place)";
  }
}

// Against the double-summing twin, with the fusions. Tolerance: the fp32 summation bound of
// kernels_conv.cpp over the (Snake'd) terms; plus, with Snake, each term's weight times the Snake
// error bound of kernels_elementwise.cpp; plus one rounding of the output (and of the residual sum).
TEST(KernelsConvDirect, MatchesRefWithFusions) {
  ThreadPool pool(2);
  Rng rng(51);
  for (const DCase& c : direct_cases())
    for (DType store : {DType::F32, DType::BF16})
      for (Fuse fu : kFusions)
        for (bool with_bias : {true, false}) {
          SCOPED_TRACE(describe(c) + " store=" + test::store_name(store) + " fusion=" + fuse_name(fu) +
                       " bias=" + std::to_string(with_bias));
          const bool bf = store == DType::BF16;
          const int64_t Lout = out_len(c);
          ASSERT_GT(Lout, 0);
          Data d = make_data(c, rng, bf);
          const float* bp = with_bias ? d.b.data() : nullptr;
          const bool snake = fu == Fuse::snake || fu == Fuse::snake_residual_in_place;
          const bool res = fu != Fuse::none && fu != Fuse::snake;
          Guarded y(1, c.Cout * Lout, c.Cout * Lout);
          kern::ConvFusion f;
          if (snake) f.snake_alpha = d.alpha.data();
          if (fu == Fuse::residual) f.residual = d.res.data();
          if (fu == Fuse::snake_residual_in_place) {
            std::copy(d.res.begin(), d.res.end(), y.data());
            f.residual = y.data();
          }
          run_kernel(pool, c, d.x.data(), d.w, bp, y.data(), store, f);
          kern::ConvFusion rf = f;
          if (res) rf.residual = d.res.data();
          std::vector<float> want(size_t(c.Cout * Lout)), xs(d.x.size());
          run_ref(c, d.x.data(), d.w, bp, want.data(), store, rf);
          if (snake) ref::snake(d.x.data(), d.alpha.data(), xs.data(), c.Cin, c.L, store);
          EXPECT_EQ(y.touched_outside(), 0);
          EXPECT_EQ(y.untouched_inside(), 0);
          EXPECT_EQ(test::count_violations(
                        "conv_packed", y.data(), Lout, want.data(), c.Cout, Lout,
                        [&](int64_t co, int64_t o, float e) {
                          double s = bp ? std::fabs(bp[co]) : 0, sn = 0;
                          for_each_tap(c, d.w, co, o, [&](float wv, int64_t ci, int64_t src) {
                            if (src < 0 || src >= c.L) return;
                            const float xv = d.x[ci * c.L + src];
                            const float v = snake ? xs[ci * c.L + src] : xv;
                            s += std::fabs(double(wv) * v);
                            if (snake) {
                              const double scale = std::fabs(xv) + 1.0 / d.alpha[ci];
                              sn += std::fabs(wv) * (bf ? 2 * test::bf16_ulp(v) + test::bf16_ulp(float(scale))
                                                        : 8 * test::kEps32 * scale);
                            }
                          });
                          const int64_t taps = c.Cin * c.K;
                          double t = (taps + 2) * 0.5 * test::kEps32 * s + sn;
                          const double ulp = bf ? test::bf16_ulp(e) : test::kEps32 * std::fabs(e);
                          t += ulp * (res ? 2 : 1);
                          return t;
                        }),
                    0);
          if (bf) {
            EXPECT_EQ(test::count_non_bf16(y.data(), Lout, c.Cout, Lout), 0);
          }
        }
}

// The fused call gives the bits of the separate kernels (snake, convolution, add), and the packed
// weight gives the bits of the raw-weight call.
TEST(KernelsConvDirect, FusionEqualsSeparateKernelsBitwise) {
  ThreadPool pool(2);
  Rng rng(52);
  for (const DCase& c : direct_cases())
    for (DType store : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(describe(c) + " store=" + test::store_name(store));
      const bool bf = store == DType::BF16;
      const int64_t Lout = out_len(c), n = c.Cout * Lout;
      Data d = make_data(c, rng, bf);
      // Separate: xs = snake(x); t = conv(xs); y = add(res, t).
      std::vector<float> xs(d.x.size()), t(static_cast<size_t>(n)), sep(static_cast<size_t>(n));
      kern::snake(d.x.data(), d.alpha.data(), xs.data(), c.Cin, c.L, store);
      run_kernel(pool, c, xs.data(), d.w, d.b.data(), t.data(), store, {});
      kern::add(d.res.data(), t.data(), sep.data(), n, store);
      // Fused, in place on a copy of the residual.
      std::vector<float> fused = d.res;
      run_kernel(pool, c, d.x.data(), d.w, d.b.data(), fused.data(), store,
                 {.snake_alpha = d.alpha.data(), .residual = fused.data()});
      EXPECT_EQ(test::count_bit_diffs(fused.data(), n, sep.data(), 1, n), 0) << "fused vs separate";
      if (packable(c)) {
        std::vector<float> viaw(static_cast<size_t>(n));
        kern::conv_packed(pool, pack(c, d.w, d.b.data()), xs.data(), c.L, viaw.data(), store);
        EXPECT_EQ(test::count_bit_diffs(viaw.data(), n, t.data(), 1, n), 0) << "ConvWeight vs raw-weight call";
      }
    }
}

// kernels.h's order: one sequential fp32 FMA chain over (ci, tap) from 0 (taps in ascending k, a tap
// that falls in the zero padding contributes w * 0), then + bias, then one rounding. Recomputed here
// with std::fma; the direct kernel must match it bit for bit (a different association of the same sum,
// e.g. taps outer and channels inner, does not).
TEST(KernelsConvDirect, EachOutputIsOneFmaChainInOrder) {
  ThreadPool pool(2);
  Rng rng(53);
  for (const DCase& c : direct_cases()) {
    if (!packable(c)) continue;
    for (DType store : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(describe(c) + " store=" + test::store_name(store));
      const bool bf = store == DType::BF16;
      const int64_t Lout = out_len(c), n = c.Cout * Lout;
      Data d = make_data(c, rng, bf);
      std::vector<float> y(static_cast<size_t>(n)), chain(static_cast<size_t>(n));
      kern::conv_packed(pool, pack(c, d.w, d.b.data()), d.x.data(), c.L, y.data(), store);
      for (int64_t co = 0; co < c.Cout; ++co)
        for (int64_t o = 0; o < Lout; ++o) {
          float acc = 0.f;
          for_each_tap(c, d.w, co, o, [&](float wv, int64_t ci, int64_t src) {
            acc = std::fma(wv, (src >= 0 && src < c.L) ? d.x[ci * c.L + src] : 0.f, acc);
          });
          chain[co * Lout + o] = round_store(acc + d.b[co], store);
        }
      EXPECT_EQ(test::count_bit_diffs(y.data(), n, chain.data(), 1, n), 0);
    }
  }
}

// 1, 2 and 3 threads, and a repeated call, give the same bits, at shapes that make several tasks,
// channel groups, input slabs and partial vectors (with Snake and an in-place residual).
TEST(KernelsConvDirect, DeterministicAndThreadCountIndependent) {
  ThreadPool p1(1), p2(2), p3(3);
  Rng rng(54);
  const DCase cases[] = {
      {false, 200, 50, 3001, 7, 1, 9, 3, 0},  // 3 chunks x 1 group, 2 slabs
      {false, 40, 300, 333, 7, 1, 3, 1, 0},   // 2 chunks of 256 x channel groups
      {false, 900, 20, 700, 1, 1, 0, 1, 0},   // one tap, 2 slabs of 768
      {true, 150, 70, 401, 16, 8, 4, 1, 0},   // 4 chunks, 2 slabs
      {true, 33, 200, 60, 4, 2, 1, 1, 0},     // channel groups
  };
  for (const DCase& c : cases) {
    SCOPED_TRACE(describe(c));
    const int64_t n = c.Cout * out_len(c);
    Data d = make_data(c, rng, false);
    const kern::ConvWeight cw = pack(c, d.w, d.b.data());
    std::vector<float> outs[4];
    const ThreadPool* pools[4] = {&p2, &p2, &p1, &p3};
    for (int i = 0; i < 4; ++i) {
      outs[i] = d.res;
      kern::conv_packed(*pools[i], cw, d.x.data(), c.L, outs[i].data(), DType::F32,
                        {.snake_alpha = d.alpha.data(), .residual = outs[i].data()});
    }
    EXPECT_EQ(std::memcmp(outs[0].data(), outs[1].data(), size_t(n) * 4), 0) << "two identical calls differ";
    EXPECT_EQ(std::memcmp(outs[0].data(), outs[2].data(), size_t(n) * 4), 0) << "1 and 2 threads differ";
    EXPECT_EQ(std::memcmp(outs[0].data(), outs[3].data(), size_t(n) * 4), 0) << "3 and 2 threads differ";
  }
}

// rounded(BF16) is the weight packed from bf16-rounded values (the vocoder's bf16 compute copies).
TEST(KernelsConvDirect, RoundedEqualsPackingRoundedWeights) {
  ThreadPool pool(2);
  Rng rng(55);
  for (const DCase& c : direct_cases()) {
    if (!c.tr && c.stride != 1) continue;  // (stride-3 ConvTranspose1d: the kept raw weight is rounded)
    SCOPED_TRACE(describe(c));
    const int64_t n = c.Cout * out_len(c);
    Data d = make_data(c, rng, false);
    std::vector<float> wr = d.w, br = d.b, x = d.x;
    round_to_store(wr.data(), wr.size(), DType::BF16);
    round_to_store(br.data(), br.size(), DType::BF16);
    round_to_store(x.data(), x.size(), DType::BF16);
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    kern::conv_packed(pool, pack(c, d.w, d.b.data()).rounded(DType::BF16), x.data(), c.L, a.data(), DType::BF16);
    kern::conv_packed(pool, pack(c, wr, br.data()), x.data(), c.L, b.data(), DType::BF16);
    EXPECT_EQ(test::count_bit_diffs(a.data(), n, b.data(), 1, n), 0);
  }
}

TEST(KernelsConvDirect, WeightDescribesItsLayer) {
  std::vector<float> w(4 * 3 * 16, 0.5f);
  const kern::ConvWeight t = kern::ConvWeight::conv_transpose1d(w.data(), nullptr, 4, 3, 16, 8, 4, 0);
  EXPECT_TRUE(t.transposed());
  EXPECT_EQ(t.in_channels(), 4);
  EXPECT_EQ(t.out_channels(), 3);
  EXPECT_EQ(t.out_len(689), 8 * 689);  // MODEL.md §5.1
  EXPECT_EQ(t.flops(10), 2.0 * 4 * 3 * 16 * 10);
  const kern::ConvWeight c = kern::ConvWeight::conv1d(w.data(), nullptr, 3, 4, 7, 27, 9);
  EXPECT_FALSE(c.transposed());
  EXPECT_EQ(c.out_len(100), 100);
  EXPECT_EQ(c.flops(100), 2.0 * 3 * 4 * 7 * 100);
  EXPECT_TRUE(kern::ConvWeight().empty());
  EXPECT_FALSE(kern::ConvWeight::transpose_packable(6, 3));
  EXPECT_TRUE(kern::ConvWeight::transpose_packable(16, 8));
}

}  // namespace
}  // namespace mm3
