// synth_checkpoint.cpp — random-weight checkpoints in the real MiniMax-Music3 layout (see the header;
// MODEL.md §1.1–1.7 for names, shapes and dtypes; golden/v1/checkpoint for configs and file format).
#include "model/synth_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <set>

#include "core/errors.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"

namespace mm3::synth {

namespace fs = std::filesystem;
using nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Values
// ---------------------------------------------------------------------------------------------

namespace {

constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;

inline uint64_t mix64(uint64_t z) {  // splitmix64's output function
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline float value_from_bits(const Init& init, uint64_t r) {
  switch (init.kind) {
    case InitKind::normal: {
      // Irwin–Hall: four 16-bit uniforms; each has variance (65536^2 - 1) / 12.
      const uint32_t s = static_cast<uint32_t>(r & 0xFFFF) + static_cast<uint32_t>((r >> 16) & 0xFFFF) +
                         static_cast<uint32_t>((r >> 32) & 0xFFFF) + static_cast<uint32_t>(r >> 48);
      constexpr float kInvSd = 1.0f / 37837.2273f;  // 1 / sqrt(4 * (65536^2 - 1) / 12)
      return init.a + init.b * ((static_cast<float>(s) - 131070.0f) * kInvSd);
    }
    case InitKind::uniform:
      return init.a + (init.b - init.a) * (static_cast<float>(r >> 40) * (1.0f / 16777216.0f));
    case InitKind::constant: break;
  }
  return init.a;
}

inline uint64_t bits_at(uint64_t key, int64_t i) { return mix64(key + static_cast<uint64_t>(i + 1) * kGamma); }

}  // namespace

uint64_t tensor_key(uint64_t seed, std::string_view component, std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over "component/name"
  auto eat = [&](std::string_view s) {
    for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  };
  eat(component);
  eat("/");
  eat(name);
  return mix64(mix64(seed + kGamma) ^ h);
}

float value_at(const Init& init, uint64_t key, int64_t i) { return value_from_bits(init, bits_at(key, i)); }

void fill(const ThreadPool& pool, const Init& init, uint64_t key, int64_t first, int64_t n, DType dtype, void* out) {
  if (dtype != DType::F32 && dtype != DType::BF16)
    throw InvalidInput(fmt::format("synth fill: dtype {} is not supported (F32 or BF16)", dtype_name(dtype)));
  pool.parallel_for(
      n,
      [&](int64_t b, int64_t e) {
        if (dtype == DType::F32) {
          float* o = static_cast<float*>(out);
          if (init.kind == InitKind::constant) {
            std::fill(o + b, o + e, init.a);
            return;
          }
          for (int64_t i = b; i < e; ++i) o[i] = value_from_bits(init, bits_at(key, first + i));
        } else {
          uint16_t* o = static_cast<uint16_t*>(out);
          if (init.kind == InitKind::constant) {
            std::fill(o + b, o + e, f32_to_bf16_bits(init.a));
            return;
          }
          for (int64_t i = b; i < e; ++i) o[i] = f32_to_bf16_bits(value_from_bits(init, bits_at(key, first + i)));
        }
      },
      1 << 16);
}

// ---------------------------------------------------------------------------------------------
// Dims
// ---------------------------------------------------------------------------------------------

SynthDims SynthDims::tiny() {
  SynthDims d;
  d.size_name = "tiny";
  d.repo_id = "tiny-random/minimax-music3-public";  // as in the golden modular_model_index.json
  d.lm_hidden = 64, d.lm_inter = 128, d.lm_layers = 2, d.lm_heads = 4, d.lm_kv_heads = 2, d.lm_head_dim = 16;
  d.vocab = 168100;
  d.depth_layers = 2, d.depth_heads = 4, d.depth_inter = 96;
  d.cond_out = 32;
  d.dit_in = 16, d.dit_layers = 2, d.dit_heads = 4, d.dit_head_dim = 8, d.dit_ff = 64, d.dit_rot = 4;
  d.dit_fourier = 16;
  d.voc_dec_in = 24, d.voc_hidden = 32;
  d.max_shard_bytes = 6'000'000;  // manifest "shard": "6MB"
  return d;
}

SynthDims SynthDims::full() {
  SynthDims d;
  d.size_name = "full";
  d.repo_id = "mm3-synth/minimax-music3-random-full";
  d.lm_hidden = 4096, d.lm_inter = 12288, d.lm_layers = 36, d.lm_heads = 32, d.lm_kv_heads = 8, d.lm_head_dim = 128;
  d.vocab = 200000;
  d.depth_layers = 4, d.depth_heads = 16, d.depth_inter = 6144;
  d.cond_out = 2048;
  d.dit_in = 128, d.dit_layers = 36, d.dit_heads = 32, d.dit_head_dim = 64, d.dit_ff = 8192, d.dit_rot = 32;
  d.dit_fourier = 256;
  d.voc_dec_in = 1024, d.voc_hidden = 1536;
  d.max_shard_bytes = 5'000'000'000ull;  // "5GB": reproduces the real shard sizes exactly
  return d;
}

// ---------------------------------------------------------------------------------------------
// Plan
// ---------------------------------------------------------------------------------------------

uint64_t PlannedComponent::data_bytes() const {
  uint64_t b = 0;
  for (const auto& f : files) b += f.data_bytes;
  return b;
}

int64_t PlannedComponent::params() const {
  int64_t p = 0;
  for (const auto& t : tensors) p += t.numel();
  return p;
}

uint64_t SynthPlan::weight_file_bytes() const {
  uint64_t b = 0;
  for (const auto& c : components)
    for (const auto& f : c.files) b += f.file_bytes();
  return b;
}

std::vector<std::vector<size_t>> split_shards(const std::vector<uint64_t>& sizes, uint64_t max_shard_bytes) {
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> cur;
  uint64_t cur_bytes = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] > max_shard_bytes) {  // too big for any shard: a shard of its own, placed now
      shards.push_back({i});
      continue;
    }
    if (cur_bytes + sizes[i] > max_shard_bytes) {
      shards.push_back(std::move(cur));
      cur = {};
      cur_bytes = 0;
    }
    cur.push_back(i);
    cur_bytes += sizes[i];
  }
  if (!cur.empty()) shards.push_back(std::move(cur));
  return shards;
}

