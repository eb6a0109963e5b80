// conv_direct.cpp — kern::ConvWeight and kern::conv_packed (kernels.h): direct Conv1d (stride 1) and
// ConvTranspose1d for the CPU backend, the vocoder's convolutions (MODEL.md §5.1).
//
// One formulation covers both. Every output is
//     y[co, o] = bias[co] + sum_ci sum_j  Wj[co, ci](o) * xs[ci, o + off_j]
// over a zero-padded "slab" xs of the input (Snake applied on the way in when fused):
// * Conv1d (stride 1, dilation d, padding p): xs[ci, c] = x[ci, t0 - p + c] for the task's first output
//   t0, tap j = k at off_j = k·d, and Wj[co, ci] = w[co, ci, k] for every o.
// * ConvTranspose1d (stride s, kernel K = J·s, padding p): output o receives the taps
//   k = ((o + p) mod s) + j·s, j < J, from input t = floor((o + p) / s) − j. So the slab is the input
//   repeated s times, xs[ci, c] = x[ci, floor((u + p) / s)] with u = t0 − (J−1)·s + c, tap j sits at
//   off_j = (J−1−j)·s, and its weight depends on the output's phase: lane l of a 16-output vector that
//   starts at a multiple of 16 has phase (l + p) mod s, the same in every vector when s divides 16.
//   The weight operand is then a pattern of s values broadcast over the 16 lanes. This is the
//   stride-phase decomposition without its strided stores, and without the 8× wasted work of a GEMM
//   over the zero-stuffed input.
// Register tile: kMR output channels × kNR = 64 consecutive outputs (4 zmm) = 24 accumulators; per (ci,
// tap) it loads 4 slab vectors and 6 weights (scalar broadcasts, or s-value patterns) for 24 FMAs.
// Packed weights [co block][ci][tap][kMR][phases] make the weight stream contiguous. Output channels
// past Cout are zero rows, computed and never stored.
// Blocking: tasks of (TC outputs, a group of output-channel blocks) go to whichever thread is free;
// inside a task the input channels go in slabs of KC rows, each packed once (Snake applied, zero
// padding, the s-fold repetition for ConvTranspose1d) into the thread's buffer, where it stays in L2
// while every channel block sweeps it with its KC·taps weights in L1. Partial sums are parked in a
// task buffer between slabs (exact); the last slab's pass adds the bias, rounds, adds the residual and
// stores. See conv_packed for the sizes.
// Numerics: each output is ONE sequential FMA chain over (ci, tap) in ascending order starting from 0;
// the bias is added after the chain, then one rounding to the store dtype. Blocking, the task split,
// the thread count and the ISA path (AVX-512, AVX2 or the portable loop, which uses std::fma) change no bit.
// For Conv1d this is the order of the im2col + GEMM path that preceded it (same bits).
#pragma GCC optimize("fp-contract=off")

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/aligned.h"
#include "kernels/cpu/conv_detail.h"
#include "kernels/cpu/gemm_nt.h"
#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"

