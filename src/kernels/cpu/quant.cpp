// quant.cpp — the quantized weight formats of kernels/quant.h: the quantizer, dequantization, the
// decode GEMV (AVX512-VNNI, AVX2 and a portable scalar path doing the very same operations) and the
// prefill path (dequantized panels through the blocked GEMM of gemm_nt.h).
//
// Why VPDPBUSD rather than dequantizing to fp32: with the lane = block layout one instruction does 64
// multiply-adds of one row and one CFG row, and a superblock (512 weights) needs per row and per m
// only 8 VPDPBUSD + a convert, a multiply and one or two FMAs, so two cores stay far below their
// compute limit and the GEMV runs at the memory's speed. Integer sums are exact, so how the int32
// accumulation is chained never changes a bit.
#pragma GCC optimize("fp-contract=off")

#include "kernels/quant.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "core/errors.h"
#include "kernels/cpu/gemm_nt.h"
#include "kernels/cpu/segments.h"
#include "kernels/cpu/simd.h"
#include "kernels/tuning.h"

namespace mm3::kern {

const char* quant_name(QuantType t) {
  switch (t) {
    case QuantType::None: return "none";
    case QuantType::Int8: return "int8";
    case QuantType::Q4: return "q4";
  }
  return "?";
}

std::optional<QuantType> quant_from_name(std::string_view s) {
  if (s == "none" || s == "bf16") return QuantType::None;
  if (s == "int8" || s == "q8") return QuantType::Int8;
  if (s == "q4" || s == "int4") return QuantType::Q4;
  return std::nullopt;
}

int64_t quant_row_qs_bytes(QuantType t, int64_t K) {
  MM3_CHECK(t == QuantType::Int8 || t == QuantType::Q4, "quant_row_qs_bytes: type {}", quant_name(t));
  return t == QuantType::Int8 ? quant_padded_k(K) : quant_padded_k(K) / 2;
}

int64_t quant_row_scales(QuantType t, int64_t K) {
  MM3_CHECK(t == QuantType::Int8 || t == QuantType::Q4, "quant_row_scales: type {}", quant_name(t));
  return quant_padded_k(K) / kQuantBlock * (t == QuantType::Int8 ? 1 : 2);
}

QuantMatrix::QuantMatrix(QuantType type, int64_t N, int64_t K, Tensor qs, Tensor scales)
    : type_(type), n_(N), k_(K), kp_(quant_padded_k(K)), qs_(std::move(qs)), sc_(std::move(scales)) {
  MM3_CHECK(type == QuantType::Int8 || type == QuantType::Q4, "QuantMatrix: type {}", quant_name(type));
  MM3_CHECK(N > 0 && K > 0, "QuantMatrix: N={} K={}", N, K);
  row_qs_ = quant_row_qs_bytes(type, K);
  row_sc_ = quant_row_scales(type, K);
  MM3_CHECK(qs_.dtype() == DType::I32 && qs_.ndim() == 2 && qs_.dim(0) == N && qs_.dim(1) * 4 == row_qs_ &&
                qs_.is_contiguous(),
            "QuantMatrix {}: qs {} does not match [{}, {}] bytes", quant_name(type), qs_.describe(), N, row_qs_);
  MM3_CHECK(sc_.dtype() == DType::F16 && sc_.ndim() == 2 && sc_.dim(0) == N && sc_.dim(1) == row_sc_ &&
                sc_.is_contiguous(),
            "QuantMatrix {}: scales {} does not match F16[{}, {}]", quant_name(type), sc_.describe(), N, row_sc_);
  qs_bytes_ = static_cast<const uint8_t*>(qs_.raw());
  scales_ = static_cast<const uint16_t*>(sc_.raw());
}

namespace {

// Byte offset, inside a superblock of unpacked (one byte per weight) data, of element e of lane l.
inline int64_t lane_offset(int64_t l, int64_t e) { return 64 * (e / 4) + 4 * l + (e % 4); }

// q (0..15) of element e (0..31) of lane l in a Q4 superblock's 256 bytes.
inline int q4_code(const uint8_t* sb, int64_t l, int64_t e) {
  const int64_t u = lane_offset(l, e);  // byte in the unpacked 512
  const int64_t v = u / 64, j = u % 64;
  const uint8_t b = sb[64 * (v % 4) + j];
  return v < 4 ? (b & 0x0F) : (b >> 4);
}

}  // namespace

float QuantMatrix::value(int64_t n, int64_t k) const {
  if (k < 0 || k >= k_) return 0.f;
  const int64_t s = k / kQuantSuper, l = (k % kQuantSuper) / kQuantBlock, e = k % kQuantBlock;
  const uint16_t* sc = scales_row(n);
  if (type_ == QuantType::Int8) {
    const int q = int(qs_row(n)[s * kQuantSuper + lane_offset(l, e)]) - 128;
    return f16_bits_to_f32(sc[16 * s + l]) * static_cast<float>(q);
  }
  const int q = q4_code(qs_row(n) + s * (kQuantSuper / 2), l, e);
  const float d = f16_bits_to_f32(sc[32 * s + l]), m = f16_bits_to_f32(sc[32 * s + 16 + l]);
  const float dq = d * static_cast<float>(q);
  return dq + m;
}

// ---- quantizer ------------------------------------------------------------------------------------

namespace {

inline float f16r(float v) { return f16_bits_to_f32(f32_to_f16_bits(v)); }

inline int q4_quant(float w, float d, float m) {
  return d == 0.f ? 0 : static_cast<int>(std::clamp(std::nearbyint((w - m) / d), 0.f, 15.f));
}

// Σ (w − value)² of a block with parameters (d, m), value = fp32(d · q) + m as the kernels use it.
double q4_error(const float* w, int64_t kn, float d, float m) {
  double e2 = 0;
  for (int64_t e = 0; e < kn; ++e) {
    const float dq = d * static_cast<float>(q4_quant(w[e], d, m));
    const double r = double(w[e]) - double(dq + m);
    e2 += r * r;
  }
  return e2;
}

// The q4 block parameters of quant.h: start from (min, range / 15), then two least-squares refits of
// (d, m) to the codes they induce; keep the candidate (fp16-rounded) of least squared error.
void q4_block_params(const float* w, int64_t kn, uint16_t& dh, uint16_t& mh) {
  float lo = 0.f, hi = 0.f;
  if (kn > 0) lo = hi = w[0];
  for (int64_t e = 1; e < kn; ++e) lo = std::min(lo, w[e]), hi = std::max(hi, w[e]);
  float m = f16r(lo), d = f16r((hi - m) / 15.f);
  float bd = d, bm = m;
  double best = q4_error(w, kn, d, m);
  for (int it = 0; it < 2 && d != 0.f; ++it) {
    double sq = 0, sqq = 0, sw = 0, sqw = 0;
    for (int64_t e = 0; e < kn; ++e) {
      const double q = q4_quant(w[e], d, m);
      sq += q;
      sqq += q * q;
      sw += w[e];
      sqw += q * w[e];
    }
    const double n = static_cast<double>(kn), den = n * sqq - sq * sq;
    if (!(den > 0)) break;
    const double nd = (n * sqw - sq * sw) / den, nm = (sw - nd * sq) / n;
    if (!(nd > 0)) break;
    d = f16r(static_cast<float>(nd));
    m = f16r(static_cast<float>(nm));
    const double err = q4_error(w, kn, d, m);
    if (err < best) best = err, bd = d, bm = m;
  }
  dh = f32_to_f16_bits(bd);
  mh = f32_to_f16_bits(bm);
}

// One row: w[0..K) floats -> qs row, scales row (layout of quant.h).
void quantize_row(const float* w, int64_t K, QuantType t, uint8_t* qs, uint16_t* sc) {
  const int64_t Kp = quant_padded_k(K), nblk = Kp / kQuantBlock;
  for (int64_t b = 0; b < nblk; ++b) {
    const int64_t s = b / kQuantLanes, l = b % kQuantLanes, k0 = b * kQuantBlock;
    const int64_t kn = std::clamp<int64_t>(K - k0, 0, kQuantBlock);  // real elements of the block
    if (t == QuantType::Int8) {
      uint8_t* sb = qs + s * kQuantSuper;
      float amax = 0.f;
      for (int64_t e = 0; e < kn; ++e) amax = std::max(amax, std::fabs(w[k0 + e]));
      const uint16_t dh = f32_to_f16_bits(amax / 127.f);
      const float d = f16_bits_to_f32(dh);
      sc[16 * s + l] = dh;
      for (int64_t e = 0; e < kQuantBlock; ++e) {
        int q = 0;
        if (e < kn && d != 0.f) q = static_cast<int>(std::clamp(std::nearbyint(w[k0 + e] / d), -127.f, 127.f));
        sb[lane_offset(l, e)] = static_cast<uint8_t>(q + 128);
      }
    } else {
      uint8_t* sb = qs + s * (kQuantSuper / 2);
      uint16_t dh, mh;
      q4_block_params(w + k0, kn, dh, mh);
      const float m = f16_bits_to_f32(mh), d = f16_bits_to_f32(dh);
      sc[32 * s + l] = dh;
      sc[32 * s + 16 + l] = mh;
      for (int64_t e = 0; e < kQuantBlock; ++e) {
        int q = 0;
        if (e < kn) q = q4_quant(w[k0 + e], d, m);
        const int64_t u = lane_offset(l, e), v = u / 64, j = u % 64;
        uint8_t& byte = sb[64 * (v % 4) + j];
        byte = v < 4 ? uint8_t((byte & 0xF0) | q) : uint8_t((byte & 0x0F) | (q << 4));
      }
    }
  }
}

}  // namespace

std::shared_ptr<const QuantMatrix> quantize_weight(const ThreadPool& pool, const Tensor& w, QuantType type) {
  if (type != QuantType::Int8 && type != QuantType::Q4)
    throw InternalError(fmt::format("quantize_weight: type {}", quant_name(type)));
  if (w.ndim() != 2 || (w.dtype() != DType::F32 && w.dtype() != DType::BF16) || w.strides()[1] != 1)
    throw InternalError("quantize_weight: need a 2-D F32/BF16 weight with contiguous rows, got " + w.describe());
  const int64_t N = w.dim(0), K = w.dim(1), ld = w.strides()[0];
  const int64_t rq = quant_row_qs_bytes(type, K), rs = quant_row_scales(type, K);
  // Codes and scales in one allocation (huge pages once it is large): a decode step streams both,
  // and the scales alone (1/17 of an int8 weight, 1/5 of a q4 one) would otherwise sit on 4 KiB pages.
  std::vector<Tensor> group = Tensor::empty_group({{DType::I32, {N, rq / 4}}, {DType::F16, {N, rs}}});
  Tensor qs = std::move(group[0]), sc = std::move(group[1]);
  std::memset(qs.raw(), 0, qs.nbytes());
  std::memset(sc.raw(), 0, sc.nbytes());
  uint8_t* qb = static_cast<uint8_t*>(qs.raw());
  uint16_t* sb = static_cast<uint16_t*>(sc.raw());
  const bool wb = w.dtype() == DType::BF16;
  const void* wp = w.raw();
  std::atomic<int64_t> bad_row{-1};  // a row holding a non-finite value (reported after the loop)
  pool.parallel_for(
      N,
      [&](int64_t n0, int64_t n1) {
        std::vector<float> row(static_cast<size_t>(K));
        for (int64_t n = n0; n < n1; ++n) {
          if (wb) {
            bf16_to_f32(static_cast<const uint16_t*>(wp) + n * ld, row.data(), static_cast<size_t>(K));
          } else {
            std::memcpy(row.data(), static_cast<const float*>(wp) + n * ld, sizeof(float) * size_t(K));
          }
          bool finite = true;
          for (float v : row) finite &= std::isfinite(v);
          if (!finite) {
            bad_row.store(n);
            continue;
          }
          quantize_row(row.data(), K, type, qb + n * rq, sb + n * rs);
        }
      },
      16);
  if (bad_row.load() >= 0)
    throw InvalidInput(fmt::format("quantize_weight: {} row {} holds a non-finite value", w.describe(), bad_row.load()));
  return std::make_shared<const QuantMatrix>(type, N, K, std::move(qs), std::move(sc));
}

bool quant_strips_offered() { return detail::cpu_has_avx512vnni(); }

bool quant_strips_pay(int64_t K) { return 2 * 2 * quant_padded_k(K) > detail::cpu_l1d_bytes(); }

std::shared_ptr<const QuantMatrix> with_strips(const ThreadPool& pool, const QuantMatrix& q) {
  auto out = std::make_shared<QuantMatrix>(q);
  auto st = std::make_shared<QuantStrips>();
  const bool i8 = q.type() == QuantType::Int8;
  const int64_t N = q.rows(), S = q.superblocks(), J = (N + 15) / 16;
  const int64_t B = i8 ? kQuantSuper : kQuantSuper / 2, E = i8 ? 16 : 32;
  st->strips = J, st->S = S, st->block_bytes = B, st->block_scales = E;
  std::vector<Tensor> g = Tensor::empty_group({{DType::I32, {J * 16 * S * B / 4}}, {DType::F16, {J * 16 * S * E}}});
  st->codes = std::move(g[0]);
  st->scales = std::move(g[1]);
  uint8_t* cb = static_cast<uint8_t*>(st->codes.raw());
  uint16_t* sb = static_cast<uint16_t*>(st->scales.raw());
  const bool vec = detail::cpu_has_avx512();
  pool.parallel_for(
      J,
      [&](int64_t j0, int64_t j1) {
        for (int64_t j = j0; j < j1; ++j) {
          // Codes: a strip of 16 real rows by 16 x 16 transposes of 4-byte words (vector v of superblock s:
          // word l of row r -> word r of block (l, s)); a strip with padding rows word by word.
          const bool whole = vec && 16 * j + 16 <= N;
          for (int64_t r = 0; r < 16; ++r) {
            const int64_t n = 16 * j + r;
            for (int64_t l = 0; l < 16; ++l)
              for (int64_t s = 0; s < S; ++s) {
                uint8_t* dst = cb + ((16 * j + l) * S + s) * B + 4 * r;
                uint16_t* dsc = sb + ((16 * j + l) * S + s) * E + r;
                if (n >= N) {  // padding: codes of value 0, d = m = 0
                  for (int64_t v = 0; v < B / 64; ++v) std::memset(dst + 64 * v, i8 ? 128 : 0, 4);
                  dsc[0] = 0;
                  if (!i8) dsc[16] = 0;
                  continue;
                }
                if (!whole) {
                  const uint8_t* src = q.qs_row(n) + s * B + 4 * l;
                  for (int64_t v = 0; v < B / 64; ++v) std::memcpy(dst + 64 * v, src + 64 * v, 4);
                }
                dsc[0] = q.scales_row(n)[E * s + l];
                if (!i8) dsc[16] = q.scales_row(n)[E * s + 16 + l];
              }
          }
          if (!whole) continue;
          for (int64_t s = 0; s < S; ++s)
            for (int64_t v = 0; v < B / 64; ++v) {
              const void* src[16];
              void* dst[16];
              for (int i = 0; i < 16; ++i) {
                src[i] = q.qs_row(16 * j + i) + s * B + 64 * v;
                dst[i] = cb + ((16 * j + i) * S + s) * B + 64 * v;
              }
              detail::transpose16x16_epi32(src, dst);
            }
        }
      },
      1);
  out->strips_ = std::move(st);
  return out;
}

namespace {

// The row form's bytes of superblock s of row n (B bytes: 512 Int8, 256 Q4) and its scales (16 d, then
// for Q4 16 m), from the strip form where q has one (the model's row form is then a view of the sidecar
// whose pages were released, so the prefill reads only the strips), else from the row form.
void fetch_superblock(const QuantMatrix& q, int64_t n, int64_t s, uint8_t* b, uint16_t* sc) {
  const bool i8 = q.type() == QuantType::Int8;
  const int64_t B = i8 ? kQuantSuper : kQuantSuper / 2, E = i8 ? 16 : 32;
  if (const QuantStrips* st = q.strips()) {
    const int64_t j = n / 16, r = n % 16;
    for (int64_t l = 0; l < 16; ++l) {
      const uint8_t* blk = st->block(j, l) + s * B + 4 * r;
      for (int64_t v = 0; v < B / 64; ++v) std::memcpy(b + 64 * v + 4 * l, blk + 64 * v, 4);
      const uint16_t* bs = st->block_scales_at(j, l) + s * E + r;
      sc[l] = bs[0];
      if (!i8) sc[16 + l] = bs[16];
    }
    return;
  }
  std::memcpy(b, q.qs_row(n) + s * B, size_t(B));
  std::memcpy(sc, q.scales_row(n) + s * E, sizeof(uint16_t) * size_t(E));
}

// One whole superblock (all 512 elements inside K; its bytes and scales from fetch_superblock) with
// AVX-512: the same fp32 operations as the scalar loop in dequantize_rows (Int8: d · (q − 128); Q4:
// d · q, then + m), so the same bits. Word (v, l) of the unpacked superblock holds elements 4v..4v+3 of
// block l; block l's 32 codes in element order are the words (0, l), (1, l), ..., (7, l): one 8-word
// gather from the unpacked copy.
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,f16c"))) void dequantize_superblock_avx512(QuantType t,
                                                                                                     const uint8_t* p,
                                                                                                     const uint16_t* sc,
                                                                                                     float* o) {
  alignas(64) uint32_t u[128];  // [v][l]
  const bool i8 = t == QuantType::Int8;
  if (i8) {
    std::memcpy(u, p, kQuantSuper);
  } else {
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    for (int c = 0; c < 4; ++c) {
      const __m512i b = _mm512_loadu_si512(p + 64 * c);
      _mm512_store_si512(u + 16 * c, _mm512_and_si512(b, lo4));
      _mm512_store_si512(u + 16 * (c + 4), _mm512_and_si512(_mm512_srli_epi16(b, 4), lo4));
    }
  }
  const __m256i idx = _mm256_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112);
  const __m512i off = _mm512_set1_epi32(i8 ? 128 : 0);
  for (int l = 0; l < kQuantLanes; ++l) {
    const __m256i codes = _mm256_i32gather_epi32(reinterpret_cast<const int*>(u + l), idx, 4);
    const __m512 d = _mm512_set1_ps(f16_bits_to_f32(sc[l]));
    const __m512 m = _mm512_set1_ps(i8 ? 0.f : f16_bits_to_f32(sc[16 + l]));
    for (int h = 0; h < 2; ++h) {
      const __m128i c16 = h ? _mm256_extracti128_si256(codes, 1) : _mm256_castsi256_si128(codes);
      const __m512 f = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(c16), off));
      const __m512 v = i8 ? _mm512_mul_ps(d, f) : _mm512_add_ps(_mm512_mul_ps(d, f), m);
      _mm512_storeu_ps(o + l * kQuantBlock + 16 * h, v);
    }
  }
}

}  // namespace

