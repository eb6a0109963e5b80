// linear.cpp — kern::linear and kern::gemm_f32 (kernels.h), the CPU backend.
//
// Numerics follow torch's CPU linear: fp32 accumulation of exact products, bias added to the fp32
// sum, one rounding to the store dtype at the end (torch's bf16 addmm through oneDNN does the same).
// With BF16 weights and an F32 store (an fp32 run of a bf16 checkpoint) the weights are widened
// exactly and everything stays fp32, as torch's upcast model does.
//
// Paths:
// * M <= 4 (decode): a GEMV that streams each weight row once for all M rows, parallel over output
//   rows. ISA picked at runtime (AVX-512 [+BF16 dot products] / AVX2+FMA / scalar). Each output is
//   computed by one thread with a fixed order, so results do not depend on the thread count.
// * A gemm_only_bf16 weight (bf16 computation, blocked layout): oneDNN's matmul, gemm_dnnl.cpp.
// * M > 4: the blocked GEMM in gemm_nt.cpp (fp32 FMA chains, or AVX512-BF16 pair dots for a bf16
//   computation). Not OpenBLAS: its sgemm results change with the thread count (see gemm_nt.h).
#pragma GCC optimize("fp-contract=off")

#include <cblas.h>
#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/aligned.h"
#include "kernels/cpu/gemm_nt.h"
#include "kernels/cpu/segments.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/strips.h"
#include "kernels/kernels.h"
#include "kernels/tuning.h"

namespace mm3::kern {

namespace detail {

// MM3_ISA caps the dispatch below what the CPU has (never above): "scalar", "avx2", "avx512",
// "avx512bf16", "amx" (= no cap). It lets one machine run the kernel tests on every path it can execute
// (ctest runs test_kernels_baseline under MM3_ISA=avx2 and =scalar), and reproduce a user's slower path.
namespace {
enum class IsaCap { Scalar, Avx2, Avx512, Avx512Bf16, Amx };
IsaCap isa_cap() {
  static const IsaCap cap = [] {
    const char* e = std::getenv("MM3_ISA");
    if (!e || !*e) return IsaCap::Amx;
    const std::string v(e);
    if (v == "scalar") return IsaCap::Scalar;
    if (v == "avx2") return IsaCap::Avx2;
    if (v == "avx512") return IsaCap::Avx512;
    if (v == "avx512bf16") return IsaCap::Avx512Bf16;
    if (v == "amx" || v == "native") return IsaCap::Amx;
    // Not thrown: the first probe may run inside a parallel region, where an exception terminates.
    fmt::print(stderr, "mm3: MM3_ISA={} is not a known value (scalar, avx2, avx512, avx512bf16, amx); ignored\n", v);
    return IsaCap::Amx;
  }();
  return cap;
}
}  // namespace

const char* isa_name() {
  if (cpu_has_amx_bf16()) return "amx";
  if (cpu_has_avx512bf16()) return "avx512bf16";
  if (cpu_has_avx512()) return "avx512";
  if (cpu_has_avx2_fma()) return "avx2";
  return "scalar";
}
bool cpu_has_avx512bf16() {
  static const bool v = isa_cap() >= IsaCap::Avx512Bf16 && __builtin_cpu_supports("avx512f") &&
                        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  return v;
}
bool cpu_has_avx512() {
  static const bool v = isa_cap() >= IsaCap::Avx512 && __builtin_cpu_supports("avx512f") &&
                        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                        __builtin_cpu_supports("avx512vl");
  return v;
}
int64_t cpu_l1d_bytes() {
  static const int64_t v = [] {
    const long b = ::sysconf(_SC_LEVEL1_DCACHE_SIZE);
    return b >= 4096 ? static_cast<int64_t>(b) : int64_t{32 * 1024};
  }();
  return v;
}
bool cpu_has_amx_bf16() {
  static const bool v =
      isa_cap() >= IsaCap::Amx && __builtin_cpu_supports("amx-bf16") && __builtin_cpu_supports("amx-tile");
  return v;
}
bool cpu_has_amx_int8() {
  static const bool v =
      isa_cap() >= IsaCap::Amx && __builtin_cpu_supports("amx-int8") && __builtin_cpu_supports("amx-tile");
  return v;
}
namespace {
// The probe's loops: n rounds of 12 independent chains (enough to cover either instruction's latency)
// in registers (an asm barrier on one of them had GCC store all 12 to the stack every round, which
// bounded the FMA loop by the stores). Returns a sum so the work is not optimized away.
__attribute__((target("avx512f,avx512bf16"), noinline)) float probe_dpbf16(int n) {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(float(i));
  static volatile int xw = 0x3F803F80;  // read at run time, so that the loop is not folded
  const __m512bh x = (__m512bh)_mm512_set1_epi32(xw), y = (__m512bh)_mm512_set1_epi32(0x00010001);
  for (int r = 0; r < n; ++r) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = _mm512_dpbf16_ps(a[i], x, y);
  }
  float s = 0.f;
  for (int i = 0; i < 12; ++i) s += _mm512_reduce_add_ps(a[i]);
  return s;
}
__attribute__((target("avx512f"), noinline)) float probe_fma(int n) {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(float(i));
  static volatile float one = 1.f;
  const __m512 x = _mm512_set1_ps(one), y = _mm512_set1_ps(1e-20f);
  for (int r = 0; r < n; ++r) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = _mm512_fmadd_ps(x, y, a[i]);
  }
  float s = 0.f;
  for (int i = 0; i < 12; ++i) s += _mm512_reduce_add_ps(a[i]);
  return s;
}
}  // namespace

// Does VDPBF16PS compute what the FMA bodies do: per lane the high halves' product added, then the low
// halves', each rounded to nearest even, under DAZ and FTZ? Checked on 512 lanes of pseudo-random
// operands (every bit pattern's exponent, so denormals, infinities and NaNs among them; NaNs compare as
// NaNs). On the thirty-eighth session's Xeon it does; where it does not, the pairs stay on the
// instruction, so that the choice never changes a bit.
__attribute__((target("avx512f,avx512bf16"))) bool bf16_dot_is_two_fmas() {
  uint64_t st = 0x9E3779B97F4A7C15ull;
  auto next = [&st] {
    st ^= st << 13, st ^= st >> 7, st ^= st << 17;
    return static_cast<uint32_t>(st >> 16);
  };
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  const unsigned csr = _mm_getcsr();
  bool same = true;
  for (int it = 0; it < 32 && same; ++it) {
    alignas(64) uint32_t a[16], b[16], c[16];
    for (int j = 0; j < 16; ++j) {
      a[j] = next(), b[j] = next(), c[j] = next();
      if (j % 4 == 1) a[j] &= 0x807F807Fu;                        // bf16 denormals
      if (j % 4 == 2) c[j] &= 0x807FFFFFu;                        // a denormal accumulator
      if (j % 4 == 3) b[j] = (b[j] & 0x80FF80FFu) | 0x01000100u;  // products near the underflow
    }
    const __m512i va = _mm512_load_si512(a), vb = _mm512_load_si512(b);
    const __m512 vc = _mm512_castsi512_ps(_mm512_load_si512(c));
    const __m512 want = _mm512_dpbf16_ps(vc, (__m512bh)va, (__m512bh)vb);
    _mm_setcsr(csr | 0x8040u);
    __m512 got = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(va, hi)),
                                 _mm512_castsi512_ps(_mm512_and_si512(vb, hi)), vc);
    got = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(va, 16)),
                          _mm512_castsi512_ps(_mm512_slli_epi32(vb, 16)), got);
    _mm_setcsr(csr);
    const __mmask16 nan = _mm512_cmp_ps_mask(want, want, _CMP_UNORD_Q) & _mm512_cmp_ps_mask(got, got, _CMP_UNORD_Q);
    const __mmask16 eq = _mm512_cmpeq_epi32_mask(_mm512_castps_si512(want), _mm512_castps_si512(got));
    same = static_cast<__mmask16>(eq | nan) == 0xFFFF;
  }
  return same;
}

