// elementwise.cpp — kern::silu_mul, silu_mul_bf16, silu, add, tanh_inplace, snake (kernels.h), the CPU backend.
//
// Each follows the torch expression the models use, op by op, rounding to the store dtype wherever a
// bf16 torch op would write a bf16 tensor:
// * silu(x) = x / (1 + exp(-x)) (ATen's CPU formula), fp32 inside; silu_mul rounds silu's result
//   before the product (SwiGLU `silu(gate) * up`, MODEL.md §1.2; DiT GLU `a * silu(g)`, §4.1).
// * snake (DAC, MODEL.md §5.1): x + (alpha + 1e-9).reciprocal() * sin(alpha * x).pow(2), i.e. the
//   ops mul, sin, square, add-eps, reciprocal, mul, add, each rounded in bf16, fused into one pass;
//   the row and its vector sin live in conv_snake.cpp (the convolutions fuse the same row).
#pragma GCC optimize("fp-contract=off")

#include <cmath>

#include "kernels/cpu/conv_detail.h"
#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"

namespace mm3::kern {

namespace {
inline float silu1(float x) { return x / (1.0f + std::exp(-x)); }
#if defined(__AVX512F__)
// The vector form is simd.h's silu_v: the same expression with exp_v, so a lane differs from silu1 only
// where the two exps do; 6x faster than the scalar loop over the DiT's 690 x 8192 GLU (0.33 s of a
// 5.5 s bf16 forward).
using detail::silu_v;
#endif
}  // namespace

void silu_mul(const float* gate, const float* up, float* out, int64_t n, DType store) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i < n; i += 16) {
    const __mmask16 m = detail::tail_mask(n - i);
    _mm512_mask_storeu_ps(
        out + i, m, detail::silu_mul_v(_mm512_maskz_loadu_ps(m, gate + i), _mm512_maskz_loadu_ps(m, up + i), store));
  }
#endif
  if (store == DType::BF16) {
    for (; i < n; ++i) out[i] = round_bf16(round_bf16(silu1(gate[i])) * up[i]);
  } else {
    for (; i < n; ++i) out[i] = silu1(gate[i]) * up[i];
  }
}

void silu_mul_bf16(const float* gate, const float* up, uint16_t* out, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__)
  for (; i < n; i += 16) {
    const __mmask16 m = detail::tail_mask(n - i);
    const __m512 g = detail::round_bf16_v(_mm512_maskz_loadu_ps(m, gate + i));
    const __m512 u = detail::round_bf16_v(_mm512_maskz_loadu_ps(m, up + i));
    const __m512 r = detail::round_bf16_v(_mm512_mul_ps(detail::round_bf16_v(silu_v(g)), u));
    // r is a bf16 value: its bits are the float's upper half.
    _mm256_mask_storeu_epi16(out + i, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(r), 16)));
  }
#endif
  for (; i < n; ++i) out[i] = f32_to_bf16_bits(round_bf16(silu1(round_bf16(gate[i]))) * round_bf16(up[i]));
}

void silu(const float* x, float* out, int64_t n, DType store) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i < n; i += 16) {
    const __mmask16 m = detail::tail_mask(n - i);
    _mm512_mask_storeu_ps(out + i, m, detail::round_store_v(silu_v(_mm512_maskz_loadu_ps(m, x + i)), store));
  }
#endif
  for (; i < n; ++i) out[i] = round_store(silu1(x[i]), store);
}

void add(const float* a, const float* b, float* out, int64_t n, DType store) {
  if (store == DType::BF16) {
    for (int64_t i = 0; i < n; ++i) out[i] = round_bf16(a[i] + b[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
  }
}

void tanh_inplace(float* x, int64_t n, DType store) {
  for (int64_t i = 0; i < n; ++i) x[i] = round_store(std::tanh(x[i]), store);
}

void snake(const float* x, const float* alpha, float* y, int64_t C, int64_t L, DType store) {
  // The row (vector sin, rounding points) is shared with the convolutions' fused Snake (conv_snake.cpp).
  for (int64_t c = 0; c < C; ++c)
    detail::snake_row(x + c * L, alpha[c], detail::snake_inv(alpha[c], store), y + c * L, L, store);
}

}  // namespace mm3::kern
