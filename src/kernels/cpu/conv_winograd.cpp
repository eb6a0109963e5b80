// conv_winograd.cpp — kern::conv_winograd (kernels.h): a stride-1, 7-tap Conv1d (any dilation d,
// padding 3d: the vocoder's conv_in and residual-unit conv1) as Winograd F(6,7), for fp32 compute.
//
// Six outputs y[t + e·d], e < 6, of a 7-tap filter g read the 12 inputs x[t + (i−3)d], i < 12.
// Winograd's minimal filtering algorithm (Toom-Cook at the points 0, ±1, ±3/2, ±2/3, ±3, ±1/3 and ∞)
// computes them with 12 products instead of 42:
//     (y[t + e·d])_e = AT · [ (G g) ⊙ (BT x) ],
// BT 12×12, G 12×7, AT 6×12 (below). Over channels the products become 12 independent matrix products,
// one per point p: V_p[co, n] = sum_ci Gw_p[co, ci] · U_p[ci, n], where U_p = BT_p x (the input
// transform of tile n, per input channel) and Gw_p = G_p g (the weights, transformed once at load).
// 3.5× fewer multiply-adds than the direct kernel, plus transforms that cost O(Cin + Cout) per tile
// against the products' O(Cin·Cout). (Until the thirtieth session F(4,7): 10 products per 4 outputs,
// 2.8× fewer; F(6,7) runs a fifth fewer, for ~1.2× its error, below.)
//
// Tiles. Outputs go in blocks of 6d: block b holds t = 6db + j + e·d for j < d, e < 6; tile k = b·d + j.
// Seen from a task's first block b0, input i = 6q + r of tile k is H_r[k + q·d], where the H_r are the
// task's (Snake'd, zero-padded) input deinterleaved by runs of d: H_r[b'·d + j] =
// x[6d(b0 + b') + r·d + j − 3d]. So every input transform is a sum of shifted contiguous rows.
//
// Work split: a task is a run of whole 64-tile strips (task_tiles), taken by whichever thread is free;
// it builds its H rows (all input channels, from the block of its first tile), then goes through its
// tiles in strips of 64 (the direct kernel's register tile width): U_p of the strip for every point,
// then V_p (conv_detail.h conv_onetap_strip: the direct kernel's one-tap register tile, 6 channels × 64
// tiles), then the output transform of the strip into y. One synchronisation per call. A fused
// residual unit (conv_residual_unit) sends the output transform to the task's buffer instead, and after
// each strip runs Snake, conv2 and the residual add over the buffer's completed positions into y.
//
// Numerics. Not the direct kernel's bits: the transforms add rounding, and the cancellation in AT
// amplifies the products' rounding. To keep the error near the direct kernel's, each V_p sums its input
// channels in chunks of 64 (each chunk one FMA chain from 0, the chunks added in order) instead of one
// chain. Measured (rel RMS against an fp64 evaluation), F(4,7) (sessions eleven to twenty-nine): one
// 192-channel layer 3.2e-6 with chunks, 5.0e-6 without, the direct kernel 6.5e-7; the whole full-size
// vocoder (random weights, L = 120) 1.74e-5 (4.9e-5 unchunked; the direct kernel 8.2e-6, torch's fp32
// 2.3e-6; F(2,7) chunked 6.2e-6 but ~1.3 s slower per window); the golden vocoder cases
// (vocoder_crosscheck.py) 2.4-3.0e-7 against a rule of 1e-5. F(6,7): see AccuracyNearTheDirectKernels
// and docs/performance-history.md (thirtieth session).
// The transforms are fixed sequences of fp32 multiplies and adds, so bits depend neither on the thread
// count nor on the ISA path. Store BF16 ignores the form (it would round the transformed values);
// MM3_CONV_WINOGRAD=0 turns it off.
#pragma GCC optimize("fp-contract=off")

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "core/aligned.h"
#include "kernels/cpu/conv_detail.h"
#include "kernels/kernels.h"
#include "kernels/tuning.h"

