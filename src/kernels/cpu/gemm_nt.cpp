// gemm_nt.cpp — blocked GEMM C = A · Bᵀ for kern::linear (see gemm_nt.h for why it exists).
//
// Goto-style blocking: B is packed per (panel of NC columns) x (block of KC k's) into 32-column
// strips, A is read in place, and an MR x 32 register tile accumulates. The partial sums go back to C
// between K blocks and are reloaded, which keeps each element a single sequential FMA chain.
// Work is split statically into (column panel, row chunk) tasks, each packing its own panel.
#pragma GCC optimize("fp-contract=off")

#include "kernels/cpu/gemm_nt.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/aligned.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/strips.h"

namespace mm3::kern::detail {

namespace {

constexpr int kMR = 8;     // rows per register tile (AVX-512 and portable tiles)
constexpr int kMR2 = 6;    // rows per AVX2 tile: two 6 x 16 passes over a 32-column strip
constexpr int kNR = 32;    // columns per register tile (two zmm)
// k per packed block (even: bf16 pairs never straddle blocks). It was 256 until the thirty-seventh
// session: on Zen 4 (AVX512-BF16), binaries alternating, prefill_512 (the bf16 tile) 35.4 / 36.4 / 40.2 s
// at 1024 against 39.2 / 38.4 s at 256 (512: 37.5, 2048: 36.9; one run each, this host's noise ~8%), and
// gemm_bf16_689x2048x8192 310 -> 358 GFLOP/s (medians of 5 alternating sets): a fourth of the partial
// sums' round trips through C. The fp32 AVX-512 tile's gemm_f32_689x2048x8192 193 / 180 / 186 -> 199 /
// 194 / 198 GFLOP/s.
constexpr int kKC = 1024;
// The AVX2 tiles' block: a 32-column strip of it is 32 KiB. It was 128 (16 KiB, to stay in a 32 KiB L1)
// until the thirty-seventh session: on Zen 4 capped to AVX2 (x86-64-v3 build, MM3_ISA=avx2), binaries
// alternating x3, gemm_f32_689x2048x8192 read 173-185 GFLOP/s at 256 and 512 against 155-179 at 128 and
// 139-170 at 64 (half the partial-sum round trips through C); prefill_512 85.4 / 90.3 s against 92.1 /
// 88.8 s (within this host's noise).
constexpr int kKC2 = 256;
constexpr int kNC = 128;  // columns per packed panel (4 strips; 512 KiB of f32 at KC = 1024)
static_assert(kNR == kStripRows && kNC % kStripRows == 0, "strips.h's strips are the tiles' 32-column strips");

struct TileArgs {
  int64_t kc;           // k's in this block
  float* C;             // tile origin in C
  int64_t ldc;
  int nr;               // valid columns (<= 32; <= 64 for the 64-column bf16 tile)
  bool first, last;     // first / last K block
  const float* bias;    // bias for the tile's columns, or null
  DType store;
};

// ---- fp32 FMA tile, AVX-512 ----
// Every loop over a tile's rows carries #pragma GCC unroll: GCC 12 otherwise kept the accumulator arrays
// on the stack around the k loop (~8% of the tile's samples in attention's Q·K^T, twenty-fourth session).

__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) inline __m512 round_bf16_512(__m512 v) {
  __m512i u = _mm512_castps_si512(v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  r = _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
  __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_blend_ps(nan, _mm512_castsi512_ps(r), _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000)));
}

template <int R>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) inline void tile_store_512(__m512 (&c0)[R],
                                                                                         __m512 (&c1)[R],
                                                                                         const TileArgs& t) {
  const int n0 = std::min(t.nr, 16), n1 = std::max(t.nr - 16, 0);
  const __mmask16 m0 = n0 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n0) - 1u);
  const __mmask16 m1 = n1 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n1) - 1u);
  if (t.last) {
    if (t.bias) {
      const __m512 b0 = _mm512_maskz_loadu_ps(m0, t.bias), b1 = _mm512_maskz_loadu_ps(m1, t.bias + 16);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) c0[r] = _mm512_add_ps(c0[r], b0), c1[r] = _mm512_add_ps(c1[r], b1);
    }
    if (t.store == DType::BF16)
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) c0[r] = round_bf16_512(c0[r]), c1[r] = round_bf16_512(c1[r]);
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(t.C + r * t.ldc, m0, c0[r]);
    _mm512_mask_storeu_ps(t.C + r * t.ldc + 16, m1, c1[r]);
  }
}

template <int R>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) void tile_f32_avx512(const float* A, int64_t a_rs,
                                                                                   int64_t a_cs, const float* Bp,
                                                                                   const TileArgs& t) {
  __m512 c0[R], c1[R];
  if (t.first) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) c0[r] = c1[r] = _mm512_setzero_ps();
  } else {
    const int n0 = std::min(t.nr, 16), n1 = std::max(t.nr - 16, 0);
    const __mmask16 m0 = n0 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n0) - 1u);
    const __mmask16 m1 = n1 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n1) - 1u);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      c0[r] = _mm512_maskz_loadu_ps(m0, t.C + r * t.ldc);
      c1[r] = _mm512_maskz_loadu_ps(m1, t.C + r * t.ldc + 16);
    }
  }
  for (int64_t k = 0; k < t.kc; ++k) {
    const __m512 b0 = _mm512_loadu_ps(Bp + k * kNR), b1 = _mm512_loadu_ps(Bp + k * kNR + 16);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(A[r * a_rs + k * a_cs]);
      c0[r] = _mm512_fmadd_ps(a, b0, c0[r]);
      c1[r] = _mm512_fmadd_ps(a, b1, c1[r]);
    }
  }
  tile_store_512<R>(c0, c1, t);
}

// ---- bf16 pair-dot tile, AVX512-BF16. A16 rows are bf16 bits (zero-padded to even K). ----

template <int R>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16"))) void tile_bf16_avx512(const uint16_t* A16,
                                                                                               int64_t lda16,
                                                                                               const uint16_t* Bp,
                                                                                               const TileArgs& t) {
  __m512 c0[R], c1[R];
  if (t.first) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) c0[r] = c1[r] = _mm512_setzero_ps();
  } else {
    const int n0 = std::min(t.nr, 16), n1 = std::max(t.nr - 16, 0);
    const __mmask16 m0 = n0 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n0) - 1u);
    const __mmask16 m1 = n1 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n1) - 1u);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      c0[r] = _mm512_maskz_loadu_ps(m0, t.C + r * t.ldc);
      c1[r] = _mm512_maskz_loadu_ps(m1, t.C + r * t.ldc + 16);
    }
  }
  const int64_t kp = (t.kc + 1) / 2;
  for (int64_t p = 0; p < kp; ++p) {
    const __m512i b0 = _mm512_loadu_si512(Bp + p * 2 * kNR), b1 = _mm512_loadu_si512(Bp + p * 2 * kNR + kNR);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      uint32_t pair;
      std::memcpy(&pair, A16 + r * lda16 + 2 * p, 4);
      const __m512i a = _mm512_set1_epi32(static_cast<int>(pair));
      c0[r] = _mm512_dpbf16_ps(c0[r], (__m512bh)a, (__m512bh)b0);
      c1[r] = _mm512_dpbf16_ps(c1[r], (__m512bh)a, (__m512bh)b1);
    }
  }
  tile_store_512<R>(c0, c1, t);
}

