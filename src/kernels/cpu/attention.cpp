// attention.cpp — kern::attention (SDPA with GQA) and kern::softmax_rows (kernels.h), the CPU backend.
//
// Follows torch's scaled_dot_product_attention semantics as the models use it (MODEL.md §1.2 GQA +
// causal, §1.3 causal, §4.1 bidirectional): s = (q . k) * scale in fp32, max-subtracted softmax in
// fp32, out = sum_j p_j v_j accumulated in fp32 and rounded once to the store dtype. As in torch's CPU
// flash kernel, the weighted sum uses the unnormalised exp(s - max) and is scaled by 1/sum at the end.
// Query head h reads KV head h / (Hq / Hkv) (torch's repeat_interleave in repeat_kv / enable_gqa).
#pragma GCC optimize("fp-contract=off")

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"

namespace mm3::kern {

namespace {

// exp(s_j - max) in place, returning the fp32 sum (sequential, so the order is fixed).
float exp_shift_sum(float* s, int64_t n, float mx) {
  float sum = 0.f;
  for (int64_t j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] - mx);
    sum += s[j];
  }
  return sum;
}

}  // namespace

void attention(const ThreadPool& pool, const float* q, int64_t ldq, const void* k, const void* v, int64_t ldkv,
               DType kv_dtype, float* out, int64_t ldo, int64_t Sq, int64_t Skv, int Hq, int Hkv, int D, float scale,
               bool causal, int64_t q_pos0, DType store) {
  MM3_CHECK(Hq > 0 && Hkv > 0 && Hq % Hkv == 0, "attention: Hq={} not a multiple of Hkv={}", Hq, Hkv);
  MM3_CHECK(D > 0 && ldq >= int64_t(Hq) * D && ldo >= int64_t(Hq) * D && ldkv >= int64_t(Hkv) * D,
            "attention: D={} ldq={} ldkv={} ldo={} for Hq={} Hkv={}", D, ldq, ldkv, ldo, Hq, Hkv);
  MM3_CHECK(kv_dtype == DType::F32 || kv_dtype == DType::BF16, "attention: kv dtype {} unsupported",
            dtype_name(kv_dtype));
  MM3_CHECK(Skv > 0 && q_pos0 >= 0, "attention: Skv={} q_pos0={}", Skv, q_pos0);
  if (Sq <= 0) return;
  const int group = Hq / Hkv;
  const bool kb = kv_dtype == DType::BF16;
  const float* kf = static_cast<const float*>(k);
  const float* vf = static_cast<const float*>(v);
  const uint16_t* kh = static_cast<const uint16_t*>(k);
  const uint16_t* vh = static_cast<const uint16_t*>(v);

  const int64_t items = Sq * Hq;
  pool.parallel_for(
      items,
      [&](int64_t b, int64_t e) {
        std::vector<float> s(static_cast<size_t>(Skv));
        std::vector<float> acc(static_cast<size_t>(D));
        for (int64_t it = b; it < e; ++it) {
          const int64_t i = it / Hq;
          const int h = static_cast<int>(it % Hq);
          const int hk = h / group;
          const float* qr = q + i * ldq + int64_t(h) * D;
          const int64_t nk = causal ? std::min<int64_t>(Skv, q_pos0 + i + 1) : Skv;
          float mx = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j < nk; ++j) {
            const int64_t off = j * ldkv + int64_t(hk) * D;
            const float d = kb ? detail::dot_f32_bf16(qr, kh + off, D) : detail::dot_f32(qr, kf + off, D);
            s[static_cast<size_t>(j)] = d * scale;
            mx = std::max(mx, s[static_cast<size_t>(j)]);
          }
          const float sum = exp_shift_sum(s.data(), nk, mx);
          std::fill(acc.begin(), acc.end(), 0.f);
          for (int64_t j = 0; j < nk; ++j) {
            const int64_t off = j * ldkv + int64_t(hk) * D;
            if (kb)
              detail::axpy_bf16(s[static_cast<size_t>(j)], vh + off, acc.data(), D);
            else
              detail::axpy_f32(s[static_cast<size_t>(j)], vf + off, acc.data(), D);
          }
          const float inv = 1.0f / sum;
          float* o = out + i * ldo + int64_t(h) * D;
          for (int d = 0; d < D; ++d) o[d] = round_store(acc[static_cast<size_t>(d)] * inv, store);
        }
      },
      std::max<int64_t>(1, 4096 / std::max<int64_t>(1, Skv * D / 64)));
}

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
