// sampler.h — the official seeded AR sampler (MODEL.md §2.4–2.6; SGLang-Omni's multinomial_with_seed):
// CFG combine, the c0 cond-top-k pre-mask, nan_to_num + top-k, and argmax(v + Gumbel) with the Gumbel
// noise drawn from murmur3_32(seed, position, column) in float64. No kernels; scalar code (16385
// columns per draw at most).
//
// Everything here is bit-exact given the same fp32 logits: the guided row is computed in fp32 in the
// reference's operation order, the draw in float64.
#pragma once

#include <cstdint>
#include <vector>

namespace mm3 {

// murmur3 x86_32 over the four 32-bit words (s & 0xFFFFFFFF, s >> 32, position, column), seed 0.
uint32_t murmur3_32(uint64_t s, uint32_t position, uint32_t column);

// Gumbel noise of one column: u = h / (2^32 − 1); a = clamp(log u, −DBL_MAX, −2^−32); G = −log(−a).
double seeded_gumbel(uint64_t s, uint32_t position, uint32_t column);

// guided[i] = unc[i] + (cond[i] − unc[i]) · scale, in fp32 (torch's `unc + (cond - unc) * 1.5`).
void cfg_combine(const float* cond, const float* unc, float scale, float* guided, int64_t n);

// Per-request sampler state: the scratch of the k-th-largest selection, allocated once (the AR hot
// loop must not allocate per step).
class SeededSampler {
 public:
  // `s` is the sampling seed (ar_sampling_seed(request seed)); `max_cols` the widest row (16385).
  SeededSampler(uint64_t s, int64_t max_cols, int top_k = 50);
  uint64_t seed() const { return s_; }
  int top_k() const { return k_; }

  // The k-th largest value of x[0..n) (duplicates counted, like torch.topk(x, k).values[-1]); k is
  // clamped to n.
  float kth_largest(const float* x, int64_t n, int k);

  // c0 pre-mask (§2.4): guided[i] = −inf wherever cond[i] < (k-th largest of cond).
  void cond_top_k_mask(const float* cond, float* guided, int64_t n, int k);

  // The draw (§2.6): v = nan_to_num(guided, nan=−1e9, ±inf=±1e9); thr = k-th largest of v; columns
  // with v < thr are out; returns argmax over the rest of (double)v + G(s, position, column), the first
  // column on a tie.
  int64_t sample(const float* guided, int64_t n, uint32_t position);

 private:
  uint64_t s_;
  int k_;
  std::vector<float> v_, scratch_;
};

}  // namespace mm3
