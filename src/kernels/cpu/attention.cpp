// attention.cpp — kern::attention (SDPA with GQA) and kern::softmax_rows (kernels.h), the CPU backend.
//
// Follows torch's scaled_dot_product_attention as the reference runs it on CPU (its flash kernel;
// MODEL.md §1.2 GQA + causal, §1.3 causal, §4.1 bidirectional): s = (q . k) * scale in fp32; the
// softmax online over blocks of 512 keys of the reference call's key range (kv_span): per block
// the running max, e = exp(s - max) over the block's 16-wide part with torch's vector exponential
// (fp32 run: exp_u20 = detail::exp20; bf16 run: the faster fexp_u20 = detail::fexp20, processed 32
// at a time with two lane accumulators plus one for a 16-wide remainder) and std::exp over the rest,
// the block sum from those lane sums (tree-reduced) plus the rest in order, earlier sums and partial
// outputs rescaled by exp(old max - new max). e is rounded to the store dtype before P.V (torch
// feeds bf16 probabilities to its bf16 GEMM; the sums use the unrounded e), out = (sum_j e_j v_j) /
// sum accumulated in fp32, rounded once. Emulating
// these steps is what makes a bf16 run land on the reference's bits (e2e golden cases); with store
// F32 nothing is rounded and the result is within a few ulps of the exact softmax.
// The AVX-512 path blocks 4 query rows x 64 keys (scores from a transposed f32 copy of K; a decode
// step's few rows per KV head take direct dot products instead, 16 keys a block) and 4 rows x 64 dims
// (P·V); K / V may be token-major rows or head-major (ldh, the KvCache layout); the portable path walks (query row,
// block of KV heads) items with AVX2 (every K / V row piece loaded once for all the query heads reading it), else one
// (query, head) row at a time. Both take the GEMM form (attention_gemm: gemm_ex products, AVX2 tiles on CPUs without
// AVX-512) for bidirectional attention over many rows with F32 K / V whose heads sit side by side (the DiT). In both
// every output is one sequential FMA chain over the keys, so the thread count never changes a bit. Query head h reads
// KV head h / (Hq / Hkv) (torch's repeat_interleave in repeat_kv / enable_gqa).
#pragma GCC optimize("fp-contract=off")

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/aligned.h"
#include "kernels/cpu/gemm_nt.h"
#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"

namespace mm3::kern {

namespace {

constexpr int64_t kRefKv = 512;  // keys per block of the reference's online softmax (torch kv_split_size)

// exp(s_j - max) in place, returning the fp32 sum (sequential, so the order is fixed).
float exp_shift_sum(float* s, int64_t n, float mx) {
  float sum = 0.f;
  for (int64_t j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] - mx);
    sum += s[j];
  }
  return sum;
}

// Sum of 16 lanes in the tree order of _mm512_reduce_add_ps (lane i + lane i+8, then +4, +2, +1).
[[maybe_unused]] float tree_sum16(const float* l) {
  float t[8];
  for (int i = 0; i < 8; ++i) t[i] = l[i + 8] + l[i];
  for (int i = 0; i < 4; ++i) t[i] = t[i + 4] + t[i];
  return (t[0] + t[2]) + (t[1] + t[3]);
}

void check_args(int64_t ldq, int64_t ldkv, int64_t ldh, int64_t ldo, int64_t Skv, int Hq, int Hkv, int D,
                int64_t q_pos0, DType kv_dtype, int64_t kv_span) {
  MM3_CHECK(Hq > 0 && Hkv > 0 && Hq % Hkv == 0, "attention: Hq={} not a multiple of Hkv={}", Hq, Hkv);
  MM3_CHECK(D > 0 && ldq >= int64_t(Hq) * D && ldo >= int64_t(Hq) * D && ldh >= D &&
                ldkv >= (ldh == D ? int64_t(Hkv) * D : int64_t(D)),
            "attention: D={} ldq={} ldkv={} ldh={} ldo={} for Hq={} Hkv={}", D, ldq, ldkv, ldh, ldo, Hq, Hkv);
  MM3_CHECK(kv_dtype == DType::F32 || kv_dtype == DType::BF16, "attention: kv dtype {} unsupported",
            dtype_name(kv_dtype));
  MM3_CHECK(Skv > 0 && q_pos0 >= 0, "attention: Skv={} q_pos0={}", Skv, q_pos0);
  MM3_CHECK(kv_span == 0 || kv_span >= Skv, "attention: kv_span={} < Skv={}", kv_span, Skv);
}

}  // namespace

#if defined(__AVX512F__)
namespace {

constexpr int kRB = 4;    // query rows per register block
constexpr int kKB = 64;   // keys per score block (4 zmm)
constexpr int kDB = 64;   // head dims per PV block (4 zmm)

inline __mmask16 lane_mask(int64_t n) { return detail::tail_mask(std::max<int64_t>(0, n)); }

// The score and P·V loops prefetch each key's row kPfKeys keys ahead (~16 x 256 B in flight per
// thread for the LM). With token-major cache rows (a head's keys 2 KiB apart) the hardware prefetchers
// left most K / V lines to demand misses (attention_lm_decode_513 49 ms without, 3 GB/s); with the
// head-major KvCache (contiguous keys) they still do little on Zen 5: 18.7 ms without, 4.3 ms with,
// and 8 / 32 / 64 keys ahead were no better than 16. Prefetches change no value.
constexpr int64_t kPfKeys = 16;
#define MM3_ATTN_INLINE inline __attribute__((always_inline))

inline __attribute__((always_inline)) void prefetch_row(const void* base, bool bf16, int64_t off, int n) {
  const char* p = static_cast<const char*>(base) + off * (bf16 ? 2 : 4);
  const char* const e = p + int64_t(n) * (bf16 ? 2 : 4);
  for (; p < e; p += 64) __builtin_prefetch(p, 0, 3);
}

// One work item: KV head hk, query rows [i0, i0 + nq) of all `group` query heads that read hk.
// Rows are ordered (query, head-in-group). Scores come from K transposed ([D][Skv64], f32) so each
// FMA produces 16 scores; every output element is still one sequential FMA chain over keys.
struct AttnItem {
  const float* q;
  int64_t ldq;
  const void* k;        // K in its own layout (direct scores) ...
  bool kbits;           // ... as bf16 bits
  const float* kt;      // or transposed, [D][ldkt] for this kv head (null: direct scores)
  int64_t ldkt;         // row stride of kt
  int64_t skv64;        // keys padded to a multiple of 64
  const void* v;
  int64_t ldkv;         // key stride of K and V
  int64_t ldh;          // KV head stride (D: heads side by side in a key's row)
  bool vb;              // V is bf16 bits
  float* out;
  int64_t ldo;
  int64_t Skv;
  int group, hk, D;
  float scale;
  bool causal;
  int64_t q_pos0;
  int64_t kv_span;      // keys in the reference's call (block widths of its softmax)
  DType store;
};

// The whole 32-key steps [j, vfast) of a bf16 run's block as softmax_numerators takes them (e = fexp20 of
// the scaled, shifted scores x; l0 / l1 the sums of the even / odd 16-key halves), the numerators stored
// as bf16 bits in p by one VCVTNE2PS2BF16 per 32 (round to nearest even, as round_bf16_v). A shifted
// score is at most 0, so fexp20's clamps only act below ln(FLT_MIN) ~ -87.3 (and on NaN); a step whose
// 32 x are all >= -86 takes fexp20 without them, and its e are normal numbers (>= ~2^-124), which
// VCVTNE2PS2BF16 rounds as round_bf16_v does (it would flush a subnormal to zero). Any other step (a
// score ~86 below the row's maximum, or NaN) takes the full fexp20 and the rounding in integer
// operations. The same bits either way; the common step has 31 operations instead of 50 (two fexp20
// clamp pairs, two 7-operation roundings and a permute). Returns where it stopped. Needs AVX512-BF16
// (callers pass p only with it).
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16"))) int64_t numerators_to_bf16(
    const float* s, uint16_t* p, int64_t j, int64_t vfast, __m512 vsc, __m512 m, __m512& l0, __m512& l1,
    __m512i odd16) {
  const __m512 safe = _mm512_set1_ps(-86.0f);
  for (; j + 32 <= vfast; j += 32) {
    const __m512 x0 = _mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(s + j), vsc), m);
    const __m512 x1 = _mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(s + j + 16), vsc), m);
    __m512 e0, e1;
    // not (x >= -86): below it, or NaN
    if (__builtin_expect((_mm512_cmp_ps_mask(x0, safe, _CMP_NGE_UQ) | _mm512_cmp_ps_mask(x1, safe, _CMP_NGE_UQ)) != 0,
                         0)) {
      e0 = detail::fexp20_v(x0), e1 = detail::fexp20_v(x1);
      _mm512_storeu_si512(p + j, _mm512_permutex2var_epi16(_mm512_castps_si512(detail::round_bf16_v(e0)), odd16,
                                                           _mm512_castps_si512(detail::round_bf16_v(e1))));
    } else {
      e0 = detail::fexp20_unclamped_v(x0), e1 = detail::fexp20_unclamped_v(x1);
      _mm512_storeu_si512(p + j, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
    }
    l0 = _mm512_add_ps(l0, e0), l1 = _mm512_add_ps(l1, e1);
  }
  return j;
}

