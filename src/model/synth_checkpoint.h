// synth_checkpoint.h — random-weight MiniMax-Music3 checkpoints in the exact on-disk layout of the real
// one (MODEL.md §1.1–1.7: diffusers componentized folders, configs, tensor names, shapes, dtypes,
// sharding), at the golden tiny dims or at the real full dims. Used by `mm3 synth-checkpoint`, by the
// benchmarks (a full-size model without downloading 28 GB) and by tests.
//
// Layout facts reproduced here (checked by tests/unit/models_synth_*.cpp):
// * Sharding follows huggingface_hub's split_state_dict_into_shards (what transformers'
//   save_pretrained and diffusers' save_pretrained call): walk the state dict in module-registration
//   order; a tensor larger than max_shard_size gets a shard of its own; otherwise a new shard starts
//   when adding the tensor would exceed max_shard_size. With max_shard_size = 5 GB (5e9 bytes) this
//   gives the real LM's 4 shards and the real transformer's 2 shards byte for byte; with 6 MB it gives
//   the golden tiny LM's 3 shards.
// * Each .safetensors header is written the way Python safetensors writes it: compact JSON,
//   "__metadata__":{"format":"pt"} first, then tensors sorted by name with keys dtype, shape,
//   data_offsets, padded with spaces to a multiple of 8 bytes. File sizes therefore equal the real
//   checkpoint's file sizes listed in MODEL.md §1.1.
// * Config JSON files are the golden tiny checkpoint's, with the dims replaced for --full; written as
//   json.dumps(indent=2, sort_keys=True) + "\n" (nlohmann's dump(2) matches that format).
//
// Values: a counter-based generator, so any element can be produced independently (chunked, parallel,
// spot-checked after writing): element i of a tensor is f(splitmix64(key + (i+1)·γ)) where key mixes
// the seed with the component and tensor name. "Normal" values are Irwin–Hall sums of four 16-bit
// uniforms (mean 0, unit variance, bounded at ±3.46): cheap, deterministic, close enough to a Gaussian
// for random weights. Scales keep a forward pass finite: linear/embedding N(0, 0.02), norm weights 1,
// Snake alphas U(0.5, 1.5), weight-norm gains g set to the row norm the folded weight should have, so
// the folded W = g·V/‖V‖ has a sane scale whatever V is.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace mm3::synth {

// ---------------------------------------------------------------------------------------------
// Deterministic values
// ---------------------------------------------------------------------------------------------

enum class InitKind : uint8_t { normal, uniform, constant };

struct Init {
  InitKind kind = InitKind::constant;
  float a = 0.f;  // normal: mean; uniform: low; constant: value
  float b = 0.f;  // normal: std; uniform: high
  static Init normal(float mean, float std) { return {InitKind::normal, mean, std}; }
  static Init uniform(float lo, float hi) { return {InitKind::uniform, lo, hi}; }
  static Init constant(float v) { return {InitKind::constant, v, 0.f}; }
};

// The per-tensor key: mixes `seed` with "component/name".
uint64_t tensor_key(uint64_t seed, std::string_view component, std::string_view name);
// Element i of a tensor with this init and key, before rounding to the stored dtype.
float value_at(const Init& init, uint64_t key, int64_t i);
// Elements [first, first + n) in `dtype` (F32 or BF16; BF16 rounds like torch), written to `out`.
// Parallel over `pool` when n is large.
void fill(const ThreadPool& pool, const Init& init, uint64_t key, int64_t first, int64_t n, DType dtype, void* out);

// ---------------------------------------------------------------------------------------------
// Dims and the plan of every file
// ---------------------------------------------------------------------------------------------

struct SynthDims {
  std::string size_name;  // "tiny" | "full"
  std::string repo_id;    // modular_model_index.json pretrained_model_name_or_path
  // language_model (Qwen3), MODEL.md §1.2
  int lm_hidden = 0, lm_inter = 0, lm_layers = 0, lm_heads = 0, lm_kv_heads = 0, lm_head_dim = 0, vocab = 0;
  // rvq_depth_decoder, §1.3 (hidden = lm_hidden)
  int depth_layers = 0, depth_heads = 0, depth_inter = 0, audio_vocab = 1024, codebooks = 8, depth_max_pos = 16;
  // condition_encoder, §1.4 (condition_hidden_dim = lm_hidden, num_condition_layers = codebooks)
  int cond_out = 0;
  // transformer, §1.5 (condition_dim = cond_out)
  int dit_in = 0, dit_layers = 0, dit_heads = 0, dit_head_dim = 0, dit_ff = 0, dit_rot = 0, dit_fourier = 0;
  // vocoder, §1.6 (latent_channels = dit_in)
  int voc_dec_in = 0, voc_hidden = 0;
  std::vector<int> voc_ratios{8, 8, 4, 2};
  // huggingface_hub max_shard_size (bytes) used for every component
  uint64_t max_shard_bytes = 0;

