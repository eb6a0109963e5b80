// windows.cpp — window plan, latent lengths, stitched length, prefix prompting (windows.h;
// MODEL.md §3, §4.4, §5.2). No kernels.
#include "diffusion/windows.h"

#include <algorithm>

#include "core/dtype.h"
#include "core/errors.h"

namespace mm3 {

int64_t latent_length(int64_t frames, const LatentRates& r) {
  if (frames < 0) throw InvalidInput(fmt::format("latent_length: negative frame count {}", frames));
  if (r.input_sampling_rate <= 0 || r.input_hop_length <= 0 || r.output_sampling_rate <= 0 ||
      r.output_hop_length <= 0)
    throw InvalidInput("latent_length: rates and hops must be positive");
  // Python: int(num_frames * out_sr / in_sr * in_hop / out_hop) — every operation in double, left to right.
  double v = static_cast<double>(frames) * r.output_sampling_rate;
  v = v / r.input_sampling_rate;
  v = v * r.input_hop_length;
  v = v / r.output_hop_length;
  return std::max<int64_t>(1, static_cast<int64_t>(v));  // int() truncates toward zero; v >= 0
}

std::vector<int64_t> window_starts(int64_t frames) {
  if (frames < 1) throw InvalidInput(fmt::format("acoustic stage: need at least one frame (got {})", frames));
  if (frames <= kWindowFrames) return {0};
  std::vector<int64_t> s;
  for (int64_t x = 0; x < frames - kWindowHop; x += kWindowHop) s.push_back(x);
  return s;
}

std::vector<WindowSpec> plan_windows(int64_t frames, const LatentRates& r) {
  const std::vector<int64_t> starts = window_starts(frames);
  const int n = static_cast<int>(starts.size());
  std::vector<WindowSpec> plan(static_cast<size_t>(n));
  int64_t prev_carry = 0;  // length of the previous window's carry; 0 before the first window
  for (int k = 0; k < n; ++k) {
    WindowSpec& w = plan[static_cast<size_t>(k)];
    w.index = k;
    w.start = starts[static_cast<size_t>(k)];
    w.end = std::min(w.start + kWindowFrames, frames);
    w.latents = latent_length(w.end - w.start, r);
    w.overlap = k == 0 ? 0 : std::min(prev_carry, w.latents);
    w.carry_begin = std::max<int64_t>(0, w.latents - 2 * kOverlapLatents);
    w.carry_end = std::max(w.carry_begin, w.latents - kOverlapLatents);
    prev_carry = w.carry_end - w.carry_begin;
    w.crop_left = k == 0 ? 0 : kCropLeftLatents;
    w.crop_right = k == n - 1 ? 0 : kCropRightLatents;
    if (w.kept() < 0)
      throw InternalError(fmt::format("window {} has {} latents, fewer than its crops {}+{}", k, w.latents,
                                      w.crop_left, w.crop_right));
  }
  return plan;
}

int64_t stitched_samples(int64_t frames, int64_t hop, const LatentRates& r) {
  const std::vector<int64_t> starts = window_starts(frames);
  const int64_t n = static_cast<int64_t>(starts.size());
  if (n == 1) return hop * latent_length(frames, r);
  const int64_t L_full = latent_length(kWindowFrames, r);
  const int64_t L_last = latent_length(frames - starts.back(), r);
  return hop * ((L_full - kCropRightLatents) + (n - 2) * (L_full - kCropLeftLatents - kCropRightLatents) +
                (L_last - kCropLeftLatents));
}

void prefix_prompt(float* x, int64_t C, int64_t ldx, const float* noise_prompt, int64_t ldn, const float* prev,
                   int64_t ldp, int64_t ov, float t, bool bf16) {
  const DType st = bf16 ? DType::BF16 : DType::F32;
  // (1.0 − 1e-6) is a Python float; torch multiplies it with the 0-dim time tensor in the op-math type
  // (float, also for bf16), and the product is stored in the time tensor's dtype.
  const float one_minus_sigma = static_cast<float>(1.0 - kPromptSigmaMin);
  const float a = round_store(one_minus_sigma * t, st);
  const float b = round_store(1.0f - a, st);
  for (int64_t c = 0; c < C; ++c) {
    float* xr = x + c * ldx;
    const float* nr = noise_prompt + c * ldn;
    const float* pr = prev + c * ldp;
    for (int64_t i = 0; i < ov; ++i) {
      const float u = round_store(b * nr[i], st);
      const float v = round_store(t * pr[i], st);
      xr[i] = round_store(u + v, st);
    }
  }
}

}  // namespace mm3