namespace {

std::string shape_json(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) r += ',';
    r += std::to_string(s[i]);
  }
  r += ']';
  return r;
}

// Python safetensors' header for the tensors of one file (all of one dtype), name-sorted.
void finish_file(const PlannedComponent& c, PlannedFile& f) {
  std::sort(f.tensors.begin(), f.tensors.end(),
            [&](size_t a, size_t b) { return c.tensors[a].name < c.tensors[b].name; });
  const size_t es = dtype_size(c.dtype);
  std::string h = "{\"__metadata__\":{\"format\":\"pt\"}";
  uint64_t off = 0;
  f.offsets.clear();
  for (size_t idx : f.tensors) {
    const PlannedTensor& t = c.tensors[idx];
    const uint64_t n = static_cast<uint64_t>(t.numel()) * es;
    f.offsets.push_back(off);
    h += fmt::format(",\"{}\":{{\"dtype\":\"{}\",\"shape\":{},\"data_offsets\":[{},{}]}}", t.name, dtype_name(c.dtype),
                     shape_json(t.shape), off, off + n);
    off += n;
  }
  h += "}";
  while (h.size() % 8) h += ' ';
  f.header = std::move(h);
  f.data_bytes = off;
}

// Shards the component (hub algorithm) and builds headers, file names and the index.
void shard_component(PlannedComponent& c, const std::string& stem, uint64_t max_shard_bytes,
                     bool index_has_total_parameters) {
  std::vector<uint64_t> sizes;
  for (const auto& t : c.tensors) sizes.push_back(static_cast<uint64_t>(t.numel()) * dtype_size(c.dtype));
  auto groups = split_shards(sizes, max_shard_bytes);
  const size_t n = groups.size();
  c.files.clear();
  for (size_t i = 0; i < n; ++i) {
    PlannedFile f;
    f.name = n == 1 ? stem + ".safetensors" : fmt::format("{}-{:05d}-of-{:05d}.safetensors", stem, i + 1, n);
    f.tensors = groups[i];
    finish_file(c, f);
    c.files.push_back(std::move(f));
  }
  c.index_name.clear();
  c.index = json();
  if (n > 1) {
    c.index_name = stem + ".safetensors.index.json";
    json wm = json::object();
    for (const auto& f : c.files)
      for (size_t idx : f.tensors) wm[c.tensors[idx].name] = f.name;
    json meta = json::object();
    if (index_has_total_parameters) meta["total_parameters"] = c.params();
    meta["total_size"] = c.data_bytes();
    c.index = json{{"metadata", meta}, {"weight_map", wm}};
  }
}

json index_entry(const std::string& library, const std::string& cls, const std::string& repo,
                 const std::string& sub) {
  return json::array({library, cls,
                      json{{"pretrained_model_name_or_path", repo},
                           {"revision", nullptr},
                           {"subfolder", sub},
                           {"type_hint", json::array({library, cls})},
                           {"variant", nullptr}}});
}

constexpr const char* kDiffusersVersion = "0.40.0.dev0";
constexpr const char* kTransformersVersion = "5.12.1";

