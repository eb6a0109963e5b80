// windows.h — the acoustic stage's window plan and length arithmetic (MODEL.md §3 step 6, §4.4, §5.2).
//
// The AR frames are flow-matched in windows of 200 frames with a hop of 100; window k > 0 is prompted
// with the previous window's latents [L−344, L−172) over its first `overlap` latents, and after vocoding
// every window but the first drops 86 latents on the left and every window but the last 258 on the
// right. No kernels: pure index math plus the per-step prefix-prompt blend.
#pragma once

#include <cstdint>
#include <vector>

namespace mm3 {

inline constexpr int64_t kWindowFrames = 200;       // _CHUNK_FRAMES
inline constexpr int64_t kWindowHop = 100;          // _CHUNK_HOP
inline constexpr int64_t kOverlapLatents = 172;     // _OVERLAP_LATENT_LENGTH (= 344 / 2)
inline constexpr int64_t kCropLeftLatents = 86;     // _CROP_LEFT_LATENT (= 344 / 4)
inline constexpr int64_t kCropRightLatents = 258;   // _CROP_RIGHT_LATENT (= 344 − 86)
inline constexpr double kPromptSigmaMin = 1e-6;     // σ_min of the prefix-prompt straight line

// Frame rate -> latent rate conversion of the condition encoder (MODEL.md §3 step 6), evaluated exactly
// as the reference: max(1, int(T * out_rate / in_rate * in_hop / out_hop)) in double, left to right.
struct LatentRates {
  int input_sampling_rate = 24000, input_hop_length = 960;
  int output_sampling_rate = 44100, output_hop_length = 512;
};
int64_t latent_length(int64_t frames, const LatentRates& r = {});

// Window k of a T-frame song.
struct WindowSpec {
  int index = 0;
  int64_t start = 0, end = 0;   // frames [start, end)
  int64_t latents = 0;          // L_k = latent_length(end − start)
  int64_t overlap = 0;          // latents prompted from the previous window's carry (0 for k = 0)
  int64_t carry_begin = 0, carry_end = 0;  // [a, b) of this window's latents/condition carried forward
  int64_t crop_left = 0, crop_right = 0;   // latents dropped when stitching (× hop samples)
  int64_t kept() const { return latents - crop_left - crop_right; }
};

// starts = [0] if T <= 200 else range(0, T − 100, 100). Throws InvalidInput for T < 1.
std::vector<int64_t> window_starts(int64_t frames);
std::vector<WindowSpec> plan_windows(int64_t frames, const LatentRates& r = {});

// Samples per channel of the stitched output (MODEL.md §5.2):
//   T <= 200: hop·L_0;  else hop·[(L_0 − 258) + Σ_{0<k<n−1} (L_k − 344) + (L_last − 86)].
// Evaluated in closed form from the plan's lengths (every non-final window is full length).
int64_t stitched_samples(int64_t frames, int64_t hop = 512, const LatentRates& r = {});

// Prefix prompting at flow time t over the first `ov` latents of each channel row (MODEL.md §4.4 step 4):
//   x[c, :ov] = (1 − (1 − σ_min)·t)·noise_prompt[c, :ov] + t·prev[c, :ov]
// x: [C, L] (row stride ldx), noise_prompt / prev: [C, ov_stride] rows (strides ldn / ldp). fp32, with
// torch's op order and rounding: a = f32(0.999999)·t; b = 1 − a; x = b·n + t·p (each rounded to fp32,
// then to `bf16` if set).
void prefix_prompt(float* x, int64_t C, int64_t ldx, const float* noise_prompt, int64_t ldn, const float* prev,
                   int64_t ldp, int64_t ov, float t, bool bf16 = false);

}  // namespace mm3
