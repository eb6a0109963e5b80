// strips.cpp — the 32-row bf16 pair strips of strips.h: packing, the decode GEMV bodies, gemm_ex's packers.
#include "kernels/cpu/strips.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/simd.h"

namespace mm3::kern::detail {

namespace {
constexpr int64_t kPairElems = 2 * kStripRows;  // uint16 per pair of a strip (128 bytes)
}  // namespace

namespace {

// 16 rows x 16 pairs (one 64-byte load a row) transposed into the 16 pairs' halves: pair p0 + c of the
// 16 rows goes to dst + pos[p0 + c], row i in dword i.
void transpose16_store(const uint16_t* const* rows, int64_t p0, uint16_t* dst, const int64_t* pos) {
  const void* src[16];
  void* out[16];
  for (int i = 0; i < 16; ++i) src[i] = rows[i] + 2 * p0, out[i] = dst + pos[p0 + i];
  transpose16x16_epi32(src, out);
}

}  // namespace

void strips_pack_part(const uint16_t* B, int64_t ldb, int64_t N, int64_t K, int64_t g0, int64_t g1, uint16_t* form) {
  const int64_t P = strips_pairs(K), Pf = K / 2;  // pairs, whole pairs
  constexpr int64_t kBlk = 64;                    // pairs per block: a strip's block is 8 KiB, in L1
  std::vector<int64_t> pos(static_cast<size_t>(P));
  for (int64_t p = 0; p < P; ++p) pos[size_t(p)] = strips_pair_pos(p, P) * kPairElems;
  const bool vec = cpu_has_avx512();
  for (int64_t g = g0; g < g1; ++g) {
    uint16_t* dst = form + g * P * kPairElems;
    int64_t p_done = 0;                      // pairs [0, p_done) written by the transposes for both halves
    if (vec && (g + 1) * kStripRows <= N) {  // whole 16-pair blocks of 32 valid rows: 16 x 16 transposes
      p_done = Pf / 16 * 16;
      for (int h = 0; h < 2; ++h) {
        const uint16_t* rows[16];
        for (int i = 0; i < 16; ++i) rows[i] = B + (g * kStripRows + 16 * h + i) * ldb;
        for (int64_t p0 = 0; p0 < p_done; p0 += 16) transpose16_store(rows, p0, dst + 32 * h, pos.data());
      }
    }
    for (int64_t p0 = p_done; p0 < P; p0 += kBlk) {
      const int64_t p1 = std::min(P, p0 + kBlk);
      for (int64_t j = 0; j < kStripRows; ++j) {
        const int64_t n = g * kStripRows + j;
        if (n >= N) {
          for (int64_t p = p0; p < p1; ++p) dst[pos[size_t(p)] + 2 * j] = dst[pos[size_t(p)] + 2 * j + 1] = 0;
          continue;
        }
        const uint16_t* row = B + n * ldb;
        int64_t p = p0;
        for (; p < std::min(p1, Pf); ++p) {  // whole pairs as 32-bit words
          uint32_t v;
          std::memcpy(&v, row + 2 * p, 4);
          std::memcpy(dst + pos[size_t(p)] + 2 * j, &v, 4);
        }
        for (; p < p1; ++p) {  // the last pair of an odd K: its second half is the zero pad
          dst[pos[size_t(p)] + 2 * j] = row[2 * p];
          dst[pos[size_t(p)] + 2 * j + 1] = 0;
        }
      }
    }
  }
}

uint16_t strips_at(const uint16_t* form, int64_t K, int64_t n, int64_t k) {
  const int64_t P = strips_pairs(K);
  return form[((n / kStripRows) * P + strips_pair_pos(k / 2, P)) * kPairElems + (n % kStripRows) * 2 + (k % 2)];
}

void strips_order_x(const uint16_t* xb, int64_t Kp, int64_t M, uint32_t* xq) {
  const int64_t P = Kp / 2;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t p = 0; p < P; ++p) std::memcpy(xq + m * P + strips_pair_pos(p, P), xb + m * Kp + 2 * p, 4);
}

namespace {

#define MM3_STRIPS_BF16 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))
#define MM3_STRIPS_F32 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))

// Stores the 2 x M accumulators of strip g (rows 32g.., lanes = rows) into sums, rows past N left out.
template <int M>
MM3_STRIPS_F32 inline void store_strip(__m512 (&acc)[2][M], int64_t g, int64_t N, float* sums) {
  const int64_t r0 = g * kStripRows, valid = std::min<int64_t>(kStripRows, N - r0);
  const int v0 = static_cast<int>(std::min<int64_t>(valid, 16)),
            v1 = static_cast<int>(std::max<int64_t>(valid - 16, 0));
  const __mmask16 m0 = v0 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << v0) - 1u);
  const __mmask16 m1 = v1 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << v1) - 1u);
