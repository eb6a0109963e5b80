// kernels_elementwise.cpp — kern::silu_mul, silu, add, tanh_inplace, snake against their ref twins:
// odd lengths, guard zones, both store dtypes. In bf16 the twin rounds at the same op boundaries, so
// beyond a 1-ulp tolerance almost every value must be bit-identical (a misplaced rounding is not).
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

constexpr int64_t kN = 1001;

// Common checks for an n-element output: guards, tolerance, bf16-ness, and (bf16) near bit-identity.
template <class TolFn>
void check_out(const char* what, const Guarded& y, const std::vector<float>& ref, DType store, TolFn tol,
               int64_t max_bit_diffs) {
  const int64_t n = static_cast<int64_t>(ref.size());
  EXPECT_EQ(y.touched_outside(), 0) << what;
  EXPECT_EQ(y.untouched_inside(), 0) << what;
  EXPECT_EQ(test::count_violations(what, y.data(), n, ref.data(), 1, n, tol), 0);
  if (store == DType::BF16) {
    EXPECT_EQ(test::count_non_bf16(y.data(), n, 1, n), 0) << what;
    EXPECT_LE(test::count_bit_diffs(y.data(), n, ref.data(), 1, n), max_bit_diffs) << what;
  }
}

TEST(KernelsElementwise, SiluMulMatchesRef) {
  Rng rng(31);
  for (DType store : {DType::F32, DType::BF16}) {
    const bool bf = store == DType::BF16;
    std::vector<float> g = rng.vec(kN, -8, 8, bf), u = rng.vec(kN, -3, 3, bf), ref(kN);
    Guarded y(1, kN, kN);
    kern::silu_mul(g.data(), u.data(), y.data(), kN, store);
    ref::silu_mul(g.data(), u.data(), ref.data(), kN, store);
    check_out("silu_mul", y, ref, store,
              [&](int64_t, int64_t i, float e) {
                // fp32: exp, add, divide, multiply, a few ulps; bf16: a flip of silu(g) (x|up|) and of
                // the product.
                return bf ? test::bf16_ulp(e) + std::fabs(u[i]) * test::bf16_ulp(e / u[i])
                          : 6 * test::kEps32 * std::fabs(e);
              },
              kN / 100);
  }
}

// silu_mul_bf16 (the DiT's GLU in bf16: ff_in's unrounded fp32 output in, bf16 bits out) is
// silu_mul(round_bf16(gate), round_bf16(up), BF16) bit for bit, on unrounded inputs, odd lengths (the
// vector tail) and a NaN lane; nothing written past n.
TEST(KernelsElementwise, SiluMulBf16IsSiluMulOnRoundedInputs) {
  Rng rng(33);
  for (int64_t n : {int64_t(1), int64_t(15), int64_t(16), int64_t(17), kN}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    std::vector<float> g = rng.vec(static_cast<size_t>(n), -8, 8, false),
                       u = rng.vec(static_cast<size_t>(n), -3, 3, false);
    if (n > 3) g[2] = std::nanf("");
    std::vector<float> gr(g), ur(u), want(static_cast<size_t>(n));
    round_to_store(gr.data(), gr.size(), DType::BF16);
    round_to_store(ur.data(), ur.size(), DType::BF16);
    kern::silu_mul(gr.data(), ur.data(), want.data(), n, DType::BF16);
    std::vector<uint16_t> got(static_cast<size_t>(n + 9), 0xBEEF);
    kern::silu_mul_bf16(g.data(), u.data(), got.data(), n);
    int64_t diffs = 0;
    for (int64_t i = 0; i < n; ++i)
      diffs += got[static_cast<size_t>(i)] != f32_to_bf16_bits(want[static_cast<size_t>(i)]);
    EXPECT_EQ(diffs, 0);
    for (int64_t i = n; i < n + 9; ++i) EXPECT_EQ(got[static_cast<size_t>(i)], 0xBEEF) << "wrote past n at " << i;
  }
}

TEST(KernelsElementwise, SiluMatchesRef) {
  Rng rng(32);
  for (DType store : {DType::F32, DType::BF16}) {
    const bool bf = store == DType::BF16;
    std::vector<float> x = rng.vec(kN, -10, 10, bf), ref(kN);
    Guarded y(1, kN, kN);
    kern::silu(x.data(), y.data(), kN, store);
    ref::silu(x.data(), ref.data(), kN, store);
    check_out("silu", y, ref, store,
              [&](int64_t, int64_t, float e) { return bf ? test::bf16_ulp(e) : 5 * test::kEps32 * std::fabs(e); },
              kN / 100);
  }
}

TEST(KernelsElementwise, AddMatchesRefExactly) {
  Rng rng(33);
  for (DType store : {DType::F32, DType::BF16}) {
    const bool bf = store == DType::BF16;
    std::vector<float> a = rng.vec(kN, -5, 5, bf), b = rng.vec(kN, -5, 5, bf), ref(kN);
    Guarded y(1, kN, kN);
    kern::add(a.data(), b.data(), y.data(), kN, store);
    ref::add(a.data(), b.data(), ref.data(), kN, store);
    // A float sum is exact in double, so the twin's rounding is the kernel's: bit equality.
    check_out("add", y, ref, store, [](int64_t, int64_t, float) { return 0.0; }, 0);
  }
}

TEST(KernelsElementwise, TanhMatchesRef) {
  Rng rng(34);
  for (DType store : {DType::F32, DType::BF16}) {
    const bool bf = store == DType::BF16;
    std::vector<float> x = rng.vec(kN, -4, 4, bf), ref = x;
    Guarded y(1, kN, kN);
    for (int64_t i = 0; i < kN; ++i) y.data()[i] = x[i];
    kern::tanh_inplace(y.data(), kN, store);
    ref::tanh_inplace(ref.data(), kN, store);
    check_out("tanh", y, ref, store,
              [&](int64_t, int64_t, float e) { return bf ? test::bf16_ulp(e) : 3 * test::kEps32 * std::fabs(e); },
              kN / 100);
  }
}

TEST(KernelsElementwise, SnakeMatchesRef) {
  Rng rng(35);
  const int64_t C = 5, L = 97;
  for (DType store : {DType::F32, DType::BF16}) {
    const bool bf = store == DType::BF16;
    std::vector<float> x = rng.vec(size_t(C * L), -3, 3, bf), alpha = rng.vec(size_t(C), 0.2f, 2.f, bf);
    std::vector<float> ref(size_t(C * L));
    Guarded y(1, C * L, C * L);
    kern::snake(x.data(), alpha.data(), y.data(), C, L, store);
    ref::snake(x.data(), alpha.data(), ref.data(), C, L, store);
    check_out("snake", y, ref, store,
              [&](int64_t, int64_t i, float e) {
                // The periodic term is bounded by 1/alpha; its error (sin's argument is |alpha x|) is
                // a few ulps of |x| + 1/alpha. In bf16 several staged roundings may flip.
                const double scale = std::fabs(x[i]) + 1.0 / alpha[i / L];
                return bf ? 2 * test::bf16_ulp(e) + test::bf16_ulp(float(scale)) : 8 * test::kEps32 * scale;
              },
              C * L / 50);
  }
}

}  // namespace
}  // namespace mm3