namespace mm3::kern {

namespace {

#define MM3_AVX512_TARGET __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl")))

constexpr int kMR = 6;          // output channels per register tile
constexpr int kNV = 4;          // 16-float vectors of outputs per register tile
constexpr int kNR = 16 * kNV;   // outputs per register tile

struct Packed {
  int taps = 1;                // products per (output, input channel)
  int phases = 1;              // weight pattern length: 1 (Conv1d) or the stride (ConvTranspose1d)
  int64_t span = 0;            // slab columns the taps reach past a tile's last output
  std::vector<int64_t> off;    // [taps] slab column offset of tap j from the output's column
  int64_t cobs = 0;            // output-channel blocks, ceil(Cout / kMR)
  std::vector<float> w;        // [cobs][Cin][taps][kMR][phases]; rows >= Cout are zero
  std::vector<float> bias;     // [cobs·kMR] zero-padded; empty when the layer has no bias
  // A ConvTranspose1d shape the direct kernel does not take keeps its torch-layout weight [Cin, Cout,
  // K] here (and its bias, unpadded) and runs kern::conv_transpose1d's GEMM path.
  std::vector<float> raw;
};

// conv_gemm_bf16's form: the GEMM's A as bf16 bits — for a Conv1d the torch-layout weight
// [Cout][Cin·K], for a ConvTranspose1d its transpose [Cout·K][Cin] (row co·K + k holds w[:, co, k]) —
// and the bias; geometry from the ConvWeight.
struct GemmForm {
  std::vector<uint16_t> w;
  std::vector<float> bias;
};

// conv_dpbf16's form: the packed weight with input channels taken in pairs, each uint32 holding the
// bf16 bits of channel 2p (low half) and 2p+1 (high half; zero past Cin), [cobs][cin2][taps][kMR][phases]
// — the layout of Packed::w with Cin halved, so the tile's weight stream is contiguous as before.
struct PairForm {
  int64_t cin2 = 0;  // ceil(Cin / 2)
  std::vector<uint32_t> w;
};

int64_t floordiv(int64_t a, int64_t b);

// conv_packed on a conv_gemm_bf16 weight (store BF16). Returns false, having written nothing, when
// oneDNN declines the first GEMM (the caller then runs the direct kernel); a later chunk it declines
// (only the shorter last one could be) is an InternalError: y may already hold earlier chunks, and
// with an in-place residual a rerun would add the residual twice.
bool conv_gemm_run(const ThreadPool& pool, const ConvWeight& cw, const GemmForm& g, const float* x, int64_t L,
                   float* y, const ConvFusion& fusion) {
  const int64_t Cin = cw.in_channels(), Cout = cw.out_channels(), Lout = cw.out_len(L);
  const int K = cw.kernel_size(), pad = cw.pad(), dil = cw.dilation();
  const int64_t CK = Cin * K;
  // Column chunks: the im2col block (CK x n bf16) about 4 MiB, a multiple of 64 columns.
  const int64_t n = std::clamp<int64_t>((int64_t(1) << 21) / CK / 64 * 64, 64, std::max<int64_t>(64, Lout));
  thread_local aligned_vector<uint16_t> xa, col;
  thread_local aligned_vector<float> acc;
  if (xa.size() < static_cast<size_t>(Cin * L)) xa.resize(static_cast<size_t>(Cin * L));
  if (col.size() < static_cast<size_t>(CK * n)) col.resize(static_cast<size_t>(CK * n));
  if (acc.size() < static_cast<size_t>(Cout * n)) acc.resize(static_cast<size_t>(Cout * n));
  uint16_t *const xp = xa.data(), *const cp = col.data();
  // The input as bf16 (bf16-valued by the bf16 convention; Snake'd in bf16 first when fused).
  pool.parallel_for(Cin, [&](int64_t c0, int64_t c1) {
    thread_local aligned_vector<float> row;  // a worker's Snake row, kept (fresh pages cost faults)
    if (fusion.snake_alpha && row.size() < static_cast<size_t>(L)) row.resize(static_cast<size_t>(L));
    for (int64_t c = c0; c < c1; ++c) {
      const float* src = x + c * L;
      if (fusion.snake_alpha) {
        detail::snake_row(src, fusion.snake_alpha[c], detail::snake_inv(fusion.snake_alpha[c], DType::BF16),
                          row.data(), L, DType::BF16);
        src = row.data();
      }
      f32_to_bf16(src, xp + c * L, static_cast<size_t>(L));
    }
  });
  if (cw.transposed()) {
    // y[co, t] = sum over taps k ≡ (t + pad) mod s of Yc[co·K + k][l], l = (t + pad − k) / s, where
    // Yc = A·x is one GEMM per chunk of outputs over the input columns [la, lb] the chunk reads.
    const int s = cw.stride();
    const int64_t CoK = Cout * K;
    const int64_t nl_max = std::clamp<int64_t>(std::min<int64_t>((int64_t(1) << 20) / Cin, (int64_t(1) << 21) / CoK),
                                               16, std::max<int64_t>(16, L));
    const int64_t T = std::max<int64_t>(s, (nl_max - (K + s - 1) / s - 1) * s);  // outputs per chunk
    if (col.size() < static_cast<size_t>(Cin * nl_max)) col.resize(static_cast<size_t>(Cin * nl_max));
    if (acc.size() < static_cast<size_t>(CoK * nl_max)) acc.resize(static_cast<size_t>(CoK * nl_max));
    uint16_t* const bp = col.data();
    float* const yc = acc.data();
    for (int64_t t0 = 0; t0 < Lout; t0 += T) {
      const int64_t t1 = std::min(Lout, t0 + T);
      const int64_t la = std::max<int64_t>(0, floordiv(t0 + pad - (K - 1) + s - 1, s));
      const int64_t lb = std::min<int64_t>(L - 1, floordiv(t1 - 1 + pad, s));
      if (lb < la) {  // no input reaches these outputs: bias only
        pool.parallel_for(Cout, [&](int64_t c0, int64_t c1) {
          for (int64_t co = c0; co < c1; ++co)
            for (int64_t t = t0; t < t1; ++t) {
              float v = round_bf16(g.bias.empty() ? 0.f : g.bias[static_cast<size_t>(co)]);
              if (fusion.residual) v = round_bf16(fusion.residual[co * Lout + t] + v);
              y[co * Lout + t] = v;
            }
        });
        continue;
      }
      const int64_t nl = lb - la + 1;
      MM3_CHECK(nl <= nl_max, "conv_packed: transposed chunk of {} input columns > {}", nl, nl_max);
      pool.parallel_for(Cin, [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c)
          std::memcpy(bp + c * nl, xp + c * L + la, static_cast<size_t>(nl) * sizeof(uint16_t));
      });
      if (!detail::dnnl_matmul_bf16(pool, CoK, nl, Cin, g.w.data(), bp, yc)) {
        if (t0 == 0) return false;
        throw InternalError(fmt::format("conv_packed: oneDNN declined the bf16 GEMM [{}, {}] x [{}, {}] of a "
                                        "later chunk", CoK, Cin, Cin, nl));
      }
      pool.parallel_for(Cout, [&](int64_t c0, int64_t c1) {
        for (int64_t co = c0; co < c1; ++co) {
          const float b = g.bias.empty() ? 0.f : g.bias[static_cast<size_t>(co)];
          for (int64_t t = t0; t < t1; ++t) {
            float v = 0.f;
            for (int64_t k = (t + pad) % s; k < K; k += s) {  // taps in ascending k
              const int64_t l = (t + pad - k) / s;
              if (l >= la && l <= lb) v += yc[(co * K + k) * nl + (l - la)];
            }
            if (!g.bias.empty()) v = v + b;
            v = round_bf16(v);
            if (fusion.residual) v = round_bf16(fusion.residual[co * Lout + t] + v);
            y[co * Lout + t] = v;
          }
        }
      });
    }
    return true;
  }
  // A 1-tap layer's im2col is the input itself: one GEMM over the whole length.
  const bool direct_b = K == 1 && pad == 0;
  const int64_t step = direct_b ? Lout : n;
  if (direct_b && acc.size() < static_cast<size_t>(Cout * Lout)) acc.resize(static_cast<size_t>(Cout * Lout));
  float* const ap = acc.data();
  for (int64_t t0 = 0; t0 < Lout; t0 += step) {
    const int64_t nn = std::min(step, Lout - t0);
    // cols[(ci, k)][j] = x[ci][t0 + j + k·dil − pad], zero outside [0, L).
    if (!direct_b) {
      pool.parallel_for(CK, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t ci = r / K, k = r % K, s0 = t0 + k * dil - pad;
          uint16_t* dst = cp + r * nn;
          const int64_t a = std::clamp<int64_t>(-s0, 0, nn), b = std::clamp<int64_t>(L - s0, a, nn);
          std::fill(dst, dst + a, uint16_t(0));
          if (b > a) std::memcpy(dst + a, xp + ci * L + s0 + a, static_cast<size_t>(b - a) * sizeof(uint16_t));
          std::fill(dst + b, dst + nn, uint16_t(0));
        }
      });
    }
    if (!detail::dnnl_matmul_bf16(pool, Cout, nn, CK, g.w.data(), direct_b ? xp : cp, ap)) {
      if (t0 == 0) return false;
      throw InternalError(fmt::format("conv_packed: oneDNN declined the bf16 GEMM [{}, {}] x [{}, {}] of a "
                                      "later chunk", Cout, CK, CK, nn));
    }
    pool.parallel_for(Cout, [&](int64_t c0, int64_t c1) {
      for (int64_t co = c0; co < c1; ++co) {
        const float b = g.bias.empty() ? 0.f : g.bias[static_cast<size_t>(co)];
        const float* a = ap + co * nn;
        float* yo = y + co * Lout + t0;
        const float* res = fusion.residual ? fusion.residual + co * Lout + t0 : nullptr;
        int64_t j = 0;
#if defined(__AVX512F__)
        const __m512 bv = _mm512_set1_ps(b);
        for (; j + 16 <= nn; j += 16) {  // the scalar loop below, 16 at a time (same ops, same order)
          __m512 v = _mm512_loadu_ps(a + j);
          if (!g.bias.empty()) v = _mm512_add_ps(v, bv);
          v = detail::round_bf16_v(v);
          if (res) v = detail::round_bf16_v(_mm512_add_ps(_mm512_loadu_ps(res + j), v));
          _mm512_storeu_ps(yo + j, v);
        }
#endif
        for (; j < nn; ++j) {
          float v = a[j];
          if (!g.bias.empty()) v = v + b;
          v = round_bf16(v);
          if (res) v = round_bf16(res[j] + v);
          yo[j] = v;
        }
      }
    });
  }
  return true;
}

int64_t floordiv(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// ---- register tiles ----

struct TileIO {
  float* part;           // partial sums: row m at part + m·part_ld (tile origin), used between slabs
  int64_t part_ld;
  bool first, last;      // first / last input-channel slab
  float* y;              // row m of the tile at y + m·ldy
  const float* res;      // residual rows (same layout as y) or null
  int64_t ldy;
  const float* bias;     // kMR values or null
  int rows, cols;        // valid rows (<= kMR) and columns (<= kNR)
  bool bf;
};

template <int S>
MM3_AVX512_TARGET inline __m512 weight_512(const float* p) {
  if constexpr (S == 1) {
    return _mm512_set1_ps(*p);
  } else if constexpr (S == 2) {
    double d;
    std::memcpy(&d, p, sizeof d);
    return _mm512_castpd_ps(_mm512_set1_pd(d));
  } else if constexpr (S == 4) {
    return _mm512_broadcast_f32x4(_mm_loadu_ps(p));
  } else if constexpr (S == 8) {
    return _mm512_broadcast_f32x8(_mm256_loadu_ps(p));
  } else {
    static_assert(S == 16);
    return _mm512_loadu_ps(p);
  }
}

MM3_AVX512_TARGET inline __m512 round_bf16_512(__m512 v) {
  __m512i u = _mm512_castps_si512(v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  r = _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
  __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_blend_ps(nan, _mm512_castsi512_ps(r), _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000)));
}