// ---- the bf16 pair-dot tile's bits on fp32 FMAs, AVX-512 (for CPUs where VDPBF16PS is slow) ----
// VDPBF16PS adds a pair's two exact products one at a time, the pair word's high half (the odd k) first,
// each addition rounded to nearest even, denormals read as zero and flushed (strips.cpp
// gemv_bf16fma_g). So per k pair: the high halves' FMA, then the low halves', under MXCSR's DAZ and FTZ,
// set for the tile and restored. As holds A's rows as fp32 with each pair's halves swapped (As[2p] the
// bf16 value of k = 2p + 1, As[2p + 1] that of k = 2p), so each FMA takes its row's value as a
// broadcast operand from memory; B's pair words are widened by one AND (high halves) and one shift (low).
template <int R>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) void tile_bf16fma_avx512(const float* As, int64_t ldas,
                                                                                       const uint16_t* Bp,
                                                                                       const TileArgs& t) {
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(csr | 0x8040u);  // FTZ (bit 15) and DAZ (bit 6)
  __m512 c0[R], c1[R];
  if (t.first) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) c0[r] = c1[r] = _mm512_setzero_ps();
  } else {
    const int n0 = std::min(t.nr, 16), n1 = std::max(t.nr - 16, 0);
    const __mmask16 m0 = n0 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n0) - 1u);
    const __mmask16 m1 = n1 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n1) - 1u);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      c0[r] = _mm512_maskz_loadu_ps(m0, t.C + r * t.ldc);
      c1[r] = _mm512_maskz_loadu_ps(m1, t.C + r * t.ldc + 16);
    }
  }
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  const int64_t kp = (t.kc + 1) / 2;
  for (int64_t p = 0; p < kp; ++p) {
    const __m512i b0 = _mm512_loadu_si512(Bp + p * 2 * kNR), b1 = _mm512_loadu_si512(Bp + p * 2 * kNR + kNR);
    const __m512 o0 = _mm512_castsi512_ps(_mm512_and_si512(b0, hi)), o1 = _mm512_castsi512_ps(_mm512_and_si512(b1, hi));
    const __m512 e0 = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, b0, 16)),
                 e1 = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, b1, 16));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 ao = _mm512_set1_ps(As[r * ldas + 2 * p]);
      c0[r] = _mm512_fmadd_ps(ao, o0, c0[r]);
      c1[r] = _mm512_fmadd_ps(ao, o1, c1[r]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 ae = _mm512_set1_ps(As[r * ldas + 2 * p + 1]);
      c0[r] = _mm512_fmadd_ps(ae, e0, c0[r]);
      c1[r] = _mm512_fmadd_ps(ae, e1, c1[r]);
    }
  }
  _mm_setcsr(csr);
  tile_store_512<R>(c0, c1, t);
}

// ---- bf16 pair-dot tile of 6 rows x 64 columns (two adjacent 32-column strips), AVX512-BF16 ----
// gemm_bf16_packed_serial's tile (the DiT attention's Q·K^T and P·V). Per k pair: four 64-byte loads of
// the two strips, a dword broadcast of each row's pair, 24 VDPBF16PS into 24 accumulators: 10 loads per
// 24 pair dots where the 8 x 32 tile takes 10 per 16. Each output is the same chain over the k pairs as
// in tile_bf16_avx512, so the same bits. One core, Zen 5, 128 rows (scratch, best of 300): Q·K^T
// (N 690, K 64) 30.8 -> 26.8 us (366 -> 421 GFLOP/s), P·V (N 64, K 512) 19.5 -> 18.8 us, K 178
// 7.1 -> 6.6 us. Bp1 is the second strip (Bp0 again where there is none: its columns are masked off).
template <int R>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16"))) void tile_bf16_w64_avx512(
    const uint16_t* A16, int64_t lda16, const uint16_t* Bp0, const uint16_t* Bp1, const TileArgs& t) {
  __mmask16 mk[4];
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const int n = std::clamp(t.nr - 16 * j, 0, 16);
    mk[j] = n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1u);
  }
  __m512 c[4][R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j)
      c[j][r] = t.first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mk[j], t.C + r * t.ldc + 16 * j);
  const int64_t kp = (t.kc + 1) / 2;
  for (int64_t p = 0; p < kp; ++p) {
    const __m512i b0 = _mm512_loadu_si512(Bp0 + p * 2 * kNR), b1 = _mm512_loadu_si512(Bp0 + p * 2 * kNR + kNR);
    const __m512i b2 = _mm512_loadu_si512(Bp1 + p * 2 * kNR), b3 = _mm512_loadu_si512(Bp1 + p * 2 * kNR + kNR);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      uint32_t pair;
      std::memcpy(&pair, A16 + r * lda16 + 2 * p, 4);
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
      c[0][r] = _mm512_dpbf16_ps(c[0][r], a, (__m512bh)b0);
      c[1][r] = _mm512_dpbf16_ps(c[1][r], a, (__m512bh)b1);
      c[2][r] = _mm512_dpbf16_ps(c[2][r], a, (__m512bh)b2);
      c[3][r] = _mm512_dpbf16_ps(c[3][r], a, (__m512bh)b3);
    }
  }
  if (t.last) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m512 bv = t.bias ? _mm512_maskz_loadu_ps(mk[j], t.bias + 16 * j) : _mm512_setzero_ps();
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        if (t.bias) c[j][r] = _mm512_add_ps(c[j][r], bv);
        if (t.store == DType::BF16) c[j][r] = round_bf16_512(c[j][r]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) _mm512_mask_storeu_ps(t.C + r * t.ldc + 16 * j, mk[j], c[j][r]);
}

// ---- portable fp32 tile: the same FMA chain as the AVX-512 one, so the same bits ----

template <int R>
void tile_f32_generic(const float* A, int64_t a_rs, int64_t a_cs, const float* Bp, const TileArgs& t) {
  float c[R][kNR];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < kNR; ++j) c[r][j] = (t.first || j >= t.nr) ? 0.f : t.C[r * t.ldc + j];
  for (int64_t k = 0; k < t.kc; ++k)
    for (int r = 0; r < R; ++r) {
      const float a = A[r * a_rs + k * a_cs];
      for (int j = 0; j < kNR; ++j) c[r][j] = std::fma(a, Bp[k * kNR + j], c[r][j]);
    }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < t.nr; ++j) {
      float v = c[r][j];
      if (t.last) {
        if (t.bias) v = v + t.bias[j];
        v = round_store(v, t.store);
      }
      t.C[r * t.ldc + j] = v;
    }
}

// ---- fp32 FMA tile, AVX2 (CPUs without AVX-512) ----
// 16 ymm registers do not hold an 8 x 32 tile. The AVX2 tile is 6 rows, walked as two 6 x 16 passes
// (12 accumulators: enough independent FMA chains for 2 FMA pipes of latency 4-5), the shape of the
// classic AVX2 kernels. Its A is always a packed panel, A[k * 6 + r] (see gemm_ex). Each output is
// still the same single sequential FMA chain over k, so the bits equal the other tiles'.
// (The earlier 8-row tile, 2 x (6 x 16) + one 2 x 32 pass, ran ~63 GFLOP/s per core on L1-resident
// data vs ~85 for 6 x 16 alone on Zen 3: the 2 x 32 pass has only 8 chains and 6 loads per 8 FMAs.)

