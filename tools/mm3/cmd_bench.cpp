// cmd_bench.cpp — `mm3 bench`: runs the registered benchmark stages (bench/bench_stages.h) and prints
// one JSON object per line on stdout (ARCHITECTURE.md habit 12), plus a readable table on stderr
// unless --json. Stages live in bench/*.cpp; see bench_stages.h for how to add one.
#include <algorithm>
#include <cstdio>
#include <set>

#include "../../bench/bench_stages.h"
#include "commands.h"
#include "core/errors.h"
#include "core/thread_pool.h"
#include "kernels/tuning.h"
#include "model/synth_checkpoint.h"

namespace mm3::cli {
namespace {

constexpr const char* kDefaultFull = "/work/synth/full";

struct BenchArgs {
  std::string model, full_dir;
  CLI::Option* full_opt = nullptr;
  int runs = 5, warmup = 1, threads = 0;
  std::vector<std::string> stage_filter;
  std::string alternate;
  bool json_only = false, list = false;
};

std::string fmt_rate(double v) { return v > 0 ? fmt::format("{:.1f}", v) : "-"; }

// "gemv_rows=1,4,8,12; ..." from kern::tuning::knobs(), for --alternate's help.
std::string knob_list() {
  std::string s;
  for (const kern::tuning::KnobInfo& k : kern::tuning::knobs()) {
    s += fmt::format("{}{}=", s.empty() ? "" : "; ", k.name);
    for (size_t i = 0; i < k.values.size(); ++i) s += fmt::format("{}{}", i ? "," : "", k.values[i]);
  }
  return s;
}

void print_table_row(const bench::StageResult& r) {
  const double med = r.median();
  std::fprintf(stderr, "%-36s %4zu %11.3f %11.3f %11.3f %9s %10s %9.0f\n", r.stage.c_str(), r.seconds.size(),
               med * 1e3, r.min() * 1e3, r.max() * 1e3, fmt_rate(r.bytes > 0 && med > 0 ? r.bytes / med / 1e9 : 0).c_str(),
               fmt_rate(r.flops > 0 && med > 0 ? r.flops / med / 1e9 : 0).c_str(), r.peak_rss_mb);
}

int run_bench(const BenchArgs& a) {
  auto all = bench::stages();
  std::sort(all.begin(), all.end(), [](const bench::Stage& x, const bench::Stage& y) { return x.name < y.name; });
  if (a.list) {
    for (const auto& s : all)
      std::printf("%-36s %s%s\n", s.name.c_str(), s.needs_model ? "[model] " : "", s.description.c_str());
    return 0;
  }
  std::vector<const bench::Stage*> chosen;
  const std::set<std::string> want(a.stage_filter.begin(), a.stage_filter.end());
  for (const auto& w : want) {
    bool known = false;
    for (const auto& s : all) known |= s.name == w;
    if (!known) {
      std::string names;
      for (const auto& s : all) names += "\n  " + s.name;
      throw InvalidInput(fmt::format("bench: no stage named '{}'; the stages are:{}", w, names));
    }
  }
  for (const auto& s : all)
    if (want.empty() || want.count(s.name)) chosen.push_back(&s);

  std::string model = a.model;
  if (a.full_opt && a.full_opt->count() > 0) {
    if (!model.empty()) throw InvalidInput("bench: give --model or --full, not both");
    model = a.full_dir.empty() ? kDefaultFull : a.full_dir;
  }
  if (model.empty())
    if (auto g = synth::find_golden_checkpoint()) model = *g;

  ThreadPool pool(a.threads);
  bench::BenchContext ctx(pool, model);
  bench::RunOptions opt{a.runs, a.warmup, std::nullopt};
  if (!a.alternate.empty()) {
    opt.alternate = bench::parse_alternate(a.alternate);
    if (a.runs < 2 * static_cast<int>(opt.alternate->values.size()))
      throw InvalidInput(fmt::format("bench: --alternate {} needs --runs >= {} (two cycles); 20 or more tell 5% apart",
                                     a.alternate, 2 * opt.alternate->values.size()));
  }
  if (!a.json_only) {
    std::fprintf(stderr, "mm3 bench: %zu stage(s), %d run(s) each after %d warm-up, %d thread(s), model %s\n",
                 chosen.size(), a.runs, a.warmup, pool.size(), model.empty() ? "(none)" : model.c_str());
    std::fprintf(stderr, "%-36s %4s %11s %11s %11s %9s %10s %9s\n", "stage", "runs", "median ms", "min ms", "max ms",
                 "GB/s", "GFLOP/s", "peak MB");
  }
  int failed = 0;
  for (const bench::Stage* s : chosen) {
    try {
      const bench::StageResult r = bench::run_stage(*s, ctx, opt);
      for (auto& j : bench::result_jsons(r, pool.size())) {
        if (s->needs_model) j["model"] = model;
        std::printf("%s\n", j.dump().c_str());
        if (!a.json_only && j.contains("alternate"))
          std::fprintf(stderr, "%-36s %s: median %.3f ms, %.3f x the first value's time (median of the cycles)\n",
                       r.stage.c_str(), j["alternate"].get<std::string>().c_str(), j["median_s"].get<double>() * 1e3,
                       j["ratio_to_first"].get<double>());
      }
      std::fflush(stdout);
      if (!a.json_only && !opt.alternate) print_table_row(r);
    } catch (const Cancelled&) {
      throw;
    } catch (const std::exception& e) {
      ++failed;
      std::fprintf(stderr, "mm3 bench: stage %s failed: %s\n", s->name.c_str(), e.what());
    }
  }
  if (failed) std::fprintf(stderr, "mm3 bench: %d stage(s) failed (no numbers printed for them)\n", failed);
  return failed ? 1 : 0;
}

RegisterCommand reg{
    {"bench", 70,
     [](CLI::App& sub) -> std::function<int()> {
       auto a = std::make_shared<BenchArgs>();
       sub.add_option("--model", a->model,
                      "checkpoint folder for the model stages (default: the golden tiny checkpoint)");
       a->full_opt = sub.add_option("--full", a->full_dir,
                                    "use the full-size synthetic checkpoint: --full alone means /work/synth/full "
                                    "(write it with `mm3 synth-checkpoint --full`), --full DIR another folder")
                         ->expected(0, 1);
       sub.add_option("--runs", a->runs, "timed runs per stage; the median is reported (default 5)");
       sub.add_option("--warmup", a->warmup, "untimed runs before timing (default 1)");
       sub.add_option("--stage", a->stage_filter, "only this stage (repeatable; see --list)");
       sub.add_flag("--json", a->json_only, "JSON lines only (no table on stderr)");
       sub.add_flag("--list", a->list, "list the stages and exit");
       sub.add_option("-t,--threads", a->threads, "threads (default: all cores)");
       sub.add_option("--alternate", a->alternate,
                      "KNOB=A,B: run i of each stage with the kernel knob KNOB at the (i mod n)-th value, and report "
                      "each value's runs apart; -1 is the kernel's own choice (knobs: " +
                          knob_list() + "; src/kernels/tuning.h)");
       sub.footer(
           "Prints one JSON object per stage on stdout: stage, runs, median_s, min_s, max_s, mean_s, setup_s,\n"
           "threads, bytes + gb_per_s and flops + gflop_per_s where meaningful, peak_rss_mb (the stage's own\n"
           "high-water mark when the kernel allows resetting it: peak_rss_scope \"stage\"), isa (the kernels'\n"
           "dispatch level), on AVX512-BF16 CPUs bf16_dot (\"fma\" where the bf16 pair dots run as two FMAs\n"
           "each, \"vdpbf16ps\") and bf16_dot_cost (the probe's VDPBF16PS time over an FMA's; slow above 2.5),\n"
           "and stage fields.\n"
           "Memory-bound stages (AR frames and steps, streaming GEMVs, decode attention) also read a 128 MiB\n"
           "probe before each run and after the last, and report mem_probe_gb_per_s (median) and vs_floor:\n"
           "the median of run seconds x GB/s / bytes with the faster probe beside the run, i.e. each run\n"
           "against the memory floor of its own moment.\n"
           "--alternate KNOB=A,B compares forms of a kernel that give the same bits inside one process, run\n"
           "by run (a shared host's memory moves too much between processes to tell 5-10% apart): one\n"
           "object per value, with \"alternate\" and \"ratio_to_first\" (the median over the cycles of its\n"
           "run time / the first value's in the same cycle; below 1: faster).\n"
           "A stage that cannot run is reported on stderr without a number; the exit code is then 1.\n\n"
           "Examples:\n  mm3 bench --list\n  mm3 bench --stage mem_bandwidth --stage gemv_bf16_4096x12288_m2\n"
           "  mm3 bench --full --json > bench.jsonl\n"
           "  mm3 bench --full --stage ar_frame --runs 20 --alternate gemv_rows=1,4");
       return [a]() { return run_bench(*a); };
     },
     "time kernels and model stages; JSON lines with medians"}};

}  // namespace
}  // namespace mm3::cli