// Thirty-eighth session, on a 2-core Intel Xeon (family 6 model 207, AVX512-BF16 without AMX in the
// VM): one VDPBF16PS zmm took ~2.2 cycles (latency ~8), an FMA ~0.54 (latency 4): the pair dot ran at
// half the FMA's flop rate (`peak_bf16_dot` 171 against `peak_f32_fma` 345 GFLOP/s), where on Zen 4 it
// runs at twice it (460 against 230). Each round of the probe times 2000 x 12 of each instruction, the
// best of 5 rounds (~0.1 ms in all on either CPU); bf16_dot_cost() is the ratio of the two times and the
// pair dot counts as slow above 2.5 (by those peaks 1.0 on Zen 4; 3.9 read on that Xeon).
double bf16_dot_cost() {
  static const double v = [] {
    if (!cpu_has_avx512bf16()) return 0.0;
    double dp = 1e30, fma = 1e30;
    volatile float sink = 0.f;
    for (int r = 0; r < 5; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      sink = sink + probe_dpbf16(2000);
      auto t1 = std::chrono::steady_clock::now();
      sink = sink + probe_fma(2000);
      auto t2 = std::chrono::steady_clock::now();
      dp = std::min(dp, std::chrono::duration<double>(t1 - t0).count());
      fma = std::min(fma, std::chrono::duration<double>(t2 - t1).count());
    }
    return dp / fma;
  }();
  return v;
}
bool cpu_bf16_dot_slow() {
  static const bool v = cpu_has_avx512bf16() && bf16_dot_is_two_fmas() && bf16_dot_cost() > 2.5;
  return v;
}
// The bf16 pair dots (the strip GEMV, gemm_ex's bf16 tile) as two FMAs each (the same bits) or VDPBF16PS:
// the knob bf16_dot, else the FMAs where the pair dot is slow (cpu_bf16_dot_slow). Thirty-eighth session, a
// 2-core Intel Xeon (family 6 model 207, AVX512-BF16 without AMX), `mm3 bench --alternate` (16-20 runs):
// the FMAs ÷ VDPBF16PS depth_frame 0.828, gemv_bf16_strips_4096x12288_m2 0.784; with the FMAs, T1
// prefetches 2 KiB ahead ÷ none (gemv_prefetch=1,0) 0.846 / 0.831, so the FMA body prefetches unless
// gemv_prefetch=0 (distances 1, 4, 8 KiB: the same within the noise). depth_frame 0.410 -> 0.291 s.
bool bf16_dot_fma() {
  const int forced = tuning::forced(tuning::Knob::Bf16Dot);
  return forced >= 0 ? forced == 0 : detail::cpu_bf16_dot_slow();
}

bool cpu_has_avx512vnni() {
  static const bool v = cpu_has_avx512() && __builtin_cpu_supports("avx512vnni");
  return v;
}
bool cpu_has_avx2_fma() {
  static const bool v = isa_cap() >= IsaCap::Avx2 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return v;
}

}  // namespace detail

namespace {

using detail::cpu_has_avx2_fma;
using detail::cpu_has_avx512;
using detail::cpu_has_avx512bf16;

// Sets OpenBLAS's worker count to the pool's (another pool may have changed it since).
void blas_threads(const ThreadPool& pool) {
  if (openblas_get_num_threads() != pool.size()) openblas_set_num_threads(pool.size());
}

// ---- GEMV bodies: sums[m * N + n] = sum_k x[m, k] * W[n, k] for n in [n0, n1) ----

// The AVX-512 bodies work on NB = 4 output rows at a time (the bf16 body: 1, 4, 8 or 12, see
// gemv_bf16_span) with C independent accumulator chains per (row, m), so that enough FMA / VDPBF16PS
// chains are in flight to hide their latency (2 chains per row were latency-bound at ~100 GFLOP/s on
// L2-resident weights; streamed from memory on Zen 4, one row's 2 x M chains were enough). Chain c
// takes the vector blocks b = c, c + C, ...; the masked tail goes to chain 0; the chains are summed in
// order, then reduced.
// A row's operation sequence does not depend on its neighbours, so rows computed several at a time or
// alone (chunk remainders) give the same bits, whatever the thread chunking.
constexpr int kGemvNB = 4;
constexpr int gemv_chains(int M) { return M <= 2 ? 2 : 1; }
// The bf16 body's chains: one per (row, m) for every M (M = 2 still has 2 per row). It halves the
// accumulators, which is what lets 12 rows sit side by side in the 32 vector registers (12 x 2 x 1 + 2 x +
// 1 weight); see gemv_bf16_rows for why more rows stream faster. It is also the order the strip form's
// GEMV reproduces (strips.h), so a model decodes to the same bits in either form. Until the thirty-second
// session M <= 2 took 2 chains (other bits, same bound). On the bf16 goldens' tiny checkpoint (depth
// decoder K = 64 and 96) both orders leave the depth decoder bit-identical to torch; one chain over k
// (the GEMM's order, which the strip form's GEMV ran at first) read depth_bf16 0.991 / 0.977.
constexpr int gemv_bf16_chains(int) { return 1; }
// The bf16 body's software prefetch distance (PREFETCHT1 ahead of each weight stream; gemv_bf16_prefetch).
constexpr int64_t kGemvBf16PfBytes = 2048;

template <int M, int NB, bool WB>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) inline void gemv_rows_avx512(const float* x, int64_t ldx,
                                                                                           const void* wp, int64_t K,
                                                                                           int64_t n, float* sums,
                                                                                           int64_t N) {
  constexpr int C = gemv_chains(M);
  auto wrow = [&](int i, int64_t off, __mmask16 msk, bool full) -> __m512 {
    if constexpr (WB) {
      const uint16_t* p = static_cast<const uint16_t*>(wp) + (n + i) * K + off;
      const __m256i h = full ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)) : _mm256_maskz_loadu_epi16(msk, p);
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      const float* p = static_cast<const float*>(wp) + (n + i) * K + off;
      return full ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(msk, p);
    }
  };
  __m512 acc[NB][M][C];
  for (int i = 0; i < NB; ++i)
    for (int m = 0; m < M; ++m)
      for (int c = 0; c < C; ++c) acc[i][m][c] = _mm512_setzero_ps();
  const int64_t nb = K / 16;
  int64_t b = 0;
  for (; b + C <= nb; b += C)
    for (int c = 0; c < C; ++c) {
      const int64_t off = (b + c) * 16;
      __m512 xv[M];
      for (int m = 0; m < M; ++m) xv[m] = _mm512_loadu_ps(x + m * ldx + off);
      for (int i = 0; i < NB; ++i) {
        const __m512 wv = wrow(i, off, 0, true);
        for (int m = 0; m < M; ++m) acc[i][m][c] = _mm512_fmadd_ps(xv[m], wv, acc[i][m][c]);
      }
    }
  for (int c = 0; b < nb; ++b, ++c) {  // leftover full blocks continue chains 0, 1, ...
    const int64_t off = b * 16;
    for (int i = 0; i < NB; ++i) {
      const __m512 wv = wrow(i, off, 0, true);
      for (int m = 0; m < M; ++m) acc[i][m][c] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * ldx + off), wv, acc[i][m][c]);
    }
  }
  if (K % 16) {
    const int64_t off = nb * 16;
    const __mmask16 msk = __mmask16((1u << (K % 16)) - 1u);
    for (int i = 0; i < NB; ++i) {
      const __m512 wv = wrow(i, off, msk, false);
      for (int m = 0; m < M; ++m)
        acc[i][m][0] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(msk, x + m * ldx + off), wv, acc[i][m][0]);
    }
  }
  for (int i = 0; i < NB; ++i)
    for (int m = 0; m < M; ++m) {
      __m512 t = acc[i][m][0];
      for (int c = 1; c < C; ++c) t = _mm512_add_ps(t, acc[i][m][c]);
      sums[m * N + n + i] = _mm512_reduce_add_ps(t);
    }
}

template <int M, bool WB>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) void gemv_avx512(const float* x, int64_t ldx,
                                                                               const void* wp, int64_t K, int64_t n0,
                                                                               int64_t n1, float* sums, int64_t N) {
  int64_t n = n0;
  for (; n + kGemvNB <= n1; n += kGemvNB) gemv_rows_avx512<M, kGemvNB, WB>(x, ldx, wp, K, n, sums, N);
  for (; n < n1; ++n) gemv_rows_avx512<M, 1, WB>(x, ldx, wp, K, n, sums, N);
}

