// norm.cpp — kern::embedding, kern::rms_norm, kern::layer_norm(_bf16) (kernels.h), the CPU backend.
//
// rms_norm follows transformers' Qwen3RMSNorm / diffusers' RMSNorm (MODEL.md §1.2, §1.3):
//   var = mean(x^2) (fp32), xn = x * rsqrt(var + eps) (fp32; rsqrt as torch's 1 / sqrt),
//   xn rounded to the activation dtype, y = weight * xn rounded again.
// layer_norm follows ATen's CPU LayerNorm kernel: mean / biased variance per row, rstd = 1/sqrt(var+eps)
// in fp32, y = (x - mean) * rstd * gamma + beta in fp32, one rounding at the end (for bf16 inputs the
// kernel computes in float and rounds only the output).
// Row statistics are accumulated in double and rounded to fp32: torch's fp32 cascade sum is within
// an ulp of that, and a double sum does not depend on vector width.
#pragma GCC optimize("fp-contract=off")

#include <cmath>
#include <cstring>

#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"

namespace mm3::kern {

namespace {

double sum_f64(const float* x, int64_t n) {
#if defined(__AVX512F__)
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    a0 = _mm512_add_pd(a0, _mm512_cvtps_pd(_mm256_loadu_ps(x + k)));
    a1 = _mm512_add_pd(a1, _mm512_cvtps_pd(_mm256_loadu_ps(x + k + 8)));
  }
  double s = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
  for (; k < n; ++k) s += x[k];
  return s;
#else
  double s = 0;
  for (int64_t k = 0; k < n; ++k) s += x[k];
  return s;
#endif
}

// sum (x - c)^2 in double.
double sumsq_f64(const float* x, int64_t n, double c) {
#if defined(__AVX512F__)
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd(), cv = _mm512_set1_pd(c);
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    __m512d d0 = _mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x + k)), cv);
    __m512d d1 = _mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x + k + 8)), cv);
    a0 = _mm512_fmadd_pd(d0, d0, a0);
    a1 = _mm512_fmadd_pd(d1, d1, a1);
  }
  double s = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
  for (; k < n; ++k) {
    double d = x[k] - c;
    s += d * d;
  }
  return s;
#else
  double s = 0;
  for (int64_t k = 0; k < n; ++k) {
    double d = x[k] - c;
    s += d * d;
  }
  return s;
#endif
}

}  // namespace

void embedding(const Tensor& table, const int64_t* ids, int64_t n, float* out, int64_t ldo) {
  MM3_CHECK(table.ndim() == 2 && table.is_contiguous() &&
                (table.dtype() == DType::F32 || table.dtype() == DType::BF16),
            "embedding: table must be a contiguous 2-D F32 or BF16 tensor, got {}", table.describe());
  const int64_t V = table.dim(0), H = table.dim(1);
  MM3_CHECK(ldo >= H, "embedding: ldo {} < hidden {}", ldo, H);
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= V)
      throw InvalidInput(fmt::format("embedding: id {} at position {} is outside the table's [0, {})", ids[i], i, V));
  for (int64_t i = 0; i < n; ++i) {
    if (table.dtype() == DType::F32)
      std::memcpy(out + i * ldo, table.data<float>() + ids[i] * H, static_cast<size_t>(H) * sizeof(float));
    else
      bf16_to_f32(static_cast<const uint16_t*>(table.raw()) + ids[i] * H, out + i * ldo, static_cast<size_t>(H));
  }
}

void rms_norm(const float* x, int64_t rows, int64_t dim, int64_t ldx, const float* weight, float eps, float* y,
              int64_t ldy, DType store) {
  MM3_CHECK(dim > 0 && ldx >= dim && ldy >= dim, "rms_norm: dim={} ldx={} ldy={}", dim, ldx, ldy);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    float* yr = y + r * ldy;
    const float var = static_cast<float>(sumsq_f64(xr, dim, 0.0) / static_cast<double>(dim));
    const float rs = 1.0f / std::sqrt(var + eps);
    if (store == DType::BF16) {
      for (int64_t i = 0; i < dim; ++i) {
        const float xn = round_bf16(xr[i] * rs);
        yr[i] = weight ? round_bf16(weight[i] * xn) : xn;
      }
    } else {
      for (int64_t i = 0; i < dim; ++i) {
        const float xn = xr[i] * rs;
        yr[i] = weight ? weight[i] * xn : xn;
      }
    }
  }
}

namespace {

// One row of layer_norm: out(i, v) receives element i's fp32 value before rounding.
template <class Out>
void layer_norm_row(const float* xr, int64_t dim, const float* weight, const float* bias, float eps, Out out) {
  const double mean_d = sum_f64(xr, dim) / static_cast<double>(dim);
  const float mean = static_cast<float>(mean_d);
  const float var = static_cast<float>(sumsq_f64(xr, dim, mean_d) / static_cast<double>(dim));
  const float rstd = 1.0f / std::sqrt(var + eps);
  for (int64_t i = 0; i < dim; ++i) {
    float v = (xr[i] - mean) * rstd;
    if (weight) v = v * weight[i];
    if (bias) v = v + bias[i];
    out(i, v);
  }
}

}  // namespace

void layer_norm(const float* x, int64_t rows, int64_t dim, int64_t ldx, const float* weight, const float* bias,
                float eps, float* y, int64_t ldy, DType store) {
  MM3_CHECK(dim > 0 && ldx >= dim && ldy >= dim, "layer_norm: dim={} ldx={} ldy={}", dim, ldx, ldy);
  for (int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * ldy;
    layer_norm_row(x + r * ldx, dim, weight, bias, eps, [&](int64_t i, float v) { yr[i] = round_store(v, store); });
  }
}

void layer_norm_bf16(const float* x, int64_t rows, int64_t dim, int64_t ldx, const float* weight, const float* bias,
                     float eps, uint16_t* y, int64_t ldy) {
  MM3_CHECK(dim > 0 && ldx >= dim && ldy >= dim, "layer_norm_bf16: dim={} ldx={} ldy={}", dim, ldx, ldy);
  for (int64_t r = 0; r < rows; ++r) {
    uint16_t* yr = y + r * ldy;
    layer_norm_row(x + r * ldx, dim, weight, bias, eps, [&](int64_t i, float v) { yr[i] = f32_to_bf16_bits(v); });
  }
}

}  // namespace mm3::kern