MM3_AVX512_TARGET inline void tile_start(__m512 (&acc)[kMR][kNV], const TileIO& io) {
  if (io.first) {
    for (int m = 0; m < kMR; ++m)
      for (int v = 0; v < kNV; ++v) acc[m][v] = _mm512_setzero_ps();
  } else {
    for (int m = 0; m < kMR; ++m)
      for (int v = 0; v < kNV; ++v) acc[m][v] = _mm512_loadu_ps(io.part + m * io.part_ld + 16 * v);
  }
}

// Parks the partial sums (not the last slab), or adds the bias, rounds, adds the residual, rounds, stores.
MM3_AVX512_TARGET inline void tile_finish(__m512 (&acc)[kMR][kNV], const TileIO& io) {
  if (!io.last) {
    for (int m = 0; m < kMR; ++m)
      for (int v = 0; v < kNV; ++v) _mm512_storeu_ps(io.part + m * io.part_ld + 16 * v, acc[m][v]);
    return;
  }
  for (int m = 0; m < io.rows; ++m) {
    const __m512 b = io.bias ? _mm512_set1_ps(io.bias[m]) : _mm512_setzero_ps();
    for (int v = 0; v < kNV && 16 * v < io.cols; ++v) {
      const int n = io.cols - 16 * v;
      const __mmask16 mk = n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1u);
      __m512 val = acc[m][v];
      if (io.bias) val = _mm512_add_ps(val, b);
      if (io.bf) val = round_bf16_512(val);
      if (io.res) {
        val = _mm512_add_ps(_mm512_maskz_loadu_ps(mk, io.res + m * io.ldy + 16 * v), val);
        if (io.bf) val = round_bf16_512(val);
      }
      _mm512_mask_storeu_ps(io.y + m * io.ldy + 16 * v, mk, val);
    }
  }
}

template <int S>
MM3_AVX512_TARGET void tile_avx512(const float* xs, int64_t ld, const float* w, int64_t kc, int taps,
                                   const int64_t* off, const TileIO& io) {
  __m512 acc[kMR][kNV];
  tile_start(acc, io);
  for (int64_t c = 0; c < kc; ++c) {
    const float* xr = xs + c * ld;
    for (int j = 0; j < taps; ++j) {
      const float* xp = xr + off[j];
      __m512 xv[kNV];
      for (int v = 0; v < kNV; ++v) xv[v] = _mm512_loadu_ps(xp + 16 * v);
      for (int m = 0; m < kMR; ++m) {
        const __m512 wv = weight_512<S>(w + m * S);
        for (int v = 0; v < kNV; ++v) acc[m][v] = _mm512_fmadd_ps(wv, xv[v], acc[m][v]);
      }
      w += kMR * S;
    }
  }
  tile_finish(acc, io);
}

// The tile on channel pairs (conv_dpbf16): slab and weight elements are uint32 pairs of bf16 (channels
// 2p, 2p+1), each vdpbf16ps adds both products of a pair to the fp32 accumulator (the instruction's own
// order and rounding; denormal inputs and results flush to zero). The weight patterns broadcast as
// 32-bit values, exactly as the fp32 tile broadcasts its floats.
#define MM3_DPBF16_TARGET __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx512bf16")))
template <int S>
MM3_DPBF16_TARGET void tile_dp_avx512(const uint32_t* xs, int64_t ld, const uint32_t* w, int64_t kcp, int taps,
                                      const int64_t* off, const TileIO& io) {
  __m512 acc[kMR][kNV];
  tile_start(acc, io);
  for (int64_t c = 0; c < kcp; ++c) {
    const uint32_t* xr = xs + c * ld;
    for (int j = 0; j < taps; ++j) {
      const uint32_t* xp = xr + off[j];
      __m512bh xv[kNV];
      for (int v = 0; v < kNV; ++v) xv[v] = (__m512bh)_mm512_loadu_si512(xp + 16 * v);
      for (int m = 0; m < kMR; ++m) {
        const __m512bh wv = (__m512bh)_mm512_castps_si512(weight_512<S>(reinterpret_cast<const float*>(w + m * S)));
        for (int v = 0; v < kNV; ++v) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], wv, xv[v]);
      }
      w += kMR * S;
    }
  }
  tile_finish(acc, io);
}

using TileDpFn = void (*)(const uint32_t*, int64_t, const uint32_t*, int64_t, int, const int64_t*, const TileIO&);

TileDpFn tile_dp_for(int phases) {
  switch (phases) {
    case 1: return &tile_dp_avx512<1>;
    case 2: return &tile_dp_avx512<2>;
    case 4: return &tile_dp_avx512<4>;
    case 8: return &tile_dp_avx512<8>;
    case 16: return &tile_dp_avx512<16>;
    default: break;
  }
  throw InternalError(fmt::format("conv_packed: no bf16-pair tile for {} weight phases", phases));
}

// row[c] = bf16(a[c]) | bf16(b[c]) << 16 for c < n (round to nearest even, NaN -> 0x7FC0).
MM3_AVX512_TARGET void pair_rows_avx512(const float* a, const float* b, uint32_t* row, int64_t n) {
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t c = 0; c < n; c += 16) {
    const int64_t left = n - c;
    const __mmask16 mk = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1u);
    const __m512i lo = _mm512_srli_epi32(_mm512_castps_si512(round_bf16_512(_mm512_maskz_loadu_ps(mk, a + c))), 16);
    const __m512i up = _mm512_and_si512(_mm512_castps_si512(round_bf16_512(_mm512_maskz_loadu_ps(mk, b + c))), hi);
    _mm512_mask_storeu_epi32(row + c, mk, _mm512_or_si512(lo, up));
  }
}

// The same tile without AVX-512: identical chains (std::fma is the fused multiply-add), lane l of a
// pattern weight is w[m·S + l mod S].
template <int S>
void tile_portable(const float* xs, int64_t ld, const float* w, int64_t kc, int taps, const int64_t* off,
                   const TileIO& io) {
  float acc[kMR][kNR];
  for (int m = 0; m < kMR; ++m)
    for (int l = 0; l < kNR; ++l) acc[m][l] = io.first ? 0.f : io.part[m * io.part_ld + l];
  for (int64_t c = 0; c < kc; ++c) {
    const float* xr = xs + c * ld;
    for (int j = 0; j < taps; ++j) {
      const float* xp = xr + off[j];
      for (int m = 0; m < kMR; ++m)
        for (int l = 0; l < kNR; ++l) acc[m][l] = std::fma(w[m * S + l % S], xp[l], acc[m][l]);
      w += kMR * S;
    }
  }
  if (!io.last) {
    for (int m = 0; m < kMR; ++m)
      for (int l = 0; l < kNR; ++l) io.part[m * io.part_ld + l] = acc[m][l];
    return;
  }
  const DType st = io.bf ? DType::BF16 : DType::F32;
  for (int m = 0; m < io.rows; ++m)
    for (int l = 0; l < io.cols; ++l) {
      float v = acc[m][l];
      if (io.bias) v = v + io.bias[m];
      v = round_store(v, st);
      if (io.res) v = round_store(io.res[m * io.ldy + l] + v, st);
      io.y[m * io.ldy + l] = v;
    }
}

