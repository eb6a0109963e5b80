// profile_flags.cpp — see profile_flags.h.
#include "profile_flags.h"

#include "core/errors.h"

namespace mm3::cli {

void add_profile_flags(CLI::App& sub, ProfileArgs& a) {
  sub.add_option(
      "--acoustic-precision", a.acoustic_precision,
      "DiT + vocoder compute: f32 (default; the reference profile, exact against the goldens; the vocoder's "
      "7-tap convs as Winograd F(6,7), environment MM3_CONV_WINOGRAD=0 for the direct form; MM3_STRASSEN=1 runs "
      "the DiT's FF GEMMs as Strassen's 7 half-size products: 2-3% faster, +5.4 GB) or bf16 "
      "(measured: the DiT 1.8x faster on Zen 4, 2.9x with AMX; the vocoder 1.3x with AMX, on Zen 4 no faster than "
      "f32's "
      "Winograd forms; needs AVX512-BF16; the "
      "waveform moves ~3% RMS from f32's)");
  sub.add_option("--quant", a.quant,
                 "LM + depth-decoder weights: bf16 (the reference), int8 or q4 (AR frames 1.5-1.9x / 2.0-3.0x faster, measured; "
                 "the same seed then samples a different song, see README 'Quantized LM + depth decoder'). Default: "
                 "the checkpoint's own (mm3-quant/default.json, written by `mm3 quantize`), else bf16. Without a "
                 "sidecar from `mm3 quantize` the weights are quantized at load");
  sub.add_option(
      "--dit-gemm", a.dit_gemm,
      "The DiT's block GEMMs (q|k|v, o, ff_in, ff_out): exact (default; fp32 or bf16 per "
      "--acoustic-precision) or int8 (opt-in, with --acoustic-precision f32: weights and each token's "
      "activations Hadamard-rotated, then on 127 levels, exact integer GEMMs: AMX-INT8, AVX512-VNNI or AVX-VNNI, "
      "else AVX2 on 16-bit pairs; measured on Zen 5 an Euler step ~3.5x faster than f32 and ~1.9x than "
      "bf16; with AVX2 + AVX-VNNI only (Intel laptops from 12th gen on, where bf16 is no faster than "
      "f32) ~3.4x faster than f32 on Zen 5 capped to that; with AVX2 alone ~1.5x on Zen 4 capped to "
      "that, half the fp32 weights' memory), its velocity ~2x further from f32's than bf16's on random "
      "weights; quality on the real weights unmeasured, see README 'Compute profiles')");
}

void apply_profile_flags(const ProfileArgs& a, PipelineOptions& popt) {
  if (a.acoustic_precision == "f32" || a.acoustic_precision == "fp32")
    popt.acoustic_precision = DType::F32;
  else if (a.acoustic_precision == "bf16")
    popt.acoustic_precision = DType::BF16;
  else
    throw InvalidInput(fmt::format("--acoustic-precision '{}': use f32 (the reference) or bf16", a.acoustic_precision));
  if (a.dit_gemm == "exact")
    popt.dit_gemm = DitGemm::Exact;
  else if (a.dit_gemm == "int8")
    popt.dit_gemm = DitGemm::Int8;
  else
    throw InvalidInput(fmt::format("--dit-gemm '{}': use exact (the reference) or int8", a.dit_gemm));
  if (popt.dit_gemm == DitGemm::Int8 && popt.acoustic_precision != DType::F32)
    throw InvalidInput(
        "--dit-gemm int8 runs with --acoustic-precision f32 (the int8 GEMMs replace the bf16 ones): "
        "drop one of the two");
  if (!a.quant.empty()) {
    const auto t = kern::quant_from_name(a.quant);
    if (!t) throw InvalidInput(fmt::format("--quant '{}': use bf16 (unquantized), int8 or q4", a.quant));
    popt.ar_quant = *t;
  }
}

std::string describe_profile(const PipelineOptions& popt) {
  return fmt::format("acoustic {}{}, AR weights {}", popt.acoustic_precision == DType::BF16 ? "bf16" : "f32",
                     popt.dit_gemm == DitGemm::Int8 ? " (DiT GEMMs int8)" : "",
                     popt.ar_quant
                         ? (*popt.ar_quant == kern::QuantType::None ? "bf16" : kern::quant_name(*popt.ar_quant))
                         : "the checkpoint's default");
}

}  // namespace mm3::cli
