// kernels_conv_winograd_t.cpp — kern::conv_winograd_t (cpu/conv_winograd_t.cpp): a ConvTranspose1d with
// kernel 2s, stride s and padding below s run as Winograd F(3,2) by conv_packed (store F32), against the
// ref twin (ref::conv_transpose1d: double sums, one rounding) with the same ConvFusion:
// * odd sizes: L = 1 and 2 (one tile, mostly padding), L not a multiple of 3, layers of many tasks,
//   Cin above a 64-channel chunk, Cout spanning several product groups with a partial last one and not a
//   multiple of the 6-row tile; strides 1, 2, 4, 8 and the paddings 0, the vocoder's ceil(s/2) and s − 1;
//   every fusion; guard zones;
// * a per-output error bound from the transforms' magnitudes, and accuracy within a few times the
//   direct kernel's on the same data (rel RMS against the exact sum);
// * bits independent of the thread count; the fused call equals snake -> conv -> add; the form only for
//   its shape and only for store F32.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/ref/ref_kernels.h"
#include "kernels_util.h"

namespace mm3 {
namespace {

using test::Guarded;
using test::Rng;

struct TCase {
  int64_t Cin, Cout, L;
  int s, pad;
};

std::string describe(const TCase& c) {
  return fmt::format("Cin={} Cout={} L={} s={} pad={}", c.Cin, c.Cout, c.L, c.s, c.pad);
}

kern::ConvWeight pack(const TCase& c, const std::vector<float>& w, const float* bias) {
  return kern::ConvWeight::conv_transpose1d(w.data(), bias, c.Cin, c.Cout, 2 * c.s, c.s, c.pad, 0);
}

int64_t out_len(const TCase& c) { return kern::conv_transpose1d_out_len(c.L, 2 * c.s, c.s, c.pad, 0); }

// B(co, t): output t of phase l = (t + pad) mod s at input i = (t + pad) / s sits at j = i mod 3 of
// the tile n = i / 3 whose inputs are d_q = x[3n − 1 + q]; sum over the four points p and the input
// channels of |Gw_p[co, ci]| · (|d_a| + |d_b|), U_p = d_a ± d_b. Every rounding of the transforms and
// of the products' chains is at most eps times a partial sum of these terms.
double bound_terms(const TCase& c, const std::vector<float>& w, const std::vector<float>& x, int64_t co, int64_t t) {
  const int64_t s = c.s, i = (t + c.pad) / s, l = (t + c.pad) % s, n = i / 3;
  auto xv = [&](int64_t ci, int64_t pos) { return pos >= 0 && pos < c.L ? std::fabs(double(x[ci * c.L + pos])) : 0.0; };
  double B = 0;
  for (int64_t ci = 0; ci < c.Cin; ++ci) {
    const double a = w[(ci * c.Cout + co) * 2 * s + l], b = w[(ci * c.Cout + co) * 2 * s + l + s];
    const double d0 = xv(ci, 3 * n - 1), d1 = xv(ci, 3 * n), d2 = xv(ci, 3 * n + 1), d3 = xv(ci, 3 * n + 2);
    B += std::fabs(b) * (d0 + d2) + std::fabs(b + a) / 2 * (d1 + d2) + std::fabs(b - a) / 2 * (d2 + d1) +
         std::fabs(a) * (d3 + d1);
  }
  return B;
}

double rel_rms(const float* a, const float* ref, int64_t n) {
  double d = 0, r = 0;
  for (int64_t i = 0; i < n; ++i) {
    d += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    r += double(ref[i]) * ref[i];
  }
  return std::sqrt(d / std::max(r, 1e-300));
}

enum class Fuse { none, snake, residual, snake_residual_in_place };

TEST(KernelsConvWinogradT, MatchesRefWithFusions) {
  ThreadPool pool(2);
  Rng rng(71);
  const std::vector<TCase> cases = {
      {3, 5, 1, 2, 1},     // L = 1: one tile, two of its four inputs padding
      {4, 7, 2, 8, 4},     // L = 2, the widest stride
      {7, 13, 101, 4, 2},  // odd L, Cout = 2 tiles + 1
      {5, 9, 334, 8, 0},   // padding 0
      {6, 4, 100, 4, 3},   // padding s − 1
      {3, 4, 50, 1, 0},    // stride 1 (kernel 2)
      {2, 3, 5000, 2, 1},  // many tasks
      {130, 7, 40, 2, 1},  // Cin above two 64-channel chunks
      {9, 29, 61, 8, 4},   // Cout over three product groups of 12 channels, the last partial
  };
  for (const TCase& c : cases)
    for (Fuse fu : {Fuse::none, Fuse::snake, Fuse::residual, Fuse::snake_residual_in_place})
      for (bool with_bias : {true, false}) {
        SCOPED_TRACE(describe(c) + " fusion=" + std::to_string(int(fu)) + " bias=" + std::to_string(with_bias));
        const int64_t Lout = out_len(c), n = c.Cout * Lout;
        const std::vector<float> x = rng.vec(size_t(c.Cin * c.L), -2, 2),
                                 w = rng.vec(size_t(c.Cin * c.Cout * 2 * c.s), -1, 1),
                                 b = rng.vec(size_t(c.Cout), -1, 1), alpha = rng.vec(size_t(c.Cin), 0.2f, 2.f),
                                 res = rng.vec(size_t(n), -2, 2);
        const float* bp = with_bias ? b.data() : nullptr;
        const bool snake = fu == Fuse::snake || fu == Fuse::snake_residual_in_place;
        const bool resid = fu == Fuse::residual || fu == Fuse::snake_residual_in_place;
        const kern::ConvWeight cw = kern::conv_winograd_t(pack(c, w, bp));
        ASSERT_TRUE(cw.winograd) << "the layer should take the Winograd form";
        Guarded y(1, n, n);
        kern::ConvFusion f;
        if (snake) f.snake_alpha = alpha.data();
        if (fu == Fuse::residual) f.residual = res.data();
        if (fu == Fuse::snake_residual_in_place) {
          std::copy(res.begin(), res.end(), y.data());
          f.residual = y.data();
        }
        kern::conv_packed(pool, cw, x.data(), c.L, y.data(), DType::F32, f);
        kern::ConvFusion rf = f;
        if (resid) rf.residual = res.data();
        std::vector<float> want(static_cast<size_t>(n)), xs = x;
        {
          ThreadPool one(1);
          ref::conv_transpose1d(one, x.data(), c.Cin, c.L, w.data(), bp, c.Cout, 2 * c.s, c.s, c.pad, 0, want.data(),
                                DType::F32, rf);
        }
        if (snake) ref::snake(x.data(), alpha.data(), xs.data(), c.Cin, c.L, DType::F32);
        EXPECT_EQ(y.touched_outside(), 0);
        EXPECT_EQ(y.untouched_inside(), 0);
        EXPECT_EQ(test::count_violations("winograd_t", y.data(), Lout, want.data(), c.Cout, Lout,
                                         [&](int64_t co, int64_t t, float e) {
                                           double sn = 0;  // the Snake's error, carried by the exact convolution
                                           if (snake) {
                                             const int64_t i = (t + c.pad) / c.s, l = (t + c.pad) % c.s;
                                             for (int64_t ci = 0; ci < c.Cin; ++ci)
                                               for (int tap = 0; tap < 2; ++tap) {
                                                 const int64_t src = i - tap;
                                                 if (src < 0 || src >= c.L) continue;
                                                 const double scale = std::fabs(x[ci * c.L + src]) + 1.0 / alpha[ci];
                                                 sn += std::fabs(w[(ci * c.Cout + co) * 2 * c.s + l + tap * c.s]) * 8 *
                                                       test::kEps32 * scale;
                                               }
                                           }
                                           const double B = bound_terms(c, w, xs, co, t);
                                           return double(std::min<int64_t>(c.Cin, 64) + 16) * test::kEps32 * B + sn +
                                                  test::kEps32 * (std::fabs(e) + (bp ? std::fabs(bp[co]) : 0)) *
                                                      (resid ? 3 : 2);
                                         }),
                  0);
      }
}

// Accuracy against the exact sum at the vocoder's upsampling shapes (shortened): rel RMS below 2e-6 and
// within 4x the direct kernel's on the same data.
TEST(KernelsConvWinogradT, AccuracyNearTheDirectKernel) {
  ThreadPool pool(2);
  Rng rng(72);
  for (const TCase& c : {TCase{384, 192, 200, 4, 2}, TCase{192, 96, 500, 2, 1}, TCase{768, 48, 60, 8, 4}}) {
    SCOPED_TRACE(describe(c));
    const int64_t Lout = out_len(c), n = c.Cout * Lout;
    const std::vector<float> x = rng.vec(size_t(c.Cin * c.L), -2, 2),
                             w = rng.vec(size_t(c.Cin * c.Cout * 2 * c.s), -1, 1), b = rng.vec(size_t(c.Cout), -1, 1);
    const kern::ConvWeight direct = pack(c, w, b.data()), wino = kern::conv_winograd_t(direct);
    std::vector<float> yd(static_cast<size_t>(n)), yw(yd.size()), want(yd.size());
    kern::conv_packed(pool, direct, x.data(), c.L, yd.data(), DType::F32);
    kern::conv_packed(pool, wino, x.data(), c.L, yw.data(), DType::F32);
    ThreadPool one(1);
    ref::conv_transpose1d(one, x.data(), c.Cin, c.L, w.data(), b.data(), c.Cout, 2 * c.s, c.s, c.pad, 0, want.data(),
                          DType::F32);
    const double ed = rel_rms(yd.data(), want.data(), n), ew = rel_rms(yw.data(), want.data(), n);
    std::cout << "[ NOTE     ] " << describe(c) << ": rel RMS direct " << ed << ", Winograd F(3,2) " << ew << "\n";
    EXPECT_GT(ew, 0.0) << "the Winograd form did not run (same bits as an exact sum)";
    EXPECT_LT(ew, 2e-6);
    EXPECT_LT(ew, 4 * ed);
  }
}

// 1, 2 and 3 threads and a repeated call give the same bits; the fused call (Snake, in-place residual)
// equals kern::snake, then the Winograd conv, then kern::add.
TEST(KernelsConvWinogradT, ThreadCountIndependentAndFusionEqualsSeparate) {
  ThreadPool p1(1), p2(2), p3(3);
  Rng rng(73);
  for (const TCase& c : {TCase{40, 30, 3001, 2, 1}, TCase{9, 14, 777, 8, 4}, TCase{100, 20, 400, 4, 2}}) {
    SCOPED_TRACE(describe(c));
    const int64_t Lout = out_len(c), n = c.Cout * Lout;
    const std::vector<float> x = rng.vec(size_t(c.Cin * c.L), -2, 2),
                             w = rng.vec(size_t(c.Cin * c.Cout * 2 * c.s), -1, 1), b = rng.vec(size_t(c.Cout), -1, 1),
                             alpha = rng.vec(size_t(c.Cin), 0.2f, 2.f), res = rng.vec(size_t(n), -2, 2);
    const kern::ConvWeight cw = kern::conv_winograd_t(pack(c, w, b.data()));
    std::vector<float> outs[4];
    const ThreadPool* pools[4] = {&p2, &p2, &p1, &p3};
    for (int i = 0; i < 4; ++i) {
      outs[i] = res;
      kern::conv_packed(*pools[i], cw, x.data(), c.L, outs[i].data(), DType::F32,
                        {.snake_alpha = alpha.data(), .residual = outs[i].data()});
    }
    EXPECT_EQ(std::memcmp(outs[0].data(), outs[1].data(), size_t(n) * 4), 0) << "two identical calls differ";
    EXPECT_EQ(std::memcmp(outs[0].data(), outs[2].data(), size_t(n) * 4), 0) << "1 and 2 threads differ";
    EXPECT_EQ(std::memcmp(outs[0].data(), outs[3].data(), size_t(n) * 4), 0) << "3 and 2 threads differ";
    std::vector<float> xs(x.size()), t(static_cast<size_t>(n)), sep(static_cast<size_t>(n));
    kern::snake(x.data(), alpha.data(), xs.data(), c.Cin, c.L, DType::F32);
    kern::conv_packed(p2, cw, xs.data(), c.L, t.data(), DType::F32);
    kern::add(res.data(), t.data(), sep.data(), n, DType::F32);
    EXPECT_EQ(test::count_bit_diffs(outs[0].data(), n, sep.data(), 1, n), 0) << "fused vs separate";
  }
}

// The form is made only for its shape (kernel 2s, padding below s, no output padding; not for a Conv1d)
// and runs only for store F32; a rounded() copy drops it.
TEST(KernelsConvWinogradT, OnlyItsShapeAndStoreF32) {
  Rng rng(74);
  const std::vector<float> w8 = rng.vec(3 * 4 * 8, -1, 1), w6 = rng.vec(3 * 4 * 6, -1, 1), b = rng.vec(4, -1, 1);
  EXPECT_TRUE(
      kern::conv_winograd_t(kern::ConvWeight::conv_transpose1d(w8.data(), b.data(), 3, 4, 8, 4, 2, 0)).winograd);
  EXPECT_TRUE(kern::conv_winograd_t(kern::ConvWeight::conv_transpose1d(w8.data(), nullptr, 3, 4, 8, 4, 0, 0)).winograd);
  EXPECT_FALSE(
      kern::conv_winograd_t(kern::ConvWeight::conv_transpose1d(w8.data(), b.data(), 3, 4, 8, 4, 4, 0)).winograd)
      << "padding = stride";
  EXPECT_FALSE(
      kern::conv_winograd_t(kern::ConvWeight::conv_transpose1d(w8.data(), b.data(), 3, 4, 8, 4, 2, 1)).winograd)
      << "output padding";
  EXPECT_FALSE(
      kern::conv_winograd_t(kern::ConvWeight::conv_transpose1d(w6.data(), b.data(), 3, 4, 6, 2, 1, 0)).winograd)
      << "kernel 3·stride";
  EXPECT_FALSE(kern::conv_winograd_t(kern::ConvWeight::conv1d(w8.data(), b.data(), 4, 3, 2, 1, 1)).winograd)
      << "Conv1d";
  const kern::ConvWeight direct = kern::ConvWeight::conv_transpose1d(w8.data(), b.data(), 3, 4, 8, 4, 2, 0);
  const kern::ConvWeight wino = kern::conv_winograd_t(direct);
  EXPECT_FALSE(wino.rounded(DType::BF16).winograd);
  ThreadPool pool(2);
  const int64_t L = 50, n = 4 * 4 * L;
  std::vector<float> x = rng.vec(3 * L, -2, 2, true), yd(n), yw(n);
  kern::conv_packed(pool, direct, x.data(), L, yd.data(), DType::BF16);
  kern::conv_packed(pool, wino, x.data(), L, yw.data(), DType::BF16);
  EXPECT_EQ(test::count_bit_diffs(yw.data(), n, yd.data(), 1, n), 0) << "store BF16 must ignore the form";
  kern::conv_packed(pool, direct, x.data(), L, yd.data(), DType::F32);
  kern::conv_packed(pool, wino, x.data(), L, yw.data(), DType::F32);
  EXPECT_GT(test::count_bit_diffs(yw.data(), n, yd.data(), 1, n), 0) << "store F32 should run the form";
}

}  // namespace
}  // namespace mm3
