// gemm_i8.cpp — kern::gemm_only_i8 (kernels.h): W8A8 linear layers, the weights quantized once per
// output row, the activations per row at every call, the integer GEMM in oneDNN's u8 x s8 -> s32
// matmul (brgemm with AVX512-VNNI; gemm:jit where the CPU has only AVX-VNNI, as Intel's client cores
// from Alder Lake on), the scales applied here. On Zen 5 capped to such a core (ONEDNN_MAX_CPU_ISA=
// AVX2_VNNI, MM3_ISA=avx2, an -march=alderlake build) the batch-1 DiT forward ran 7.5-8.9 s in int8
// against 21.8 s in fp32 on oneDNN's JIT sgemm (24.9 s on gemm_nt's panels; twenty-first session).
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

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/aligned.h"
#include "core/errors.h"
#include "kernels/cpu/gemm_nt.h"
#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"

namespace mm3::kern {

namespace {

struct I8Form {
  std::shared_ptr<const void> dnnl;  // the packed s8 weights (gemm_dnnl.cpp)
  std::vector<float> sw;             // [N] weight scales
  std::vector<int32_t> comp;         // [N] 128 · Σ_k qw[n, k]: the u8 offset's share of acc
  int64_t N = 0, K = 0;
  bool two_level = false;  // x quantized on two levels (q1, q2)
  bool rotate = false;     // rows taken through rotate_row before quantizing
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

// The scratch of one i8 GEMM, kept per calling thread (a fresh one per call would fault its pages in
// again; the workers get its addresses): x's levels (rows M.. the second levels of a two-level form),
// the int32 sums, x's row scales.
struct I8Scratch {
  aligned_vector<uint8_t> xq;
  aligned_vector<int32_t> acc;
  std::vector<float> sx;
  void reserve(const I8Form& f, int64_t M) {
    const int64_t rows = f.two_level ? 2 * M : M;
    if (xq.size() < static_cast<size_t>(rows * f.K)) xq.resize(static_cast<size_t>(rows * f.K));
    if (acc.size() < static_cast<size_t>(rows * f.N)) acc.resize(static_cast<size_t>(rows * f.N));
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
  void gemm(const ThreadPool& pool, const I8Form& f, int64_t M) {
    detail::dnnl_matmul_i8(pool, xq.data(), f.two_level ? 2 * M : M, f.K, f.dnnl.get(), acc.data());
  }
  // Output row m (N values) into y (accumulate: added to y's values).
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
  aligned_vector<int8_t> q(static_cast<size_t>(N * K));
  std::atomic<int64_t> bad_row{-1};
  pool.parallel_for(N, [&](int64_t b, int64_t e) {
    aligned_vector<float> rot(f->rotate ? static_cast<size_t>(K) : 0);
    for (int64_t n = b; n < e; ++n) {
      uint8_t* qn = reinterpret_cast<uint8_t*>(q.data() + n * K);
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
  f->dnnl = detail::dnnl_pack_i8(q.data(), N, K, bytes);
  if (!f->dnnl) return LinearWeight();  // no int8 brgemm here: the caller keeps its own form
  bytes += static_cast<size_t>(N) * (sizeof(float) + sizeof(int32_t));
  return LinearWeight(N, K, std::move(f), bytes, w.has_bias() ? w.bias() : Tensor(), GemmKind::I8Dnnl);
}

namespace detail {

void i8_linear(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const LinearWeight& w, float* y,
               int64_t ldy, DType store, I8Sink sink) {
  const auto& f = *static_cast<const I8Form*>(w.gemm_form());
  thread_local I8Scratch sc;
  sc.reserve(f, M);
  I8Scratch* const scp = &sc;
  pool.parallel_for(M, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) scp->quantize(f, M, m, x + m * ldx);
  });
  sc.gemm(pool, f, M);
  const float* bias = w.bias_f32();
  const int64_t N = f.N;
  pool.parallel_for(M, [&](int64_t b, int64_t e) {
    // glu: each row's output lands in this worker's row buffer (in cache) and leaves as the GLU's
    thread_local aligned_vector<float> rowbuf;
    const bool glu = sink == I8Sink::Glu;
    if (glu && rowbuf.size() < static_cast<size_t>(N)) rowbuf.resize(static_cast<size_t>(N));
    for (int64_t m = b; m < e; ++m) {
      float* const yr = glu ? rowbuf.data() : y + m * ldy;
      scp->dequantize(f, M, m, bias, yr, store, sink == I8Sink::Add);
      if (glu) silu_mul(/*gate=*/yr + N / 2, /*up=*/yr, y + m * ldy, N / 2, store);
    }
  });
}

void i8_ff_glu_add(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const LinearWeight& w_in,
                   const LinearWeight& w_out, float* y, int64_t ldy, DType store) {
  const auto& fi = *static_cast<const I8Form*>(w_in.gemm_form());
  const auto& fo = *static_cast<const I8Form*>(w_out.gemm_form());
  const int64_t F = fi.N / 2;
  thread_local I8Scratch s_in, s_out;
  s_in.reserve(fi, M);
  s_out.reserve(fo, M);
  I8Scratch* const a = &s_in;
  I8Scratch* const o = &s_out;
  pool.parallel_for(M, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) a->quantize(fi, M, m, x + m * ldx);
  });
  a->gemm(pool, fi, M);
  // Each row of w_in's output through the GLU and onto w_out's levels while it is in cache: the
  // [M, F] activations never go to memory as floats.
  const float* bias_in = w_in.bias_f32();
  pool.parallel_for(M, [&](int64_t b, int64_t e) {
    thread_local aligned_vector<float> rowbuf;
    if (rowbuf.size() < static_cast<size_t>(3 * F)) rowbuf.resize(static_cast<size_t>(3 * F));
    float* const yr = rowbuf.data();
    float* const act = yr + 2 * F;
    for (int64_t m = b; m < e; ++m) {
      a->dequantize(fi, M, m, bias_in, yr, store, false);
      silu_mul(/*gate=*/yr + F, /*up=*/yr, act, F, store);
      o->quantize(fo, M, m, act);
    }
  });
  o->gemm(pool, fo, M);
  const float* bias_out = w_out.bias_f32();
  pool.parallel_for(M, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) o->dequantize(fo, M, m, bias_out, y + m * ldy, store, true);
  });
}

}  // namespace detail

}  // namespace mm3::kern
