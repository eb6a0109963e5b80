// simd.h — private helpers shared by the CPU kernels (src/kernels/cpu/*.cpp); not part of kernels.h.
//
// Rounding follows core/dtype.h (torch c10 round_to_nearest_even, NaN -> 0x7FC0) bit for bit; the
// AVX-512 variant uses integer arithmetic rather than VCVTNEPS2BF16 because that instruction flushes
// denormals, which torch does not.
//
// Files including this header compile with fp-contract off (see the pragma in each .cpp): torch runs
// `a * b + c` of separate ops as separate roundings, so an implicit FMA would be a (tiny) divergence.
// Wherever an FMA is wanted (dot products) it is written explicitly.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include <immintrin.h>

// GCC 12 reports its own _mm*_undefined_* helpers (used inside several AVX-512 intrinsics, e.g.
// _mm512_reduce_add_ps) as "(maybe) uninitialized" (GCC PR 105593); that false positive would fail
// -Werror in every kernel file.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "core/dtype.h"
#include "core/errors.h"

namespace mm3::kern::detail {

// Cached CPU feature probes (runtime dispatch for the kernels that have several ISA variants).
bool cpu_has_avx512bf16();
bool cpu_has_avx512();
bool cpu_has_avx2_fma();
bool cpu_has_amx_bf16();  // AMX-BF16 tiles (oneDNN's brgemm then runs bf16 GEMMs on them)
bool cpu_has_amx_int8();  // AMX-INT8 tiles (oneDNN's brgemm then runs int8 GEMMs on them)
bool cpu_has_avx512vnni();  // AVX-512 and its VPDPBUSD (the int8 decode GEMV, gemm_i8.cpp's GEMM)
// Whether VDPBF16PS gives the bits of two fp32 FMAs, the high halves' first, under DAZ and FTZ (a check
// on pseudo-random operands; needs AVX512-BF16): what the bf16 pairs' FMA forms compute.
bool bf16_dot_is_two_fmas();
// AVX512-BF16 whose VDPBF16PS runs slower than two fp32 FMAs (a timing probe at first use, ~0.1 ms)
// and gives their bits (bf16_dot_is_two_fmas); false without AVX512-BF16. The bf16 pair dots then run
// as two FMAs each (strips.h, gemm_nt.cpp): the same bits, faster.
bool cpu_bf16_dot_slow();
// The probe's reading: one VDPBF16PS's time over one FMA's, at full throughput (0 without AVX512-BF16).
double bf16_dot_cost();
// Whether the bf16 pair dots run as two FMAs each (the same bits): the knob bf16_dot (tuning.h), else
// cpu_bf16_dot_slow(). Needs AVX512-BF16 to matter (the pairs' forms run only there).
bool bf16_dot_fma();
// All five honour MM3_ISA (a cap, see linear.cpp). isa_name(): the best level they allow.
const char* isa_name();
// The L1 data cache of a core in bytes (sysconf; 32 KiB when the system does not say).
int64_t cpu_l1d_bytes();

// A 16 x 16 transpose of 4-byte words: dst[c] (64 bytes) receives word c of each of the 64-byte
// src[i], word i coming from src[i]. Three rounds of shuffles: dwords of row pairs, qwords of row quads,
// then 128-bit lanes (row quads x word groups). (The strip forms' packing at load: strips.cpp,
// quant.cpp with_strips.)
__attribute__((target("avx512f"))) inline void transpose16x16_epi32(const void* const* src, void* const* dst) {
  __m512i r[16], t[16], u[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src[i]);
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4i + e], lane L: word 4L + e of rows 4i .. 4i + 3.
  for (int i = 0; i < 4; ++i) {
    u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int e = 0; e < 4; ++e) {
    const __m512i s0 = _mm512_shuffle_i32x4(u[e], u[4 + e], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512i s1 = _mm512_shuffle_i32x4(u[e], u[4 + e], _MM_SHUFFLE(3, 1, 3, 1));
    const __m512i s2 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512i s3 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], _MM_SHUFFLE(3, 1, 3, 1));
    _mm512_storeu_si512(dst[e], _mm512_shuffle_i32x4(s0, s2, _MM_SHUFFLE(2, 0, 2, 0)));       // word e
    _mm512_storeu_si512(dst[4 + e], _mm512_shuffle_i32x4(s1, s3, _MM_SHUFFLE(2, 0, 2, 0)));   // e + 4
    _mm512_storeu_si512(dst[8 + e], _mm512_shuffle_i32x4(s0, s2, _MM_SHUFFLE(3, 1, 3, 1)));   // e + 8
    _mm512_storeu_si512(dst[12 + e], _mm512_shuffle_i32x4(s1, s3, _MM_SHUFFLE(3, 1, 3, 1)));  // e + 12
  }
}

