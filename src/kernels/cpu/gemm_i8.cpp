// gemm_i8.cpp — kern::gemm_only_i8 (kernels.h): W8A8 linear layers, the weights quantized once per
// output row, the activations per row at every call, the integer GEMM (kern::pick_i8_gemm) oneDNN's
// where the CPU has AMX-INT8 (its brgemm on the tiles), else our own where the CPU has AVX512-VNNI
// (vnni_gemm below: the scales, bias, residual add or GLU applied in its tiles' epilogue), else oneDNN's
// u8 x s8 -> s32 matmul (gemm:jit where the CPU has only AVX-VNNI, as Intel's client cores from Alder
// Lake on; brgemm with AVX512-VNNI under MM3_I8_GEMM=onednn) with the scales applied here in a pass over
// its output, else (no VNNI at all, where oneDNN's sums saturate) our own AVX2 GEMM on 16-bit pairs
// (madd_gemm below) with that pass. The AMX choice is unmeasured (no AMX machine drawn since the int8
// profile exists): by Intel's figures a core's tiles run 1024 int8 multiply-adds a cycle, AVX512-VNNI 128,
// and oneDNN's bf16 GEMM (the bf16 profile) already ran on the tiles (512 bf16 multiply-adds), so by
// those figures our VNNI GEMM left the int8 profile a quarter of the bf16 profile's GEMM peak there.
// MM3_I8_GEMM=vnni takes ours anyway, for the comparison. On Zen 5 capped to an AVX-VNNI core
// (ONEDNN_MAX_CPU_ISA=AVX2_VNNI, MM3_ISA=avx2, an -march=alderlake build) the batch-1 DiT forward ran 7.5-8.9 s in int8
// against 21.8 s in fp32 on oneDNN's JIT sgemm (24.9 s on gemm_nt's panels; twenty-first session); on Zen 4 capped to
// AVX2 alone (an x86-64-v3 build, ONEDNN_MAX_CPU_ISA=AVX2) 13.0 s against 18.3 s on the AVX2 GEMM (thirty-sixth
// session).
//
// Why: on 2 Zen 5 cores (AVX512-VNNI, no AMX) oneDNN's int8 brgemm runs the DiT's shapes (M = 1380)
// at 1.49-1.59 TOP/s against 0.68-0.76 TFLOP/s for bf16 and ~0.37 for fp32 (standalone, medians of 7,
// eighteenth session): 2.1x bf16, 4x fp32.
//
// Numerics (the contract ref::linear_i8 restates in scalar code; bitwise equal, the integer sums
// being exact in any order):
//   weights, row n:  a = max_k |W[n, k]|; sw[n] = a / 127; qw[n, k] = clamp(rint(W[n, k] * (127 / a)), ±127)
//                    (a == 0: sw = 0, qw = 0)
//   x, row m:        the same with 127 levels, qx in [-127, 127] held as u8 qx + 128; sx[m]
//   y[m, n] =        store(fma(float(acc[m, n] − 128·Σ_k qw[n, k]), sx[m]·sw[n], bias[n]))
//                    with acc = Σ_k (qx[m, k] + 128)·qw[n, k] (int32: |acc| <= 255·127·K, K < 66000)
// A row of x with a non-finite value gets NaN outputs (its scale is NaN), as a float GEMM's would be
// non-finite. rint is round-half-even (the default rounding mode; _mm512_cvtps_epi32 alike).
// Two-level activations (gemm_only_i8's x_two_level): with r = x[m, k] · (127 / a) (fp32),
// q1 = clamp(rint(r), ±127), q2 = clamp(rint((r − q1) · 128), ±127) (|q2| <= 64; r − q1 is exact),
// so x ≈ sx · (q1 + q2 / 128); both go through one GEMM as 2M rows, and with s = sx[m]·sw[n]
//   y = store(fma(float(acc1 − comp), s, fma(float(acc2 − comp), s · (1/128), bias[n]))).
// Rotated forms (I8Options::rotate, K a power of two): every weight row and every row of x is first
// taken through rotate_row (kernels.h: its signs flipped by a fixed ±1 pattern, then the unnormalized
// Walsh-Hadamard transform), an orthogonal map times √K, so x·Wᵀ = rot(x)·rot(W)ᵀ / K; the
// rows are quantized as above after it, and sw[n] carries the 1/K (a power of two: exact).
#pragma GCC optimize("fp-contract=off")

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string_view>
#include <vector>

#include "core/aligned.h"
#include "core/errors.h"
#include "kernels/cpu/gemm_nt.h"
#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"
#include "kernels/tuning.h"

namespace mm3::kern {

namespace {

struct I8Form {
  std::shared_ptr<const void> dnnl;  // the packed s8 weights (gemm_dnnl.cpp), or
  aligned_buffer<int8_t> panels;     // ours (own: vnni_gemm below), panel_bytes of them
  aligned_buffer<int16_t> panels16;  // or ours without VNNI (madd: madd_gemm below), panel_bytes of them
  size_t panel_bytes = 0;
  bool own = false;
  bool madd = false;
  std::vector<float> sw;             // [N] weight scales
  std::vector<int32_t> comp;         // [N] 128 · Σ_k qw[n, k]: the u8 offset's share of acc
  int64_t N = 0, K = 0;
  bool two_level = false;  // x quantized on two levels (q1, q2)
  bool rotate = false;     // rows taken through rotate_row before quantizing
  bool glu_pairs = false;  // panels pair column j with j + N/2 (I8Options::glu_pairs; own panels only)
};

#if !defined(__AVX512F__)
// ---- AVX2 twins (a build without AVX-512, e.g. for an AVX-VNNI client core; runtime dispatch on
// cpu_has_avx2_fma()): the same operations lane for lane as the scalar loops below, so the same bytes
// and bits. Each does whole groups of 8 and returns how many elements it did; the scalar loop does the
// rest. fp-contract is off in this file, so a product stays a product (std::fma is _mm256_fmadd_ps).

// a = max over [0, k) of |x| (max is exact in any order); bad: a non-finite value among them.
MM3_SIMD_AVX2 int64_t absmax_avx2(const float* x, int64_t n, float& a, bool& bad) {
  const __m256 sign = _mm256_set1_ps(-0.0f), inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  __m256 m = _mm256_setzero_ps(), nf = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m256 v = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + k));
    nf = _mm256_or_ps(nf, _mm256_cmp_ps(v, inf, _CMP_NLT_UQ));  // |x| >= inf, or NaN
    m = _mm256_max_ps(m, v);
  }
  alignas(32) float t[8];
  _mm256_store_ps(t, m);
  for (float v : t) a = std::max(a, v);
  bad = _mm256_movemask_ps(nf) != 0;
  return k;
}

