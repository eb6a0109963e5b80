// pipeline.h — the whole text-to-music pipeline (issue 6): tokenize → AR (LM + depth decoder, seeded
// sampling) → condition encoder → windowed DiT flow matching → vocoder → stitched stereo audio.
//
// A Pipeline owns the immutable model (a ModelStore that loads each component when its stage first needs
// it); generate() keeps all per-request state local, so one Pipeline can serve requests one after another
// (the server's single worker) — generate() itself is not re-entrant on one Pipeline (stages share the
// model store's residency decisions), callers serialise.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/progress.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/quant.h"
#include "model/dit.h"
#include "pipeline/request.h"

namespace mm3 {

struct PipelineOptions {
  int threads = 0;           // 0 = all cores
  bool low_memory = false;   // free the LM and depth decoder before the DiT loads
  DType ar_precision = DType::BF16;        // reference profile
  DType acoustic_precision = DType::F32;   // reference profile
  DitGemm dit_gemm = DitGemm::Exact;       // reference profile; Int8: W8A8 block GEMMs (model/dit.h)
  // Quantized LM + depth-decoder weights (model/quant_weights.h): nullopt = the checkpoint's default
  // (its mm3-quant/default.json, written by `mm3 quantize IN OUT`; bf16 when there is none).
  std::optional<kern::QuantType> ar_quant;
};

struct GenerationResult {
  Tensor audio;                // [2, S] float32 in [-1, 1] at `sample_rate`
  int sample_rate = 44100;
  Tensor codes;                // [F + 1, 8] int64; row 0 is the non-emitted first frame (replay input)
  int64_t frames = 0;          // emitted frames T
  bool stopped_on_end = false; // the LM sampled <|audio_end|> before the frame budget
  int64_t prompt_tokens = 0;
  double seconds_ar = 0, seconds_acoustic = 0, seconds_total = 0;
  std::vector<std::string> notes;  // things the user should know (e.g. low-memory mode chosen automatically)
};

struct GenerateOptions {
  std::optional<Tensor> codes;   // replay: skip the AR stage, render these codes ([F+1, 8] int64)
  std::string dump_dir;          // non-empty: write named intermediates (npy) there
};

class Pipeline {
 public:
  // `model_dir`: a checkpoint folder in the diffusers componentized layout. Validates configs now;
  // weights are mapped lazily.
  Pipeline(const std::string& model_dir, const PipelineOptions& opt);
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  GenerationResult generate(const Request& req, const RunControl& ctl, const GenerateOptions& gopt = {});

  const std::string& model_dir() const;
  const ThreadPool& pool() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace mm3