// Softmax numerators of `rows` score rows in place (row r: s + r·lds, keys [0, nk[r])), the reference's
// way (see the header): per 512-key block b, the running max m_b, e = exp(s - m_b) (exp20 over the
// block's 16-wide part, std::exp over its remainder), the block sum from 16 lane sums plus the
// remainder in order, the running sum rescaled by alpha_b = exp(m_{b-1} - m_b); e stored rounded to
// `store` for the P.V pass. alpha [rows][nblk], inv [rows] = 1 / the final sum.
// The scores are S · scale (the products rounded to fp32 as read, so a caller need not scale S in a pass
// of its own; 1 for scores already scaled). With p16 (store BF16 only) the numerators go to p16 + r·ldp
// as bf16 bits, the input of the bf16 P·V tiles, and S is left as it was.
void softmax_numerators(float* S, int64_t lds, int rows, const int64_t* nk, int64_t nblk, int64_t kv_span, DType store,
                        float scale, float* alpha, float* inv, uint16_t* p16 = nullptr, int64_t ldp = 0) {
  const bool bf = store == DType::BF16;
  const __m512 vsc = _mm512_set1_ps(scale);
  alignas(64) static const uint16_t odd_words[32] = {1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
                                                     33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
  const __m512i odd16 = _mm512_load_si512(odd_words);
  for (int r = 0; r < rows; ++r) {
    float* s = S + size_t(r) * lds;
    uint16_t* p = p16 ? p16 + size_t(r) * ldp : nullptr;
    const int64_t n = nk[r];
    float m_run = -std::numeric_limits<float>::infinity(), sum_run = 0.f;
    for (int64_t j0 = 0, b = 0; j0 < n; j0 += kRefKv, ++b) {
      const int64_t j1 = std::min(n, j0 + kRefKv);
      const int64_t bw = std::min<int64_t>(kRefKv, kv_span - j0);
      const int64_t vend = std::min(j1, j0 + bw / 16 * 16);
      const int64_t vend2 = bf ? j0 + bw / 32 * 32 : j0;
      __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
      for (int64_t j = j0; j < j1; j += 16)
        mx = _mm512_mask_max_ps(mx, lane_mask(j1 - j), mx, _mm512_mul_ps(_mm512_loadu_ps(s + j), vsc));
      const float m_new = std::max(m_run, _mm512_reduce_max_ps(mx));
      const __m512 m = _mm512_set1_ps(m_new);
      __m512 lanes[3] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
      int64_t j = j0;
      if (bf) {
        // Whole 32-key steps of the paired part first, as the loop below would take them (slots 0 and 1
        // alternate), with the accumulators in registers and the 32 bf16 numerators gathered into one
        // 64-byte store (GCC turned the 16-wide store into VPMOVDW to memory, ~1/4 of this pass).
        const int64_t vfast = std::min(vend, vend2);
        __m512 l0 = lanes[0], l1 = lanes[1];
        if (p) j = numerators_to_bf16(s, p, j, vfast, vsc, m, l0, l1, odd16);
        for (; j + 32 <= vfast; j += 32) {
          const __m512 e0 = detail::fexp20_v(_mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(s + j), vsc), m));
          const __m512 e1 = detail::fexp20_v(_mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(s + j + 16), vsc), m));
          l0 = _mm512_add_ps(l0, e0), l1 = _mm512_add_ps(l1, e1);
          if (p)  // the upper halves of the rounded values, in order
            _mm512_storeu_si512(p + j, _mm512_permutex2var_epi16(_mm512_castps_si512(detail::round_bf16_v(e0)), odd16,
                                                                 _mm512_castps_si512(detail::round_bf16_v(e1))));
          else
            _mm512_storeu_ps(s + j, detail::round_bf16_v(e0)), _mm512_storeu_ps(s + j + 16, detail::round_bf16_v(e1));
        }
        lanes[0] = l0, lanes[1] = l1;
      } else if (!p) {
        // fp32: every whole vector into slot 2 as the loop below would add it, the sum in a register (in
        // the array, indexed by a runtime slot, each add waited on the last one's store)
        __m512 l2 = lanes[2];
        for (; j + 16 <= vend; j += 16) {
          const __m512 e = detail::exp20_v(_mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(s + j), vsc), m));
          l2 = _mm512_add_ps(l2, e);
          _mm512_storeu_ps(s + j, e);
        }
        lanes[2] = l2;
      }
      for (; j < vend; j += 16) {
        const __mmask16 msk = lane_mask(vend - j);
        const __m512 x = _mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(s + j), vsc), m);
        const __m512 e = bf ? detail::fexp20_v(x) : detail::exp20_v(x);
        const int slot = j < vend2 ? static_cast<int>(((j - j0) / 16) & 1) : 2;
        lanes[slot] = _mm512_mask_add_ps(lanes[slot], msk, lanes[slot], e);
        const __m512 er = detail::round_store_v(e, store);
        if (p)  // a bf16 value: its bits are the float's upper half
          _mm256_mask_storeu_epi16(p + j, msk, _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(er), 16)));
        else
          _mm512_mask_storeu_ps(s + j, msk, er);
      }
      float bsum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(lanes[0], lanes[2]), lanes[1]));
      for (int64_t j = vend; j < j1; ++j) {
        const float e = std::exp(s[j] * scale - m_new);
        bsum += e;
        if (p)
          p[j] = f32_to_bf16_bits(e);
        else
          s[j] = round_store(e, store);
      }
      const float al = std::exp(m_run - m_new);
      sum_run = std::fma(al, sum_run, bsum);
      alpha[size_t(r) * nblk + b] = al;
      m_run = m_new;
    }
    inv[r] = 1.0f / sum_run;
  }
}

// The 16 sums of a[0..15] (key k's accumulator in a[k]) in one vector, lane k = key k. Each is added
// up in _mm512_reduce_add_ps's tree as GCC defines it (lanes i and i + 8, then i and i + 4, then
// (0 + 2) + (1 + 3)), so a block of keys gets the bits of 16 separate reductions, in 30 shuffles and 15
// adds instead of ~130 dependent operations. (IEEE addition commutes bit for bit; only the tree counts.)
MM3_ATTN_INLINE __m512 reduce16_keys(const __m512* a) {
  __m512 b[8], c[4], d[2];
  for (int i = 0; i < 8; ++i)  // [key 2i lanes 0-7 + 8-15 | key 2i+1's]
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // 128-bit lane l: key 4i + l, its 4 lanes + the next 4
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)  // lane l: (key 8i + l: 0 + 2, 1 + 3), (key 8i + 4 + l: the same)
    d[i] =
        _mm512_add_ps(_mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0x44), _mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0xEE));
  // element 4l + m: key 4m + l
  const __m512 e = _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD));
  return _mm512_permutexvar_ps(_mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0), e);
}

