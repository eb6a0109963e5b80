// kernels_conv.cpp — kern::conv1d and kern::conv_transpose1d against torch (small exact examples,
// embedded) and the ref twins: stride / padding / dilation combinations, L = 1, the vocoder's
// ConvTranspose (kernel 2s, stride s, padding ceil(s/2)) for s = 2, 4, 8, inputs long enough to span
// several scratch tiles, guard zones, both store dtypes.
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

// torch 1.13 CPU fp32, integer-valued so the results are exact:
//   x = [[1, 2, -1, 3, 0, 2, 1], [0, -2, 1, 1, 2, -1, 3]] (Cin 2, L 7)
//   w = [[[1, 0, -1], [2, 1, 0]], [[0, 1, 1], [-1, 0, 2]]] (Cout 2, Cin 2, K 3), b = [0.5, -1]
//   F.conv1d(x, w, b, stride=2, padding=3, dilation=2)
TEST(KernelsConv, Conv1dMatchesTorchExample) {
  const std::vector<float> x = {1, 2, -1, 3, 0, 2, 1, 0, -2, 1, 1, 2, -1, 3};
  const std::vector<float> w = {1, 0, -1, 2, 1, 0, 0, 1, 1, -1, 0, 2};
  const std::vector<float> b = {0.5f, -1.f};
  const std::vector<float> want = {-1.5f, -4.5f, -2.5f, 4.5f, 0.5f, -3.f, 6.f, 4.f, 0.f, 0.f};
  ThreadPool pool(2);
  ASSERT_EQ(kern::conv1d_out_len(7, 3, 2, 3, 2), 5);
  std::vector<float> y(10);
  kern::conv1d(pool, x.data(), 2, 7, w.data(), b.data(), 2, 3, 2, 3, 2, y.data(), DType::F32);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(y[i], want[i]) << i;
}

//   xt = [[1, -2, 3], [2, 0, -1]] (Cin 2, L 3), wt = [[[1, 2, 0, -1]], [[0, 1, 3, 1]]] (Cin 2, Cout 1, K 4)
//   F.conv_transpose1d(xt, wt, [0.25], stride=2, padding=1)
TEST(KernelsConv, ConvTranspose1dMatchesTorchExample) {
  const std::vector<float> x = {1, -2, 3, 2, 0, -1};
  const std::vector<float> w = {1, 2, 0, -1, 0, 1, 3, 1};
  const std::vector<float> b = {0.25f};
  const std::vector<float> want = {4.25f, 4.25f, -2.75f, 3.25f, 7.25f, -2.75f};
  ThreadPool pool(2);
  ASSERT_EQ(kern::conv_transpose1d_out_len(3, 4, 2, 1, 0), 6);
  std::vector<float> y(6);
  kern::conv_transpose1d(pool, x.data(), 2, 3, w.data(), b.data(), 1, 4, 2, 1, 0, y.data(), DType::F32);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(y[i], want[i]) << i;
}

// Tolerance for a convolution output: (taps + 2)/2 ulps of the sum of |terms| (fp32 summation
// bound), plus one bf16 spacing when stored in bf16.
double conv_tol(double abs_sum, int64_t taps, DType store, float e) {
  const double t = (taps + 2) * 0.5 * test::kEps32 * abs_sum;
  return store == DType::BF16 ? t + test::bf16_ulp(e) : t;
}

struct ConvCase {
  int64_t Cin, Cout, L;
  int K, stride, pad, dil;
};

const ConvCase kConv[] = {
    {3, 5, 1, 1, 1, 0, 1},   {3, 5, 1, 3, 1, 1, 1},    // L = 1
    {4, 6, 17, 7, 1, 3, 1},  {4, 6, 17, 7, 1, 9, 3},   // vocoder residual conv1, dilation 1 and 3
    {5, 3, 23, 7, 1, 27, 9},                           // dilation 9
    {2, 3, 19, 4, 2, 1, 1},  {3, 2, 20, 3, 3, 0, 1},   // strides 2 and 3
    {7, 9, 31, 1, 1, 0, 1},  {6, 5, 13, 3, 1, 1, 1},   // 1x1, condition-encoder shape
    {37, 11, 40, 5, 2, 2, 2}, {2, 1, 9, 7, 1, 3, 1},   // odd sizes; Cout = 1 (conv_out)
    {150, 3, 2100, 7, 1, 3, 1},                        // spans several im2col tiles
};

