// hadamard.cpp — kern::rotate_row (kernels.h): a row's signs flipped by rotation_sign, then the
// unnormalized Walsh-Hadamard transform in place. gemm_only_i8's rotated forms (I8Options::rotate) take
// weight rows through it once and every activation row at every call, so it is vectorized: on AVX-512 the
// sign flip and the four stages inside a 16-float vector in registers (a lane swap, a sign flip and an add
// per stage), then the stages h >= 16 across vectors, two at a time while two remain (a 4-point butterfly
// of elements h apart: one load and one store per element for two stages). The AVX2 twin does the same on
// 8 lanes. Rotating a row of 8192 is ~1% of the int8 DiT's samples (twenty-second session).
// The first pass reads the source row, so rotating a copy costs no separate copy. Every output is the
// scalar loop's sequence of adds and subtracts, so all paths give the same bits
// (x − y is x + (−y) in IEEE arithmetic, and a + b is b + a). ref::rotate_row is the scalar twin.
#include <cstring>
#include <vector>

#include "core/errors.h"
#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"

namespace mm3::kern {

namespace {

constexpr int64_t kMaxRotation = 65536;

// Sign-bit masks of rotation_sign for k < kMaxRotation (0 or 0x80000000), built once.
const uint32_t* sign_masks() {
  static const std::vector<uint32_t> masks = [] {
    std::vector<uint32_t> m(static_cast<size_t>(kMaxRotation));
    for (int64_t k = 0; k < kMaxRotation; ++k) m[static_cast<size_t>(k)] = rotation_sign(k) < 0 ? 0x80000000u : 0u;
    return m;
  }();
  return masks.data();
}

#if defined(__AVX512F__)
// The stages h >= h0 (h0 a power of two >= the vector width W) on blocks of W floats, the vector ops
// through the lambdas. Two stages per pass (a 4-point butterfly) while two remain.
template <int W, typename Load, typename Store, typename Add, typename Sub>
inline void stages_across(float* v, int64_t n, int64_t h0, Load ld, Store st, Add add, Sub sub) {
  int64_t h = h0;
  for (; 4 * h <= n; h *= 4)
    for (int64_t i = 0; i < n; i += 4 * h)
      for (int64_t j = i; j < i + h; j += W) {
        const auto a = ld(v + j), b = ld(v + j + h), c = ld(v + j + 2 * h), d = ld(v + j + 3 * h);
        const auto ab = add(a, b), amb = sub(a, b), cd = add(c, d), cmd = sub(c, d);
        st(v + j, add(ab, cd));
        st(v + j + h, add(amb, cmd));
        st(v + j + 2 * h, sub(ab, cd));
        st(v + j + 3 * h, sub(amb, cmd));
      }
  for (; h < n; h *= 2)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; j += W) {
        const auto a = ld(v + j), b = ld(v + j + h);
        st(v + j, add(a, b));
        st(v + j + h, sub(a, b));
      }
}
#endif

void rotate_scalar(const float* src, float* v, int64_t n) {
  const uint32_t* sg = sign_masks();
  for (int64_t k = 0; k < n; ++k) {
    uint32_t b;
    std::memcpy(&b, src + k, 4);
    b ^= sg[k];
    std::memcpy(v + k, &b, 4);
  }
  for (int64_t h = 1; h < n; h *= 2)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const float a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
}

#if defined(__AVX512F__)
// One stage h < 16 inside a vector: lanes with bit h clear get v + p, lanes with it set p − v, p being v
// with the lanes h apart swapped (neg: the sign bit on the lanes with bit h set).
inline __m512 stage_in(__m512 v, __m512 p, __m512 neg) { return _mm512_add_ps(p, _mm512_xor_ps(v, neg)); }

void rotate_avx512(const float* src, float* v, int64_t n) {
  const uint32_t* sg = sign_masks();
  auto lanes_with = [](int bit) {
    alignas(64) uint32_t m[16];
    for (int i = 0; i < 16; ++i) m[i] = (i & bit) ? 0x80000000u : 0u;
    return _mm512_castsi512_ps(_mm512_load_si512(m));
  };
  const __m512 n1 = lanes_with(1), n2 = lanes_with(2), n4 = lanes_with(4), n8 = lanes_with(8);
  for (int64_t j = 0; j < n; j += 16) {
    __m512 x = _mm512_xor_ps(_mm512_loadu_ps(src + j), _mm512_castsi512_ps(_mm512_loadu_si512(sg + j)));
    x = stage_in(x, _mm512_permute_ps(x, 0xB1), n1);        // lanes 1 apart
    x = stage_in(x, _mm512_permute_ps(x, 0x4E), n2);        // 2 apart
    x = stage_in(x, _mm512_shuffle_f32x4(x, x, 0xB1), n4);  // 4 apart: 128-bit blocks swapped in pairs
    x = stage_in(x, _mm512_shuffle_f32x4(x, x, 0x4E), n8);  // 8 apart: the 256-bit halves swapped
    _mm512_storeu_ps(v + j, x);
  }
  stages_across<16>(
      v, n, 16, [](const float* p) { return _mm512_loadu_ps(p); }, [](float* p, __m512 x) { _mm512_storeu_ps(p, x); },
      [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); }, [](__m512 a, __m512 b) { return _mm512_sub_ps(a, b); });
}
#else
MM3_SIMD_AVX2 inline __m256 stage_in8(__m256 v, __m256 p, __m256 neg) {
  return _mm256_add_ps(p, _mm256_xor_ps(v, neg));
}