// BF16 x BF16 with VDPBF16PS: xb is the bf16 copy of x, [M, Kp] with Kp even and zero padding.
// Products of bf16 values are exact in fp32, so this is an fp32-accumulated dot product like the
// others, only with a different (fixed) summation order. Blocks are 32 bf16 (16 pairs).
//
// SH: where the weight rows start within a cache line, in 4-byte units. Weights used in place from a
// safetensors file sit wherever its header put them (the synthetic full checkpoint: 16 or 48 bytes
// past a line), so each 64-byte block load would straddle two lines; with SH > 0 the block is built from the
// two aligned lines it overlaps (VPERMT2D), which streams from memory like aligned rows do. Measured
// on 2 Zen 5 cores, depth_frame with its weights copied 16 bytes off a line: vs_floor 1.39-1.54 vs
// 1.14-1.34 aligned. The blocks, and so the sums and their order, are the same for every SH: same bits.
// The aligned loads read up to 60 bytes before a row's start or after its end, always inside a cache
// line that holds some of the row's bytes (so never a fault); address sanitizers are told so.
template <int M, int NB, int SH, bool PF>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16"), no_sanitize_address)) inline void
gemv_rows_bf16(const uint16_t* xb, int64_t Kp, const uint16_t* w, int64_t K, int64_t n, float* sums, int64_t N) {
  constexpr int C = gemv_bf16_chains(M);
  [[maybe_unused]] const __m512i idx =
      _mm512_add_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(SH));
  // Block `off` (in bf16 elements) of row i: 64 bytes from w + (n + i) * K + off.
  auto wblock = [&](int i, int64_t off) -> __m512i {
    const uint16_t* p = w + (n + i) * K + off;
    if constexpr (SH == 0) {
      return _mm512_loadu_si512(p);
    } else {
      const auto* a = reinterpret_cast<const __m512i*>(p - 2 * SH);  // the line the block starts in
      return _mm512_permutex2var_epi32(_mm512_load_si512(a), idx, _mm512_load_si512(a + 1));
    }
  };
  __m512 acc[NB][M][C];
  for (int i = 0; i < NB; ++i)
    for (int m = 0; m < M; ++m)
      for (int c = 0; c < C; ++c) acc[i][m][c] = _mm512_setzero_ps();
  const int64_t nb = K / 32;
  int64_t b = 0;
  for (; b + C <= nb; b += C)
    for (int c = 0; c < C; ++c) {
      const int64_t off = (b + c) * 32;
      __m512i xv[M];
      for (int m = 0; m < M; ++m) xv[m] = _mm512_loadu_si512(xb + m * Kp + off);
      for (int i = 0; i < NB; ++i) {
        const __m512i wv = wblock(i, off);
        if constexpr (PF) __builtin_prefetch(w + (n + i) * K + off + kGemvBf16PfBytes / 2, 0, 2);
        for (int m = 0; m < M; ++m) acc[i][m][c] = _mm512_dpbf16_ps(acc[i][m][c], (__m512bh)xv[m], (__m512bh)wv);
      }
    }
  for (int c = 0; b < nb; ++b, ++c) {
    const int64_t off = b * 32;
    for (int i = 0; i < NB; ++i) {
      const __m512i wv = wblock(i, off);
      for (int m = 0; m < M; ++m)
        acc[i][m][c] = _mm512_dpbf16_ps(acc[i][m][c], (__m512bh)_mm512_loadu_si512(xb + m * Kp + off), (__m512bh)wv);
    }
  }
  if (K % 32) {
    const int64_t off = nb * 32;
    const __mmask32 msk = __mmask32((1u << (K % 32)) - 1u);
    for (int i = 0; i < NB; ++i) {
      const __m512i wv = _mm512_maskz_loadu_epi16(msk, w + (n + i) * K + off);
      for (int m = 0; m < M; ++m)
        acc[i][m][0] =
            _mm512_dpbf16_ps(acc[i][m][0], (__m512bh)_mm512_maskz_loadu_epi16(msk, xb + m * Kp + off), (__m512bh)wv);
    }
  }
  for (int i = 0; i < NB; ++i)
    for (int m = 0; m < M; ++m) {
      __m512 t = acc[i][m][0];
      for (int c = 1; c < C; ++c) t = _mm512_add_ps(t, acc[i][m][c]);
      sums[m * N + n + i] = _mm512_reduce_add_ps(t);
    }
}

// Whether the bf16 body prefetches (PREFETCHT1: into L2, kGemvBf16PfBytes ahead of each weight row's
// stream). On 2 Zen 4 cores (AMD family 19h; twenty-seventh session, `mm3 bench --alternate
// gemv_prefetch=0,1`, 20-40 runs, memory probe 30-34 GB/s) with ÷ without: ar_frame 0.924 / 0.927,
// depth_frame 0.931, lm_step 0.941, gemv_bf16_4096x12288_m2 0.92. In a scratch copy of the 4-row body
// (one process, forms alternating) T1 at 2 KiB read 27.7 vs 25.5 GB/s on two threads, 4 and 8 KiB a
// little less, and the NTA hint was slower than none (23.4). Elsewhere it is off: on Zen 5 an NTA
// prefetch 1 KiB ahead had moved ar_frame by nothing (quant.cpp, kVnniPfBytes), and T1 was not measured.
// The knob gemv_prefetch (MM3_GEMV_PREFETCH=0 or 1) forces it. A prefetch changes no value.
bool gemv_bf16_prefetch() {
  static const bool zen4 = __builtin_cpu_is("amd") && __builtin_cpu_is("amdfam19h");
  const int forced = tuning::forced(tuning::Knob::GemvPrefetch);
  return forced >= 0 ? forced == 1 : zen4;
}

// Rows one after another, each read front to back, unless the M bf16 rows of x (M · Kp · 2 bytes)
// outgrow a quarter of the L1D: then NB rows side by side, which load each x vector once for NB
// weight rows. (The quantized GEMV's threshold is half the L1D, quant.cpp; its x is a byte a value.)
// Twenty-sixth session: one row at a time below half the L1D, from binaries alternating x3 on 2 Zen 4
// cores (gemv_bf16_4096x{12288,4096,6144}_m2 17.4-18.9 -> 18.0-22.7 GB/s one thread, 24.6-30.4 ->
// 32.1-35.0 two; lm_step 465 / 409 / 449 -> 454 / 361 / 413 ms). The twenty-seventh, on the same
// machine, compared the two orders inside one process, alternating run by run (20-40 runs, the median
// of the pairs' ratios), and found the opposite at K = 4096, M = 2 (2 x 8 KiB of x): 4 side by side ÷
// one at a time ar_frame 0.905 / 0.937 / 0.819 / 0.985 / 0.869 / 0.92 (six sets), depth_frame 0.898 /
// 0.963, lm_step 0.851; the stage gemv_bf16_4096x12288_m2 disagreed (0.945, 1.20, 1.10) on two threads,
// agreed on one (0.924, twenty-eighth session). Its weights and the model's sit on cache lines alike
// (the model's are resident copies: perf shows ar_frame in the SH = 0 body). In a scratch copy of the
// body one core streamed 8 KiB rows at ~11-19 GB/s with 16 KiB of x and ~19-20 with the same loads
// from 8 KiB (docs/performance-history.md).
// Long rows were side by side under both rules: gemv_bf16_12288x4096_m2 (K = 12288) one row at a time
// 11.2-12.5 GB/s on one thread, 23.7-24.1 on two, 4 side by side 19.9-21.0 and 31.8-38.5. A row's
// operations do not depend on its neighbours: the same bits either way.
// The knob gemv_rows (MM3_GEMV_ROWS=1, 4, 8 or 12; `mm3 bench --alternate gemv_rows=1,4,8,12`) forces one order.
// Side by side means 8 rows on Zen 4 (thirty-first session; AMD family 19h), 4 elsewhere. With
// `mm3 bench --alternate gemv_rows=4,8` (20-24 runs, one process) 8 ÷ 4 read: ar_frame 0.957 / 0.881
// (probe 35 / 56 GB/s), 0.874 on one thread; depth_frame 0.895 / 0.917, one thread 0.858; lm_step 0.964;
// gemv_bf16_{4096x12288, 12288x4096, 4096x1024}_m2 0.926 / 0.954 / 0.971. For M = 4 too (the depth
// decoder's first step; 32 accumulators, some spilled), 8 rows against 4 there, binaries alternating
// x4: depth_frame vs_floor 1.16-1.45 against 1.21-1.54. kern::linear itself over [12288, 4096] (M = 2,
// five copies on huge pages, 4 and 8 alternating call by call): 19.4 -> 21.8 GB/s on one core, 27.5 ->
// 28.7 on two. Why 8 rows streamed faster was open then; the thirty-second session's answer follows.
// Other CPUs were not measured with 8 or 12 (try --alternate gemv_rows=4,8,12 there).
// Thirty-second session (Zen 4): the cost is the L1 fills. Each block step loads M lines of x beside
// NB weight lines, and x (2 x 8 KiB at K = 4096) does not survive in the L1D while 8 rows' weights
// stream past between its uses, so those are L2 fills too, and a fill from L2 costs the streaming body
// about what a weight line's does. A scratch copy of the 8-row body (one process, cold copies on huge
// pages, forms alternating call by call) read 22-23 GB/s on one core with the real x, 29-31 with x
// confined to 2 KiB (always in the L1D) or held in registers, about a plain streaming sum's rate: the
// M/NB extra fills (2/8) are most of the gap. So more rows side by side: 12, 2 x lines per 12 weight
// lines, which fit the registers with one chain per (row, m) (gemv_bf16_chains). The scratch read 24.9
// for 12 rows, 23.1 for 16 (accumulators spilled); in the kernel 14 rows ÷ 8 read 0.94 where 12 ÷ 8
// read 0.91. K-chunked forms that keep x in the L1D by holding the accumulators in memory gained less
// (8 rows, chunks of 512: +8% with a relaid single-stream weight, -10% row-major).
// `mm3 bench --alternate gemv_rows=8,12` (same bits), 12 ÷ 8: ar_frame 0.947, depth_frame 0.956,
// lm_step 0.954 (30 runs, probe ~60 GB/s); gemv_bf16_4096x6144_m2 0.920 (probe 61), 4096x12288 0.961
// (48), 12288x4096 0.997 (35); one thread 4096x12288 0.937.
// Zen 4 takes 12 for M <= 2 and 8 for M = 3 and 4 (12 x 4 accumulators do not fit).
// Since the same session the model's bf16 weights are in the strip form where the CPU has AVX512-BF16
// (strips.h: one x line per 16 pairs, 2 per 32 weight lines at M = 2; the same bits as this body), so
// this body serves plain BF16 weights: MM3_BF16_STRIPS=0, tests, and the bench's gemv_bf16_* stages.
int gemv_bf16_rows(int64_t M, int64_t Kp) {
  const int forced = tuning::forced(tuning::Knob::GemvRows);
  if (forced > 0) return forced;
  static const bool zen4 = __builtin_cpu_is("amd") && __builtin_cpu_is("amdfam19h");
  const int wide = zen4 ? (M <= 2 ? 12 : 8) : kGemvNB;
  return 2 * M * Kp > detail::cpu_l1d_bytes() / 4 ? wide : 1;
}