void dequantize_rows(const QuantMatrix& q, int64_t n0, int64_t n1, float* out, int64_t ldo) {
  const int64_t K = q.cols(), S = q.superblocks();
  const bool vec = detail::cpu_has_avx512();
  alignas(64) uint8_t sb[kQuantSuper];
  uint16_t sc[32];
  for (int64_t n = n0; n < n1; ++n) {
    float* o = out + (n - n0) * ldo;
    for (int64_t s = 0; s < S; ++s) {
      fetch_superblock(q, n, s, sb, sc);
      if (vec && (s + 1) * kQuantSuper <= K) {  // a whole superblock (the partial last one: the loop below)
        dequantize_superblock_avx512(q.type(), sb, sc, o + s * kQuantSuper);
        continue;
      }
      for (int64_t l = 0; l < kQuantLanes; ++l) {
        const int64_t k0 = s * kQuantSuper + l * kQuantBlock;
        if (k0 >= K) break;
        const int64_t kn = std::min<int64_t>(kQuantBlock, K - k0);
        if (q.type() == QuantType::Int8) {
          const float d = f16_bits_to_f32(sc[l]);
          for (int64_t e = 0; e < kn; ++e) o[k0 + e] = d * static_cast<float>(int(sb[lane_offset(l, e)]) - 128);
        } else {
          const float d = f16_bits_to_f32(sc[l]), m = f16_bits_to_f32(sc[16 + l]);
          for (int64_t e = 0; e < kn; ++e) {
            const float dq = d * static_cast<float>(q4_code(sb, l, e));
            o[k0 + e] = dq + m;
          }
        }
      }
    }
  }
}

