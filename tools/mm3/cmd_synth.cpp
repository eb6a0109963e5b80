// cmd_synth.cpp — `mm3 synth-checkpoint --tiny|--full OUT`: writes a random-weight checkpoint in the
// exact layout of the real MiniMax-Music3 one (MODEL.md §1.1–1.7; see model/synth_checkpoint.h).
#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "core/errors.h"
#include "core/thread_pool.h"
#include "model/synth_checkpoint.h"

namespace mm3::cli {
namespace {

namespace fs = std::filesystem;

struct SynthArgs {
  std::string out;
  bool tiny = false, full = false, force = false, quiet = false, dry_run = false;
  uint64_t seed = 0;
  std::string tokenizer_from;
  int threads = 0;
  int spot_checks = 8;
};

void print_plan(const synth::SynthPlan& p) {
  std::printf("%s checkpoint plan (seed %llu):\n", p.dims.size_name.c_str(), static_cast<unsigned long long>(p.seed));
  for (const auto& c : p.components) {
    std::printf("  %-18s %-4s %4zu tensors %14lld params\n", c.name.c_str(), dtype_name(c.dtype), c.tensors.size(),
                static_cast<long long>(c.params()));
    for (const auto& f : c.files)
      std::printf("    %-52s %4zu tensors %15llu bytes\n", f.name.c_str(), f.tensors.size(),
                  static_cast<unsigned long long>(f.file_bytes()));
    if (!c.index_name.empty()) std::printf("    %s\n", c.index_name.c_str());
  }
  std::printf("  weights: %llu bytes (%.2f GB)\n", static_cast<unsigned long long>(p.weight_file_bytes()),
              p.weight_file_bytes() / 1e9);
}

int run_synth(const SynthArgs& a) {
  if (a.tiny == a.full) throw InvalidInput("synth-checkpoint: give exactly one of --tiny or --full");
  const synth::SynthPlan plan = synth::make_plan(a.tiny ? synth::SynthDims::tiny() : synth::SynthDims::full(), a.seed);
  if (a.dry_run) {
    print_plan(plan);
    return 0;
  }
  synth::WriteOptions opt;
  opt.force = a.force;
  opt.progress = !a.quiet;
  opt.spot_checks = a.spot_checks;
  if (!a.tokenizer_from.empty()) {
    opt.tokenizer_from = a.tokenizer_from;
  } else if (auto g = synth::find_golden_checkpoint()) {
    opt.tokenizer_from = (fs::path(*g) / "tokenizer").string();
  } else {
    throw InvalidInput(
        "synth-checkpoint: no tokenizer source found (looked for ../shared/golden/v1/checkpoint/tokenizer next to "
        "the repository); pass --tokenizer-from DIR, a folder holding tokenizer.json and tokenizer_config.json");
  }
  ThreadPool pool(a.threads);
  const synth::WriteResult r = synth::write_checkpoint(plan, a.out, opt, pool);
  std::printf("wrote %s (%s, seed %llu): %d files, %.2f GB in %.1f s (%.0f MB/s); validated in %.1f s "
              "(tokenizer from %s)\n",
              a.out.c_str(), plan.dims.size_name.c_str(), static_cast<unsigned long long>(a.seed), r.files,
              r.bytes / 1e9, r.seconds, r.seconds > 0 ? r.bytes / r.seconds / 1e6 : 0.0, r.validate_seconds,
              opt.tokenizer_from.c_str());
  return 0;
}

RegisterCommand reg{
    {"synth-checkpoint", 80,
     [](CLI::App& sub) -> std::function<int()> {
       auto a = std::make_shared<SynthArgs>();
       sub.add_option("OUT", a->out, "output folder (created; must be empty unless --force)")->required();
       sub.add_flag("--tiny", a->tiny, "the golden tiny dims (hidden 64, vocab 168100; ~60 MB)");
       sub.add_flag("--full", a->full, "the real dims (MODEL.md §1.1; ~28.6 GB on disk)");
       sub.add_option("--seed", a->seed, "value seed (default 0)");
       sub.add_option("--tokenizer-from", a->tokenizer_from,
                      "folder with tokenizer.json + tokenizer_config.json to copy (default: the golden "
                      "checkpoint's tokenizer, ../shared/golden/v1/checkpoint/tokenizer)");
       sub.add_flag("--force", a->force, "write into a non-empty OUT, overwriting the files the layout names");
       sub.add_flag("-q,--quiet", a->quiet, "no progress lines on stderr");
       sub.add_flag("--dry-run", a->dry_run, "print the files, tensor counts and byte sizes; write nothing");
       sub.add_option("--spot-checks", a->spot_checks, "values re-checked per tensor after writing (default 8)");
       sub.add_option("-t,--threads", a->threads, "threads generating values (default: all cores)");
       sub.footer(
           "Writes modular_model_index.json and the component folders language_model/ (BF16, sharded at 5 GB\n"
           "like the real one: 4 shards + index), rvq_depth_decoder/ (BF16), condition_encoder/, transformer/\n"
           "(F32; 2 shards + index), vocoder/ (F32, weight_g/weight_v pairs), scheduler/ and tokenizer/. Names,\n"
           "shapes, dtypes, configs and file sizes are those of the real checkpoint (--full) or of the golden\n"
           "tiny one (--tiny); values are deterministic random numbers of a sane scale. Streams with bounded\n"
           "memory; each file is written as .partial and renamed; the model index comes last. The result is\n"
           "opened with the checkpoint loader and checked against the plan before the command returns.\n\n"
           "Examples:\n  mm3 synth-checkpoint --tiny /tmp/tiny\n  mm3 synth-checkpoint --full /work/synth/full\n"
           "  mm3 synth-checkpoint --full --dry-run x");
       return [a]() { return run_synth(*a); };
     },
     "write a random-weight checkpoint in the real layout (--tiny or --full)"}};

}  // namespace
}  // namespace mm3::cli
