// conv_snake.cpp — the Snake activation row (conv_detail.h), used by kern::snake and by the direct
// convolution's fused input pass (conv_direct.cpp); MODEL.md §5.1.
//
// Snake is x + (alpha + 1e-9).reciprocal() * sin(alpha * x).pow(2): torch's ops mul, sin, pow, mul, add
// (each rounded to bf16 in a bf16 run; fp32 otherwise, fp-contract off so no FMA merges two of them).
// The vocoder evaluates ~1e9 sines per window, so sin is vectorised (AVX-512, 16 lanes):
//   j = nearest(x · 2/π); r = x − j·(π/2) by a three-part Cody–Waite split with FMAs. For |x| <= 8192
//   the first step is exact (x and j·P1 are both multiples of 2^-23 or finer and |r| < 1), so r is
//   good to ~1 ulp even next to a multiple of π/2; then sin r or cos r (Cephes sinf / cosf
//   polynomials on |r| <= π/4) by the quadrant j mod 4. Measured: at most 1.52 ulps of the true
//   sine's binade over every float within 4 ulps of a multiple of π/2 and 2M random |x| <= 8192
//   (tests/unit/kernels_conv_snake.cpp checks <= 2).
// Lanes with |x| > 8192, inf or NaN take std::sin (glibc sinf, which reduces exactly). torch itself
// uses SLEEF's 1-ulp vector sinf, so neither matches torch bit for bit; all are within ~1-2 ulps.
// That sine serves the bf16 Snake, whose every op rounds to bf16 as torch's do. The fp32 Snake, since
// the thirtieth session, takes sin² in one sequence instead (sin2_512: the same reduction, then a
// polynomial for sin² r, 1 − sin² r in the odd quadrants): 3.32 ulps at worst where the sine squared
// is 3.23, ~1/4 fewer operations. One thread, vocoder_L689, binaries alternating ×2: 12.35 / 11.93 ->
// 11.21 / 11.45 s; two threads no different (5.90-6.19 s either way).
// With AVX2 only, the same operations 8 lanes at a time (the same bits, pinned by
// KernelsConvSnake.F32BitsEqualOnAvx512AndAvx2); without either, the plain scalar loop over std::sin.
#pragma GCC optimize("fp-contract=off")

#include <algorithm>
#include <cmath>

#include "kernels/cpu/conv_detail.h"
#include "kernels/cpu/simd.h"

