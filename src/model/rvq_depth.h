// rvq_depth.h — the RVQ depth decoder ("0.6B local LLM", MODEL.md §1.3, §2.7) and the frame feedback
// embedding (§2.8).
//
// Per block (pre-norm): h = x + to_out(attn(to_q(n), to_k(n), to_v(n))), n = RMSNorm(x);
// out = h + down(silu(gate(m)) * up(m)), m = RMSNorm(h); final RMSNorm; audio_heads[j−1] gives the
// logits of codebook j. Input x = seq + pos_embedding[position] (learned absolute positions 0..7),
// heads of head_dim = hidden / heads, causal, NO RoPE, NO qk-norm, scale 1/√head_dim. The shared
// `projection` maps the LM hidden and every code embedding into the sequence.
//
// The reference recomputes the whole causal sequence (2..8 positions) for each codebook; this runs it
// incrementally with its own KvCache (batch 2, capacity 8), which is the same computation because the
// attention is causal and the positions absolute (tests/unit/models_ar_depth.cpp compares both).
//
// Quantization (issue 8, model/quant_weights.h): with QuantType::Int8 / Q4 the projection and the
// layers' Linears hold quantized blocks and the audio heads int8; the embedding tables and norms stay.
//
// Kernels: kern::linear (M = 2 rows, or 4 for the first two positions), kern::rms_norm,
// kern::attention, kern::silu_mul, kern::add, kern::embedding. Weights are immutable zero-copy views;
// DepthState is the per-request part.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "kernels/kernels.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "model/quant_weights.h"

namespace mm3 {

// Per-request state of the depth decoder: its KV cache and scratch (allocated once by make_state()).
struct DepthState {
  KvCache cache;                 // [layers, 2, B, num_codebooks, H]
  int64_t rows = 0;              // scratch capacity in rows (B * num_codebooks)
  std::vector<float> x;          // [rows, H] residual stream
  std::vector<float> hn;         // [rows, H]
  std::vector<float> q, k, v;    // [rows, H]
  std::vector<float> att;        // [rows, H]
  std::vector<float> o;          // [rows, H]
  std::vector<float> gate, up;   // [rows, I]
  // decode_frame() buffers
  std::vector<float> pin, seq;   // [B, 2, H] sequence entries before / after the projection
  std::vector<float> y;          // [B, H] final-norm output of the newest position
  std::vector<float> emb;        // [H]
  std::vector<float> logits;     // [B, audio_vocab]
  std::vector<float> guided;     // [audio_vocab]
  void reset() { cache.reset(); }
};

// Chooses code c_j (j = 1..7) from the guided row [n] the sampler sees: sampling, forcing, recording.
using DepthCodeChooser = std::function<int64_t(int j, const float* guided, int64_t n)>;

class RvqDepth {
 public:
  RvqDepth(const TensorStore& store, const DepthConfig& cfg, const QuantLoad& quant = {});
  static std::shared_ptr<const RvqDepth> load(const Checkpoint& ck, QuantType quant = QuantType::None,
                                              const ThreadPool* pool = nullptr);
  QuantType quant_type() const { return quant_; }
  // Every Linear weight with its sidecar key (projection, layers, heads).
  std::vector<std::pair<std::string, const kern::LinearWeight*>> linears() const;
  // Weight bytes of one depth step (projection + layer Linears) and of the 7 heads together.
  double step_weight_bytes() const;
  double heads_weight_bytes() const;

  const DepthConfig& config() const { return cfg_; }
  int hidden() const { return cfg_.hidden_size; }
  int codebooks() const { return cfg_.num_codebooks; }
  int64_t audio_vocab() const { return cfg_.audio_vocab_size; }

  DepthState make_state(int batch, DType precision) const;

  // out [M, H] = projection(x [M, H]) (row stride H).
  void project(const ThreadPool& pool, const float* x, int64_t M, float* out, DType precision) const;
  // out [H] = audio_embeddings[(j − 1) · 1024 + code], codebook j in 1..num_codebooks−1 (exact).
  // Throws InvalidInput for a code outside [0, audio_vocab).
  void residual_embedding(int j, int64_t code, float* out) const;

  // Appends S positions per row at positions [st.cache.length(), + S): seq [B, S, H] are the projected
  // sequence entries (pos_embedding is added here). Writes the final-norm output of the last new
  // position of each row to y [B, H].
  void step(const ThreadPool& pool, const float* seq, int B, int64_t S, DepthState& st, float* y,
            DType precision) const;

  // logits [B, audio_vocab] of codebook j (1..num_codebooks−1) from y [B, H]: audio_heads[j−1](y),
  // rounded to `precision` (torch's `.float()` of a bf16 head).
  void head_logits(const ThreadPool& pool, int j, const float* y, int64_t B, float* logits, DType precision) const;

  // The depth procedure of one frame (§2.7) for the two CFG rows: h [2, H] the LM hiddens (cond,
  // uncond), codes[0] = c0 (set by the caller). For j = 1..7: y_j = the newest position's output,
  // guided = unc + (cond − unc)·cfg of audio_heads[j−1](y_j) (fp32, no pre-mask), codes[j] =
  // choose(j, guided, 1024) (same code for both rows), then P(A(c_j + (j−1)·1024)) is appended (not for
  // the last codebook). d_rows [7, H] (may be null) receives row 0 (cond) of each y_j. Resets st first.
  void decode_frame(const ThreadPool& pool, const Tensor& lm_embed, const float* h, float cfg, DepthState& st,
                    const DepthCodeChooser& choose, int64_t* codes, float* d_rows, DType precision) const;

 private:
  struct Layer {
    std::vector<float> input_norm, post_norm;  // [H]
    kern::LinearWeight q, k, v, o;             // [H, H] each
    kern::LinearWeight gate, up, down;         // [I, H], [I, H], [H, I]
  };
  DepthConfig cfg_;
  QuantType quant_ = QuantType::None;
  Tensor audio_embeddings_;            // [(num_codebooks−1)·1024, H]
  Tensor pos_embedding_;               // [max_position_embeddings, H]
  std::vector<float> pos_f32_;         // the same, as floats (exact)
  kern::LinearWeight projection_;      // [H, H]
  std::vector<Layer> layers_;
  std::vector<float> final_norm_;      // [H]
  std::vector<kern::LinearWeight> heads_;  // num_codebooks−1 of [1024, H]
};

// The frame feedback embedding (§2.8), the same row for both CFG rows:
//   e = (E_LM(c0 + 151675) + Σ_{j=1..7} A(c_j + (j−1)·1024)) · num_codebooks^−½
// In the BF16 profile torch adds the seven residual embeddings in one reduction (fp32 accumulation,
// one bf16 rounding), adds the c0 row (bf16 rounding) and scales by the fp32 scalar (bf16 rounding);
// checked bit-exact against depth_bf16's feedback_embed. codes = [c0, c1, ..., c7]; out [H];
// scratch [2, H].
void frame_feedback_embedding(const Tensor& lm_embed, const RvqDepth& depth, const int64_t* codes, float* out,
                              float* scratch, DType precision);

}  // namespace mm3
