// profile_flags.h — the compute-profile flags `mm3 generate` and `mm3 serve` share:
//   --acoustic-precision f32|bf16   the DiT + vocoder compute (f32: the reference profile)
//   --quant bf16|int8|q4            the LM + depth-decoder weights (default: the checkpoint's own)
//   --dit-gemm exact|int8           the DiT's block GEMMs (exact: the reference; int8: W8A8, opt-in)
// Parsed here so both commands accept and explain them the same way.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "pipeline/pipeline.h"

namespace mm3::cli {

struct ProfileArgs {
  std::string acoustic_precision = "f32";
  std::string quant;  // empty: the checkpoint's default (mm3-quant/default.json, else bf16)
  std::string dit_gemm = "exact";
};

void add_profile_flags(CLI::App& sub, ProfileArgs& a);
// Fills popt.acoustic_precision / popt.ar_quant / popt.dit_gemm; throws InvalidInput naming the accepted values.
void apply_profile_flags(const ProfileArgs& a, PipelineOptions& popt);
// "acoustic f32, AR weights checkpoint default" etc., for logs.
std::string describe_profile(const PipelineOptions& popt);

}  // namespace mm3::cli
