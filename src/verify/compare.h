// compare.h — the golden comparison rules, exactly as ../shared/golden/README.md defines them.
// The thresholds always come from the manifest's `checks` (ARCHITECTURE.md habit 6); nothing here
// holds a tolerance of its own.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/tensor.h"

namespace mm3::verify {

struct CheckResult {
  std::string output;   // tensor name
  std::string rule;     // exact | fp32 | bf16 | ...
  bool pass = false;
  std::string metrics;  // "rel_rms=1.2e-07 max_abs=3e-06/1e-04"
  std::string reason;   // why it failed (empty on pass)
  // The golden reference itself cannot be compared against (e.g. it holds NaN): no implementation can
  // pass or fail this check. Reported as a golden defect; `pass` stays false. Never set for a defect of
  // ours — a non-finite value in OUR output is an ordinary failure.
  bool unverifiable = false;
};

struct DiffStats {
  int64_t n = 0;
  double rel_rms = 0, max_abs = 0, mean_abs = 0, ref_absmax = 0, bit_identical = 0;
  int64_t nonfinite = 0, ref_nonfinite = 0, exact_mismatches = 0, first_mismatch = -1;
};
DiffStats diff_stats(const Tensor& ours, const Tensor& ref);

// Applies one manifest check object ({"output", "rule", ...thresholds}) to ours vs ref.
// `rule_override` lets a caller apply another check's bounds (bf16_forced uses lm_bf16's).
CheckResult apply_check(const nlohmann::json& check, const Tensor& ours, const Tensor& ref);

// The individual rules, for callers that build checks themselves.
CheckResult check_exact(const std::string& output, const Tensor& ours, const Tensor& ref);
CheckResult check_fp32(const std::string& output, const Tensor& ours, const Tensor& ref, double rel_rms_max,
                       double max_abs_over_ref_absmax);
CheckResult check_bf16(const std::string& output, const Tensor& ours, const Tensor& ref, double bit_identical_min,
                       double mean_abs_max, double max_abs_max);

}  // namespace mm3::verify