PlannedComponent plan_lm(const SynthDims& d) {
  PlannedComponent c;
  c.name = "language_model";
  c.dtype = DType::BF16;
  const Init lin = Init::normal(0.f, 0.02f), one = Init::constant(1.f);
  const int64_t H = d.lm_hidden, q = int64_t(d.lm_heads) * d.lm_head_dim, kv = int64_t(d.lm_kv_heads) * d.lm_head_dim;
  auto add = [&](std::string n, Shape s, Init i) { c.tensors.push_back({std::move(n), std::move(s), i}); };
  // Qwen3ForCausalLM state-dict order (MODEL.md §1.2).
  add("model.embed_tokens.weight", {d.vocab, H}, lin);
  for (int i = 0; i < d.lm_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    add(p + "self_attn.q_proj.weight", {q, H}, lin);
    add(p + "self_attn.k_proj.weight", {kv, H}, lin);
    add(p + "self_attn.v_proj.weight", {kv, H}, lin);
    add(p + "self_attn.o_proj.weight", {H, q}, lin);
    add(p + "self_attn.q_norm.weight", {d.lm_head_dim}, one);
    add(p + "self_attn.k_norm.weight", {d.lm_head_dim}, one);
    add(p + "mlp.gate_proj.weight", {d.lm_inter, H}, lin);
    add(p + "mlp.up_proj.weight", {d.lm_inter, H}, lin);
    add(p + "mlp.down_proj.weight", {H, d.lm_inter}, lin);
    add(p + "input_layernorm.weight", {H}, one);
    add(p + "post_attention_layernorm.weight", {H}, one);
  }
  add("model.norm.weight", {H}, one);
  add("lm_head.weight", {d.vocab, H}, lin);
  shard_component(c, "model", d.max_shard_bytes, /*index_has_total_parameters=*/true);

  json layer_types = json::array();
  for (int i = 0; i < d.lm_layers; ++i) layer_types.push_back("full_attention");
  json cfg = {{"architectures", json::array({"Qwen3ForCausalLM"})},
              {"attention_bias", false},
              {"attention_dropout", 0.0},
              {"bos_token_id", nullptr},
              {"dtype", "bfloat16"},
              {"eos_token_id", nullptr},
              {"head_dim", d.lm_head_dim},
              {"hidden_act", "silu"},
              {"hidden_size", d.lm_hidden},
              {"initializer_range", 0.02},
              {"intermediate_size", d.lm_inter},
              {"layer_types", layer_types},
              {"max_position_embeddings", 10240},
              {"max_window_layers", 28},  // transformers' Qwen3Config default, as in the golden; unused
              {"model_type", "qwen3"},
              {"num_attention_heads", d.lm_heads},
              {"num_hidden_layers", d.lm_layers},
              {"num_key_value_heads", d.lm_kv_heads},
              {"pad_token_id", nullptr},
              {"rms_norm_eps", 1e-06},
              {"rope_parameters", {{"rope_theta", 1000000.0}, {"rope_type", "default"}}},
              {"sliding_window", nullptr},
              {"tie_word_embeddings", false},
              {"transformers_version", kTransformersVersion},
              {"use_cache", true},
              {"use_sliding_window", false},
              {"vocab_size", d.vocab}};
  json gen = {{"_from_model_config", true},
              {"output_attentions", false},
              {"output_hidden_states", false},
              {"transformers_version", kTransformersVersion},
              {"use_cache", true}};
  c.json_files = {{"config.json", cfg}, {"generation_config.json", gen}};
  return c;
}

PlannedComponent plan_depth(const SynthDims& d) {
  PlannedComponent c;
  c.name = "rvq_depth_decoder";
  c.dtype = DType::BF16;
  const Init lin = Init::normal(0.f, 0.02f), one = Init::constant(1.f);
  const int64_t H = d.lm_hidden;
  auto add = [&](std::string n, Shape s, Init i) { c.tensors.push_back({std::move(n), std::move(s), i}); };
  // MODEL.md §1.3; module order of MiniMaxMusic3RVQDepthDecoder (one file at both sizes, so the order
  // does not reach the disk).
  add("audio_embeddings.weight", {int64_t(d.audio_vocab) * (d.codebooks - 1), H}, lin);
  add("projection.weight", {H, H}, lin);
  add("pos_embedding.weight", {d.depth_max_pos, H}, lin);
  for (int i = 0; i < d.depth_layers; ++i) {
    const std::string p = fmt::format("layers.{}.", i);
    add(p + "input_layernorm.weight", {H}, one);
    add(p + "attn.to_q.weight", {H, H}, lin);
    add(p + "attn.to_k.weight", {H, H}, lin);
    add(p + "attn.to_v.weight", {H, H}, lin);
    add(p + "attn.to_out.weight", {H, H}, lin);
    add(p + "post_attention_layernorm.weight", {H}, one);
    add(p + "gate_proj.weight", {d.depth_inter, H}, lin);
    add(p + "up_proj.weight", {d.depth_inter, H}, lin);
    add(p + "down_proj.weight", {H, d.depth_inter}, lin);
  }
  add("norm.weight", {H}, one);
  for (int j = 0; j < d.codebooks - 1; ++j) add(fmt::format("audio_heads.{}.weight", j), {d.audio_vocab, H}, lin);
  shard_component(c, "diffusion_pytorch_model", d.max_shard_bytes, false);
  json cfg = {{"_class_name", "MiniMaxMusic3RVQDepthDecoder"},
              {"_diffusers_version", kDiffusersVersion},
              {"audio_vocab_size", d.audio_vocab},
              {"hidden_size", d.lm_hidden},
              {"intermediate_size", d.depth_inter},
              {"max_position_embeddings", d.depth_max_pos},
              {"num_attention_heads", d.depth_heads},
              {"num_codebooks", d.codebooks},
              {"num_layers", d.depth_layers}};
  c.json_files = {{"config.json", cfg}};
  return c;
}

