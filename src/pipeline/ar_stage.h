// ar_stage.h — the autoregressive stage (MODEL.md §2.3–2.8): prefill of the [cond, uncond] prompt rows,
// then per AR step: sampleable LM logits → CFG → c0 cond-top-50 pre-mask → seeded top-k draw → depth
// decoder (c1..c7, each CFG-guided and drawn the same way, no pre-mask) → frame feedback embedding →
// one LM decode step (batch 2, one read of the weights). Frame 0 is sampled and fed back but never
// emitted; emitted frame k uses the LM hidden computed after feeding frame k−1.
//
// Kernels: through Qwen3Lm and RvqDepth (kern::linear / rms_norm / attention / ...); sampling is
// sampling/sampler.h. All per-request buffers are allocated before the first step; the loop itself
// allocates nothing. Progress is reported per emitted frame and cancellation checked between steps.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/progress.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "model/qwen3_lm.h"
#include "model/rvq_depth.h"

namespace mm3 {

inline constexpr double kArFrameRate = 25.0;    // 24000 / 960 (§2.3)
inline constexpr int64_t kArMaxFrames = 9000;   // the reference's hard cap (§2.3)

// The frame budget of a requested duration: min(int(duration · 25), 9000) (int truncates). Throws
// InvalidInput when duration is not a finite number > 0, or when it gives 0 frames (< 0.04 s).
int64_t frame_budget(double duration_seconds);

struct ArModels {
  const Qwen3Lm* lm = nullptr;
  const RvqDepth* depth = nullptr;
};

struct ArParams {
  uint64_t seed = 0;              // request seed; the sampler uses ar_sampling_seed(seed) (§2.6)
  int64_t max_frames = 1500;      // frame budget, 1..9000 (frame_budget(duration))
  double cfg = 1.5;               // AR CFG scale, for c0 and c1..c7
  int top_k = 50;                 // sampling top-k
  int c0_cond_top_k = 50;         // the c0 pre-mask: cond's top-k
  DType precision = DType::BF16;  // BF16 = reference profile; F32 = debugging (fp32 of the bf16 model)
  // Teacher forcing / replay: [F + 1, 8] int64 codes fed back at each AR step instead of sampling (row 0
  // = the non-emitted frame 0). A row with c0 = −1 means the end token: generation stops there (it must
  // be the last row). Guided rows are still computed (and recorded when asked).
  std::optional<Tensor> forced_codes;
  int64_t record_guided_steps = 0;  // record the guided rows of the first N AR steps (0: none)
};

struct ArResult {
  // [steps, 8] int64: the codes fed back at each AR step, row 0 the non-emitted frame 0. When the end
  // token stopped generation, a last row of −1 marks it (the golden `codes` convention). Without a
  // stop, steps = frames + 1.
  Tensor codes;
  Tensor frame_hiddens;  // [T, 8·H] F32 (bf16 values in the BF16 profile): h_LM ‖ d1 ‖ … ‖ d7 (cond row)
  int64_t frames = 0;    // T, emitted frames (≥ 1)
  bool stopped_on_end = false;
  int64_t prompt_tokens = 0;
  // Recorded guided rows (record_guided_steps > 0), in call order: c0 rows over [end, code 0..16383]
  // with −inf where the pre-mask removed a column; 7 depth rows over 1024 codes per step.
  Tensor c0_guided;      // [min(N, steps), 16385] F32
  Tensor depth_guided;   // [7 · (steps recorded that drew depth codes), 1024] F32
  double seconds_prefill = 0, seconds_total = 0;
  double ms_per_frame() const { return frames > 0 ? 1000.0 * (seconds_total - seconds_prefill) / frames : 0.0; }
};

// Runs the AR stage. cond_ids / uncond_ids: the two prompt rows (§2.1, §2.2), equal lengths. Throws
// InvalidInput for bad ids / params / forced codes and when zero frames are generated (the first
// sample, or the first emitted one, is <|audio_end|>); Cancelled when ctl asks.
ArResult run_ar(const ArModels& models, const std::vector<int64_t>& cond_ids, const std::vector<int64_t>& uncond_ids,
                const ArParams& p, const ThreadPool& pool, const RunControl& ctl);

}  // namespace mm3