// The tile with AVX2 (CPUs without AVX-512): 16 ymm registers hold kMR x 16 outputs (12 accumulators),
// so the 64 outputs go as 4 passes of 16 over the same (ci, tap) stream (weights and slab rows stay in
// L1). Same chains as the other tiles, so the same bits. A pattern weight covers 8 lanes: lane l of a
// 16-output vector uses w[m·S + l mod S], so for S <= 8 both halves take the same pattern and for
// S = 16 the upper half takes w[m·16 + 8..15].
#define MM3_CONV_AVX2 __attribute__((target("avx2,fma")))

template <int S>
MM3_CONV_AVX2 inline __m256 weight_256(const float* p) {
  if constexpr (S == 1) {
    return _mm256_broadcast_ss(p);
  } else if constexpr (S == 2) {
    double d;
    std::memcpy(&d, p, sizeof d);
    return _mm256_castpd_ps(_mm256_set1_pd(d));
  } else if constexpr (S == 4) {
    return _mm256_broadcast_ps(reinterpret_cast<const __m128*>(p));
  } else {
    static_assert(S == 8 || S == 16);
    return _mm256_loadu_ps(p);
  }
}

MM3_CONV_AVX2 inline __m256i lanes8_conv(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// The last slab's epilogue of 8 outputs (n valid): bias, rounding, residual, rounding, store.
MM3_CONV_AVX2 inline __attribute__((always_inline)) void finish8_avx2(__m256 val, __m256 b, const TileIO& io, float* yp,
                                                                      const float* rp, int n) {
  if (n <= 0) return;
  const __m256i mk = lanes8_conv(n);
  if (io.bias) val = _mm256_add_ps(val, b);
  if (io.bf) val = detail::round_bf16_v8(val);
  if (rp) {
    val = _mm256_add_ps(n >= 8 ? _mm256_loadu_ps(rp) : _mm256_maskload_ps(rp, mk), val);
    if (io.bf) val = detail::round_bf16_v8(val);
  }
  if (n >= 8)  // VMASKMOVPS stores are microcoded on AMD: only for a tail
    _mm256_storeu_ps(yp, val);
  else
    _mm256_maskstore_ps(yp, mk, val);
}

constexpr int64_t kPfRows = 8;
constexpr int64_t kTcMaxAvx2 = 512;
constexpr int64_t kOneTapSlabBytes = 384 << 10;

template <int S>
MM3_CONV_AVX2 void tile_avx2(const float* xs, int64_t ld, const float* w0, int64_t kc, int taps, const int64_t* off,
                             const TileIO& io) {
  for (int q = 0; q < kNV; ++q) {
    const int c0 = 16 * q;
    if (io.last && c0 >= io.cols) break;  // nothing of this pass is stored
    __m256 a0[kMR], a1[kMR];
    if (io.first) {
#pragma GCC unroll 6
      for (int m = 0; m < kMR; ++m) a0[m] = a1[m] = _mm256_setzero_ps();
    } else {
#pragma GCC unroll 6
      for (int m = 0; m < kMR; ++m) {
        a0[m] = _mm256_loadu_ps(io.part + m * io.part_ld + c0);
        a1[m] = _mm256_loadu_ps(io.part + m * io.part_ld + c0 + 8);
      }
    }
    const float* w = w0;
    for (int64_t c = 0; c < kc; ++c) {
      const float* xr = xs + c * ld + c0;
      // The slab lives in L2 and each pass reads 64 B of every row: fetch a few rows ahead (prefetches
      // change no value).
      _mm_prefetch(reinterpret_cast<const char*>(xr + kPfRows * ld + off[0]), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(xr + kPfRows * ld + off[taps - 1] + 15), _MM_HINT_T0);
      for (int j = 0; j < taps; ++j) {
        const __m256 x0 = _mm256_loadu_ps(xr + off[j]), x1 = _mm256_loadu_ps(xr + off[j] + 8);
#pragma GCC unroll 6
        for (int m = 0; m < kMR; ++m) {
          const __m256 wl = weight_256<S>(w + m * S);
          const __m256 wh = S == 16 ? weight_256<S>(w + m * S + 8) : wl;
          a0[m] = _mm256_fmadd_ps(wl, x0, a0[m]);
          a1[m] = _mm256_fmadd_ps(wh, x1, a1[m]);
        }
        w += kMR * S;
      }
    }
    if (!io.last) {
#pragma GCC unroll 6
      for (int m = 0; m < kMR; ++m) {
        _mm256_storeu_ps(io.part + m * io.part_ld + c0, a0[m]);
        _mm256_storeu_ps(io.part + m * io.part_ld + c0 + 8, a1[m]);
      }
      continue;
    }
    // Every loop over m unrolled with constant indices: with a runtime bound or index here GCC kept
    // a0 / a1 on the stack and stored them on every (ci, tap) of the loop above (perf annotate).
#pragma GCC unroll 6
    for (int m = 0; m < kMR; ++m) {
      if (m >= io.rows) break;
      const __m256 b = _mm256_set1_ps(io.bias ? io.bias[m] : 0.f);
      finish8_avx2(a0[m], b, io, io.y + m * io.ldy + c0, io.res ? io.res + m * io.ldy + c0 : nullptr, io.cols - c0);
      finish8_avx2(a1[m], b, io, io.y + m * io.ldy + c0 + 8, io.res ? io.res + m * io.ldy + c0 + 8 : nullptr,
                   io.cols - c0 - 8);
    }
  }
}

using TileFn = void (*)(const float*, int64_t, const float*, int64_t, int, const int64_t*, const TileIO&);

template <int S>
TileFn pick_tile() {
  return detail::cpu_has_avx512() ? &tile_avx512<S> : detail::cpu_has_avx2_fma() ? &tile_avx2<S> : &tile_portable<S>;
}

TileFn tile_for(int phases) {
  switch (phases) {
    case 1: return pick_tile<1>();
    case 2: return pick_tile<2>();
    case 4: return pick_tile<4>();
    case 8: return pick_tile<8>();
    case 16: return pick_tile<16>();
    default: break;
  }
  throw InternalError(fmt::format("conv_packed: no tile for {} weight phases", phases));
}

// ---- ConvTranspose1d slab rows ----

// row[c] = line[(c + r0) / s] for c < n (0 <= r0 < s, s divides 16): each value repeated s times.
// Vectors of 16 columns start at multiples of 16, so their source index is c/s + (l + r0)/s.
MM3_AVX512_TARGET void expand_row_avx512(const float* line, float* row, int64_t n, int s, int r0) {
  alignas(64) int32_t idx[16];
  for (int l = 0; l < 16; ++l) idx[l] = (l + r0) / s;
  const __m512i iv = _mm512_load_si512(idx);
  for (int64_t c = 0; c < n; c += 16) {
    const int64_t left = n - c;
    const __mmask16 mk = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1u);
    _mm512_mask_storeu_ps(row + c, mk, _mm512_permutexvar_ps(iv, _mm512_loadu_ps(line + c / s)));
  }
}

// The same with 8 columns a vector (s divides 8): lane l of the vector at c reads c/s + (l + r0)/s.
// Reads at most line[(n - 1 + 7) / s + 7], as the AVX-512 twin reads past its last source value.
__attribute__((target("avx2,fma"))) void expand_row_avx2(const float* line, float* row, int64_t n, int s, int r0) {
  alignas(32) int32_t idx[8];
  for (int l = 0; l < 8; ++l) idx[l] = (l + r0) / s;
  const __m256i iv = _mm256_load_si256(reinterpret_cast<const __m256i*>(idx));
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) _mm256_storeu_ps(row + c, _mm256_permutevar8x32_ps(_mm256_loadu_ps(line + c / s), iv));
  for (; c < n; ++c) row[c] = line[(c + r0) / s];
}

