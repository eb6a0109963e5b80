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

#include "kernels/cpu/simd.h"

namespace mm3::kern::detail {

namespace {

constexpr int kMR = 8;     // rows per register tile
constexpr int kNR = 32;    // columns per register tile (two zmm)
constexpr int kKC = 256;   // k per packed block (even: bf16 pairs never straddle blocks)
constexpr int kNC = 128;   // columns per packed panel (4 strips; 128 KiB of f32 at KC = 256)

struct TileArgs {
  int64_t kc;           // k's in this block
  float* C;             // tile origin in C
  int64_t ldc;
  int nr;               // valid columns (<= 32)
  bool first, last;     // first / last K block
  const float* bias;    // bias for the tile's columns, or null
  DType store;
};

// ---- fp32 FMA tile, AVX-512 ----

__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) inline __m512 round_bf16_512(__m512 v) {
  __m512i u = _mm512_castps_si512(v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  r = _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
  __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_blend_ps(nan, _mm512_castsi512_ps(r), _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000)));
}

template <int R>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) inline void tile_store_512(__m512 (&c0)[R], __m512 (&c1)[R],
                                                                               const TileArgs& t) {
  const int n0 = std::min(t.nr, 16), n1 = std::max(t.nr - 16, 0);
  const __mmask16 m0 = n0 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n0) - 1u);
  const __mmask16 m1 = n1 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n1) - 1u);
  if (t.last) {
    if (t.bias) {
      const __m512 b0 = _mm512_maskz_loadu_ps(m0, t.bias), b1 = _mm512_maskz_loadu_ps(m1, t.bias + 16);
      for (int r = 0; r < R; ++r) c0[r] = _mm512_add_ps(c0[r], b0), c1[r] = _mm512_add_ps(c1[r], b1);
    }
    if (t.store == DType::BF16)
      for (int r = 0; r < R; ++r) c0[r] = round_bf16_512(c0[r]), c1[r] = round_bf16_512(c1[r]);
  }
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(t.C + r * t.ldc, m0, c0[r]);
    _mm512_mask_storeu_ps(t.C + r * t.ldc + 16, m1, c1[r]);
  }
}

