// bench_runner.cpp — the stage registry and the timing loop of `mm3 bench` (bench_stages.h).
// Timing: steady_clock around each call of a stage's `run`, after `warmup` untimed calls; the median
// is the reported figure. Peak RSS: the kernel's VmHWM after the stage, reset before setup through
// /proc/self/clear_refs ("5") when the kernel allows it, so it is the stage's own peak.
#include <immintrin.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <string>

#include "bench_stages.h"
#include "core/errors.h"
#include "core/tensor.h"
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

// (The earlier mem_bandwidth read, a uint64 sum that GCC compiled into one vpaddq chain over a
// std::vector, was 13-38% slower than this on Zen 5, so every floor computed from it was too generous.)
float stream_sum(const float* p, int64_t n) {
#if defined(__AVX512F__)
  __m512 a = _mm512_setzero_ps(), b = a, c = a, d = a;
  for (int64_t i = 0; i < n; i += 64) {
    a = _mm512_add_ps(a, _mm512_load_ps(p + i));
    b = _mm512_add_ps(b, _mm512_load_ps(p + i + 16));
    c = _mm512_add_ps(c, _mm512_load_ps(p + i + 32));
    d = _mm512_add_ps(d, _mm512_load_ps(p + i + 48));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(c, d)));
#else
  float acc[32] = {};
  for (int64_t i = 0; i < n; i += 32)
    for (int j = 0; j < 32; ++j) acc[j] += p[i + j];
  float s = 0;
  for (float x : acc) s += x;
  return s;
#endif
}

namespace {

using Clock = std::chrono::steady_clock;

// The memory_floor probe: two halves of 128 MiB (4x a Zen 5 CCD's L3), on huge pages like the
// weights, created once, before the first such stage's peak-RSS reset, and kept: its size is
// subtracted from every later peak_rss_mb.
constexpr int64_t kProbeFloats = int64_t(32) << 20;  // per half
const Tensor* g_probe = nullptr;

const Tensor& probe_buffer() {
  if (!g_probe) {
    auto* t = new Tensor(Tensor::empty(DType::F32, {2 * kProbeFloats}));  // lives for the process
    float* p = static_cast<float*>(t->raw());
    for (int64_t i = 0; i < 2 * kProbeFloats; ++i) p[i] = static_cast<float>(i & 1023);
    g_probe = t;
  }
  return *g_probe;
}

double probe_mb() { return g_probe ? double(g_probe->nbytes()) / 1e6 : 0.0; }

// GB/s of one read of probe half `h` over the pool, one contiguous piece per thread (as mem_bandwidth).
double probe_bandwidth(const ThreadPool& pool, int h) {
  const float* p = static_cast<const float*>(probe_buffer().raw()) + h * kProbeFloats;
  const int64_t per = (kProbeFloats / pool.size() + 63) / 64 * 64, pieces = (kProbeFloats + per - 1) / per;
  std::vector<float> part(static_cast<size_t>(pieces), 0.f);
  const auto t0 = Clock::now();
  pool.parallel_for(
      pieces,
      [&](int64_t b, int64_t e) {
        for (int64_t c = b; c < e; ++c)
          part[size_t(c)] = stream_sum(p + c * per, std::min(per, kProbeFloats - c * per));
      },
      1);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  volatile float sink = std::accumulate(part.begin(), part.end(), 0.f);  // keeps the reads observable
  (void)sink;
  return double(kProbeFloats) * 4 / s / 1e9;
}

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
  if (s.memory_floor) probe_buffer();  // before the reset: not part of the stage's peak
  r.peak_rss_per_stage = reset_peak_rss();
  {
    const auto t0 = Clock::now();
    StageRun run = s.setup(ctx);
    r.setup_s = since(t0);
    if (!run.run) throw InternalError(fmt::format("bench stage {}: setup returned no run function", s.name));
    // --alternate: each warm-up and timed run with its knob value; the knob's previous setting is
    // restored however the stage ends.
    const int before = opt.alternate ? kern::tuning::forced(opt.alternate->knob) : -1;
    struct Restore {
      const std::optional<Alternate>& alt;
      int value;
      ~Restore() {
        if (alt) kern::tuning::force(alt->knob, value);
      }
    } restore{opt.alternate, before};
    const int nv = opt.alternate ? static_cast<int>(opt.alternate->values.size()) : 1;
    auto set_variant = [&](int i) {
      if (opt.alternate) kern::tuning::force(opt.alternate->knob, opt.alternate->values[size_t(i % nv)]);
    };
    for (int i = 0; i < opt.warmup * nv; ++i) {
      set_variant(i);
      run.run();
    }
    // A probe before each run and one after the last. Each is the faster of two reads (one read's
    // dispatch and ramp-up only ever lower it) of different halves, so neither finds the other's
    // lines in a cache.
    auto probe = [&] {
      if (s.memory_floor)
        r.probe_gbps.push_back(std::max(probe_bandwidth(ctx.pool(), 0), probe_bandwidth(ctx.pool(), 1)));
    };
    for (int i = 0; i < opt.runs; ++i) {
      probe();
      set_variant(i);
      const auto t = Clock::now();
      run.run();
      r.seconds.push_back(since(t));
      if (opt.alternate) r.variant.push_back(i % nv);
    }
    r.alternate = opt.alternate;
    probe();
    r.bytes = run.bytes;
    r.flops = run.flops;
    r.info = run.info;
    if (run.finish) run.finish(r.median(), r.info);
    r.peak_rss_mb = peak_rss_mb() - probe_mb();
  }  // the stage's state is released here
  return r;
}