namespace detail {

// ---- activations ----------------------------------------------------------------------------------

namespace {
void quantize_acts_scalar(const float* x, int64_t M, int64_t ldx, int64_t K, QuantActs& a) {
  const int64_t Kp = a.Kp, nblk = Kp / kQuantBlock;
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * ldx;
    int8_t* q = a.xq.data() + m * Kp;
    for (int64_t b = 0; b < nblk; ++b) {
      const int64_t k0 = b * kQuantBlock, kn = std::clamp<int64_t>(K - k0, 0, kQuantBlock);
      const int64_t s = b / kQuantLanes, l = b % kQuantLanes;
      float amax = 0.f;
      for (int64_t e = 0; e < kn; ++e) amax = std::max(amax, std::fabs(xr[k0 + e]));
      if (amax == 0.f) continue;  // dx = 0, xq = 0
      const float dx = amax / 127.f, ix = 127.f / amax;
      int32_t sx = 0;
      for (int64_t e = 0; e < kn; ++e) {
        const int v = static_cast<int>(std::clamp(std::nearbyint(xr[k0 + e] * ix), -127.f, 127.f));
        q[s * kQuantSuper + lane_offset(l, e)] = static_cast<int8_t>(v);
        sx += v;
      }
      a.dx[size_t(m * nblk + b)] = dx;
      a.corr[size_t(m * nblk + b)] = -128 * sx;
      a.sxdx[size_t(m * nblk + b)] = dx * static_cast<float>(sx);
    }
  }
}
void quantize_acts_avx512(const float* x, int64_t M, int64_t ldx, int64_t K, QuantActs& a);
void quantize_acts_avx2(const float* x, int64_t M, int64_t ldx, int64_t K, QuantActs& a);
}  // namespace

void quantize_acts(const float* x, int64_t M, int64_t ldx, int64_t K, QuantActs& a, bool scalar) {
  const int64_t Kp = quant_padded_k(K), nblk = Kp / kQuantBlock;
  a.M = M;
  a.Kp = Kp;
  a.xq.assign(static_cast<size_t>(M * Kp), 0);
  a.dx.assign(static_cast<size_t>(M * nblk), 0.f);
  a.corr.assign(static_cast<size_t>(M * nblk), 0);
  a.sxdx.assign(static_cast<size_t>(M * nblk), 0.f);
  if (!scalar && cpu_has_avx512())
    quantize_acts_avx512(x, M, ldx, K, a);
  else if (!scalar && cpu_has_avx2_fma())
    quantize_acts_avx2(x, M, ldx, K, a);
  else
    quantize_acts_scalar(x, M, ldx, K, a);
}

void order_acts_for_strips(QuantActs& a) {
  const int64_t M = a.M, S = a.Kp / kQuantSuper, nblk = a.Kp / kQuantBlock;
  a.sxw.resize(static_cast<size_t>(M * a.Kp / 4));
  a.sdx.resize(static_cast<size_t>(M * nblk));
  a.scorr.resize(static_cast<size_t>(M * nblk));
  a.ssxdx.resize(static_cast<size_t>(M * nblk));
  for (int64_t l = 0; l < 16; ++l)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t m = 0; m < M; ++m) {
        const size_t i = size_t((l * S + s) * M + m), b = size_t(m * nblk + 16 * s + l);
        a.sdx[i] = a.dx[b];
        a.scorr[i] = a.corr[b];
        a.ssxdx[i] = a.sxdx[b];
        for (int64_t g = 0; g < 8; ++g)
          std::memcpy(&a.sxw[size_t(((l * S + s) * 8 + g) * M + m)], a.xq.data() + m * a.Kp + 512 * s + 64 * g + 4 * l,
                      4);
      }
}

namespace {

// quantize_acts with AVX-512: the same operations lane for lane (|x| max, the two fp32 divisions, the
// product, round-half-even conversion, clamp, integer sum), so the same bytes as the scalar loop.
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) void quantize_acts_avx512(const float* x, int64_t M,
                                                                                        int64_t ldx, int64_t K,
                                                                                        QuantActs& a) {
  const int64_t Kp = a.Kp, nblk = Kp / kQuantBlock;
  const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * ldx;
    uint32_t* q = reinterpret_cast<uint32_t*>(a.xq.data() + m * Kp);
    for (int64_t b = 0; b < nblk; ++b) {
      const int64_t k0 = b * kQuantBlock, kn = std::clamp<int64_t>(K - k0, 0, kQuantBlock);
      if (kn == 0) break;
      const __mmask16 m0 = kn >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << kn) - 1u);
      const __mmask16 m1 = kn >= 32 ? __mmask16(0xFFFF) : kn <= 16 ? __mmask16(0) : __mmask16((1u << (kn - 16)) - 1u);
      const __m512 v0 = _mm512_maskz_loadu_ps(m0, xr + k0), v1 = _mm512_maskz_loadu_ps(m1, xr + k0 + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(v0, absmask), _mm512_and_ps(v1, absmask)));
      if (amax == 0.f) continue;
      const float dx = amax / 127.f, ix = 127.f / amax;
      const __m512 iv = _mm512_set1_ps(ix);
      const __m512i q0 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v0, iv)), lo), hi);
      const __m512i q1 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v1, iv)), lo), hi);
      const int32_t sx = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
      // 32 int8 = 8 words; word g (elements 4g..4g+3) goes to word 16g + l of the superblock.
      alignas(32) uint32_t w[8];
      _mm_store_si128(reinterpret_cast<__m128i*>(w), _mm512_cvtepi32_epi8(q0));
      _mm_store_si128(reinterpret_cast<__m128i*>(w + 4), _mm512_cvtepi32_epi8(q1));
      uint32_t* sb = q + (b / kQuantLanes) * (kQuantSuper / 4) + (b % kQuantLanes);
      for (int g = 0; g < 8; ++g) sb[16 * g] = w[g];
      a.dx[size_t(m * nblk + b)] = dx;
      a.corr[size_t(m * nblk + b)] = -128 * sx;
      a.sxdx[size_t(m * nblk + b)] = dx * static_cast<float>(sx);
    }
  }
}