// Decode scores of RN query rows (same KV head) over keys [0, nk): S[r][j] = (q_r . k_j) * scale, each
// a 16-lane FMA chain over the head dims, reduced as _mm512_reduce_add_ps does. KN keys' chains run
// side by side (RN * KN accumulators: one key's 8 dependent FMAs left the core idle), and the
// reductions go 16 keys at a time through reduce16_keys. The row count and the K dtype are template
// parameters so the accumulators stay in registers.
template <int RN, bool KB>
MM3_ATTN_INLINE void direct_scores(const AttnItem& a, const float* const* q, int64_t nk, float* S) {
  constexpr int KN = RN <= 2 ? 8 : 4;
  __m512 acc[RN][16];
  const __m512 vscale = _mm512_set1_ps(a.scale);
  const int64_t base = a.hk * a.ldh;
  for (int64_t j0 = 0; j0 < nk; j0 += 16) {
    const int nb = static_cast<int>(std::min<int64_t>(16, nk - j0));
    for (int jj = 0; jj < 16; jj += KN) {
      __m512 s[RN][KN];
      for (int r = 0; r < RN; ++r)
        for (int t = 0; t < KN; ++t) s[r][t] = _mm512_setzero_ps();
      if (jj < nb) {  // keys past nk: zeros, never stored
        int64_t off[KN];
        for (int t = 0; t < KN; ++t) {
          const int64_t j = std::min<int64_t>(j0 + jj + t, nk - 1);
          off[t] = j * a.ldkv + base;
          if (j + kPfKeys < nk) prefetch_row(a.k, KB, off[t] + kPfKeys * a.ldkv, a.D);
        }
        for (int d = 0; d < a.D; d += 16) {
          const __mmask16 m = lane_mask(a.D - d);
          __m512 kv[KN];
          for (int t = 0; t < KN; ++t)
            kv[t] = KB ? detail::maskz_load_bf16_v(m, static_cast<const uint16_t*>(a.k) + off[t] + d)
                       : _mm512_maskz_loadu_ps(m, static_cast<const float*>(a.k) + off[t] + d);
          for (int r = 0; r < RN; ++r) {
            const __m512 qv = _mm512_maskz_loadu_ps(m, q[r] + d);
            for (int t = 0; t < KN; ++t) s[r][t] = _mm512_fmadd_ps(qv, kv[t], s[r][t]);
          }
        }
      }
      for (int r = 0; r < RN; ++r)
        for (int t = 0; t < KN; ++t) acc[r][jj + t] = s[r][t];
    }
    for (int r = 0; r < RN; ++r)
      _mm512_mask_storeu_ps(S + size_t(r) * a.ldkt + j0, lane_mask(nb), _mm512_mul_ps(reduce16_keys(acc[r]), vscale));
  }
}

struct PvArgs {
  const AttnItem& a;
  const float* S;      // the block's first row of probabilities (row stride a.ldkt)
  const float* alpha;  // the block's first row of rescale factors (row stride nblk)
  int64_t nblk;
  int d0;
  const __mmask16* dm;  // [4] lane masks of dims d0 .. d0 + 64
  int64_t nkmax;        // prefetch bound
};

// acc[r][c] += p_rj * v_j[d0 + 16c ..] for keys j < nk in order, rescaled by alpha at each 512-key
// block boundary (the loop attention_item ran inline before; same operations, same order).
template <int RN, bool VB>
MM3_ATTN_INLINE void pv_keys(const PvArgs& pa, int64_t nk, __m512 (&acc)[kRB][4]) {
  const AttnItem& a = pa.a;
  const int dn = std::min(kDB, a.D - pa.d0);
  // The first pass over the keys (dims 0..63) fetches whole rows, so later passes find them in L2
  // rather than stream the same lines' other halves from memory again.
  const int pf_n = pa.d0 == 0 ? a.D : dn;
  __m512 ac[RN][4];
  for (int r = 0; r < RN; ++r)
    for (int c = 0; c < 4; ++c) ac[r][c] = acc[r][c];
  for (int64_t j = 0; j < nk;) {
    if (j > 0 && j % kRefKv == 0)
      for (int r = 0; r < RN; ++r) {
        const __m512 al = _mm512_set1_ps(pa.alpha[size_t(r) * pa.nblk + j / kRefKv]);
        for (int c = 0; c < 4; ++c) ac[r][c] = _mm512_mul_ps(ac[r][c], al);
      }
    for (const int64_t je = std::min(nk, (j / kRefKv + 1) * kRefKv); j < je; ++j) {
      const int64_t off = j * a.ldkv + a.hk * a.ldh + pa.d0;
      if (j + kPfKeys < pa.nkmax) prefetch_row(a.v, VB, off + kPfKeys * a.ldkv, pf_n);
      __m512 vv[4];
      for (int c = 0; c < 4; ++c)
        vv[c] = VB ? detail::maskz_load_bf16_v(pa.dm[c], static_cast<const uint16_t*>(a.v) + off + 16 * c)
                   : _mm512_maskz_loadu_ps(pa.dm[c], static_cast<const float*>(a.v) + off + 16 * c);
      for (int r = 0; r < RN; ++r) {
        const __m512 p = _mm512_set1_ps(pa.S[size_t(r) * a.ldkt + j]);
        for (int c = 0; c < 4; ++c) ac[r][c] = _mm512_fmadd_ps(p, vv[c], ac[r][c]);
      }
    }
  }
  for (int r = 0; r < RN; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = ac[r][c];
}

void attention_item(const AttnItem& a, int64_t i0, int64_t nq, aligned_vector<float>& S) {
  const int rows = static_cast<int>(nq) * a.group;
  S.resize(static_cast<size_t>(rows) * a.ldkt);
  std::vector<const float*> qr(rows);
  std::vector<float*> orow(rows);
  std::vector<int64_t> nk(rows);
  for (int r = 0; r < rows; ++r) {
    const int64_t i = i0 + r / a.group;
    const int h = a.hk * a.group + r % a.group;
    qr[r] = a.q + i * a.ldq + int64_t(h) * a.D;
    orow[r] = a.out + i * a.ldo + int64_t(h) * a.D;
    nk[r] = a.causal ? std::min<int64_t>(a.Skv, a.q_pos0 + i + 1) : a.Skv;
  }
  const __m512 vscale = _mm512_set1_ps(a.scale);
  // ---- scores, few rows (decode): per key, D-wide FMAs for 4 rows, then one reduction each ----
  if (!a.kt) {
    for (int rb = 0; rb < rows; rb += kRB) {
      const int rn = std::min(kRB, rows - rb);
      int64_t nkmax = 0;
      for (int r = 0; r < rn; ++r) nkmax = std::max(nkmax, nk[rb + r]);
      float* srow = S.data() + size_t(rb) * a.ldkt;
      const float* const* q = qr.data() + rb;
      switch (rn * 2 + (a.kbits ? 1 : 0)) {
        case 2: direct_scores<1, false>(a, q, nkmax, srow); break;
        case 3: direct_scores<1, true>(a, q, nkmax, srow); break;
        case 4: direct_scores<2, false>(a, q, nkmax, srow); break;
        case 5: direct_scores<2, true>(a, q, nkmax, srow); break;
        case 6: direct_scores<3, false>(a, q, nkmax, srow); break;
        case 7: direct_scores<3, true>(a, q, nkmax, srow); break;
        case 8: direct_scores<4, false>(a, q, nkmax, srow); break;
        default: direct_scores<4, true>(a, q, nkmax, srow); break;
      }
    }
  }
  // ---- scores, many rows: S[r][j] = (q_r . k_j) * scale, 4 rows x 64 keys per register block ----
  for (int rb = 0; a.kt && rb < rows; rb += kRB) {
    const int rn = std::min(kRB, rows - rb);
    int64_t nkmax = 0;
    for (int r = 0; r < rn; ++r) nkmax = std::max(nkmax, nk[rb + r]);
    for (int64_t jb = 0; jb < nkmax; jb += kKB) {
      __m512 acc[kRB][4];
      for (int r = 0; r < kRB; ++r)
        for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
      const float* kt = a.kt + jb;
      for (int d = 0; d < a.D; ++d) {
        const float* kr = kt + int64_t(d) * a.ldkt;
        const __m512 k0 = _mm512_loadu_ps(kr), k1 = _mm512_loadu_ps(kr + 16), k2 = _mm512_loadu_ps(kr + 32),
                     k3 = _mm512_loadu_ps(kr + 48);
        for (int r = 0; r < rn; ++r) {
          const __m512 qv = _mm512_set1_ps(qr[rb + r][d]);
          acc[r][0] = _mm512_fmadd_ps(qv, k0, acc[r][0]);
          acc[r][1] = _mm512_fmadd_ps(qv, k1, acc[r][1]);
          acc[r][2] = _mm512_fmadd_ps(qv, k2, acc[r][2]);
          acc[r][3] = _mm512_fmadd_ps(qv, k3, acc[r][3]);
        }
      }
      for (int r = 0; r < rn; ++r)
        for (int c = 0; c < 4; ++c)
          _mm512_storeu_ps(S.data() + size_t(rb + r) * a.ldkt + jb + 16 * c, _mm512_mul_ps(acc[r][c], vscale));
    }
  }
  // ---- softmax numerators in place, the reference's way (see the header): per 512-key block b, the
  // running max m_b, e = exp(s - m_b) (exp20 over the block's 16-wide part, std::exp over its
  // remainder), the block sum from 16 lane sums plus the remainder in order, the running sum
  // rescaled by alpha_b = exp(m_{b-1} - m_b); e stored rounded to `store` for the P.V pass.
  int64_t nkall = 0;
  for (int r = 0; r < rows; ++r) nkall = std::max(nkall, nk[r]);
  const int64_t nblk = (nkall + kRefKv - 1) / kRefKv;
  aligned_vector<float> inv(rows), alpha(static_cast<size_t>(rows) * nblk);
  softmax_numerators(S.data(), a.ldkt, rows, nk.data(), nblk, a.kv_span, a.store, /*scale: applied above*/ 1.0f,
                     alpha.data(), inv.data());
  // ---- out_r = (sum_j e_rj v_j) * inv_r: 4 rows x 64 dims in registers, keys sequential; at each
  // 512-key boundary the row's partial sum is rescaled by alpha_b first ----
  for (int rb = 0; rb < rows; rb += kRB) {
    const int rn = std::min(kRB, rows - rb);
    int64_t nkmin = nk[rb], nkmax = nk[rb];
    for (int r = 0; r < rn; ++r) nkmin = std::min(nkmin, nk[rb + r]), nkmax = std::max(nkmax, nk[rb + r]);
    for (int d0 = 0; d0 < a.D; d0 += kDB) {
      __mmask16 dm[4];
      for (int c = 0; c < 4; ++c) dm[c] = lane_mask(a.D - d0 - 16 * c);
      __m512 acc[kRB][4];
      for (int r = 0; r < kRB; ++r)
        for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
      const int dn = std::min(kDB, a.D - d0);
      auto load_v = [&](int64_t j, __m512(&vv)[4]) {
        const int64_t off = j * a.ldkv + a.hk * a.ldh + d0;
        if (j + kPfKeys < nkmax) prefetch_row(a.v, a.vb, off + kPfKeys * a.ldkv, d0 == 0 ? a.D : dn);
        for (int c = 0; c < 4; ++c)
          vv[c] = a.vb ? detail::maskz_load_bf16_v(dm[c], static_cast<const uint16_t*>(a.v) + off + 16 * c)
                       : _mm512_maskz_loadu_ps(dm[c], static_cast<const float*>(a.v) + off + 16 * c);
      };
      auto rescale = [&](int r, int64_t j) {
        const __m512 al = _mm512_set1_ps(alpha[size_t(rb + r) * nblk + j / kRefKv]);
        for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_mul_ps(acc[r][c], al);
      };
      {
        const PvArgs pa{a, S.data() + size_t(rb) * a.ldkt, alpha.data() + size_t(rb) * nblk, nblk, d0, dm, nkmax};
        switch (rn * 2 + (a.vb ? 1 : 0)) {
          case 2: pv_keys<1, false>(pa, nkmin, acc); break;
          case 3: pv_keys<1, true>(pa, nkmin, acc); break;
          case 4: pv_keys<2, false>(pa, nkmin, acc); break;
          case 5: pv_keys<2, true>(pa, nkmin, acc); break;
          case 6: pv_keys<3, false>(pa, nkmin, acc); break;
          case 7: pv_keys<3, true>(pa, nkmin, acc); break;
          case 8: pv_keys<4, false>(pa, nkmin, acc); break;
          default: pv_keys<4, true>(pa, nkmin, acc); break;
        }
      }
      for (int r = 0; r < rn; ++r) {  // rows that see more keys (causal) continue their own chain
        for (int64_t j = nkmin; j < nk[rb + r]; ++j) {
          if (j > 0 && j % kRefKv == 0) rescale(r, j);
          __m512 vv[4];
          load_v(j, vv);
          const __m512 p = _mm512_set1_ps(S[size_t(rb + r) * a.ldkt + j]);
          for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_fmadd_ps(p, vv[c], acc[r][c]);
        }
        const __m512 iv = _mm512_set1_ps(inv[rb + r]);
        for (int c = 0; c < 4; ++c)
          if (dm[c])
            _mm512_mask_storeu_ps(orow[rb + r] + d0 + 16 * c, dm[c],
                                  detail::round_store_v(_mm512_mul_ps(acc[r][c], iv), a.store));
      }
    }
  }
}

}  // namespace
#else
namespace {

// Portable softmax_numerators: the reference's block softmax of the AVX-512 version above, its 16
// lanes emulated (also the portable attention's row loop below); with AVX2 the
// exponentials of whole 16-key groups go 8 at a time (exp20_v8 / fexp20_v8 equal their scalar twins
// lane for lane, and each lane still adds its keys in order), so the bits are the same either way.
// e of 16 scores s · scale (written to out, rounded to store; as bf16 bits to p16 when given).
MM3_SIMD_AVX2 void exp_group16_avx2(const float* s, float scale, float m_new, bool bf, DType store, float* lanes,
                                    float* out, uint16_t* p16) {
  const __m256 m = _mm256_set1_ps(m_new), vsc = _mm256_set1_ps(scale);
  for (int h = 0; h < 2; ++h) {
    const __m256 x = _mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(s + 8 * h), vsc), m);
    const __m256 e = bf ? detail::fexp20_v8(x) : detail::exp20_v8(x);
    _mm256_storeu_ps(lanes + 8 * h, _mm256_add_ps(_mm256_loadu_ps(lanes + 8 * h), e));
    const __m256 er = store == DType::BF16 ? detail::round_bf16_v8(e) : e;
    if (p16) {
      alignas(32) float t[8];
      _mm256_store_ps(t, er);
      for (int i = 0; i < 8; ++i) p16[8 * h + i] = f32_to_bf16_bits(t[i]);
    } else {
      _mm256_storeu_ps(out + 8 * h, er);
    }
  }
}

