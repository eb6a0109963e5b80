// qwen3_lm.h — the global language model: transformers' Qwen3ForCausalLM as MiniMax-Music3 runs it
// (MODEL.md §1.2, §2.4, §2.9). Entry by inputs_embeds (the AR loop feeds frame embeddings, not token
// ids), both CFG rows [cond, uncond] in one batch, a KvCache, and a head that computes only the 16385
// sampleable rows of lm_head: the end token 151670 and the codes 151675..168058.
//
// Per layer (pre-norm): h = x + o_proj(attn(rope(q_norm(q)), rope(k_norm(k)), v)) over RMSNorm(x);
// out = h + down(silu(gate(n)) * up(n)), n = RMSNorm(h); final model.norm. qk-norm is an RMSNorm over
// head_dim per head, before RoPE; RoPE is rotate_half over all of head_dim with θ from the config;
// GQA (query head h reads KV head h / (Hq / Hkv)); scale 1/√head_dim; causal.
//
// Kernels: kern::embedding, kern::rms_norm, kern::linear (M = 2 in decode: both rows share one read of
// each weight), kern::rope_apply, kern::attention (bf16 or fp32 KV), kern::silu_mul, kern::add.
// RoPE tables are built here, not by kern::rope_tables, because of a reference quirk (see
// lm_rope_tables below).
//
// Quantization (issue 8, model/quant_weights.h): loaded with QuantType::Int8 or Q4, every layer Linear
// holds quantized blocks (kernels/quant.h) and the 16385 head rows int8; embed_tokens and the norms
// are unchanged. QuantType::None (the default) is the bf16 model exactly as before.
//
// Weights are immutable zero-copy views of the checkpoint (bf16 for the real one; never copied whole);
// everything per request (KV cache, scratch) lives in the caller's objects. Precision is a parameter:
// DType::BF16 rounds at every torch op boundary (the reference profile), DType::F32 never rounds (the
// fp32 goldens ran the checkpoint upcast to fp32).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/aligned.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "kernels/kernels.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "model/quant_weights.h"

namespace mm3 {

// Vocabulary facts of the music LM (MODEL.md §1.2, §1.7).
inline constexpr int64_t kAudioEndToken = 151670;   // <|audio_end|>
inline constexpr int64_t kAudioCodeOffset = 151675; // c0 = id − 151675
inline constexpr int64_t kNumSemanticCodes = 16384;
inline constexpr int64_t kSampleableColumns = 1 + kNumSemanticCodes;  // [end, code 0, ..., code 16383]

// RoPE cos/sin tables [n_pos, head_dim] as the reference computes them. The reference's `inv_freq` is a
// floating-point buffer that follows the module's dtype casts: the LM was cast to bf16 (and, for the
// fp32 goldens, back up to fp32), so inv_freq holds bf16-rounded values in both profiles. Measured on
// lm_fp32: with fp32 inv_freq prefill_hidden is off by rel_rms 6.3e-6 growing with position (the
// bound is 1e-5); with bf16-rounded inv_freq the difference is 2.8e-8. So: inv_freq_i =
// bf16(1 / θ^(2i/D)) (fp32 arithmetic), freqs = pos · inv_freq (fp32), cos/sin in fp32, then rounded
// to `store`; cat(freqs, freqs) layout like kern::rope_tables.
void lm_rope_tables(const int64_t* positions, int64_t n_pos, int head_dim, double theta, float* cos, float* sin,
                    DType store);

// Per-request scratch of Qwen3Lm::forward, sized for `rows` = batch × chunk tokens. Allocated by
// reserve(); forward() never allocates once it is large enough. On alloc_storage (core/aligned.h): a
// prefill chunk's large buffers on huge pages.
struct LmScratch {
  int64_t rows = 0, chunk = 0;
  aligned_vector<float> x;         // [rows, H] residual stream
  aligned_vector<float> hn;        // [rows, H] normed input of attention / MLP
  aligned_vector<float> q;         // [rows, Hq*D]
  aligned_vector<float> k, v;      // [rows, Hkv*D]
  aligned_vector<float> att;       // [rows, Hq*D] attention output
  aligned_vector<float> o;         // [rows, H] o_proj / down_proj output
  aligned_vector<float> gate, up;  // [rows, I]
  aligned_vector<float> cos, sin;  // [chunk, D]
  std::vector<int64_t> pos;        // [chunk]
  void reserve(const LmConfig& c, int64_t rows, int64_t chunk);
};

class Qwen3Lm {
 public:
  // Tokens per row processed together in forward(); a longer input (the prompt prefill) is split into
  // chunks, which bounds the scratch (the real prompt may have 5000 tokens). Exact: rows of a linear
  // are independent and attention sees the same keys either way.
  static constexpr int64_t kChunk = 256;

