// vocoder.h — the Flow-VAE decoder ("DAV", a DAC decoder; MODEL.md §1.6, §5.1): latents [C, L] ->
// stereo waveform [2, hop·L] at 44.1 kHz.
//
//   stereo fold (channels [0, C/2) left, [C/2, C) right, decoded as two mono streams); dec_in_proj 1×1;
//   WN-conv_in k7; 4 blocks of Snake, WN-ConvTranspose1d(k 2s, stride s, pad ⌈s/2⌉), three residual units
//   (Snake, WN-conv k7 dilation d ∈ {1, 3, 9}, Snake, WN-conv k1, + x); Snake, WN-conv_out k7; tanh.
//   Weight norm is folded at load (WeightBinder::get_weight_norm, dim 0: per output channel for Conv1d
//   V [out, in, k], per input channel for ConvTranspose1d V [in, out, k]).
//
// Kernels: conv_packed (Snake and the residual add fused into the convolutions), tanh_inplace.
//
// Immutable after construction; convolution weights are packed once here (kern::ConvWeight); bf16
// weight copies for the bf16 compute option are built on first use.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "model/config.h"

namespace mm3 {

// Wall time of each layer of one decode, both stereo streams summed (mm3 bench --stage
// vocoder_L689_layers). flops: 2 per multiply-add of the convolution; elements: values an elementwise
// op writes (0 for convolutions); cpu_seconds: the process's CPU time over the layer (all threads), which
// a machine shared with other work does not inflate the way it inflates wall time.
struct VocoderLayerTime {
  std::string name;  // checkpoint prefix of the layer(s), e.g. "blocks.1.res_unit2.snake1+conv1"
  std::string op;    // conv1d, conv_transpose1d, tanh, fold
  double flops = 0, elements = 0, seconds = 0, cpu_seconds = 0;
};
using VocoderProfile = std::vector<VocoderLayerTime>;

// Activation buffers Vocoder::decode reuses from call to call (per-request state: one per concurrent
// caller, e.g. one for all the windows of a request). Fresh buffers cost page faults and the kernel's
// zeroing of every page on each call: ~0.4 s of an 8 s bf16 window on a 2-core Zen 4 VM.
class VocoderWorkspace {
 public:
  VocoderWorkspace();
  ~VocoderWorkspace();
  VocoderWorkspace(const VocoderWorkspace&) = delete;
  VocoderWorkspace& operator=(const VocoderWorkspace&) = delete;
  // Floats each of its buffers holds now (0 before the first decode).
  int64_t capacity() const;
  struct Buffers;  // vocoder.cpp

 private:
  friend class Vocoder;
  std::unique_ptr<Buffers> b_;
};

class Vocoder {
 public:
  // Binds vocoder/*.safetensors (121 tensors at full size); throws BadModel listing every defect.
  Vocoder(const TensorStore& store, const VocoderConfig& cfg);
  ~Vocoder();

  const VocoderConfig& config() const { return cfg_; }
  int64_t hop() const { return hop_; }  // samples per latent (512)
  // Checkpoint tensors that hold NaN/inf (loaded as-is, like torch; they make the output non-finite).
  // Callers report these: a non-finite waveform then names its cause.
  const std::vector<std::string>& nonfinite_tensors() const { return nonfinite_; }
  // Floating-point operations of decode(L): 2 per multiply-add of every convolution, both streams.
  double flops(int64_t L) const;
  // The multiply-adds decode(L, F32) actually runs (x 2): the 7-tap layers in their Winograd form
  // (kernels.h conv_winograd) count kern::kWinogradProductShare of theirs, the upsampling convs in
  // theirs (conv_winograd_t) kern::kWinogradTProductShare (transforms not counted).
  double flops_executed(int64_t L) const;

  // latents: [C, L] channel-major F32 values (torch [1, C, L]); wave: [2, hop·L] (row stride ldw >= hop·L).
  // compute F32 (reference) or BF16 (rounds at every op boundary, bf16-rounded weights).
  // profile: when non-null, receives one entry per layer (in forward order), times summed over streams.
  // ws: buffers kept across calls (null: this call allocates its own).
  void decode(const ThreadPool& pool, const float* latents, int64_t L, float* wave, int64_t ldw,
              DType compute = DType::F32, VocoderProfile* profile = nullptr, VocoderWorkspace* ws = nullptr) const;
  // Tensor convenience: [1, C, L] or [C, L] -> [1, 2, hop·L] F32.
  Tensor decode(const ThreadPool& pool, const Tensor& latents, DType compute = DType::F32) const;

  struct Weights;  // one precision's weights (vocoder.cpp)

 private:
  const Weights& weights(DType compute) const;

  VocoderConfig cfg_;
  int64_t hop_ = 0;
  std::vector<std::string> nonfinite_;
  std::unique_ptr<Weights> f32_;
  mutable std::unique_ptr<Weights> bf16_;
  mutable std::once_flag bf16_once_;
};

}  // namespace mm3