void softmax_numerators(float* S, int64_t lds, int rows, const int64_t* nk, int64_t nblk, int64_t kv_span, DType store,
                        float scale, float* alpha, float* inv, uint16_t* p16 = nullptr, int64_t ldp = 0) {
  const bool bf = store == DType::BF16;
  const bool avx2 = detail::cpu_has_avx2_fma();
  for (int r = 0; r < rows; ++r) {
    float* s = S + size_t(r) * lds;
    uint16_t* p = p16 ? p16 + size_t(r) * ldp : nullptr;
    const int64_t n = nk[r];
    float m_run = -std::numeric_limits<float>::infinity(), sum_run = 0.f;
    for (int64_t j0 = 0, b = 0; j0 < n; j0 += kRefKv, ++b) {
      const int64_t j1 = std::min(n, j0 + kRefKv);
      const int64_t bw = std::min<int64_t>(kRefKv, kv_span - j0);
      const int64_t vend = std::min(j1, j0 + bw / 16 * 16);
      const int64_t vend2 = bf ? j0 + bw / 32 * 32 : j0;
      float m_new = m_run;
      for (int64_t j = j0; j < j1; ++j) m_new = std::max(m_new, s[j] * scale);
      float lanes[3][16] = {};
      auto put = [&](int64_t j, float e) {
        if (p)
          p[j] = f32_to_bf16_bits(e);
        else
          s[j] = round_store(e, store);
      };
      int64_t j = j0;
      if (avx2)
        for (; j + 16 <= vend; j += 16)
          exp_group16_avx2(s + j, scale, m_new, bf, store, lanes[j < vend2 ? ((j - j0) / 16) & 1 : 2], s + j,
                           p ? p + j : nullptr);
      for (; j < vend; ++j) {
        const float e = bf ? detail::fexp20(s[j] * scale - m_new) : detail::exp20(s[j] * scale - m_new);
        const int slot = j < vend2 ? static_cast<int>(((j - j0) / 16) & 1) : 2;
        lanes[slot][(j - j0) % 16] += e;
        put(j, e);
      }
      for (int l = 0; l < 16; ++l) lanes[0][l] = (lanes[0][l] + lanes[2][l]) + lanes[1][l];
      float bsum = tree_sum16(lanes[0]);
      for (int64_t j = vend; j < j1; ++j) {
        const float e = std::exp(s[j] * scale - m_new);
        bsum += e;
        put(j, e);
      }
      const float al = std::exp(m_run - m_new);
      sum_run = std::fma(al, sum_run, bsum);
      alpha[size_t(r) * nblk + b] = al;
      m_run = m_new;
    }
    inv[r] = 1.0f / sum_run;
  }
}

}  // namespace
#endif

