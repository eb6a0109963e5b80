// acoustic_stage.h — frame hiddens -> stereo audio (MODEL.md §3, §4.2–§4.5, §5): per 200-frame window
// (hop 100) the condition encoder, the splice of the previous window's condition, per-window noise,
// N Euler steps of CFG flow matching (batch-2 DiT forward: condition | all-zero condition) with overlap
// prefix prompting at every step (σ_min 1e-6), the restore after the last step and the carry of
// [L−344, L−172); then every window is vocoded, cropped (86 latents left unless first, 258 right unless
// last), concatenated and clamped to [−1, 1].
//
// Kernels: none directly (the models' forwards); the solver comes from diffusion/scheduler.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/progress.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "diffusion/windows.h"
#include "model/condition_encoder.h"
#include "model/dit.h"
#include "model/vocoder.h"

namespace mm3 {

// The three acoustic components (not owned; loaded elsewhere, immutable, shareable across requests).
struct AcousticModels {
  const ConditionEncoder* condition = nullptr;
  const DiT* dit = nullptr;
  const Vocoder* vocoder = nullptr;
};

struct AcousticParams {
  int steps = 30;              // Euler steps per window (MODEL.md §4.2)
  double cfg = 1.7;            // v = v_u + cfg·(v_c − v_u), v_u from the all-zero condition (§4.3)
  uint64_t seed = 0;           // request seed; window k's noise seed = derive_seed(seed, "dit", k) (§4.5)
  std::vector<Tensor> noise;   // optional injected initial noise, one [1, C, L_k] (or [C, L_k]) per window;
                               // empty: drawn from the engine's Philox stream (diffusion/noise.h)
  DType precision = DType::F32;  // DiT + vocoder compute: F32 (reference profile) or BF16
  DitGemm dit_gemm = DitGemm::Exact;  // Int8: the DiT's block GEMMs W8A8 (model/dit.h; needs precision F32)
  std::string solver = "euler";  // diffusion/scheduler.h registry name
  bool decode_audio = true;      // false: stop after the latents (no vocoder)
};

struct AcousticResult {
  std::vector<WindowSpec> windows;  // the plan
  std::vector<Tensor> latents;      // per window [1, C, L_k] F32, uncropped, after the overlap restore
  Tensor audio;                     // [2, S] F32 in [−1, 1], S = stitched_samples(T) (empty if !decode_audio)
  int sample_rate = 44100;
  double seconds_condition = 0, seconds_dit = 0, seconds_vocoder = 0;
};

// frame_hiddens: [T, layers·H] or [1, T, layers·H], any float dtype (bf16 frame hiddens are cast to fp32,
// MODEL.md §1.8). Progress: stage "dit" (unit "steps", one event per step, detail "window k/n") and
// stage "vocoder" (unit "windows"). Cancellation is checked before every step and every window decode
// (throws mm3::Cancelled). Throws InvalidInput for bad shapes / params.
AcousticResult run_acoustic(const AcousticModels& models, const Tensor& frame_hiddens, const AcousticParams& p,
                            const ThreadPool& pool, const RunControl& ctl = {});

// Crop-and-concat of per-window waveforms ([2, hop·L_k] each, channel-major) by the plan, then clamp to
// [−1, 1] (MODEL.md §5.2). Returns [2, S].
Tensor stitch_windows(const std::vector<Tensor>& waves, const std::vector<WindowSpec>& plan, int64_t hop);

}  // namespace mm3