#pragma GCC unroll 4
  for (int m = 0; m < M; ++m) {
    _mm512_mask_storeu_ps(sums + m * N + r0, m0, acc[0][m]);
    _mm512_mask_storeu_ps(sums + m * N + r0 + 16, m1, acc[1][m]);
  }
}

// Residue by residue q: per pair of the residue the strip's two lines (rows 0-15, 16-31), x's pair
// broadcast, one VDPBF16PS per (half, m) in the row-major body's operand order (x, then the weight);
// the 16 residues' chains then meet in _mm512_reduce_add_ps's tree (GCC: lanes i + 8, then i + 4, then
// (0 + 2) + (1 + 3)), lane by lane, which is what the row-major body's reduction does to its lanes.
template <int M>
MM3_STRIPS_BF16 void gemv_bf16_m(const uint32_t* xq, const uint16_t* form, int64_t N, int64_t K, int64_t g0, int64_t g1,
                                 float* sums) {
  const int64_t P = strips_pairs(K);
  for (int64_t g = g0; g < g1; ++g) {
    const uint16_t* sp = form + g * P * kPairElems;
    __m512 part[16][2][M];
    for (int q = 0; q < 16; ++q) {
      const int64_t b = strips_residue_start(q, P), e = strips_residue_start(q + 1, P);
      __m512 acc[2][M];
#pragma GCC unroll 4
      for (int m = 0; m < M; ++m) acc[0][m] = acc[1][m] = _mm512_setzero_ps();
      for (int64_t t = b; t < e; ++t) {
        const __m512i b0 = _mm512_load_si512(sp + t * kPairElems), b1 = _mm512_load_si512(sp + t * kPairElems + 32);
#pragma GCC unroll 4
        for (int m = 0; m < M; ++m) {
          const __m512i a = _mm512_set1_epi32(static_cast<int>(xq[m * P + t]));
          acc[0][m] = _mm512_dpbf16_ps(acc[0][m], (__m512bh)a, (__m512bh)b0);
          acc[1][m] = _mm512_dpbf16_ps(acc[1][m], (__m512bh)a, (__m512bh)b1);
        }
      }
#pragma GCC unroll 4
      for (int m = 0; m < M; ++m) part[q][0][m] = acc[0][m], part[q][1][m] = acc[1][m];
    }
    __m512 out[2][M];
    for (int h = 0; h < 2; ++h)
#pragma GCC unroll 4
      for (int m = 0; m < M; ++m) {
        __m512 t3[8], t6[4];
        for (int i = 0; i < 8; ++i) t3[i] = _mm512_add_ps(part[8 + i][h][m], part[i][h][m]);
        for (int i = 0; i < 4; ++i) t6[i] = _mm512_add_ps(t3[4 + i], t3[i]);
        out[h][m] = _mm512_add_ps(_mm512_add_ps(t6[0], t6[2]), _mm512_add_ps(t6[1], t6[3]));
      }
    store_strip<M>(out, g, N, sums);
  }
}

// gemv_bf16_m's bits without VDPBF16PS, for CPUs where it runs slower than two FMAs (cpu_bf16_dot_slow).
// The instruction adds a pair's two exact products to its lane one at a time, the odd element's
// (the pair word's high half) first, each addition rounded to nearest even, with denormal inputs read
// as zero and denormal results flushed (checked bit for bit on that Xeon, on random data with denormals
// in every operand). So per pair: the high halves' FMA, then the low halves', under MXCSR's DAZ and FTZ
// (set for the chains, restored for the residues' tree, which VDPBF16PS's body adds without them). xs holds x's pairs
// split: per (m, pair) the high half then the low half as fp32. S strips side by side share each x broadcast and double
// the independent chains (an accumulator's two FMAs a pair are dependent: 8 cycles of latency a pair on that Xeon).
constexpr int64_t kFmaPfBytes = 2048;  // T1 prefetch distance; 1, 4 and 8 KiB read the same on that Xeon

