// rope.cpp — kern::rope_tables and kern::rope_apply (kernels.h), the CPU backend.
//
// Tables follow transformers' default RoPE (`_compute_default_rope_parameters` + the rotary
// embedding forward; MODEL.md §1.2 and §4.1 step 6):
//   inv_freq = 1.0 / (theta ** (arange(0, dim, 2).float() / dim))   all fp32
//   freqs = pos * inv_freq (fp32; the K=1 matmul is one rounded product), emb = cat(freqs, freqs)
//   cos = emb.cos(), sin = emb.sin() in fp32, then cast to the activation dtype.
// theta ** e and cos/sin are evaluated in double and rounded once to fp32 (correctly rounded).
// torch's vectorised SLEEF versions are within 1 ulp of that, not always equal: measured with
// torch 1.13 here, 1 of the 64 inv_freq values for dim 128 / theta 1e6 (index 37: 1e6^0.578125 =
// 2942.72718 lies 1.4% of an ulp above a float midpoint; torch returns the lower neighbour) and ~6%
// of fp32 cos/sin values differ by 1 ulp; after a bf16 cast only ~1e-5 of the values differ. The
// index-37 phase error grows with the position (~1e-6 rad at 10k), far below any golden tolerance.
// rope_apply is rotate_half RoPE: r * cos + rotate_half(r) * sin, three torch ops (two products and
// a sum), each rounded to the store dtype.
#pragma GCC optimize("fp-contract=off")

#include <cmath>
#include <vector>

#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"

namespace mm3::kern {

void rope_tables(const int64_t* positions, int64_t n_pos, int rot_dim, double theta, float* cos, float* sin,
                 DType store) {
  MM3_CHECK(rot_dim > 0 && rot_dim % 2 == 0, "rope_tables: rot_dim {} must be even and positive", rot_dim);
  const int half = rot_dim / 2;
  const float base = static_cast<float>(theta);
  std::vector<float> inv(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(rot_dim);
    const float p = static_cast<float>(std::pow(static_cast<double>(base), static_cast<double>(e)));
    inv[static_cast<size_t>(i)] = 1.0f / p;
  }
  for (int64_t s = 0; s < n_pos; ++s) {
    const float pos = static_cast<float>(positions[s]);
    float* c = cos + s * rot_dim;
    float* sn = sin + s * rot_dim;
    for (int i = 0; i < half; ++i) {
      const double f = static_cast<double>(pos * inv[static_cast<size_t>(i)]);
      const float cv = round_store(static_cast<float>(std::cos(f)), store);
      const float sv = round_store(static_cast<float>(std::sin(f)), store);
      c[i] = c[i + half] = cv;
      sn[i] = sn[i + half] = sv;
    }
  }
}

void rope_apply(float* x, int64_t S, int H, int head_dim, int64_t ld, const float* cos, const float* sin,
                int rot_dim, DType store) {
  MM3_CHECK(rot_dim > 0 && rot_dim % 2 == 0 && rot_dim <= head_dim && ld >= int64_t(H) * head_dim,
            "rope_apply: rot_dim={} head_dim={} H={} ld={}", rot_dim, head_dim, H, ld);
  const int half = rot_dim / 2;
  const bool bf = store == DType::BF16;
  for (int64_t s = 0; s < S; ++s) {
    const float* c = cos + s * rot_dim;
    const float* sn = sin + s * rot_dim;
    for (int h = 0; h < H; ++h) {
      float* r = x + s * ld + int64_t(h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const float a = r[i], b = r[i + half];
        // out[i] = a*cos[i] + (-b)*sin[i]; out[i+half] = b*cos[i+half] + a*sin[i+half]
        float p1 = a * c[i], p2 = -b * sn[i];
        float q1 = b * c[i + half], q2 = a * sn[i + half];
        if (bf) {
          r[i] = round_bf16(round_bf16(p1) + round_bf16(p2));
          r[i + half] = round_bf16(round_bf16(q1) + round_bf16(q2));
        } else {
          r[i] = p1 + p2;
          r[i + half] = q1 + q2;
        }
      }
    }
  }
}

}  // namespace mm3::kern