namespace mm3::kern::detail {

namespace {

#define MM3_AVX512_TARGET __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl")))

// sin² r / r² = 1 − z/3 + 2z²/45 − z³/315 + 2z⁴/14175 − 2z⁵/467775 + ..., z = r² (fp32 roundings of the
// Taylor coefficients; the fp32 Snake's sin2_512 and its AVX2 twin).
constexpr float kSin2C1 = float(-1.0 / 3), kSin2C2 = float(2.0 / 45), kSin2C3 = float(-1.0 / 315),
                kSin2C4 = float(2.0 / 14175), kSin2C5 = float(-2.0 / 467775);

MM3_AVX512_TARGET inline __m512 round_bf16_512(__m512 v) {
  __m512i u = _mm512_castps_si512(v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  r = _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
  __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_blend_ps(nan, _mm512_castsi512_ps(r), _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000)));
}

// Each step below runs over the N vectors of a group, unrolled.
#define MM3_EACH _Pragma("GCC unroll 8") for (int k = 0; k < N; ++k)

// sin of N vectors of 16 floats (see the file comment), each step on all N before the next: one
// vector's ~25 dependent operations take ~80 cycles of latency, more than the out-of-order window
// overlaps across loop iterations, so a lone chain runs latency-bound; N side by side in program order
// fill the pipes. Each lane gets the same instructions whatever N is (the same bits).
template <int N>
MM3_AVX512_TARGET inline void sin_512(const __m512 (&x)[N], __m512 (&out)[N]) {
  // π/2 = P1 + P2 + P3 (P1, P2 the fp32 roundings of π/2 and of the remainder).
  const __m512 P1 = _mm512_set1_ps(1.57079637050628662109375f);
  const __m512 P2 = _mm512_set1_ps(-4.371138828673793e-8f);
  const __m512 P3 = _mm512_set1_ps(-1.7151245100058819e-15f);
  __m512 jf[N], r[N], z[N], ps[N], pc[N];
  MM3_EACH jf[k] = _mm512_roundscale_ps(_mm512_mul_ps(x[k], _mm512_set1_ps(0.636619772367581343f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  MM3_EACH r[k] = _mm512_fnmadd_ps(jf[k], P1, x[k]);
  MM3_EACH r[k] = _mm512_fnmadd_ps(jf[k], P2, r[k]);
  MM3_EACH r[k] = _mm512_fnmadd_ps(jf[k], P3, r[k]);
  MM3_EACH z[k] = _mm512_mul_ps(r[k], r[k]);
  // sin r = r + r·z·(s1 + z·(s2 + z·s3)); cos r = 1 − z/2 + z²·(c1 + z·(c2 + z·c3))
  MM3_EACH ps[k] = _mm512_fmadd_ps(_mm512_set1_ps(-1.9515295891e-4f), z[k], _mm512_set1_ps(8.3321608736e-3f));
  MM3_EACH pc[k] = _mm512_fmadd_ps(_mm512_set1_ps(2.443315711809948e-5f), z[k], _mm512_set1_ps(-1.388731625493765e-3f));
  MM3_EACH ps[k] = _mm512_fmadd_ps(ps[k], z[k], _mm512_set1_ps(-1.6666654611e-1f));
  MM3_EACH pc[k] = _mm512_fmadd_ps(pc[k], z[k], _mm512_set1_ps(4.166664568298827e-2f));
  MM3_EACH {
    const __m512 sr = _mm512_fmadd_ps(_mm512_mul_ps(ps[k], z[k]), r[k], r[k]);
    const __m512 cr = _mm512_fmadd_ps(_mm512_mul_ps(pc[k], z[k]), z[k],
                                      _mm512_fnmadd_ps(_mm512_set1_ps(0.5f), z[k], _mm512_set1_ps(1.f)));
    const __m512i j = _mm512_cvtps_epi32(jf[k]);  // exact: jf is an integer, |jf| <= 5216 on the vector path
    const __mmask16 odd = _mm512_test_epi32_mask(j, _mm512_set1_epi32(1));
    const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(j, _mm512_set1_epi32(2)), 30);  // quadrants 2, 3
    out[k] = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_mask_blend_ps(odd, sr, cr)), sign));
  }
}

// std::sin on the lanes `big` of x, sin_512's values v elsewhere (rare: out of line).
__attribute__((noinline, cold)) MM3_AVX512_TARGET __m512 sin_lanes_exact(__m512 x, __m512 v, __mmask16 big) {
  alignas(64) float xs[16], vs[16];
  _mm512_store_ps(xs, x);
  _mm512_store_ps(vs, v);
  for (int l = 0; l < 16; ++l)
    if (big >> l & 1) vs[l] = std::sin(xs[l]);
  return _mm512_load_ps(vs);
}

template <bool BF>
MM3_AVX512_TARGET inline __m512 rnd_t(__m512 v) {
  if constexpr (BF) return round_bf16_512(v);
  return v;
}