// quantize_acts with AVX2: the AVX-512 loop on 8-float vectors (whole 32-blocks; a block cut short by K
// takes the scalar loop's steps), so the same bytes as the scalar loop. In a build for a CPU without
// AVX-512 the scalar loop had taken as long as the GEMV body itself (perf, gemv_q4_192x4096_m2_l2).
__attribute__((target("avx2,fma"))) void quantize_acts_avx2(const float* x, int64_t M, int64_t ldx, int64_t K,
                                                            QuantActs& a) {
  const int64_t Kp = a.Kp, nblk = Kp / kQuantBlock;
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * ldx;
    uint32_t* q = reinterpret_cast<uint32_t*>(a.xq.data() + m * Kp);
    for (int64_t b = 0; b < nblk; ++b) {
      const int64_t k0 = b * kQuantBlock, kn = std::clamp<int64_t>(K - k0, 0, kQuantBlock);
      if (kn == 0) break;
      float amax = 0.f;
      int32_t sx = 0;
      uint32_t* sb = q + (b / kQuantLanes) * (kQuantSuper / 4) + (b % kQuantLanes);
      if (kn < kQuantBlock) {  // the scalar loop's steps (a row's last block only)
        for (int64_t e = 0; e < kn; ++e) amax = std::max(amax, std::fabs(xr[k0 + e]));
        if (amax == 0.f) continue;
        const float ix = 127.f / amax;
        int8_t* qb = a.xq.data() + m * Kp;
        for (int64_t e = 0; e < kn; ++e) {
          const int v = static_cast<int>(std::clamp(std::nearbyint(xr[k0 + e] * ix), -127.f, 127.f));
          qb[(b / kQuantLanes) * kQuantSuper + lane_offset(b % kQuantLanes, e)] = static_cast<int8_t>(v);
          sx += v;
        }
      } else {
        __m256 v[4];
        for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(xr + k0 + 8 * i);
        const __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], absmask), _mm256_and_ps(v[1], absmask)),
                                        _mm256_max_ps(_mm256_and_ps(v[2], absmask), _mm256_and_ps(v[3], absmask)));
        alignas(32) float t[8];
        _mm256_store_ps(t, mx);
        for (float e : t) amax = std::max(amax, e);
        if (amax == 0.f) continue;
        const __m256 iv = _mm256_set1_ps(127.f / amax);
        __m256i qi[4];
        for (int i = 0; i < 4; ++i)
          qi[i] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[i], iv)), lo), hi);
        const __m256i s8 = _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
        const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
        const __m128i s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
        sx = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 1)));
        // 32 int8 in element order = 8 words; word g (elements 4g..4g+3) goes to word 16g + l.
        const __m256i b8 = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
        alignas(32) uint32_t w[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(w), _mm256_permutevar8x32_epi32(b8, order));
        for (int g = 0; g < 8; ++g) sb[16 * g] = w[g];
      }
      const float dx = amax / 127.f;
      a.dx[size_t(m * nblk + b)] = dx;
      a.corr[size_t(m * nblk + b)] = -128 * sx;
      a.sxdx[size_t(m * nblk + b)] = dx * static_cast<float>(sx);
    }
  }
}

// The fixed lane tree of quant.h.
inline float lane_tree(const float* acc) {
  float t8[8], t4[4], t2[2];
  for (int i = 0; i < 8; ++i) t8[i] = acc[i] + acc[i + 8];
  for (int i = 0; i < 4; ++i) t4[i] = t8[i] + t8[i + 4];
  for (int i = 0; i < 2; ++i) t2[i] = t4[i] + t4[i + 2];
  return t2[0] + t2[1];
}

// Where a GEMV body puts output (m, n): y[m * ldy + n] = round_store(r + bias[n]).
struct GemvOut {
  float* y;
  int64_t ldy;
  const float* bias;
  DType store;
  void put(int64_t m, int64_t n, float r) const { y[m * ldy + n] = round_store(bias ? r + bias[n] : r, store); }
};

// ---- portable scalar path: rows [n0, n1) ----
void gemv_scalar(const QuantActs& a, const QuantMatrix& w, int64_t n0, int64_t n1, const GemvOut& out) {
  const int64_t S = w.superblocks(), nblk = a.Kp / kQuantBlock;
  const bool i8 = w.type() == QuantType::Int8;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* qr = w.qs_row(n);
    const uint16_t* sc = w.scales_row(n);
    for (int64_t m = 0; m < a.M; ++m) {
      const int8_t* xq = a.xq.data() + m * a.Kp;
      float acc[16] = {0};
      for (int64_t s = 0; s < S; ++s) {
        const int8_t* xs = xq + s * kQuantSuper;
        for (int l = 0; l < 16; ++l) {
          const int64_t b = s * 16 + l;
          int32_t isum = 0;
          if (i8) {
            const uint8_t* ws = qr + s * kQuantSuper;
            for (int e = 0; e < 32; ++e) {
              const int64_t o = lane_offset(l, e);
              isum += int32_t(ws[o]) * int32_t(xs[o]);
            }
            isum += a.corr[size_t(m * nblk + b)];
          } else {
            const uint8_t* ws = qr + s * (kQuantSuper / 2);
            for (int e = 0; e < 32; ++e) isum += int32_t(q4_code(ws, l, e)) * int32_t(xs[lane_offset(l, e)]);
          }
          const float d = f16_bits_to_f32(sc[(i8 ? 16 : 32) * s + l]);
          const float dd = d * a.dx[size_t(m * nblk + b)];
          acc[l] = std::fma(static_cast<float>(isum), dd, acc[l]);
          if (!i8) acc[l] = std::fma(f16_bits_to_f32(sc[32 * s + 16 + l]), a.sxdx[size_t(m * nblk + b)], acc[l]);
        }
      }
      out.put(m, n, lane_tree(acc));
    }
  }
}

// ---- AVX512-VNNI path ----

#define MM3_Q_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c")))

MM3_Q_TARGET inline float lane_tree_v(__m512 acc) {
  const __m256 t8 = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
  const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
  const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));               // lanes 0, 1: t4_0 + t4_2, t4_1 + t4_3
  return _mm_cvtss_f32(_mm_add_ss(t2, _mm_movehdup_ps(t2)));              // t2_0 + t2_1
}

// The VNNI bodies fetch kVnniPfBytes ahead of each weight stream (non-temporal hint; T1 or none on Zen 4,
// vnni_prefetch below), one line per 64-byte load. A [N, 4096] int8 row is one 4 KiB page, and the hardware
// prefetchers stop at page ends, so each row began with demand misses (perf: ~30% of the body's samples on
// the first load after a 512-byte step). Measured on Zen 5 (2 threads), A/B interleaved run by run in one
// process, 20 runs each: ar_frame_int8 0.298 -> 0.249 s, ar_frame_q4 0.275 -> 0.259 s;
// gemv_int8_4096x12288_m2 +17% in 8 of 8 process pairs, q4 +8%. The same prefetch in the bf16 GEMV
// (rows 8 KiB, 4 side by side) moved ar_frame by nothing (0.437 / 0.445 s), so that path has none on
// Zen 5 (linear.cpp: Zen 4's takes PREFETCHT1). A prefetch changes no value and never faults, so it may
// run past the end.
// The distance was 1024 bytes until the activations sat on cache lines (core/aligned.h); since then the body
// is fast enough that 1 KiB (~30 ns of a core's compute) no longer covers memory's latency. ar_frame in one
// process, Zen 5, 15 runs per setting interleaved: q4 1024 / 2048 / 4096 / 6144 / 8192 bytes 238.7 / 217.9 /
// 220.8 / 218.3 / 214.6 ms; int8 1024 / 4096 / 8192: 302.9 / 282.5 / 285.8 ms. The scales row (a separate
// stream, 1/4 of the q4 bytes) gets its own prefetch, half the codes' distance ahead (2 KiB then): q4
// 222.1 -> 209.7 ms (int8 282.5 -> 279.3, within the noise).
constexpr int64_t kVnniPfBytes = 4096;

// The distance the bodies prefetch the codes at (the scales at half of it): kVnniPfBytes, or the knob
// quant_pf_kib. Zen 4's q4 bodies prefetch twice as far (thirty-third session): `depth_frame_q4 --alternate
// quant_pf_kib=4,8` (40 runs a set) read 0.879 with the probe at 58 GB/s (vs_floor 1.58 -> 1.39) and
// 1.008-1.040 in five sets at probes 33-35; on one thread `gemv_q4_4096x12288_m2` 0.80 / 0.84. In the fast
// memory state each core streams what one core streams alone, and there the farther prefetch keeps more
// lines in flight; in the slow state memory itself is the bound. int8 (T1 only where M >= 3) stays at 4 KiB.
int64_t vnni_pf_bytes(bool i8) {
  static const bool zen4 = __builtin_cpu_is("amd") && __builtin_cpu_is("amdfam19h");
  const int forced = tuning::forced(tuning::Knob::QuantPfKib);
  if (forced > 0) return int64_t(forced) * 1024;
  return zen4 && !i8 ? 2 * kVnniPfBytes : kVnniPfBytes;
}