// 8 int32 lanes (each in [-127, 127]) as 8 bytes plus offset (128: x ^ 0x80 on the two's complement byte).
MM3_SIMD_AVX2 inline void store_bytes8(__m256i i, int offset, uint8_t* q) {
  const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
  __m128i b = _mm_packs_epi16(w16, w16);
  if (offset == 128) b = _mm_xor_si128(b, _mm_set1_epi8(static_cast<char>(0x80)));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(q), b);
}

// q[k] = clamp(rint(x[k] · inv), ±127) + offset (rint: the conversion's round-half-even).
MM3_SIMD_AVX2 int64_t quantize_bytes_avx2(const float* x, int64_t n, float inv, int offset, uint8_t* q) {
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m256i i = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k), vinv));
    store_bytes8(_mm256_min_epi32(_mm256_max_epi32(i, lo), hi), offset, q + k);
  }
  return k;
}

// quantize_row_level2's loop: q2 = clamp(rint((x · inv − (q1 − 128)) · 128), ±127) + 128.
MM3_SIMD_AVX2 int64_t level2_avx2(const float* x, int64_t n, const uint8_t* q1, float inv, uint8_t* q2) {
  const __m256 vinv = _mm256_set1_ps(inv), v128 = _mm256_set1_ps(128.0f);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127), off = _mm256_set1_epi32(128);
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m256 r = _mm256_mul_ps(_mm256_loadu_ps(x + k), vinv);
    const __m256i i1 =
        _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q1 + k))), off);
    const __m256i i = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_sub_ps(r, _mm256_cvtepi32_ps(i1)), v128));
    store_bytes8(_mm256_min_epi32(_mm256_max_epi32(i, lo), hi), 128, q2 + k);
  }
  return k;
}

MM3_SIMD_AVX2 inline __m256 round_store_v8(__m256 v, DType store) {
  return store == DType::BF16 ? detail::round_bf16_v8(v) : v;
}

// dequant_row's (one level, acc2 null) and dequant_row2's (two levels) loops.
MM3_SIMD_AVX2 int64_t dequant_avx2(const int32_t* acc1, const int32_t* acc2, const int32_t* comp, const float* sw,
                                   float sx, const float* bias, float* y, int64_t N, DType store, bool accumulate) {
  const __m256 vsx = _mm256_set1_ps(sx), eighth = _mm256_set1_ps(1.0f / 128.0f);
  int64_t n = 0;
  for (; n + 8 <= N; n += 8) {
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(comp + n));
    const __m256 d1 =
        _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc1 + n)), c));
    const __m256 s = _mm256_mul_ps(vsx, _mm256_loadu_ps(sw + n));
    __m256 b = bias ? _mm256_loadu_ps(bias + n) : _mm256_setzero_ps();
    if (acc2) {
      const __m256 d2 =
          _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc2 + n)), c));
      b = _mm256_fmadd_ps(d2, _mm256_mul_ps(s, eighth), b);
    }
    __m256 v = round_store_v8(_mm256_fmadd_ps(d1, s, b), store);
    if (accumulate) v = round_store_v8(_mm256_add_ps(_mm256_loadu_ps(y + n), v), store);
    _mm256_storeu_ps(y + n, v);
  }
  return n;
}
#endif

// Quantizes one row of n floats to 127 levels: q[k] = clamp(rint(x[k] · 127 / a), ±127) + offset as a
// byte (offset 128: u8; 0: s8 in two's complement); returns the scale a / 127 (0 for an all-zero row,
// NaN for a row with a non-finite value, whose bytes are then all `offset`).
// `inv`, when given, receives the factor 127 / a the levels were taken with (0 where there were none).
float quantize_row(const float* x, int64_t n, uint8_t* q, int offset, float* inv_out = nullptr) {
  if (inv_out) *inv_out = 0.0f;
  float a = 0.0f;
  bool finite = true;
  int64_t k = 0;
#if defined(__AVX512F__)
  __m512 m = _mm512_setzero_ps();
  __mmask16 bad = 0;
  for (; k + 16 <= n; k += 16) {
    const __m512 v = _mm512_loadu_ps(x + k);
    bad |= _mm512_fpclass_ps_mask(v, 0x99);  // QNaN | ±Inf | SNaN
    m = _mm512_max_ps(m, _mm512_abs_ps(v));
  }
  a = _mm512_reduce_max_ps(m);
  finite = bad == 0;
#else
  if (detail::cpu_has_avx2_fma()) {
    bool bad = false;
    k = absmax_avx2(x, n, a, bad);
    finite = !bad;
  }
#endif
  for (; k < n; ++k) {
    if (!std::isfinite(x[k])) finite = false;
    a = std::max(a, std::fabs(x[k]));
  }
  if (!finite || a == 0.0f) {
    std::memset(q, offset, static_cast<size_t>(n));
    return finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
  }
  const float inv = 127.0f / a;
  if (inv_out) *inv_out = inv;
  k = 0;
#if defined(__AVX512F__)
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127), off = _mm512_set1_epi32(offset);
  for (; k + 16 <= n; k += 16) {
    __m512i i = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k), vinv));
    i = _mm512_add_epi32(_mm512_min_epi32(_mm512_max_epi32(i, lo), hi), off);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + k), _mm512_cvtepi32_epi8(i));
  }
#else
  if (detail::cpu_has_avx2_fma()) k = quantize_bytes_avx2(x, n, inv, offset, q);
#endif
  for (; k < n; ++k) {
    const float r = std::nearbyint(x[k] * inv);
    const int i = static_cast<int>(std::clamp(r, -127.0f, 127.0f)) + offset;
    q[k] = static_cast<uint8_t>(i & 0xFF);
  }
  return a / 127.0f;
}

// The second level of x's row: q2[k] = clamp(rint((r − q1) · 128), ±127) + 128 with r = x[k] · (127 / a)
// and q1 the first level's byte − 128, `inv` the first level's 127 / a. A zero or non-finite row (no
// levels: `live` false): all 128.
void quantize_row_level2(const float* x, int64_t n, const uint8_t* q1, float inv, bool live, uint8_t* q2) {
  if (!live) {
    std::memset(q2, 128, static_cast<size_t>(n));
    return;
  }
  int64_t k = 0;
#if defined(__AVX512F__)
  const __m512 vinv = _mm512_set1_ps(inv), v128 = _mm512_set1_ps(128.0f);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127), off = _mm512_set1_epi32(128);
  for (; k + 16 <= n; k += 16) {
    const __m512 r = _mm512_mul_ps(_mm512_loadu_ps(x + k), vinv);
    const __m512i i1 =
        _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q1 + k))), off);
    const __m512 d = _mm512_mul_ps(_mm512_sub_ps(r, _mm512_cvtepi32_ps(i1)), v128);
    __m512i i = _mm512_cvtps_epi32(d);
    i = _mm512_add_epi32(_mm512_min_epi32(_mm512_max_epi32(i, lo), hi), off);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q2 + k), _mm512_cvtepi32_epi8(i));
  }