void expand_row(const float* line, float* row, int64_t n, int s, int r0) {
  if (detail::cpu_has_avx512()) {
    expand_row_avx512(line, row, n, s, r0);
    return;
  }
  if (8 % s == 0 && detail::cpu_has_avx2_fma()) {
    expand_row_avx2(line, row, n, s, r0);
    return;
  }
  for (int64_t c = 0; c < n; ++c) row[c] = line[(c + r0) / s];
}

// ---- packing ----

std::shared_ptr<Packed> new_packed(int taps, int phases, int64_t Cin, int64_t Cout, const float* bias) {
  auto p = std::make_shared<Packed>();
  p->taps = taps;
  p->phases = phases;
  p->cobs = (Cout + kMR - 1) / kMR;
  p->w.assign(static_cast<size_t>(p->cobs * Cin * taps * kMR * phases), 0.f);
  if (bias) {
    p->bias.assign(static_cast<size_t>(p->cobs * kMR), 0.f);
    std::copy(bias, bias + Cout, p->bias.begin());
  }
  return p;
}

}  // namespace

ConvWeight ConvWeight::conv1d(const float* w, const float* bias, int64_t Cout, int64_t Cin, int K, int pad,
                              int dilation) {
  MM3_CHECK(Cin > 0 && Cout > 0 && K > 0 && pad >= 0 && dilation > 0,
            "ConvWeight::conv1d: Cin={} Cout={} K={} pad={} dilation={}", Cin, Cout, K, pad, dilation);
  auto p = new_packed(K, 1, Cin, Cout, bias);
  for (int k = 0; k < K; ++k) p->off.push_back(int64_t(k) * dilation);
  p->span = int64_t(K - 1) * dilation;
  for (int64_t co = 0; co < Cout; ++co)
    for (int64_t ci = 0; ci < Cin; ++ci)
      for (int k = 0; k < K; ++k)
        p->w[static_cast<size_t>((((co / kMR) * Cin + ci) * K + k) * kMR + co % kMR)] = w[(co * Cin + ci) * K + k];
  ConvWeight r;
  r.transposed_ = false;
  r.cin_ = Cin;
  r.cout_ = Cout;
  r.k_ = K;
  r.pad_ = pad;
  r.dilation_ = dilation;
  r.packed = std::move(p);
  return r;
}

ConvWeight ConvWeight::conv_transpose1d(const float* w, const float* bias, int64_t Cin, int64_t Cout, int K,
                                        int stride, int pad, int output_padding) {
  MM3_CHECK(Cin > 0 && Cout > 0 && K > 0 && stride > 0 && pad >= 0 && output_padding >= 0,
            "ConvWeight::conv_transpose1d: Cin={} Cout={} K={} stride={} pad={} output_padding={}", Cin, Cout, K,
            stride, pad, output_padding);
  ConvWeight r;
  r.transposed_ = true;
  r.cin_ = Cin;
  r.cout_ = Cout;
  r.k_ = K;
  r.stride_ = stride;
  r.pad_ = pad;
  r.output_padding_ = output_padding;
  if (!transpose_packable(K, stride)) {
    auto p = std::make_shared<Packed>();
    p->raw.assign(w, w + Cin * Cout * K);
    if (bias) p->bias.assign(bias, bias + Cout);
    r.packed = std::move(p);
    return r;
  }
  const int s = stride, J = K / s;
  auto p = new_packed(J, s, Cin, Cout, bias);
  for (int j = 0; j < J; ++j) p->off.push_back(int64_t(J - 1 - j) * s);
  p->span = int64_t(J - 1) * s;
  for (int64_t co = 0; co < Cout; ++co)
    for (int64_t ci = 0; ci < Cin; ++ci)
      for (int j = 0; j < J; ++j)
        for (int l = 0; l < s; ++l) {
          const int k = (l + pad) % s + j * s;  // lane l's phase, tap j
          p->w[static_cast<size_t>(((((co / kMR) * Cin + ci) * J + j) * kMR + co % kMR) * s + l)] =
              w[(ci * Cout + co) * K + k];
        }
  r.packed = std::move(p);
  return r;
}

const float* detail::conv_bias(const ConvWeight& w) {
  const Packed& P = *static_cast<const Packed*>(w.packed.get());
  return P.bias.empty() ? nullptr : P.bias.data();
}

void detail::conv_unpack(const ConvWeight& w, std::vector<float>& weight, std::vector<float>& bias) {
  MM3_CHECK(!w.empty(), "conv_unpack: an empty weight");
  const Packed& P = *static_cast<const Packed*>(w.packed.get());
  const int64_t Cin = w.in_channels(), Cout = w.out_channels();
  const int K = w.kernel_size();
  weight.resize(static_cast<size_t>(Cout * Cin * K));
  bias.assign(P.bias.begin(), P.bias.empty() ? P.bias.begin() : P.bias.begin() + Cout);
  if (!w.transposed()) {
    for (int64_t co = 0; co < Cout; ++co)  // undo conv1d's packing above
      for (int64_t ci = 0; ci < Cin; ++ci)
        for (int k = 0; k < K; ++k)
          weight[static_cast<size_t>((co * Cin + ci) * K + k)] =
              P.w[static_cast<size_t>((((co / kMR) * Cin + ci) * K + k) * kMR + co % kMR)];
    return;
  }
  if (!P.raw.empty()) {
    weight = P.raw;
    return;
  }
  const int s = w.stride(), J = K / s, pad = w.pad();
  for (int64_t co = 0; co < Cout; ++co)  // undo conv_transpose1d's packing above
    for (int64_t ci = 0; ci < Cin; ++ci)
      for (int j = 0; j < J; ++j)
        for (int l = 0; l < s; ++l)
          weight[static_cast<size_t>((ci * Cout + co) * K + (l + pad) % s + j * s)] =
              P.w[static_cast<size_t>(((((co / kMR) * Cin + ci) * J + j) * kMR + co % kMR) * s + l)];
}

