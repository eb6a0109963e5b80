#include "core/dtype.h"

#if defined(__AVX512F__)
// GCC 12's own AVX-512 shift intrinsics trip -Wmaybe-uninitialized (GCC PR 105593; see simd.h).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#endif

namespace mm3 {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I64: return 8;
    case DType::I32: return 4;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view s) {
  if (s == "F32") return DType::F32;
  if (s == "BF16") return DType::BF16;
  if (s == "F16") return DType::F16;
  if (s == "I64") return DType::I64;
  if (s == "I32") return DType::I32;
  return std::nullopt;
}

uint16_t f32_to_f16_bits(float f) {
  uint32_t x = f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7FFFFFFFu;
  if (absx > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);  // NaN
  if (absx >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // overflow -> inf
  if (absx < 0x38800000u) {
    // Result is subnormal (or zero): value = absx as float; scale to units of 2^-24 with RNE.
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25 rounds to 0
    uint32_t mant = (absx & 0x7FFFFFu) | 0x800000u;
    int e = static_cast<int>(absx >> 23);  // biased exponent, 102..112
    int shift = 126 - e;                   // 14..24
    uint32_t r = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  // Normal: rebias exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
  uint32_t r = absx - 0x38000000u;  // exponent rebias
  uint32_t lsb = (r >> 13) & 1u;
  r += 0xFFFu + lsb;
  return static_cast<uint16_t>(sign | (r >> 13));
}

float f16_bits_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1Fu;
  uint32_t m = h & 0x3FFu;
  if (e == 0) {
    if (m == 0) return f32_from_bits(sign);
    float v = std::ldexp(static_cast<float>(m), -24);
    return sign ? -v : v;
  }
  if (e == 31) return f32_from_bits(sign | 0x7F800000u | (m << 13));
  return f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
namespace {
// f32_to_bf16_bits of 16 lanes, in the upper halves of the 32-bit lanes (the lower halves zero): the same
// integer recipe (round half to even, NaN -> 0x7FC0).
inline __m512i bf16_upper_v(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i bias =
      _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7FFF));
  const __m512i r = _mm512_and_si512(_mm512_add_epi32(u, bias), _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
  return _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC00000));
}
#if defined(__AVX512BF16__)
// VCVTNE2PS2BF16 rounds to nearest even as the recipe does for every pattern but NaNs and subnormals
// (checked exhaustively: the 4,261,412,868 others all equal): it flushes subnormal inputs to zero and
// keeps a NaN's sign and payload. Vectors with lanes of those classes (VFPCLASSPS: QNaN 0x01, subnormal
// 0x20, SNaN 0x80) take the integer recipe.
constexpr int kCvtUnsafe = 0x01 | 0x20 | 0x80;
#endif
}  // namespace
#endif

void round_to_store(float* x, size_t n, DType store) {
  if (store != DType::BF16) return;
  size_t i = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__)
  // (the integer recipe: a guarded VCVTNEPS2BF16 widened back to floats was no faster, 0.8 against 0.6-0.7
  // us for 16384 floats in L1)
  for (; i + 16 <= n; i += 16) _mm512_storeu_si512(x + i, bf16_upper_v(_mm512_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) x[i] = round_bf16(x[i]);
}

void bf16_to_f32(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_f32(src[i]);
}

// f32_to_bf16_bits element for element. AVX-512: 32 at a time into one 64-byte store (the 16-wide
// VPMOVDW to memory GCC makes of a narrowing store had been the slow part), by one VCVTNE2PS2BF16 where
// the build has AVX512-BF16 and no lane is a NaN or subnormal, else the integer recipe and a word
// gather; the masked 16-wide recipe for the tail.
void f32_to_bf16(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__)
  alignas(64) static const uint16_t odd_words[32] = {1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
                                                     33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
  const __m512i odd = _mm512_load_si512(odd_words);
  for (; i + 32 <= n; i += 32) {
    const __m512 a = _mm512_loadu_ps(src + i), b = _mm512_loadu_ps(src + i + 16);
#if defined(__AVX512BF16__)
    if (!(_mm512_fpclass_ps_mask(a, kCvtUnsafe) | _mm512_fpclass_ps_mask(b, kCvtUnsafe))) {
      _mm512_storeu_si512(dst + i, (__m512i)_mm512_cvtne2ps_pbh(b, a));
      continue;
    }
#endif
    _mm512_storeu_si512(dst + i, _mm512_permutex2var_epi16(bf16_upper_v(a), odd, bf16_upper_v(b)));
  }
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1u);
    _mm512_mask_cvtepi32_storeu_epi16(dst + i, m,
                                      _mm512_srli_epi32(bf16_upper_v(_mm512_maskz_loadu_ps(m, src + i)), 16));
  }
#endif
  for (; i < n; ++i) dst[i] = f32_to_bf16_bits(src[i]);
}

}  // namespace mm3
