// sampler.cpp — seeded top-k Gumbel sampler and CFG combine (MODEL.md §2.4–2.6).
// Exact torch op order: no fused multiply-add contraction (GCC contracts by default).
#pragma GCC optimize("fp-contract=off")

#include "sampling/sampler.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>

#include "core/errors.h"

namespace mm3 {

namespace {
inline uint32_t rotl32(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }
}  // namespace

uint32_t murmur3_32(uint64_t s, uint32_t position, uint32_t column) {
  const uint32_t words[4] = {static_cast<uint32_t>(s & 0xFFFFFFFFull), static_cast<uint32_t>(s >> 32), position,
                             column};
  uint32_t h = 0;
  for (uint32_t k : words) {
    k *= 0xcc9e2d51u;
    k = rotl32(k, 15);
    k *= 0x1b873593u;
    h ^= k;
    h = rotl32(h, 13);
    h = h * 5u + 0xe6546b64u;
  }
  h ^= 16u;  // total length in bytes
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

double seeded_gumbel(uint64_t s, uint32_t position, uint32_t column) {
  const double u = static_cast<double>(murmur3_32(s, position, column)) / 4294967295.0;
  double a = std::log(u);                // -inf when u == 0
  a = std::max(a, -DBL_MAX);             // clamp min
  a = std::min(a, -std::ldexp(1.0, -32));  // clamp max (u == 1 would give log 0 = -0 -> G = -inf)
  return -std::log(-a);
}

void cfg_combine(const float* cond, const float* unc, float scale, float* guided, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    // Three fp32 ops, each rounded (no fused multiply-add): sub, mul, add.
    volatile float d = cond[i] - unc[i];
    volatile float m = d * scale;
    guided[i] = unc[i] + m;
  }
}

SeededSampler::SeededSampler(uint64_t s, int64_t max_cols, int top_k) : s_(s), k_(top_k) {
  if (top_k < 1) throw InvalidInput(fmt::format("sampler: top_k must be >= 1, got {}", top_k));
  v_.resize(static_cast<size_t>(max_cols));
  scratch_.resize(static_cast<size_t>(max_cols));
}

float SeededSampler::kth_largest(const float* x, int64_t n, int k) {
  MM3_CHECK(n > 0 && n <= static_cast<int64_t>(scratch_.size()), "row of {} columns, sampler sized for {}", n,
            scratch_.size());
  const int64_t kk = std::min<int64_t>(k, n);
  std::copy(x, x + n, scratch_.begin());
  // Descending order: the (kk-1)-th element is the k-th largest. NaN must not reach here.
  std::nth_element(scratch_.begin(), scratch_.begin() + (kk - 1), scratch_.begin() + n, std::greater<float>());
  return scratch_[static_cast<size_t>(kk - 1)];
}

void SeededSampler::cond_top_k_mask(const float* cond, float* guided, int64_t n, int k) {
  // cond holds finite logits (the narrowed columns are all allowed), so no NaN reaches the selection.
  const float thr = kth_largest(cond, n, k);
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i)
    if (cond[i] < thr) guided[i] = ninf;
}

int64_t SeededSampler::sample(const float* guided, int64_t n, uint32_t position) {
  MM3_CHECK(n > 0 && n <= static_cast<int64_t>(v_.size()), "row of {} columns, sampler sized for {}", n, v_.size());
  for (int64_t i = 0; i < n; ++i) {
    const float g = guided[i];
    v_[i] = std::isnan(g) ? -1e9f : (std::isinf(g) ? (g > 0 ? 1e9f : -1e9f) : g);
  }
  const float thr = kth_largest(v_.data(), n, k_);
  int64_t best = -1;
  double best_val = 0;
  for (int64_t c = 0; c < n; ++c) {
    if (v_[c] < thr) continue;
    const double val = static_cast<double>(v_[c]) + seeded_gumbel(s_, position, static_cast<uint32_t>(c));
    if (best < 0 || val > best_val) {
      best = c;
      best_val = val;
    }
  }
  return best;
}

}  // namespace mm3