namespace {

// conv_onetap_strip's AVX-512 body for one block of kMR output channels (rows <= kMR valid) and a full
// strip of kNR columns: each chunk's chains from 0 in the 24 accumulators, then stored (first chunk)
// or added to v's values (later chunks) — the tile path's sums, in its order, without a tile call,
// prologue and masked epilogue per chunk.
MM3_AVX512_TARGET void onetap_chunks_avx512(const float* u, int64_t ldu, const float* w, int64_t Cin, int64_t chunk,
                                            int rows, float* v, int64_t ldv) {
  for (int64_t c0 = 0; c0 < Cin; c0 += chunk) {
    __m512 acc[kMR][kNV];
#pragma GCC unroll 6
    for (int m = 0; m < kMR; ++m)
#pragma GCC unroll 4
      for (int q = 0; q < kNV; ++q) acc[m][q] = _mm512_setzero_ps();
    const int64_t c1 = std::min(Cin, c0 + chunk);
    for (int64_t c = c0; c < c1; ++c) {
      __m512 x[kNV];
#pragma GCC unroll 4
      for (int q = 0; q < kNV; ++q) x[q] = _mm512_loadu_ps(u + c * ldu + 16 * q);
#pragma GCC unroll 6
      for (int m = 0; m < kMR; ++m) {
        const __m512 wv = _mm512_set1_ps(w[c * kMR + m]);
#pragma GCC unroll 4
        for (int q = 0; q < kNV; ++q) acc[m][q] = _mm512_fmadd_ps(wv, x[q], acc[m][q]);
      }
    }
    for (int m = 0; m < rows; ++m)
#pragma GCC unroll 4
      for (int q = 0; q < kNV; ++q) {
        float* p = v + m * ldv + 16 * q;
        _mm512_storeu_ps(p, c0 == 0 ? acc[m][q] : _mm512_add_ps(_mm512_loadu_ps(p), acc[m][q]));
      }
  }
}

// Its AVX2 body (CPUs without AVX-512): the same chains and order, the strip in four passes of 16 columns
// (12 accumulators; the chunk's weights and x rows stay in L1 across the passes). The direct kernel's
// tile_avx2<1>, which ran these before (the thirty-sixth session), spends a tap loop, two prefetches and
// a residual epilogue on every 12 FMAs of a one-tap product.
MM3_CONV_AVX2 void onetap_chunks_avx2(const float* u, int64_t ldu, const float* w, int64_t Cin, int64_t chunk, int rows,
                                      float* v, int64_t ldv) {
  for (int64_t c0 = 0; c0 < Cin; c0 += chunk) {
    const int64_t c1 = std::min(Cin, c0 + chunk);
    for (int q = 0; q < kNV; ++q) {
      __m256 a0[kMR], a1[kMR];
#pragma GCC unroll 6
      for (int m = 0; m < kMR; ++m) a0[m] = a1[m] = _mm256_setzero_ps();
      const float* x = u + 16 * q;
      for (int64_t c = c0; c < c1; ++c) {
        const __m256 x0 = _mm256_loadu_ps(x + c * ldu), x1 = _mm256_loadu_ps(x + c * ldu + 8);
#pragma GCC unroll 6
        for (int m = 0; m < kMR; ++m) {
          const __m256 wv = _mm256_broadcast_ss(w + c * kMR + m);
          a0[m] = _mm256_fmadd_ps(wv, x0, a0[m]);
          a1[m] = _mm256_fmadd_ps(wv, x1, a1[m]);
        }
      }
#pragma GCC unroll 6
      for (int m = 0; m < kMR; ++m) {
        if (m >= rows) break;
        float* p = v + m * ldv + 16 * q;
        _mm256_storeu_ps(p, c0 == 0 ? a0[m] : _mm256_add_ps(_mm256_loadu_ps(p), a0[m]));
        _mm256_storeu_ps(p + 8, c0 == 0 ? a1[m] : _mm256_add_ps(_mm256_loadu_ps(p + 8), a1[m]));
      }
    }
  }
}

}  // namespace

void detail::conv_onetap_strip(const ConvWeight& w, const float* u, int64_t ldu, int cols, float* v, int64_t ldv,
                               int64_t chunk) {
  const Packed& P = *static_cast<const Packed*>(w.packed.get());
  MM3_CHECK(!w.transposed() && P.taps == 1 && P.phases == 1 && P.raw.empty() && cols > 0 && cols <= kNR && chunk > 0,
            "conv_onetap_strip: not a one-tap Conv1d, or cols={} chunk={}", cols, chunk);
  const int64_t Cin = w.in_channels(), Cout = w.out_channels();
  if (cols == kNR && detail::cpu_has_avx512()) {
    for (int64_t cob = 0; cob < P.cobs; ++cob)
      onetap_chunks_avx512(u, ldu, P.w.data() + cob * Cin * kMR, Cin, chunk,
                           static_cast<int>(std::min<int64_t>(kMR, Cout - cob * kMR)), v + cob * kMR * ldv, ldv);
    return;
  }
  if (cols == kNR && detail::cpu_has_avx2_fma()) {
    for (int64_t cob = 0; cob < P.cobs; ++cob)
      onetap_chunks_avx2(u, ldu, P.w.data() + cob * Cin * kMR, Cin, chunk,
                         static_cast<int>(std::min<int64_t>(kMR, Cout - cob * kMR)), v + cob * kMR * ldv, ldv);
    return;
  }
  static const int64_t off0 = 0;
  const TileFn tile = tile_for(1);
  TileIO io{};
  io.first = io.last = true;
  io.ldy = ldv;
  io.cols = cols;
  for (int64_t cob = 0; cob < P.cobs; ++cob) {
    io.rows = static_cast<int>(std::min<int64_t>(kMR, Cout - cob * kMR));
    io.y = v + cob * kMR * ldv;
    for (int64_t c0 = 0; c0 < Cin; c0 += chunk) {
      io.res = c0 == 0 ? nullptr : io.y;  // chunks after the first: v = v + chunk's chain
      tile(u + c0 * ldu, ldu, P.w.data() + (cob * Cin + c0) * kMR, std::min(chunk, Cin - c0), 1, &off0, io);
    }
  }
}

ConvWeight ConvWeight::rounded(DType store) const {
  MM3_CHECK(packed, "ConvWeight::rounded on an empty weight");
  auto p = std::make_shared<Packed>(*static_cast<const Packed*>(packed.get()));
  round_to_store(p->w.data(), p->w.size(), store);  // packing only moves values (and adds zeros)
  round_to_store(p->bias.data(), p->bias.size(), store);
  round_to_store(p->raw.data(), p->raw.size(), store);
  ConvWeight r = *this;
  r.packed = std::move(p);
  r.winograd.reset();  // its transformed values were not rounded
  return r;
}

ConvWeight conv_gemm_bf16(const ConvWeight& w) {
  MM3_CHECK(!w.empty(), "conv_gemm_bf16 on an empty weight");
  if (!detail::dnnl_bf16_available()) return w;
  const Packed& P = *static_cast<const Packed*>(w.packed.get());
  const int64_t Cin = w.in_channels(), Cout = w.out_channels();
  const int K = w.kernel_size();
  if (w.transposed() && (!P.raw.empty() || w.output_padding() != 0)) return w;
  auto g = std::make_shared<GemmForm>();
  g->w.resize(static_cast<size_t>(Cout * Cin * K));
  if (w.transposed()) {  // undo the packing of conv_transpose1d above into [Cout·K][Cin]
    const int s = w.stride(), J = K / s, pad = w.pad();
    for (int64_t co = 0; co < Cout; ++co)
      for (int64_t ci = 0; ci < Cin; ++ci)
        for (int j = 0; j < J; ++j)
          for (int l = 0; l < s; ++l) {
            const int k = (l + pad) % s + j * s;
            g->w[static_cast<size_t>((co * K + k) * Cin + ci)] = f32_to_bf16_bits(
                P.w[static_cast<size_t>(((((co / kMR) * Cin + ci) * J + j) * kMR + co % kMR) * s + l)]);
          }
  } else {
    std::vector<float> wt, unused;
    detail::conv_unpack(w, wt, unused);
    for (size_t i = 0; i < wt.size(); ++i) g->w[i] = f32_to_bf16_bits(wt[i]);
  }
  if (!P.bias.empty()) g->bias.assign(P.bias.begin(), P.bias.begin() + Cout);
  ConvWeight r = w;
  r.gemm = std::move(g);
  return r;
}