#if defined(__AVX512F__)
// 16 floats rounded to bf16 values (kept as floats), identical to round_bf16 lane by lane. (A VCVTNEPS2BF16
// form, guarded against NaN and subnormal lanes, measured slower in silu_mul_bf16: 5.1 -> 5.6 us for
// 8192 floats in L1; the 32-wide VCVTNE2PS2BF16 into bf16 bits does pay, see f32_to_bf16.)
inline __m512 round_bf16_v(__m512 v) {
  __m512i u = _mm512_castps_si512(v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  r = _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
  __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_blend_ps(nan, _mm512_castsi512_ps(r), _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000)));
}
inline __m512 round_store_v(__m512 v, DType store) { return store == DType::BF16 ? round_bf16_v(v) : v; }
// 16 bf16 bit patterns -> 16 floats (exact).
inline __m512 load_bf16_v(const uint16_t* p) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
inline __m512 maskz_load_bf16_v(__mmask16 m, const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}
inline __mmask16 tail_mask(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1u); }
#endif

#if defined(__AVX512F__)
// exp(x) for 16 floats, within ~1 ulp: 2^n * e^r with n = round(x log2 e), r = x - n ln2 (two-part
// ln2 with FMAs, |r| <= 0.35), e^r by its degree-7 Taylor polynomial (truncation < 0.05 ulp), 2^n
// applied with VSCALEFPS (handles the denormal range). x below -104 gives +0; NaN stays NaN.
inline __m512 exp_v(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-104.0f), hi = _mm512_set1_ps(88.8f);
  x = _mm512_min_ps(hi, _mm512_max_ps(lo, x));  // VMAXPS/VMINPS return the 2nd operand on NaN: kept
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);  // ln2 high part (exact n*hi)
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);   // ln2 low part
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}
// silu of 16 lanes: x / (1 + exp(-x)), ATen's CPU formula, with exp_v (~1 ulp, as std::exp and ATen's
// vector exp are); the add and the divide are IEEE. elementwise.cpp's silu / silu_mul and the int8
// GEMM's GLU epilogue (gemm_i8.cpp) share it, so they give the same bits.
inline __m512 silu_v(__m512 x) {
  const __m512 e = exp_v(_mm512_sub_ps(_mm512_setzero_ps(), x));
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}
// silu_mul's lanes (kernels.h): store(store(silu(g)) * a).
inline __m512 silu_mul_v(__m512 g, __m512 a, DType store) {
  return round_store_v(_mm512_mul_ps(round_store_v(silu_v(g), store), a), store);
}
#endif

// The reference's softmax exponential: torch's CPU flash attention takes exp(s - max) with its
// "ULP 20" approximation, so matching the reference bf16 run bit for bit needs the same function
// (its error, ~1e-6 relative, is far inside bf16 noise and the fp32 bounds). Recipe: clamp x to
// [ln(FLT_MIN), ln(FLT_MAX)] (a NaN clamps to the upper end, as MINPS/MAXPS order it); n =
// floor(x log2e + 0.5) by FMA; r = x - n ln2 by one FMA with a one-part ln2; a degree-5 polynomial
// with fitted coefficients in Horner form by FMAs; times 2^(n-1) built in the exponent bits, times 2;
// inputs below ln(FLT_MIN) give +0. exp20 is the scalar twin, equal lane for lane.
namespace exp20_c {
inline float bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
constexpr uint32_t kLog2e = 0x3fb8aa3b, kLn2 = 0x3f317218, kLo = 0xc2aeac50, kHi = 0x42b17218;
constexpr float kC1 = 0.999999701f, kC2 = 0.499991506f, kC3 = 0.166676521f, kC4 = 0.0418978221f,
                kC5 = 0.00828929059f;
}  // namespace exp20_c

