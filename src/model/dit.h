// dit.h — the flow-matching DiT (MODEL.md §1.5, §4.1): v = DiT(x, t, C).
//
//   z = [x | 0 | C^T] (channels), z = Conv1x1(z) + z, proj_in; the Fourier/MLP time embedding is
//   prepended as token 0; 36 pre-norm blocks (LayerNorm eps 1e-5 with bias, bidirectional MHA with
//   partial rotate_half RoPE over the first rotary_dim dims of each head, θ = 10000, positions 0..S−1
//   including the time token; gated FF with the value half first: [a | g] = ff_in(x), a ⊙ SiLU(g));
//   no final norm; proj_out on tokens 1..S−1; v = Conv1x1(v) + v.
//
// Kernels: linear, linear_bf16_in, add, layer_norm(_bf16), rope_tables, rope_apply, attention, silu, silu_mul(_bf16),
// transpose_2d.
//
// Immutable after construction (weights are zero-copy views of the checkpoint); the bf16 weight copies
// for the bf16 compute option are built once on first use (thread-safe). Per-call state lives in a
// DitWorkspace owned by the caller.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/aligned.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "kernels/kernels.h"
#include "model/config.h"

namespace mm3 {

// Per-call buffers (token-major float rows); grown on demand, fully rewritten by every forward. On
// alloc_storage (core/aligned.h): the large ones on huge pages, as the passes between the GEMMs stream them.
struct DitWorkspace {
  aligned_vector<float> z, zp;          // [B·L, Cc] concat input, after the pre conv
  aligned_vector<float> h, n;           // [B·S, D] residual stream, normed
  aligned_vector<float> qkv;            // [B·S, 3D] q | k | v
  aligned_vector<float> att, tmp;       // [B·S, D]
  aligned_vector<float> ff, act;        // [B·S, 2F], [B·S, F]
  aligned_vector<uint16_t> n16, act16;  // bf16 compute: the normed rows and the GLU as bf16 bits
  aligned_vector<float> tf, t1;         // [B, fourier], [B, D] time-embedding intermediates
  aligned_vector<float> po, pv;         // [L, C] proj_out, post conv (one batch item at a time)
  aligned_vector<float> cos, sin;       // [S, rot]
  int64_t rope_len = -1;
  DType rope_store = DType::F32;
};

// One batch item: latents x [C, L] (channel-major, torch [1, C, L]), time t, condition [L, Dc] token-major
// (torch [1, L, Dc]) or nullptr for the all-zero condition (the CFG unconditional branch).
struct DitItem {
  const float* x = nullptr;
  float t = 0;
  const float* cond = nullptr;
};

// How the DiT's block GEMMs (q | k | v, o, ff_in, ff_out: all but ~0.1% of its FLOPs) hold and run
// their weights under the fp32 compute profile. Exact: fp32 (the reference). Int8: W8A8
// (kern::gemm_only_i8: weight rows and activation rows Hadamard-rotated, then per-row weight scales and
// per-token activation scales at every call, exact int32 sums; the FF block run by kern::ff_glu_add and o by
// kern::linear_add, so the GLU and both residual adds happen row by row in cache), an opt-in that
// trades accuracy for speed; attention takes the bf16 profile's form (bf16 pair dots, bf16 probabilities and
// output) where the CPU has AVX512-BF16, else fp32's; every other op, and the small GEMMs at the ends, stay
// fp32. Where the CPU has no exact int8 GEMM (no AVX2 and FMA: without VNNI the GEMM is our own on
// 16-bit pairs, kernels.h) Int8 runs the fp32 weights and says so.
enum class DitGemm : uint8_t { Exact, Int8 };
const char* dit_gemm_name(DitGemm g);  // "exact" / "int8"

class DiT {
 public:
  // Binds transformer/*.safetensors (441 tensors at full size); throws BadModel listing every defect.
  DiT(const TensorStore& store, const DitConfig& cfg);
  ~DiT();

  const DitConfig& config() const { return cfg_; }

  // Velocity of every item: out[b] is [C, L] channel-major. `compute` F32 (reference) or BF16 (every op
  // boundary rounds to bf16, with bf16 weights, as torch's bf16 model does).
  // `gemm` Int8 needs compute F32 (InvalidInput otherwise).
  void forward(const ThreadPool& pool, const std::vector<DitItem>& items, int64_t L, const std::vector<float*>& out,
               DType compute, DitWorkspace& ws, DitGemm gemm = DitGemm::Exact) const;

  // Tensor convenience: x [B, C, L], t [B], cond [B, L, Dc] -> [B, C, L] F32.
  Tensor forward(const ThreadPool& pool, const Tensor& x, const Tensor& t, const Tensor& cond,
                 DType compute = DType::F32, DitGemm gemm = DitGemm::Exact) const;

  // Whether DitGemm::Int8 got int8 weights (false before its first forward, or on a CPU without them).
  bool int8_active() const;

  struct Weights;  // one precision's weights (dit.cpp)

  // Whether the fp32 profile holds the FF weights (ff_in, ff_out: 3/4 of its GEMM work) as one level of
  // Strassen (kern::gemm_strassen_f32), an opt-in: MM3_STRASSEN=1 in the environment when the weights
  // are packed (the first fp32 forward). Measured on 2 Zen 5 cores, the batch-2 fp32 forward 2-3%
  // faster (the products save 1/8 of the FF work, the passes that add the blocks cost ~2% of the
  // forward), for 9.7 -> 15.1 GB of packed weights at the real shapes and outputs that move ~1e-6
  // relative from the plain GEMMs'. The memory plan counts the extra bytes (pipeline/memory_plan.cpp).
  static bool fp32_strassen_requested();  // MM3_STRASSEN=1
  bool fp32_strassen() const;             // the form the packed weights took (false before the first fp32 forward)

 private:
  // The weights for `compute`, prepared at the first call (pool: its workers): F32 packs the GEMM
  // weights once (kern::gemm_only_f32), BF16 builds the bf16 copies; both from the mapped fp32.
  const Weights& weights(DType compute, const ThreadPool& pool) const;
  // DitGemm::Int8's weights, prepared at its first call from the mapped fp32.
  const Weights& int8_weights(const ThreadPool& pool) const;

  DitConfig cfg_;
  std::unique_ptr<Weights> f32_;                   // views of the file mapping
  mutable std::unique_ptr<Weights> f32_packed_;    // f32_ with the GEMM weights pre-packed
  mutable std::unique_ptr<Weights> bf16_;
  mutable std::unique_ptr<Weights> int8_;  // block GEMMs W8A8, the rest as f32_packed_
  mutable bool int8_active_ = false;       // under weights_mu_
  mutable std::mutex weights_mu_;  // guards the one-time preparations
  mutable bool strassen_used_ = false;  // under weights_mu_
};

}  // namespace mm3