// sin(x)^2 of N vectors (fp32 Snake): x reduced as in sin_512 to r = x − j·π/2, |r| <= π/4, then
// sin² r = z·P(z), z = r², P the Taylor series of sin² r / r² through z^5 (its next term is below 1e-8
// of P on |r| <= π/4), and cos² r = 1 − sin² r in the odd quadrants. 10 operations after the
// reduction where sin_512 then squaring take 17, so the fp32 Snake ~1/4 cheaper; not torch's op
// sequence (sin, then pow 2), a value within 3.32 ulps of the true square where the sine squared is
// within 3.23 (KernelsConvSnake.SineSquaredWithinFourUlps). The AVX2 twin runs the same operations.
template <int N>
MM3_AVX512_TARGET inline void sin2_512(const __m512 (&x)[N], __m512 (&out)[N]) {
  const __m512 P1 = _mm512_set1_ps(1.57079637050628662109375f);
  const __m512 P2 = _mm512_set1_ps(-4.371138828673793e-8f);
  const __m512 P3 = _mm512_set1_ps(-1.7151245100058819e-15f);
  __m512 jf[N], r[N], z[N], p[N];
  MM3_EACH jf[k] = _mm512_roundscale_ps(_mm512_mul_ps(x[k], _mm512_set1_ps(0.636619772367581343f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  MM3_EACH r[k] = _mm512_fnmadd_ps(jf[k], P1, x[k]);
  MM3_EACH r[k] = _mm512_fnmadd_ps(jf[k], P2, r[k]);
  MM3_EACH r[k] = _mm512_fnmadd_ps(jf[k], P3, r[k]);
  MM3_EACH z[k] = _mm512_mul_ps(r[k], r[k]);
  MM3_EACH p[k] = _mm512_fmadd_ps(_mm512_set1_ps(kSin2C5), z[k], _mm512_set1_ps(kSin2C4));
  MM3_EACH p[k] = _mm512_fmadd_ps(p[k], z[k], _mm512_set1_ps(kSin2C3));
  MM3_EACH p[k] = _mm512_fmadd_ps(p[k], z[k], _mm512_set1_ps(kSin2C2));
  MM3_EACH p[k] = _mm512_fmadd_ps(p[k], z[k], _mm512_set1_ps(kSin2C1));
  MM3_EACH p[k] = _mm512_fmadd_ps(p[k], z[k], _mm512_set1_ps(1.f));
  MM3_EACH {
    const __m512 s2 = _mm512_mul_ps(z[k], p[k]);
    const __mmask16 odd = _mm512_test_epi32_mask(_mm512_cvtps_epi32(jf[k]), _mm512_set1_epi32(1));
    out[k] = _mm512_mask_sub_ps(s2, odd, _mm512_set1_ps(1.f), s2);
  }
}

// sin² on the lanes `big` of x by std::sin, v elsewhere (rare: out of line).
__attribute__((noinline, cold)) MM3_AVX512_TARGET __m512 sin2_lanes_exact(__m512 x, __m512 v, __mmask16 big) {
  alignas(64) float xs[16], vs[16];
  _mm512_store_ps(xs, x);
  _mm512_store_ps(vs, v);
  for (int l = 0; l < 16; ++l)
    if (big >> l & 1) {
      const float sn = std::sin(xs[l]);
      vs[l] = sn * sn;
    }
  return _mm512_load_ps(vs);
}

// N vectors of Snake (valid: the lanes loaded), step by step across the N vectors as in sin_512:
// bf16, the ops mul, sin, square, mul, add, each rounded; fp32, mul, sin2_512, mul, add.
template <bool BF, int N>
MM3_AVX512_TARGET inline void snake_512(__m512 (&v)[N], __m512 av, __m512 iv, __mmask16 valid) {
  __m512 ax[N], s[N];
  MM3_EACH ax[k] = rnd_t<BF>(_mm512_mul_ps(av, v[k]));
  if constexpr (!BF) {
    sin2_512<N>(ax, s);
    MM3_EACH {
      const __mmask16 big = _mm512_mask_cmp_ps_mask(valid, _mm512_abs_ps(ax[k]), _mm512_set1_ps(8192.f), _CMP_NLE_UQ);
      if (__builtin_expect(big != 0, 0)) s[k] = sin2_lanes_exact(ax[k], s[k], big);
    }
    MM3_EACH s[k] = _mm512_mul_ps(iv, s[k]);
    MM3_EACH v[k] = _mm512_add_ps(v[k], s[k]);
    return;
  }
  sin_512<N>(ax, s);
  MM3_EACH {
    // |ax| > 8192, inf, NaN: std::sin (NLE_UQ is true for NaN).
    const __mmask16 big = _mm512_mask_cmp_ps_mask(valid, _mm512_abs_ps(ax[k]), _mm512_set1_ps(8192.f), _CMP_NLE_UQ);
    if (__builtin_expect(big != 0, 0)) s[k] = sin_lanes_exact(ax[k], s[k], big);
  }
  MM3_EACH s[k] = rnd_t<BF>(s[k]);
  MM3_EACH s[k] = rnd_t<BF>(_mm512_mul_ps(s[k], s[k]));
  MM3_EACH s[k] = rnd_t<BF>(_mm512_mul_ps(iv, s[k]));
  MM3_EACH v[k] = rnd_t<BF>(_mm512_add_ps(v[k], s[k]));
}

// Vectors side by side in snake_row's main loop. One thread, a 1024-float row in L1, Zen 5, cycles per
// 16 values (bf16 / f32): one at a time 42 / 12.9, 2: 33.6 / 12.0, 4: 29.4 / 11.7, 8: 22.5 / 10.8.
// (Dropping the NaN handling of the five bf16 roundings where no value can be NaN saved nothing more:
// 22.1 either way.)
constexpr int kSnakeVecs = 8;

template <bool BF>
MM3_AVX512_TARGET void snake_row_avx512(const float* x, float alpha, float inv, float* y, int64_t n) {
  const __m512 av = _mm512_set1_ps(alpha), iv = _mm512_set1_ps(inv);
  constexpr int N = kSnakeVecs;
  int64_t i = 0;
  for (; i + 16 * N <= n; i += 16 * N) {
    __m512 v[N];
    MM3_EACH v[k] = _mm512_loadu_ps(x + i + 16 * k);
    snake_512<BF, N>(v, av, iv, __mmask16(0xFFFF));
    MM3_EACH _mm512_storeu_ps(y + i + 16 * k, v[k]);
  }
  for (; i < n; i += 16) {  // the rest one vector at a time, the tail on masked lanes
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1u);
    __m512 v[1] = {_mm512_maskz_loadu_ps(m, x + i)};
    snake_512<BF, 1>(v, av, iv, m);
    _mm512_mask_storeu_ps(y + i, m, v[0]);
  }
}

#undef MM3_EACH

MM3_AVX512_TARGET void sin2_row_avx512(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1u);
    const __m512 v[1] = {_mm512_maskz_loadu_ps(m, x + i)};
    __m512 s[1];
    sin2_512<1>(v, s);
    const __mmask16 big = _mm512_mask_cmp_ps_mask(m, _mm512_abs_ps(v[0]), _mm512_set1_ps(8192.f), _CMP_NLE_UQ);
    if (big) s[0] = sin2_lanes_exact(v[0], s[0], big);
    _mm512_mask_storeu_ps(y + i, m, s[0]);
  }
}