// Superblock s of NB rows (n-th pointers in qr / sc), M activation rows. Each (row, m) integer sum runs
// in C chains (vector v of the superblock into chain v % C; the chains added at the end: integer sums
// are exact, so neither the split nor the order changes a bit), NB·M·C >= 8 chains where the registers
// allow, so the VPDPBUSDs need not wait for each other; every loop runs over template constants and is
// unrolled (GCC had kept an earlier version's loop rolled with the sums on the stack, latency-bound at
// ~0.5 VPDPBUSD a cycle where Zen 5 issues 2). The fp32 steps then run superblock by superblock in order
// (quant.h).
// Superblocks go strictly one after another, so a row's codes are read in address order. Until the
// twenty-sixth session 4 (M = 2) or 8 (M = 1) superblocks were interleaved vector by vector (one chain
// per superblock: 64-byte loads 512 bytes apart, four streams inside 2 KiB), which Zen 4's prefetchers
// followed badly. Zen 4, 2 cores (docs/performance-history.md, twenty-sixth session): [12288, 4096] M = 2
// weights cycled through 512 MB, both bodies in one scratch program, one thread int8 ~15.7 -> ~22 GB/s,
// q4 ~17 -> ~19-21; two threads int8 ~23.5 -> ~31.5, q4 ~22.6 -> ~31 (a plain streaming sum: 31 / 35
// GB/s); in L2 (compute alone) no difference (int8 ~48, q4 ~29 GB/s a core). Binaries alternating x3:
// ar_frame_int8 502 / 499 / 475 -> 424 / 451 / 357 ms, ar_frame_q4 271 / 316 / 266 -> 259 / 237 / 212 ms,
// depth_frame_q4 100 / 108 / 114 -> 85 / 82 / 87 ms.
template <int M, bool I8, int NB, int PF>
MM3_Q_TARGET inline void superblock_vnni(const QuantActs& a, const uint8_t* const (&qr)[NB],
                                         const uint16_t* const (&sc)[NB], int64_t s, int64_t nblk, int64_t pfd,
                                         __m512 (&acc)[NB][M]) {
  constexpr int C = std::clamp(8 / (M * NB), 1, 4);
  const __m512i lo4 = _mm512_set1_epi8(0x0F);
  __m512i isum[NB][M][C];
#pragma GCC unroll 16
  for (int r = 0; r < NB; ++r)
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m)
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c)
        isum[r][m][c] =
            I8 && c == 0 ? _mm512_loadu_si512(a.corr.data() + size_t(m * nblk + s * 16)) : _mm512_setzero_si512();
  const int8_t* xs = a.xq.data() + s * kQuantSuper;
  if constexpr (I8) {
#pragma GCC unroll 16
    for (int v = 0; v < 8; ++v) {
      __m512i xv[M];
#pragma GCC unroll 16
      for (int m = 0; m < M; ++m) xv[m] = _mm512_loadu_si512(xs + m * a.Kp + 64 * v);
#pragma GCC unroll 16
      for (int r = 0; r < NB; ++r) {
        const __m512i wv = _mm512_loadu_si512(qr[r] + s * kQuantSuper + 64 * v);
        if constexpr (PF > 0) __builtin_prefetch(qr[r] + s * kQuantSuper + 64 * v + pfd, 0, PF == 2 ? 2 : 0);
#pragma GCC unroll 16
        for (int m = 0; m < M; ++m) isum[r][m][v % C] = _mm512_dpbusd_epi32(isum[r][m][v % C], wv, xv[m]);
      }
    }
  } else {
#pragma GCC unroll 16
    for (int c = 0; c < 4; ++c) {  // chunk c holds unpacked vectors c (low nibbles) and c + 4 (high nibbles)
      __m512i xl[M], xh[M];
#pragma GCC unroll 16
      for (int m = 0; m < M; ++m) {
        xl[m] = _mm512_loadu_si512(xs + m * a.Kp + 64 * c);
        xh[m] = _mm512_loadu_si512(xs + m * a.Kp + 64 * (c + 4));
      }
#pragma GCC unroll 16
      for (int r = 0; r < NB; ++r) {
        const __m512i b = _mm512_loadu_si512(qr[r] + s * (kQuantSuper / 2) + 64 * c);
        if constexpr (PF > 0) __builtin_prefetch(qr[r] + s * (kQuantSuper / 2) + 64 * c + pfd, 0, PF == 2 ? 2 : 0);
        const __m512i wl = _mm512_and_si512(b, lo4), wh = _mm512_and_si512(_mm512_srli_epi16(b, 4), lo4);
#pragma GCC unroll 16
        for (int m = 0; m < M; ++m) {
          isum[r][m][(2 * c) % C] = _mm512_dpbusd_epi32(isum[r][m][(2 * c) % C], wl, xl[m]);
          isum[r][m][(2 * c + 1) % C] = _mm512_dpbusd_epi32(isum[r][m][(2 * c + 1) % C], wh, xh[m]);
        }
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < NB; ++r) {
    if constexpr (PF > 0)
      __builtin_prefetch(reinterpret_cast<const char*>(sc[r] + (I8 ? 16 : 32) * s) + pfd / 2, 0, PF == 2 ? 2 : 0);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc[r] + (I8 ? 16 : 32) * s)));
    __m512 mn = _mm512_setzero_ps();
    if constexpr (!I8) mn = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc[r] + 32 * s + 16)));
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) {
      __m512i t = isum[r][m][0];
#pragma GCC unroll 16
      for (int c = 1; c < C; ++c) t = _mm512_add_epi32(t, isum[r][m][c]);
      const size_t bi = size_t(m * nblk + s * 16);
      const __m512 dd = _mm512_mul_ps(d, _mm512_loadu_ps(a.dx.data() + bi));
      acc[r][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), dd, acc[r][m]);
      if constexpr (!I8) acc[r][m] = _mm512_fmadd_ps(mn, _mm512_loadu_ps(a.sxdx.data() + bi), acc[r][m]);
    }
  }
}

// NB rows n..n+NB-1 over all superblocks.
template <int M, bool I8, int NB, int PF>
MM3_Q_TARGET inline void rows_vnni(const QuantActs& a, const QuantMatrix& w, int64_t n, int64_t pfd,
                                   const GemvOut& out) {
  const int64_t S = w.superblocks(), nblk = a.Kp / kQuantBlock;
  const uint8_t* qr[NB];
  const uint16_t* sc[NB];
  __m512 acc[NB][M];
  for (int r = 0; r < NB; ++r) {
    qr[r] = w.qs_row(n + r), sc[r] = w.scales_row(n + r);
    for (int m = 0; m < M; ++m) acc[r][m] = _mm512_setzero_ps();
  }
  for (int64_t s = 0; s < S; ++s) superblock_vnni<M, I8, NB, PF>(a, qr, sc, s, nblk, pfd, acc);
  for (int r = 0; r < NB; ++r)
    for (int m = 0; m < M; ++m) out.put(m, n + r, lane_tree_v(acc[r][m]));
}

// Rows [n0, n1) one after another, so each thread streams one contiguous range in address order.
// Measured on Zen 4 (2 threads, weights cycled through 500 MB): walking 4 rows side by side, 256 B of
// each in turn, read 2 KiB q4 rows at ~16 GB/s in a pure-load experiment, one row after another at
// ~25 GB/s (interleaved offsets inside a 4 KiB page defeat the hardware prefetcher; software prefetches
// did not recover it): [12288, 4096] q4 2.0-2.4 -> 1.2 ms, int8 2.2-2.4 -> 1.7 ms. The exception is a
// row whose M rows of quantized activations (M · Kp bytes) no longer stay in L1 beside the streamed
// weights: then 4 rows side by side, which load each activation vector once for 4 weight rows, are
// faster. The test is M · Kp > L1D / 2. Zen 4 (L1D 32 KiB), the LM's down projection (K = 12288, 2 x
// 12 KiB of activations): 4 rows [4096, 12288] q4 ~2.0 -> ~1.5 ms, int8 ~2.9 -> ~2.1 ms (2 rows: in
// between); the depth decoder's K = 6144 stays faster one row at a time (q4 0.70 vs 0.94 ms). Zen 5
// (L1D 48 KiB) is on the other side at K = 12288: one row at a time, 3 alternations of 9 runs,
// gemv_q4_12288x4096_m2 0.78-0.84 -> 0.61-0.67 ms, gemv_int8_12288x4096_m2 1.06-1.10 -> 0.97-0.98 ms;
// ar_frame_q4 in one process (15 frames each, alternating, same bits) 170.9 / 170.0 / 170.6 -> 165.8 /
// 163.6 / 164.8 ms, ar_frame_int8 274.1 -> 273.7 ms. With M > 2 the 4-row body would not fit the
// registers. The choice changes no bit (each output's sums run in the same order either way).
// Where a weight has the strip form (with_strips; the model builds it where quant_strips_pay, i.e. in
// this regime), strips_vnni runs instead: x broadcast per 16 rows, 1.2-1.4x this body's rate at K = 12288.
template <int M, bool I8, int PF>
MM3_Q_TARGET void gemv_vnni(const QuantActs& a, const QuantMatrix& w, int64_t n0, int64_t n1, const GemvOut& out) {
  int64_t n = n0;
  const int64_t pfd = PF > 0 ? vnni_pf_bytes(I8) : 0;
  if (M <= 2 && 2 * M * w.padded_cols() > cpu_l1d_bytes())
    for (; n + 4 <= n1; n += 4) rows_vnni<M, I8, 4, PF>(a, w, n, pfd, out);
  for (; n < n1; ++n) rows_vnni<M, I8, 1, PF>(a, w, n, pfd, out);
}