template <int R>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) void tile_f32_avx512(const float* A, int64_t a_rs, int64_t a_cs,
                                                                          const float* Bp, const TileArgs& t) {
  __m512 c0[R], c1[R];
  if (t.first) {
    for (int r = 0; r < R; ++r) c0[r] = c1[r] = _mm512_setzero_ps();
  } else {
    const int n0 = std::min(t.nr, 16), n1 = std::max(t.nr - 16, 0);
    const __mmask16 m0 = n0 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n0) - 1u);
    const __mmask16 m1 = n1 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n1) - 1u);
    for (int r = 0; r < R; ++r) {
      c0[r] = _mm512_maskz_loadu_ps(m0, t.C + r * t.ldc);
      c1[r] = _mm512_maskz_loadu_ps(m1, t.C + r * t.ldc + 16);
    }
  }
  for (int64_t k = 0; k < t.kc; ++k) {
    const __m512 b0 = _mm512_loadu_ps(Bp + k * kNR), b1 = _mm512_loadu_ps(Bp + k * kNR + 16);
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
    for (int r = 0; r < R; ++r) c0[r] = c1[r] = _mm512_setzero_ps();
  } else {
    const int n0 = std::min(t.nr, 16), n1 = std::max(t.nr - 16, 0);
    const __mmask16 m0 = n0 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n0) - 1u);
    const __mmask16 m1 = n1 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n1) - 1u);
    for (int r = 0; r < R; ++r) {
      c0[r] = _mm512_maskz_loadu_ps(m0, t.C + r * t.ldc);
      c1[r] = _mm512_maskz_loadu_ps(m1, t.C + r * t.ldc + 16);
    }
  }
  const int64_t kp = (t.kc + 1) / 2;
  for (int64_t p = 0; p < kp; ++p) {
    const __m512i b0 = _mm512_loadu_si512(Bp + p * 2 * kNR), b1 = _mm512_loadu_si512(Bp + p * 2 * kNR + kNR);
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

using TileF32 = void (*)(const float*, int64_t, int64_t, const float*, const TileArgs&);
using TileBf16 = void (*)(const uint16_t*, int64_t, const uint16_t*, const TileArgs&);

const TileF32* f32_tiles() {
  static const TileF32 avx[kMR] = {tile_f32_avx512<1>, tile_f32_avx512<2>, tile_f32_avx512<3>, tile_f32_avx512<4>,
                                   tile_f32_avx512<5>, tile_f32_avx512<6>, tile_f32_avx512<7>, tile_f32_avx512<8>};
  static const TileF32 gen[kMR] = {tile_f32_generic<1>, tile_f32_generic<2>, tile_f32_generic<3>,
                                   tile_f32_generic<4>, tile_f32_generic<5>, tile_f32_generic<6>,
                                   tile_f32_generic<7>, tile_f32_generic<8>};
  return cpu_has_avx512() ? avx : gen;
}
const TileBf16* bf16_tiles() {
  static const TileBf16 t[kMR] = {tile_bf16_avx512<1>, tile_bf16_avx512<2>, tile_bf16_avx512<3>,
                                  tile_bf16_avx512<4>, tile_bf16_avx512<5>, tile_bf16_avx512<6>,
                                  tile_bf16_avx512<7>, tile_bf16_avx512<8>};
  return t;
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
    for (int j = 0; j < kNR; ++j) {
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

// bf16 pairs: Bp[((strip * kp + p) * 32 + j) * 2 + h] = B[n, k0 + 2p + h], zero past N or K.
void pack_bf16(const uint16_t* B, int64_t ldb, int64_t N, int64_t K, int64_t n0, int64_t nc, int64_t k0, int64_t kc,
               uint16_t* Bp) {
  const int64_t strips = (nc + kNR - 1) / kNR, kp = (kc + 1) / 2;
  const int64_t kfull = std::min(kp, (K - k0) / 2);  // pairs with both halves inside K
  for (int64_t s = 0; s < strips; ++s) {
    uint16_t* dst = Bp + s * kp * 2 * kNR;
    for (int j = 0; j < kNR; ++j) {
      const int64_t n = n0 + s * kNR + j;
      const bool valid = n < N && s * kNR + j < nc;
      const uint16_t* row = B + n * ldb;
      int64_t p = 0;
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

void gemm_ex(const ThreadPool& pool, const float* A, int64_t a_rs, int64_t a_cs, int64_t M, const void* B,
             DType b_dtype, int64_t ldb, bool b_kmajor, int64_t N, int64_t K, const float* bias, float* C, int64_t ldc,
             DType store, bool bf16_dot) {
  if (M <= 0 || N <= 0) return;
  MM3_CHECK(K > 0, "gemm_ex: K={}", K);
  const bool use_bf16 = bf16_dot && !b_kmajor && b_dtype == DType::BF16 && cpu_has_avx512bf16();

  // bf16 copy of A (exact for bf16-valued A), rows padded to an even length with zeros.
  const int64_t Kp = (K + 1) & ~int64_t(1);
  std::vector<uint16_t> A16;
  if (use_bf16) {
    A16.assign(static_cast<size_t>(M * Kp), 0);
    pool.parallel_for(
        M,
        [&](int64_t m0, int64_t m1) {
          for (int64_t m = m0; m < m1; ++m)
            if (a_cs == 1)
              f32_to_bf16(A + m * a_rs, A16.data() + m * Kp, static_cast<size_t>(K));
            else
              for (int64_t k = 0; k < K; ++k) A16[size_t(m * Kp + k)] = f32_to_bf16_bits(A[m * a_rs + k * a_cs]);
        },
        std::max<int64_t>(1, 65536 / K));
  }

  // Static task split: column panels x row chunks. Any split gives the same bits; this one just
  // aims for ~2 tasks per thread without re-packing a panel for tiny row chunks.
  const int64_t panels = (N + kNC - 1) / kNC;
  const int64_t want = 2 * pool.size();
  int64_t chunks = panels >= want ? 1 : (want + panels - 1) / panels;
  chunks = std::max<int64_t>(1, std::min(chunks, (M + 63) / 64));
  const int64_t mc = ((M + chunks - 1) / chunks + kMR - 1) / kMR * kMR;
  chunks = (M + mc - 1) / mc;

  const TileF32* tf = f32_tiles();
  const TileBf16* tb = use_bf16 ? bf16_tiles() : nullptr;
  pool.parallel_for(panels * chunks, [&](int64_t t0, int64_t t1) {
    thread_local std::vector<float> bufF;
    thread_local std::vector<uint16_t> bufH;
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t pn = task / chunks, ch = task % chunks;
      const int64_t n0 = pn * kNC, nc = std::min<int64_t>(kNC, N - n0);
      const int64_t ms = ch * mc, me = std::min(M, ms + mc);
      const int64_t strips = (nc + kNR - 1) / kNR;
      for (int64_t k0 = 0; k0 < K; k0 += kKC) {
        const int64_t kc = std::min<int64_t>(kKC, K - k0);
        if (use_bf16) {
          const int64_t kp = (kc + 1) / 2;
          bufH.resize(static_cast<size_t>(strips * kp * 2 * kNR));
          pack_bf16(static_cast<const uint16_t*>(B), ldb, N, K, n0, nc, k0, kc, bufH.data());
        } else {
          bufF.resize(static_cast<size_t>(strips * kc * kNR));
          pack_f32(B, b_dtype, ldb, b_kmajor, N, n0, nc, k0, kc, bufF.data());
        }
        for (int64_t m0 = ms; m0 < me; m0 += kMR) {
          const int r = static_cast<int>(std::min<int64_t>(kMR, me - m0));
          for (int64_t s = 0; s < strips; ++s) {
            const int64_t ns = n0 + s * kNR;
            TileArgs ta{kc,
                        C + m0 * ldc + ns,
                        ldc,
                        static_cast<int>(std::min<int64_t>(kNR, N - ns)),
                        k0 == 0,
                        k0 + kc >= K,
                        bias ? bias + ns : nullptr,
                        store};
            if (use_bf16)
              tb[r - 1](A16.data() + m0 * Kp + k0, Kp, bufH.data() + s * ((kc + 1) / 2) * 2 * kNR, ta);
            else
              tf[r - 1](A + m0 * a_rs + k0 * a_cs, a_rs, a_cs, bufF.data() + s * kc * kNR, ta);
          }
        }
      }
    }
  });
}

}  // namespace mm3::kern::detail