inline float exp20(float x) {
  using namespace exp20_c;
  const float lo = bits(kLo), hi = bits(kHi);
  const bool under = x < lo;
  float v = x < hi ? x : hi;
  v = v > lo ? v : lo;
  const float n = std::floor(std::fma(v, bits(kLog2e), 0.5f));
  const float r = std::fma(-n, bits(kLn2), v);
  float p = std::fma(r, kC5, kC4);
  p = std::fma(r, p, kC3);
  p = std::fma(r, p, kC2);
  p = std::fma(r, p, kC1);
  p = std::fma(r, p, 1.0f);
  const uint32_t e = static_cast<uint32_t>(static_cast<int32_t>(n - 1.0f) + 127) << 23;
  const float two_n1 = under ? 0.0f : bits(e);
  return p * two_n1 * 2.0f;
}

// The reference's softmax exponential when the probabilities are stored as bf16: torch's "fast"
// fexp_u20 (accurate to about one bf16 ulp): y = x log2e (one rounding), f = y - floor(y), a cubic
// in f (fitted coefficients, Horner by FMAs) subtracted from y, then the float's bits are built
// directly as trunc(2^23 y' + 127 * 2^23) (one FMA, so only ~16 significant bits survive); x below
// ln(FLT_MIN) gives +0, above ln(FLT_MAX) +inf, NaN gives the bits of CVTTPS2DQ's 0x80000000 (-0).
// fexp20 is the scalar twin, equal lane for lane.
namespace fexp20_c {
constexpr float kC0 = 0.00010703434948458272f, kC1 = 0.30354260500649682f, kC2 = -0.22433836478672356f,
                kC3 = -0.079204240219773236f;
constexpr float kA = 8388608.0f, kB = 8388608.0f * 127.0f;  // 2^23, 127 * 2^23
}  // namespace fexp20_c

inline float fexp20(float x) {
  using namespace fexp20_c;
  const float lo = exp20_c::bits(exp20_c::kLo), hi = exp20_c::bits(exp20_c::kHi);
  float y = x * exp20_c::bits(exp20_c::kLog2e);
  const float f = y - std::floor(y);
  float p = std::fma(f, kC3, kC2);
  p = std::fma(f, p, kC1);
  p = std::fma(f, p, kC0);
  y = y - p;
  const float t = std::fma(kA, y, kB);
  // CVTTPS2DQ: truncation, 0x80000000 for NaN and out-of-range values.
  const uint32_t i = (t >= -2147483648.0f && t < 2147483648.0f) ? static_cast<uint32_t>(static_cast<int32_t>(t))
                                                                 : 0x80000000u;
  if (x < lo) return 0.0f;
  if (x > hi) return INFINITY;
  return exp20_c::bits(i);
}

#if defined(__AVX512F__)
// fexp20_v without its clamps: the same lanes wherever x is in [ln(FLT_MIN), ln(FLT_MAX)] (callers that
// know that skip the two compares and blends).
inline __m512 fexp20_unclamped_v(__m512 x) {
  using namespace fexp20_c;
  __m512 y = _mm512_mul_ps(x, _mm512_set1_ps(exp20_c::bits(exp20_c::kLog2e)));
  const __m512 f = _mm512_sub_ps(y, _mm512_roundscale_ps(y, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));
  __m512 p = _mm512_fmadd_ps(f, _mm512_set1_ps(kC3), _mm512_set1_ps(kC2));
  p = _mm512_fmadd_ps(f, p, _mm512_set1_ps(kC1));
  p = _mm512_fmadd_ps(f, p, _mm512_set1_ps(kC0));
  y = _mm512_sub_ps(y, p);
  return _mm512_castsi512_ps(_mm512_cvttps_epi32(_mm512_fmadd_ps(_mm512_set1_ps(kA), y, _mm512_set1_ps(kB))));
}
inline __m512 fexp20_v(__m512 x) {
  const __mmask16 small = _mm512_cmp_ps_mask(x, _mm512_set1_ps(exp20_c::bits(exp20_c::kLo)), _CMP_LT_OS);
  const __mmask16 large = _mm512_cmp_ps_mask(x, _mm512_set1_ps(exp20_c::bits(exp20_c::kHi)), _CMP_GT_OS);
  const __m512 r = _mm512_mask_blend_ps(small, fexp20_unclamped_v(x), _mm512_setzero_ps());
  return _mm512_mask_blend_ps(large, r, _mm512_set1_ps(INFINITY));
}
#endif