#else
  if (detail::cpu_has_avx2_fma()) k = level2_avx2(x, n, q1, inv, q2);
#endif
  for (; k < n; ++k) {
    const float r = x[k] * inv;
    const float d = (r - static_cast<float>(int{q1[k]} - 128)) * 128.0f;
    q2[k] = static_cast<uint8_t>(static_cast<int>(std::clamp(std::nearbyint(d), -127.0f, 127.0f)) + 128);
  }
}

// y row m = store(fma(float(acc − comp), sx · sw, bias)) over n < N; accumulate: y = store(y + that),
// bitwise linear() into a scratch and then add() (the residual connection, one pass fewer).
void dequant_row(const int32_t* acc, const int32_t* comp, const float* sw, float sx, const float* bias, float* y,
                 int64_t N, DType store, bool accumulate) {
  int64_t n = 0;
#if defined(__AVX512F__)
  const __m512 vsx = _mm512_set1_ps(sx);
  for (; n + 16 <= N; n += 16) {
    const __m512 d = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512(acc + n), _mm512_loadu_si512(comp + n)));
    const __m512 s = _mm512_mul_ps(vsx, _mm512_loadu_ps(sw + n));
    const __m512 b = bias ? _mm512_loadu_ps(bias + n) : _mm512_setzero_ps();
    __m512 v = detail::round_store_v(_mm512_fmadd_ps(d, s, b), store);
    if (accumulate) v = detail::round_store_v(_mm512_add_ps(_mm512_loadu_ps(y + n), v), store);
    _mm512_storeu_ps(y + n, v);
  }
#else
  if (detail::cpu_has_avx2_fma()) n = dequant_avx2(acc, nullptr, comp, sw, sx, bias, y, N, store, accumulate);
#endif
  for (; n < N; ++n) {
    float v = round_store(std::fma(static_cast<float>(acc[n] - comp[n]), sx * sw[n], bias ? bias[n] : 0.0f), store);
    if (accumulate) v = round_store(y[n] + v, store);
    y[n] = v;
  }
}

// The two-level form: y = store(fma(float(acc1 − comp), s, fma(float(acc2 − comp), s · (1/128), bias))),
// s = sx · sw; accumulate as dequant_row's.
void dequant_row2(const int32_t* acc1, const int32_t* acc2, const int32_t* comp, const float* sw, float sx,
                  const float* bias, float* y, int64_t N, DType store, bool accumulate) {
  int64_t n = 0;
#if defined(__AVX512F__)
  const __m512 vsx = _mm512_set1_ps(sx), eighth = _mm512_set1_ps(1.0f / 128.0f);
  for (; n + 16 <= N; n += 16) {
    const __m512i c = _mm512_loadu_si512(comp + n);
    const __m512 d1 = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512(acc1 + n), c));
    const __m512 d2 = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512(acc2 + n), c));
    const __m512 s = _mm512_mul_ps(vsx, _mm512_loadu_ps(sw + n));
    const __m512 b = bias ? _mm512_loadu_ps(bias + n) : _mm512_setzero_ps();
    const __m512 lo = _mm512_fmadd_ps(d2, _mm512_mul_ps(s, eighth), b);
    __m512 v = detail::round_store_v(_mm512_fmadd_ps(d1, s, lo), store);
    if (accumulate) v = detail::round_store_v(_mm512_add_ps(_mm512_loadu_ps(y + n), v), store);
    _mm512_storeu_ps(y + n, v);
  }
#else
  if (detail::cpu_has_avx2_fma()) n = dequant_avx2(acc1, acc2, comp, sw, sx, bias, y, N, store, accumulate);
#endif
  for (; n < N; ++n) {
    const float s = sx * sw[n];
    const float lo = std::fma(static_cast<float>(acc2[n] - comp[n]), s * (1.0f / 128.0f), bias ? bias[n] : 0.0f);
    float v = round_store(std::fma(static_cast<float>(acc1[n] - comp[n]), s, lo), store);
    if (accumulate) v = round_store(y[n] + v, store);
    y[n] = v;
  }
}

// ---- Our own integer GEMM (AVX512-VNNI), its epilogue in registers ----------------------------------
// Where the CPU has AVX512-VNNI (and MM3_ISA allows AVX-512) the form holds the weights in panels of
// kPanel = 64 output columns, [K4 = ceil(K / 4)][64 columns][4 bytes of k] each (K padded with zero
// weights), and `vnni_gemm` runs tiles of up to 6 rows x 64 columns: per 4 k, four 64-byte loads of the
// panel, a dword broadcast of each row's 4 bytes of x, 24 VPDPBUSDs into 24 int32 accumulators, so the
// integer sums are exact as oneDNN's. The sums then leave through the tile's epilogue while in
// registers: dequantized as dequant_row does it, lane for lane the same operations (so the same bits),
// straight into y (adding the residual where asked), through silu_mul's lanes for a GLU-paired form, or
// (two-level forms) stored as int32 for dequant_row2. That removes the int32 round trip through memory
// and the pass over it oneDNN's s32 output needs. Measured on 2 Zen 5 cores (twenty-third session,
// docs/performance-history.md): the tiles run about as fast as oneDNN's brgemm (~1.5 TOP/s in the
// DiT's shapes); the DiT's int8 Euler step ~4% faster (alternating binaries), 180 MB less memory.
// Blocking: threads take panels (each streams its own weights); per block of kMC rows of x and kKC
// bytes of k the block's tiles run over the panel's slice (kKC x 64 bytes, from L2), and the partial
// sums of a block wider than kKC wait in a per-thread buffer. kKC was 512 (a 32 KiB slice, for L1) until
// the thirty-seventh session: on Zen 4, run by run in one process (`--alternate i8_kc=...`), 2048 took
// the batch-1 int8 forward to 0.967 of 512's time and the Euler step to 0.975 (fewer partial-sum round
// trips; the K = 2048 GEMMs have none); 256 (a slice that fits Zen 4's 32 KiB L1) 0.998, 8192 no better
// than 2048, and the rows a block (knob i8_mc, 192-768) made no difference. Zen 5 was not measured at
// 2048 (its earlier block-size trials, binaries alternating: within the noise). MM3_I8_GEMM=onednn forces
// oneDNN's GEMM (with the pass) where both exist, for comparisons.
constexpr int64_t kPanel = 64;
constexpr int kTileRows = 6;
constexpr int64_t kMCDefault = 384, kKCDefault = 2048;  // rows of x and bytes of k a block (knobs i8_mc, i8_kc)

// MM3_I8_GEMM: "vnni", "onednn", "avx2" or unset. Read at each packing (not cached), so one process can
// hold two forms for a comparison; another value is ignored, with a warning (once).
std::string_view i8_gemm_env() {
  const char* e = std::getenv("MM3_I8_GEMM");
  if (!e || !*e) return {};
  const std::string_view v(e);
  if (v == "vnni" || v == "onednn" || v == "avx2") return v;
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true))
    fmt::print(stderr, "mm3: MM3_I8_GEMM={} is not a known value (vnni, onednn, avx2); ignored\n", v);
  return {};
}