MM3_AVX512_TARGET void sin_row_avx512(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1u);
    const __m512 xv = _mm512_maskz_loadu_ps(m, x + i);
    __m512 v[1] = {xv}, sv[1];
    sin_512<1>(v, sv);
    __m512 s = sv[0];
    const __mmask16 big = _mm512_mask_cmp_ps_mask(m, _mm512_abs_ps(xv), _mm512_set1_ps(8192.f), _CMP_NLE_UQ);
    if (big) s = sin_lanes_exact(xv, s, big);
    _mm512_mask_storeu_ps(y + i, m, s);
  }
}

// ---- AVX2 (CPUs without AVX-512): sin_512's operations 8 lanes at a time, so the same bits ----

#define MM3_SNAKE_AVX2 __attribute__((target("avx2,fma")))

// Vectors side by side in snake_row_avx2's main loop. Measured on Zen 5 under MM3_ISA=avx2 (not on an
// AVX2-only CPU), one thread, cycles per 16 values bf16 / f32: one at a time 86.9 / 28.4, 2: 68.0 / 24.6,
// 4: 56.6 / 24.5, 8: 43.6 / 21.9 (the 16 ymm registers spill at 8, and it is still the fastest).
constexpr int kSnakeVecsAvx2 = 8;

// N vectors side by side, each step across all N (see sin_512).
#define MM3_EACH _Pragma("GCC unroll 8") for (int k = 0; k < N; ++k)
template <int N>
MM3_SNAKE_AVX2 inline void sin_256x(const __m256 (&x)[N], __m256 (&out)[N]) {
  const __m256 P1 = _mm256_set1_ps(1.57079637050628662109375f);
  const __m256 P2 = _mm256_set1_ps(-4.371138828673793e-8f);
  const __m256 P3 = _mm256_set1_ps(-1.7151245100058819e-15f);
  __m256 jf[N], r[N], z[N], ps[N], pc[N];
  MM3_EACH jf[k] = _mm256_round_ps(_mm256_mul_ps(x[k], _mm256_set1_ps(0.636619772367581343f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  MM3_EACH r[k] = _mm256_fnmadd_ps(jf[k], P1, x[k]);
  MM3_EACH r[k] = _mm256_fnmadd_ps(jf[k], P2, r[k]);
  MM3_EACH r[k] = _mm256_fnmadd_ps(jf[k], P3, r[k]);
  MM3_EACH z[k] = _mm256_mul_ps(r[k], r[k]);
  MM3_EACH ps[k] = _mm256_fmadd_ps(_mm256_set1_ps(-1.9515295891e-4f), z[k], _mm256_set1_ps(8.3321608736e-3f));
  MM3_EACH pc[k] = _mm256_fmadd_ps(_mm256_set1_ps(2.443315711809948e-5f), z[k], _mm256_set1_ps(-1.388731625493765e-3f));
  MM3_EACH ps[k] = _mm256_fmadd_ps(ps[k], z[k], _mm256_set1_ps(-1.6666654611e-1f));
  MM3_EACH pc[k] = _mm256_fmadd_ps(pc[k], z[k], _mm256_set1_ps(4.166664568298827e-2f));
  MM3_EACH {
    const __m256 sr = _mm256_fmadd_ps(_mm256_mul_ps(ps[k], z[k]), r[k], r[k]);
    const __m256 cr = _mm256_fmadd_ps(_mm256_mul_ps(pc[k], z[k]), z[k],
                                      _mm256_fnmadd_ps(_mm256_set1_ps(0.5f), z[k], _mm256_set1_ps(1.f)));
    const __m256i j = _mm256_cvtps_epi32(jf[k]);
    const __m256 odd =
        _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(j, _mm256_set1_epi32(1)), _mm256_set1_epi32(1)));
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(j, _mm256_set1_epi32(2)), 30);
    out[k] = _mm256_castsi256_ps(_mm256_xor_si256(_mm256_castps_si256(_mm256_blendv_ps(sr, cr, odd)), sign));
  }
}

