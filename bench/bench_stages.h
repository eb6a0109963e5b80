// bench_stages.h — the stage registry behind `mm3 bench` (ARCHITECTURE.md habit 12: benchmarks print
// machine-readable JSON with medians). A stage is a named, repeatable unit of work: `setup` prepares
// everything (untimed, though its duration is reported), `run` is what gets timed.
//
// Every bench/*.cpp file is compiled into the mm3 binary and registers its stages with a static
// RegisterStage object, so adding a stage never touches the runner or CMake. To add one, create your
// own file, e.g. bench/stage_ar.cpp:
//
//   // stage_ar.cpp — AR benchmarks: one LM decode step of the [cond, uncond] batch (MODEL.md §2.4).
//   #include "bench_stages.h"
//   #include "model/qwen3_lm.h"
//
//   namespace mm3::bench {
//   namespace {
//   RegisterStage reg_ar_frame{{
//       .name = "ar_frame",
//       .description = "one LM decode step, batch 2, KV length 1000",
//       .needs_model = true,                      // uses ctx.checkpoint(): --model / --full
//       .setup = [](const BenchContext& ctx) {
//         auto st = std::make_shared<ArState>(ctx.checkpoint(), ctx.pool());  // load, allocate, prefill
//         StageRun r;
//         r.run = [st] { st->decode_one(); };     // the timed work, called warmup + runs times
//         r.bytes = st->weight_bytes();           // bytes one run must stream (0: not meaningful)
//         r.flops = st->flops_per_step();         // flops of one run (0: not meaningful)
//         r.info = {{"kv_len", 1000}};            // extra fields for the JSON line
//         return r;
//       }}};
//   }  // namespace
//   }  // namespace mm3::bench
//
// Rules for a stage:
// * Do all loading and allocation in setup; keep state alive by capturing shared_ptrs in `run`.
//   Everything is released when the StageRun is destroyed, before the next stage starts, so each
//   stage's peak RSS is its own.
// * Each call of `run` does the same work (reset what it consumes, e.g. rewind a KV cache position).
// * `bytes` / `flops` describe ONE run; the runner derives gb_per_s / gflop_per_s from the median.
//   Say in `description` what `bytes` counts (weights only, or all compulsory traffic).
// * A stage that cannot run (no model, model too small, kernel missing) throws an mm3 error with the
//   reason; the runner reports it on stderr and prints no number for it. Never fake a measurement.
// * Model stages should reuse the golden cases' shapes (a DiT window is 690 tokens, a vocoder window
//   689 latents) so numbers compare across machines and against the goldens.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/tuning.h"
#include "model/checkpoint.h"

namespace mm3::bench {

// What a stage's setup can use. The checkpoint is opened on first use, so kernel-only runs never
// touch a model folder.
class BenchContext {
 public:
  BenchContext(const ThreadPool& pool, std::string model_dir) : pool_(pool), model_dir_(std::move(model_dir)) {}
  const ThreadPool& pool() const { return pool_; }
  // The --model folder ("" when none was given and the golden checkpoint was not found).
  const std::string& model_dir() const { return model_dir_; }
  // Throws InvalidInput when no model folder is known; BadModel when it is not a checkpoint.
  const Checkpoint& checkpoint() const;

 private:
  const ThreadPool& pool_;
  std::string model_dir_;
  mutable std::unique_ptr<Checkpoint> ckpt_;
};

// A prepared stage: the timed closure and what one call of it does.
struct StageRun {
  std::function<void()> run;
  double bytes = 0;                          // bytes one run streams (see the stage's description)
  double flops = 0;                          // floating-point operations of one run
  nlohmann::json info = nlohmann::json::object();  // extra fields copied into the JSON line
  // Optional: called once after the timed runs with their median, to add fields that derive from the
  // timings (e.g. audio seconds per wall second) to the result's copy of `info`.
  std::function<void(double median_s, nlohmann::json& info)> finish;
};

struct Stage {
  std::string name;         // unique; [a-z0-9_]; shape in the name when it is fixed
  std::string description;  // one line: what is timed and what `bytes` counts
  bool needs_model = false;
  // Bounded by memory: `bytes` / bandwidth is the stage's limit. The runner then reads a 128 MiB probe
  // buffer before each timed run and after the last (the host's bandwidth drifts by tens of percent
  // within minutes, so a floor from a mem_bandwidth stage run minutes apart is not this run's) and
  // reports mem_probe_gb_per_s (median of the probes) and vs_floor: the median over runs of
  // seconds x GB/s / bytes, with the faster of the probes just before and just after the run.
  bool memory_floor = false;
  std::function<StageRun(const BenchContext&)> setup;
};

// Every registered stage, in registration order (sorted by name by the runner for stable output).
std::vector<Stage>& stages();

struct RegisterStage {
  explicit RegisterStage(Stage s);
};

// ---- the runner (bench_runner.cpp) ----

// --alternate KNOB=A,B[,...]: run i of a stage runs with the same-bits kernel knob (kernels/tuning.h)
// forced to values[i % n], so the forms are compared run by run inside one process.
struct Alternate {
  kern::tuning::Knob knob{};
  std::string name;
  std::vector<int> values;
};
// Parses "KNOB=A,B[,...]" (InvalidInput, saying what is wrong, for anything else).
Alternate parse_alternate(std::string_view spec);

struct RunOptions {
  int runs = 5;
  int warmup = 1;
  std::optional<Alternate> alternate;
};

struct StageResult {
  std::string stage;
  std::vector<double> seconds;  // one per timed run
  std::vector<double> probe_gbps;  // memory_floor stages: the probe's bandwidth before each run and after the last
  double setup_s = 0;
  double bytes = 0, flops = 0;
  double peak_rss_mb = 0;
  bool peak_rss_per_stage = false;  // true when the kernel let us reset the high-water mark first
  nlohmann::json info = nlohmann::json::object();
  std::optional<Alternate> alternate;
  std::vector<int> variant;  // with alternate: the index into alternate->values of each timed run
  double median() const;
  double min() const;
  double max() const;
};

// Sum of n floats (n a multiple of 64) read as the fastest plain stream we write: 64-byte loads into
// four accumulators (AVX-512 where built for it). mem_bandwidth's read and the runner's probe.
float stream_sum(const float* p, int64_t n);

// Sets up, warms up and times one stage. Exceptions from setup or run propagate.
StageResult run_stage(const Stage& s, const BenchContext& ctx, const RunOptions& opt);

// The JSON object of one result: stage, runs, median_s, min_s, max_s, mean_s, setup_s, threads,
// bytes + gb_per_s and flops + gflop_per_s when non-zero, mem_probe_gb_per_s + vs_floor for
// memory_floor stages, peak_rss_mb (+ peak_rss_scope), info fields.
nlohmann::ordered_json result_json(const StageResult& r, int threads);
// With --alternate, one object per knob value (that value's runs; vs_floor against each run's own
// probes), each with "alternate": "KNOB=V" and "ratio_to_first": the median over the cycles of this
// value's run time ÷ the first value's in the same cycle. Otherwise {result_json(r)}.
std::vector<nlohmann::ordered_json> result_jsons(const StageResult& r, int threads);

}  // namespace mm3::bench