  static SynthDims tiny();  // the golden checkpoint's dims (golden/v1/manifest.json "dims")
  static SynthDims full();  // the real checkpoint's dims (MODEL.md §1.1)
};

struct PlannedTensor {
  std::string name;
  Shape shape;
  Init init;
  int64_t numel() const { return shape_numel(shape); }
};

struct PlannedFile {
  std::string name;                 // file name inside the component folder
  std::vector<size_t> tensors;      // indices into PlannedComponent::tensors, in on-disk (name) order
  std::vector<uint64_t> offsets;    // data_offsets begin of each, relative to the data buffer
  std::string header;               // the JSON header, space-padded to a multiple of 8
  uint64_t data_bytes = 0;
  uint64_t file_bytes() const { return 8 + header.size() + data_bytes; }
};

struct PlannedComponent {
  std::string name;                  // folder, e.g. "language_model"
  DType dtype = DType::F32;          // every tensor of the component
  std::vector<PlannedTensor> tensors;  // module-registration (state dict) order: drives sharding
  std::vector<PlannedFile> files;      // one, or the shards
  std::string index_name;              // "<stem>.safetensors.index.json" when sharded, else empty
  nlohmann::json index;                // its content when sharded
  std::vector<std::pair<std::string, nlohmann::json>> json_files;  // config.json, generation_config.json
  uint64_t data_bytes() const;
  int64_t params() const;
};

struct SynthPlan {
  SynthDims dims;
  uint64_t seed = 0;
  std::vector<PlannedComponent> components;   // the five weight components
  // Other JSON files, path relative to the checkpoint root (scheduler config, model index).
  std::vector<std::pair<std::string, nlohmann::json>> root_json;
  uint64_t weight_file_bytes() const;  // sum of .safetensors file sizes
};

// Builds every name, shape, init, shard split, header and config for `dims`. No I/O.
SynthPlan make_plan(const SynthDims& dims, uint64_t seed);

// huggingface_hub's shard split of `sizes` (bytes, state-dict order): the groups of indices, in order.
std::vector<std::vector<size_t>> split_shards(const std::vector<uint64_t>& sizes, uint64_t max_shard_bytes);

// ---------------------------------------------------------------------------------------------
// Writing and validating
// ---------------------------------------------------------------------------------------------

struct WriteOptions {
  std::string tokenizer_from;  // folder holding tokenizer.json and tokenizer_config.json (required)
  bool force = false;          // write into a non-empty OUT (overwriting the files the plan names)
  bool progress = true;        // progress lines on stderr
  size_t chunk_bytes = 64u << 20;  // generation/write unit; two such buffers are alive at a time
  int spot_checks = 8;         // values re-generated and compared per tensor after writing (0: none)
};

struct WriteResult {
  uint64_t bytes = 0;   // bytes written (weights + JSON + tokenizer)
  int files = 0;
  double seconds = 0;   // wall time of writing (validation excluded)
  double validate_seconds = 0;
};

// Writes the plan under `out_dir` (created). Every file goes to "<name>.partial" first and is renamed
// when complete; modular_model_index.json is written last, so an interrupted run never leaves a
// folder that loads. Memory is bounded by two chunk buffers whatever the model size. Afterwards the
// checkpoint is opened with Checkpoint and every component's TensorStore, and names, shapes, dtypes,
// file sizes and spot values are compared with the plan (validate()). Throws InvalidInput for an
// unusable OUT or tokenizer source, BadModel when validation fails.
WriteResult write_checkpoint(const SynthPlan& plan, const std::string& out_dir, const WriteOptions& opt,
                             const ThreadPool& pool);

// Opens `dir` with Checkpoint + TensorStores and checks it against the plan: every tensor present with
// the planned dtype and shape, no extra tensor, file sizes as planned, `spot_checks` values per tensor
// equal to the generator's. Throws BadModel naming the first defect.
void validate(const SynthPlan& plan, const std::string& dir, int spot_checks);

// The golden tiny checkpoint (../shared/golden/v1/checkpoint next to the repository), looked up from
// this source file's location, the working directory and the executable's location; nullopt if absent.
std::optional<std::string> find_golden_checkpoint();

}  // namespace mm3::synth