MM3_SNAKE_AVX2 inline __m256 sin_256(__m256 x) {
  const __m256 v[1] = {x};
  __m256 s[1];
  sin_256x<1>(v, s);
  return s[0];
}

// Lanes of x (the first n) that sin_256 does not take: |x| > 8192, inf, NaN (NLE_UQ), as a bit mask.
MM3_SNAKE_AVX2 inline int big_lanes_256(__m256 x, int n) {
  const __m256 ax = _mm256_andnot_ps(_mm256_set1_ps(-0.f), x);
  const int m = _mm256_movemask_ps(_mm256_cmp_ps(ax, _mm256_set1_ps(8192.f), _CMP_NLE_UQ));
  return n >= 8 ? m : m & ((1 << n) - 1);
}

MM3_SNAKE_AVX2 inline __m256 sin_fix_256(__m256 x, __m256 v, int big) {
  if (__builtin_expect(big == 0, 1)) return v;
  alignas(32) float xs[8], vs[8];
  _mm256_store_ps(xs, x);
  _mm256_store_ps(vs, v);
  for (int l = 0; l < 8; ++l)
    if (big >> l & 1) vs[l] = std::sin(xs[l]);
  return _mm256_load_ps(vs);
}

// sin2_512's operations on 8 lanes (the same bits).
template <int N>
MM3_SNAKE_AVX2 inline void sin2_256x(const __m256 (&x)[N], __m256 (&out)[N]) {
  const __m256 P1 = _mm256_set1_ps(1.57079637050628662109375f);
  const __m256 P2 = _mm256_set1_ps(-4.371138828673793e-8f);
  const __m256 P3 = _mm256_set1_ps(-1.7151245100058819e-15f);
  __m256 jf[N], r[N], z[N], p[N];
  MM3_EACH jf[k] = _mm256_round_ps(_mm256_mul_ps(x[k], _mm256_set1_ps(0.636619772367581343f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  MM3_EACH r[k] = _mm256_fnmadd_ps(jf[k], P1, x[k]);
  MM3_EACH r[k] = _mm256_fnmadd_ps(jf[k], P2, r[k]);
  MM3_EACH r[k] = _mm256_fnmadd_ps(jf[k], P3, r[k]);
  MM3_EACH z[k] = _mm256_mul_ps(r[k], r[k]);
  MM3_EACH p[k] = _mm256_fmadd_ps(_mm256_set1_ps(kSin2C5), z[k], _mm256_set1_ps(kSin2C4));
  MM3_EACH p[k] = _mm256_fmadd_ps(p[k], z[k], _mm256_set1_ps(kSin2C3));
  MM3_EACH p[k] = _mm256_fmadd_ps(p[k], z[k], _mm256_set1_ps(kSin2C2));
  MM3_EACH p[k] = _mm256_fmadd_ps(p[k], z[k], _mm256_set1_ps(kSin2C1));
  MM3_EACH p[k] = _mm256_fmadd_ps(p[k], z[k], _mm256_set1_ps(1.f));
  MM3_EACH {
    const __m256 s2 = _mm256_mul_ps(z[k], p[k]);
    const __m256i j = _mm256_cvtps_epi32(jf[k]);
    const __m256 odd =
        _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(j, _mm256_set1_epi32(1)), _mm256_set1_epi32(1)));
    out[k] = _mm256_blendv_ps(s2, _mm256_sub_ps(_mm256_set1_ps(1.f), s2), odd);
  }
}

// sin2_256 with std::sin's square on the lanes `big` (rare).
MM3_SNAKE_AVX2 inline __m256 sin2_fix_256(__m256 x, __m256 v, int big) {
  if (__builtin_expect(big == 0, 1)) return v;
  alignas(32) float xs[8], vs[8];
  _mm256_store_ps(xs, x);
  _mm256_store_ps(vs, v);
  for (int l = 0; l < 8; ++l)
    if (big >> l & 1) {
      const float sn = std::sin(xs[l]);
      vs[l] = sn * sn;
    }
  return _mm256_load_ps(vs);
}

// sin2_row on AVX2: 8 values (m valid) through sin2_256x.
MM3_SNAKE_AVX2 void sin2_row8_avx2(const float* xs, float* out, int m) {
  const __m256 v[1] = {_mm256_load_ps(xs)};
  __m256 s[1];
  sin2_256x<1>(v, s);
  _mm256_store_ps(out, sin2_fix_256(v[0], s[0], big_lanes_256(v[0], m)));
}

// fp32 Snake rows on AVX2: mul, sin2_256x, mul, add (snake_512's fp32 operations).
MM3_SNAKE_AVX2 void snake_row_avx2_f32(const float* x, float alpha, float inv, float* y, int64_t n) {
  const __m256 av = _mm256_set1_ps(alpha), iv = _mm256_set1_ps(inv);
  constexpr int N = kSnakeVecsAvx2;
  int64_t i = 0;
  for (; i + 8 * N <= n; i += 8 * N) {
    __m256 v[N], ax[N], s[N];
    MM3_EACH v[k] = _mm256_loadu_ps(x + i + 8 * k);
    MM3_EACH ax[k] = _mm256_mul_ps(av, v[k]);
    sin2_256x<N>(ax, s);
    MM3_EACH s[k] = sin2_fix_256(ax[k], s[k], big_lanes_256(ax[k], 8));
    MM3_EACH _mm256_storeu_ps(y + i + 8 * k, _mm256_add_ps(v[k], _mm256_mul_ps(iv, s[k])));
  }
  for (; i < n; i += 8) {  // the rest 8 at a time, the tail through a zero-padded vector
    const int m = static_cast<int>(std::min<int64_t>(8, n - i));
    alignas(32) float xs[8] = {}, out[8];
    for (int l = 0; l < m; ++l) xs[l] = x[i + l];
    const __m256 v[1] = {_mm256_load_ps(xs)};
    const __m256 ax[1] = {_mm256_mul_ps(av, v[0])};
    __m256 s[1];
    sin2_256x<1>(ax, s);
    s[0] = sin2_fix_256(ax[0], s[0], big_lanes_256(ax[0], m));
    _mm256_store_ps(out, _mm256_add_ps(v[0], _mm256_mul_ps(iv, s[0])));
    for (int l = 0; l < m; ++l) y[i + l] = out[l];
  }
}

template <bool BF>
MM3_SNAKE_AVX2 inline __m256 rnd8(__m256 v) {
  if constexpr (BF) return round_bf16_v8(v);
  return v;
}

template <bool BF>
MM3_SNAKE_AVX2 void snake_row_avx2(const float* x, float alpha, float inv, float* y, int64_t n) {
  if constexpr (!BF) {
    snake_row_avx2_f32(x, alpha, inv, y, n);
    return;
  }
  const __m256 av = _mm256_set1_ps(alpha), iv = _mm256_set1_ps(inv);
  constexpr int N = kSnakeVecsAvx2;
  int64_t i = 0;
  for (; i + 8 * N <= n; i += 8 * N) {
    __m256 v[N], ax[N], s[N];
    MM3_EACH v[k] = _mm256_loadu_ps(x + i + 8 * k);
    MM3_EACH ax[k] = rnd8<BF>(_mm256_mul_ps(av, v[k]));
    sin_256x<N>(ax, s);
    MM3_EACH s[k] = rnd8<BF>(sin_fix_256(ax[k], s[k], big_lanes_256(ax[k], 8)));
    MM3_EACH s[k] = rnd8<BF>(_mm256_mul_ps(s[k], s[k]));
    MM3_EACH s[k] = rnd8<BF>(_mm256_mul_ps(iv, s[k]));
    MM3_EACH _mm256_storeu_ps(y + i + 8 * k, rnd8<BF>(_mm256_add_ps(v[k], s[k])));
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
    const __m256 ax = rnd8<BF>(_mm256_mul_ps(av, xv));
    const __m256 s = rnd8<BF>(sin_fix_256(ax, sin_256(ax), big_lanes_256(ax, 8)));
    const __m256 tm = rnd8<BF>(_mm256_mul_ps(iv, rnd8<BF>(_mm256_mul_ps(s, s))));
    _mm256_storeu_ps(y + i, rnd8<BF>(_mm256_add_ps(xv, tm)));
  }
  for (; i < n; ++i) {  // the tail: scalar, with sin_256's value for the lane
    alignas(32) float xs[8] = {}, out[8];
    xs[0] = alpha * x[i];
    if (BF) xs[0] = round_bf16(xs[0]);
    const __m256 xv = _mm256_load_ps(xs);
    _mm256_store_ps(out, sin_fix_256(xv, sin_256(xv), big_lanes_256(xv, 1)));
    const float sv = BF ? round_bf16(out[0]) : out[0];
    const float sq = BF ? round_bf16(sv * sv) : sv * sv;
    const float tm = BF ? round_bf16(inv * sq) : inv * sq;
    y[i] = BF ? round_bf16(x[i] + tm) : x[i] + tm;
  }
}

#undef MM3_EACH

MM3_SNAKE_AVX2 void sin_row_avx2(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
    _mm256_storeu_ps(y + i, sin_fix_256(xv, sin_256(xv), big_lanes_256(xv, 8)));
  }
  if (i < n) {
    alignas(32) float xs[8] = {}, out[8];
    for (int64_t k = i; k < n; ++k) xs[k - i] = x[k];
    const __m256 xv = _mm256_load_ps(xs);
    _mm256_store_ps(out, sin_fix_256(xv, sin_256(xv), big_lanes_256(xv, static_cast<int>(n - i))));
    for (int64_t k = i; k < n; ++k) y[k] = out[k - i];
  }
}

}  // namespace