  // Binds every tensor of `store` by key and shape (WeightBinder, finish()): throws BadModel naming
  // missing / misshapen / unused tensors.
  // With quant.type != None the Linear weights are quantized (quant_weights.h: from quant.sidecar, or
  // quantized here from the bf16 tensors, which are still bound and shape-checked).
  Qwen3Lm(const TensorStore& store, const LmConfig& cfg, const QuantLoad& quant = {});
  // quant: the Linear weights' type; the checkpoint's mm3-quant sidecar is used when it has one.
  static std::shared_ptr<const Qwen3Lm> load(const Checkpoint& ck, QuantType quant = QuantType::None,
                                             const ThreadPool* pool = nullptr);
  QuantType quant_type() const { return quant_; }
  // Every Linear weight with its sidecar key (layers, then the two head row slices), for `mm3 quantize`
  // and byte counts.
  std::vector<std::pair<std::string, const kern::LinearWeight*>> linears() const;
  // Weight bytes one decode step streams: all layer Linears + the 16385 head rows.
  double decode_weight_bytes() const;

  const LmConfig& config() const { return cfg_; }
  int hidden() const { return cfg_.hidden_size; }

  // A cache for `batch` rows of `capacity` positions, in the dtype `precision` needs.
  KvCache make_cache(int batch, int64_t capacity, DType precision) const;
  // Scratch large enough for forward() over `batch` rows with any S.
  LmScratch make_scratch(int batch) const;

  // out[i, :] = embed_tokens[ids[i]] (exact). Throws InvalidInput for an id outside the vocabulary.
  void embed(const int64_t* ids, int64_t n, float* out, int64_t ldo) const;
  const Tensor& embed_table() const { return embed_; }  // [V, H]

  // Runs S new tokens per row through the model at positions [cache.length(), cache.length() + S) and
  // appends their k/v to the cache. x: [B, S, H] input embeddings (bf16-valued in the BF16 profile).
  // out: [B, S, H] final-norm hidden states when all_positions, else [B, H] of the last position only.
  void forward(const ThreadPool& pool, const float* x, int B, int64_t S, KvCache& cache, LmScratch& scr, float* out,
               bool all_positions, DType precision) const;

  // The sampleable logits of hidden rows h [B, H] (row stride ldh): out [B, 16385] with column 0 the
  // end token and column 1 + c code c, as torch's `lm_head(h).float()` gives them (bf16 matmul, fp32
  // accumulation, rounded to `precision`).
  void sampleable_logits(const ThreadPool& pool, const float* h, int64_t B, int64_t ldh, float* out,
                         DType precision) const;

 private:
  struct Layer {
    std::vector<float> input_norm;     // [H]
    std::vector<float> post_norm;      // [H]
    std::vector<float> q_norm, k_norm; // [D]
    kern::LinearWeight q, k, v, o;     // [Hq*D, H], [Hkv*D, H], [Hkv*D, H], [H, Hq*D]
    kern::LinearWeight gate, up, down; // [I, H], [I, H], [H, I]
  };
  LmConfig cfg_;
  QuantType quant_ = QuantType::None;
  Tensor embed_;                      // [V, H] model.embed_tokens.weight (zero-copy)
  std::vector<Layer> layers_;
  std::vector<float> final_norm_;     // [H]
  kern::LinearWeight head_end_;       // [1, H]     lm_head rows [151670, 151671)
  kern::LinearWeight head_codes_;     // [16384, H] lm_head rows [151675, 168059)
};

}  // namespace mm3
