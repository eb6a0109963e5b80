// bench_runner.cpp — the stage registry and the timing loop of `mm3 bench` (bench_stages.h).
// Timing: steady_clock around each call of a stage's `run`, after `warmup` untimed calls; the median
// is the reported figure. Peak RSS: the kernel's VmHWM after the stage, reset before setup through
// /proc/self/clear_refs ("5") when the kernel allows it, so it is the stage's own peak.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <numeric>
#include <string>

#include "bench_stages.h"
#include "core/errors.h"
#include "kernels/cpu/simd.h"

namespace mm3::bench {

const Checkpoint& BenchContext::checkpoint() const {
  if (!ckpt_) {
    if (model_dir_.empty())
      throw InvalidInput("this stage needs a model: pass --model DIR or --full (no golden checkpoint found)");
    ckpt_ = std::make_unique<Checkpoint>(model_dir_);
  }
  return *ckpt_;
}

std::vector<Stage>& stages() {
  static std::vector<Stage> s;
  return s;
}

RegisterStage::RegisterStage(Stage s) { stages().push_back(std::move(s)); }

double StageResult::median() const {
  if (seconds.empty()) return 0;
  std::vector<double> v = seconds;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
double StageResult::min() const { return seconds.empty() ? 0 : *std::min_element(seconds.begin(), seconds.end()); }
double StageResult::max() const { return seconds.empty() ? 0 : *std::max_element(seconds.begin(), seconds.end()); }

namespace {

using Clock = std::chrono::steady_clock;

bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

// VmHWM in MB (1e6 bytes), or the process-lifetime ru_maxrss when /proc is unavailable.
double peak_rss_mb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) * 1024.0 / 1e6;  // kB
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) * 1024.0 / 1e6;
}

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

StageResult run_stage(const Stage& s, const BenchContext& ctx, const RunOptions& opt) {
  if (opt.runs < 1) throw InvalidInput("--runs must be >= 1");
  StageResult r;
  r.stage = s.name;
  r.peak_rss_per_stage = reset_peak_rss();
  {
    const auto t0 = Clock::now();
    StageRun run = s.setup(ctx);
    r.setup_s = since(t0);
    if (!run.run) throw InternalError(fmt::format("bench stage {}: setup returned no run function", s.name));
    for (int i = 0; i < opt.warmup; ++i) run.run();
    for (int i = 0; i < opt.runs; ++i) {
      const auto t = Clock::now();
      run.run();
      r.seconds.push_back(since(t));
    }
    r.bytes = run.bytes;
    r.flops = run.flops;
    r.info = run.info;
    if (run.finish) run.finish(r.median(), r.info);
    r.peak_rss_mb = peak_rss_mb();
  }  // the stage's state is released here
  return r;
}

nlohmann::ordered_json result_json(const StageResult& r, int threads) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  const double med = r.median();
  j["stage"] = r.stage;
  j["runs"] = r.seconds.size();
  j["median_s"] = med;
  j["min_s"] = r.min();
  j["max_s"] = r.max();
  j["mean_s"] = r.seconds.empty() ? 0.0
                                  : std::accumulate(r.seconds.begin(), r.seconds.end(), 0.0) / r.seconds.size();
  j["setup_s"] = r.setup_s;
  j["threads"] = threads;
  j["isa"] = kern::detail::isa_name();  // the kernels' dispatch level (MM3_ISA may cap it)
  // Whole numbers print as integers (bytes and flops usually are).
  auto num = [](double v) -> nlohmann::ordered_json {
    if (v == std::floor(v) && v < 9e15) return static_cast<int64_t>(v);
    return v;
  };
  if (r.bytes > 0) {
    j["bytes"] = num(r.bytes);
    j["gb_per_s"] = med > 0 ? r.bytes / med / 1e9 : 0.0;
  }
  if (r.flops > 0) {
    j["flops"] = num(r.flops);
    j["gflop_per_s"] = med > 0 ? r.flops / med / 1e9 : 0.0;
  }
  j["peak_rss_mb"] = r.peak_rss_mb;
  j["peak_rss_scope"] = r.peak_rss_per_stage ? "stage" : "process";
  for (auto it = r.info.begin(); it != r.info.end(); ++it)
    if (!j.contains(it.key())) j[it.key()] = it.value();
  return j;
}

}  // namespace mm3::bench