template <int M, int S, bool PF>
MM3_STRIPS_F32 void gemv_bf16fma_g(const float* xs, const uint16_t* form, int64_t N, int64_t K, int64_t g,
                                   float* sums) {
  const int64_t P = strips_pairs(K);
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(csr | 0x8040u);  // FTZ (bit 15) and DAZ (bit 6) for the chains; the tree runs without them
  __m512 part[16][S][2][M];
  for (int q = 0; q < 16; ++q) {
    const int64_t b = strips_residue_start(q, P), e = strips_residue_start(q + 1, P);
    __m512 acc[S][2][M];
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 4
      for (int m = 0; m < M; ++m) acc[s][0][m] = acc[s][1][m] = _mm512_setzero_ps();
    for (int64_t t = b; t < e; ++t) {
      __m512 od[S][2], ev[S][2];
      for (int s = 0; s < S; ++s)
        for (int h = 0; h < 2; ++h) {
          const uint16_t* wp = form + ((g + s) * P + t) * kPairElems + 32 * h;
          if constexpr (PF) _mm_prefetch(reinterpret_cast<const char*>(wp) + kFmaPfBytes, _MM_HINT_T1);
          const __m512i w = _mm512_load_si512(wp);
          od[s][h] = _mm512_castsi512_ps(_mm512_and_si512(w, hi));
          ev[s][h] = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, w, 16));
        }
#pragma GCC unroll 4
      for (int m = 0; m < M; ++m) {
        const __m512 xo = _mm512_set1_ps(xs[(m * P + t) * 2]), xe = _mm512_set1_ps(xs[(m * P + t) * 2 + 1]);
        for (int s = 0; s < S; ++s)
          for (int h = 0; h < 2; ++h) acc[s][h][m] = _mm512_fmadd_ps(xo, od[s][h], acc[s][h][m]);
        for (int s = 0; s < S; ++s)
          for (int h = 0; h < 2; ++h) acc[s][h][m] = _mm512_fmadd_ps(xe, ev[s][h], acc[s][h][m]);
      }
    }
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 4
      for (int m = 0; m < M; ++m) part[q][s][0][m] = acc[s][0][m], part[q][s][1][m] = acc[s][1][m];
  }
  _mm_setcsr(csr);
  for (int s = 0; s < S; ++s) {
    __m512 out[2][M];
    for (int h = 0; h < 2; ++h)
#pragma GCC unroll 4
      for (int m = 0; m < M; ++m) {
        __m512 t3[8], t6[4];
        for (int i = 0; i < 8; ++i) t3[i] = _mm512_add_ps(part[8 + i][s][h][m], part[i][s][h][m]);
        for (int i = 0; i < 4; ++i) t6[i] = _mm512_add_ps(t3[4 + i], t3[i]);
        out[h][m] = _mm512_add_ps(_mm512_add_ps(t6[0], t6[2]), _mm512_add_ps(t6[1], t6[3]));
      }
    store_strip<M>(out, g + s, N, sums);
  }
}

template <int M, bool PF>
MM3_STRIPS_F32 void gemv_bf16fma_m(const float* xs, const uint16_t* form, int64_t N, int64_t K, int64_t g0, int64_t g1,
                                   float* sums) {
  int64_t g = g0;
  for (; g + 2 <= g1; g += 2) gemv_bf16fma_g<M, 2, PF>(xs, form, N, K, g, sums);
  if (g < g1) gemv_bf16fma_g<M, 1, PF>(xs, form, N, K, g, sums);
}

// Per pair p: the two lines widened to fp32 (the low halves: k = 2p, the high: k = 2p + 1), then per
// (half, m) the FMA of k = 2p and of k = 2p + 1, in order: one FMA chain per output over k, as gemm_nt's
// fp32 tile (fmadd(a, b, c) with a the broadcast x) runs it. An odd K's last pair takes its first half only.
template <int M>
MM3_STRIPS_F32 void gemv_f32_m(const float* x, int64_t ldx, const uint16_t* form, int64_t N, int64_t K, int64_t g0,
                               int64_t g1, float* sums) {
  const int64_t P = strips_pairs(K), Pf = K / 2;
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t g = g0; g < g1; ++g) {
    const uint16_t* sp = form + g * P * kPairElems;
    __m512 acc[2][M];
#pragma GCC unroll 4
    for (int m = 0; m < M; ++m) acc[0][m] = acc[1][m] = _mm512_setzero_ps();
    for (int64_t p = 0; p < P; ++p) {
      const int64_t t = strips_pair_pos(p, P);
      const __m512i b0 = _mm512_load_si512(sp + t * kPairElems), b1 = _mm512_load_si512(sp + t * kPairElems + 32);
      // (The zero-masked shift: GCC 12 warns of an uninitialized operand in the unmasked one inlined here.)
      const __m512 e0 = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, b0, 16)),
                   e1 = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, b1, 16));
      const __m512 o0 = _mm512_castsi512_ps(_mm512_and_si512(b0, hi)),
                   o1 = _mm512_castsi512_ps(_mm512_and_si512(b1, hi));
      const bool whole = p < Pf;