template <int M, int SH, bool PF>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16"), no_sanitize_address)) void gemv_bf16_span(
    const uint16_t* xb, int64_t Kp, const uint16_t* w, int64_t K, int64_t n0, int64_t n1, float* sums, int64_t N) {
  int64_t n = n0;
  const int rows = gemv_bf16_rows(M, Kp);
  if (rows == 12)
    for (; n + 12 <= n1; n += 12) gemv_rows_bf16<M, 12, SH, PF>(xb, Kp, w, K, n, sums, N);
  if (rows >= 8)
    for (; n + 8 <= n1; n += 8) gemv_rows_bf16<M, 8, SH, PF>(xb, Kp, w, K, n, sums, N);
  if (rows >= kGemvNB)
    for (; n + kGemvNB <= n1; n += kGemvNB) gemv_rows_bf16<M, kGemvNB, SH, PF>(xb, Kp, w, K, n, sums, N);
  for (; n < n1; ++n) gemv_rows_bf16<M, 1, SH, PF>(xb, Kp, w, K, n, sums, N);
}

// The line-aligned loads need every row to start at the same offset within a line (K a multiple of
// 32) and that offset to be whole 4-byte units; other weights take the straddling loads (SH 0).
using GemvBf16SpanFn = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, int64_t, int64_t, float*, int64_t);
template <int M, bool PF, size_t... SH>
constexpr std::array<GemvBf16SpanFn, sizeof...(SH)> gemv_bf16_spans(std::index_sequence<SH...>) {
  return {gemv_bf16_span<M, static_cast<int>(SH), PF>...};
}

template <int M>
void gemv_avx512bf16(const uint16_t* xb, int64_t Kp, const uint16_t* w, int64_t K, int64_t n0, int64_t n1, float* sums,
                     int64_t N) {
  static constexpr auto spans = gemv_bf16_spans<M, false>(std::make_index_sequence<16>{});
  static constexpr auto spans_pf = gemv_bf16_spans<M, true>(std::make_index_sequence<16>{});
  const auto at = reinterpret_cast<uintptr_t>(w) % 64;
  (gemv_bf16_prefetch() ? spans_pf : spans)[K % 32 == 0 && at % 4 == 0 ? at / 4 : 0](xb, Kp, w, K, n0, n1, sums, N);
}

// The AVX-512 body for bf16 weights in a bf16 computation where the CPU has AVX-512 but not AVX512-BF16
// (Skylake-SP, Cascade Lake, Ice Lake): the AVX2 body's scheme (below) on 64-byte loads. x from its
// exact bf16 copy; one 16-lane chain per (row, m): per 32 k, lane j takes k + 2j (the 32-bit lanes of a
// 64-byte load shifted left by 16), then k + 2j + 1 (the lanes with their low 16 bits cleared); the
// K % 32 tail as one scalar FMA chain from 0; the chain reduced lane j + 8, then + 4, + 2, + 1 (in
// gemv_split_sum's order), the tail added last. NB rows side by side (up to 12 at M <= 2: 24
// accumulators), each with that sequence: every NB gives the same bits. Until the thirty-fifth session
// these took gemv_avx512 (4 rows, two chains of fp32 x, VPMOVZXWD widening): ar_frame under MM3_ISA=avx512
// on Zen 4 0.978 s at vs_floor 1.42 (probe 31 GB/s); measured after: docs/performance-history.md.
inline float gemv_split_sum(const float (&l)[16]) {
  float a[8], b[4];
  for (int j = 0; j < 8; ++j) a[j] = l[j] + l[j + 8];
  for (int j = 0; j < 4; ++j) b[j] = a[j] + a[j + 4];
  return (b[0] + b[2]) + (b[1] + b[3]);
}

template <int M, int NB, bool PF>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) inline void gemv_rows_split512(
    const uint16_t* xb, int64_t K, const uint16_t* w, int64_t n, float* sums, int64_t N) {
  const __m512i hi16 = _mm512_set1_epi32(int32_t(0xFFFF0000u));
  auto split32 = [&](const uint16_t* p, int h) -> __m512 {
    const __m512i v = _mm512_loadu_si512(p);
    return _mm512_castsi512_ps(h == 0 ? _mm512_slli_epi32(v, 16) : _mm512_and_si512(v, hi16));
  };
  __m512 acc[NB][M];
  for (int i = 0; i < NB; ++i)
    for (int m = 0; m < M; ++m) acc[i][m] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    if constexpr (PF)
      for (int i = 0; i < NB; ++i) __builtin_prefetch(w + (n + i) * K + k + kGemvBf16PfBytes / 2, 0, 2);
    for (int h = 0; h < 2; ++h) {
      __m512 xv[M];
      for (int m = 0; m < M; ++m) xv[m] = split32(xb + m * K + k, h);
      for (int i = 0; i < NB; ++i) {
        const __m512 wv = split32(w + (n + i) * K + k, h);
        for (int m = 0; m < M; ++m) acc[i][m] = _mm512_fmadd_ps(xv[m], wv, acc[i][m]);
      }
    }
  }
  for (int i = 0; i < NB; ++i)
    for (int m = 0; m < M; ++m) {
      float tail = 0.f;
      for (int64_t t = k; t < K; ++t)
        tail = std::fma(bf16_bits_to_f32(xb[m * K + t]), bf16_bits_to_f32(w[(n + i) * K + t]), tail);
      float l[16];
      _mm512_storeu_ps(l, acc[i][m]);
      sums[m * N + n + i] = gemv_split_sum(l) + tail;
    }
}

constexpr int split512_fit(int M) { return M <= 2 ? 12 : M == 3 ? 8 : 4; }

template <int M, bool PF, int NB, int... NBs>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) inline void split512_groups(int rows, const uint16_t* xb,
                                                                                          int64_t K, const uint16_t* w,
                                                                                          int64_t& n, int64_t n1,
                                                                                          float* sums, int64_t N) {
  if constexpr (NB <= split512_fit(M))
    if (rows >= NB)
      for (; n + NB <= n1; n += NB) gemv_rows_split512<M, NB, PF>(xb, K, w, n, sums, N);
  if constexpr (sizeof...(NBs) > 0) split512_groups<M, PF, NBs...>(rows, xb, K, w, n, n1, sums, N);
}

// Rows side by side: the most that fit, unless the knob gemv_rows forces a count (capped at that); the
// prefetch as the AVX512-BF16 body's (gemv_bf16_prefetch).
template <int M>
void gemv_split512(const void* xb, int64_t, const void* w, int64_t K, int64_t n0, int64_t n1, float* sums, int64_t N) {
  const int forced = tuning::forced(tuning::Knob::GemvRows);
  const int rows = forced > 0 ? std::min(forced, split512_fit(M)) : split512_fit(M);
  int64_t n = n0;
  const auto* x16 = static_cast<const uint16_t*>(xb);
  const auto* w16 = static_cast<const uint16_t*>(w);
  if (gemv_bf16_prefetch())
    split512_groups<M, true, 12, 8, 4, 2, 1>(rows, x16, K, w16, n, n1, sums, N);
  else
    split512_groups<M, false, 12, 8, 4, 2, 1>(rows, x16, K, w16, n, n1, sums, N);
}

constexpr int64_t kGemvPfBytes = 1024;