// The strip form's GEMV (quant.h): strips [j0, j1) of w. Per strip and residue l, the blocks s go in
// order; per (m, block) the integer sum runs in C chains (vectors into chain g % C; exact), then the
// fp32 steps of quant.h with the 16 rows in the lanes, d of the 16 rows from the strip's scales and dx
// (and dx · sx) broadcast. The 16 residues' vectors then go through quant.h's lane tree lane by lane.
// Thirty-third session, Zen 4, a scratch copy against the row body (same bits; cold copies, forms
// alternating): in L2 one core, q4 M = 2 45.9 vs 33.8 GB/s, int8 M = 2 81 vs 57; streamed from memory,
// int8 [4096, 12288] M = 2 21.6 vs 14.3 GB/s on one core and 34.0 vs 26.0 on two (a plain sum: 33.7).
template <int M, bool I8, int PF>
MM3_Q_TARGET void strips_vnni(const QuantActs& a, const QuantMatrix& w, int64_t j0, int64_t j1, const GemvOut& out) {
  const QuantStrips& st = *w.strips();
  const int64_t S = st.S, N = w.rows(), E = st.block_scales;
  const int64_t pfd = PF > 0 ? vnni_pf_bytes(I8) : 0;
  constexpr int C = M == 1 ? 4 : 2;
  const __m512i lo4 = _mm512_set1_epi8(0x0F);
  alignas(64) float part[M][16][16];
  for (int64_t j = j0; j < j1; ++j) {
    for (int l = 0; l < 16; ++l) {
      const uint8_t* q = st.block(j, l);
      const uint16_t* sp = st.block_scales_at(j, l);
      const int32_t* xw = a.sxw.data() + l * S * 8 * M;
      const size_t ai = size_t(l * S * M);
      __m512 acc[M];
#pragma GCC unroll 4
      for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
      for (int64_t s = 0; s < S; ++s) {
        __m512i isum[M][C];
#pragma GCC unroll 4
        for (int m = 0; m < M; ++m)
#pragma GCC unroll 4
          for (int c = 0; c < C; ++c)
            isum[m][c] = I8 && c == 0 ? _mm512_set1_epi32(a.scorr[ai + size_t(s * M + m)]) : _mm512_setzero_si512();
        if constexpr (I8) {
          const uint8_t* qs = q + s * kQuantSuper;
#pragma GCC unroll 8
          for (int g = 0; g < 8; ++g) {
            const __m512i wv = _mm512_load_si512(qs + 64 * g);
            if constexpr (PF > 0) __builtin_prefetch(qs + 64 * g + pfd, 0, PF == 2 ? 2 : 0);
#pragma GCC unroll 4
            for (int m = 0; m < M; ++m)
              isum[m][g % C] = _mm512_dpbusd_epi32(isum[m][g % C], wv, _mm512_set1_epi32(xw[(s * 8 + g) * M + m]));
          }
        } else {
          const uint8_t* qs = q + s * (kQuantSuper / 2);
#pragma GCC unroll 4
          for (int c = 0; c < 4; ++c) {  // chunk c: vectors c (low nibbles) and c + 4 (high nibbles)
            const __m512i b = _mm512_load_si512(qs + 64 * c);
            if constexpr (PF > 0) __builtin_prefetch(qs + 64 * c + pfd, 0, PF == 2 ? 2 : 0);
            const __m512i wl = _mm512_and_si512(b, lo4), wh = _mm512_and_si512(_mm512_srli_epi16(b, 4), lo4);
#pragma GCC unroll 4
            for (int m = 0; m < M; ++m) {
              isum[m][(2 * c) % C] =
                  _mm512_dpbusd_epi32(isum[m][(2 * c) % C], wl, _mm512_set1_epi32(xw[(s * 8 + c) * M + m]));
              isum[m][(2 * c + 1) % C] =
                  _mm512_dpbusd_epi32(isum[m][(2 * c + 1) % C], wh, _mm512_set1_epi32(xw[(s * 8 + c + 4) * M + m]));
            }
          }
        }
        if constexpr (PF > 0)
          __builtin_prefetch(reinterpret_cast<const char*>(sp + E * s) + pfd / 2, 0, PF == 2 ? 2 : 0);
        const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(sp + E * s)));
        __m512 mn = _mm512_setzero_ps();
        if constexpr (!I8) mn = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(sp + E * s + 16)));
#pragma GCC unroll 4
        for (int m = 0; m < M; ++m) {
          __m512i t = isum[m][0];
#pragma GCC unroll 4
          for (int c = 1; c < C; ++c) t = _mm512_add_epi32(t, isum[m][c]);
          const size_t bi = ai + size_t(s * M + m);
          const __m512 dd = _mm512_mul_ps(d, _mm512_set1_ps(a.sdx[bi]));
          acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), dd, acc[m]);
          if constexpr (!I8) acc[m] = _mm512_fmadd_ps(mn, _mm512_set1_ps(a.ssxdx[bi]), acc[m]);
        }
      }
#pragma GCC unroll 4
      for (int m = 0; m < M; ++m) _mm512_store_ps(part[m][l], acc[m]);
    }
    const int64_t rows = std::min<int64_t>(16, N - 16 * j);
    for (int m = 0; m < M; ++m) {
      __m512 t8[8], t4[4];
      for (int i = 0; i < 8; ++i) t8[i] = _mm512_add_ps(_mm512_load_ps(part[m][i]), _mm512_load_ps(part[m][i + 8]));
      for (int i = 0; i < 4; ++i) t4[i] = _mm512_add_ps(t8[i], t8[i + 4]);
      const __m512 r = _mm512_add_ps(_mm512_add_ps(t4[0], t4[2]), _mm512_add_ps(t4[1], t4[3]));
      alignas(64) float rv[16];
      _mm512_store_ps(rv, r);
      for (int64_t i = 0; i < rows; ++i) out.put(m, 16 * j + i, rv[i]);
    }
  }
}

using GemvFn = void (*)(const QuantActs&, const QuantMatrix&, int64_t, int64_t, const GemvOut&);

template <bool I8, int PF>
GemvFn pick_vnni_pf(int64_t M) {
  switch (M) {
    case 1:
      return gemv_vnni<1, I8, PF>;
    case 2:
      return gemv_vnni<2, I8, PF>;
    case 3:
      return gemv_vnni<3, I8, PF>;
    default:
      return gemv_vnni<4, I8, PF>;
  }
}

// Which software prefetches the VNNI bodies issue (codes and scales): 0 none, 1 PREFETCHNTA (the
// distances above), 2 PREFETCHT1 (into L2; same distances). On Zen 5 NTA took ar_frame_int8 0.298 ->
// 0.249 s and ar_frame_q4 0.275 -> 0.259 s (above). On Zen 4 (AMD family 19h, the only one of its cores
// with AVX512-VNNI), measured inside one process with the forms alternating run by run (20-30 runs a
// set; twenty-seventh session, docs/performance-history.md): NTA cost the int8 frames 11-14%
// (ar_frame_int8 without ÷ with 0.86 / 0.90 / 0.88 / 0.82, memory probe ~33 / ~57 / ~33 / ~40 GB/s;
// depth_frame_int8 0.89), T1 against none 1.00 / 1.04 there and 0.91 in depth_frame_int8, so int8 runs
// without. The q4 frames gained from T1: T1 ÷ NTA ar_frame_q4 0.81 / 0.89, depth_frame_q4 0.64, and
// T1 ÷ none 0.78 (NTA against none was even: 0.96-1.04). The knob quant_prefetch
// (MM3_QUANT_PREFETCH=0, 1 or 2; `mm3 bench --alternate quant_prefetch=0,1,2`) forces one form
// for both types.
// Zen 4's int8 with M >= 3 takes T1 (thirty-third session): the depth decoder's first step runs M = 4 (two
// positions of two CFG rows), whose 4 x 4 KiB of activations share the L1D with the streamed codes, and
// without prefetches that step took 2.0x an M = 2 step's time (perf, depth_frame_int8: 22% of the frame
// for one of 7 steps); with T1 1.08x. A scratch copy of the body, [12288, 4096], M = 4, one core, cold
// copies: none 11 GB/s, T1 4 / 8 / 16 KiB ahead 19.5 / 23 / 25 GB/s (M = 2: 22-25 either way). In the
// model, `--alternate quant_prefetch=0,-1` (old choice, then this one), 60 runs: depth_frame_int8 0.937
// (probe 33 GB/s) and 0.920 (probe 56); T1's distance 4 / 8 / 16 / 32 KiB: 1.00 / 1.03 / 1.02 / 1.02.
// Intel (thirty-eighth session; a 2-core Xeon, family 6 model 207, the first Intel core measured with
// these bodies): NTA was far the slowest. `--alternate quant_prefetch=1,0,2` (18 runs): depth_frame_int8
// none ÷ NTA 0.581, T1 ÷ NTA 0.461 (vs_floor 2.37 -> 1.10); depth_frame_q4 0.857 / 0.679 (1.82 -> 1.22).
// T1's distance 2 / 8 / 16 KiB against 4: 1.04 / 1.01 / 1.03 (int8), 1.04 / 1.00 / 1.00 (q4). So Intel's
// cores take T1 for both types; on Intel's cores NTA fills the L1D only, ahead of a stream that then
// evicts them before use (an inference, not measured).
int vnni_prefetch(bool i8, int64_t M) {
  static const bool zen4 = __builtin_cpu_is("amd") && __builtin_cpu_is("amdfam19h");
  static const bool intel = __builtin_cpu_is("intel");
  const int forced = tuning::forced(tuning::Knob::QuantPrefetch);
  if (forced >= 0) return forced;
  if (intel) return 2;
  return zen4 ? (i8 && M <= 2 ? 0 : 2) : 1;
}

template <bool I8>
GemvFn pick_vnni(int64_t M) {
  switch (vnni_prefetch(I8, M)) {
    case 0:
      return pick_vnni_pf<I8, 0>(M);
    case 2:
      return pick_vnni_pf<I8, 2>(M);
    default:
      return pick_vnni_pf<I8, 1>(M);
  }
}

template <bool I8, int PF>
GemvFn pick_strips_pf(int64_t M) {
  switch (M) {
    case 1:
      return strips_vnni<1, I8, PF>;
    case 2:
      return strips_vnni<2, I8, PF>;
    case 3:
      return strips_vnni<3, I8, PF>;
    default:
      return strips_vnni<4, I8, PF>;
  }
}

// The strip GEMV's prefetches: vnni_prefetch's choice.
template <bool I8>
GemvFn pick_strips(int64_t M) {
  switch (vnni_prefetch(I8, M)) {
    case 0:
      return pick_strips_pf<I8, 0>(M);
    case 2:
      return pick_strips_pf<I8, 2>(M);
    default:
      return pick_strips_pf<I8, 1>(M);
  }
}

bool cpu_has_vnni() { return cpu_has_avx512vnni(); }