#if defined(__AVX512F__)
inline __m512 exp20_v(__m512 x) {
  using namespace exp20_c;
  const __m512 lo = _mm512_set1_ps(bits(kLo)), hi = _mm512_set1_ps(bits(kHi));
  const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OS);
  __m512 v = _mm512_max_ps(_mm512_min_ps(x, hi), lo);
  const __m512i ni = _mm512_cvt_roundps_epi32(_mm512_fmadd_ps(v, _mm512_set1_ps(bits(kLog2e)), _mm512_set1_ps(0.5f)),
                                              _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 n = _mm512_cvtepi32_ps(ni);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(bits(kLn2)), v);
  __m512 p = _mm512_fmadd_ps(r, _mm512_set1_ps(kC5), _mm512_set1_ps(kC4));
  p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(kC3));
  p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(kC2));
  p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(kC1));
  p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(
      _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_sub_ps(n, _mm512_set1_ps(1.0f))), _mm512_set1_epi32(127)), 23);
  const __m512 two_n1 = _mm512_mask_blend_ps(under, _mm512_castsi512_ps(e), _mm512_setzero_ps());
  return _mm512_mul_ps(_mm512_mul_ps(p, two_n1), _mm512_set1_ps(2.0f));
}
#endif

// fp32 dot product with a fixed accumulation order (deterministic; independent of callers' chunking).
inline float dot_f32(const float* a, const float* b, int64_t n) {
#if defined(__AVX512F__)
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= n; k += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + k), _mm512_loadu_ps(b + k), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + k + 16), _mm512_loadu_ps(b + k + 16), acc1);
  }
  for (; k < n; k += 16) {
    __mmask16 m = tail_mask(n - k);
    acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + k), _mm512_maskz_loadu_ps(m, b + k), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#else
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int j = 0; j < 8; ++j) acc[j] = std::fma(a[k + j], b[k + j], acc[j]);
  for (; k < n; ++k) acc[0] = std::fma(a[k], b[k], acc[0]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
#endif
}

// fp32 dot product of floats with bf16 bit patterns (converted exactly).
inline float dot_f32_bf16(const float* a, const uint16_t* b, int64_t n) {
#if defined(__AVX512F__)
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= n; k += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + k), load_bf16_v(b + k), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + k + 16), load_bf16_v(b + k + 16), acc1);
  }
  for (; k < n; k += 16) {
    __mmask16 m = tail_mask(n - k);
    acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + k), maskz_load_bf16_v(m, b + k), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#else
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int j = 0; j < 8; ++j) acc[j] = std::fma(a[k + j], bf16_bits_to_f32(b[k + j]), acc[j]);
  for (; k < n; ++k) acc[0] = std::fma(a[k], bf16_bits_to_f32(b[k]), acc[0]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
#endif
}

// y[0..n) += a * x[0..n) (fp32 FMA), x floats or bf16 bits.
inline void axpy_f32(float a, const float* x, float* y, int64_t n) {
#if defined(__AVX512F__)
  __m512 av = _mm512_set1_ps(a);
  int64_t k = 0;
  for (; k + 16 <= n; k += 16)
    _mm512_storeu_ps(y + k, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + k), _mm512_loadu_ps(y + k)));
  if (k < n) {
    __mmask16 m = tail_mask(n - k);
    _mm512_mask_storeu_ps(y + k, m, _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + k), _mm512_maskz_loadu_ps(m, y + k)));
  }
#else
  for (int64_t k = 0; k < n; ++k) y[k] = std::fma(a, x[k], y[k]);