PlannedComponent plan_condition(const SynthDims& d) {
  PlannedComponent c;
  c.name = "condition_encoder";
  c.dtype = DType::F32;
  auto add = [&](std::string n, Shape s, Init i) { c.tensors.push_back({std::move(n), std::move(s), i}); };
  // MODEL.md §1.4: softmax weights over the 8 condition layers, a scale, a k=3 Conv1d.
  add("layer_weight_logits", {d.codebooks}, Init::normal(0.f, 0.5f));
  add("layer_scale", {1}, Init::constant(1.f));
  add("proj.weight", {d.cond_out, d.lm_hidden, 3}, Init::normal(0.f, 0.02f));
  add("proj.bias", {d.cond_out}, Init::normal(0.f, 0.02f));
  shard_component(c, "diffusion_pytorch_model", d.max_shard_bytes, false);
  json cfg = {{"_class_name", "MiniMaxMusic3ConditionEncoder"},
              {"_diffusers_version", kDiffusersVersion},
              {"condition_hidden_dim", d.lm_hidden},
              {"input_hop_length", 960},
              {"input_sampling_rate", 24000},
              {"num_condition_layers", d.codebooks},
              {"out_dim", d.cond_out},
              {"output_hop_length", 512},
              {"output_sampling_rate", 44100}};
  c.json_files = {{"config.json", cfg}};
  return c;
}

PlannedComponent plan_transformer(const SynthDims& d) {
  PlannedComponent c;
  c.name = "transformer";
  c.dtype = DType::F32;
  const Init lin = Init::normal(0.f, 0.02f), one = Init::constant(1.f);
  const int64_t D = int64_t(d.dit_heads) * d.dit_head_dim, C = 2 * int64_t(d.dit_in) + d.cond_out;
  auto add = [&](std::string n, Shape s, Init i) { c.tensors.push_back({std::move(n), std::move(s), i}); };
  // MODEL.md §1.5, in MiniMaxMusic3Transformer1DModel's registration order (this order decides which
  // tensors land in which of the real checkpoint's two shards).
  add("time_proj.weight", {d.dit_fourier / 2, 1}, Init::normal(0.f, 1.f));  // Fourier frequencies, randn
  add("time_embed.linear_1.weight", {D, d.dit_fourier}, lin);
  add("time_embed.linear_1.bias", {D}, lin);
  add("time_embed.linear_2.weight", {D, D}, lin);
  add("time_embed.linear_2.bias", {D}, lin);
  add("preprocess_conv.weight", {C, C, 1}, lin);
  add("proj_in.weight", {D, C}, lin);
  for (int i = 0; i < d.dit_layers; ++i) {
    const std::string p = fmt::format("transformer_blocks.{}.", i);
    add(p + "norm1.weight", {D}, one);
    add(p + "norm1.bias", {D}, lin);
    add(p + "attn.to_q.weight", {D, D}, lin);
    add(p + "attn.to_k.weight", {D, D}, lin);
    add(p + "attn.to_v.weight", {D, D}, lin);
    add(p + "attn.to_out.0.weight", {D, D}, lin);
    add(p + "norm2.weight", {D}, one);
    add(p + "norm2.bias", {D}, lin);
    add(p + "ff_in.weight", {2 * int64_t(d.dit_ff), D}, lin);
    add(p + "ff_in.bias", {2 * int64_t(d.dit_ff)}, lin);
    add(p + "ff_out.weight", {D, d.dit_ff}, lin);
    add(p + "ff_out.bias", {D}, lin);
  }
  add("proj_out.weight", {d.dit_in, D}, lin);
  add("postprocess_conv.weight", {d.dit_in, d.dit_in, 1}, lin);
  shard_component(c, "diffusion_pytorch_model", d.max_shard_bytes, false);
  json cfg = {{"_class_name", "MiniMaxMusic3Transformer1DModel"},
              {"_diffusers_version", kDiffusersVersion},
              {"attention_head_dim", d.dit_head_dim},
              {"condition_dim", d.cond_out},
              {"ff_inner_dim", d.dit_ff},
              {"fourier_embedding_dim", d.dit_fourier},
              {"in_channels", d.dit_in},
              {"num_attention_heads", d.dit_heads},
              {"num_layers", d.dit_layers},
              {"rotary_dim", d.dit_rot}};
  c.json_files = {{"config.json", cfg}};
  return c;
}