// The AVX2 body. F32 weights: each (row, m) sums in two 8-lane chains, chain 0 over k % 16 < 8, chain
// 1 over the rest, one FMA per 16 k each; then a scalar FMA chain over the K % 16 tail from 0; the two
// chains added, reduced 128 + 128, then 64 + 64, 32 + 32, and the tail added last.
// BF16 weights: one 8-lane chain per (row, m): per 16 k, lane j takes k + 2j, then k + 2j + 1 (a
// 32-byte load holds 16 bf16 weights; the even ones are its 32-bit lanes shifted left by 16, the odd
// ones the lanes with their low 16 bits cleared: one shift or one AND a weight vector, where widening 8
// at a time took a VPMOVZXWD and a shift); the tail and the reduction as above. x must come in the
// same order: from a bf16 copy (XB: the same split of a 32-byte load), else from a "split" fp32 copy
// (x_split: per 16 k, the 8 even ones, then the 8 odd; the tail as it is). One chain per (row, m) is
// what lets 6 rows sit side by side at M = 2 in the 16 ymm registers (12 accumulators, 2 x, 1 weight).
// NB rows go side by side, each with exactly its sequence, so every NB gives the same bits; side by side
// they share each load of x.
// Thirty-fifth session (AVX2 is what a laptop without AVX-512 runs): the body until then took one row
// at a time, the F32 weights' two chains, VPMOVZXWD widening and fp32 x. At M = 2, K = 4096 each 32-byte
// step of a weight row read 2 x 64 bytes of fp32 x, which (32 KiB) does not stay in the L1D beside
// the stream: the L1 fills of x that the AVX-512 body's rows side by side answer (thirty-second
// session, gemv_bf16_rows). Measured: docs/performance-history.md, thirty-fifth session.
template <int M, int NB, bool WB, bool XB, int PF>
__attribute__((target("avx2,fma"))) inline void gemv_rows_avx2(const void* xp, int64_t ldx, const void* wp, int64_t K,
                                                               int64_t n, float* sums, int64_t N) {
  static_assert(WB || !XB, "a bf16 x goes with bf16 weights");
  const __m256i hi16 = _mm256_set1_epi32(int32_t(0xFFFF0000u));
  // Half h of the 16 values from k on, of a bf16 weight row or x: h = 0 the even ones, 1 the odd.
  auto split16 = [&](const uint16_t* p, int h) -> __m256 {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm256_castsi256_ps(h == 0 ? _mm256_slli_epi32(v, 16) : _mm256_and_si256(v, hi16));
  };
  auto load_w = [&](int i, int64_t k, int h) -> __m256 {
    if constexpr (WB)
      return split16(static_cast<const uint16_t*>(wp) + (n + i) * K + k, h);
    else
      return _mm256_loadu_ps(static_cast<const float*>(wp) + (n + i) * K + k + 8 * h);
  };
  auto load_x = [&](int m, int64_t k, int h) -> __m256 {
    if constexpr (XB)
      return split16(static_cast<const uint16_t*>(xp) + m * ldx + k, h);
    else
      return _mm256_loadu_ps(static_cast<const float*>(xp) + m * ldx + k + 8 * h);
  };
  auto x_at = [&](int m, int64_t k) -> float {  // the tail's x: in place in every form
    if constexpr (XB)
      return bf16_bits_to_f32(static_cast<const uint16_t*>(xp)[m * ldx + k]);
    else
      return static_cast<const float*>(xp)[m * ldx + k];
  };
  auto w_at = [&](int i, int64_t k) -> float {
    if constexpr (WB)
      return bf16_bits_to_f32(static_cast<const uint16_t*>(wp)[(n + i) * K + k]);
    else
      return static_cast<const float*>(wp)[(n + i) * K + k];
  };
  constexpr int64_t wsize = WB ? 2 : 4;
  constexpr int C = WB ? 1 : 2;  // chains per (row, m): half h of each 16 k goes to chain h % C
  __m256 acc[C][NB][M];
  for (int c = 0; c < C; ++c)
    for (int i = 0; i < NB; ++i)
      for (int m = 0; m < M; ++m) acc[c][i][m] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    // Each row is contiguous: fetch ahead of its stream (PF: see gemv_avx2_span), into the next row near
    // its end (a prefetch changes no value, and never faults).
    for (int i = 0; i < NB; ++i) {
      const char* at = static_cast<const char*>(wp) + ((n + i) * K + k) * wsize + (PF == 2 ? 2048 : kGemvPfBytes);
      if constexpr (PF == 1) __builtin_prefetch(at, 0, 0);
      if constexpr (PF == 2) __builtin_prefetch(at, 0, 2);
      if constexpr (!WB) __builtin_prefetch(at + 32, 0, 0);
    }
    for (int h = 0; h < 2; ++h) {
      __m256 xv[M];
      for (int m = 0; m < M; ++m) xv[m] = load_x(m, k, h);
      for (int i = 0; i < NB; ++i) {
        const __m256 w = load_w(i, k, h);
        for (int m = 0; m < M; ++m) acc[h % C][i][m] = _mm256_fmadd_ps(xv[m], w, acc[h % C][i][m]);
      }
    }
  }
  for (int i = 0; i < NB; ++i)
    for (int m = 0; m < M; ++m) {
      float tail = 0.f;
      for (int64_t t = k; t < K; ++t) tail = std::fma(x_at(m, t), w_at(i, t), tail);
      __m256 s = acc[0][i][m];
      if constexpr (C == 2) s = _mm256_add_ps(s, acc[C - 1][i][m]);
      __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
      h = _mm_add_ps(h, _mm_movehl_ps(h, h));
      h = _mm_add_ss(h, _mm_movehdup_ps(h));
      sums[m * N + n + i] = _mm_cvtss_f32(h) + tail;
    }
}

// x_split for the AVX2 body of bf16 weights: per whole 16 k, x[k], x[k + 2], ..., x[k + 14], then x[k + 1],
// ..., x[k + 15]; the last K % 16 as they are. Rows K apart.
void x_split(const float* x, int64_t M, int64_t ldx, int64_t K, float* out) {
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * ldx;
    float* o = out + m * K;
    int64_t k = 0;
    for (; k + 16 <= K; k += 16)
      for (int j = 0; j < 8; ++j) {
        o[k + j] = xr[k + 2 * j];
        o[k + 8 + j] = xr[k + 2 * j + 1];
      }
    for (; k < K; ++k) o[k] = xr[k];
  }
}

// Rows side by side in the AVX2 body: as many as keep its accumulators (C·NB·M), M x vectors and a
// weight vector within the 16 ymm registers: F32 weights (C = 2) M = 1: 4, 2: 3, 3: 2, 4: 1; BF16
// weights (C = 1) M = 1: 8, 2: 6, 3: 4, 4: 2. The knob avx2_gemv_rows (MM3_AVX2_GEMV_ROWS) forces a
// count (capped at that).
constexpr int avx2_fit(int M, bool WB) {
  return WB ? (M <= 1 ? 8 : M == 2 ? 6 : M == 3 ? 4 : 2) : (M <= 1 ? 4 : M == 2 ? 3 : M == 3 ? 2 : 1);
}
int gemv_avx2_rows(int M, bool WB) {
  const int fit = avx2_fit(M, WB);
  const int forced = tuning::forced(tuning::Knob::Avx2GemvRows);
  return forced > 0 ? std::min(forced, fit) : fit;
}

// Rows [n, n1) in groups of the first NB of NBs that is at most `rows` and fits, then smaller ones.
template <int M, bool WB, bool XB, int PF, int NB, int... NBs>
__attribute__((target("avx2,fma"))) inline void avx2_groups(int rows, const void* x, int64_t ldx, const void* wp,
                                                            int64_t K, int64_t& n, int64_t n1, float* sums, int64_t N) {
  if constexpr (NB <= avx2_fit(M, WB))
    if (rows >= NB)
      for (; n + NB <= n1; n += NB) gemv_rows_avx2<M, NB, WB, XB, PF>(x, ldx, wp, K, n, sums, N);
  if constexpr (sizeof...(NBs) > 0) avx2_groups<M, WB, XB, PF, NBs...>(rows, x, ldx, wp, K, n, n1, sums, N);
}

template <int M, bool WB, bool XB>
__attribute__((target("avx2,fma"))) void gemv_avx2_span(const void* x, int64_t ldx, const void* wp, int64_t K,
                                                        int64_t n0, int64_t n1, float* sums, int64_t N) {
  int64_t n = n0;
  // The weights' prefetch (PF): 1 PREFETCHNTA kGemvPfBytes ahead (bba0fab: on Zen 3 it gained 20-30%
  // over none), unless the knob gemv_prefetch forces 0 (none) or 1 (PF 2: PREFETCHT1 2 KiB ahead, as the
  // AVX-512 body takes on Zen 4). On Zen 4 capped to AVX2 (thirty-fifth session, `--alternate
  // gemv_prefetch=-1,0,1`, ar_frame, 15 runs) none and T1 read 0.822 and 0.707 of NTA's time; but an
  // AVX2-only CPU is not a Zen 4, whose own path is AVX-512, so the default stays what was measured on one.
  const int f = tuning::forced(tuning::Knob::GemvPrefetch);
  if (!WB || f < 0)
    avx2_groups<M, WB, XB, 1, 8, 6, 4, 3, 2, 1>(gemv_avx2_rows(M, WB), x, ldx, wp, K, n, n1, sums, N);
  else if (f == 0)
    avx2_groups<M, WB, XB, 0, 8, 6, 4, 3, 2, 1>(gemv_avx2_rows(M, WB), x, ldx, wp, K, n, n1, sums, N);
  else
    avx2_groups<M, WB, XB, 2, 8, 6, 4, 3, 2, 1>(gemv_avx2_rows(M, WB), x, ldx, wp, K, n, n1, sums, N);
}

