// tuning.cpp — the same-bits kernel knobs of tuning.h.
#include "kernels/tuning.h"

#include <atomic>
#include <cstdlib>

#include "core/errors.h"

namespace mm3::kern::tuning {

const std::vector<KnobInfo>& knobs() {
  static const std::vector<KnobInfo> v = {
      {Knob::GemvRows,
       "gemv_rows",
       "MM3_GEMV_ROWS",
       {1, 4, 8, 12},
       "bf16 decode GEMV: 1 = weight rows one after another, 4 / 8 / 12 = that many side by side (linear.cpp; "
       "also the AVX-512 body without AVX512-BF16, capped at what its registers hold)"},
      {Knob::QuantPrefetch,
       "quant_prefetch",
       "MM3_QUANT_PREFETCH",
       {0, 1, 2},
       "quantized decode GEMV (AVX512-VNNI): 0 = no software prefetches, 1 = PREFETCHNTA, 2 = PREFETCHT1 "
       "(quant.cpp)"},
      {Knob::GemvPrefetch,
       "gemv_prefetch",
       "MM3_GEMV_PREFETCH",
       {0, 1},
       "bf16 decode GEMV (AVX512-BF16, AVX-512 without it, and the AVX2 body of bf16 weights): 0 = no software "
       "prefetch, 1 = PREFETCHT1 2 KiB ahead of each row (unforced on AVX2: PREFETCHNTA 1 KiB ahead) (linear.cpp)"},
      {Knob::ResidualUnit,
       "residual_unit",
       "MM3_RESIDUAL_UNIT",
       {0, 1},
       "vocoder fp32 residual units: 0 = conv1 and conv2 as two convolutions, 1 = one fused pass where the "
       "length allows (conv_winograd.cpp conv_residual_unit)"},
      {Knob::QuantPfKib,
       "quant_pf_kib",
       "MM3_QUANT_PF_KIB",
       {2, 4, 8, 16, 32},
       "quantized decode GEMV (AVX512-VNNI): the prefetch distance on the codes in KiB (the scales' is half) "
       "where quant_prefetch issues prefetches (quant.cpp)"},
      {Knob::QuantStrips,
       "quant_strips",
       "MM3_QUANT_STRIPS_GEMV",
       {0, 1},
       "quantized decode GEMV (AVX512-VNNI): 0 = the row form's bodies, 1 = the strip form's where a weight has "
       "one (the model holds both forms with MM3_QUANT_STRIPS=2, the GEMV stages where the model has strips, "
       "or at every K with 3; model/quant_weights.h)"},
      {Knob::WinoTaskKib,
       "wino_task_kib",
       "MM3_WINO_TASK_KIB",
       {128, 256, 512, 1024, 2048, 4096},
       "vocoder fp32 7-tap convs (Winograd F(6,7)): about this many KiB of a task's H rows (the task's tiles "
       "follow; the same bits at every size; conv_winograd.cpp task_tiles)"},
      {Knob::Avx2GemvRows,
       "avx2_gemv_rows",
       "MM3_AVX2_GEMV_ROWS",
       {1, 2, 3, 4, 6, 8},
       "decode GEMV on AVX2 (no AVX-512): weight rows side by side, capped at what the 16 registers hold for "
       "M rows of x (linear.cpp gemv_avx2_rows)"},
      {Knob::Avx2GemvXb,
       "avx2_gemv_xb",
       "MM3_AVX2_GEMV_XB",
       {0, 1},
       "decode GEMV on AVX2 of bf16 weights in a bf16 computation: 0 = x read as fp32, 1 = from its exact bf16 "
       "copy (linear.cpp)"},
      {Knob::I8Kc,
       "i8_kc",
       "MM3_I8_KC",
       {128, 256, 512, 1024, 2048, 8192},
       "our int8 GEMMs (--dit-gemm int8; AVX512-VNNI and the AVX2 one on 16-bit pairs): k's per block, the "
       "panel slice a block's tiles run over (the integer sums are exact at every size; gemm_i8.cpp)"},
      {Knob::I8Mc,
       "i8_mc",
       "MM3_I8_MC",
       {96, 192, 384, 768},
       "int8 GEMM on AVX512-VNNI: rows of x per block, each block's rows running over a panel's slice before the "
       "next slice (gemm_i8.cpp vnni_gemm)"},
      {Knob::Bf16Dot,
       "bf16_dot",
       "MM3_BF16_DOT",
       {0, 1},
       "bf16 pair dots (AVX512-BF16: the decode GEMV on the strip form, the bf16 GEMM tile of the LM prefill, "
       "and without AMX whether the bf16 DiT's GEMMs take oneDNN's (1) or that tile (0), read as they are packed): "
       "0 = each pair as two fp32 FMAs in VDPBF16PS's order and rounding (the same bits where the CPU's "
       "instruction computes exactly that, linear.cpp bf16_dot_is_two_fmas), 1 = VDPBF16PS; "
       "unforced, the FMAs where a probe finds VDPBF16PS slower than two FMAs (strips.cpp, gemm_nt.cpp, "
       "linear.cpp cpu_bf16_dot_slow)"},
  };
  return v;
}

namespace {

const KnobInfo& info(Knob k) {
  for (const KnobInfo& i : knobs())
    if (i.knob == k) return i;
  throw InternalError("tuning: unknown knob");
}

bool accepts(const KnobInfo& i, int value) {
  if (value == -1) return true;
  for (int v : i.values)
    if (v == value) return true;
  return false;
}

std::string accepted(const KnobInfo& i) {
  std::string s;
  for (int v : i.values) s += (s.empty() ? "" : " or ") + std::to_string(v);
  return s;
}

// One slot per knob, its first value from the environment (an unset or unrecognised value: -1).
std::atomic<int>& slot(Knob k) {
  static std::atomic<int> slots[12] = {-2, -2, -2, -2, -2, -2, -2, -2, -2, -2, -2, -2};
  static_assert(sizeof(slots) / sizeof(slots[0]) == 12, "one slot per Knob");
  std::atomic<int>& s = slots[static_cast<int>(k)];
  if (s.load(std::memory_order_relaxed) == -2) {
    const KnobInfo& i = info(k);
    int v = -1;
    if (const char* e = std::getenv(i.env); e && *e) {
      char* end = nullptr;
      const long l = std::strtol(e, &end, 10);
      if (end && *end == '\0' && accepts(i, static_cast<int>(l))) v = static_cast<int>(l);
    }
    int expected = -2;
    s.compare_exchange_strong(expected, v);
  }
  return s;
}

}  // namespace

int forced(Knob k) { return slot(k).load(std::memory_order_relaxed); }

void force(Knob k, int value) {
  const KnobInfo& i = info(k);
  if (!accepts(i, value))
    throw InvalidInput(
        fmt::format("tuning knob {} takes {} (or -1: the kernel's own choice), not {}", i.name, accepted(i), value));
  slot(k).store(value, std::memory_order_relaxed);
}

Knob knob_from_name(std::string_view name) {
  std::string names;
  for (const KnobInfo& i : knobs()) {
    if (name == i.name) return i.knob;
    names += fmt::format("\n  {} ({}): {}", i.name, accepted(i), i.help);
  }
  throw InvalidInput(fmt::format("no tuning knob named '{}'; the knobs are:{}", name, names));
}

}  // namespace mm3::kern::tuning
