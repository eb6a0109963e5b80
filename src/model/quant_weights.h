// quant_weights.h — quantized Linear weights for the LM and the depth decoder (issue 8; formats in
// kernels/quant.h). Used only when asked for: a model loaded with QuantType::None is the unchanged
// bf16 model, bit for bit.
//
// What is quantized (the "plan"):
// * body — every Linear streamed once per decode step: the LM's q/k/v/o/gate/up/down of all layers,
//   the depth decoder's projection and its layers' to_q/to_k/to_v/to_out/gate/up/down: the requested
//   type (int8 or q4);
// * heads — the LM's sampleable lm_head rows (the end token 151670 and the 16384 codes, see
//   qwen3_lm.h; the other 183,615 rows are never computed) and the 7 depth audio_heads: int8 for both
//   types, because their outputs are the logits the sampler ranks (4-bit heads would move the top-k
//   set far more than 4-bit hidden layers do), and they are only 1.3 % of the streamed bytes;
// * kept as they are: the embedding tables (LM embed_tokens, depth audio_embeddings and pos_embedding:
//   row gathers, not streamed, and the feedback embedding must stay the reference's), every RMSNorm
//   weight (fp32 copies), and the KV caches (bf16 in the bf16 profile).
//
// Where quantized weights come from: `mm3 quantize IN OUT --type T` writes, per component, the
// sidecar OUT/mm3-quant/<T>/<component>.safetensors holding for every quantized Linear `key` the two
// tensors "<key>.qs" (I32 raw bytes) and "<key>.scales" (F16), with the lm_head row slices named
// "lm_head.weight[151670:151671]" and "lm_head.weight[151675:168059]"; its __metadata__ says
// {"mm3_quant_format": "1", "mm3_quant_type": T, "mm3.type.<key>": int8|q4, ...}. The original
// bf16 files are not touched (OUT is IN itself or a folder of links to IN's files). When a model is
// loaded with type T and that sidecar exists its tensors are read from it (copied into huge-page
// memory, see make_linear); otherwise the bf16 weights are quantized at load (same bytes: the
// quantizer is deterministic). OUT/mm3-quant/default.json
// {"type": T} (written when OUT is a new folder) makes T the checkpoint's default, so a plain
// `mm3 generate --model OUT` runs quantized.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "kernels/kernels.h"

namespace mm3 {

using kern::QuantType;

inline constexpr const char* kQuantDirName = "mm3-quant";
inline constexpr const char* kQuantFormatVersion = "1";

struct QuantPlan {
  QuantType body = QuantType::None;
  QuantType heads = QuantType::None;
};
QuantPlan quant_plan(QuantType t);  // None -> {None, None}; Int8 -> {Int8, Int8}; Q4 -> {Q4, Int8}

std::string quant_sidecar_path(const std::string& ckpt_dir, const std::string& component, QuantType t);
// The checkpoint's default type (ckpt/mm3-quant/default.json), None when there is none. Throws BadModel
// for an unreadable or unknown entry.
QuantType checkpoint_default_quant(const std::string& ckpt_dir);

// How a model's quantized weights are obtained.
struct QuantLoad {
  QuantType type = QuantType::None;
  const ThreadPool* pool = nullptr;            // workers for quantize-at-load (null: a local pool)
  std::shared_ptr<const SafetensorsFile> sidecar;  // null: quantize the bf16 weights at load
};

// The sidecar of `component` for type t when the checkpoint has one (validated: format version and
// type), else null.
std::shared_ptr<const SafetensorsFile> open_quant_sidecar(const std::string& ckpt_dir, const std::string& component,
                                                          QuantType t);

// Builds the LinearWeight of `key` (the view `w` already bound and shape-checked by the caller):
// t None: a BF16 weight in the strip form (kern::bf16_strips, any size, its mapped pages released)
// where the CPU offers it and MM3_BF16_STRIPS is not 0; otherwise the weight itself (the same bytes; a
// mapped view of >= 4 MiB is copied into huge-page memory and its mapped pages released, which streams
// ~2x faster). MM3_MMAP_WEIGHTS=1 keeps the view either way. Else the sidecar's tensors (BadModel
// naming the file and key when missing, of another type or misshapen; codes and scales copied into one
// huge-page allocation and their mapped pages released, unless MM3_MMAP_WEIGHTS=1) or the quantized
// bf16 weight.
kern::LinearWeight make_linear(const Tensor& w, const std::string& key, QuantType t, const QuantLoad& q);

// Whether MM3_MMAP_WEIGHTS asks to keep weights as zero-copy views of the files (no resident copies).
bool weights_stay_mapped();
// Whether a sidecar's quantized weight of width K is held in the strip form (kern::with_strips): where
// the CPU has its GEMV and it pays at K (kern::quant_strips_pay), unless MM3_QUANT_STRIPS=0 or
// MM3_MMAP_WEIGHTS=1. MM3_QUANT_STRIPS=2 keeps a resident row copy beside the strips
// (quant_strips_keep_rows), so that `mm3 bench --alternate quant_strips=0,1` compares the two GEMVs on
// resident memory; MM3_QUANT_STRIPS=3 builds the strip form at every K (tests; the GEMV stages then hold
// both forms at every K).
// Otherwise the strip form is the resident copy and the row form stays a view of the sidecar (its pages
// released: only the prefill's dequantizing and `mm3 quantize` read it, through the page cache).
// Weights quantized at load keep the row form alone (both forms would double their memory).
bool quant_strips_for(int64_t K);
bool quant_strips_keep_rows();
// Drops the pages of a file-mapped view from this process (they stay in the page cache, reclaimable;
// the view still reads the file): for a weight whose copy is what gets used. No-op for an owned tensor.
void release_mapped_pages(const Tensor& w);
// Faults in the pages of a file-mapped view before a pass reads all of it (io/mmap_file.h populate_read;
// 8 MiB pieces over the pool's threads when given): the packing or quantizing at load then reads memory
// instead of taking a fault per 64 KiB. No-op for an owned tensor.
void populate_mapped_pages(const Tensor& w, const ThreadPool* pool);

// For `mm3 quantize`: the sidecar tensors and metadata entries of one quantized Linear.
void append_quant_tensors(const std::string& key, const kern::LinearWeight& w,
                          std::vector<std::pair<std::string, Tensor>>& tensors,
                          std::map<std::string, std::string>& metadata);

}  // namespace mm3