namespace {

// Bidirectional attention over many query rows with F32 K / V (the DiT: 690 x 690 per head) as
// GEMMs: per task (query head h, block of kGemmQB or kGemmQB16 rows) S = Q_h K_h^T (gemm_ex, fp32), the reference's
// blocked softmax numerators of S·scale (softmax_numerators, scaling as it reads), then per 512-key
// block O_b = E_b V_b (gemm_ex) combined as O = O·alpha_b + O_b, out = O·inv rounded once. K_h and
// the V_b are packed once per call in the tiles' layout (pack_*_panels_serial), not per task. The same
// operations as attention_item up to the summation order of the two products (blocked GEMM chains
// instead of one FMA chain per output), so not the same bits; well inside the fp32 gates (rel RMS
// 1e-5). Each task runs its GEMMs on one thread (nested parallel_for runs inline), so the result does
// not depend on the thread count. attention_dit_L690 (32 heads x 64, 690 tokens, fp32): 64 ms a
// layer by the direct path (61 GFLOP/s) -> 16.7 ms (235 GFLOP/s). DiT goldens: rel RMS 2e-7.
// With store BF16 on a CPU with AVX512-BF16 both products take bf16 pair dots (VDPBF16PS, gemm_ex's
// bf16 form) instead: q, k and v rounded to bf16 (exact for a bf16 computation's bf16-valued tensors),
// K and V packed once per call straight from their fp32 rows (pack_bf16_panels_from_f32_part: V
// k-major, so no transpose), Q converted to bf16 rows once per call, the probabilities written by
// softmax_numerators straight as bf16 bits (P16) and multiplied by gemm_bf16_packed_serial. Products of
// bf16 values are exact in fp32, so only the summation order (in pairs) differs from the fp32 GEMMs.
// attention_dit_L690_bf16 on 2 Zen 5 cores:
// 13.1-13.9 ms with the per-task packing and f32 copies of P, 10.5-12.4 ms packed once (medians,
// 5 alternations); attention_dit_L690 (fp32) 23.9-25.4 -> 21.6-24.5 ms. Same bits as before. Twentieth
// session (a noisier host; alternations x 60 runs, min / median): 11.3-11.7 / 11.8-14.0 ms ->
// 9.9-10.3 / 10.1-12.3 ms with K / V packed from fp32 (a bf16 copy of K and a scalar bf16 transpose of
// V had been ~1/5 of the samples), Q converted in one pass and 32-key softmax steps; same bits.
// Query rows per task: 128 for the fp32 GEMMs' 8-row tiles, 126 for the bf16 6-row tiles (a 128-row block
// left a 2-row tile, 1.5% of attention_dit_L690_bf16's samples; 690 = 5 x 126 + 60 fills every tile).
// Which rows share a task changes no bit.
constexpr int64_t kGemmQB = 128, kGemmQB16 = 126;
constexpr int64_t kGemmMinRows = 64;  // below this the direct path is as fast (and takes tiny cases)

void attention_gemm(const ThreadPool& pool, const float* q, int64_t ldq, const float* k, const float* v, int64_t ldkv,
                    float* out, int64_t ldo, int64_t Sq, int64_t Skv, int Hq, int Hkv, int D, float scale,
                    int64_t span, DType store) {
  const int group = Hq / Hkv;
  const bool bfdot = store == DType::BF16 && detail::cpu_has_avx512bf16();
  const int64_t qb = bfdot ? kGemmQB16 : kGemmQB;
  const int64_t nqb = (Sq + qb - 1) / qb;
  const int64_t nblk = (Skv + kRefKv - 1) / kRefKv;
  int64_t lds = (Skv + 15) / 16 * 16;
  if (lds % 1024 == 0) lds += 16;            // no 4 KiB-aliased rows
  const int64_t Dp = (D + 1) & ~int64_t(1);  // bf16 rows of Q padded to whole pairs
  // Each KV head's K (B of S = Q K^T: [Skv, D]) and its V blocks (B of O_b = P_b V_b: [D, w] per 512-key
  // block) packed once per call in the layout the GEMM tiles read, shared by the head's query blocks
  // (packing them per (head, query block) was ~1/5 of this kernel). Offsets in elements of the form.
  const int64_t kpack = bfdot ? detail::pack_bf16_panels_size(Skv, D) : detail::pack_f32_panels_size(Skv, D);
  const int64_t vpack = bfdot ? detail::pack_bf16_panels_size(D, kRefKv) : detail::pack_f32_panels_size(D, kRefKv);
  const int64_t per_head = kpack + nblk * vpack;
  // Scratch kept between calls (the caller's for Q's bf16 rows and the packed forms, each worker's for its
  // blocks): fresh zeroed buffers per call and per chunk cost their memset and page faults, ~1/3 of the
  // samples of attention_dit_L690_bf16. Every element a GEMM reads is written first.
  thread_local aligned_vector<uint16_t> pk16_buf, q16_buf;
  thread_local aligned_vector<float> pk32_buf;
  uint16_t* pk16 = nullptr;
  float* pk32 = nullptr;
  // Q as bf16 rows [Sq, Hq·Dp] (each head's D values, an odd D's pad zero), converted in one pass over whole
  // rows before the tasks (each task converting its 128 strided pieces had taken twice as long)
  const int64_t ldq16 = int64_t(Hq) * Dp;
  uint16_t* q16 = nullptr;
  if (bfdot) {
    if (pk16_buf.size() < static_cast<size_t>(Hkv * per_head)) pk16_buf.resize(static_cast<size_t>(Hkv * per_head));
    pk16 = pk16_buf.data();
    if (q16_buf.size() < static_cast<size_t>(Sq * ldq16)) q16_buf.resize(static_cast<size_t>(Sq * ldq16));
    q16 = q16_buf.data();
    pool.parallel_for(
        Sq,
        [&](int64_t i0, int64_t i1) {
          for (int64_t i = i0; i < i1; ++i) {
            if (Dp == D) {
              f32_to_bf16(q + i * ldq, q16 + i * ldq16, static_cast<size_t>(ldq16));
              continue;
            }
            for (int h = 0; h < Hq; ++h) {
              f32_to_bf16(q + i * ldq + int64_t(h) * D, q16 + i * ldq16 + h * Dp, static_cast<size_t>(D));
              q16[i * ldq16 + h * Dp + D] = 0;  // an odd D's pad: the last pair's second half
            }
          }
        },
        8);
    // K (n-major rows) and V (k-major: B[d, j] = V[j0 + j, d]) packed straight from the fp32 rows, rounded
    // to bf16 as read (a bf16 copy of K and a transposed bf16 copy of V took ~1/5 of this kernel). Tasks
    // are 32-key chunks of K, and of each 512-key V block, every head packed from the chunk's rows in turn
    // (a task per head, reading a 256-byte slice of each row, every row in another 4 KiB page, took ~1/4
    // longer: 9.3% -> 7.5% of the samples).
    const int64_t kch = (Skv + 31) / 32;
    pool.parallel_for(2 * kch, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const bool is_v = t >= kch;
        const int64_t j = (t % kch) * 32, je = std::min(Skv, j + 32);
        const int64_t b = j / kRefKv, j0 = b * kRefKv, w = std::min(kRefKv, Skv - j0);
        for (int hk = 0; hk < Hkv; ++hk) {
          uint16_t* dst = pk16 + hk * per_head;
          if (!is_v)
            detail::pack_bf16_panels_from_f32_part(k + hk * D, ldkv, /*b_kmajor=*/false, Skv, D, j, je, dst);
          else
            detail::pack_bf16_panels_from_f32_part(v + j0 * ldkv + hk * D, ldkv, /*b_kmajor=*/true, D, w, j - j0,
                                                   je - j0, dst + kpack + b * vpack);
        }
      }
    });
  } else {
    if (pk32_buf.size() < static_cast<size_t>(Hkv * per_head)) pk32_buf.resize(static_cast<size_t>(Hkv * per_head));
    pk32 = pk32_buf.data();
    // The same 32-key chunks of whole rows as the bf16 form's (B[d, j] = V[j0 + j, d]: V's rows are the
    // k-major form)
    const int64_t kch = (Skv + 31) / 32;
    pool.parallel_for(2 * kch, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const bool is_v = t >= kch;
        const int64_t j = (t % kch) * 32, je = std::min(Skv, j + 32);
        const int64_t b = j / kRefKv, j0 = b * kRefKv, w = std::min(kRefKv, Skv - j0);
        for (int hk = 0; hk < Hkv; ++hk) {
          float* dst = pk32 + hk * per_head;
          if (!is_v)
            detail::pack_f32_panels_part(k + hk * D, ldkv, /*b_kmajor=*/false, Skv, D, j, je, dst);
          else
            detail::pack_f32_panels_part(v + j0 * ldkv + hk * D, ldkv, /*b_kmajor=*/true, D, w, j - j0, je - j0,
                                         dst + kpack + b * vpack);
        }
      }
    });
  }
  pool.parallel_for(
      int64_t(Hq) * nqb,
      [&](int64_t t0, int64_t t1) {
        thread_local aligned_vector<float> S, O, T, alpha, inv;
        thread_local aligned_vector<uint16_t> P16;
        auto at_least = [](auto& b, int64_t n) {
          if (b.size() < static_cast<size_t>(n)) b.resize(static_cast<size_t>(n));
        };
        at_least(S, qb * lds), at_least(O, qb * D), at_least(T, qb * D);
        at_least(alpha, qb * nblk), at_least(inv, qb);
        if (bfdot) at_least(P16, qb * lds);
        const std::vector<int64_t> nk(static_cast<size_t>(qb), Skv);
        for (int64_t t = t0; t < t1; ++t) {
          const int h = static_cast<int>(t / nqb), hk = h / group;
          const int64_t i0 = (t % nqb) * qb, n = std::min(qb, Sq - i0);
          const float* qh = q + i0 * ldq + int64_t(h) * D;
          if (bfdot) {
            const uint16_t* kp = pk16 + hk * per_head;
            detail::gemm_bf16_packed_serial(q16 + i0 * ldq16 + h * Dp, ldq16, n, kp, Skv, D, S.data(), lds, DType::F32);
            // The numerators as bf16 bits in P16 (rows padded like S; an odd Skv's pad key is zero).
            softmax_numerators(S.data(), lds, static_cast<int>(n), nk.data(), nblk, span, store, scale, alpha.data(),
                               inv.data(), P16.data(), lds);
            if (Skv % 2)
              for (int64_t r = 0; r < n; ++r) P16[size_t(r * lds + Skv)] = 0;
          } else {
            detail::gemm_ex(pool, qh, ldq, 1, n, nullptr, DType::F32, 0, false, Skv, D, nullptr, S.data(), lds,
                            DType::F32, false, pk32 + hk * per_head);
            softmax_numerators(S.data(), lds, static_cast<int>(n), nk.data(), nblk, span, store, scale, alpha.data(),
                               inv.data());
          }
          for (int64_t b = 0; b < nblk; ++b) {
            const int64_t j0 = b * kRefKv, w = std::min(kRefKv, Skv - j0);
            float* dst = b == 0 ? O.data() : T.data();
            if (bfdot)
              detail::gemm_bf16_packed_serial(P16.data() + j0, lds, n, pk16 + hk * per_head + kpack + b * vpack, D, w,
                                              dst, D, DType::F32);
            else
              detail::gemm_ex(pool, S.data() + j0, lds, 1, n, nullptr, DType::F32, 0, false, D, w, nullptr, dst, D,
                              DType::F32, false, pk32 + hk * per_head + kpack + b * vpack);
            if (b > 0)
              for (int64_t r = 0; r < n; ++r) {
                const float al = alpha[size_t(r * nblk + b)];
                for (int d = 0; d < D; ++d) O[size_t(r * D + d)] = O[size_t(r * D + d)] * al + T[size_t(r * D + d)];
              }
          }
          for (int64_t r = 0; r < n; ++r) {
            float* o = out + (i0 + r) * ldo + int64_t(h) * D;
            for (int d = 0; d < D; ++d) o[d] = round_store(O[size_t(r * D + d)] * inv[size_t(r)], store);
          }
        }
      },
      1);
}

}  // namespace