// Our VNNI GEMM needs a build with AVX-512 code (a build for an AVX2 target has only oneDNN's and
// madd_gemm).
bool vnni_gemm_runs() {
#if defined(__AVX512F__)
  return detail::cpu_has_avx512vnni();
#else
  return false;
#endif
}

// Where a tile's sums go.
struct I8Epilogue {
  int32_t* acc = nullptr;  // int32 out (row stride ldacc), when y is null
  int64_t ldacc = 0;
  float* y = nullptr;  // else: y = store(fma(float(sum − comp), sx·sw, bias)) (+ y's value, accumulate)
  int64_t ldy = 0;
  const int32_t* comp = nullptr;
  const float* sw = nullptr;
  const float* sx = nullptr;  // [M] row scales
  const float* bias = nullptr;
  DType store = DType::F32;
  bool accumulate = false;
  int64_t N = 0;
  bool glu_pairs = false;  // panel p: columns [32p, 32p + 32) and [N/2 + 32p, ..) (else [64p, 64p + 64))
  float* act = nullptr;    // the GLU's rows (stride ldact): silu_mul(g, a) of a panel's pairs, in place of y
  int64_t ldact = 0;
};

// The first output column of a panel's 16-column vector j.
inline int64_t panel_col(bool glu_pairs, int64_t N, int64_t p, int j) {
  return glu_pairs ? (j < 2 ? 32 * p + 16 * j : N / 2 + 32 * p + 16 * (j - 2)) : kPanel * p + 16 * j;
}

// Panels of the s8 weights q [N, K] (zero weights past N and K).
// (glu_pairs: panel p's slots hold the rows panel_col says; N a multiple of 64.)
// (Every byte is written: no zeroing first.)
aligned_buffer<int8_t> pack_i8_panels(const ThreadPool& pool, const int8_t* q, int64_t N, int64_t K, bool glu_pairs,
                                      size_t& bytes) {
  const int64_t K4 = (K + 3) / 4, P = (N + kPanel - 1) / kPanel;
  bytes = static_cast<size_t>(P * K4 * kPanel * 4);
  aligned_buffer<int8_t> out = make_aligned_buffer<int8_t>(bytes);
  pool.parallel_for(P, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int8_t* rows[kPanel];  // the weight row of each slot, null past N
      for (int64_t c = 0; c < kPanel; ++c) {
        const int64_t n = panel_col(glu_pairs, N, p, static_cast<int>(c / 16)) + c % 16;
        rows[c] = n < N ? q + n * K : nullptr;
      }
      // 4 k of every slot in turn: the panel is written front to back
      int8_t* dst = out.get() + p * K4 * kPanel * 4;
      for (int64_t t = 0; t < K4; ++t)
        for (int64_t c = 0; c < kPanel; ++c, dst += 4) {
          if (rows[c] && 4 * t + 4 <= K) {
            std::memcpy(dst, rows[c] + 4 * t, 4);
          } else {
            std::memset(dst, 0, 4);
            for (int64_t k = 4 * t; rows[c] && k < K; ++k) dst[k - 4 * t] = rows[c][k];
          }
        }
    }
  });
  return out;
}

#if defined(__AVX512F__)
inline __mmask16 tail_mask_at(int64_t n) { return n <= 0 ? __mmask16(0) : detail::tail_mask(n); }

#define MM3_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))

// R rows of x (u8, row stride lda) by one panel's 64 columns over T groups of 4 k (b: the panel's
// slice). part: the partial sums of this tile (64 per row) when the block is one of several over k:
// read unless first, written unless last; on the last block the sums leave through e for rows m0..
// and panel p's columns (panel_col; those past N masked). The #pragma unrolls keep the 24
// accumulators in registers (GCC 12 spills arrays of vectors indexed in loops it keeps rolled).
template <int R>
MM3_VNNI_TARGET void vnni_tile(const uint8_t* x, int64_t lda, const int8_t* b, int64_t T, int32_t* part, bool first,
                               bool last, const I8Epilogue& e, int64_t m0, int64_t p) {
  __m512i c0[R], c1[R], c2[R], c3[R];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
    if (first) {
      c0[i] = c1[i] = c2[i] = c3[i] = _mm512_setzero_si512();
    } else {
      c0[i] = _mm512_load_si512(part + i * kPanel);
      c1[i] = _mm512_load_si512(part + i * kPanel + 16);
      c2[i] = _mm512_load_si512(part + i * kPanel + 32);
      c3[i] = _mm512_load_si512(part + i * kPanel + 48);
    }
  }
  if (last && e.y && e.accumulate)  // the residual rows the epilogue reads: fetched while the sums run
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < 4; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(e.y + (m0 + i) * e.ldy + panel_col(e.glu_pairs, e.N, p, j)),
                     _MM_HINT_T0);
  for (int64_t t = 0; t < T; ++t) {
    const int8_t* bt = b + t * kPanel * 4;
    const __m512i b0 = _mm512_load_si512(bt), b1 = _mm512_load_si512(bt + 64), b2 = _mm512_load_si512(bt + 128),
                  b3 = _mm512_load_si512(bt + 192);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      int32_t xv;
      std::memcpy(&xv, x + i * lda + 4 * t, 4);
      const __m512i a = _mm512_set1_epi32(xv);
      c0[i] = _mm512_dpbusd_epi32(c0[i], a, b0);
      c1[i] = _mm512_dpbusd_epi32(c1[i], a, b1);
      c2[i] = _mm512_dpbusd_epi32(c2[i], a, b2);
      c3[i] = _mm512_dpbusd_epi32(c3[i], a, b3);
    }
  }
  if (!last) {
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      _mm512_store_si512(part + i * kPanel, c0[i]);
      _mm512_store_si512(part + i * kPanel + 16, c1[i]);
      _mm512_store_si512(part + i * kPanel + 32, c2[i]);
      _mm512_store_si512(part + i * kPanel + 48, c3[i]);
    }
    return;
  }
  int64_t col[4];
  __mmask16 mk[4];
  for (int j = 0; j < 4; ++j) {
    col[j] = panel_col(e.glu_pairs, e.N, p, j);
    mk[j] = tail_mask_at(e.N - col[j]);
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
    const __m512i cs[4] = {c0[i], c1[i], c2[i], c3[i]};
    if (!e.y && !e.act) {
      int32_t* out = e.acc + (m0 + i) * e.ldacc;
      for (int j = 0; j < 4; ++j) _mm512_mask_storeu_epi32(out + col[j], mk[j], cs[j]);
      continue;
    }
    // dequant_row's loop, lane for lane
    const __m512 vsx = _mm512_set1_ps(e.sx[m0 + i]);
    __m512 v[4];
    for (int j = 0; j < 4; ++j) {
      if (!mk[j]) break;
      const int64_t n = col[j];
      const __m512 d = _mm512_cvtepi32_ps(_mm512_sub_epi32(cs[j], _mm512_maskz_loadu_epi32(mk[j], e.comp + n)));
      const __m512 s = _mm512_mul_ps(vsx, _mm512_maskz_loadu_ps(mk[j], e.sw + n));
      const __m512 bv = e.bias ? _mm512_maskz_loadu_ps(mk[j], e.bias + n) : _mm512_setzero_ps();
      __m512 r = detail::round_store_v(_mm512_fmadd_ps(d, s, bv), e.store);
      if (e.act) {
        v[j] = r;
        continue;
      }
      float* yr = e.y + (m0 + i) * e.ldy + n;
      if (e.accumulate) r = detail::round_store_v(_mm512_add_ps(_mm512_maskz_loadu_ps(mk[j], yr), r), e.store);
      _mm512_mask_storeu_ps(yr, mk[j], r);
    }
    // the GLU of the pairs (glu_pairs: v[0..1] the values a, v[2..3] their gates g), silu_mul's lanes
    if (e.act) {
      float* ar = e.act + (m0 + i) * e.ldact + 32 * p;
      _mm512_storeu_ps(ar, detail::silu_mul_v(/*gate=*/v[2], /*up=*/v[0], e.store));
      _mm512_storeu_ps(ar + 16, detail::silu_mul_v(/*gate=*/v[3], /*up=*/v[1], e.store));
    }
  }
}

