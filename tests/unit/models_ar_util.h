// models_ar_util.h — tiny synthetic language models / depth decoders for the AR tests (issue 4), built
// in memory with the real tensor names and written with write_safetensors into a temp dir, so the
// binding path (WeightBinder by key and shape) is the production one. The vocabulary is the real one's
// minimum (the audio codes need ids up to 168058); every other dim is tiny.
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "io/safetensors.h"
#include "model/config.h"
#include "model/qwen3_lm.h"
#include "model/rvq_depth.h"

namespace mm3::artest {

class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / ("mm3_ar_test_" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string sub(const std::string& name) const {
    std::filesystem::create_directories(path_ / name);
    return (path_ / name).string();
  }

 private:
  std::filesystem::path path_;
};

inline LmConfig tiny_lm_config() {
  LmConfig c;
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.vocab_size = 168064;
  c.max_position_embeddings = 10240;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1e6;
  c.dtype = "bfloat16";
  return c;
}

inline DepthConfig tiny_depth_config() {
  DepthConfig c;
  c.hidden_size = 16;
  c.num_layers = 2;
  c.num_attention_heads = 2;
  c.intermediate_size = 24;
  c.audio_vocab_size = 1024;
  c.num_codebooks = 8;
  c.max_position_embeddings = 16;
  return c;
}

// Fills a tensor of `shape` with f(i) rounded to bf16 (stored BF16).
inline Tensor bf16_tensor(const Shape& shape, const std::function<float(int64_t)>& f) {
  Tensor t = Tensor::empty(DType::BF16, shape);
  uint16_t* p = static_cast<uint16_t*>(t.raw());
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = f32_to_bf16_bits(f(i));
  return t;
}

// Deterministic pseudo-random values in [-scale, scale].
inline std::function<float(int64_t)> rnd(uint64_t key, float scale) {
  return [key, scale](int64_t i) {
    uint64_t z = key * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i) * 0xBF58476D1CE4E5B9ull + 0x94D049BB133111EBull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return scale * (static_cast<float>(z >> 40) / static_cast<float>(1 << 24) * 2.f - 1.f);
  };
}
inline std::function<float(int64_t)> constant(float v) {
  return [v](int64_t) { return v; };
}

using Named = std::vector<std::pair<std::string, Tensor>>;

// Every LM tensor under its checkpoint name. `make(name, shape)` supplies the values.
inline Named lm_tensors(const LmConfig& c, const std::function<Tensor(const std::string&, const Shape&)>& make) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int64_t QW = int64_t(c.num_attention_heads) * D, KW = int64_t(c.num_key_value_heads) * D;
  Named t;
  auto add = [&](const std::string& n, Shape s) { t.emplace_back(n, make(n, s)); };
  add("model.embed_tokens.weight", {c.vocab_size, H});
  add("model.norm.weight", {H});
  add("lm_head.weight", {c.vocab_size, H});
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {H});
    add(p + "post_attention_layernorm.weight", {H});
    add(p + "self_attn.q_proj.weight", {QW, H});
    add(p + "self_attn.k_proj.weight", {KW, H});
    add(p + "self_attn.v_proj.weight", {KW, H});
    add(p + "self_attn.o_proj.weight", {H, QW});
    add(p + "self_attn.q_norm.weight", {D});
    add(p + "self_attn.k_norm.weight", {D});
    add(p + "mlp.gate_proj.weight", {I, H});
    add(p + "mlp.up_proj.weight", {I, H});
    add(p + "mlp.down_proj.weight", {H, I});
  }
  return t;
}

inline Named depth_tensors(const DepthConfig& c, const std::function<Tensor(const std::string&, const Shape&)>& make) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  Named t;
  auto add = [&](const std::string& n, Shape s) { t.emplace_back(n, make(n, s)); };
  add("audio_embeddings.weight", {int64_t(c.num_codebooks - 1) * c.audio_vocab_size, H});
  add("projection.weight", {H, H});
  add("pos_embedding.weight", {c.max_position_embeddings, H});
  add("norm.weight", {H});
  for (int j = 0; j < c.num_codebooks - 1; ++j) add("audio_heads." + std::to_string(j) + ".weight", {c.audio_vocab_size, H});
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {H});
    add(p + "post_attention_layernorm.weight", {H});
    for (const char* w : {"attn.to_q.weight", "attn.to_k.weight", "attn.to_v.weight", "attn.to_out.weight"})
      add(p + w, {H, H});
    add(p + "gate_proj.weight", {I, H});
    add(p + "up_proj.weight", {I, H});
    add(p + "down_proj.weight", {H, I});
  }
  return t;
}

inline bool is_norm(const std::string& n) { return n.find("norm") != std::string::npos; }

// Random weights: norms around 1, matrices and embeddings in [-0.5, 0.5].
inline std::function<Tensor(const std::string&, const Shape&)> random_maker(uint64_t seed) {
  return [seed](const std::string& n, const Shape& s) {
    const uint64_t key = seed ^ std::hash<std::string>{}(n);
    if (is_norm(n)) return bf16_tensor(s, [f = rnd(key, 0.25f)](int64_t i) { return 1.f + f(i); });
    return bf16_tensor(s, rnd(key, 0.5f));
  };
}

// A loaded tiny model pair; the files live as long as the object.
struct TinyModels {
  TempDir dir;
  LmConfig lm_cfg = tiny_lm_config();
  DepthConfig depth_cfg = tiny_depth_config();
  std::unique_ptr<TensorStore> lm_store, depth_store;
  std::unique_ptr<Qwen3Lm> lm;
  std::unique_ptr<RvqDepth> depth;

  TinyModels(const Named& lm_t, const Named& depth_t) {
    const std::string ld = dir.sub("language_model"), dd = dir.sub("rvq_depth_decoder");
    write_safetensors(ld + "/model.safetensors", lm_t);
    write_safetensors(dd + "/diffusion_pytorch_model.safetensors", depth_t);
    lm_store = std::make_unique<TensorStore>(TensorStore::open_dir(ld));
    depth_store = std::make_unique<TensorStore>(TensorStore::open_dir(dd));
    lm = std::make_unique<Qwen3Lm>(*lm_store, lm_cfg);
    depth = std::make_unique<RvqDepth>(*depth_store, depth_cfg);
  }
  static std::unique_ptr<TinyModels> random(uint64_t seed) {
    const LmConfig lc = tiny_lm_config();
    const DepthConfig dc = tiny_depth_config();
    return std::make_unique<TinyModels>(lm_tensors(lc, random_maker(seed)), depth_tensors(dc, random_maker(seed + 1)));
  }
};

// The golden checkpoint next to the repository, or "" when absent.
inline std::string golden_dir() {
  const std::string d = MM3_GOLDEN_DIR;
  return std::filesystem::exists(d + "/manifest.json") ? d : std::string();
}

}  // namespace mm3::artest