#define MM3_GEMM_AVX2 __attribute__((target("avx2,fma")))

// Lane mask of the first n (clamped to 0..8) of 8 floats, for VMASKMOVPS.
MM3_GEMM_AVX2 inline __m256i lanes8(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Bias, rounding (last K block) and the masked store of RS rows of one 8-column vector at C (tile
// column c, nv valid columns from there).
template <int RS>
MM3_GEMM_AVX2 inline __attribute__((always_inline)) void finish_cols_avx2(__m256 (&x)[RS], float* C, const TileArgs& t,
                                                                          int c, int nv) {
  const __m256i msk = lanes8(nv);
  if (t.last) {
    if (t.bias) {
      const __m256 bb = _mm256_maskload_ps(t.bias + c, msk);
#pragma GCC unroll 8
      for (int r = 0; r < RS; ++r) x[r] = _mm256_add_ps(x[r], bb);
    }
    if (t.store == DType::BF16) {
#pragma GCC unroll 8
      for (int r = 0; r < RS; ++r) x[r] = round_bf16_v8(x[r]);
    }
  }
  if (nv >= 8) {  // VMASKMOVPS stores are microcoded on AMD (~10x a plain store): only for a tail
#pragma GCC unroll 8
    for (int r = 0; r < RS; ++r) _mm256_storeu_ps(C + r * t.ldc, x[r]);
  } else {
#pragma GCC unroll 8
    for (int r = 0; r < RS; ++r) _mm256_maskstore_ps(C + r * t.ldc, msk, x[r]);
  }
}

// The partial sums of RS rows of one 8-column vector at C (nv valid columns), as finish_cols_avx2
// stored them.
template <int RS>
MM3_GEMM_AVX2 inline __attribute__((always_inline)) void load_cols_avx2(__m256 (&x)[RS], const float* C, int64_t ldc,
                                                                        int nv) {
  if (nv >= 8) {
#pragma GCC unroll 8
    for (int r = 0; r < RS; ++r) x[r] = _mm256_loadu_ps(C + r * ldc);
  } else {
    const __m256i msk = lanes8(nv);
#pragma GCC unroll 8
    for (int r = 0; r < RS; ++r) x[r] = _mm256_maskload_ps(C + r * ldc, msk);
  }
}

// Rows [0, RS) of the tile (packed A panel Ap[k * kMR2 + r]), columns [c0, c0 + 8W) of the 32-column
// strip (W = 2 or 4). One named accumulator array per column vector, every loop over rows unrolled
// and no pointer to them taken: otherwise GCC kept the accumulators in registers but also stored
// them to the stack on every k (perf annotate), which halved the rate.
template <int RS, int W>
MM3_GEMM_AVX2 inline void subtile_f32_avx2(const float* Ap, const float* Bp, const TileArgs& t, int c0) {
  static_assert((W == 2 || W == 4) && RS <= kMR2);
  const int nv = t.nr - c0;
  if (nv <= 0) return;
  const int64_t kc = t.kc, ldc = t.ldc;
  float* C = t.C;
  __m256 x0[RS], x1[RS], x2[RS], x3[RS];
  if (t.first) {
#pragma GCC unroll 8
    for (int r = 0; r < RS; ++r) x0[r] = x1[r] = x2[r] = x3[r] = _mm256_setzero_ps();
  } else {
    load_cols_avx2<RS>(x0, C + c0, ldc, nv);
    load_cols_avx2<RS>(x1, C + c0 + 8, ldc, nv - 8);
    if constexpr (W == 4) {
      load_cols_avx2<RS>(x2, C + c0 + 16, ldc, nv - 16);
      load_cols_avx2<RS>(x3, C + c0 + 24, ldc, nv - 24);
    }
  }
  const float* b = Bp + c0;
  const float* a = Ap;
  for (int64_t k = 0; k < kc; ++k, b += kNR, a += kMR2) {
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
    if constexpr (W == 4) {
      const __m256 b2 = _mm256_loadu_ps(b + 16), b3 = _mm256_loadu_ps(b + 24);
#pragma GCC unroll 8
      for (int r = 0; r < RS; ++r) {
        const __m256 ar = _mm256_broadcast_ss(a + r);
        x0[r] = _mm256_fmadd_ps(ar, b0, x0[r]);
        x1[r] = _mm256_fmadd_ps(ar, b1, x1[r]);
        x2[r] = _mm256_fmadd_ps(ar, b2, x2[r]);
        x3[r] = _mm256_fmadd_ps(ar, b3, x3[r]);
      }
    } else {
#pragma GCC unroll 8
      for (int r = 0; r < RS; ++r) {
        const __m256 ar = _mm256_broadcast_ss(a + r);
        x0[r] = _mm256_fmadd_ps(ar, b0, x0[r]);
        x1[r] = _mm256_fmadd_ps(ar, b1, x1[r]);
      }
    }
  }
  finish_cols_avx2<RS>(x0, C + c0, t, c0, nv);
  finish_cols_avx2<RS>(x1, C + c0 + 8, t, c0 + 8, nv - 8);
  if constexpr (W == 4) {
    finish_cols_avx2<RS>(x2, C + c0 + 16, t, c0 + 16, nv - 16);
    finish_cols_avx2<RS>(x3, C + c0 + 24, t, c0 + 24, nv - 24);
  }
}

// R (<= 6) rows x the 32-column strip. Rows fewer than 4 (a tail) take the strip in one pass of
// R x 32 (4R accumulators) rather than two of R x 16.
template <int R>
MM3_GEMM_AVX2 void tile_f32_avx2(const float* Ap, const float* Bp, const TileArgs& t) {
  if constexpr (R <= 3) {
    subtile_f32_avx2<R, 4>(Ap, Bp, t, 0);
  } else {
    subtile_f32_avx2<R, 2>(Ap, Bp, t, 0);
    subtile_f32_avx2<R, 2>(Ap, Bp, t, 16);
  }
}

using TileF32 = void (*)(const float*, int64_t, int64_t, const float*, const TileArgs&);
using TilePacked = void (*)(const float*, const float*, const TileArgs&);
using TileBf16 = void (*)(const uint16_t*, int64_t, const uint16_t*, const TileArgs&);

const TileF32* f32_tiles() {
  static const TileF32 avx[kMR] = {tile_f32_avx512<1>, tile_f32_avx512<2>, tile_f32_avx512<3>, tile_f32_avx512<4>,
                                   tile_f32_avx512<5>, tile_f32_avx512<6>, tile_f32_avx512<7>, tile_f32_avx512<8>};
  static const TileF32 gen[kMR] = {tile_f32_generic<1>, tile_f32_generic<2>, tile_f32_generic<3>,
                                   tile_f32_generic<4>, tile_f32_generic<5>, tile_f32_generic<6>,
                                   tile_f32_generic<7>, tile_f32_generic<8>};
  return cpu_has_avx512() ? avx : gen;
}
// The AVX2 tiles, on packed A panels; null where they do not run (AVX-512 or no AVX2/FMA).
const TilePacked* f32_tiles_packed() {
  static const TilePacked avx2[kMR2] = {tile_f32_avx2<1>, tile_f32_avx2<2>, tile_f32_avx2<3>,
                                        tile_f32_avx2<4>, tile_f32_avx2<5>, tile_f32_avx2<6>};
  return !cpu_has_avx512() && cpu_has_avx2_fma() ? avx2 : nullptr;
}
using TileBf16W64 = void (*)(const uint16_t*, int64_t, const uint16_t*, const uint16_t*, const TileArgs&);
constexpr int kMRW = 6;  // rows of the 64-column bf16 tile
const TileBf16W64* bf16_w64_tiles() {
  static const TileBf16W64 t[kMRW] = {tile_bf16_w64_avx512<1>, tile_bf16_w64_avx512<2>, tile_bf16_w64_avx512<3>,
                                      tile_bf16_w64_avx512<4>, tile_bf16_w64_avx512<5>, tile_bf16_w64_avx512<6>};
  return t;
}
using TileBf16Fma = void (*)(const float*, int64_t, const uint16_t*, const TileArgs&);
const TileBf16Fma* bf16fma_tiles() {
  static const TileBf16Fma t[kMR] = {tile_bf16fma_avx512<1>, tile_bf16fma_avx512<2>, tile_bf16fma_avx512<3>,
                                     tile_bf16fma_avx512<4>, tile_bf16fma_avx512<5>, tile_bf16fma_avx512<6>,
                                     tile_bf16fma_avx512<7>, tile_bf16fma_avx512<8>};
  return t;
}
const TileBf16* bf16_tiles() {
  static const TileBf16 t[kMR] = {tile_bf16_avx512<1>, tile_bf16_avx512<2>, tile_bf16_avx512<3>,
                                  tile_bf16_avx512<4>, tile_bf16_avx512<5>, tile_bf16_avx512<6>,
                                  tile_bf16_avx512<7>, tile_bf16_avx512<8>};
  return t;
}

// dst[k * ldd + i] = src_i[k] for i < LANES, k < 8: an 8 x 8 transpose of 8 rows (fp32 values, or
// bf16 bits widened exactly) with AVX2, of which the first LANES (8 or 6) rows are stored. Copies
// values only.
template <bool BF16, int LANES = 8>
MM3_GEMM_AVX2 inline void transpose8x8_avx2(const void* const (&src)[8], float* dst, int64_t ldd) {
  static_assert(LANES == 8 || LANES == 6);
  __m256 r[8];
  for (int i = 0; i < 8; ++i) {
    if constexpr (BF16)
      r[i] = _mm256_castsi256_ps(
          _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(static_cast<const __m128i*>(src[i]))), 16));
    else
      r[i] = _mm256_loadu_ps(static_cast<const float*>(src[i]));
  }
  __m256 t[8];
  for (int i = 0; i < 4; ++i) {  // pairs of rows interleaved
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  __m256 u[8];
  for (int i = 0; i < 2; ++i) {  // 4 rows: 64-bit shuffles
    u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {  // 128-bit halves: column i and i + 4
    const __m256 lo = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20), hi = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    if constexpr (LANES == 8) {
      _mm256_storeu_ps(dst + i * ldd, lo);
      _mm256_storeu_ps(dst + (i + 4) * ldd, hi);
    } else {  // lanes 0..3, then 4..5
      _mm_storeu_ps(dst + i * ldd, _mm256_castps256_ps128(lo));
      _mm_storel_pi(reinterpret_cast<__m64*>(dst + i * ldd + 4), _mm256_extractf128_ps(lo, 1));
      _mm_storeu_ps(dst + (i + 4) * ldd, _mm256_castps256_ps128(hi));
      _mm_storel_pi(reinterpret_cast<__m64*>(dst + (i + 4) * ldd + 4), _mm256_extractf128_ps(hi, 1));
    }
  }
}

// pack_f32's n-major strip body with 8 x 8 transposes: columns j0..j0+7 (all inside N and nc) of
// strip dst, k's [k0, k0 + kc8) with kc8 a multiple of 8.
MM3_GEMM_AVX2 void pack_cols8_avx2(const void* B, DType bdt, int64_t ldb, int64_t n, int64_t k0, int64_t kc8,
                                   float* dst) {
  const bool bf = bdt == DType::BF16;
  for (int64_t k = 0; k < kc8; k += 8) {
    const void* src[8];
    for (int i = 0; i < 8; ++i)
      src[i] = bf ? static_cast<const void*>(static_cast<const uint16_t*>(B) + (n + i) * ldb + k0 + k)
                  : static_cast<const void*>(static_cast<const float*>(B) + (n + i) * ldb + k0 + k);
    if (bf)
      transpose8x8_avx2<true>(src, dst + k * kNR, kNR);
    else
      transpose8x8_avx2<false>(src, dst + k * kNR, kNR);
  }
}

// Packs columns [n0, n0+nc) x k's [k0, k0+kc) of B (rows = columns of the product) into 32-column
// strips: Bp[(strip * kc + k) * 32 + j] = B[n0 + 32*strip + j, k0 + k], zero past N.
void pack_f32(const void* B, DType bdt, int64_t ldb, bool kmajor, int64_t N, int64_t n0, int64_t nc, int64_t k0,
              int64_t kc, float* Bp) {
  const int64_t strips = (nc + kNR - 1) / kNR;
  for (int64_t s = 0; s < strips; ++s) {
    float* dst = Bp + s * kc * kNR;
    if (kmajor) {  // B[k, n] at B + k * ldb + n: 32-float runs copy straight
      const int64_t nv = std::min<int64_t>(kNR, std::min(nc, N - n0) - s * kNR);
      for (int64_t k = 0; k < kc; ++k) {
        float* d = dst + k * kNR;
        if (bdt == DType::BF16) {
          const uint16_t* row = static_cast<const uint16_t*>(B) + (k0 + k) * ldb + n0 + s * kNR;
          for (int64_t j = 0; j < nv; ++j) d[j] = bf16_bits_to_f32(row[j]);
        } else {
          std::memcpy(d, static_cast<const float*>(B) + (k0 + k) * ldb + n0 + s * kNR,
                      static_cast<size_t>(std::max<int64_t>(nv, 0)) * sizeof(float));
        }
        for (int64_t j = std::max<int64_t>(nv, 0); j < kNR; ++j) d[j] = 0.f;
      }
      continue;
    }
    int j = 0;
    if (cpu_has_avx2_fma()) {  // whole groups of 8 valid columns, whole groups of 8 k's
      const int64_t kc8 = kc / 8 * 8;
      for (; j + 8 <= kNR && n0 + s * kNR + j + 8 <= N && s * kNR + j + 8 <= nc; j += 8) {
        const int64_t n = n0 + s * kNR + j;
        pack_cols8_avx2(B, bdt, ldb, n, k0, kc8, dst + j);
        for (int i = 0; i < 8; ++i)
          for (int64_t k = kc8; k < kc; ++k)
            dst[k * kNR + j + i] = bdt == DType::BF16
                                       ? bf16_bits_to_f32(static_cast<const uint16_t*>(B)[(n + i) * ldb + k0 + k])
                                       : static_cast<const float*>(B)[(n + i) * ldb + k0 + k];
      }
    }
    for (; j < kNR; ++j) {
      const int64_t n = n0 + s * kNR + j;
      if (n >= N || s * kNR + j >= nc) {
        for (int64_t k = 0; k < kc; ++k) dst[k * kNR + j] = 0.f;
      } else if (bdt == DType::BF16) {
        const uint16_t* row = static_cast<const uint16_t*>(B) + n * ldb + k0;
        for (int64_t k = 0; k < kc; ++k) dst[k * kNR + j] = bf16_bits_to_f32(row[k]);
      } else {
        const float* row = static_cast<const float*>(B) + n * ldb + k0;
        for (int64_t k = 0; k < kc; ++k) dst[k * kNR + j] = row[k];
      }
    }
  }
}

int64_t pack_bf16_rows16_avx512(const uint16_t* B, int64_t ldb, int64_t n, int64_t k0, int64_t kfull, uint16_t* dst);

// bf16 pairs: Bp[((strip * kp + p) * 32 + j) * 2 + h] = B[n, k0 + 2p + h], zero past N or K.
void pack_bf16(const uint16_t* B, int64_t ldb, int64_t N, int64_t K, int64_t n0, int64_t nc, int64_t k0, int64_t kc,
               uint16_t* Bp) {
  const int64_t strips = (nc + kNR - 1) / kNR, kp = (kc + 1) / 2;
  const int64_t kfull = std::min(kp, (K - k0) / 2);  // pairs with both halves inside K
  const bool vec = cpu_has_avx512();
  for (int64_t s = 0; s < strips; ++s) {
    uint16_t* dst = Bp + s * kp * 2 * kNR;
    int64_t done[2] = {0, 0};  // pairs of rows [16h, 16h + 16) packed by 16 x 16 transposes
    for (int h = 0; h < 2 && vec; ++h)
      if (n0 + s * kNR + 16 * h + 16 <= N && s * kNR + 16 * h + 16 <= nc)
        done[h] = pack_bf16_rows16_avx512(B, ldb, n0 + s * kNR + 16 * h, k0, kfull, dst + 16 * h * 2);
    for (int j = 0; j < kNR; ++j) {
      const int64_t n = n0 + s * kNR + j;
      const bool valid = n < N && s * kNR + j < nc;
      const uint16_t* row = B + n * ldb;
      int64_t p = done[j / 16];
      if (valid)  // whole pairs as 32-bit words, no per-element tests (the packing was ~1/3 of the DiT attention)
        for (const uint16_t* src = row + k0; p < kfull; ++p) {
          uint32_t w;
          std::memcpy(&w, src + 2 * p, 4);
          std::memcpy(dst + (p * kNR + j) * 2, &w, 4);
        }
      for (; p < kp; ++p)
        for (int h = 0; h < 2; ++h) {
          const int64_t k = k0 + 2 * p + h;
          dst[(p * kNR + j) * 2 + h] = (valid && k < K) ? row[k] : uint16_t(0);
        }
    }
  }
}

}  // namespace