using VnniTileFn = void (*)(const uint8_t*, int64_t, const int8_t*, int64_t, int32_t*, bool, bool, const I8Epilogue&,
                            int64_t, int64_t);
constexpr VnniTileFn kVnniTiles[kTileRows + 1] = {nullptr,      vnni_tile<1>, vnni_tile<2>, vnni_tile<3>,
                                                  vnni_tile<4>, vnni_tile<5>, vnni_tile<6>};

// x [M, K] u8 (row stride lda; up to 3 bytes past a row's K are read, and multiply zero weights) times
// the panels, through e. Threads take whole panels; every sum and epilogue is per (m, n): the bits do
// not depend on the thread count.
void vnni_gemm(const ThreadPool& pool, const uint8_t* x, int64_t M, int64_t lda, const int8_t* panels, int64_t N,
               int64_t K, const I8Epilogue& e) {
  const int kc_forced = tuning::forced(tuning::Knob::I8Kc), mc_forced = tuning::forced(tuning::Knob::I8Mc);
  const int64_t kMC = mc_forced > 0 ? mc_forced : kMCDefault, TB = (kc_forced > 0 ? kc_forced : kKCDefault) / 4;
  const int64_t K4 = (K + 3) / 4, P = (N + kPanel - 1) / kPanel;
  pool.parallel_for(P, [&](int64_t p0, int64_t p1) {
    thread_local aligned_vector<int32_t> part;
    if (K4 > TB && part.size() < static_cast<size_t>(kMC * kPanel)) part.resize(static_cast<size_t>(kMC * kPanel));
    for (int64_t mb = 0; mb < M; mb += kMC) {
      const int64_t me = std::min(M, mb + kMC);
      for (int64_t p = p0; p < p1; ++p)
        for (int64_t t0 = 0; t0 < K4; t0 += TB) {
          const int64_t T = std::min(TB, K4 - t0);
          const bool first = t0 == 0, last = t0 + T == K4;
          const int8_t* b = panels + (p * K4 + t0) * kPanel * 4;
          for (int64_t m = mb; m < me; m += kTileRows) {
            const int r = static_cast<int>(std::min<int64_t>(kTileRows, me - m));
            kVnniTiles[r](x + m * lda + 4 * t0, lda, b, T, part.data() + (m - mb) * kPanel, first, last, e, m, p);
          }
        }
    }
  });
}
#else
void vnni_gemm(const ThreadPool&, const uint8_t*, int64_t, int64_t, const int8_t*, int64_t, int64_t,
               const I8Epilogue&) {
  throw InternalError("gemm_i8: the VNNI GEMM needs an AVX-512 build");
}
#endif

// ---- Our own integer GEMM where the CPU has AVX2 but no VNNI ("madd": VPMADDWD on 16-bit pairs) ----
// oneDNN's int8 GEMM without VNNI multiplies with VPMADDUBSW, whose u8 x s8 pair sums saturate at int16
// (gemm_dnnl.cpp's probe refuses it), so before this the int8 profile ran fp32 on such CPUs (Zen 2 / 3,
// Intel's cores before Alder Lake, AVX-512 without VNNI as Skylake-SP). Here the weights are held as
// int16 and x's bytes are widened to int16 at every call: VPMADDWD multiplies 16 pairs of int16 and adds
// each pair into an int32 lane exactly (|pair| <= 2 · 255 · 127), VPADDD into the accumulator, so the
// sums are acc's of the contract above, bit for bit the VNNI GEMM's: 16 multiply-adds per 2 instructions
// where an AVX2 FMA does 8 per 1, but VPMADDWD issues on as many ports as the FMA or more. On one Zen 4
// core in L1 the tile's loop ran 93 G multiply-adds/s, the fp32 FMA tile's 58; on two cores the GEMM
// at ff_out's shape (bench gemm_i8_1380x2048x8192) 316-324 GOP/s, ~0.9 of the VPMADDWD + VPADDD pairs'
// peak (peak_i8_dot there), against oneDNN's fp32 208 GFLOP/s.
// Form: panels of kMaddPanel = 16 output columns, [K2 = ceil(K / 2)][16 columns][2 int16 of k] (zero past
// N and K: twice the int8 bytes, half of fp32's); tiles of up to 6 rows x 16 columns (12 accumulators):
// per pair of k two 32-byte loads of the panel, a dword broadcast of each row's pair of x. Blocking as
// vnni_gemm: threads take panels, per block of kMaddMC rows and kMaddKP pairs (2048 k's, a 64 KiB slice;
// knob i8_kc) the block's tiles run over the panel's slice, the partial sums of a longer K wait in a
// per-thread buffer (capped Zen 4, the batch-1 int8 forward run by run: 2048 k's 0.90-0.97 of the
// earlier 512's time, 1024 0.97, 8192 0.95). The
// sums go to memory as int32 (acc) and the row pass (dequant_row / dequant_row2, silu_mul) follows, as
// with oneDNN's. MM3_I8_GEMM=avx2 takes it wherever the CPU has AVX2 and FMA (for tests and comparisons).
constexpr int64_t kMaddPanel = 16;
constexpr int kMaddRows = 6;
constexpr int64_t kMaddMC = 384, kMaddKPDefault = 1024;  // rows of x and pairs of k a block