// F32 weights (bf16 weights take linear_gemv's prepared x: gemv_avx2_bf16).
template <int M, bool WB>
void gemv_avx2(const float* x, int64_t ldx, const void* wp, int64_t K, int64_t n0, int64_t n1, float* sums, int64_t N) {
  static_assert(!WB, "bf16 weights need x split (x_split) or as bf16: gemv_avx2_bf16");
  gemv_avx2_span<M, false, false>(x, ldx, wp, K, n0, n1, sums, N);
}

template <int M, bool WB>
void gemv_scalar(const float* x, int64_t ldx, const void* wp, int64_t K, int64_t n0, int64_t n1, float* sums,
                 int64_t N) {
  for (int64_t n = n0; n < n1; ++n) {
    for (int m = 0; m < M; ++m) {
      const float* xr = x + m * ldx;
      sums[m * N + n] = WB ? detail::dot_f32_bf16(xr, static_cast<const uint16_t*>(wp) + n * K, K)
                           : detail::dot_f32(xr, static_cast<const float*>(wp) + n * K, K);
    }
  }
}

using GemvFn = void (*)(const float*, int64_t, const void*, int64_t, int64_t, int64_t, float*, int64_t);

template <bool WB>
GemvFn pick_gemv(int M) {
  const bool a512 = cpu_has_avx512(), a2 = cpu_has_avx2_fma();
  switch (M) {
    case 1:
      return a512 ? gemv_avx512<1, WB> : a2 && !WB ? gemv_avx2<1, false> : gemv_scalar<1, WB>;
    case 2:
      return a512 ? gemv_avx512<2, WB> : a2 && !WB ? gemv_avx2<2, false> : gemv_scalar<2, WB>;
    case 3:
      return a512 ? gemv_avx512<3, WB> : a2 && !WB ? gemv_avx2<3, false> : gemv_scalar<3, WB>;
    default:
      return a512 ? gemv_avx512<4, WB> : a2 && !WB ? gemv_avx2<4, false> : gemv_scalar<4, WB>;
  }
}

// The AVX2 body of bf16 weights, on x prepared by linear_gemv: as bf16 (XB) or split (x_split).
bool gemv_avx2_bf16() { return !cpu_has_avx512() && cpu_has_avx2_fma(); }
using GemvPreparedFn = void (*)(const void*, int64_t, const void*, int64_t, int64_t, int64_t, float*, int64_t);
GemvPreparedFn pick_gemv_split512(int M) {
  switch (M) {
    case 1:
      return gemv_split512<1>;
    case 2:
      return gemv_split512<2>;
    case 3:
      return gemv_split512<3>;
    default:
      return gemv_split512<4>;
  }
}
template <bool XB>
GemvPreparedFn pick_gemv_avx2_bf16(int M) {
  switch (M) {
    case 1:
      return gemv_avx2_span<1, true, XB>;
    case 2:
      return gemv_avx2_span<2, true, XB>;
    case 3:
      return gemv_avx2_span<3, true, XB>;
    default:
      return gemv_avx2_span<4, true, XB>;
  }
}

using GemvBf16Fn = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, int64_t, int64_t, float*, int64_t);
GemvBf16Fn pick_gemv_bf16(int M) {
  switch (M) {
    case 1: return gemv_avx512bf16<1>;
    case 2: return gemv_avx512bf16<2>;
    case 3: return gemv_avx512bf16<3>;
    default: return gemv_avx512bf16<4>;
  }
}

constexpr int64_t kGemvMaxM = 4;

// y[m, n] = round(sums[m, n] + bias[n]) for n in [n0, n1).
void epilogue(const float* sums, int64_t M, int64_t N, const float* bias, float* y, int64_t ldy, int64_t n0,
              int64_t n1, DType store) {
  for (int64_t m = 0; m < M; ++m) {
    const float* s = sums + m * N;
    float* yr = y + m * ldy;
    for (int64_t n = n0; n < n1; ++n) yr[n] = round_store(bias ? s[n] + bias[n] : s[n], store);
  }
}

// The GEMV of several plain weights of one dtype and K sharing x (one entry: linear's own GEMV): one
// parallel pass over their concatenated output rows. Each output is computed exactly as for its
// weight alone (the row kernels take any row range), so grouping never changes a bit.
void linear_gemv(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const LinearOut* outs, int n,
                 DType store) {
  const LinearWeight& w0 = *outs[0].w;
  const int64_t K = w0.in_features();
  const bool wb = w0.weight().dtype() == DType::BF16;
  std::vector<int64_t> starts(size_t(n) + 1, 0);
  for (int i = 0; i < n; ++i) starts[size_t(i) + 1] = starts[size_t(i)] + outs[i].w->out_features();
  // Weight i's fp32 sums: M rows of its N_i outputs, from sums + M * starts[i].
  std::vector<float> sums(static_cast<size_t>(M * starts.back()));
  // Enough rows per chunk that a chunk streams at least ~64 KiB of weights.
  const int64_t min_rows = std::max<int64_t>(1, (64 * 1024) / std::max<int64_t>(1, K * (wb ? 2 : 4)));
  auto segment = [&](size_t i, int64_t n0, int64_t n1, auto&& rows) {
    const LinearWeight& w = *outs[i].w;
    const int64_t N = w.out_features();
    float* s = sums.data() + M * starts[i];
    rows(w.weight().raw(), n0, n1, s, N);
    epilogue(s, M, N, w.bias_f32(), outs[i].y, outs[i].ldy, n0, n1, store);
  };

  if (wb && store == DType::BF16 && cpu_has_avx512bf16()) {
    // bf16 computation: x is bf16-valued by convention, so its bf16 copy is exact.
    const int64_t Kp = (K + 1) & ~int64_t(1);
    aligned_vector<uint16_t> xb(static_cast<size_t>(M * Kp), 0);  // on a cache line (core/aligned.h)
    for (int64_t m = 0; m < M; ++m) f32_to_bf16(x + m * ldx, xb.data() + m * Kp, static_cast<size_t>(K));
    GemvBf16Fn fn = pick_gemv_bf16(static_cast<int>(M));
    auto rows = [&](const void* wp, int64_t n0, int64_t n1, float* s, int64_t N) {
      fn(xb.data(), Kp, static_cast<const uint16_t*>(wp), K, n0, n1, s, N);
    };
    pool.parallel_for(
        starts.back(),
        [&](int64_t b, int64_t e) {
          detail::for_segments(starts, b, e, [&](size_t i, int64_t n0, int64_t n1) { segment(i, n0, n1, rows); });
        },
        min_rows);
    return;
  }
  // Bf16 weights where the CPU has no AVX512-BF16: a bf16 computation reads x from its bf16 copy where
  // that copy is exact (x is bf16-valued by convention; checked, so a caller that breaks it still gets
  // the fp32 x's sums). AVX-512: gemv_split512 on the copy, else gemv_avx512 on x. AVX2: the AVX2 body
  // on the copy (unless the knob avx2_gemv_xb, MM3_AVX2_GEMV_XB=0, turns it off), else on x_split's
  // copy (the same values in the same lanes: the same bits).
  aligned_vector<uint16_t> xb;
  aligned_vector<float> xs;
  GemvPreparedFn prepared = nullptr;
  auto exact_bf16_copy = [&] {
    xb.resize(static_cast<size_t>(M * K));
    for (int64_t m = 0; m < M; ++m) {
      f32_to_bf16(x + m * ldx, xb.data() + m * K, static_cast<size_t>(K));
      for (int64_t k = 0; k < K; ++k)
        if (bf16_bits_to_f32(xb[size_t(m * K + k)]) != x[m * ldx + k]) return false;
    }
    return true;
  };
  if (wb && store == DType::BF16 && cpu_has_avx512() && !cpu_has_avx512bf16() && exact_bf16_copy())
    prepared = pick_gemv_split512(static_cast<int>(M));
  if (wb && gemv_avx2_bf16()) {
    if (store == DType::BF16 && tuning::forced(tuning::Knob::Avx2GemvXb) != 0 && exact_bf16_copy())
      prepared = pick_gemv_avx2_bf16<true>(static_cast<int>(M));
    if (!prepared) {
      xs.resize(static_cast<size_t>(M * K));
      x_split(x, M, ldx, K, xs.data());
      prepared = pick_gemv_avx2_bf16<false>(static_cast<int>(M));
    }
  }
  const void* px = xs.empty() ? static_cast<const void*>(xb.data()) : xs.data();
  GemvFn fn = wb ? pick_gemv<true>(static_cast<int>(M)) : pick_gemv<false>(static_cast<int>(M));
  auto rows = [&](const void* wp, int64_t n0, int64_t n1, float* s, int64_t N) {
    if (prepared)
      prepared(px, K, wp, K, n0, n1, s, N);
    else
      fn(x, ldx, wp, K, n0, n1, s, N);
  };
  pool.parallel_for(
      starts.back(),
      [&](int64_t b, int64_t e) {
        detail::for_segments(starts, b, e, [&](size_t i, int64_t n0, int64_t n1) { segment(i, n0, n1, rows); });
      },
      min_rows);
}