PlannedComponent plan_vocoder(const SynthDims& d) {
  PlannedComponent c;
  c.name = "vocoder";
  c.dtype = DType::F32;
  const Init alpha = Init::uniform(0.5f, 1.5f), bias = Init::normal(0.f, 0.01f);
  auto add = [&](std::string n, Shape s, Init i) { c.tensors.push_back({std::move(n), std::move(s), i}); };
  // A weight-normed conv: V ~ N(0, 1) (its scale cancels in the fold) and g = the row norm the folded
  // weight should have, `gain` / sqrt(fan_in) per element, i.e. gain * sqrt(rest / fan_in) per row.
  auto wn = [&](const std::string& p, Shape v, double fan_in, double gain) {
    const double rest = static_cast<double>(shape_numel(v) / v[0]);
    const float g = static_cast<float>(gain * std::sqrt(rest / fan_in));
    add(p + ".weight_g", {v[0], 1, 1}, Init::normal(g, 0.05f * g));
    add(p + ".weight_v", std::move(v), Init::normal(0.f, 1.f));
  };
  // MODEL.md §1.6. dec_in_proj is a plain Conv1d over half the latent channels.
  const int64_t half = d.dit_in / 2;
  add("dec_in_proj.weight", {d.voc_dec_in, half, 1}, Init::normal(0.f, static_cast<float>(1.0 / std::sqrt(half))));
  add("dec_in_proj.bias", {d.voc_dec_in}, bias);
  wn("conv_in", {d.voc_hidden, d.voc_dec_in, 7}, 7.0 * d.voc_dec_in, 1.0);
  add("conv_in.bias", {d.voc_hidden}, bias);
  int64_t ch = d.voc_hidden;
  for (size_t b = 0; b < d.voc_ratios.size(); ++b) {
    const int64_t out = ch / 2, s = d.voc_ratios[b];
    const std::string p = fmt::format("blocks.{}.", b);
    add(p + "snake1.alpha", {1, ch, 1}, alpha);
    // ConvTranspose1d V is [in, out, 2s]; each output sample sees in * 2s / s = 2 * in taps.
    wn(p + "conv_t1", {ch, out, 2 * s}, 2.0 * ch, 1.0);
    add(p + "conv_t1.bias", {out}, bias);
    for (int u = 1; u <= 3; ++u) {
      const std::string r = p + fmt::format("res_unit{}.", u);
      add(r + "snake1.alpha", {1, out, 1}, alpha);
      wn(r + "conv1", {out, out, 7}, 7.0 * out, 1.0);
      add(r + "conv1.bias", {out}, bias);
      add(r + "snake2.alpha", {1, out, 1}, alpha);
      // The residual branch's last conv is damped so 12 residual units do not blow the scale up.
      wn(r + "conv2", {out, out, 1}, 1.0 * out, 0.3);
      add(r + "conv2.bias", {out}, bias);
    }
    ch = out;
  }
  add("snake_out.alpha", {1, ch, 1}, alpha);
  wn("conv_out", {1, ch, 7}, 7.0 * ch, 1.0);
  add("conv_out.bias", {1}, bias);
  shard_component(c, "diffusion_pytorch_model", d.max_shard_bytes, false);
  json ratios = json::array();
  for (int r : d.voc_ratios) ratios.push_back(r);
  json cfg = {{"_class_name", "MiniMaxMusic3Vocoder"},
              {"_diffusers_version", kDiffusersVersion},
              {"decoder_hidden_dim", d.voc_hidden},
              {"decoder_input_dim", d.voc_dec_in},
              {"latent_channels", d.dit_in},
              {"sampling_rate", 44100},
              {"upsampling_ratios", ratios}};
  c.json_files = {{"config.json", cfg}};
  return c;
}

}  // namespace

SynthPlan make_plan(const SynthDims& d, uint64_t seed) {
  if (d.lm_hidden <= 0 || d.vocab < 151675 + 16384 || d.max_shard_bytes == 0)
    throw InvalidInput("synth-checkpoint: dims are not set (vocab must hold the code ids, shard size > 0)");
  SynthPlan p;
  p.dims = d;
  p.seed = seed;
  p.components = {plan_lm(d), plan_depth(d), plan_condition(d), plan_transformer(d), plan_vocoder(d)};
  json sched = {{"_class_name", "FlowMatchEulerDiscreteScheduler"},
                {"_diffusers_version", kDiffusersVersion},
                {"base_image_seq_len", 256},
                {"base_shift", 0.5},
                {"invert_sigmas", true},
                {"max_image_seq_len", 4096},
                {"max_shift", 1.15},
                {"num_train_timesteps", 1},
                {"shift", 1.0},
                {"shift_terminal", nullptr},
                {"stochastic_sampling", false},
                {"time_shift_type", "exponential"},
                {"use_beta_sigmas", false},
                {"use_dynamic_shifting", false},
                {"use_exponential_sigmas", false},
                {"use_karras_sigmas", false}};
  json index = {{"_blocks_class_name", "MiniMaxMusic3Blocks"},
                {"_class_name", "MiniMaxMusic3ModularPipeline"},
                {"_diffusers_version", kDiffusersVersion},
                {"condition_encoder", index_entry("diffusers", "MiniMaxMusic3ConditionEncoder", d.repo_id,
                                                  "condition_encoder")},
                {"language_model", index_entry("transformers", "Qwen3ForCausalLM", d.repo_id, "language_model")},
                {"rvq_depth_decoder", index_entry("diffusers", "MiniMaxMusic3RVQDepthDecoder", d.repo_id,
                                                  "rvq_depth_decoder")},
                {"scheduler", index_entry("diffusers", "FlowMatchEulerDiscreteScheduler", d.repo_id, "scheduler")},
                {"tokenizer", index_entry("transformers", "Qwen2Tokenizer", d.repo_id, "tokenizer")},
                {"transformer", index_entry("diffusers", "MiniMaxMusic3Transformer1DModel", d.repo_id, "transformer")},
                {"vocoder", index_entry("diffusers", "MiniMaxMusic3Vocoder", d.repo_id, "vocoder")}};
  // The model index stays last: write_checkpoint writes root_json in order.
  p.root_json = {{"scheduler/scheduler_config.json", sched}, {"modular_model_index.json", index}};
  return p;
}

// ---------------------------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------------------------

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Progress {
  bool on = true;
  uint64_t total = 0, done = 0;
  Clock::time_point t0 = Clock::now(), last = Clock::now();
  void add(uint64_t n, const std::string& what, bool force_line = false) {
    done += n;
    if (!on) return;
    const auto now = Clock::now();
    if (!force_line && std::chrono::duration<double>(now - last).count() < 2.0) return;
    last = now;
    const double s = seconds_since(t0);
    std::fprintf(stderr, "synth-checkpoint: %7.2f / %.2f GB (%3.0f%%)  %6.0f MB/s  %5.0f s  %s\n", done / 1e9,
                 total / 1e9, total ? 100.0 * done / total : 100.0, s > 0 ? done / s / 1e6 : 0.0, s, what.c_str());
  }
};