// Panels of the s8 weights q [N, K] widened to int16 (zero weights past N and K). Every value is written.
aligned_buffer<int16_t> pack_madd_panels(const ThreadPool& pool, const int8_t* q, int64_t N, int64_t K, size_t& bytes) {
  const int64_t K2 = (K + 1) / 2, P = (N + kMaddPanel - 1) / kMaddPanel;
  bytes = static_cast<size_t>(P * K2 * kMaddPanel * 2) * sizeof(int16_t);
  aligned_buffer<int16_t> out = make_aligned_buffer<int16_t>(bytes / sizeof(int16_t));
  pool.parallel_for(P, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      int16_t* dst = out.get() + p * K2 * kMaddPanel * 2;
      for (int64_t t = 0; t < K2; ++t)
        for (int64_t c = 0; c < kMaddPanel; ++c, dst += 2) {
          const int64_t n = kMaddPanel * p + c;
          for (int64_t h = 0; h < 2; ++h) {
            const int64_t k = 2 * t + h;
            dst[h] = n < N && k < K ? int16_t{q[n * K + k]} : int16_t{0};
          }
        }
    }
  });
  return out;
}

// Rows [0, rows) of x's bytes (u8, row stride K) widened to int16, row stride ld = 2 · ceil(K / 2) (the
// pad value past K is 0; it meets zero weights).
void widen_rows(const ThreadPool& pool, const uint8_t* xq, int64_t rows, int64_t K, int16_t* x16, int64_t ld) {
  pool.parallel_for(rows, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      const uint8_t* s = xq + m * K;
      int16_t* d = x16 + m * ld;
      for (int64_t k = 0; k < K; ++k) d[k] = int16_t{s[k]};
      for (int64_t k = K; k < ld; ++k) d[k] = 0;
    }
  });
}

// R rows of x16 (row stride ldx int16) by one panel's 16 columns over T pairs of k (b: the panel's slice).
// part: this tile's partial sums (16 per row) when the block is one of several over k: read unless first,
// written unless last; on the last block the sums go to acc's rows (stride ldacc), nv (<= 16) columns.
// The 12 accumulators, two panel vectors, the broadcast and one product fill the 16 ymm registers: every
// loop over rows carries #pragma GCC unroll (one without it, the tail's stores, made GCC 12 keep the
// accumulators on the stack as well, every k: 194 against 316 GOP/s in gemm_i8_1380x2048x8192 on Zen 4
// capped to AVX2). Six rows' broadcasts from rows K apart share L1 sets with the slice; packing x so they
// read one run measured no different (319-320 against 323-324 GOP/s, alternating binaries).
template <int R>
MM3_SIMD_AVX2 void madd_tile(const int16_t* x, int64_t ldx, const int16_t* b, int64_t T, int32_t* part, bool first,
                             bool last, int32_t* acc, int64_t ldacc, int64_t nv) {
  __m256i c0[R], c1[R];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
    if (first) {
      c0[i] = c1[i] = _mm256_setzero_si256();
    } else {
      c0[i] = _mm256_load_si256(reinterpret_cast<const __m256i*>(part + i * kMaddPanel));
      c1[i] = _mm256_load_si256(reinterpret_cast<const __m256i*>(part + i * kMaddPanel + 8));
    }
  }
  for (int64_t t = 0; t < T; ++t) {
    const int16_t* bt = b + t * kMaddPanel * 2;
    const __m256i b0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(bt)),
                  b1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(bt + 16));
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      int32_t xv;
      std::memcpy(&xv, x + i * ldx + 2 * t, 4);
      const __m256i a = _mm256_set1_epi32(xv);
      c0[i] = _mm256_add_epi32(c0[i], _mm256_madd_epi16(a, b0));
      c1[i] = _mm256_add_epi32(c1[i], _mm256_madd_epi16(a, b1));
    }
  }
  if (!last) {
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(part + i * kMaddPanel), c0[i]);
      _mm256_store_si256(reinterpret_cast<__m256i*>(part + i * kMaddPanel + 8), c1[i]);
    }
    return;
  }
  if (nv >= kMaddPanel) {
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc + i * ldacc), c0[i]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc + i * ldacc + 8), c1[i]);
    }
    return;
  }
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(nv)), lane),
                m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(nv) - 8), lane);
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
    _mm256_maskstore_epi32(acc + i * ldacc, m0, c0[i]);
    _mm256_maskstore_epi32(acc + i * ldacc + 8, m1, c1[i]);
  }
}

using MaddTileFn = void (*)(const int16_t*, int64_t, const int16_t*, int64_t, int32_t*, bool, bool, int32_t*, int64_t,
                            int64_t);
constexpr MaddTileFn kMaddTiles[kMaddRows + 1] = {nullptr,      madd_tile<1>, madd_tile<2>, madd_tile<3>,
                                                  madd_tile<4>, madd_tile<5>, madd_tile<6>};

// acc [M, N] (row stride ldacc) = the int32 sums of x16 [M, 2 · ceil(K / 2)] (row stride ldx) times the
// panels. Threads take whole panels; every sum is exact, so the bits do not depend on the thread count.
void madd_gemm(const ThreadPool& pool, const int16_t* x16, int64_t M, int64_t ldx, const int16_t* panels, int64_t N,
               int64_t K, int32_t* acc, int64_t ldacc) {
  const int kc_forced = tuning::forced(tuning::Knob::I8Kc);
  const int64_t kMaddKP = kc_forced > 0 ? kc_forced / 2 : kMaddKPDefault;
  const int64_t K2 = (K + 1) / 2, P = (N + kMaddPanel - 1) / kMaddPanel;
  pool.parallel_for(P, [&](int64_t p0, int64_t p1) {
    thread_local aligned_vector<int32_t> part;
    if (K2 > kMaddKP && part.size() < static_cast<size_t>(kMaddMC * kMaddPanel))
      part.resize(static_cast<size_t>(kMaddMC * kMaddPanel));
    for (int64_t mb = 0; mb < M; mb += kMaddMC) {
      const int64_t me = std::min(M, mb + kMaddMC);
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t nv = std::min(kMaddPanel, N - p * kMaddPanel);
        for (int64_t t0 = 0; t0 < K2; t0 += kMaddKP) {
          const int64_t T = std::min(kMaddKP, K2 - t0);
          const bool first = t0 == 0, last = t0 + T == K2;
          const int16_t* b = panels + (p * K2 + t0) * kMaddPanel * 2;
          for (int64_t m = mb; m < me; m += kMaddRows) {
            const int r = static_cast<int>(std::min<int64_t>(kMaddRows, me - m));
            kMaddTiles[r](x16 + m * ldx + 2 * t0, ldx, b, T, part.data() + (m - mb) * kMaddPanel, first, last,
                          acc + m * ldacc + p * kMaddPanel, ldacc, nv);
          }
        }
      }
    }
  });
}