#if defined(__AVX512F__)
void attention(const ThreadPool& pool, const float* q, int64_t ldq, const void* k, const void* v, int64_t ldkv,
               DType kv_dtype, float* out, int64_t ldo, int64_t Sq, int64_t Skv, int Hq, int Hkv, int D, float scale,
               bool causal, int64_t q_pos0, DType store, int64_t kv_span, int64_t ldh) {
  if (ldh == 0) ldh = D;
  check_args(ldq, ldkv, ldh, ldo, Skv, Hq, Hkv, D, q_pos0, kv_dtype, kv_span);
  if (Sq <= 0) return;
  const int64_t span = kv_span > 0 ? kv_span : Skv;
  // (the GEMM form packs the heads of a key's row together: rows of side-by-side heads only)
  if (!causal && kv_dtype == DType::F32 && Sq >= kGemmMinRows && Skv >= kGemmMinRows && ldh == D) {
    attention_gemm(pool, q, ldq, static_cast<const float*>(k), static_cast<const float*>(v), ldkv, out, ldo, Sq, Skv,
                   Hq, Hkv, D, scale, span, store);
    return;
  }
  const int group = Hq / Hkv;
  const bool kb = kv_dtype == DType::BF16;
  // Keys a query can see at most (causal rows never look past q_pos0 + Sq - 1).
  const int64_t kmax = causal ? std::min<int64_t>(Skv, q_pos0 + Sq) : Skv;
  const int64_t skv64 = (kmax + kKB - 1) / kKB * kKB;
  // Row stride of the transposed K, padded by one cache line: a multiple of 4 KiB would put every
  // d-row of a key block in the same L1 set.
  const int64_t ldkt = skv64 + 16;
  // K transposed to f32 [Hkv][D][ldkt] (keys zero-padded to skv64): shared by every query block of a
  // head. Worth its extra pass over K only when many rows read each key (prefill, the DiT); a decode
  // step (few rows per KV head) takes direct dot products instead.
  const bool use_kt = Sq * group >= 16;
  aligned_vector<float> kt(use_kt ? static_cast<size_t>(Hkv) * D * ldkt : 0);
  // Tasks = (kv head, block of 64 keys): rows of K are read contiguously, the transposed block's
  // 64-float runs are written while they sit in L1.
  const int64_t nkb = use_kt ? skv64 / kKB : 0;
  pool.parallel_for(
      int64_t(Hkv) * nkb,
      [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) {
          const int64_t hk = t / nkb, j0 = (t % nkb) * kKB, j1 = std::min(kmax, j0 + kKB);
          float* dst = kt.data() + size_t(hk) * D * ldkt;
          for (int64_t j = j0; j < j1; ++j) {
            const int64_t off = j * ldkv + hk * ldh;
            if (kb) {
              const uint16_t* src = static_cast<const uint16_t*>(k) + off;
              for (int d = 0; d < D; ++d) dst[d * ldkt + j] = bf16_bits_to_f32(src[d]);
            } else {
              const float* src = static_cast<const float*>(k) + off;
              for (int d = 0; d < D; ++d) dst[d * ldkt + j] = src[d];
            }
          }
          for (int64_t j = std::max(j0, j1); j < j0 + kKB; ++j)
            for (int d = 0; d < D; ++d) dst[d * ldkt + j] = 0.f;
        }
      },
      std::max<int64_t>(1, 64 / std::max(1, D / 16)));

  // Query blocks small enough that 2 x threads items exist when possible.
  const int64_t bq = std::clamp<int64_t>(Sq * Hkv / std::max(1, 2 * pool.size()), 1, 16);
  const int64_t nqb = (Sq + bq - 1) / bq;
  AttnItem it{q,   ldq, k,   kb,    nullptr, ldkt, skv64, v,      ldkv,   ldh,  kb,
              out, ldo, Skv, group, 0,       D,    scale, causal, q_pos0, span, store};
  pool.parallel_for(Hkv * nqb, [&](int64_t b, int64_t e) {
    aligned_vector<float> S;
    for (int64_t t = b; t < e; ++t) {
      AttnItem a = it;
      a.hk = static_cast<int>(t / nqb);
      a.kt = use_kt ? kt.data() + size_t(a.hk) * D * ldkt : nullptr;
      const int64_t i0 = (t % nqb) * bq;
      attention_item(a, i0, std::min(bq, Sq - i0), S);
    }
  });
}

#else  // portable fallback: the GEMM form above where it applies, else one (query, head) row at a time

namespace {

// ---- AVX2: one item = (query row i, a block of HB KV heads) with all their query heads ----
// Each K / V row piece of the block (HB·D contiguous values) is loaded once for all heads that read
// it, key after key: the per-(row, head) loop read each piece once per query head, 256 B of a 2 KiB
// cache row at a time, and waited on its lines (attention_lm_decode_513 ~45-50 ms, 3 GB/s). The
// operations per output are those of the portable loop: a score is dot_f32's 8-lane FMA chain over
// the head dims reduced ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)) (VHADDPS twice gives exactly that tree),
// times scale; P.V is axpy's fma(e, v, acc) per key in order. So the same bits, whatever the blocks.
// Needs D % 8 == 0.

// The 8 lanes of x summed in dot_f32's tree order.
MM3_SIMD_AVX2 inline float tree_sum8_avx2(__m256 x) {
  const __m256 h1 = _mm256_hadd_ps(x, x);    // l0+l1, l2+l3 | l4+l5, l6+l7 (per 128-bit half)
  const __m256 h2 = _mm256_hadd_ps(h1, h1);  // (l0+l1)+(l2+l3) | (l4+l5)+(l6+l7)
  return _mm_cvtss_f32(_mm256_castps256_ps128(h2)) + _mm_cvtss_f32(_mm256_extractf128_ps(h2, 1));
}

template <bool BF>
MM3_SIMD_AVX2 inline __m256 load8_avx2(const void* p, int64_t off) {
  if constexpr (BF)
    return _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + off))),
        16));
  else
    return _mm256_loadu_ps(static_cast<const float*>(p) + off);
}

inline void prefetch_span(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, 3);
}

