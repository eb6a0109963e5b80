#include "verify/compare.h"

#include <cmath>

namespace mm3::verify {

namespace {

std::string g3(double v) { return fmt::format("{:.3g}", v); }

// A golden tensor holding NaN/inf cannot be compared by any rule of golden/README.md.
bool golden_unusable(const DiffStats& s, CheckResult& r) {
  if (s.ref_nonfinite == 0) return false;
  r.pass = false;
  r.unverifiable = true;
  r.metrics = fmt::format("golden_nonfinite={}/{}", s.ref_nonfinite, s.n);
  r.reason = fmt::format("golden defect: the reference tensor holds {} non-finite value(s) of {}; it cannot be "
                         "compared (ours: {} non-finite)",
                         s.ref_nonfinite, s.n, s.nonfinite);
  return true;
}

bool same_shape(const Tensor& a, const Tensor& b, CheckResult& r) {
  if (a.shape() == b.shape()) return true;
  r.pass = false;
  r.reason = fmt::format("shape {} != golden {}", shape_str(a.shape()), shape_str(b.shape()));
  return false;
}

}  // namespace

DiffStats diff_stats(const Tensor& ours, const Tensor& ref) {
  DiffStats s;
  const bool ints = ref.dtype() == DType::I64 || ref.dtype() == DType::I32;
  s.n = ref.numel();
  if (ints) {
    auto a = ours.to_i64_vector(), b = ref.to_i64_vector();
    for (int64_t i = 0; i < s.n; ++i) {
      double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
      if (a[i] != b[i]) {
        ++s.exact_mismatches;
        if (s.first_mismatch < 0) s.first_mismatch = i;
      }
      s.max_abs = std::max(s.max_abs, d);
      s.mean_abs += d;
    }
    s.bit_identical = s.n ? 1.0 - static_cast<double>(s.exact_mismatches) / s.n : 1.0;
    if (s.n) s.mean_abs /= s.n;
    return s;
  }
  auto a = ours.to_f32_vector(), b = ref.to_f32_vector();
  double se = 0, sr = 0;
  int64_t same_bf16 = 0;
  for (int64_t i = 0; i < s.n; ++i) {
    const bool fa = std::isfinite(a[i]), fb = std::isfinite(b[i]);
    s.nonfinite += !fa;
    s.ref_nonfinite += !fb;
    if (!fa || !fb) continue;
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    se += d * d;
    sr += static_cast<double>(b[i]) * b[i];
    s.max_abs = std::max(s.max_abs, std::fabs(d));
    s.mean_abs += std::fabs(d);
    s.ref_absmax = std::max(s.ref_absmax, std::fabs(static_cast<double>(b[i])));
    if (a[i] != b[i]) {
      ++s.exact_mismatches;
      if (s.first_mismatch < 0) s.first_mismatch = i;
    }
    if (f32_to_bf16_bits(a[i]) == f32_to_bf16_bits(b[i])) ++same_bf16;
  }
  s.rel_rms = sr > 0 ? std::sqrt(se / sr) : (se > 0 ? INFINITY : 0.0);
  if (s.n) {
    s.mean_abs /= s.n;
    s.bit_identical = static_cast<double>(same_bf16) / s.n;
  }
  return s;
}

CheckResult check_exact(const std::string& output, const Tensor& ours, const Tensor& ref) {
  CheckResult r{output, "exact", false, "", ""};
  if (!same_shape(ours, ref, r)) return r;
  DiffStats s = diff_stats(ours, ref);
  if (golden_unusable(s, r)) return r;
  r.metrics = fmt::format("mismatches={}/{}", s.exact_mismatches + s.nonfinite, s.n);
  r.pass = s.exact_mismatches == 0 && s.nonfinite == 0;
  if (!r.pass) r.reason = fmt::format("first mismatch at flat index {}", s.first_mismatch);
  return r;
}

CheckResult check_fp32(const std::string& output, const Tensor& ours, const Tensor& ref, double rel_rms_max,
                       double max_abs_over_ref_absmax) {
  CheckResult r{output, "fp32", false, "", ""};
  if (!same_shape(ours, ref, r)) return r;
  DiffStats s = diff_stats(ours, ref);
  if (golden_unusable(s, r)) return r;
  const double max_abs_lim = max_abs_over_ref_absmax * s.ref_absmax;
  r.metrics = fmt::format("rel_rms={}/{} max_abs={}/{}", g3(s.rel_rms), g3(rel_rms_max), g3(s.max_abs), g3(max_abs_lim));
  r.pass = s.nonfinite == 0 && s.rel_rms <= rel_rms_max && s.max_abs <= max_abs_lim;
  if (s.nonfinite) r.reason = fmt::format("{} non-finite values", s.nonfinite);
  else if (!r.pass) r.reason = s.rel_rms > rel_rms_max ? "rel_rms over the bound" : "max_abs over the bound";
  return r;
}

CheckResult check_bf16(const std::string& output, const Tensor& ours, const Tensor& ref, double bit_identical_min,
                       double mean_abs_max, double max_abs_max) {
  CheckResult r{output, "bf16", false, "", ""};
  if (!same_shape(ours, ref, r)) return r;
  DiffStats s = diff_stats(ours, ref);
  if (golden_unusable(s, r)) return r;
  r.metrics = fmt::format("bit_identical={:.4f}/>={:.4f} mean_abs={}/{} max_abs={}/{}", s.bit_identical,
                          bit_identical_min, g3(s.mean_abs), g3(mean_abs_max), g3(s.max_abs), g3(max_abs_max));
  const bool bi = s.bit_identical >= bit_identical_min, me = s.mean_abs <= mean_abs_max, mx = s.max_abs <= max_abs_max;
  r.pass = s.nonfinite == 0 && bi && me && mx;
  if (s.nonfinite) r.reason = fmt::format("{} non-finite values", s.nonfinite);
  else if (!bi) r.reason = "bit-identical fraction under the bound";
  else if (!me) r.reason = "mean |d| over the bound";
  else if (!mx) r.reason = "max |d| over the bound";
  return r;
}

CheckResult apply_check(const nlohmann::json& check, const Tensor& ours, const Tensor& ref) {
  const std::string output = check.value("output", "");
  const std::string rule = check.value("rule", "");
  try {
    if (rule == "exact") return check_exact(output, ours, ref);
    if (rule == "fp32")
      return check_fp32(output, ours, ref, check.at("rel_rms_max").get<double>(),
                        check.at("max_abs_over_ref_absmax").get<double>());
    if (rule == "bf16")
      return check_bf16(output, ours, ref, check.at("bit_identical_min").get<double>(),
                        check.at("mean_abs_max").get<double>(), check.at("max_abs_max").get<double>());
  } catch (const nlohmann::json::exception& e) {
    return {output, rule, false, "", fmt::format("malformed check in manifest: {}", e.what())};
  }
  return {output, rule, false, "", fmt::format("unknown rule '{}'", rule)};
}

}  // namespace mm3::verify