void gemm_nt(const ThreadPool& pool, const float* A, int64_t lda, int64_t M, const void* B, DType b_dtype, int64_t ldb,
             int64_t N, int64_t K, const float* bias, float* C, int64_t ldc, DType store, bool bf16_dot) {
  gemm_ex(pool, A, lda, 1, M, B, b_dtype, ldb, false, N, K, bias, C, ldc, store, bf16_dot);
}

// The K block of the fp32 tiles on this machine: the AVX2 tiles (packed A panels) take kKC2.
int64_t f32_kc_block() { return f32_tiles_packed() ? kKC2 : kKC; }

int64_t pack_f32_panels_size(int64_t N, int64_t K) { return (N + kNC - 1) / kNC * kNC * K; }

namespace {
void pack_f32_panel(const float* B, int64_t ldb, bool b_kmajor, int64_t N, int64_t K, int64_t p, float* panels) {
  const int64_t kcb = f32_kc_block();
  const int64_t n0 = p * kNC, nc = std::min<int64_t>(kNC, N - n0), strips = (nc + kNR - 1) / kNR;
  for (int64_t k0 = 0; k0 < K; k0 += kcb)
    pack_f32(B, DType::F32, ldb, b_kmajor, N, n0, nc, k0, std::min(kcb, K - k0),
             panels + p * kNC * K + k0 * strips * kNR);
}
}  // namespace