// The loops below fetch each key's piece kPfKeysP keys ahead: with token-major cache rows (pieces a
// whole row apart, 2 KiB for the LM) the prefetchers, which stop at 4 KiB pages, left most K / V lines
// to demand misses. Prefetches change no value. attention_lm_decode_513 on Zen 3 (token-major,
// pieces of 4 heads, 1 KiB): 4 / 8 / 16 / 32 keys ahead 17.2-18.0 / 16.0-17.9 / 19.0 / 19.5 ms; on
// Zen 5 with the head-major cache 8 and 16 measured the same.
constexpr int64_t kPfKeysP = 8;

// One item's geometry: KV heads [hk0, hk0 + HB), each read by `group` query heads; rows of the item's
// score / numerator matrix S and accumulator acc are (KV head in block, head in group), S rows lds
// apart, acc rows D apart.
struct GroupItem {
  const float* q;  // query row i, head 0
  const void* kv;  // K or V at key 0, KV head hk0
  int64_t ldkv;    // key stride
  int64_t ldh;     // KV head stride (D: the block's heads side by side in a key's row)
  int D, group, HB;
};

// Prefetch key `off`'s pieces of the block's heads: one span where they sit side by side, else one
// per head (a head-major cache).
inline void prefetch_heads(const GroupItem& g, int64_t off, int64_t elt) {
  const char* p = static_cast<const char*>(g.kv) + off * elt;
  if (g.ldh == g.D)
    prefetch_span(p, int64_t(g.HB) * g.D * elt);
  else
    for (int hb = 0; hb < g.HB; ++hb) prefetch_span(p + hb * g.ldh * elt, int64_t(g.D) * elt);
}

// S[row][j] = (q_row . k_j) * scale for keys j < nk and heads r0 .. r0 + RN of every group (RN <= 4).
// Two keys at a time: each score is one FMA chain over the head dims (4-cycle latency), and the 2·RN
// chains of a key pair, which share their q loads, keep both FMA pipes busy where one key's RN chains
// left them waiting (the same chain per score, so the same bits).
template <int RN, bool BF>
__attribute__((noinline)) MM3_SIMD_AVX2 void group_scores_avx2(const GroupItem& g, int r0, int64_t nk, float scale,
                                                               float* S, int64_t lds) {
  const int64_t elt = BF ? 2 : 4, D = g.D;
  int64_t j = 0;
  for (; j + 2 <= nk; j += 2) {
    const int64_t off = j * g.ldkv;
    for (int64_t p = 0; p < 2; ++p)
      if (j + p + kPfKeysP < nk) prefetch_heads(g, off + (p + kPfKeysP) * g.ldkv, elt);
    for (int hb = 0; hb < g.HB; ++hb) {
      const float* const q0 = g.q + (int64_t(hb) * g.group + r0) * D;  // the RN rows are D apart
      const int64_t ko = off + hb * g.ldh;
      __m256 a[2][4];
      for (int p = 0; p < 2; ++p)
        for (int r = 0; r < 4; ++r) a[p][r] = _mm256_setzero_ps();
      for (int64_t d = 0; d < D; d += 8) {
        const __m256 k0 = load8_avx2<BF>(g.kv, ko + d), k1 = load8_avx2<BF>(g.kv, ko + g.ldkv + d);
#pragma GCC unroll 4
        for (int r = 0; r < RN; ++r) {
          const __m256 qv = _mm256_loadu_ps(q0 + r * D + d);
          a[0][r] = _mm256_fmadd_ps(qv, k0, a[0][r]);
          a[1][r] = _mm256_fmadd_ps(qv, k1, a[1][r]);
        }
      }
      float* const s = S + (int64_t(hb) * g.group + r0) * lds + j;
#pragma GCC unroll 4
      for (int r = 0; r < RN; ++r) {
        s[r * lds] = tree_sum8_avx2(a[0][r]) * scale;
        s[r * lds + 1] = tree_sum8_avx2(a[1][r]) * scale;
      }
    }
  }
  for (; j < nk; ++j) {
    const int64_t off = j * g.ldkv;
    for (int hb = 0; hb < g.HB; ++hb) {
      const float* const q0 = g.q + (int64_t(hb) * g.group + r0) * D;
      const int64_t ko = off + hb * g.ldh;
      __m256 a[4];
      for (int r = 0; r < 4; ++r) a[r] = _mm256_setzero_ps();
      for (int64_t d = 0; d < D; d += 8) {
        const __m256 kv = load8_avx2<BF>(g.kv, ko + d);
#pragma GCC unroll 4
        for (int r = 0; r < RN; ++r) a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + r * D + d), kv, a[r]);
      }
      float* const s = S + (int64_t(hb) * g.group + r0) * lds + j;
#pragma GCC unroll 4
      for (int r = 0; r < RN; ++r) s[r * lds] = tree_sum8_avx2(a[r]) * scale;
    }
  }
}

// Keys per sub-block of group_pv_avx2: a head's V pieces of one sub-block (64 · D values) stay in L1
// across the D / 16 register passes over them.
constexpr int64_t kPvKeys = 64;

// acc[row] = fma(e_row,j, v_j, acc[row]) for keys j in [j0, j1) in order, heads r0 .. r0 + RN of
// every group (RN <= 4); E the numerators (rows as S). Accumulators in registers: for each sub-block
// of kPvKeys keys, head and 16 of the D dims, the RN rows' 2 vectors each run through the sub-block's
// keys in order and are stored once (the loop that loaded, FMA'd and stored acc for every key was
// bound by its loads and stores). Each acc value sees the same FMAs in the same key order: same bits.
template <int RN, bool BF>
__attribute__((noinline)) MM3_SIMD_AVX2 void group_pv_avx2(const GroupItem& g, int r0, int64_t j0, int64_t j1,
                                                           const float* E, int64_t lds, float* acc) {
  const int64_t elt = BF ? 2 : 4, D = g.D;
  for (int64_t b0 = j0; b0 < j1; b0 += kPvKeys) {
    const int64_t b1 = std::min(j1, b0 + kPvKeys);
    for (int hb = 0; hb < g.HB; ++hb) {
      const int64_t row = int64_t(hb) * g.group + r0;
      const float* const e = E + row * lds;
      float* const y = acc + row * D;
      for (int64_t d0 = 0; d0 < D; d0 += 16) {
        const bool two = d0 + 16 <= D;  // D % 8 == 0: the last pass may hold one vector
        __m256 y0[4], y1[4];
#pragma GCC unroll 4
        for (int r = 0; r < RN; ++r) {
          y0[r] = _mm256_loadu_ps(y + r * D + d0);
          y1[r] = two ? _mm256_loadu_ps(y + r * D + d0 + 8) : _mm256_setzero_ps();
        }
        const bool pf = hb == 0 && d0 == 0;  // the first pass over a sub-block fetches the next one's rows
        for (int64_t j = b0; j < b1; ++j) {
          const int64_t vo = j * g.ldkv + hb * g.ldh + d0;
          if (pf && j + kPvKeys < j1) prefetch_heads(g, (j + kPvKeys) * g.ldkv, elt);
          const __m256 x0 = load8_avx2<BF>(g.kv, vo);
          const __m256 x1 = two ? load8_avx2<BF>(g.kv, vo + 8) : _mm256_setzero_ps();
#pragma GCC unroll 4
          for (int r = 0; r < RN; ++r) {
            const __m256 er = _mm256_set1_ps(e[r * lds + j]);
            y0[r] = _mm256_fmadd_ps(er, x0, y0[r]);
            y1[r] = _mm256_fmadd_ps(er, x1, y1[r]);
          }
        }
#pragma GCC unroll 4
        for (int r = 0; r < RN; ++r) {
          _mm256_storeu_ps(y + r * D + d0, y0[r]);
          if (two) _mm256_storeu_ps(y + r * D + d0 + 8, y1[r]);
        }
      }
    }
  }
}

}  // namespace