namespace mm3::kern {

namespace {

constexpr int kTaps = 7;
constexpr int kM = 6;                             // outputs per tile
constexpr int kPts = kM + kTaps - 1;              // points (products per tile)
static_assert(kPts == kWinogradPoints, "kernels.h states the point count");
constexpr int64_t kStrip = 64;                    // tiles per strip: the direct kernel's tile width
constexpr int64_t kChunk = 64;                    // input channels per FMA chain of a product (see Numerics)
constexpr int64_t kTaskBytes = int64_t(512) << 10;  // a task's H rows (knob wino_task_kib; task_tiles)

// F(6,7) from Toom-Cook at the points 0, 1, −1, 3/2, −3/2, 2/3, −2/3, 3, −3, 1/3, −1/3 and ∞ (rows p in
// that order). Each BT row (the Lagrange basis polynomial of its point, ∞: the product of (z − a) over
// the finite points) is scaled to coprime integers, each AT column (the powers of its point) likewise,
// and G carries both inverse scales: every BT and AT entry is an exact fp32 integer (at most 12427),
// and G is applied in double at load. tests/unit/kernels_conv_winograd.cpp rebuilds the unscaled
// matrices from the points. The points: of the sets of five ± pairs among 1, 2, 1/2, 3/2, 2/3, 3/4,
// 4/3, 1/4, 3, 1/3, 5/4, 4/5 this one gave the least error in an fp32 emulation of the whole layer
// (rel RMS ~1.2× F(4,7)'s at the points 0, ±1, ±2, ±1/2, ±3/2; adding ±2/3 to those: ~1.8×).
// F(8,7) (14 products per 8 outputs, ~6% fewer products a window) in the same kind of emulation
// (thirty-fifth session, ~50 sets of six ± pairs): at best 1.18e-5 against this set's 2.97e-6, ~4× the
// error for at most ~4% of a window; not taken.
constexpr float kBT[kPts][kPts] = {
    {324, 0, -4149, 0, 12427, 0, -12427, 0, 4149, 0, -324, 0},
    {0, 324, 324, -3825, -3825, 8602, 8602, -3825, -3825, 324, 324, 0},
    {0, -324, 324, 3825, -3825, -8602, 8602, 3825, -3825, -324, 324, 0},
    {0, -108, -72, 1335, 890, -3549, -2366, 2565, 1710, -243, -162, 0},
    {0, 108, -72, -1335, 890, 3549, -2366, -2565, 1710, 243, -162, 0},
    {0, -162, -243, 1710, 2565, -2366, -3549, 890, 1335, -72, -108, 0},
    {0, 162, -243, -1710, 2565, 2366, -3549, -890, 1335, 72, -108, 0},
    {0, 108, 36, -1371, -457, 3990, 1330, -3699, -1233, 972, 324, 0},
    {0, -108, 36, 1371, -457, -3990, 1330, 3699, -1233, -972, 324, 0},
    {0, 324, 972, -1233, -3699, 1330, 3990, -457, -1371, 36, 108, 0},
    {0, -324, 972, 1233, -3699, -1330, 3990, 457, -1371, -36, 108, 0},
    {0, -324, 0, 4149, 0, -12427, 0, 12427, 0, -4149, 0, 324},
};
constexpr float kAT[kM][kPts] = {
    {1, 1, 1, 32, 32, 243, 243, 1, 1, 243, 243, 0}, {0, 1, -1, 48, -48, 162, -162, 3, -3, 81, -81, 0},
    {0, 1, 1, 72, 72, 108, 108, 9, 9, 27, 27, 0},   {0, 1, -1, 108, -108, 72, -72, 27, -27, 9, -9, 0},
    {0, 1, 1, 162, 162, 48, 48, 81, 81, 3, 3, 0},   {0, 1, -1, 243, -243, 32, -32, 243, -243, 1, -1, 1},
};
constexpr double kG[kPts][kTaps] = {
    {1. / 324, 0, 0, 0, 0, 0, 0},
    {1. / 3200, 1. / 3200, 1. / 3200, 1. / 3200, 1. / 3200, 1. / 3200, 1. / 3200},
    {1. / 3200, -1. / 3200, 1. / 3200, -1. / 3200, 1. / 3200, -1. / 3200, 1. / 3200},
    {8. / 6081075, 4. / 2027025, 2. / 675675, 1. / 225225, 1. / 150150, 1. / 100100, 3. / 200200},
    {8. / 6081075, -4. / 2027025, 2. / 675675, -1. / 225225, 1. / 150150, -1. / 100100, 3. / 200200},
    {3. / 200200, 1. / 100100, 1. / 150150, 1. / 225225, 2. / 675675, 4. / 2027025, 8. / 6081075},
    {3. / 200200, -1. / 100100, 1. / 150150, -1. / 225225, 2. / 675675, -4. / 2027025, 8. / 6081075},
    {1. / 23950080, 1. / 7983360, 1. / 2661120, 1. / 887040, 1. / 295680, 1. / 98560, 3. / 98560},
    {1. / 23950080, -1. / 7983360, 1. / 2661120, -1. / 887040, 1. / 295680, -1. / 98560, 3. / 98560},
    {3. / 98560, 1. / 98560, 1. / 295680, 1. / 887040, 1. / 2661120, 1. / 7983360, 1. / 23950080},
    {3. / 98560, -1. / 98560, 1. / 295680, -1. / 887040, 1. / 2661120, -1. / 7983360, 1. / 23950080},
    {0, 0, 0, 0, 0, 0, 1. / 324},
};

// 16 floats as one GCC/Clang vector value: the transforms below are lane-wise fp32 multiplies and
// adds, the same bits on every ISA (one zmm with AVX-512, two ymm with AVX2, SSE otherwise).
// (Internal, inlined helpers: -Wpsabi's note on passing such values without AVX-512 does not apply.)
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float v16 __attribute__((vector_size(64)));

inline v16 load16(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store16(float* p, v16 v) { std::memcpy(p, &v, sizeof v); }

// The transforms' vector: 16 lanes where the build has AVX-512, else 8 (one ymm with AVX2): the 12
// points' vectors of a transform then fit the 16 ymm registers, where 16-lane ones (two ymm each) spilled
// (perf annotate; the thirty-sixth session: vocoder_L689 under MM3_ISA=avx2 on an x86-64-v3 build, the
// transforms ~25% of the window). Lane-wise the same operations, so the same bits.
#if defined(__AVX512F__)
typedef v16 vt;
#else
typedef float vt __attribute__((vector_size(32)));
#endif
constexpr int kVt = static_cast<int>(sizeof(vt) / sizeof(float));
inline vt loadvt(const float* p) {
  vt v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void storevt(float* p, vt v) { std::memcpy(p, &v, sizeof v); }

// The points after 0 come in pairs ±a (rows 2k−1 and 2k, k = 1..5), so BT's row for −a is the row for +a
// with its odd-index entries negated, and AT's column for −a is the column for +a times (−1)^e. The
// transforms share that work: U_{2k−1}, U_{2k} = E − O, E + O, with E the row's even-index terms and O
// the odd-index terms of the row for −a; and output e sums S_k = V_{2k−1} + V_{2k} (e even) or
// D_k = V_{2k−1} − V_{2k} (e odd) once per pair: ~45% fewer adds and multiplies than each row and
// output summed term by term. Other bits, the same accuracy (AccuracyNearTheDirectKernels: rel RMS
// 2.9-3.4e-6 either way). vocoder_L689 on Zen 4, binaries alternating ×3: two threads 6.50-6.68 ->
// 6.49-6.53 s, one thread 12.69 / 13.10 -> 12.62 / 12.86 s.
constexpr bool pairs_mirror() {
  for (int k = 1; k <= (kPts - 2) / 2; ++k) {
    const int a = 2 * k - 1, b = 2 * k;
    for (int i = 0; i < kPts; ++i)
      if (kBT[b][i] != (i % 2 ? -kBT[a][i] : kBT[a][i])) return false;
    for (int e = 0; e < kM; ++e)
      if (kAT[e][b] != (e % 2 ? -kAT[e][a] : kAT[e][a])) return false;
  }
  return true;
}
static_assert(pairs_mirror(), "the points must come in ± pairs at rows 2k−1, 2k");

// acc = sum of coef[i] · v[i] over the nonzero coefficients with i ≡ par (mod 2) (par < 0: all i), in
// ascending i: the first term a product, then one add per term (fp-contract is off: no fusing).
// Unrolled at compile time, so the zero coefficients cost nothing.
template <int N, typename V>
inline V dot(const float (&coef)[N], const V (&v)[N], int par) {
  V acc = {};
  bool first = true;
#pragma GCC unroll 16
  for (int i = 0; i < N; ++i) {
    if (coef[i] == 0.f || (par >= 0 && i % 2 != par)) continue;
    acc = first ? coef[i] * v[i] : acc + coef[i] * v[i];
    first = false;
  }
  return acc;
}

// U_p[ci][k] for every point p (rows ldp apart) and the strip's 64 tiles k, from one input channel's
// H rows (input i of tile k at in[i][k]).
void input_transform(const float* const (&in)[kPts], float* u, int64_t ldp) {
  for (int k = 0; k < kStrip; k += kVt) {
    vt v[kPts];
    for (int i = 0; i < kPts; ++i) v[i] = loadvt(in[i] + k);
    storevt(u + k, dot(kBT[0], v, -1));
#pragma GCC unroll 4
    for (int q = 1; q < kPts - 1; q += 2) {
      const vt e = dot(kBT[q], v, 0), o = dot(kBT[q + 1], v, 1);
      storevt(u + q * ldp + k, e - o);
      storevt(u + (q + 1) * ldp + k, e + o);
    }
    storevt(u + (kPts - 1) * ldp + k, dot(kBT[kPts - 1], v, -1));
  }
}

// out[e][k] = AT · (V_p[k])_p for one output channel (V_p rows at v[p]): per output, the term of point 0,
// the pairs' S or D scaled in ascending k, then the term of ∞, as above.
void output_transform(const float* const (&v)[kPts], float (&out)[kM][kStrip]) {
  for (int k = 0; k < kStrip; k += kVt) {
    vt a[kPts], sd[2][kPts / 2];
    for (int p = 0; p < kPts; ++p) a[p] = loadvt(v[p] + k);
#pragma GCC unroll 4
    for (int q = 1; q < kPts - 1; q += 2) {
      sd[0][q / 2] = a[q] + a[q + 1];
      sd[1][q / 2] = a[q] - a[q + 1];
    }
#pragma GCC unroll 4
    for (int e = 0; e < kM; ++e) {
      vt acc = {};
      bool first = true;
      auto term = [&](float c, vt t) {
        if (c == 0.f) return;
        acc = first ? c * t : acc + c * t;
        first = false;
      };
      term(kAT[e][0], a[0]);
#pragma GCC unroll 4
      for (int q = 1; q < kPts - 1; q += 2) term(kAT[e][q], sd[e % 2][q / 2]);
      term(kAT[e][kPts - 1], a[kPts - 1]);
      storevt(out[e] + k, acc);
    }
  }
}

// H rows of one channel from its Snake'd segment s (see winograd_run's step 1): H[r][k] =
// s[m·d·(k / d) + r·d + k % d] for r < m, k < rowlen (rows rowlen apart). Only moves values.
// d = 1: a stride-6 deinterleave, 16 columns of every row from 96 floats by two-source shuffles;
// d = 3, 9 (the vocoder's other dilations): runs of d floats as fixed-size copies; else run by run.
typedef int32_t i16v __attribute__((vector_size(64)));
// Lane j of row R is element 6j + R of a[0..5] (96 floats): picked from the pairs a0|a1, a2|a3, a4|a5
// (pick: the index in the pair starting at float B, 0 where lane j's element is not in it), then the
// three merged lane by lane (from_second: lane j from the second operand where element 6j + R >= B).
template <int R, int B>
constexpr int pick(int j) {
  const int i = 6 * j + R - B;
  return i >= 0 && i < 32 ? i : 0;
}
template <int R, int B>
constexpr int from_second(int j) {
  return 6 * j + R >= B ? 16 + j : j;
}
#define MM3_LANES16(F) \
  { F(0), F(1), F(2), F(3), F(4), F(5), F(6), F(7), F(8), F(9), F(10), F(11), F(12), F(13), F(14), F(15) }
template <int R>
inline v16 deinterleave6(const v16 (&a)[6]) {
  static_assert(kM == 6);
#define MM3_M0(j) pick<R, 0>(j)
#define MM3_M1(j) pick<R, 32>(j)
#define MM3_M2(j) pick<R, 64>(j)
#define MM3_C1(j) from_second<R, 32>(j)
#define MM3_C2(j) from_second<R, 64>(j)
  constexpr i16v m0 = MM3_LANES16(MM3_M0), m1 = MM3_LANES16(MM3_M1), m2 = MM3_LANES16(MM3_M2);
  constexpr i16v c1 = MM3_LANES16(MM3_C1), c2 = MM3_LANES16(MM3_C2);
#undef MM3_M0
#undef MM3_M1
#undef MM3_M2
#undef MM3_C1
#undef MM3_C2
  const v16 lo = __builtin_shuffle(a[0], a[1], m0), mid = __builtin_shuffle(a[2], a[3], m1),
            hi = __builtin_shuffle(a[4], a[5], m2);
  return __builtin_shuffle(__builtin_shuffle(lo, mid, c1), hi, c2);
}

// The inverse, for the output side: positions 16·O + l (l < 16) of the 96 that 16 tiles' six outputs fill
// in position order (d = 1), from a[e] = output e of those tiles: lane l holds a[p % 6][p / 6], p = 16·O + l.
// Picked from the pairs a0|a1, a2|a3, a4|a5, then merged lane by lane.
template <int O, int P>
constexpr int pick_out(int l) {
  const int p = 16 * O + l, e = p % 6;
  return e / 2 == P ? (e % 2) * 16 + p / 6 : 0;
}
template <int O, int P>
constexpr int from_pair(int l) {
  return (16 * O + l) % 6 / 2 == P ? 16 + l : l;
}
template <int O>
inline v16 interleave6(const v16 (&a)[6]) {
#define MM3_P0(l) pick_out<O, 0>(l)
#define MM3_P1(l) pick_out<O, 1>(l)
#define MM3_P2(l) pick_out<O, 2>(l)
#define MM3_F1(l) from_pair<O, 1>(l)
#define MM3_F2(l) from_pair<O, 2>(l)
  constexpr i16v p0 = MM3_LANES16(MM3_P0), p1 = MM3_LANES16(MM3_P1), p2 = MM3_LANES16(MM3_P2);
  constexpr i16v f1 = MM3_LANES16(MM3_F1), f2 = MM3_LANES16(MM3_F2);
#undef MM3_P0
#undef MM3_P1
#undef MM3_P2
#undef MM3_F1
#undef MM3_F2
  const v16 lo = __builtin_shuffle(a[0], a[1], p0), mid = __builtin_shuffle(a[2], a[3], p1),
            hi = __builtin_shuffle(a[4], a[5], p2);
  return __builtin_shuffle(__builtin_shuffle(lo, mid, f1), hi, f2);
}
#undef MM3_LANES16

// A strip's outputs in position order: st[b·m·D + e·D + j] = out[e][k0 + b·D + j] for the tiles
// [k0, k0 + nb·D) (whole blocks of D). Only moves values. d = 1: 16 tiles at a time by interleave6
// (columns up to the next multiple of 16, which out holds: st has room for a whole strip); d = 3, 9:
// runs of D floats as fixed-size copies; else value by value. (Until the thirty-first session value by
// value for every d. One fused 96-channel unit, L = 352768, one Zen 4 thread, binaries alternating x3:
// d = 1 0.326-0.348 -> 0.299-0.330 s, d = 3 0.297-0.380 -> 0.303-0.354, d = 9 0.318-0.325 ->
// 0.307-0.310; vocoder_L689 on two threads 6.17-6.57 -> 6.20-6.48 s, within the host's noise.)
template <int D>
void stage_runs(const float (&out)[kM][kStrip], int64_t k0, int64_t nb, float* st) {
  for (int64_t b = 0; b < nb; ++b)
    for (int e = 0; e < kM; ++e) std::memcpy(st + (b * kM + e) * D, out[e] + k0 + b * D, D * sizeof(float));
}

void stage_outputs(const float (&out)[kM][kStrip], int64_t k0, int64_t nb, int64_t D, float* st) {
  if (D == 1) {
    for (int64_t k = 0; k < nb; k += 16) {  // k0 = 0 for d = 1
      v16 a[kM];
      for (int e = 0; e < kM; ++e) a[e] = load16(out[e] + k);
      float* o = st + kM * k;
      store16(o, interleave6<0>(a));
      store16(o + 16, interleave6<1>(a));
      store16(o + 32, interleave6<2>(a));
      store16(o + 48, interleave6<3>(a));
      store16(o + 64, interleave6<4>(a));
      store16(o + 80, interleave6<5>(a));
    }
  } else if (D == 3) {
    stage_runs<3>(out, k0, nb, st);
  } else if (D == 9) {
    stage_runs<9>(out, k0, nb, st);
  } else {
    for (int64_t b = 0; b < nb; ++b)
      for (int e = 0; e < kM; ++e)
        for (int64_t j = 0; j < D; ++j) st[(b * kM + e) * D + j] = out[e][k0 + b * D + j];
  }
}

template <int D>
void copy_runs(const float* s, float* h, int64_t rowlen) {
  constexpr int64_t MD = kM * D;
  for (int r = 0; r < kM; ++r) {
    float* hr = h + r * rowlen;
    const float* sr = s + r * D;
    int64_t bb = 0;
    for (; (bb + 1) * D <= rowlen; ++bb) std::memcpy(hr + bb * D, sr + bb * MD, D * sizeof(float));
    for (int64_t j = 0; bb * D + j < rowlen; ++j) hr[bb * D + j] = sr[bb * MD + j];
  }
}

void build_h(const float* s, float* h, int64_t rowlen, int64_t D) {
  if (D == 1) {
    int64_t k = 0;
    for (; k + 16 <= rowlen; k += 16) {
      v16 a[6];
      for (int v = 0; v < 6; ++v) a[v] = load16(s + kM * k + 16 * v);
      store16(h + k, deinterleave6<0>(a));
      store16(h + rowlen + k, deinterleave6<1>(a));
      store16(h + 2 * rowlen + k, deinterleave6<2>(a));
      store16(h + 3 * rowlen + k, deinterleave6<3>(a));
      store16(h + 4 * rowlen + k, deinterleave6<4>(a));
      store16(h + 5 * rowlen + k, deinterleave6<5>(a));
    }
    for (; k < rowlen; ++k)
      for (int r = 0; r < kM; ++r) h[r * rowlen + k] = s[k * kM + r];
  } else if (D == 3) {
    copy_runs<3>(s, h, rowlen);
  } else if (D == 9) {
    copy_runs<9>(s, h, rowlen);
  } else {
    for (int64_t bb = 0; bb * D < rowlen; ++bb)
      for (int r = 0; r < kM; ++r)
        for (int64_t j = 0; j < D && bb * D + j < rowlen; ++j) h[r * rowlen + bb * D + j] = s[bb * kM * D + r * D + j];
  }
}

struct WinoForm {
  std::vector<ConvWeight> pts;  // one-tap [Cout, Cin] weight of each point (G applied), no bias
  std::vector<float> bias;      // [Cout], empty without
};

// Tiles per task: a whole number of 64-tile strips (only a layer's last task ends in a partial strip,
// which the products run at the tiles' generic path and pay for all 64 columns), the task's H rows
// (6·Cin floats per tile) about kTaskBytes, and at least 4 tasks per thread where the layer is long
// enough (balance on a shared host). The size changes no bit (a tile's sums do not depend on its task).
// kTaskBytes was 2 MiB until the thirty-fourth session: with the fused unit's buffer beside them, a
// task's rows (~4 MB at 2 MiB) did not fit a 1 MiB L2. Zen 4, vocoder_L689, two threads, `--alternate
// wino_task_kib` (12-24 runs a set), time ÷ 2 MiB's: 512 KiB 0.979 / 0.962 / 0.977, 1024 KiB 0.973,
// 256 KiB 0.975, 128 KiB ~0.96 (within the noise of 512). The transposed convs' tasks (conv_winograd_t)
// at 512 KiB instead of 2 MiB: 0.991, so they stay.
int64_t task_tiles(int64_t Cin, int64_t ntiles, int workers) {
  const int kib = tuning::forced(tuning::Knob::WinoTaskKib);
  const int64_t tb = kib > 0 ? int64_t(kib) * 1024 : kTaskBytes;
  const int64_t by_size = std::clamp<int64_t>(tb / (4 * kM * Cin), kStrip, 4096);
  const int64_t by_balance = (ntiles + 4 * workers - 1) / (4 * workers);
  const int64_t t = std::min(by_size, std::max(by_balance, kStrip));
  return std::max<int64_t>(1, (t + kStrip / 2) / kStrip) * kStrip;  // nearest whole strips
}

}  // namespace

bool detail::winograd_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("MM3_CONV_WINOGRAD");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

ConvWeight conv_winograd(const ConvWeight& w) {
  MM3_CHECK(!w.empty(), "conv_winograd on an empty weight");
  if (!detail::winograd_enabled() || w.transposed() || w.kernel_size() != kTaps || w.pad() != 3 * w.dilation())
    return w;
  const int64_t Cin = w.in_channels(), Cout = w.out_channels();
  std::vector<float> wt, bias;
  detail::conv_unpack(w, wt, bias);  // [Cout, Cin, 7]
  auto f = std::make_shared<WinoForm>();
  std::vector<float> wp(static_cast<size_t>(Cout * Cin));
  for (int p = 0; p < kPts; ++p) {
    for (int64_t i = 0; i < Cout * Cin; ++i) {
      double s = 0;
      for (int k = 0; k < kTaps; ++k) s += kG[p][k] * double(wt[static_cast<size_t>(i * kTaps + k)]);
      wp[static_cast<size_t>(i)] = static_cast<float>(s);
    }
    f->pts.push_back(ConvWeight::conv1d(wp.data(), nullptr, Cout, Cin, 1, 0, 1));
  }
  f->bias = std::move(bias);
  ConvWeight r = w;
  r.winograd = std::move(f);
  return r;
}

namespace {

// The second convolution of a fused residual unit (conv_residual_unit): y = residual + conv2(snake(u))
// over conv1's outputs u, which the task keeps in its buffer.
struct UnitTail {
  const ConvWeight* conv2;
  const float* alpha2;
  std::vector<float> inv2;
  const float* bias2;     // [Cout] or null
  const float* residual;  // [Cout, L]
};

// Tiles per task of a fused unit: task_tiles rounded to whole blocks of d tiles as well as whole
// strips, so every task's outputs are whole blocks (contiguous positions nobody else writes).
int64_t unit_task_tiles(int64_t Cin, int64_t ntiles, int workers, int64_t D) {
  const int64_t unit = kStrip / std::gcd(kStrip, D) * D;
  return std::max<int64_t>(1, (task_tiles(Cin, ntiles, workers) + unit / 2) / unit) * unit;
}

using detail::conv_onetap_strip;
using detail::snake_inv;
using detail::snake_row;

// winograd_run's body; with a tail, conv1's outputs go to the task's buffer instead of y, and the tail
// turns each complete run of them into y.
void winograd_impl(const ThreadPool& pool, const ConvWeight& cw, const float* x, int64_t L, float* y,
                   const ConvFusion& fusion, const UnitTail* tail) {
  const WinoForm& f = *static_cast<const WinoForm*>(cw.winograd.get());
  constexpr int m = kM, np = kPts, qmax = (np - 1) / m;
  const int64_t Cin = cw.in_channels(), Cout = cw.out_channels();
  const int64_t D = cw.dilation(), MD = m * D, nblocks = (L + MD - 1) / MD, ntiles = nblocks * D;
  const int64_t tpt = tail ? unit_task_tiles(Cin, ntiles, pool.size(), D) : task_tiles(Cin, ntiles, pool.size());
  const int64_t n_tasks = (ntiles + tpt - 1) / tpt;
  // The tail's buffer rows: a task's positions (m per tile) plus a strip's reach past the last one.
  int64_t uld = tpt * m + kStrip;
  if (uld % 1024 == 0) uld += 16;  // no 4 KiB-aliased rows
  std::vector<float> inv;
  if (fusion.snake_alpha) {
    inv.resize(static_cast<size_t>(Cin));
    for (int64_t c = 0; c < Cin; ++c) inv[static_cast<size_t>(c)] = snake_inv(fusion.snake_alpha[c], DType::F32);
  }
  const float* bias = f.bias.empty() ? nullptr : f.bias.data();
  // A task is the tiles [k0, k1) (tile k = b·d + j: block b, phase j); its H rows start at block
  // b0 = k0 / d, so its first strip starts at tile s = k0 − b0·d of the rows. Rows of H (one phase of
  // one channel): through the last strip's 64th column plus the reach of the last input (qmax·d), so a
  // strip's 64 columns are always readable (zeros past the end).
  auto row_len = [&](int64_t s, int64_t n) { return s + (n - s + kStrip - 1) / kStrip * kStrip + (qmax + 1) * D; };
  std::atomic<int64_t> next{0};
  pool.parallel_for(std::min<int64_t>(pool.size(), n_tasks), [&](int64_t, int64_t) {
    thread_local aligned_vector<float> H, U, V, seg, stage, Uo, V2;
    auto grow = [](aligned_vector<float>& v, int64_t n) {
      if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
    };
    const int64_t rl_max = row_len(D - 1, D - 1 + tpt);
    grow(H, Cin * m * rl_max);
    grow(U, np * Cin * kStrip);
    grow(V, np * Cout * kStrip);
    grow(stage, m * kStrip);
    grow(seg, (rl_max / D + 1) * MD);
    if (tail) {
      grow(Uo, Cout * uld);
      grow(V2, Cout * kStrip);
    }
    for (int64_t task; (task = next.fetch_add(1)) < n_tasks;) {
      const int64_t k0 = task * tpt, k1 = std::min(ntiles, k0 + tpt), b0 = k0 / D;
      const int64_t first = k0 - b0 * D, n = k1 - b0 * D;  // the task's tiles: [first, n) of its rows
      const int64_t rowlen = row_len(first, n);
      const int64_t lo = MD * b0 - 3 * D, len = (rowlen / D + 1) * MD;  // input positions [lo, lo + len)
      const int64_t a = std::clamp<int64_t>(-lo, 0, len), b = std::clamp<int64_t>(L - lo, a, len);
      // Where conv1's outputs go: y, or (tail) the task's buffer, whose column 0 is position MD·b0.
      const int64_t origin = tail ? MD * b0 : 0, ldo = tail ? uld : L;
      float* const out_base = tail ? Uo.data() : y;
      int64_t done2 = 0;  // tail: buffer columns [0, done2) have gone through conv2
      // 1. H[ci][r][k] = (Snake'd, zero-padded) x[ci, lo + m·d·(k / d) + r·d + k % d]: input i = m·q + r of
      //    tile k is H[ci][r][k + q·d].
      for (int64_t ci = 0; ci < Cin; ++ci) {
        float* s = seg.data();
        std::fill(s, s + a, 0.f);
        if (b > a) {
          if (fusion.snake_alpha)
            snake_row(x + ci * L + lo + a, fusion.snake_alpha[ci], inv[static_cast<size_t>(ci)], s + a, b - a,
                      DType::F32);
          else
            std::memcpy(s + a, x + ci * L + lo + a, static_cast<size_t>(b - a) * sizeof(float));
        }
        std::fill(s + b, s + len, 0.f);
        float* h = H.data() + ci * m * rowlen;
        build_h(s, h, rowlen, D);
      }
      // 2. Strips of 64 tiles: U = BT · inputs for every point, V_p = Gw_p · U_p (the direct kernel's
      //    tiles), then y = AT · V (+ bias, + residual), back to interleaved positions.
      for (int64_t s0 = first; s0 < n; s0 += kStrip) {
        const int cols = static_cast<int>(std::min<int64_t>(kStrip, n - s0));
        for (int64_t ci = 0; ci < Cin; ++ci) {
          const float* h = H.data() + ci * m * rowlen + s0;
          const float* in[kPts];
          for (int i = 0; i < np; ++i) in[i] = h + (i % m) * rowlen + (i / m) * D;
          input_transform(in, U.data() + ci * kStrip, Cin * kStrip);
        }
        for (int p = 0; p < np; ++p)
          conv_onetap_strip(f.pts[static_cast<size_t>(p)], U.data() + p * Cin * kStrip, kStrip, cols,
                            V.data() + p * Cout * kStrip, kStrip, kChunk);
        // Output e of tile s0 + k lands at MD·(b0 + (s0 + k) / d) + (s0 + k) % d + e·d. The whole blocks
        // the strip covers (tiles [kf, ke)) fill MD·nfull contiguous outputs from tf: they are staged in
        // position order and written 16 at a time; the tiles of a partial first or last block one by one.
        const int64_t j0 = s0 % D;
        const int64_t kf = j0 ? std::min<int64_t>(cols, D - j0) : 0, nfull = (cols - kf) / D, ke = kf + nfull * D;
        const int64_t tf = MD * (b0 + (s0 + kf) / D), nf = std::clamp<int64_t>(L - tf, 0, nfull * MD);
        for (int64_t co = 0; co < Cout; ++co) {
          const float* v[kPts];
          for (int p = 0; p < np; ++p) v[p] = V.data() + (p * Cout + co) * kStrip;
          float out[kM][kStrip];
          output_transform(v, out);
          const float bc = bias ? bias[co] : 0.f;
          float* yr = out_base + co * ldo - origin;  // indexed by position
          const float* res = fusion.residual ? fusion.residual + co * L : nullptr;
          auto one_by_one = [&](int64_t k, int64_t kend) {
            int64_t j = (s0 + k) % D, t = MD * (b0 + (s0 + k) / D) + j;  // output 0 of tile s0 + k
            for (; k < kend; ++k) {
              for (int e = 0; e < m; ++e) {
                const int64_t te = t + e * D;
                if (te >= L) break;
                float val = out[e][k];
                if (bias) val = val + bc;
                if (res) val = res[te] + val;
                yr[te] = val;
              }
              if (++j == D) {
                j = 0;
                t += MD - D + 1;
              } else {
                ++t;
              }
            }
          };
          one_by_one(0, kf);
          if (nf > 0) {
            float* st = stage.data();
            stage_outputs(out, kf, nfull, D, st);
            float* yo = yr + tf;
            const float* ro = res ? res + tf : nullptr;
            int64_t i = 0;
            for (; i + 16 <= nf; i += 16) {
              v16 val = load16(st + i);
              if (bias) val = val + bc;
              if (ro) val = load16(ro + i) + val;
              store16(yo + i, val);
            }
            for (; i < nf; ++i) {
              float val = st[i];
              if (bias) val = val + bc;
              if (ro) val = ro[i] + val;
              yo[i] = val;
            }
          }
          one_by_one(ke, cols);
        }
        if (tail) {
          // 3. conv2 over the buffer's complete columns: those of whole blocks done, in runs of 64
          //    (the rest at the task's end). Snake in place, the one-tap products into V2 (one chain
          //    over all input channels, as the direct kernel's tile), then bias, residual, store.
          const bool end = s0 + kStrip >= n;
          const int64_t complete = std::min(MD * ((s0 + cols) / D), L - origin);
          const int64_t upto = end ? complete : complete / kStrip * kStrip;
          if (upto <= done2) continue;
          const ConvWeight& w2 = *tail->conv2;
          for (int64_t c = 0; c < Cout; ++c)
            snake_row(Uo.data() + c * uld + done2, tail->alpha2[c], tail->inv2[static_cast<size_t>(c)],
                      Uo.data() + c * uld + done2, upto - done2, DType::F32);
          for (int64_t c0 = done2; c0 < upto; c0 += kStrip) {
            const int nc = static_cast<int>(std::min<int64_t>(kStrip, upto - c0));
            conv_onetap_strip(w2, Uo.data() + c0, uld, nc, V2.data(), kStrip, Cout);
            for (int64_t co = 0; co < Cout; ++co) {
              if (c0 + 2 * kStrip <= upto || !end) {  // the next run's residual and output lines, into L2
                const float* rn = tail->residual + co * L + origin + c0 + kStrip;
                float* yn = y + co * L + origin + c0 + kStrip;
                for (int q = 0; q < kStrip; q += 16) {
                  __builtin_prefetch(rn + q, 0, 2);
                  __builtin_prefetch(yn + q, 1, 2);
                }
              }
              const float* v = V2.data() + co * kStrip;
              const float* r = tail->residual + co * L + origin + c0;
              float* yo = y + co * L + origin + c0;
              const float b2 = tail->bias2 ? tail->bias2[co] : 0.f;
              int i = 0;
              for (; i + 16 <= nc; i += 16) {
                v16 val = load16(v + i);
                if (tail->bias2) val = val + b2;
                store16(yo + i, load16(r + i) + val);
              }
              for (; i < nc; ++i) {
                float val = v[i];
                if (tail->bias2) val = val + b2;
                yo[i] = r[i] + val;
              }
            }
          }
          done2 = upto;
        }
      }
    }
  });
}

}  // namespace

namespace detail {

void winograd_run(const ThreadPool& pool, const ConvWeight& cw, const float* x, int64_t L, float* y,
                  const ConvFusion& fusion) {
  winograd_impl(pool, cw, x, L, y, fusion, nullptr);
}

}  // namespace detail

bool conv_residual_unit_fuses(const ThreadPool& pool, const ConvWeight& conv1, const ConvWeight& conv2, int64_t L) {
  if (tuning::forced(tuning::Knob::ResidualUnit) == 0) return false;
  if (conv1.empty() || conv2.empty() || L < 1 || !conv1.winograd) return false;
  const int64_t C = conv1.out_channels();
  if (conv1.in_channels() != C || conv2.transposed() || conv2.kernel_size() != 1 || conv2.pad() != 0 ||
      conv2.in_channels() != C || conv2.out_channels() != C)
    return false;
  const int64_t D = conv1.dilation(), ntiles = (L + kM * D - 1) / (kM * D) * D;
  const int64_t tpt = unit_task_tiles(C, ntiles, pool.size(), D);
  return (ntiles + tpt - 1) / tpt >= 4 * int64_t(pool.size());
}

void conv_residual_unit(const ThreadPool& pool, const ConvWeight& conv1, const float* alpha1, const ConvWeight& conv2,
                        const float* alpha2, const float* x, int64_t L, float* y) {
  MM3_CHECK(conv_residual_unit_fuses(pool, conv1, conv2, L) && alpha2,
            "conv_residual_unit: weights or length it does not take (L={}), or no alpha2", L);
  const int64_t C = conv1.out_channels();
  MM3_CHECK(x + C * L <= y || y + C * L <= x, "conv_residual_unit: y overlaps x");
  UnitTail tail{&conv2, alpha2, {}, detail::conv_bias(conv2), x};
  tail.inv2.resize(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) tail.inv2[static_cast<size_t>(c)] = snake_inv(alpha2[c], DType::F32);
  winograd_impl(pool, conv1, x, L, y, {.snake_alpha = alpha1}, &tail);
}

}  // namespace mm3::kern
