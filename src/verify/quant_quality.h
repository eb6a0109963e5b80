// quant_quality.h — `mm3 verify --quant int8|q4`: how far the quantized LM + depth decoder
// (model/quant_weights.h) land from the bf16 goldens. INFORMATIONAL ONLY: a quantized run is a
// different computation from the reference, so there is no pass/fail and the golden rules of
// kind_ar.cpp are neither applied nor changed; the verify exit code stays that of the bf16 run.
//
// Cases (the bf16 ones of the manifest, under the verify --kind / --case filters):
// * language_model (meta.dtype bf16, e.g. lm_bf16): prefill_hidden, decode_hidden, code_logits as the
//   language_model runner computes them, vs the golden: bit-identical fraction, rel RMS, max |d|; for
//   the logits also the argmax agreement and the mean top-50 overlap (the sampler's candidate set).
// * rvq_depth_decoder (bf16, depth_bf16): depth_hidden, guided_logits (+ argmax / top-50), feedback_embed.
// * e2e (reference profile): (a) teacher-forced to the golden codes: frame_hiddens, c0_guided and
//   depth_guided rows vs the golden (finite columns; argmax agreement per row); (b) free-running from
//   meta.seed: AR steps identical to the golden codes before the first divergence, of how many.
#pragma once

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/quant.h"
#include "verify/verify.h"

namespace mm3::verify {

struct QuantQualityRow {
  std::string case_name, output;
  double bit_identical = 0, rel_rms = 0, max_abs = 0;
  double argmax_agree = -1, top50_overlap = -1;  // logits rows only (-1: not applicable)
  int64_t same_steps = -1, steps = -1;           // free-running codes only
  std::string note;
};

// Runs the selected cases with `type` weights and prints one "INFO quant=<type> ..." line per case.
std::vector<QuantQualityRow> run_quant_quality(const std::filesystem::path& golden_dir, const VerifyOptions& opt,
                                               kern::QuantType type, const ThreadPool& pool, std::FILE* out);

}  // namespace mm3::verify