void attention(const ThreadPool& pool, const float* q, int64_t ldq, const void* k, const void* v, int64_t ldkv,
               DType kv_dtype, float* out, int64_t ldo, int64_t Sq, int64_t Skv, int Hq, int Hkv, int D, float scale,
               bool causal, int64_t q_pos0, DType store, int64_t kv_span, int64_t ldh) {
  if (ldh == 0) ldh = D;
  check_args(ldq, ldkv, ldh, ldo, Skv, Hq, Hkv, D, q_pos0, kv_dtype, kv_span);
  if (Sq <= 0) return;
  const int64_t span = kv_span > 0 ? kv_span : Skv;
  // (the GEMM form packs the heads of a key's row together: rows of side-by-side heads only)
  if (!causal && kv_dtype == DType::F32 && Sq >= kGemmMinRows && Skv >= kGemmMinRows && ldh == D) {
    attention_gemm(pool, q, ldq, static_cast<const float*>(k), static_cast<const float*>(v), ldkv, out, ldo, Sq, Skv,
                   Hq, Hkv, D, scale, span, store);
    return;
  }
  const int group = Hq / Hkv;
  const bool kb = kv_dtype == DType::BF16;
  const float* kf = static_cast<const float*>(k);
  const float* vf = static_cast<const float*>(v);
  const uint16_t* kh = static_cast<const uint16_t*>(k);
  const uint16_t* vh = static_cast<const uint16_t*>(v);
  if (detail::cpu_has_avx2_fma() && D % 8 == 0) {
    // Items (query row, block of HB KV heads). Heads side by side in a key's row: as few blocks per
    // row as keep every thread busy (one block of all heads reads whole contiguous cache rows).
    // Head-major (ldh != D): one head per item, so each item streams one contiguous run of keys
    // (blocks of 8 heads there read 8 runs at once: no faster than token-major rows, 11.2-11.4 ms
    // for attention_lm_decode_513's calls under MM3_ISA=avx2 on Zen 5).
    const int64_t per_row = ldh != D ? Hkv : std::min<int64_t>(Hkv, (pool.size() + Sq - 1) / Sq);
    const int HB = static_cast<int>((Hkv + per_row - 1) / per_row);
    const int64_t blocks = (Hkv + HB - 1) / HB;
    const int64_t elt = kb ? 2 : 4;
    const char* kc = static_cast<const char*>(k);
    const char* vc = static_cast<const char*>(v);
    pool.parallel_for(
        Sq * blocks,
        [&](int64_t b, int64_t e) {
          aligned_vector<float> S, acc, alpha, inv;
          std::vector<int64_t> nks;
          for (int64_t it = b; it < e; ++it) {
            const int64_t i = it / blocks;
            const int hk0 = static_cast<int>(it % blocks) * HB;
            const int hb_n = std::min(HB, Hkv - hk0);
            const int rows = hb_n * group;
            const int64_t nk = causal ? std::min<int64_t>(Skv, q_pos0 + i + 1) : Skv;
            S.resize(size_t(rows) * Skv);
            acc.assign(size_t(rows) * D, 0.f);
            inv.resize(rows);
            nks.assign(rows, nk);
            const GroupItem gk{q + i * ldq + int64_t(hk0) * group * D, kc + hk0 * ldh * elt, ldkv, ldh, D, group, hb_n};
            GroupItem gv = gk;
            gv.kv = vc + hk0 * ldh * elt;
            for (int r0 = 0; r0 < group; r0 += 4) {
              switch (std::min(4, group - r0) * 2 + (kb ? 1 : 0)) {
                case 2:
                  group_scores_avx2<1, false>(gk, r0, nk, scale, S.data(), Skv);
                  break;
                case 3:
                  group_scores_avx2<1, true>(gk, r0, nk, scale, S.data(), Skv);
                  break;
                case 4:
                  group_scores_avx2<2, false>(gk, r0, nk, scale, S.data(), Skv);
                  break;
                case 5:
                  group_scores_avx2<2, true>(gk, r0, nk, scale, S.data(), Skv);
                  break;
                case 6:
                  group_scores_avx2<3, false>(gk, r0, nk, scale, S.data(), Skv);
                  break;
                case 7:
                  group_scores_avx2<3, true>(gk, r0, nk, scale, S.data(), Skv);
                  break;
                case 8:
                  group_scores_avx2<4, false>(gk, r0, nk, scale, S.data(), Skv);
                  break;
                default:
                  group_scores_avx2<4, true>(gk, r0, nk, scale, S.data(), Skv);
                  break;
              }
            }
            // The reference's block softmax (file header), every row of the item.
            const int64_t nblk = (nk + kRefKv - 1) / kRefKv;
            alpha.resize(size_t(rows) * nblk);
            softmax_numerators(S.data(), Skv, rows, nks.data(), nblk, span, store, 1.0f, alpha.data(), inv.data());
            for (int64_t j0 = 0, blk = 0; j0 < nk; j0 += kRefKv, ++blk) {
              if (j0 > 0)
                for (int r = 0; r < rows; ++r)
                  for (int d = 0; d < D; ++d) acc[size_t(r) * D + d] *= alpha[size_t(r) * nblk + blk];
              const int64_t j1 = std::min(nk, j0 + kRefKv);
              for (int r0 = 0; r0 < group; r0 += 4) {
                switch (std::min(4, group - r0) * 2 + (kb ? 1 : 0)) {
                  case 2:
                    group_pv_avx2<1, false>(gv, r0, j0, j1, S.data(), Skv, acc.data());
                    break;
                  case 3:
                    group_pv_avx2<1, true>(gv, r0, j0, j1, S.data(), Skv, acc.data());
                    break;
                  case 4:
                    group_pv_avx2<2, false>(gv, r0, j0, j1, S.data(), Skv, acc.data());
                    break;
                  case 5:
                    group_pv_avx2<2, true>(gv, r0, j0, j1, S.data(), Skv, acc.data());
                    break;
                  case 6:
                    group_pv_avx2<3, false>(gv, r0, j0, j1, S.data(), Skv, acc.data());
                    break;
                  case 7:
                    group_pv_avx2<3, true>(gv, r0, j0, j1, S.data(), Skv, acc.data());
                    break;
                  case 8:
                    group_pv_avx2<4, false>(gv, r0, j0, j1, S.data(), Skv, acc.data());
                    break;
                  default:
                    group_pv_avx2<4, true>(gv, r0, j0, j1, S.data(), Skv, acc.data());
                    break;
                }
              }
            }
            for (int r = 0; r < rows; ++r) {
              float* o = out + i * ldo + (int64_t(hk0) * group + r) * D;  // query head hk0·group + r
              for (int d = 0; d < D; ++d) o[d] = round_store(acc[size_t(r) * D + d] * inv[r], store);
            }
          }
        },
        1);
    return;
  }

  // Without AVX2 (or D % 8 != 0): one (query, head) row at a time.
  pool.parallel_for(
      Sq * Hq,
      [&](int64_t b, int64_t e) {
        aligned_vector<float> s(static_cast<size_t>(Skv));
        aligned_vector<float> acc(static_cast<size_t>(D)), alpha;
        for (int64_t it = b; it < e; ++it) {
          const int64_t i = it / Hq;
          const int h = static_cast<int>(it % Hq);
          const int hk = h / group;
          const float* qr = q + i * ldq + int64_t(h) * D;
          const int64_t nk = causal ? std::min<int64_t>(Skv, q_pos0 + i + 1) : Skv;
          for (int64_t j = 0; j < nk; ++j) {
            const int64_t off = j * ldkv + hk * ldh;
            const float d = kb ? detail::dot_f32_bf16(qr, kh + off, D) : detail::dot_f32(qr, kf + off, D);
            s[static_cast<size_t>(j)] = d * scale;
          }
          // The reference's block softmax (file header): numerators in s, per-block rescales alpha.
          const int64_t nblk = (nk + kRefKv - 1) / kRefKv;
          alpha.resize(static_cast<size_t>(nblk));
          float inv = 0.f;
          softmax_numerators(s.data(), 0, 1, &nk, nblk, span, store, 1.0f, alpha.data(), &inv);
          std::fill(acc.begin(), acc.end(), 0.f);
          for (int64_t j0 = 0, blk = 0; j0 < nk; j0 += kRefKv, ++blk) {
            const int64_t j1 = std::min(nk, j0 + kRefKv);
            if (j0 > 0)
              for (float& x : acc) x *= alpha[static_cast<size_t>(blk)];
            for (int64_t j = j0; j < j1; ++j) {
              const int64_t off = j * ldkv + hk * ldh;
              const float ej = s[static_cast<size_t>(j)];
              if (kb)
                detail::axpy_bf16(ej, vh + off, acc.data(), D);
              else
                detail::axpy_f32(ej, vf + off, acc.data(), D);
            }
          }
          float* o = out + i * ldo + int64_t(h) * D;
          for (int d = 0; d < D; ++d) o[d] = round_store(acc[static_cast<size_t>(d)] * inv, store);
        }
      },
      std::max<int64_t>(1, 4096 / std::max<int64_t>(1, Skv * D / 64)));
}

#endif

bool attention_bf16_dots() { return detail::cpu_has_avx512bf16(); }

void softmax_rows(float* x, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * cols;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < cols; ++j) mx = std::max(mx, xr[j]);
    const float inv = 1.0f / exp_shift_sum(xr, cols, mx);
    for (int64_t j = 0; j < cols; ++j) xr[j] = xr[j] * inv;
  }
}

}  // namespace mm3::kern