// The decode GEMV of several strip-form weights of one K sharing x (strips.h; one entry: linear's own):
// one parallel pass over their concatenated strips. An output's operations do not depend on the
// chunking or the grouping, so neither changes a bit.
struct Bf16StripsForm {
  Tensor data;  // uint16 bits, strips_size(N, K) of them
};
const uint16_t* strips_of(const LinearWeight& w) {
  return static_cast<const uint16_t*>(static_cast<const Bf16StripsForm*>(w.gemm_form())->data.raw());
}

void strips_gemv(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const LinearOut* outs, int n,
                 DType store) {
  const int64_t K = outs[0].w->in_features(), Kp = 2 * detail::strips_pairs(K);
  std::vector<int64_t> starts(size_t(n) + 1, 0), rows(size_t(n) + 1, 0);  // in strips, in rows
  for (int i = 0; i < n; ++i) {
    starts[size_t(i) + 1] = starts[size_t(i)] + detail::strips_count(outs[i].w->out_features());
    rows[size_t(i) + 1] = rows[size_t(i)] + outs[i].w->out_features();
  }
  std::vector<float> sums(static_cast<size_t>(M * rows.back()));
  const bool bf16 = store == DType::BF16;
  MM3_CHECK(bf16 ? cpu_has_avx512bf16() : cpu_has_avx512(), "linear: a strip-form weight on a CPU without {}",
            bf16 ? "AVX512-BF16" : "AVX-512");
  aligned_vector<uint32_t> xq;  // x as bf16 pairs in the form's pair order (strips.h)
  aligned_vector<float> xs;     // xq split into fp32 halves, where the pairs run as FMAs
  bool pf = false;
  if (bf16) {  // bf16 computation: x is bf16-valued by convention, so its bf16 copy is exact
    aligned_vector<uint16_t> xb(static_cast<size_t>(M * Kp), 0);
    for (int64_t m = 0; m < M; ++m) f32_to_bf16(x + m * ldx, xb.data() + m * Kp, static_cast<size_t>(K));
    xq.resize(static_cast<size_t>(M * Kp / 2));
    detail::strips_order_x(xb.data(), Kp, M, xq.data());
    if (detail::bf16_dot_fma()) {
      const int forced = tuning::forced(tuning::Knob::GemvPrefetch);
      pf = forced != 0;  // T1 prefetches unless the knob turns them off (measured: bf16_dot_fma)
      xs.resize(static_cast<size_t>(M * Kp));
      detail::strips_split_x(xq.data(), M, Kp / 2, xs.data());
    }
  }
  // Enough strips per chunk that a chunk streams at least ~64 KiB of weights.
  const int64_t min_strips = std::max<int64_t>(1, (64 * 1024) / (detail::kStripRows * Kp * 2));
  pool.parallel_for(
      starts.back(),
      [&](int64_t b, int64_t e) {
        detail::for_segments(starts, b, e, [&](size_t i, int64_t g0, int64_t g1) {
          const LinearWeight& w = *outs[i].w;
          const int64_t N = w.out_features();
          float* s = sums.data() + M * rows[i];
          if (bf16 && !xs.empty())
            detail::strips_gemv_bf16fma(xs.data(), M, strips_of(w), N, K, g0, g1, s, pf);
          else if (bf16)
            detail::strips_gemv_bf16(xq.data(), M, strips_of(w), N, K, g0, g1, s);
          else
            detail::strips_gemv_f32(x, ldx, M, strips_of(w), N, K, g0, g1, s);
          epilogue(s, M, N, w.bias_f32(), outs[i].y, outs[i].ldy, g0 * detail::kStripRows,
                   std::min(N, g1 * detail::kStripRows), store);
        });
      },
      min_strips);
}

void linear_gemm(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const LinearWeight& w, float* y,
                 int64_t ldy, DType store) {
  const int64_t N = w.out_features(), K = w.in_features();
  const DType wdt = w.weight().dtype();
  // bf16 dot products exactly when the GEMV would use them: a bf16 computation with bf16 weights.
  detail::gemm_nt(pool, x, ldx, M, w.weight().raw(), wdt, K, N, K, w.bias_f32(), y, ldy, store,
                  wdt == DType::BF16 && store == DType::BF16);
}

}  // namespace

namespace {
// gemm_only_f32's form: the packed panels (detail::pack_f32_panels), in huge-page memory.
struct F32Panels {
  Tensor data;
};
}  // namespace

LinearWeight gemm_only_f32(const LinearWeight& w, const ThreadPool& pool, bool onednn) {
  MM3_CHECK(!w.quantized() && !w.gemm_form() && w.weight().ndim() == 2 && w.weight().dtype() == DType::F32,
            "gemm_only_f32: needs a plain F32 weight");
  const int64_t N = w.out_features(), K = w.in_features();
  const Tensor plain = w.weight().contiguous();
  const Tensor bias = w.has_bias() ? w.bias() : Tensor();
  if (onednn) {
    size_t bytes = 0;
    if (auto form = detail::dnnl_pack_f32(plain, w.has_bias(), bytes))
      return LinearWeight(N, K, std::move(form), bytes, bias, GemmKind::F32Dnnl);
  }
  auto f = std::make_shared<F32Panels>();
  f->data = Tensor::empty(DType::F32, {detail::pack_f32_panels_size(N, K)});
  detail::pack_f32_panels(pool, static_cast<const float*>(plain.raw()), K, N, K, static_cast<float*>(f->data.raw()));
  const size_t bytes = f->data.nbytes();
  return LinearWeight(N, K, std::move(f), bytes, bias, GemmKind::F32Panels);
}

bool bf16_strips_offered() { return cpu_has_avx512bf16(); }

LinearWeight bf16_strips(const uint16_t* w, int64_t ldw, int64_t N, int64_t K, const ThreadPool* pool, Tensor bias) {
  MM3_CHECK(N > 0 && K > 0 && ldw >= K, "bf16_strips: weight [{}, {}] with rows {} apart", N, K, ldw);
  MM3_CHECK(bf16_strips_offered(), "bf16_strips: this CPU has no AVX512-BF16 for the form's GEMV");
  auto f = std::make_shared<Bf16StripsForm>();
  f->data = Tensor::empty(DType::BF16, {detail::strips_size(N, K)});
  auto* form = static_cast<uint16_t*>(f->data.raw());
  const int64_t G = detail::strips_count(N);
  auto part = [&](int64_t g0, int64_t g1) { detail::strips_pack_part(w, ldw, N, K, g0, g1, form); };
  if (pool)
    pool->parallel_for(G, part, 1);
  else
    part(0, G);
  const size_t bytes = f->data.nbytes();
  return LinearWeight(N, K, std::move(f), bytes, std::move(bias), GemmKind::Bf16Strips);
}

void linear(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const LinearWeight& w, float* y,
            int64_t ldy, DType store) {
  const int64_t N = w.out_features(), K = w.in_features();
  MM3_CHECK(N > 0 && K > 0, "linear: empty weight [{}, {}]", N, K);
  MM3_CHECK(M >= 0 && ldx >= K && ldy >= N, "linear: M={} ldx={} ldy={} for weight [{}, {}]", M, ldx, ldy, N, K);
  if (M == 0) return;
  if (w.gemm_packed()) {  // gemm_only_bf16: oneDNN for every M (gemm_dnnl.cpp)
    MM3_CHECK(store == DType::BF16, "linear: a gemm_only_bf16 weight [{}, {}] needs store BF16, not {}", N, K,
              dtype_name(store));
    detail::dnnl_linear_bf16(pool, x, M, ldx, w.gemm_form(), w.bias_f32(), y, ldy);
    return;
  }
  if (w.gemm_kind() == GemmKind::I8) {  // gemm_only_i8: W8A8 (gemm_i8.cpp)
    detail::i8_linear(pool, x, M, ldx, w, y, ldy, store);
    return;
  }
  if (w.gemm_kind() == GemmKind::F32Strassen) {  // gemm_strassen_f32: 7 GEMMs on its forms (gemm_strassen.cpp)
    detail::strassen_linear(pool, x, M, ldx, w, y, ldy, store);
    return;
  }
  if (w.gemm_kind() == GemmKind::F32Dnnl) {  // gemm_only_f32, oneDNN's form: oneDNN for every M
    detail::dnnl_linear_f32(pool, x, M, ldx, w.gemm_form(), w.bias_f32(), y, ldy, store);
    return;
  }
  if (w.gemm_kind() == GemmKind::Bf16Strips) {  // bf16_strips: the plain weight's bits in a bf16 run (strips.h)
    if (M <= kGemvMaxM) {
      const LinearOut one{&w, y, ldy};
      strips_gemv(pool, x, M, ldx, &one, 1, store);
    } else {
      detail::gemm_ex(pool, x, ldx, 1, M, strips_of(w), DType::BF16, K, false, N, K, w.bias_f32(), y, ldy, store,
                      store == DType::BF16, nullptr, /*b_strips=*/true);
    }
    return;
  }
  if (w.f32_packed()) {  // gemm_only_f32: the GEMM on its panels for every M
    const auto* f = static_cast<const F32Panels*>(w.gemm_form());
    detail::gemm_ex(pool, x, ldx, 1, M, nullptr, DType::F32, K, false, N, K, w.bias_f32(), y, ldy, store, false,
                    static_cast<const float*>(f->data.raw()));
    return;
  }
  if (w.quantized()) {  // kernels/quant.h
    if (M <= kGemvMaxM)
      detail::quant_gemv(pool, x, M, ldx, *w.quant(), w.bias_f32(), y, ldy, store);
    else
      detail::quant_gemm(pool, x, M, ldx, *w.quant(), w.bias_f32(), y, ldy, store);
    return;
  }
  if (M <= kGemvMaxM) {
    const LinearOut one{&w, y, ldy};
    linear_gemv(pool, x, M, ldx, &one, 1, store);
  } else {
    linear_gemm(pool, x, M, ldx, w, y, ldy, store);
  }
}