// The scratch of one i8 GEMM, kept per calling thread (a fresh one per call would fault its pages in
// again; the workers get its addresses): x's levels (rows M.. the second levels of a two-level form),
// the int32 sums, x's row scales.
struct I8Scratch {
  aligned_vector<uint8_t> xq;
  aligned_vector<int16_t> x16;  // xq widened for the madd GEMM (rows of 2 · ceil(K / 2))
  aligned_vector<int32_t> acc;  // the int32 sums where they go to memory (oneDNN's, madd's; two-level forms)
  aligned_vector<float> yf;     // floats for glu()'s row pass: [M, N / 2] (GLU-paired forms) or [M, N]
  std::vector<float> sx;
  static bool fused(const I8Form& f) { return f.own && !f.two_level; }
  void reserve(const I8Form& f, int64_t M, bool rows_after = false) {
    const int64_t rows = f.two_level ? 2 * M : M;
    // + 64: the VNNI tiles read a row's k in groups of 4 bytes, up to 3 past the last row
    if (xq.size() < static_cast<size_t>(rows * f.K + 64)) xq.resize(static_cast<size_t>(rows * f.K + 64));
    if (!fused(f) && acc.size() < static_cast<size_t>(rows * f.N)) acc.resize(static_cast<size_t>(rows * f.N));
    const int64_t ld16 = 2 * ((f.K + 1) / 2);
    if (f.madd && x16.size() < static_cast<size_t>(rows * ld16)) x16.resize(static_cast<size_t>(rows * ld16));
    // the GLU's floats between the GEMM and a row pass: [M, N / 2] where the epilogue takes the GLU
    const int64_t yn = f.glu_pairs ? f.N / 2 : f.N;
    if (fused(f) && rows_after && yf.size() < static_cast<size_t>(M * yn)) yf.resize(static_cast<size_t>(M * yn));
    if (sx.size() < static_cast<size_t>(M)) sx.resize(static_cast<size_t>(M));
  }
  // Row m of x (K values) on f's levels (rotated first where f is).
  void quantize(const I8Form& f, int64_t M, int64_t m, const float* xr) {
    if (f.rotate) {
      thread_local aligned_vector<float> rot;  // this worker's copy of the row
      if (rot.size() < static_cast<size_t>(f.K)) rot.resize(static_cast<size_t>(f.K));
      rotate_row(xr, rot.data(), f.K);
      xr = rot.data();
    }
    float inv = 0.0f;
    uint8_t* const q1 = xq.data() + m * f.K;
    sx[static_cast<size_t>(m)] = quantize_row(xr, f.K, q1, 128, &inv);
    if (f.two_level) quantize_row_level2(xr, f.K, q1, inv, inv != 0.0f, xq.data() + (M + m) * f.K);
  }
  // y = the dequantized product (accumulate: added to y's values), bitwise dequant_row / dequant_row2.
  void gemm(const ThreadPool& pool, const I8Form& f, int64_t M, const float* bias, float* y, int64_t ldy, DType store,
            bool accumulate) {
    const int64_t rows = f.two_level ? 2 * M : M;
    I8Epilogue e;
    e.N = f.N, e.glu_pairs = f.glu_pairs;
    if (fused(f)) {
      e.y = y, e.ldy = ldy, e.comp = f.comp.data(), e.sw = f.sw.data(), e.sx = sx.data(), e.bias = bias;
      e.store = store, e.accumulate = accumulate;
      vnni_gemm(pool, xq.data(), rows, f.K, f.panels.get(), f.N, f.K, e);
      return;
    }
    sums(pool, f, M);
    pool.parallel_for(M, [&](int64_t b, int64_t end) {
      for (int64_t m = b; m < end; ++m) dequantize(f, M, m, bias, y + m * ldy, store, accumulate);
    });
  }
  // The GLU: act row m = silu_mul(gate = row m of the product's second half, up = its first half),
  // bitwise. Into out (row stride ldout) when given, else each row handed to rows(m, act row) while
  // in cache (a pass over the rows follows the GEMM either way where out is null).
  template <typename Rows>
  void glu(const ThreadPool& pool, const I8Form& f, int64_t M, const float* bias, DType store, float* out,
           int64_t ldout, Rows rows) {
    const int64_t N = f.N, F = N / 2;
    if (fused(f) && f.glu_pairs) {  // the GLU in the tiles' epilogue
      I8Epilogue e;
      e.N = N, e.glu_pairs = true, e.comp = f.comp.data(), e.sw = f.sw.data(), e.sx = sx.data(), e.bias = bias;
      e.store = store, e.act = out ? out : yf.data(), e.ldact = out ? ldout : F;
      vnni_gemm(pool, xq.data(), M, f.K, f.panels.get(), N, f.K, e);
      if (out) return;
      pool.parallel_for(M, [&](int64_t b, int64_t end) {
        for (int64_t m = b; m < end; ++m) rows(m, yf.data() + m * F);
      });
      return;
    }
    if (fused(f))
      gemm(pool, f, M, bias, yf.data(), N, store, false);
    else
      sums(pool, f, M);
    pool.parallel_for(M, [&](int64_t b, int64_t e) {
      thread_local aligned_vector<float> rowbuf;
      if (rowbuf.size() < static_cast<size_t>(N + F)) rowbuf.resize(static_cast<size_t>(N + F));
      for (int64_t m = b; m < e; ++m) {
        const float* yr = rowbuf.data();
        if (fused(f))
          yr = yf.data() + m * N;
        else
          dequantize(f, M, m, bias, rowbuf.data(), store, false);
        float* const act = out ? out + m * ldout : rowbuf.data() + N;
        silu_mul(/*gate=*/yr + F, /*up=*/yr, act, F, store);
        if (!out) rows(m, act);
      }
    });
  }
  // The int32 sums of every row of x's levels into acc [rows, N] (a form not fused).
  void sums(const ThreadPool& pool, const I8Form& f, int64_t M) {
    const int64_t rows = f.two_level ? 2 * M : M;
    if (f.own) {
      I8Epilogue e;
      e.N = f.N, e.glu_pairs = f.glu_pairs, e.acc = acc.data(), e.ldacc = f.N;
      vnni_gemm(pool, xq.data(), rows, f.K, f.panels.get(), f.N, f.K, e);
    } else if (f.madd) {
      const int64_t ld16 = 2 * ((f.K + 1) / 2);
      widen_rows(pool, xq.data(), rows, f.K, x16.data(), ld16);
      madd_gemm(pool, x16.data(), rows, ld16, f.panels16.get(), f.N, f.K, acc.data(), f.N);
    } else {
      detail::dnnl_matmul_i8(pool, xq.data(), rows, f.K, f.dnnl.get(), acc.data());
    }
  }
  // Output row m (N values) into y from the int32 sums (accumulate: added to y's values).
  void dequantize(const I8Form& f, int64_t M, int64_t m, const float* bias, float* y, DType store,
                  bool accumulate) const {
    const float s = sx[static_cast<size_t>(m)];
    if (f.two_level)
      dequant_row2(acc.data() + m * f.N, acc.data() + (M + m) * f.N, f.comp.data(), f.sw.data(), s, bias, y, f.N, store,
                   accumulate);
    else
      dequant_row(acc.data() + m * f.N, f.comp.data(), f.sw.data(), s, bias, y, f.N, store, accumulate);
  }
};

}  // namespace

