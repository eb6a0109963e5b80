// tuning.h — choices between forms of a kernel that give the same bits and differ only in speed
// (the order a GEMV reads its weight rows in, whether it issues software prefetches, whether the
// vocoder runs a residual unit as one pass). Each kernel
// makes its choice per CPU; a knob can force it, from the environment (read once, at first use) or at
// run time, which is how `mm3 bench --alternate KNOB=A,B` compares two forms run by run inside one
// process: on a shared host whose memory bandwidth moves by 2x within minutes, separate processes
// (binaries or settings alternating) could not tell forms 5-10% apart; the twenty-sixth session's
// measurements that way missed the int8 GEMV's 11-14% prefetch cost on Zen 4 (docs/performance-history.md,
// twenty-seventh session).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace mm3::kern::tuning {

enum class Knob {
  GemvRows,       // "gemv_rows": the bf16 decode GEMV, 1 = rows one after another, 4 / 8 / 12 side by side
  QuantPrefetch,  // "quant_prefetch": the quantized GEMV's VNNI bodies' prefetches, 0 none, 1 NTA, 2 T1
  GemvPrefetch,   // "gemv_prefetch": the bf16 decode GEMV (AVX512-BF16 / AVX2), 0 = no software prefetch, 1 = T1
  ResidualUnit,   // "residual_unit": the vocoder's fp32 residual units, 0 = two convolutions, 1 = one fused pass
  QuantPfKib,     // "quant_pf_kib": how far ahead (KiB) the quantized GEMV's prefetches run on the codes
  QuantStrips,    // "quant_strips": 0 = the quantized GEMV's row bodies even where a weight has the strip form
  WinoTaskKib,    // "wino_task_kib": the fp32 7-tap Winograd's KiB of H rows per task
  Avx2GemvRows,   // "avx2_gemv_rows": the AVX2 decode GEMV's weight rows side by side (1 = one at a time)
  Avx2GemvXb,     // "avx2_gemv_xb": the AVX2 decode GEMV of bf16 weights, 0 = fp32 x, 1 = a bf16 copy of x
  I8Kc,           // "i8_kc": our int8 GEMMs' k's per block (VNNI: panel slices of 64 x this many bytes)
  I8Mc,           // "i8_mc": the VNNI int8 GEMM's rows of x per block
  Bf16Dot,        // "bf16_dot": bf16 pair dots (strip GEMV, gemm_ex tile), 0 = two fp32 FMAs a pair, 1 = VDPBF16PS
};

struct KnobInfo {
  Knob knob;
  const char* name;
  const char* env;          // the environment variable that forces it
  std::vector<int> values;  // the values it accepts (besides -1: the kernel's own choice)
  const char* help;
};
const std::vector<KnobInfo>& knobs();

// The forced value, or -1 where the kernel chooses (the environment variable, read at first use,
// sets the initial value). Cheap: kernels read it once per call.
int forced(Knob k);
// Forces `k` to `value` (-1: back to the kernel's choice). InvalidInput for a value it does not take.
void force(Knob k, int value);
// The knob named `name` (InvalidInput, listing the knobs, for an unknown name).
Knob knob_from_name(std::string_view name);

}  // namespace mm3::kern::tuning