void linear_glu(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const LinearWeight& w, float* act,
                int64_t ldact, DType store) {
  const int64_t N = w.out_features(), F = N / 2, K = w.in_features();
  MM3_CHECK(N > 0 && N % 2 == 0 && K > 0, "linear_glu: weight [{}, {}] needs an even, nonzero output count", N, K);
  MM3_CHECK(M >= 0 && ldx >= K && ldact >= F, "linear_glu: M={} ldx={} ldact={} for weight [{}, {}]", M, ldx, ldact, N,
            K);
  if (M == 0) return;
  if (w.gemm_kind() == GemmKind::I8) {
    detail::i8_linear(pool, x, M, ldx, w, act, ldact, store, detail::I8Sink::Glu);
    return;
  }
  thread_local aligned_vector<float> y;
  if (y.size() < static_cast<size_t>(M * N)) y.resize(static_cast<size_t>(M * N));
  float* const yp = y.data();
  linear(pool, x, M, ldx, w, yp, N, store);
  pool.parallel_for(M, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) silu_mul(/*gate=*/yp + m * N + F, /*up=*/yp + m * N, act + m * ldact, F, store);
  });
}

void linear_add(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const LinearWeight& w, float* y,
                int64_t ldy, DType store) {
  const int64_t N = w.out_features(), K = w.in_features();
  MM3_CHECK(N > 0 && K > 0, "linear_add: empty weight [{}, {}]", N, K);
  MM3_CHECK(M >= 0 && ldx >= K && ldy >= N, "linear_add: M={} ldx={} ldy={} for weight [{}, {}]", M, ldx, ldy, N, K);
  if (M == 0) return;
  if (w.gemm_kind() == GemmKind::I8) {
    detail::i8_linear(pool, x, M, ldx, w, y, ldy, store, detail::I8Sink::Add);
    return;
  }
  thread_local aligned_vector<float> t;
  if (t.size() < static_cast<size_t>(M * N)) t.resize(static_cast<size_t>(M * N));
  float* const tp = t.data();
  linear(pool, x, M, ldx, w, tp, N, store);
  pool.parallel_for(M, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) add(y + m * ldy, tp + m * N, y + m * ldy, N, store);
  });
}

void ff_glu_add(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const LinearWeight& w_in,
                const LinearWeight& w_out, float* y, int64_t ldy, DType store) {
  const int64_t F = w_in.out_features() / 2, K = w_in.in_features(), D = w_out.out_features();
  MM3_CHECK(F > 0 && w_in.out_features() % 2 == 0 && K > 0 && D > 0 && w_out.in_features() == F,
            "ff_glu_add: weights [{}, {}] and [{}, {}] do not make a gated FF", w_in.out_features(), K, D,
            w_out.in_features());
  MM3_CHECK(M >= 0 && ldx >= K && ldy >= D, "ff_glu_add: M={} ldx={} ldy={} for weights [{}, {}], [{}, {}]", M, ldx,
            ldy, 2 * F, K, D, F);
  if (M == 0) return;
  if (w_in.gemm_kind() == GemmKind::I8 && w_out.gemm_kind() == GemmKind::I8) {
    detail::i8_ff_glu_add(pool, x, M, ldx, w_in, w_out, y, ldy, store);
    return;
  }
  thread_local aligned_vector<float> act;
  if (act.size() < static_cast<size_t>(M * F)) act.resize(static_cast<size_t>(M * F));
  linear_glu(pool, x, M, ldx, w_in, act.data(), F, store);
  linear_add(pool, act.data(), M, F, w_out, y, ldy, store);
}

void linear_bf16_in(const ThreadPool& pool, const uint16_t* x, int64_t M, int64_t ldx, const LinearWeight& w, float* y,
                    int64_t ldy, bool round_y) {
  const int64_t N = w.out_features(), K = w.in_features();
  MM3_CHECK(N > 0 && K > 0, "linear_bf16_in: empty weight [{}, {}]", N, K);
  MM3_CHECK(M >= 0 && ldx >= K && ldy >= N, "linear_bf16_in: M={} ldx={} ldy={} for weight [{}, {}]", M, ldx, ldy, N,
            K);
  if (M == 0) return;
  if (w.gemm_packed()) {
    detail::dnnl_linear_bf16_in(pool, x, M, ldx, w.gemm_form(), w.bias_f32(), y, ldy, round_y);
    return;
  }
  // Every other form reads float rows: widen (exact), then linear() as usual.
  thread_local aligned_vector<float> xf;
  if (xf.size() < static_cast<size_t>(M * K)) xf.resize(static_cast<size_t>(M * K));
  float* const xp = xf.data();
  pool.parallel_for(M, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) bf16_to_f32(x + m * ldx, xp + m * K, static_cast<size_t>(K));
  });
  linear(pool, xp, M, K, w, y, ldy, DType::BF16);
}

void linear_multi(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, std::span<const LinearOut> outs,
                  DType store) {
  if (outs.empty() || M == 0) return;
  const LinearWeight& w0 = *outs[0].w;
  // One pass where every weight takes the same GEMV: all quantized (any mix of int8 / q4), all in the
  // strip form, or all plain of one dtype; otherwise (M > 4, another GEMM form, a mix) linear() on each.
  bool group = M <= kGemvMaxM && outs.size() > 1;
  bool strips = group;
  for (const LinearOut& o : outs) {
    const LinearWeight& w = *o.w;
    MM3_CHECK(w.out_features() > 0 && w.in_features() == w0.in_features(),
              "linear_multi: weight [{}, {}] beside in_features {}", w.out_features(), w.in_features(),
              w0.in_features());
    MM3_CHECK(M >= 0 && ldx >= w.in_features() && o.ldy >= w.out_features(),
              "linear_multi: M={} ldx={} ldy={} for weight [{}, {}]", M, ldx, o.ldy, w.out_features(), w.in_features());
    group = group && !w.gemm_form() && w.quantized() == w0.quantized() &&
            (w.quantized() || w.weight().dtype() == w0.weight().dtype());
    strips = strips && w.gemm_kind() == GemmKind::Bf16Strips;
  }
  if (strips) {
    strips_gemv(pool, x, M, ldx, outs.data(), static_cast<int>(outs.size()), store);
    return;
  }
  if (!group) {
    for (const LinearOut& o : outs) linear(pool, x, M, ldx, *o.w, o.y, o.ldy, store);
    return;
  }
  if (w0.quantized()) {
    std::vector<detail::QuantOut> q;
    for (const LinearOut& o : outs) q.push_back({o.w->quant(), o.w->bias_f32(), o.y, o.ldy});
    detail::quant_gemv_multi(pool, x, M, ldx, q.data(), static_cast<int>(q.size()), store);
    return;
  }
  linear_gemv(pool, x, M, ldx, outs.data(), static_cast<int>(outs.size()), store);
}

void gemm_f32(const ThreadPool& pool, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
              const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  MM3_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm_f32: negative size M={} N={} K={}", M, N, K);
  MM3_CHECK(lda >= std::max<int64_t>(1, trans_a ? M : K) && ldb >= std::max<int64_t>(1, trans_b ? K : N) &&
                ldc >= std::max<int64_t>(1, N),
            "gemm_f32: bad leading dims lda={} ldb={} ldc={} for M={} N={} K={}", lda, ldb, ldc, M, N, K);
  if (M == 0 || N == 0) return;
  blas_threads(pool);
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(M), static_cast<blasint>(N), static_cast<blasint>(K), alpha, A,
              static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta, C, static_cast<blasint>(ldc));
}

}  // namespace mm3::kern