TEST(KernelsConv, Conv1dMatchesRef) {
  ThreadPool pool(2);
  Rng rng(41);
  for (const auto& c : kConv)
    for (DType store : {DType::F32, DType::BF16})
      for (bool with_bias : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "Cin=" << c.Cin << " Cout=" << c.Cout << " L=" << c.L << " K=" << c.K
                                          << " s=" << c.stride << " p=" << c.pad << " d=" << c.dil
                                          << " store=" << test::store_name(store) << " bias=" << with_bias);
        const bool bf = store == DType::BF16;
        const int64_t Lout = kern::conv1d_out_len(c.L, c.K, c.stride, c.pad, c.dil);
        ASSERT_GT(Lout, 0);
        std::vector<float> x = rng.vec(size_t(c.Cin * c.L), -2, 2, bf);
        std::vector<float> w = rng.vec(size_t(c.Cout * c.Cin * c.K), -1, 1, bf);
        std::vector<float> b = rng.vec(size_t(c.Cout), -1, 1, bf);
        const float* bp = with_bias ? b.data() : nullptr;
        Guarded y(1, c.Cout * Lout, c.Cout * Lout);
        kern::conv1d(pool, x.data(), c.Cin, c.L, w.data(), bp, c.Cout, c.K, c.stride, c.pad, c.dil, y.data(), store);
        std::vector<float> ref(size_t(c.Cout * Lout));
        ref::conv1d(pool, x.data(), c.Cin, c.L, w.data(), bp, c.Cout, c.K, c.stride, c.pad, c.dil, ref.data(), store);
        EXPECT_EQ(y.touched_outside(), 0);
        EXPECT_EQ(y.untouched_inside(), 0);
        EXPECT_EQ(test::count_violations("conv1d", y.data(), Lout, ref.data(), c.Cout, Lout,
                                         [&](int64_t co, int64_t t, float e) {
                                           double s = bp ? std::fabs(bp[co]) : 0;
                                           for (int64_t ci = 0; ci < c.Cin; ++ci)
                                             for (int k = 0; k < c.K; ++k) {
                                               const int64_t src = t * c.stride - c.pad + int64_t(k) * c.dil;
                                               if (src >= 0 && src < c.L)
                                                 s += std::fabs(w[(co * c.Cin + ci) * c.K + k] * x[ci * c.L + src]);
                                             }
                                           return conv_tol(s, c.Cin * c.K, store, e);
                                         }),
                  0);
        if (bf) {
          EXPECT_EQ(test::count_non_bf16(y.data(), Lout, c.Cout, Lout), 0);
        }
      }
}

struct ConvTCase {
  int64_t Cin, Cout, L;
  int K, stride, pad, out_pad;
};

std::vector<ConvTCase> convt_cases() {
  std::vector<ConvTCase> v;
  for (int s : {2, 4, 8})  // the vocoder's upsampler: kernel 2s, stride s, padding ceil(s/2)
    for (int64_t L : {1, 7}) v.push_back({5, 3, L, 2 * s, s, (s + 1) / 2, 0});
  v.push_back({3, 4, 9, 3, 1, 0, 0});
  v.push_back({4, 2, 6, 5, 3, 2, 1});   // output_padding
  v.push_back({2, 3, 8, 4, 2, 0, 0});
  v.push_back({3, 512, 300, 16, 8, 4, 0});  // spans several column tiles
  return v;
}