// Streams one file through two alternating buffers: the main thread fills one (in parallel over the
// pool) while a background task writes the other with pwrite, waits for it to reach the disk
// (sync_file_range) and drops it from the page cache, so neither our memory nor the kernel's dirty
// pages grow with the model size, and the MB/s printed is the disk's.
// The two chunk buffers, allocated once per checkpoint and left uninitialised (every byte handed to
// pwrite was generated first).
struct ChunkBuffers {
  explicit ChunkBuffers(size_t n) : size(n) {
    for (auto& b : buf) b.reset(new unsigned char[n]);
  }
  size_t size;
  std::array<std::unique_ptr<unsigned char[]>, 2> buf;
};

class StreamFile {
 public:
  StreamFile(std::string path, ChunkBuffers& bufs) : path_(std::move(path)), partial_(path_ + ".partial"), bufs_(bufs) {
    fd_ = ::open(partial_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw InvalidInput(fmt::format("cannot create {}: {}", partial_, std::strerror(errno)));
  }
  ~StreamFile() {
    if (pending_.valid()) {
      try {
        pending_.get();
      } catch (...) {
      }
    }
    if (fd_ >= 0) {
      ::close(fd_);
      std::error_code ec;
      fs::remove(partial_, ec);  // never leave a half-written .partial behind
    }
  }
  StreamFile(const StreamFile&) = delete;
  StreamFile& operator=(const StreamFile&) = delete;

  // Space left in the current buffer (flushes a full one first).
  size_t space() {
    if (fill_ == bufs_.size) flush();
    return bufs_.size - fill_;
  }
  unsigned char* ptr() { return bufs_.buf[cur_].get() + fill_; }
  void commit(size_t n) { fill_ += n; }
  void put(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    while (n) {
      size_t k = std::min(n, space());
      std::memcpy(ptr(), p, k);
      commit(k);
      p += k, n -= k;
    }
  }
  // Writes what is left, syncs, closes and renames the .partial into place.
  void finish() {
    flush();
    if (pending_.valid()) pending_.get();
    if (::fdatasync(fd_) != 0) throw InvalidInput(fmt::format("fdatasync {}: {}", partial_, std::strerror(errno)));
    if (::close(fd_) != 0) {
      fd_ = -1;
      throw InvalidInput(fmt::format("close {}: {}", partial_, std::strerror(errno)));
    }
    fd_ = -1;
    fs::rename(partial_, path_);
  }
  uint64_t bytes() const { return offset_ + fill_; }

 private:
  void flush() {
    if (fill_ == 0) return;
    if (pending_.valid()) pending_.get();  // the other buffer is free again (rethrows a write error)
    const unsigned char* data = bufs_.buf[cur_].get();
    const size_t n = fill_;
    const uint64_t off = offset_;
    pending_ = std::async(std::launch::async, [this, data, n, off] { write_out(data, n, off); });
    offset_ += n;
    cur_ ^= 1;
    fill_ = 0;
  }
  void write_out(const unsigned char* data, size_t n, uint64_t off) const {
    size_t done = 0;
    while (done < n) {
      ssize_t w = ::pwrite(fd_, data + done, n - done, static_cast<off_t>(off + done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0)
        throw InvalidInput(fmt::format("write to {} failed after {} bytes: {} (disk full?)", partial_, off + done,
                                       w < 0 ? std::strerror(errno) : "no progress"));
      done += static_cast<size_t>(w);
    }
    ::sync_file_range(fd_, static_cast<off_t>(off), static_cast<off_t>(n),
                      SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
    ::posix_fadvise(fd_, static_cast<off_t>(off), static_cast<off_t>(n), POSIX_FADV_DONTNEED);
  }

  std::string path_, partial_;
  ChunkBuffers& bufs_;
  int fd_ = -1;
  int cur_ = 0;
  size_t fill_ = 0;
  uint64_t offset_ = 0;
  std::future<void> pending_;
};

void write_text(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".partial";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw InvalidInput(fmt::format("cannot write {}", tmp.string()));
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.flush();
    if (!out) throw InvalidInput(fmt::format("write to {} failed (disk full?)", tmp.string()));
  }
  fs::rename(tmp, path);
}

std::string json_text(const json& j) { return j.dump(2) + "\n"; }  // = json.dumps(indent=2, sort_keys=True)

void write_weights(const PlannedComponent& c, const PlannedFile& f, const fs::path& dir, uint64_t seed,
                   ChunkBuffers& bufs, const ThreadPool& pool, Progress& prog) {
  const std::string what = c.name + "/" + f.name;
  StreamFile out((dir / f.name).string(), bufs);
  const uint64_t n = f.header.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  out.put(len, 8);
  out.put(f.header.data(), f.header.size());
  prog.add(8 + n, what);
  const size_t es = dtype_size(c.dtype);
  for (size_t idx : f.tensors) {
    const PlannedTensor& t = c.tensors[idx];
    const uint64_t key = tensor_key(seed, c.name, t.name);
    int64_t first = 0, left = t.numel();
    while (left > 0) {
      size_t room = out.space() / es;
      if (room == 0) {  // a partial element cannot happen: buffers are multiples of 8 and so is the header
        throw InternalError(fmt::format("synth: chunk of {} bytes misaligned for {}", bufs.size, t.name));
      }
      const int64_t k = std::min<int64_t>(left, static_cast<int64_t>(room));
      fill(pool, t.init, key, first, k, c.dtype, out.ptr());
      out.commit(static_cast<size_t>(k) * es);
      first += k, left -= k;
      prog.add(static_cast<uint64_t>(k) * es, what);
    }
  }
  if (out.bytes() != f.file_bytes())
    throw InternalError(fmt::format("synth: {} has {} bytes, planned {}", what, out.bytes(), f.file_bytes()));
  out.finish();
  prog.add(0, what + " done", /*force_line=*/true);
}

}  // namespace

WriteResult write_checkpoint(const SynthPlan& plan, const std::string& out_dir, const WriteOptions& opt,
                             const ThreadPool& pool) {
  if (opt.chunk_bytes < 4096 || opt.chunk_bytes % 8)
    throw InvalidInput(fmt::format("synth: chunk_bytes {} must be a multiple of 8, >= 4096", opt.chunk_bytes));
  const fs::path tok(opt.tokenizer_from);
  const fs::path tok_files[2] = {tok / "tokenizer.json", tok / "tokenizer_config.json"};
  if (opt.tokenizer_from.empty())
    throw InvalidInput("synth-checkpoint: no tokenizer source; pass --tokenizer-from DIR (a folder with "
                       "tokenizer.json and tokenizer_config.json, e.g. ../shared/golden/v1/checkpoint/tokenizer)");
  for (const auto& f : tok_files)
    if (!fs::is_regular_file(f))
      throw InvalidInput(fmt::format("synth-checkpoint: {} not found (--tokenizer-from must name a folder with "
                                     "tokenizer.json and tokenizer_config.json)",
                                     f.string()));
  const fs::path out(out_dir);
  std::error_code ec;
  if (fs::exists(out) && !fs::is_directory(out))
    throw InvalidInput(fmt::format("synth-checkpoint: {} exists and is not a directory", out_dir));
  if (fs::is_directory(out) && !fs::is_empty(out) && !opt.force)
    throw InvalidInput(fmt::format("synth-checkpoint: {} is not empty (use --force to overwrite)", out_dir));
  fs::create_directories(out, ec);
  if (ec) throw InvalidInput(fmt::format("synth-checkpoint: cannot create {}: {}", out_dir, ec.message()));

  uint64_t total = plan.weight_file_bytes() + fs::file_size(tok_files[0]) + fs::file_size(tok_files[1]);
  const fs::space_info sp = fs::space(out, ec);
  if (!ec && sp.available < total + (64ull << 20))
    throw InvalidInput(fmt::format("synth-checkpoint: {} needs {:.2f} GB but only {:.2f} GB are free", out_dir,
                                   total / 1e9, sp.available / 1e9));

  Progress prog;
  prog.on = opt.progress;
  prog.total = total;
  WriteResult r;
  const auto t0 = Clock::now();
  uint64_t largest = 8;
  for (const auto& c : plan.components)
    for (const auto& f : c.files) largest = std::max(largest, f.file_bytes());
  ChunkBuffers bufs(static_cast<size_t>(std::min<uint64_t>(opt.chunk_bytes, (largest + 7) / 8 * 8)));
  for (const auto& c : plan.components) {
    const fs::path dir = out / c.name;
    fs::create_directories(dir);
    for (const auto& f : c.files) {
      write_weights(c, f, dir, plan.seed, bufs, pool, prog);
      r.files++;
    }
    if (!c.index_name.empty()) {
      const std::string s = json_text(c.index);
      write_text(dir / c.index_name, s);
      prog.add(s.size(), c.name + "/" + c.index_name);
      r.files++;
    }
    for (const auto& [name, j] : c.json_files) {
      const std::string s = json_text(j);
      write_text(dir / name, s);
      prog.add(s.size(), c.name + "/" + name);
      r.files++;
    }
  }
  fs::create_directories(out / "tokenizer");
  for (const auto& f : tok_files) {
    const fs::path dst = out / "tokenizer" / f.filename();
    const fs::path tmp = dst.string() + ".partial";
    fs::copy_file(f, tmp, fs::copy_options::overwrite_existing);
    fs::permissions(tmp, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::add);  // source may be read-only
    fs::rename(tmp, dst);
    prog.add(fs::file_size(dst), "tokenizer/" + f.filename().string());
    r.files++;
  }
  for (const auto& [rel, j] : plan.root_json) {
    const fs::path p = out / rel;
    fs::create_directories(p.parent_path());
    // diffusers writes modular_model_index.json without the trailing newline its config.json files have.
    const std::string s = rel == "modular_model_index.json" ? j.dump(2) : json_text(j);
    write_text(p, s);
    prog.add(s.size(), rel);
    r.files++;
  }
  r.bytes = prog.done;
  r.seconds = seconds_since(t0);
  prog.add(0, "all files written", true);

  const auto t1 = Clock::now();
  validate(plan, out_dir, opt.spot_checks);
  r.validate_seconds = seconds_since(t1);
  return r;
}

// ---------------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------------

void validate(const SynthPlan& plan, const std::string& dir, int spot_checks) {
  Checkpoint ck(dir);  // every config parsed and cross-checked
  auto read_json = [&](const fs::path& p) {
    std::ifstream in(p);
    if (!in) throw BadModel(fmt::format("{}: missing", p.string()));
    try {
      return json::parse(in);
    } catch (const json::exception& e) {
      throw BadModel(fmt::format("{}: not valid JSON ({})", p.string(), e.what()));
    }
  };
  for (const auto& [rel, j] : plan.root_json)
    if (read_json(fs::path(dir) / rel) != j) throw BadModel(fmt::format("{}/{}: differs from the plan", dir, rel));
  for (const auto& c : plan.components) {
    const fs::path cdir = fs::path(dir) / c.name;
    for (const auto& [name, j] : c.json_files)
      if (read_json(cdir / name) != j)
        throw BadModel(fmt::format("{}: differs from the plan", (cdir / name).string()));
    if (!c.index_name.empty() && read_json(cdir / c.index_name) != c.index)
      throw BadModel(fmt::format("{}: differs from the plan", (cdir / c.index_name).string()));

    const TensorStore& st = ck.store(c.name);
    std::set<std::string> planned;
    for (const auto& t : c.tensors) planned.insert(t.name);
    for (const auto& n : st.names())
      if (!planned.count(n)) throw BadModel(fmt::format("{}: unexpected tensor {}", cdir.string(), n));
    if (st.names().size() != planned.size())
      throw BadModel(fmt::format("{}: {} tensors, planned {}", cdir.string(), st.names().size(), planned.size()));
    for (const auto& f : c.files) {
      const fs::path fp = cdir / f.name;
      if (!fs::exists(fp) || fs::file_size(fp) != f.file_bytes())
        throw BadModel(fmt::format("{}: size {} differs from the planned {}", fp.string(),
                                   fs::exists(fp) ? fs::file_size(fp) : 0, f.file_bytes()));
      for (size_t idx : f.tensors) {
        const PlannedTensor& t = c.tensors[idx];
        if (!st.contains(t.name)) throw BadModel(fmt::format("{}: tensor {} is missing", fp.string(), t.name));
        const TensorInfo& info = st.info(t.name);
        if (info.dtype != c.dtype || info.shape != t.shape)
          throw BadModel(fmt::format("{}: {} is {}{}, planned {}{}", fp.string(), t.name, dtype_name(info.dtype),
                                     shape_str(info.shape), dtype_name(c.dtype), shape_str(t.shape)));
        if (fs::path(st.file_of(t.name)).filename() != f.name)
          throw BadModel(fmt::format("{}: {} is in {}, planned {}", cdir.string(), t.name, st.file_of(t.name), f.name));
        if (spot_checks <= 0) continue;
        const Tensor v = st.get(t.name);
        const uint64_t key = tensor_key(plan.seed, c.name, t.name);
        const int64_t n = t.numel();
        for (int s = 0; s < spot_checks; ++s) {
          const int64_t i = s == 0 ? 0 : s == 1 ? n - 1 : static_cast<int64_t>(bits_at(key ^ 0x5bd1e995, s) % n);
          const float want = value_at(t.init, key, i);
          float got;
          if (c.dtype == DType::BF16) {
            got = bf16_bits_to_f32(static_cast<const uint16_t*>(v.raw())[i]);
            if (f32_to_bf16_bits(want) != f32_to_bf16_bits(got))
              throw BadModel(fmt::format("{}: {}[{}] = {} but the generator gives {}", fp.string(), t.name, i, got,
                                         round_bf16(want)));
          } else {
            got = static_cast<const float*>(v.raw())[i];
            if (f32_bits(got) != f32_bits(want))
              throw BadModel(
                  fmt::format("{}: {}[{}] = {} but the generator gives {}", fp.string(), t.name, i, got, want));
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Locating the golden checkpoint
// ---------------------------------------------------------------------------------------------

std::optional<std::string> find_golden_checkpoint() {
  const fs::path rel = fs::path("shared") / "golden" / "v1" / "checkpoint";
  std::vector<fs::path> roots;
  // This file is <repo>/src/model/synth_checkpoint.cpp; the golden set lives next to the repo.
  const fs::path src(__FILE__);
  if (src.is_absolute()) roots.push_back(src.parent_path().parent_path().parent_path().parent_path());
  std::error_code ec;
  const fs::path cwd = fs::current_path(ec);
  if (!ec) roots.insert(roots.end(), {cwd.parent_path(), cwd, cwd.parent_path().parent_path()});
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    // <repo>/<build>/mm3 or <repo>/<build>/tests/test_x
    fs::path p = exe.parent_path();
    for (int i = 0; i < 4 && !p.empty(); ++i, p = p.parent_path()) roots.push_back(p);
  }
  for (const auto& r : roots) {
    const fs::path cand = r / rel;
    if (fs::is_regular_file(cand / "modular_model_index.json", ec)) return fs::weakly_canonical(cand, ec).string();
  }
  return std::nullopt;
}

}  // namespace mm3::synth