void sin2_row(const float* x, float* y, int64_t n) {
  if (cpu_has_avx512()) {
    sin2_row_avx512(x, y, n);
    return;
  }
  if (cpu_has_avx2_fma()) {
    for (int64_t i = 0; i < n; i += 8) {
      const int m = static_cast<int>(std::min<int64_t>(8, n - i));
      alignas(32) float xs[8] = {}, out[8];
      for (int l = 0; l < m; ++l) xs[l] = x[i + l];
      sin2_row8_avx2(xs, out, m);
      for (int l = 0; l < m; ++l) y[i + l] = out[l];
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const float s = std::sin(x[i]);
    y[i] = s * s;
  }
}

void sin_row(const float* x, float* y, int64_t n) {
  if (cpu_has_avx512()) {
    sin_row_avx512(x, y, n);
    return;
  }
  if (cpu_has_avx2_fma()) {
    sin_row_avx2(x, y, n);
    return;
  }
  for (int64_t i = 0; i < n; ++i) y[i] = std::sin(x[i]);
}

float snake_inv(float alpha, DType store) {
  return store == DType::BF16 ? round_bf16(1.0f / round_bf16(alpha + 1e-9f)) : 1.0f / (alpha + 1e-9f);
}

void snake_row(const float* x, float alpha, float inv, float* y, int64_t n, DType store) {
  const bool bf = store == DType::BF16;
  if (cpu_has_avx512()) {
    if (bf)
      snake_row_avx512<true>(x, alpha, inv, y, n);
    else
      snake_row_avx512<false>(x, alpha, inv, y, n);
    return;
  }
  if (cpu_has_avx2_fma()) {
    if (bf)
      snake_row_avx2<true>(x, alpha, inv, y, n);
    else
      snake_row_avx2<false>(x, alpha, inv, y, n);
    return;
  }
  for (int64_t t = 0; t < n; ++t) {
    const float xv = x[t];
    if (bf) {
      const float s = round_bf16(std::sin(round_bf16(alpha * xv)));
      y[t] = round_bf16(xv + round_bf16(inv * round_bf16(s * s)));
    } else {
      const float s = std::sin(alpha * xv);
      y[t] = xv + inv * (s * s);
    }
  }
}

}  // namespace mm3::kern::detail