void pack_f32_panels(const ThreadPool& pool, const float* B, int64_t ldb, int64_t N, int64_t K, float* panels) {
  pool.parallel_for((N + kNC - 1) / kNC, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) pack_f32_panel(B, ldb, false, N, K, p, panels);
  });
}

void pack_f32_panels_serial(const float* B, int64_t ldb, bool b_kmajor, int64_t N, int64_t K, float* panels) {
  for (int64_t p = 0; p < (N + kNC - 1) / kNC; ++p) pack_f32_panel(B, ldb, b_kmajor, N, K, p, panels);
}

void pack_f32_panels_part(const float* B, int64_t ldb, bool b_kmajor, int64_t N, int64_t K, int64_t r0, int64_t r1,
                          float* panels) {
  const int64_t rows = b_kmajor ? K : N;
  MM3_CHECK(r0 >= 0 && r0 % 32 == 0 && r0 < r1 && r1 <= rows && (r1 % 32 == 0 || r1 == rows),
            "pack_f32_panels_part: rows [{}, {}) of {} (need multiples of 32, or the end)", r0, r1, rows);
  const int64_t kcb = f32_kc_block();
  for (int64_t p = 0; p < (N + kNC - 1) / kNC; ++p) {
    const int64_t n0 = p * kNC, nc = std::min<int64_t>(kNC, N - n0), strips = (nc + kNR - 1) / kNR;
    if (!b_kmajor && (n0 + nc <= r0 || n0 >= r1)) continue;
    for (int64_t k0 = 0; k0 < K; k0 += kcb) {
      const int64_t kc = std::min(kcb, K - k0);
      float* const Bp = panels + p * kNC * K + k0 * strips * kNR;
      if (!b_kmajor) {  // pack_f32 over the strips of rows [r0, r1): its strip s at Bp + s * kc * 32
        const int64_t sb = (std::max(r0, n0) - n0) / kNR, se = (std::min(r1, n0 + nc) - n0 + kNR - 1) / kNR;
        pack_f32(B, DType::F32, ldb, false, N, n0 + sb * kNR, std::min(nc - sb * kNR, (se - sb) * kNR), k0, kc,
                 Bp + sb * kc * kNR);
        continue;
      }
      const int64_t ka = std::max(r0, k0), kb = std::min(r1, k0 + kc);  // pack_f32's k-major copy, k's [ka, kb)
      for (int64_t s = 0; s < strips; ++s) {
        const int64_t nv = std::min<int64_t>(kNR, nc - s * kNR);
        for (int64_t k = ka; k < kb; ++k) {
          float* d = Bp + (s * kc + k - k0) * kNR;
          std::memcpy(d, B + k * ldb + n0 + s * kNR, static_cast<size_t>(nv) * sizeof(float));
          for (int64_t j = nv; j < kNR; ++j) d[j] = 0.f;
        }
      }
    }
  }
}

int64_t pack_bf16_panels_size(int64_t N, int64_t K) { return (N + kNC - 1) / kNC * kNC * ((K + 1) & ~int64_t(1)); }

void pack_bf16_panels_serial(const uint16_t* B, int64_t ldb, int64_t N, int64_t K, uint16_t* panels) {
  const int64_t Kp = (K + 1) & ~int64_t(1);
  for (int64_t p = 0; p < (N + kNC - 1) / kNC; ++p) {
    const int64_t n0 = p * kNC, nc = std::min<int64_t>(kNC, N - n0), strips = (nc + kNR - 1) / kNR;
    for (int64_t k0 = 0; k0 < K; k0 += kKC)  // kKC is even: a block at k0 starts k0 / 2 pairs in
      pack_bf16(B, ldb, N, K, n0, nc, k0, std::min<int64_t>(kKC, K - k0), panels + p * kNC * Kp + k0 * strips * kNR);
  }
}

