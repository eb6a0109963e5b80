// condition_encoder.h — the condition mix (MODEL.md §1.4, §3): softmax-weighted sum of the 8 frame-hidden
// layers, a learned scalar scale, Conv1d(H -> out_dim, k=3, p=1) and nearest resampling from the frame rate
// to the latent rate. It runs once per window (§4.4), so the conv's zero padding sits at window edges.
// Kernels: conv1d, transpose_2d, interpolate_nearest.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "diffusion/windows.h"
#include "io/safetensors.h"
#include "model/config.h"

namespace mm3 {

class ConditionEncoder {
 public:
  // Binds condition_encoder/*.safetensors (4 tensors; throws BadModel on any defect or unused tensor).
  ConditionEncoder(const TensorStore& store, const ConditionConfig& cfg);

  const ConditionConfig& config() const { return cfg_; }
  LatentRates rates() const;
  // L = max(1, int(T · out_sr / in_sr · in_hop / out_hop)).
  int64_t latent_length(int64_t frames) const;

  // frames: [T, layers · H] float (one window's rows, row stride ld >= layers · H; F32 values).
  // Returns [L, out_dim] F32 (token-major, i.e. torch's [1, L, out_dim] without the batch dim).
  // Always fp32, the checkpoint dtype (MODEL.md §1.8); a bf16 DiT rounds the result itself.
  Tensor forward(const ThreadPool& pool, const float* frames, int64_t T, int64_t ld) const;
  // Convenience: [T, layers·H] or [1, T, layers·H] of any float dtype -> [1, L, out_dim].
  Tensor forward(const ThreadPool& pool, const Tensor& frame_hiddens) const;

 private:
  ConditionConfig cfg_;
  std::vector<float> layer_weights_;  // [layers] softmax(layer_weight_logits), fp32
  float layer_scale_ = 1.0f;          // [1]
  Tensor proj_w_;                     // [out_dim, H, 3] F32
  Tensor proj_b_;                     // [out_dim] F32
};

}  // namespace mm3