#endif
}
inline void axpy_bf16(float a, const uint16_t* x, float* y, int64_t n) {
#if defined(__AVX512F__)
  __m512 av = _mm512_set1_ps(a);
  int64_t k = 0;
  for (; k + 16 <= n; k += 16)
    _mm512_storeu_ps(y + k, _mm512_fmadd_ps(av, load_bf16_v(x + k), _mm512_loadu_ps(y + k)));
  if (k < n) {
    __mmask16 m = tail_mask(n - k);
    _mm512_mask_storeu_ps(y + k, m, _mm512_fmadd_ps(av, maskz_load_bf16_v(m, x + k), _mm512_maskz_loadu_ps(m, y + k)));
  }
#else
  for (int64_t k = 0; k < n; ++k) y[k] = std::fma(a, bf16_bits_to_f32(x[k]), y[k]);
#endif
}

// ---- AVX2 twins (runtime dispatch: callers check cpu_has_avx2_fma()) ----
#define MM3_SIMD_AVX2 __attribute__((target("avx2,fma")))

// 8 floats rounded to bf16 values (kept as floats), identical to round_bf16 lane by lane.
MM3_SIMD_AVX2 inline __m256 round_bf16_v8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
  r = _mm256_and_si256(r, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u)));
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  return _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)), nan);
}

// exp20 for 8 floats, equal to exp20 lane for lane (the same operations in the same order).
MM3_SIMD_AVX2 inline __m256 exp20_v8(__m256 x) {
  using namespace exp20_c;
  const __m256 lo = _mm256_set1_ps(bits(kLo)), hi = _mm256_set1_ps(bits(kHi));
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OS);
  const __m256 v = _mm256_max_ps(_mm256_min_ps(x, hi), lo);  // NaN: MINPS returns hi, as exp20's x < hi
  const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(v, _mm256_set1_ps(bits(kLog2e)), _mm256_set1_ps(0.5f)));
  const __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(bits(kLn2)), v);
  __m256 p = _mm256_fmadd_ps(r, _mm256_set1_ps(kC5), _mm256_set1_ps(kC4));
  p = _mm256_fmadd_ps(r, p, _mm256_set1_ps(kC3));
  p = _mm256_fmadd_ps(r, p, _mm256_set1_ps(kC2));
  p = _mm256_fmadd_ps(r, p, _mm256_set1_ps(kC1));
  p = _mm256_fmadd_ps(r, p, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_sub_ps(n, _mm256_set1_ps(1.0f))), _mm256_set1_epi32(127)), 23);
  const __m256 two_n1 = _mm256_blendv_ps(_mm256_castsi256_ps(e), _mm256_setzero_ps(), under);
  return _mm256_mul_ps(_mm256_mul_ps(p, two_n1), _mm256_set1_ps(2.0f));
}

// fexp20 for 8 floats, equal to fexp20 lane for lane.
MM3_SIMD_AVX2 inline __m256 fexp20_v8(__m256 x) {
  using namespace fexp20_c;
  const __m256 small = _mm256_cmp_ps(x, _mm256_set1_ps(exp20_c::bits(exp20_c::kLo)), _CMP_LT_OS);
  const __m256 large = _mm256_cmp_ps(x, _mm256_set1_ps(exp20_c::bits(exp20_c::kHi)), _CMP_GT_OS);
  __m256 y = _mm256_mul_ps(x, _mm256_set1_ps(exp20_c::bits(exp20_c::kLog2e)));
  const __m256 f = _mm256_sub_ps(y, _mm256_floor_ps(y));
  __m256 p = _mm256_fmadd_ps(f, _mm256_set1_ps(kC3), _mm256_set1_ps(kC2));
  p = _mm256_fmadd_ps(f, p, _mm256_set1_ps(kC1));
  p = _mm256_fmadd_ps(f, p, _mm256_set1_ps(kC0));
  y = _mm256_sub_ps(y, p);
  const __m256i i = _mm256_cvttps_epi32(_mm256_fmadd_ps(_mm256_set1_ps(kA), y, _mm256_set1_ps(kB)));
  const __m256 r = _mm256_blendv_ps(_mm256_castsi256_ps(i), _mm256_setzero_ps(), small);
  return _mm256_blendv_ps(r, _mm256_set1_ps(INFINITY), large);
}

}  // namespace mm3::kern::detail