namespace {

#define MM3_PACK_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))

// The 16 x 16 transpose of 32-bit words: r[i] lane j becomes r[j] lane i.
MM3_PACK_AVX512 inline void transpose16_epi32(__m512i (&r)[16]) {
  __m512i a[16], b[16];
  for (int i = 0; i < 8; ++i) {  // lane L of a[2i] / a[2i+1]: rows 2i, 2i+1 of columns 4L, 4L+1 / 4L+2, 4L+3
    a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // lane L of b[4i + c]: rows 4i..4i+3 of column 4L + c
    b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
    b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // column 4L + c gathers lane L of b[c], b[4 + c], b[8 + c], b[12 + c]
    const __m512i d0 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0x88), d1 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0xDD);
    const __m512i e0 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0x88),
                  e1 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0xDD);
    r[c] = _mm512_shuffle_i32x4(d0, e0, 0x88);
    r[8 + c] = _mm512_shuffle_i32x4(d0, e0, 0xDD);
    r[4 + c] = _mm512_shuffle_i32x4(d1, e1, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(d1, e1, 0xDD);
  }
}

// pack_bf16's rows n .. n + 15 (all valid), whole groups of 16 pairs among the first kfull from k0: a
// 16 x 16 transpose of their 32-bit pair words per group, each pair's 16 words stored as one vector at
// dst + p * 64 (dst: the strip's row 16h slot). Returns the pairs done (the rest: pack_bf16's loop).
// Copies words only. The quantized prefill (kern::quant_gemm) packs every dequantized weight here: the
// word-at-a-time loop was ~11% of its samples (thirty-seventh session).
MM3_PACK_AVX512 int64_t pack_bf16_rows16_avx512(const uint16_t* B, int64_t ldb, int64_t n, int64_t k0, int64_t kfull,
                                                uint16_t* dst) {
  int64_t p = 0;
  for (; p + 16 <= kfull; p += 16) {
    __m512i r[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(B + (n + i) * ldb + k0 + 2 * p);
    transpose16_epi32(r);  // r[q]: pair p + q of the 16 rows
    for (int q = 0; q < 16; ++q) _mm512_storeu_si512(dst + (p + q) * kNR * 2, r[q]);
  }
  return p;
}

// Strips [sb, se) x pairs [pb, pe) of one K block (k0, kc) of one panel (n0, nc) as pack_bf16 lays it out,
// from fp32 B rounded as read; Bp is the block's start. Elements past N or K are 0 (pack_bf16's padding).
struct PackPart {
  int64_t n0, nc, k0, kc, sb, se, pb, pe;
};

void pack_bf16_from_f32_block_scalar(const float* B, int64_t ldb, bool b_kmajor, int64_t K, const PackPart& t,
                                     uint16_t* Bp) {
  const int64_t kp = (t.kc + 1) / 2;
  for (int64_t s = t.sb; s < t.se; ++s)
    for (int64_t p = t.pb; p < t.pe; ++p)
      for (int j = 0; j < kNR; ++j)
        for (int h = 0; h < 2; ++h) {
          const int64_t n = t.n0 + s * kNR + j, k = t.k0 + 2 * p + h;
          const bool in = s * kNR + j < t.nc && k < K;
          Bp[((s * kp + p) * kNR + j) * 2 + h] = in ? f32_to_bf16_bits(b_kmajor ? B[k * ldb + n] : B[n * ldb + k]) : 0;
        }
}

// The same with AVX-512. n-major B (row n: B + n * ldb): 16 rows x 16 pairs at a time (pb a multiple of
// 16), each row's 32 floats rounded and their bf16 halves gathered in order (16 pair words: the even
// element's bf16 low, the odd's high), then transposed so each vector holds one pair of 16 rows.
// k-major B (B[n, k] at B + k * ldb + n): a pair's word joins row k's and row k + 1's rounded values
// lane by lane. Elements past N or K read as 0 (masked loads), whose bf16 is 0.
MM3_PACK_AVX512 void pack_bf16_from_f32_block(const float* B, int64_t ldb, bool b_kmajor, int64_t K, const PackPart& t,
                                              uint16_t* Bp) {
  const int64_t kp = (t.kc + 1) / 2, nend = t.n0 + t.nc;
  auto mask = [](int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << std::max<int64_t>(0, n)) - 1u); };
  if (b_kmajor) {
    for (int64_t s = t.sb; s < t.se; ++s)
      for (int64_t p = t.pb; p < t.pe; ++p) {
        const int64_t k = t.k0 + 2 * p;
        uint16_t* dst = Bp + (s * kp + p) * 2 * kNR;
        for (int h = 0; h < kNR / 16; ++h) {
          const int64_t n = t.n0 + s * kNR + h * 16;
          const __mmask16 m = mask(nend - n);
          const __m512i lo =
              _mm512_srli_epi32(_mm512_castps_si512(round_bf16_512(_mm512_maskz_loadu_ps(m, B + k * ldb + n))), 16);
          const __m512i hi = k + 1 < K
                                 ? _mm512_castps_si512(round_bf16_512(_mm512_maskz_loadu_ps(m, B + (k + 1) * ldb + n)))
                                 : _mm512_setzero_si512();
          _mm512_storeu_si512(dst + h * 32, _mm512_or_si512(lo, hi));
        }
      }
    return;
  }
  // a row's 32 bf16 values in order: the upper 16-bit halves (the odd words) of its two rounded halves
  alignas(64) static const uint16_t odd_words[32] = {1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
                                                     33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
  const __m512i odd = _mm512_load_si512(odd_words);
  for (int64_t s = t.sb; s < t.se; ++s)
    for (int h = 0; h < kNR / 16; ++h) {
      const int64_t nb = t.n0 + s * kNR + h * 16;
      for (int64_t p0 = t.pb; p0 < t.pe; p0 += 16) {
        const int64_t ka = t.k0 + 2 * p0;  // the 32 floats [ka, ka + 32) of each row, clipped to K
        const __mmask16 m0 = mask(K - ka), m1 = mask(K - ka - 16);
        __m512i r[16];
        for (int i = 0; i < 16; ++i) {
          const int64_t n = nb + i;
          if (n >= nend) {
            r[i] = _mm512_setzero_si512();
            continue;
          }
          const float* row = B + n * ldb + ka;
          const __m512i a = _mm512_castps_si512(round_bf16_512(_mm512_maskz_loadu_ps(m0, row)));
          const __m512i b = _mm512_castps_si512(round_bf16_512(_mm512_maskz_loadu_ps(m1, row + 16)));
          r[i] = _mm512_permutex2var_epi16(a, odd, b);  // pair word q = (element 2q, element 2q + 1)
        }
        transpose16_epi32(r);  // r[q]: pair p0 + q of the 16 rows
        for (int64_t q = 0; q < 16 && p0 + q < t.pe; ++q)
          _mm512_storeu_si512(Bp + ((s * kp + p0 + q) * kNR + h * 16) * 2, r[q]);
      }
    }
}

}  // namespace