namespace {

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Run i against the floor of its own moment: the faster of the probes just before and just after it
// (a short probe read in a momentary slowdown would otherwise flatter the run).
std::vector<double> floor_ratios(const StageResult& r) {
  const std::vector<double>& bw = r.probe_gbps;
  std::vector<double> ratio;
  for (size_t i = 0; i < r.seconds.size() && i < bw.size(); ++i) {
    const double b = i + 1 < bw.size() ? std::max(bw[i], bw[i + 1]) : bw[i];
    ratio.push_back(r.seconds[i] * b * 1e9 / r.bytes);
  }
  return ratio;
}

}  // namespace

Alternate parse_alternate(std::string_view spec) {
  const size_t eq = spec.find('=');
  if (eq == std::string_view::npos || eq == 0)
    throw InvalidInput(fmt::format("--alternate '{}': expected KNOB=A,B (e.g. gemv_rows=1,4)", spec));
  Alternate a;
  a.name = std::string(spec.substr(0, eq));
  a.knob = kern::tuning::knob_from_name(a.name);
  std::string_view rest = spec.substr(eq + 1);
  while (true) {
    const size_t c = rest.find(',');
    const std::string item(rest.substr(0, c));
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0')
      throw InvalidInput(fmt::format("--alternate '{}': '{}' is not a whole number", spec, item));
    const int prev = kern::tuning::forced(a.knob);
    kern::tuning::force(a.knob, static_cast<int>(v));  // throws, naming the values the knob takes
    kern::tuning::force(a.knob, prev);
    a.values.push_back(static_cast<int>(v));
    if (c == std::string_view::npos) break;
    rest = rest.substr(c + 1);
  }
  if (a.values.size() < 2)
    throw InvalidInput(fmt::format("--alternate '{}': give at least two values to alternate", spec));
  return a;
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
  // How the bf16 pair dots run where the CPU has AVX512-BF16: "fma" (two FMAs a pair, where the probe
  // finds VDPBF16PS slow, or the knob bf16_dot=0), "vdpbf16ps"; absent without AVX512-BF16. The cost:
  // one VDPBF16PS's time over one FMA's (linear.cpp cpu_bf16_dot_slow: slow above 2.5).
  if (kern::detail::cpu_has_avx512bf16()) {
    j["bf16_dot"] = kern::detail::bf16_dot_fma() ? "fma" : "vdpbf16ps";
    j["bf16_dot_cost"] = std::round(kern::detail::bf16_dot_cost() * 100) / 100;  // the probe's time ratio
  }
  // How libgomp's threads (oneDNN's) wait between calls; the mm3 command sets PASSIVE when unset.
  const char* wait = std::getenv("OMP_WAIT_POLICY");
  j["omp_wait_policy"] = wait ? wait : "unset";
  // Whole numbers print as integers (bytes and flops usually are).
  auto num = [](double v) -> nlohmann::ordered_json {
    if (v == std::floor(v) && v < 9e15) return static_cast<int64_t>(v);
    return v;
  };
  if (r.bytes > 0) {
    j["bytes"] = num(r.bytes);
    j["gb_per_s"] = med > 0 ? r.bytes / med / 1e9 : 0.0;
  }
  if (!r.probe_gbps.empty() && r.bytes > 0) {
    j["mem_probe_gb_per_s"] = median_of(r.probe_gbps);
    j["vs_floor"] = median_of(floor_ratios(r));
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

std::vector<nlohmann::ordered_json> result_jsons(const StageResult& r, int threads) {
  if (!r.alternate || r.variant.size() != r.seconds.size()) return {result_json(r, threads)};
  const Alternate& alt = *r.alternate;
  const size_t nv = alt.values.size();
  const std::vector<double> ratios = r.probe_gbps.empty() || r.bytes <= 0 ? std::vector<double>{} : floor_ratios(r);
  std::vector<nlohmann::ordered_json> out;
  for (size_t v = 0; v < nv; ++v) {
    StageResult one = r;  // this value's runs, without the probes (vs_floor from the whole run's pairing)
    one.alternate.reset();
    one.variant.clear();
    one.seconds.clear();
    one.probe_gbps.clear();
    std::vector<double> fl, rel;
    for (size_t i = 0; i < r.seconds.size(); ++i) {
      if (size_t(r.variant[i]) != v) continue;
      one.seconds.push_back(r.seconds[i]);
      if (i < ratios.size()) fl.push_back(ratios[i]);
      // The same cycle's run of the first value: runs i - v .. i - v + nv - 1 form one cycle.
      const size_t first = i - v;
      if (size_t(r.variant[first]) == 0 && r.seconds[first] > 0) rel.push_back(r.seconds[i] / r.seconds[first]);
    }
    nlohmann::ordered_json j = result_json(one, threads);
    j["alternate"] = fmt::format("{}={}", alt.name, alt.values[v]);
    if (!fl.empty()) {
      j["mem_probe_gb_per_s"] = median_of(r.probe_gbps);
      j["vs_floor"] = median_of(fl);
    }
    j["ratio_to_first"] = median_of(rel);
    out.push_back(std::move(j));
  }
  return out;
}

}  // namespace mm3::bench