// ---- AVX2 path (CPUs without AVX512-VNNI: Zen 2/3, Haswell..Comet Lake) ----
// AVX2 has no exact u8 x s8 dot: VPMADDUBSW adds two u8 x s8 products into a *saturating* int16, and
// (q + 128) · xq reaches 2 · 255 · 127 per pair. So the Int8 body works on q itself: the stored byte
// XOR 0x80 is q as an int8 (-127..127), and |q| (as u8) times xq carrying q's sign (VPSIGNB) is q · xq;
// a pair is at most 2 · 127 · 127 = 32258 < 2^15, so VPMADDUBSW is exact, and VPMADDWD with ones adds
// the pairs into the 32-bit lane of their 4 elements, i.e. of their block (the qs layout of quant.h).
// The block sum is then Σ q · xq directly, the very integer the scalar path reaches as
// Σ (q + 128) · xq − 128 · sx. Q4 codes are 0..15: a pair is at most 2 · 15 · 127 = 3810, so all 8
// unpacked vectors of a superblock add in int16 (≤ 30480) and one VPMADDWD per superblock widens them.
// Integer sums are exact; the fp32 steps are the scalar path's, in its order (lanes 0..7 in one ymm,
// 8..15 in the other), so the bits are the same.
#define MM3_Q2_TARGET __attribute__((target("avx2,fma,f16c")))

MM3_Q2_TARGET inline float lane_tree_v2(__m256 lo, __m256 hi) {
  const __m256 t8 = _mm256_add_ps(lo, hi);  // t8_i = acc_i + acc_{i+8}
  const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
  const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
  return _mm_cvtss_f32(_mm_add_ss(t2, _mm_movehdup_ps(t2)));
}

MM3_Q2_TARGET inline __m256i ld256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Rows [n0, n1) one after another (each thread streams its range in address order, as gemv_vnni).
template <int M, bool I8>
MM3_Q2_TARGET void gemv_avx2(const QuantActs& a, const QuantMatrix& w, int64_t n0, int64_t n1, const GemvOut& out) {
  const int64_t S = w.superblocks(), nblk = a.Kp / kQuantBlock;
  const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8(char(0x80)), lo4 = _mm256_set1_epi8(0x0F);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* qr = w.qs_row(n);
    const uint16_t* sc = w.scales_row(n);
    __m256 acc[M][2];
    for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    for (int64_t s = 0; s < S; ++s) {
      const int8_t* xs = a.xq.data() + s * kQuantSuper;
      // Fetch 1 KiB ahead of the weight stream (rows are contiguous; measured on Zen 3 for the bf16
      // GEMV: 25-35% faster than the hardware prefetchers alone). Prefetches change no value.
      {
        const char* ahead = reinterpret_cast<const char*>(qr) + (s + 1) * (I8 ? kQuantSuper : kQuantSuper / 2) + 1024;
        for (int b = 0; b < (I8 ? 8 : 4); ++b) __builtin_prefetch(ahead + 64 * b, 0, 0);
      }
      __m256i isum[M][2];
      if constexpr (I8) {
        for (int m = 0; m < M; ++m) isum[m][0] = isum[m][1] = _mm256_setzero_si256();
        const uint8_t* ws = qr + s * kQuantSuper;
        for (int v = 0; v < 8; ++v)
          for (int h = 0; h < 2; ++h) {
            const __m256i q = _mm256_xor_si256(ld256(ws + 64 * v + 32 * h), flip);
            const __m256i aq = _mm256_abs_epi8(q);
            for (int m = 0; m < M; ++m) {
              const __m256i xv = ld256(xs + m * a.Kp + 64 * v + 32 * h);
              const __m256i p = _mm256_maddubs_epi16(aq, _mm256_sign_epi8(xv, q));
              isum[m][h] = _mm256_add_epi32(isum[m][h], _mm256_madd_epi16(p, ones));
            }
          }
      } else {
        __m256i s16[M][2];
        for (int m = 0; m < M; ++m) s16[m][0] = s16[m][1] = _mm256_setzero_si256();
        const uint8_t* ws = qr + s * (kQuantSuper / 2);
        for (int c = 0; c < 4; ++c)  // chunk c: unpacked vectors c (low nibbles) and c + 4 (high nibbles)
          for (int h = 0; h < 2; ++h) {
            const __m256i b = ld256(ws + 64 * c + 32 * h);
            const __m256i wl = _mm256_and_si256(b, lo4), wh = _mm256_and_si256(_mm256_srli_epi16(b, 4), lo4);
            for (int m = 0; m < M; ++m) {
              const __m256i pl = _mm256_maddubs_epi16(wl, ld256(xs + m * a.Kp + 64 * c + 32 * h));
              const __m256i ph = _mm256_maddubs_epi16(wh, ld256(xs + m * a.Kp + 64 * (c + 4) + 32 * h));
              s16[m][h] = _mm256_add_epi16(s16[m][h], _mm256_add_epi16(pl, ph));
            }
          }
        for (int m = 0; m < M; ++m)
          for (int h = 0; h < 2; ++h) isum[m][h] = _mm256_madd_epi16(s16[m][h], ones);
      }
      for (int h = 0; h < 2; ++h) {
        const uint16_t* sd = sc + (I8 ? 16 : 32) * s + 8 * h;
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sd)));
        __m256 mn = _mm256_setzero_ps();
        if constexpr (!I8) mn = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sd + 16)));
        for (int m = 0; m < M; ++m) {
          const size_t bi = size_t(m * nblk + s * 16 + 8 * h);
          const __m256 dd = _mm256_mul_ps(d, _mm256_loadu_ps(a.dx.data() + bi));
          acc[m][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[m][h]), dd, acc[m][h]);
          if constexpr (!I8) acc[m][h] = _mm256_fmadd_ps(mn, _mm256_loadu_ps(a.sxdx.data() + bi), acc[m][h]);
        }
      }
    }
    for (int m = 0; m < M; ++m) out.put(m, n, lane_tree_v2(acc[m][0], acc[m][1]));
  }
}

// ---- AVX-VNNI path (AVX2 + the VEX-encoded VPDPBUSD, no AVX-512: Intel's client cores from Alder
// Lake on, Sierra Forest) ----
// gemv_avx2's loop with VPDPBUSD in place of the VPSIGNB / VPMADDUBSW / VPMADDWD steps: u8 x s8 products
// summed exactly into int32 lanes, four bytes a lane, as gemv_vnni does on 512 bits. Int8 multiplies the
// stored byte (q + 128) and starts each block sum at the correction −128 · sx (QuantActs::corr); Q4 adds
// the codes' products straight into int32. The fp32 steps are gemv_avx2's, in its order, so the same bits.
// Each (m, half) sum has two chains (even and odd vectors v) added at the end (integer: any order).
// Measured on Zen 5 capped to 256 bits (MM3_ISA=avx2; with quantize_acts_avx2 below, which the capped
// path had lacked), alternating binaries: gemv_q4_192x4096_m2_l2 (2 threads) 27.6-28.6 -> 14.8-15.1 us,
// gemv_q4_4096x12288_m2 0.94-0.98 -> 0.84-0.87 ms, gemv_int8_4096x12288_m2 1.58-1.81 -> 1.48-1.50 ms;
// ar_frame_q4 231.6 / 244.8 -> 199.4 / 212.3 ms; ar_frame_int8 349.8 -> 346.7 ms (memory-bound).
#define MM3_QV2_TARGET __attribute__((target("avx2,fma,f16c,avxvnni")))

template <int M, bool I8>
MM3_QV2_TARGET void gemv_avx_vnni(const QuantActs& a, const QuantMatrix& w, int64_t n0, int64_t n1,
                                  const GemvOut& out) {
  const int64_t S = w.superblocks(), nblk = a.Kp / kQuantBlock;
  const __m256i lo4 = _mm256_set1_epi8(0x0F);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* qr = w.qs_row(n);
    const uint16_t* sc = w.scales_row(n);
    __m256 acc[M][2];
    for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    for (int64_t s = 0; s < S; ++s) {
      const int8_t* xs = a.xq.data() + s * kQuantSuper;
      {
        const char* ahead = reinterpret_cast<const char*>(qr) + (s + 1) * (I8 ? kQuantSuper : kQuantSuper / 2) + 1024;
        for (int b = 0; b < (I8 ? 8 : 4); ++b) __builtin_prefetch(ahead + 64 * b, 0, 0);
      }
      __m256i isum[M][2][2];
      for (int m = 0; m < M; ++m)
        for (int h = 0; h < 2; ++h) {
          isum[m][h][0] = I8 ? ld256(a.corr.data() + size_t(m * nblk + s * 16 + 8 * h)) : _mm256_setzero_si256();
          isum[m][h][1] = _mm256_setzero_si256();
        }
      if constexpr (I8) {
        const uint8_t* ws = qr + s * kQuantSuper;
#pragma GCC unroll 8
        for (int v = 0; v < 8; ++v)
#pragma GCC unroll 2
          for (int h = 0; h < 2; ++h) {
            const __m256i q = ld256(ws + 64 * v + 32 * h);
#pragma GCC unroll 4
            for (int m = 0; m < M; ++m)
              isum[m][h][v & 1] = _mm256_dpbusd_avx_epi32(isum[m][h][v & 1], q, ld256(xs + m * a.Kp + 64 * v + 32 * h));
          }
      } else {
        const uint8_t* ws = qr + s * (kQuantSuper / 2);
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c)  // chunk c: unpacked vectors c (low nibbles) and c + 4 (high nibbles)
#pragma GCC unroll 2
          for (int h = 0; h < 2; ++h) {
            const __m256i b = ld256(ws + 64 * c + 32 * h);
            const __m256i wl = _mm256_and_si256(b, lo4), wh = _mm256_and_si256(_mm256_srli_epi16(b, 4), lo4);
#pragma GCC unroll 4
            for (int m = 0; m < M; ++m) {
              isum[m][h][0] = _mm256_dpbusd_avx_epi32(isum[m][h][0], wl, ld256(xs + m * a.Kp + 64 * c + 32 * h));
              isum[m][h][1] = _mm256_dpbusd_avx_epi32(isum[m][h][1], wh, ld256(xs + m * a.Kp + 64 * (c + 4) + 32 * h));
            }
          }
      }
      for (int h = 0; h < 2; ++h) {
        const uint16_t* sd = sc + (I8 ? 16 : 32) * s + 8 * h;
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sd)));
        __m256 mn = _mm256_setzero_ps();
        if constexpr (!I8) mn = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sd + 16)));
        for (int m = 0; m < M; ++m) {
          const size_t bi = size_t(m * nblk + s * 16 + 8 * h);
          const __m256 dd = _mm256_mul_ps(d, _mm256_loadu_ps(a.dx.data() + bi));
          const __m256i is = _mm256_add_epi32(isum[m][h][0], isum[m][h][1]);
          acc[m][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), dd, acc[m][h]);
          if constexpr (!I8) acc[m][h] = _mm256_fmadd_ps(mn, _mm256_loadu_ps(a.sxdx.data() + bi), acc[m][h]);
        }
      }
    }
    for (int m = 0; m < M; ++m) out.put(m, n, lane_tree_v2(acc[m][0], acc[m][1]));
  }
}