TEST(KernelsConv, ConvTranspose1dMatchesRef) {
  ThreadPool pool(2);
  Rng rng(42);
  for (const auto& c : convt_cases())
    for (DType store : {DType::F32, DType::BF16})
      for (bool with_bias : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "Cin=" << c.Cin << " Cout=" << c.Cout << " L=" << c.L << " K=" << c.K
                                          << " s=" << c.stride << " p=" << c.pad << " op=" << c.out_pad
                                          << " store=" << test::store_name(store) << " bias=" << with_bias);
        const bool bf = store == DType::BF16;
        const int64_t Lout = kern::conv_transpose1d_out_len(c.L, c.K, c.stride, c.pad, c.out_pad);
        if (c.K == 2 * c.stride && c.pad == (c.stride + 1) / 2) {
          EXPECT_EQ(Lout, c.stride * c.L);  // MODEL.md §5.1
        }
        std::vector<float> x = rng.vec(size_t(c.Cin * c.L), -2, 2, bf);
        std::vector<float> w = rng.vec(size_t(c.Cin * c.Cout * c.K), -1, 1, bf);
        std::vector<float> b = rng.vec(size_t(c.Cout), -1, 1, bf);
        const float* bp = with_bias ? b.data() : nullptr;
        Guarded y(1, c.Cout * Lout, c.Cout * Lout);
        kern::conv_transpose1d(pool, x.data(), c.Cin, c.L, w.data(), bp, c.Cout, c.K, c.stride, c.pad, c.out_pad,
                               y.data(), store);
        std::vector<float> ref(size_t(c.Cout * Lout));
        ref::conv_transpose1d(pool, x.data(), c.Cin, c.L, w.data(), bp, c.Cout, c.K, c.stride, c.pad, c.out_pad,
                              ref.data(), store);
        EXPECT_EQ(y.touched_outside(), 0);
        EXPECT_EQ(y.untouched_inside(), 0);
        EXPECT_EQ(test::count_violations("conv_transpose1d", y.data(), Lout, ref.data(), c.Cout, Lout,
                                         [&](int64_t co, int64_t o, float e) {
                                           double s = bp ? std::fabs(bp[co]) : 0;
                                           for (int k = 0; k < c.K; ++k) {
                                             const int64_t num = o + c.pad - k;
                                             if (num < 0 || num % c.stride || num / c.stride >= c.L) continue;
                                             for (int64_t ci = 0; ci < c.Cin; ++ci)
                                               s += std::fabs(w[(ci * c.Cout + co) * c.K + k] *
                                                              x[ci * c.L + num / c.stride]);
                                           }
                                           return conv_tol(s, c.Cin * c.K, store, e);
                                         }),
                  0);
        if (bf) {
          EXPECT_EQ(test::count_non_bf16(y.data(), Lout, c.Cout, Lout), 0);
        }
      }
}

}  // namespace
}  // namespace mm3

namespace mm3 {
namespace {

// Same call twice is bitwise equal, and so is the result with 1 and 2 threads.
TEST(KernelsConv, DeterministicAndThreadCountIndependent) {
  ThreadPool p1(1), p2(2);
  test::Rng rng(43);
  const int64_t Cin = 96, Cout = 80, L = 700;
  std::vector<float> x = rng.vec(size_t(Cin * L), -1, 1), w = rng.vec(size_t(Cout * Cin * 7), -1, 1);
  std::vector<float> wt = rng.vec(size_t(Cin * Cout * 8), -1, 1), b = rng.vec(size_t(Cout), -1, 1);
  const int64_t Lo = kern::conv1d_out_len(L, 7, 1, 9, 3), Lt = kern::conv_transpose1d_out_len(L, 8, 4, 2, 0);
  std::vector<float> a(size_t(Cout * Lo)), c(a.size()), d(a.size()), at(size_t(Cout * Lt)), ct(at.size()), dt(at.size());
  kern::conv1d(p2, x.data(), Cin, L, w.data(), b.data(), Cout, 7, 1, 9, 3, a.data(), DType::F32);
  kern::conv1d(p2, x.data(), Cin, L, w.data(), b.data(), Cout, 7, 1, 9, 3, c.data(), DType::F32);
  kern::conv1d(p1, x.data(), Cin, L, w.data(), b.data(), Cout, 7, 1, 9, 3, d.data(), DType::F32);
  EXPECT_EQ(std::memcmp(a.data(), c.data(), a.size() * 4), 0) << "conv1d: two identical calls differ";
  EXPECT_EQ(std::memcmp(a.data(), d.data(), a.size() * 4), 0) << "conv1d: 1 and 2 threads differ";
  kern::conv_transpose1d(p2, x.data(), Cin, L, wt.data(), b.data(), Cout, 8, 4, 2, 0, at.data(), DType::F32);
  kern::conv_transpose1d(p2, x.data(), Cin, L, wt.data(), b.data(), Cout, 8, 4, 2, 0, ct.data(), DType::F32);
  kern::conv_transpose1d(p1, x.data(), Cin, L, wt.data(), b.data(), Cout, 8, 4, 2, 0, dt.data(), DType::F32);
  EXPECT_EQ(std::memcmp(at.data(), ct.data(), at.size() * 4), 0) << "conv_transpose1d: two identical calls differ";
  EXPECT_EQ(std::memcmp(at.data(), dt.data(), at.size() * 4), 0) << "conv_transpose1d: 1 and 2 threads differ";
}

}  // namespace
}  // namespace mm3