void pack_bf16_panels_from_f32_part(const float* B, int64_t ldb, bool b_kmajor, int64_t N, int64_t K, int64_t r0,
                                    int64_t r1, uint16_t* panels) {
  const int64_t rows = b_kmajor ? K : N;
  MM3_CHECK(r0 >= 0 && r0 % 32 == 0 && r0 < r1 && r1 <= rows && (r1 % 32 == 0 || r1 == rows),
            "pack_bf16_panels_from_f32_part: rows [{}, {}) of {} (need multiples of 32, or the end)", r0, r1, rows);
  const int64_t Kp = (K + 1) & ~int64_t(1);
  const bool vec = cpu_has_avx512();
  for (int64_t p = 0; p < (N + kNC - 1) / kNC; ++p) {
    const int64_t n0 = p * kNC, nc = std::min<int64_t>(kNC, N - n0), strips = (nc + kNR - 1) / kNR;
    if (!b_kmajor && (n0 + nc <= r0 || n0 >= r1)) continue;
    for (int64_t k0 = 0; k0 < K; k0 += kKC) {
      const int64_t kc = std::min<int64_t>(kKC, K - k0), kp = (kc + 1) / 2;
      if (b_kmajor && (k0 + kc <= r0 || k0 >= r1)) continue;
      PackPart t{n0, nc, k0, kc, 0, strips, 0, kp};
      if (b_kmajor) {  // pairs of the rows k in [r0, r1): r0 is even, r1 even or K
        t.pb = (std::max(r0, k0) - k0) / 2, t.pe = (std::min(r1, k0 + kc) - k0 + 1) / 2;
      } else {  // strips of the rows n in [r0, r1): 32-row aligned, or ending at N
        t.sb = (std::max(r0, n0) - n0) / kNR, t.se = (std::min(r1, n0 + nc) - n0 + kNR - 1) / kNR;
      }
      uint16_t* Bp = panels + p * kNC * Kp + k0 * strips * kNR;
      if (vec)
        pack_bf16_from_f32_block(B, ldb, b_kmajor, K, t, Bp);
      else
        pack_bf16_from_f32_block_scalar(B, ldb, b_kmajor, K, t, Bp);
    }
  }
}

void pack_bf16_panels_from_f32_serial(const float* B, int64_t ldb, bool b_kmajor, int64_t N, int64_t K,
                                      uint16_t* panels) {
  if (N > 0 && K > 0) pack_bf16_panels_from_f32_part(B, ldb, b_kmajor, N, K, 0, b_kmajor ? K : N, panels);
}

void gemm_bf16_packed_serial(const uint16_t* A, int64_t lda, int64_t M, const uint16_t* panels, int64_t N, int64_t K,
                             float* C, int64_t ldc, DType store) {
  MM3_CHECK(cpu_has_avx512bf16() && K > 0, "gemm_bf16_packed_serial: needs AVX512-BF16 and K > 0 (K={})", K);
  const TileBf16W64* tb = bf16_w64_tiles();
  const int64_t Kp = (K + 1) & ~int64_t(1);
  for (int64_t p = 0; p < (N + kNC - 1) / kNC; ++p) {
    const int64_t n0 = p * kNC, nc = std::min<int64_t>(kNC, N - n0), strips = (nc + kNR - 1) / kNR;
    for (int64_t k0 = 0; k0 < K; k0 += kKC) {
      const int64_t kc = std::min<int64_t>(kKC, K - k0), sstride = ((kc + 1) / 2) * 2 * kNR;
      const uint16_t* bp = panels + p * kNC * Kp + k0 * strips * kNR;
      for (int64_t m0 = 0; m0 < M; m0 += kMRW)
        for (int64_t s = 0; s < strips; s += 2) {  // strips s and s + 1 (a last odd strip alone)
          const int64_t ns = n0 + s * kNR;
          const bool two = s + 1 < strips;
          const TileArgs ta{
              kc,      C + m0 * ldc + ns, ldc,     static_cast<int>(std::min<int64_t>(two ? 2 * kNR : kNR, N - ns)),
              k0 == 0, k0 + kc >= K,      nullptr, store};
          const uint16_t* b0 = bp + s * sstride;
          tb[std::min<int64_t>(kMRW, M - m0) - 1](A + m0 * lda + k0, lda, b0, two ? b0 + sstride : b0, ta);
        }
    }
  }
}