#pragma GCC unroll 4
      for (int m = 0; m < M; ++m) {
        const __m512 a0 = _mm512_set1_ps(x[m * ldx + 2 * p]);
        acc[0][m] = _mm512_fmadd_ps(a0, e0, acc[0][m]);
        acc[1][m] = _mm512_fmadd_ps(a0, e1, acc[1][m]);
        if (whole) {
          const __m512 a1 = _mm512_set1_ps(x[m * ldx + 2 * p + 1]);
          acc[0][m] = _mm512_fmadd_ps(a1, o0, acc[0][m]);
          acc[1][m] = _mm512_fmadd_ps(a1, o1, acc[1][m]);
        }
      }
    }
    store_strip<M>(acc, g, N, sums);
  }
}

}  // namespace

void strips_gemv_bf16(const uint32_t* xq, int64_t M, const uint16_t* form, int64_t N, int64_t K, int64_t g0, int64_t g1,
                      float* sums) {
  switch (M) {
    case 1:
      return gemv_bf16_m<1>(xq, form, N, K, g0, g1, sums);
    case 2:
      return gemv_bf16_m<2>(xq, form, N, K, g0, g1, sums);
    case 3:
      return gemv_bf16_m<3>(xq, form, N, K, g0, g1, sums);
    default:
      return gemv_bf16_m<4>(xq, form, N, K, g0, g1, sums);
  }
}

void strips_split_x(const uint32_t* xq, int64_t M, int64_t P, float* xs) {
  for (int64_t i = 0; i < M * P; ++i) {
    xs[2 * i] = bf16_bits_to_f32(static_cast<uint16_t>(xq[i] >> 16));
    xs[2 * i + 1] = bf16_bits_to_f32(static_cast<uint16_t>(xq[i] & 0xFFFFu));
  }
}

void strips_gemv_bf16fma(const float* xs, int64_t M, const uint16_t* form, int64_t N, int64_t K, int64_t g0, int64_t g1,
                         float* sums, bool prefetch) {
  using Fn = void (*)(const float*, const uint16_t*, int64_t, int64_t, int64_t, int64_t, float*);
  static const Fn fns[2][4] = {
      {gemv_bf16fma_m<1, false>, gemv_bf16fma_m<2, false>, gemv_bf16fma_m<3, false>, gemv_bf16fma_m<4, false>},
      {gemv_bf16fma_m<1, true>, gemv_bf16fma_m<2, true>, gemv_bf16fma_m<3, true>, gemv_bf16fma_m<4, true>}};
  fns[prefetch ? 1 : 0][std::clamp<int64_t>(M, 1, 4) - 1](xs, form, N, K, g0, g1, sums);
}

void strips_gemv_f32(const float* x, int64_t ldx, int64_t M, const uint16_t* form, int64_t N, int64_t K, int64_t g0,
                     int64_t g1, float* sums) {
  switch (M) {
    case 1:
      return gemv_f32_m<1>(x, ldx, form, N, K, g0, g1, sums);
    case 2:
      return gemv_f32_m<2>(x, ldx, form, N, K, g0, g1, sums);
    case 3:
      return gemv_f32_m<3>(x, ldx, form, N, K, g0, g1, sums);
    default:
      return gemv_f32_m<4>(x, ldx, form, N, K, g0, g1, sums);
  }
}

void strips_block_bf16(const uint16_t* form, int64_t K, int64_t n0, int64_t nc, int64_t k0, int64_t kc, uint16_t* Bp) {
  const int64_t P = strips_pairs(K), kp = (kc + 1) / 2, strips = (nc + kStripRows - 1) / kStripRows;
  for (int64_t s = 0; s < strips; ++s) {
    const uint16_t* sp = form + (n0 / kStripRows + s) * P * kPairElems;
    for (int64_t t = 0; t < kp; ++t)
      std::memcpy(Bp + (s * kp + t) * kPairElems, sp + strips_pair_pos(k0 / 2 + t, P) * kPairElems,
                  static_cast<size_t>(kPairElems) * sizeof(uint16_t));
  }
}

void strips_block_f32(const uint16_t* form, int64_t K, int64_t n0, int64_t nc, int64_t k0, int64_t kc, float* Bp) {
  const int64_t P = strips_pairs(K), strips = (nc + kStripRows - 1) / kStripRows;
  for (int64_t s = 0; s < strips; ++s) {
    const uint16_t* sp = form + (n0 / kStripRows + s) * P * kPairElems;
    float* dst = Bp + s * kc * kStripRows;
    for (int64_t k = 0; k < kc; ++k) {
      const uint16_t* src = sp + strips_pair_pos((k0 + k) / 2, P) * kPairElems + ((k0 + k) % 2);
      for (int64_t j = 0; j < kStripRows; ++j) dst[k * kStripRows + j] = bf16_bits_to_f32(src[2 * j]);
    }
  }
}

}  // namespace mm3::kern::detail