const char* pick_i8_gemm(const I8GemmCpu& cpu, std::string_view env) {
  if (env == "vnni" && cpu.vnni) return "vnni";
  if (env == "onednn" && cpu.dnnl_exact) return "onednn";
  if (env == "avx2" && cpu.avx2_fma) return "avx2";
  if (cpu.amx_int8 && cpu.dnnl_exact) return "onednn";
  if (cpu.vnni) return "vnni";
  if (cpu.dnnl_exact) return "onednn";
  return cpu.avx2_fma ? "avx2" : "";
}

const char* i8_gemm_engine() {
  const I8GemmCpu cpu{.vnni = vnni_gemm_runs(),
                      .amx_int8 = detail::cpu_has_amx_int8(),
                      .dnnl_exact = detail::dnnl_i8_offered(),
                      .avx2_fma = detail::cpu_has_avx2_fma()};
  return pick_i8_gemm(cpu, i8_gemm_env());
}

const char* i8_gemm_name(const LinearWeight& w) {
  if (w.gemm_kind() != GemmKind::I8) return "";
  const auto& f = *static_cast<const I8Form*>(w.gemm_form());
  return f.own ? "vnni" : f.madd ? "avx2" : "onednn";
}

LinearWeight gemm_only_i8(const LinearWeight& w, const ThreadPool& pool, I8Options opt) {
  MM3_CHECK(!w.quantized() && !w.gemm_form() && w.weight().ndim() == 2,
            "gemm_only_i8: needs a plain F32 / BF16 weight");
  const int64_t N = w.out_features(), K = w.in_features();
  MM3_CHECK(K < 66000, "gemm_only_i8: K = {} would overflow the int32 sums", K);
  const Tensor plain = w.weight().to(DType::F32).contiguous();
  const float* wf = static_cast<const float*>(plain.raw());
  auto f = std::make_shared<I8Form>();
  f->N = N;
  f->K = K;
  f->two_level = opt.x_two_level;
  f->rotate = opt.rotate && rotation_applies(K);
  // The rotated rows' product is K times the plain one (rotate_row is unnormalized); 1/K is exact.
  const float unscale = f->rotate ? 1.0f / static_cast<float>(K) : 1.0f;
  f->sw.resize(static_cast<size_t>(N));
  f->comp.resize(static_cast<size_t>(N));
  const aligned_buffer<int8_t> q = make_aligned_buffer<int8_t>(static_cast<size_t>(N * K));  // all written below
  std::atomic<int64_t> bad_row{-1};
  pool.parallel_for(N, [&](int64_t b, int64_t e) {
    aligned_vector<float> rot(f->rotate ? static_cast<size_t>(K) : 0);
    for (int64_t n = b; n < e; ++n) {
      uint8_t* qn = reinterpret_cast<uint8_t*>(q.get() + n * K);
      const float* row = wf + n * K;
      if (f->rotate) {
        rotate_row(row, rot.data(), K);
        row = rot.data();
      }
      const float s = quantize_row(row, K, qn, 0);
      if (!std::isfinite(s)) bad_row.store(n);  // workers must not throw (core/thread_pool.h)
      int32_t sum = 0;
      for (int64_t k = 0; k < K; ++k) sum += static_cast<int8_t>(qn[k]);
      f->sw[static_cast<size_t>(n)] = s * unscale;
      f->comp[static_cast<size_t>(n)] = 128 * sum;
    }
  });
  if (bad_row.load() >= 0)
    throw BadModel(
        fmt::format("gemm_only_i8: weight row {} of [{}, {}] holds a non-finite value", bad_row.load(), N, K));
  size_t bytes = 0;
  const std::string_view engine = i8_gemm_engine();
  if (engine == "vnni") {
    f->glu_pairs = opt.glu_pairs && N % (2 * kPanel) == 0;
    f->panels = pack_i8_panels(pool, q.get(), N, K, f->glu_pairs, f->panel_bytes);
    f->own = true;
    bytes = f->panel_bytes;
  } else {
    if (engine == "onednn") f->dnnl = detail::dnnl_pack_i8(q.get(), N, K, bytes);
    if (!f->dnnl) {
      // no exact int8 GEMM here: the caller keeps its own form
      if (engine.empty() || !detail::cpu_has_avx2_fma()) return LinearWeight();
      f->panels16 = pack_madd_panels(pool, q.get(), N, K, f->panel_bytes);
      f->madd = true;
      bytes = f->panel_bytes;
    }
  }
  bytes += static_cast<size_t>(N) * (sizeof(float) + sizeof(int32_t));
  return LinearWeight(N, K, std::move(f), bytes, w.has_bias() ? w.bias() : Tensor(), GemmKind::I8);
}

namespace detail {

void i8_linear(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const LinearWeight& w, float* y,
               int64_t ldy, DType store, I8Sink sink) {
  const auto& f = *static_cast<const I8Form*>(w.gemm_form());
  const bool glu = sink == I8Sink::Glu;
  thread_local I8Scratch sc;
  sc.reserve(f, M, glu);
  I8Scratch* const scp = &sc;
  pool.parallel_for(M, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) scp->quantize(f, M, m, x + m * ldx);
  });
  const float* bias = w.bias_f32();
  if (!glu) {
    sc.gemm(pool, f, M, bias, y, ldy, store, sink == I8Sink::Add);
    return;
  }
  // each row's output leaves as the GLU's
  sc.glu(pool, f, M, bias, store, y, ldy, [](int64_t, const float*) {});
}

void i8_ff_glu_add(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const LinearWeight& w_in,
                   const LinearWeight& w_out, float* y, int64_t ldy, DType store) {
  const auto& fi = *static_cast<const I8Form*>(w_in.gemm_form());
  const auto& fo = *static_cast<const I8Form*>(w_out.gemm_form());
  thread_local I8Scratch s_in, s_out;
  s_in.reserve(fi, M, /*rows_after=*/true);
  s_out.reserve(fo, M);
  I8Scratch* const a = &s_in;
  I8Scratch* const o = &s_out;
  pool.parallel_for(M, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) a->quantize(fi, M, m, x + m * ldx);
  });
  // Each row of w_in's output through the GLU and onto w_out's levels while it is in cache: the
  // [M, F] activations never go to memory as floats.
  a->glu(pool, fi, M, w_in.bias_f32(), store, nullptr, 0,
         [&](int64_t m, const float* act) { o->quantize(fo, M, m, act); });
  o->gemm(pool, fo, M, w_out.bias_f32(), y, ldy, store, /*accumulate=*/true);
}

}  // namespace detail

}  // namespace mm3::kern