void gemm_ex(const ThreadPool& pool, const float* A, int64_t a_rs, int64_t a_cs, int64_t M, const void* B,
             DType b_dtype, int64_t ldb, bool b_kmajor, int64_t N, int64_t K, const float* bias, float* C, int64_t ldc,
             DType store, bool bf16_dot, const float* prepacked, bool b_strips) {
  if (M <= 0 || N <= 0) return;
  MM3_CHECK(K > 0, "gemm_ex: K={}", K);
  MM3_CHECK(!b_strips || (b_dtype == DType::BF16 && !prepacked && !b_kmajor), "gemm_ex: strips are BF16, n-major");
  const bool use_bf16 = !prepacked && bf16_dot && !b_kmajor && b_dtype == DType::BF16 && cpu_has_avx512bf16();

  // bf16 copy of A (exact for bf16-valued A), rows padded to an even length with zeros.
  const int64_t Kp = (K + 1) & ~int64_t(1);
  // On cache lines, as every buffer the tiles load vectors from. The calling thread's, kept between
  // calls: a fresh zeroed buffer per call (the DiT attention makes ~2 per query block and head) cost
  // its memset and page faults, ~1/3 of attention_dit_L690_bf16's samples. Workers get its address.
  thread_local aligned_vector<uint16_t> a16_buf;
  uint16_t* A16 = nullptr;
  if (use_bf16) {
    if (a16_buf.size() < static_cast<size_t>(M * Kp)) a16_buf.resize(static_cast<size_t>(M * Kp));
    A16 = a16_buf.data();
    pool.parallel_for(
        M,
        [&](int64_t m0, int64_t m1) {
          for (int64_t m = m0; m < m1; ++m) {
            if (a_cs == 1)
              f32_to_bf16(A + m * a_rs, A16 + m * Kp, static_cast<size_t>(K));
            else
              for (int64_t k = 0; k < K; ++k) A16[m * Kp + k] = f32_to_bf16_bits(A[m * a_rs + k * a_cs]);
            if (Kp > K) A16[m * Kp + K] = 0;  // the pad of an odd K: the last pair's second half
          }
        },
        std::max<int64_t>(1, 65536 / K));
  }
  // Where VDPBF16PS is slow, the same bits on FMAs (tile_bf16fma_avx512) from A16's values with each
  // pair's halves swapped, as fp32. The calling thread's buffer, kept as A16's is.
  thread_local aligned_vector<float> as_buf;
  float* As = nullptr;
  if (use_bf16 && bf16_dot_fma()) {
    if (as_buf.size() < static_cast<size_t>(M * Kp)) as_buf.resize(static_cast<size_t>(M * Kp));
    As = as_buf.data();
    pool.parallel_for(
        M,
        [&](int64_t m0, int64_t m1) {
          for (int64_t i = m0 * Kp; i < m1 * Kp; i += 2) {
            As[i] = bf16_bits_to_f32(A16[i + 1]);
            As[i + 1] = bf16_bits_to_f32(A16[i]);
          }
        },
        std::max<int64_t>(1, 65536 / K));
  }

  // Static task split: column panels x row chunks. Any split gives the same bits; this one just
  // aims for ~2 tasks per thread without re-packing a panel for tiny row chunks.
  const int64_t panels = (N + kNC - 1) / kNC;
  const int64_t want = 2 * pool.size();
  int64_t chunks = panels >= want ? 1 : (want + panels - 1) / panels;
  chunks = std::max<int64_t>(1, std::min(chunks, (M + 63) / 64));
  const TileF32* tf = f32_tiles();
  const TileBf16* tb = use_bf16 ? bf16_tiles() : nullptr;
  const TileBf16Fma* tbf = As ? bf16fma_tiles() : nullptr;
  // The AVX2 tiles read A from panels copied once for all column panels, [K block][6-row block][k <
  // kc_block][6] (rows past M: unwritten, never read). Read in place, the rows of a row-major A (K =
  // 8192: 32 KiB apart) all fall into one L1 set and the broadcasts kept missing; the row blocks of one
  // K block are contiguous, so a sweep down all rows (the AVX2 loop order below) reads one stream.
  // (As [row block][K][6], the row blocks' pieces of a K block were K·24 bytes apart, all in the same
  // L2 sets.) Copying changes no value.
  const TilePacked* tp = use_bf16 ? nullptr : f32_tiles_packed();
  const bool pack_a = tp != nullptr;
  const int64_t mr = pack_a ? kMR2 : kMR;  // rows per tile
  const int64_t kc_block = pack_a ? kKC2 : kKC;
  MM3_CHECK(use_bf16 || kc_block == f32_kc_block(), "gemm_ex: fp32 K block {} is not f32_kc_block()", kc_block);
  const int64_t mc = ((M + chunks - 1) / chunks + mr - 1) / mr * mr;
  chunks = (M + mc - 1) / mc;
  // The buffer is the calling thread's and keeps its pages between calls (fresh pages cost a fault and
  // the kernel's zeroing each: ~6% of a DiT GEMM's samples), so up to the largest M·K floats seen
  // (~50 MB: the LM prefill's down projection) stay allocated per calling thread.
  const int64_t mblocks = (M + mr - 1) / mr, kblocks = (K + kc_block - 1) / kc_block;
  thread_local aligned_vector<float> ap_buf;
  float* Ap = nullptr;
  auto a_panel = [&](int64_t mb, int64_t kb) { return Ap + (kb * mblocks + mb) * kc_block * kMR2; };
  if (pack_a) {
    static_assert(kMR2 == 6 && kKC2 % 8 == 0, "the A panels are filled by 8 x 8 transposes storing 6 lanes");
    const size_t need = static_cast<size_t>(mblocks * kblocks * kc_block * kMR2);
    if (ap_buf.size() < need) ap_buf.resize(need);
    Ap = ap_buf.data();
    pool.parallel_for(
        mblocks,
        [&](int64_t b0, int64_t b1) {
          for (int64_t b = b0; b < b1; ++b) {
            const int64_t r0 = b * kMR2;
            const bool whole = a_cs == 1 && r0 + kMR2 <= M;
            for (int64_t kb = 0; kb < kblocks; ++kb) {
              float* dst = a_panel(b, kb);
              const int64_t k0 = kb * kc_block, kc = std::min(kc_block, K - k0);
              int64_t k = 0;
              if (whole)  // 6 whole rows: 8 x 8 transposes of them and 2 repeats of the last, 6 lanes stored
                for (; k + 8 <= kc; k += 8) {
                  const void* src[8];
                  for (int i = 0; i < 8; ++i) src[i] = A + (r0 + std::min(i, kMR2 - 1)) * a_rs + k0 + k;
                  transpose8x8_avx2<false, kMR2>(src, dst + k * kMR2, kMR2);
                }
              for (int64_t i = 0; i < kMR2 && r0 + i < M; ++i)
                for (int64_t kk = k; kk < kc; ++kk) dst[kk * kMR2 + i] = A[(r0 + i) * a_rs + (k0 + kk) * a_cs];
            }
          }
        },
        std::max<int64_t>(1, 8192 / K));
  }
  pool.parallel_for(panels * chunks, [&](int64_t t0, int64_t t1) {
    thread_local aligned_vector<float> bufF;  // the packed B strips, on cache lines (core/aligned.h)
    thread_local aligned_vector<uint16_t> bufH;
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t pn = task / chunks, ch = task % chunks;
      const int64_t n0 = pn * kNC, nc = std::min<int64_t>(kNC, N - n0);
      const int64_t ms = ch * mc, me = std::min(M, ms + mc);
      const int64_t strips = (nc + kNR - 1) / kNR;
      for (int64_t k0 = 0; k0 < K; k0 += kc_block) {
        const int64_t kc = std::min<int64_t>(kc_block, K - k0);
        if (use_bf16) {
          const int64_t kp = (kc + 1) / 2;
          bufH.resize(static_cast<size_t>(strips * kp * 2 * kNR));
          if (b_strips)
            strips_block_bf16(static_cast<const uint16_t*>(B), K, n0, nc, k0, kc, bufH.data());
          else
            pack_bf16(static_cast<const uint16_t*>(B), ldb, N, K, n0, nc, k0, kc, bufH.data());
        } else if (!prepacked) {
          bufF.resize(static_cast<size_t>(strips * kc * kNR));
          if (b_strips)
            strips_block_f32(static_cast<const uint16_t*>(B), K, n0, nc, k0, kc, bufF.data());
          else
            pack_f32(B, b_dtype, ldb, b_kmajor, N, n0, nc, k0, kc, bufF.data());
        }
        const float* bp = prepacked ? prepacked + pn * kNC * K + k0 * strips * kNR : bufF.data();
        auto tile = [&](int64_t m0, int64_t s) {
          const int r = static_cast<int>(std::min<int64_t>(mr, me - m0));
          const int64_t ns = n0 + s * kNR;
          TileArgs ta{
              kc,           C + m0 * ldc + ns,          ldc,  static_cast<int>(std::min<int64_t>(kNR, N - ns)), k0 == 0,
              k0 + kc >= K, bias ? bias + ns : nullptr, store};
          if (As)
            tbf[r - 1](As + m0 * Kp + k0, Kp, bufH.data() + s * ((kc + 1) / 2) * 2 * kNR, ta);
          else if (use_bf16)
            tb[r - 1](A16 + m0 * Kp + k0, Kp, bufH.data() + s * ((kc + 1) / 2) * 2 * kNR, ta);
          else if (pack_a)
            tp[r - 1](a_panel(m0 / kMR2, k0 / kc_block), bp + s * kc * kNR, ta);
          else
            tf[r - 1](A + m0 * a_rs + k0 * a_cs, a_rs, a_cs, bp + s * kc * kNR, ta);
        };
        // The AVX2 tiles walk each B strip (32 KiB) down all row blocks, so it is reused from L1 / L2 while the
        // packed A streams in order; the AVX-512 ones walk the strips of each row block.
        if (pack_a)
          for (int64_t s = 0; s < strips; ++s)
            for (int64_t m0 = ms; m0 < me; m0 += mr) tile(m0, s);
        else
          for (int64_t m0 = ms; m0 < me; m0 += mr)
            for (int64_t s = 0; s < strips; ++s) tile(m0, s);
      }
    }
  });
}

}  // namespace mm3::kern::detail