template <bool I8, bool VNNI>
GemvFn pick_avx2(int64_t M) {
  switch (M) {
    case 1:
      return VNNI ? gemv_avx_vnni<1, I8> : gemv_avx2<1, I8>;
    case 2:
      return VNNI ? gemv_avx_vnni<2, I8> : gemv_avx2<2, I8>;
    case 3:
      return VNNI ? gemv_avx_vnni<3, I8> : gemv_avx2<3, I8>;
    default:
      return VNNI ? gemv_avx_vnni<4, I8> : gemv_avx2<4, I8>;
  }
}

bool cpu_has_quant_avx2() {
  static const bool v = cpu_has_avx2_fma() && __builtin_cpu_supports("f16c");
  return v;
}
bool cpu_has_quant_avx_vnni() {
  static const bool v = cpu_has_quant_avx2() && __builtin_cpu_supports("avxvnni");
  return v;
}

}  // namespace

bool quant_isa_available(QuantIsa isa) {
  switch (isa) {
    case QuantIsa::Auto:
    case QuantIsa::Scalar: return true;
    case QuantIsa::Avx512Vnni: return cpu_has_vnni();
    case QuantIsa::Avx2:
      return cpu_has_quant_avx2();
    case QuantIsa::AvxVnni:
      return cpu_has_quant_avx_vnni();
  }
  return false;
}

void quant_gemv(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const QuantMatrix& w,
                const float* bias, float* y, int64_t ldy, DType store, QuantIsa isa) {
  const QuantOut one{&w, bias, y, ldy};
  quant_gemv_multi(pool, x, M, ldx, &one, 1, store, isa);
}

void quant_gemv_multi(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const QuantOut* outs, int n,
                      DType store, QuantIsa isa) {
  MM3_CHECK(n >= 1, "quant_gemv_multi: no weights");
  const int64_t K = outs[0].w->cols();
  std::vector<int64_t> starts(size_t(n) + 1, 0);
  for (int i = 0; i < n; ++i) {
    const QuantMatrix& w = *outs[i].w;
    MM3_CHECK(M >= 1 && M <= 4 && ldx >= K && w.cols() == K && outs[i].ldy >= w.rows(),
              "quant_gemv: M={} ldx={} ldy={} for [{}, {}] (K {})", M, ldx, outs[i].ldy, w.rows(), w.cols(), K);
    starts[size_t(i) + 1] = starts[size_t(i)] + w.rows();
  }
  if (isa == QuantIsa::Auto)
    isa = cpu_has_vnni()             ? QuantIsa::Avx512Vnni
          : cpu_has_quant_avx_vnni() ? QuantIsa::AvxVnni
          : cpu_has_quant_avx2()     ? QuantIsa::Avx2
                                     : QuantIsa::Scalar;
  MM3_CHECK(quant_isa_available(isa), "quant_gemv: the requested ISA is not available on this CPU");
  // Reused per calling thread (no allocation per call). A local reference, so that the workers'
  // chunks read the caller's buffers and not their own thread_local instances.
  thread_local QuantActs tl_acts;
  QuantActs& a = tl_acts;
  quantize_acts(x, M, ldx, K, a, isa == QuantIsa::Scalar);
  // The strip GEMV where every weight of the call has the strip form; the work is then split by strips.
  bool strips = isa == QuantIsa::Avx512Vnni && tuning::forced(tuning::Knob::QuantStrips) != 0;
  for (int i = 0; i < n; ++i) strips = strips && outs[i].w->strips();
  if (strips) {
    order_acts_for_strips(a);
    for (int i = 0; i < n; ++i) starts[size_t(i) + 1] = starts[size_t(i)] + outs[i].w->strips()->strips;
  }
  std::vector<GemvOut> out(static_cast<size_t>(n));
  std::vector<GemvFn> fn(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    out[size_t(i)] = GemvOut{outs[i].y, outs[i].ldy, outs[i].bias, store};
    const bool i8 = outs[i].w->type() == QuantType::Int8;
    fn[size_t(i)] = isa == QuantIsa::Scalar    ? gemv_scalar
                    : isa == QuantIsa::Avx2    ? (i8 ? pick_avx2<true, false>(M) : pick_avx2<false, false>(M))
                    : isa == QuantIsa::AvxVnni ? (i8 ? pick_avx2<true, true>(M) : pick_avx2<false, true>(M))
                    : strips                   ? (i8 ? pick_strips<true>(M) : pick_strips<false>(M))
                                               : (i8 ? pick_vnni<true>(M) : pick_vnni<false>(M));
  }
  const int64_t row_bytes = outs[0].w->row_qs_bytes() + 2 * outs[0].w->row_scales();
  const int64_t min_rows = std::max<int64_t>(1, (64 * 1024) / row_bytes);
  pool.parallel_for(
      starts.back(),
      [&](int64_t b, int64_t e) {
        for_segments(starts, b, e, [&](size_t i, int64_t lo, int64_t hi) { fn[i](a, *outs[i].w, lo, hi, out[i]); });
      },
      strips ? std::max<int64_t>(1, min_rows / 16) : min_rows);
}

void quant_gemm(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const QuantMatrix& w,
                const float* bias, float* y, int64_t ldy, DType store) {
  const int64_t N = w.rows(), K = w.cols();
  MM3_CHECK(M >= 0 && ldx >= K && ldy >= N, "quant_gemm: M={} ldx={} ldy={} for [{}, {}]", M, ldx, ldy, N, K);
  if (M == 0) return;
  const bool bf16 = store == DType::BF16;  // gemm_nt falls back to fp32 FMAs without AVX512-BF16
  // Panels of dequantized weights, a multiple of the GEMM's 128-column panels: ~16 MiB of bf16 (each
  // GEMM call converts x to bf16 again, so fewer, larger panels; 4 MiB before the thirty-seventh
  // session), ~4 MiB of fp32. bf16 rows pass through a row of fp32 in the worker's cache, not a panel.
  const int64_t np = std::clamp<int64_t>((bf16 ? (16 << 20) / (K * 2) : (4 << 20) / (K * 4)) / 128 * 128, 128,
                                         std::max<int64_t>(128, N));
  std::vector<float> pf(bf16 ? 0 : static_cast<size_t>(std::min(np, N) * K));
  std::vector<uint16_t> ph(bf16 ? static_cast<size_t>(std::min(np, N) * K) : 0);
  for (int64_t n0 = 0; n0 < N; n0 += np) {
    const int64_t n1 = std::min(N, n0 + np);
    pool.parallel_for(
        n1 - n0,
        [&](int64_t a, int64_t b) {
          if (!bf16) {
            dequantize_rows(w, n0 + a, n0 + b, pf.data() + a * K, K);
            return;
          }
          thread_local aligned_vector<float> row;
          if (row.size() < static_cast<size_t>(K)) row.resize(static_cast<size_t>(K));
          for (int64_t r = a; r < b; ++r) {
            dequantize_rows(w, n0 + r, n0 + r + 1, row.data(), K);
            f32_to_bf16(row.data(), ph.data() + r * K, static_cast<size_t>(K));
          }
        },
        std::max<int64_t>(1, 16384 / K));
    if (bf16)
      gemm_nt(pool, x, ldx, M, ph.data(), DType::BF16, K, n1 - n0, K, bias ? bias + n0 : nullptr, y + n0, ldy, store,
              true);
    else
      gemm_nt(pool, x, ldx, M, pf.data(), DType::F32, K, n1 - n0, K, bias ? bias + n0 : nullptr, y + n0, ldy, store,
              false);
  }
}

}  // namespace detail
}  // namespace mm3::kern