// The sign bit on the lanes whose index has `bit` set.
MM3_SIMD_AVX2 inline __m256 lanes_with8(int bit) {
  alignas(32) uint32_t m[8];
  for (int i = 0; i < 8; ++i) m[i] = (i & bit) ? 0x80000000u : 0u;
  return _mm256_castsi256_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(m)));
}

MM3_SIMD_AVX2 void rotate_avx2(const float* src, float* v, int64_t n) {
  const uint32_t* sg = sign_masks();
  const __m256 n1 = lanes_with8(1), n2 = lanes_with8(2), n4 = lanes_with8(4);
  for (int64_t j = 0; j < n; j += 8) {
    __m256 x = _mm256_xor_ps(_mm256_loadu_ps(src + j),
                             _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sg + j))));
    x = stage_in8(x, _mm256_permute_ps(x, 0xB1), n1);
    x = stage_in8(x, _mm256_permute_ps(x, 0x4E), n2);
    x = stage_in8(x, _mm256_permute2f128_ps(x, x, 0x01), n4);
    _mm256_storeu_ps(v + j, x);
  }
  // The stages h >= 8, as stages_across (written out: its lambdas would need the AVX2 target too).
  int64_t h = 8;
  for (; 4 * h <= n; h *= 4)
    for (int64_t i = 0; i < n; i += 4 * h)
      for (int64_t j = i; j < i + h; j += 8) {
        const __m256 a = _mm256_loadu_ps(v + j), b = _mm256_loadu_ps(v + j + h), c = _mm256_loadu_ps(v + j + 2 * h),
                     d = _mm256_loadu_ps(v + j + 3 * h);
        const __m256 ab = _mm256_add_ps(a, b), amb = _mm256_sub_ps(a, b), cd = _mm256_add_ps(c, d),
                     cmd = _mm256_sub_ps(c, d);
        _mm256_storeu_ps(v + j, _mm256_add_ps(ab, cd));
        _mm256_storeu_ps(v + j + h, _mm256_add_ps(amb, cmd));
        _mm256_storeu_ps(v + j + 2 * h, _mm256_sub_ps(ab, cd));
        _mm256_storeu_ps(v + j + 3 * h, _mm256_sub_ps(amb, cmd));
      }
  for (; h < n; h *= 2)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; j += 8) {
        const __m256 a = _mm256_loadu_ps(v + j), b = _mm256_loadu_ps(v + j + h);
        _mm256_storeu_ps(v + j, _mm256_add_ps(a, b));
        _mm256_storeu_ps(v + j + h, _mm256_sub_ps(a, b));
      }
}
#endif

}  // namespace

bool rotation_applies(int64_t n) { return n >= 1 && n <= kMaxRotation && (n & (n - 1)) == 0; }

void rotate_row(const float* src, float* dst, int64_t n) {
  MM3_CHECK(rotation_applies(n), "rotate_row: n = {} is not a power of two <= {}", n, kMaxRotation);
#if defined(__AVX512F__)
  if (n >= 16) return rotate_avx512(src, dst, n);
#else
  if (n >= 8 && detail::cpu_has_avx2_fma()) return rotate_avx2(src, dst, n);
#endif
  rotate_scalar(src, dst, n);
}

void rotate_row(float* v, int64_t n) { rotate_row(v, v, n); }

}  // namespace mm3::kern