namespace {

// The direct kernel's task loop (see conv_packed): fp32 slabs and tile, or (Pairs) bf16 channel-pair
// slabs and the vdpbf16ps tile of a conv_dpbf16 weight.
template <bool Pairs>
void direct_run(const ThreadPool& pool, const ConvWeight& cw, const Packed& P, const PairForm* pf, const float* x,
                int64_t L, float* y, DType store, const ConvFusion& fusion) {
  using Elem = std::conditional_t<Pairs, uint32_t, float>;
  const int64_t Cin = cw.in_channels(), Cout = cw.out_channels(), Lout = cw.out_len(L);
  const bool tr = cw.transposed();
  // Geometry of the slab's first column relative to a task's first output t0 (see the file comment).
  const int stride = cw.stride(), pad = cw.pad(), J = P.taps;
  const TileFn tile = Pairs ? nullptr : tile_for(P.phases);
  const TileDpFn tile_dp = Pairs ? tile_dp_for(P.phases) : nullptr;
  const bool bf = store == DType::BF16;

  // Blocking (numerics do not depend on any of it). Tasks are (chunk of TC outputs, group of G
  // output-channel blocks), taken from a counter by whichever thread is free: one synchronisation per
  // call, so a thread the OS preempts (a shared machine) delays nobody until the end. Inside a task
  // the input channels go in slabs of KC rows; each slab is packed once (Snake applied, zero padding,
  // the s-fold repetition for ConvTranspose1d) into the thread's buffer, stays in L2, and every channel
  // block of the group sweeps it with its KC·taps weights in L1. Partial sums wait in the thread's
  // `part` between slabs. Each weight is read once per chunk (4/TC bytes per FMA) and each input value
  // (and its Snake) is computed once per task.
  const int workers = pool.size();
  // Sizes measured on the vocoder's layers (Zen 5, 48 KiB L1, 1 MiB L2): multi-tap layers take slabs
  // of 128 channels over chunks of up to 1024 outputs (~550 KiB); one-tap layers (few FMAs per slab
  // value) take every channel (up to 768), which avoids partial sums, over 256+ outputs (below).
  // The bf16-pair slab holds two channels per row (half the bytes): slabs twice as deep.
  // The AVX2 tile reads a slab's weights once per 16 outputs (4 passes), so they must stay in L1
  // (32 KiB on Zen 3): pattern weights (ConvTranspose1d, S values per product) take shallower slabs.
  const int64_t kc_multi = detail::cpu_has_avx512() ? 128 : std::max<int64_t>(16, 128 / std::max(1, P.phases / 2));
  const int64_t KC = std::min<int64_t>(Cin, (P.taps == 1 ? 768 : kc_multi) * (Pairs ? 2 : 1));
  const int64_t KR = Pairs ? (KC + 1) / 2 : KC;  // slab rows
  const int64_t want = 8 * int64_t(workers);  // tasks, for balance
  // Without AVX-512 (Zen 3: 512 KiB L2) the multi-tap chunks stop at 512 outputs (slab ~290 KiB).
  // One-tap layers: chunks as long as a ~384 KiB slab allows (256-4096 outputs): their narrow layers
  // (96-192 channels) read each input and residual row in longer runs, which the hardware prefetchers
  // follow (vocoder block 3's conv2 + Snake + residual, 2 threads, 3 interleaved rounds: bf16
  // 36.9-37.7 -> 34.1-34.4 ms, block 2's 48.7-50.3 -> 45.7-47.2 ms; fp32 alike). Wide ones keep 256,
  // and so does the AVX2 path (not measured there; Zen 3's L2 is half the size).
  const int64_t tc_one_tap =
      detail::cpu_has_avx512()
          ? std::clamp<int64_t>(kOneTapSlabBytes / (KR * int64_t(sizeof(Elem))) / kNR * kNR, 256, 4096)
          : 256;
  const int64_t tc_max = P.taps == 1 ? tc_one_tap : detail::cpu_has_avx512() ? 1024 : kTcMaxAvx2;
  const int64_t TC = std::clamp<int64_t>(((Lout + want - 1) / want + kNR - 1) / kNR * kNR, 256, tc_max);
  const int64_t n_tc = (Lout + TC - 1) / TC;
  int64_t n_cg = 1;  // split the channels only when the chunks are too few (short inputs)
  while (n_tc * n_cg < want && (P.cobs + 2 * n_cg - 1) / (2 * n_cg) >= 8) n_cg *= 2;
  const int64_t G = (P.cobs + n_cg - 1) / n_cg;
  const int64_t n_tasks = n_tc * n_cg;
  int64_t ld = (TC + P.span + 15) / 16 * 16;  // slab row stride
  if (ld % 1024 == 0) ld += 16;               // no 4 KiB-aliased rows
  const bool multi = Cin > KC;                // partial sums between slabs

  std::vector<float> inv;  // Snake reciprocals, once per call
  if (fusion.snake_alpha) {
    inv.resize(static_cast<size_t>(Cin));
    for (int64_t c = 0; c < Cin; ++c) inv[static_cast<size_t>(c)] = detail::snake_inv(fusion.snake_alpha[c], store);
  }

  std::atomic<int64_t> next{0};
  pool.parallel_for(
      std::min<int64_t>(workers, n_tasks),
      [&](int64_t, int64_t) {
        // Scratch, not zeroed (no page is read before this task writes it): the slab's columns are all
        // written up to the last one a tile reads, partial sums are read only after a slab stored them,
        // and `line` is cleared before each use.
        const size_t line_n = tr ? static_cast<size_t>((TC + P.span + 2 * stride) / stride + 16) : 0;
        // On cache lines (core/aligned.h): the tiles load and store whole vectors of them.
        const aligned_buffer<Elem> slab_buf = make_aligned_buffer<Elem>(static_cast<size_t>(KR * ld));
        const aligned_buffer<float> pair_buf =
            Pairs ? make_aligned_buffer<float>(static_cast<size_t>(2 * ld)) : nullptr;
        const aligned_buffer<float> part_buf =
            multi ? make_aligned_buffer<float>(static_cast<size_t>(G * kMR * TC)) : nullptr;
        const aligned_buffer<float> line_buf = tr ? make_aligned_buffer<float>(line_n) : nullptr;
        Elem* const slab = slab_buf.get();
        float* const part = part_buf.get();
        float* const line = line_buf.get();
        TileIO io{};
        io.part_ld = TC;
        io.ldy = Lout;
        io.bf = bf;
        for (int64_t task; (task = next.fetch_add(1)) < n_tasks;) {
          const int64_t tc = task % n_tc, cg = task / n_tc;
          const int64_t t0 = tc * TC, nt = std::min(TC, Lout - t0), ntp = (nt + kNR - 1) / kNR * kNR;
          const int64_t cb0 = cg * G, cb1 = std::min(P.cobs, cb0 + G);
          const int64_t wcols = ntp + P.span;  // slab columns this task reads
          for (int64_t c0 = 0; c0 < Cin; c0 += KC) {
            const int64_t kc = std::min(KC, Cin - c0);
            // The slab: rows c0 .. c0+kc of the (Snake'd) input around [t0, t0 + ntp) (channel pairs
            // per row for the bf16-pair tile; a pair's missing second channel is a zero row).
            auto fill = [&](int64_t ci, float* row) {
              if (ci >= Cin) {
                std::fill(row, row + wcols, 0.f);
                return;
              }
              const float* xr = x + ci * L;
              auto act = [&](const float* src, float* dst, int64_t n) {
                if (fusion.snake_alpha)
                  detail::snake_row(src, fusion.snake_alpha[ci], inv[static_cast<size_t>(ci)], dst, n, store);
                else
                  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
              };
              if (!tr) {
                const int64_t b0 = t0 - pad;  // input index of slab column 0
                const int64_t a = std::clamp<int64_t>(-b0, 0, wcols), b = std::clamp<int64_t>(L - b0, a, wcols);
                std::fill(row, row + a, 0.f);
                if (b > a) act(xr + b0 + a, row + a, b - a);
                std::fill(row + b, row + wcols, 0.f);
              } else {
                // Slab column cc holds x[floor((u0 + cc + pad) / s)], u0 = t0 − (J−1)·s: line[q − qa] holds
                // x[q] (zero outside [0, L)) and column cc reads line[(cc + r0) / s], r0 = u0 + pad − qa·s.
                const int64_t u0 = t0 - int64_t(J - 1) * stride;
                const int64_t qa = floordiv(u0 + pad, stride), qb = floordiv(u0 + wcols - 1 + pad, stride);
                const int64_t va = std::max<int64_t>(qa, 0), vb = std::min<int64_t>(qb + 1, L);  // valid q
                const int r0 = static_cast<int>(u0 + pad - qa * stride);
                std::fill(line, line + line_n, 0.f);
                if (vb > va) act(xr + va, line + (va - qa), vb - va);
                expand_row(line, row, wcols, stride, r0);
              }
            };
            if constexpr (Pairs) {
              for (int64_t r = 0; r < (kc + 1) / 2; ++r) {
                fill(c0 + 2 * r, pair_buf.get());
                fill(c0 + 2 * r + 1, pair_buf.get() + ld);
                pair_rows_avx512(pair_buf.get(), pair_buf.get() + ld, slab + r * ld, wcols);
              }
            } else {
              for (int64_t c = 0; c < kc; ++c) fill(c0 + c, slab + c * ld);
            }
            io.first = c0 == 0;
            io.last = c0 + kc == Cin;
            for (int64_t cob = cb0; cob < cb1; ++cob) {
              const int64_t wofs = Pairs ? ((cob * pf->cin2 + c0 / 2) * P.taps) * kMR * P.phases
                                         : ((cob * Cin + c0) * P.taps) * kMR * P.phases;
              io.rows = static_cast<int>(std::min<int64_t>(kMR, Cout - cob * kMR));
              io.bias = P.bias.empty() ? nullptr : P.bias.data() + cob * kMR;
              for (int64_t t = 0; t < ntp; t += kNR) {
                io.part = multi ? part + ((cob - cb0) * kMR) * TC + t : nullptr;
                io.cols = static_cast<int>(std::min<int64_t>(kNR, nt - t));
                io.y = y + (cob * kMR) * Lout + t0 + t;
                io.res = fusion.residual ? fusion.residual + (cob * kMR) * Lout + t0 + t : nullptr;
                // The next tile's residual lines (kMR rows Lout apart, which the hardware prefetchers do not
                // follow here): the residual units' conv2 (one tap, Snake, in-place residual), 2 threads,
                // alternating runs: C 96 / 192 / 384 / 768 37-38 -> 32-33 / 55 -> 50 / 43.5 -> 41 / 20.4 ->
                // 20.3 ms; the window's 12 conv2 layers 1.02 -> 0.91 s. Two or four tiles ahead: less gain.
                if (io.res && io.last && t + kNR < ntp)
                  for (int m = 0; m < io.rows; ++m)
                    for (int q = 0; q < kNR; q += 16)
                      _mm_prefetch(reinterpret_cast<const char*>(io.res + m * Lout + kNR + q), _MM_HINT_T0);
                if constexpr (Pairs)
                  tile_dp(slab + t, ld, pf->w.data() + wofs, (kc + 1) / 2, P.taps, P.off.data(), io);
                else
                  tile(slab + t, ld, P.w.data() + wofs, kc, P.taps, P.off.data(), io);
              }
            }
          }
        }
      },
      1);
}

}  // namespace

ConvWeight conv_dpbf16(const ConvWeight& w) {
  MM3_CHECK(!w.empty(), "conv_dpbf16 on an empty weight");
  const Packed& P = *static_cast<const Packed*>(w.packed.get());
  if (!detail::cpu_has_avx512bf16() || !P.raw.empty()) return w;
  const int64_t Cin = w.in_channels(), unit = int64_t(P.taps) * kMR * P.phases;  // values per (cob, ci)
  auto f = std::make_shared<PairForm>();
  f->cin2 = (Cin + 1) / 2;
  f->w.assign(static_cast<size_t>(P.cobs * f->cin2 * unit), 0u);
  for (int64_t cob = 0; cob < P.cobs; ++cob)
    for (int64_t ci = 0; ci < Cin; ++ci) {
      const float* src = P.w.data() + (cob * Cin + ci) * unit;
      uint32_t* dst = f->w.data() + (cob * f->cin2 + ci / 2) * unit;
      const int shift = ci % 2 ? 16 : 0;
      for (int64_t e = 0; e < unit; ++e) dst[e] |= uint32_t(f32_to_bf16_bits(src[e])) << shift;
    }
  ConvWeight r = w;
  r.pairs = std::move(f);
  return r;
}

ConvWeight conv_bf16_form(const ConvWeight& w) {
  static const std::string pick = [] {
    const char* e = std::getenv("MM3_CONV_BF16");
    const std::string v = e ? e : "";
    if (!v.empty() && v != "gemm" && v != "pairs" && v != "direct")
      throw InvalidInput(fmt::format("MM3_CONV_BF16='{}': use gemm, pairs or direct (or leave it unset)", v));
    return v;
  }();
  if (pick == "gemm") return conv_gemm_bf16(w);
  if (pick == "pairs") return conv_dpbf16(w);
  if (pick == "direct") return w;
  if (detail::cpu_has_amx_bf16()) return conv_gemm_bf16(w);
  // Where VDPBF16PS is slow (detail::bf16_dot_fma: the probe, or the knob bf16_dot=0) the fp32-operand
  // direct kernel. Thirty-eighth session, 2-core Xeon family 6 model 207, vocoder_L689_bf16: pairs 14.9 s,
  // direct 8.3 s (2 runs each, one process each; rel RMS from fp32 0.0337 either way).
  return detail::bf16_dot_fma() ? w : conv_dpbf16(w);
}

void conv_packed(const ThreadPool& pool, const ConvWeight& cw, const float* x, int64_t L, float* y, DType store,
                 const ConvFusion& fusion) {
  MM3_CHECK(!cw.empty() && L > 0, "conv_packed: empty weight or L={}", L);
  const Packed& P = *static_cast<const Packed*>(cw.packed.get());
  const int64_t Cin = cw.in_channels(), Cout = cw.out_channels(), Lout = cw.out_len(L);
  MM3_CHECK(Lout > 0, "conv_packed: output length {} for L={}", Lout, L);
  if (cw.winograd && store == DType::F32) {
    if (cw.transposed())
      detail::winograd_t_run(pool, cw, x, L, y, fusion);
    else
      detail::winograd_run(pool, cw, x, L, y, fusion);
    return;
  }
  if (cw.gemm && store == DType::BF16 &&
      conv_gemm_run(pool, cw, *static_cast<const GemmForm*>(cw.gemm.get()), x, L, y, fusion))
    return;
  if (!P.raw.empty()) {
    conv_transpose1d(pool, x, Cin, L, P.raw.data(), P.bias.empty() ? nullptr : P.bias.data(), Cout,
                     cw.kernel_size(), cw.stride(), cw.pad(), cw.output_padding(), y, store, fusion);
    return;
  }
  if (cw.pairs && store == DType::BF16)
    direct_run<true>(pool, cw, P, static_cast<const PairForm*>(cw.pairs.get()), x, L, y, store, fusion);
  else
    direct_run<false>(pool, cw, P, nullptr, x, L, y, store, fusion);
}

}  // namespace mm3::kern
