// cmd_quantize.cpp — `mm3 quantize IN_CKPT OUT_DIR --type int8|q4`: writes the quantized LM and
// depth-decoder weights as sidecar files (model/quant_weights.h; format in kernels/quant.h) without
// touching the bf16 checkpoint files.
//
// OUT_DIR == IN_CKPT: the sidecars go to IN_CKPT/mm3-quant/<type>/ and the checkpoint keeps loading as
// bf16 unless a quantized run is asked for (`mm3 bench` quant stages, `mm3 verify --quant`, or
// PipelineOptions::ar_quant). A new OUT_DIR: it becomes a checkpoint of its own — every entry of
// IN_CKPT linked (symlinks to the original files), the sidecars, and mm3-quant/default.json naming the
// type, so `mm3 generate --model OUT_DIR` runs quantized with no other flag.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/errors.h"
#include "core/thread_pool.h"
#include "model/checkpoint.h"
#include "model/qwen3_lm.h"
#include "model/rvq_depth.h"

namespace mm3::cli {
namespace {

namespace fs = std::filesystem;

struct QuantArgs {
  std::string in, out, type;
  int threads = 0;
};

// Links every entry of `in` (except an mm3-quant folder) into `out`; an existing link to the same
// target is kept, anything else in the way is an error.
void link_checkpoint(const fs::path& in, const fs::path& out) {
  fs::create_directories(out);
  for (const auto& e : fs::directory_iterator(in)) {
    const std::string name = e.path().filename().string();
    if (name == kQuantDirName) continue;
    const fs::path target = fs::absolute(e.path()), link = out / name;
    if (fs::is_symlink(link)) {
      if (fs::read_symlink(link) == target) continue;
      throw InvalidInput(fmt::format("quantize: {} already links to {}, not {}", link.string(),
                                     fs::read_symlink(link).string(), target.string()));
    }
    if (fs::exists(link)) throw InvalidInput(fmt::format("quantize: {} already exists (not a link to {})", link.string(), target.string()));
    fs::create_symlink(target, link);
  }
}

struct ComponentResult {
  std::string name, file;
  size_t tensors = 0;
  double quant_bytes = 0, source_bytes = 0, seconds = 0;
};

template <class Model>
ComponentResult write_component(const Checkpoint& ck, const std::string& component, QuantType t,
                                const ThreadPool& pool, const fs::path& qdir, const std::string& in_dir) {
  const auto t0 = std::chrono::steady_clock::now();
  std::fprintf(stderr, "quantize: %s -> %s ...\n", component.c_str(), kern::quant_name(t));
  // Quantizes the bf16 weights at load (or maps IN's own sidecar of this type: the same bytes, the
  // quantizer being deterministic).
  auto model = Model::load(ck, t, &pool);
  ComponentResult r;
  r.name = component;
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> md = {{"mm3_quant_format", kQuantFormatVersion},
                                           {"mm3_quant_type", kern::quant_name(t)},
                                           {"mm3_component", component},
                                           {"mm3_source", in_dir},
                                           {"mm3_layout", "src/kernels/quant.h"}};
  for (const auto& [key, w] : model->linears()) {
    append_quant_tensors(key, *w, tensors, md);
    r.quant_bytes += static_cast<double>(w->weight_bytes());
  }
  r.tensors = tensors.size();
  const TensorStore& st = ck.store(component);
  r.source_bytes = static_cast<double>(st.total_bytes());
  const fs::path file = qdir / (component + ".safetensors");
  write_safetensors(file.string(), tensors, md);
  r.file = file.string();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

int run_quantize(const QuantArgs& a) {
  const auto t = kern::quant_from_name(a.type);
  if (!t || *t == QuantType::None) throw InvalidInput(fmt::format("quantize: --type '{}': use int8 or q4", a.type));
  const fs::path in = fs::absolute(a.in), out = fs::absolute(a.out);
  if (!fs::is_directory(in)) throw BadModel(fmt::format("quantize: {} is not a checkpoint folder", in.string()));
  const bool same = fs::exists(out) && fs::equivalent(in, out);
  Checkpoint ck(in.string());  // validates the configs first
  if (!same) link_checkpoint(in, out);
  const fs::path qdir = out / kQuantDirName / kern::quant_name(*t);
  fs::create_directories(qdir);
  ThreadPool pool(a.threads);

  // Rerun in place: drop the old sidecars first so the weights are quantized afresh from the bf16 files.
  for (const char* c : {"language_model", "rvq_depth_decoder"}) fs::remove(qdir / (std::string(c) + ".safetensors"));
  std::vector<ComponentResult> res;
  res.push_back(write_component<Qwen3Lm>(ck, "language_model", *t, pool, qdir, in.string()));
  ck.release("language_model");
  res.push_back(write_component<RvqDepth>(ck, "rvq_depth_decoder", *t, pool, qdir, in.string()));
  ck.release("rvq_depth_decoder");

  const QuantPlan plan = quant_plan(*t);
  nlohmann::ordered_json j;
  j["format"] = kQuantFormatVersion;
  j["type"] = kern::quant_name(*t);
  j["layout"] = "src/kernels/quant.h: blocks of 32 along K, 16 blocks per 512-weight superblock; int8: fp16 scale; "
                "q4: fp16 scale + fp16 minimum";
  j["body"] = kern::quant_name(plan.body);
  j["heads"] = kern::quant_name(plan.heads);
  j["kept"] = "embeddings (embed_tokens, audio_embeddings, pos_embedding), norms, and the unsampleable lm_head rows "
              "(never computed) are read from the original bf16 files";
  j["source"] = in.string();
  for (const auto& r : res)
    j["components"][r.name] = {{"file", fs::path(r.file).filename().string()},
                               {"tensors", r.tensors},
                               {"quantized_bytes", r.quant_bytes},
                               {"source_bytes", r.source_bytes}};
  std::ofstream(qdir / "quant.json") << j.dump(2) << "\n";
  if (!same) std::ofstream(out / kQuantDirName / "default.json") << nlohmann::json{{"type", kern::quant_name(*t)}}.dump() << "\n";

  // Read back through the loader (sidecar path): every key and shape is checked.
  Checkpoint back(out.string());
  Qwen3Lm::load(back, *t, &pool);
  RvqDepth::load(back, *t, &pool);
  for (const auto& r : res)
    std::printf("%s: %zu tensors, %.3f GB quantized Linear weights (component files %.3f GB bf16) -> %s (%.1f s)\n",
                r.name.c_str(), r.tensors, r.quant_bytes / 1e9, r.source_bytes / 1e9, r.file.c_str(), r.seconds);
  std::printf("wrote %s (%s%s)\n", (out / kQuantDirName / kern::quant_name(*t)).string().c_str(), kern::quant_name(*t),
              same ? "; the checkpoint still loads bf16 by default" : "; default of this checkpoint folder");
  return 0;
}

RegisterCommand reg{
    {"quantize", 75,
     [](CLI::App& sub) -> std::function<int()> {
       auto a = std::make_shared<QuantArgs>();
       sub.add_option("IN_CKPT", a->in, "checkpoint folder (bf16 language_model/ and rvq_depth_decoder/)")->required();
       sub.add_option("OUT_DIR", a->out, "output folder: IN_CKPT itself, or a new folder")->required();
       sub.add_option("--type", a->type, "int8 or q4")->required();
       sub.add_option("-t,--threads", a->threads, "threads (default: all cores)");
       sub.footer(
           "Quantizes the LM's layer Linears and the depth decoder's projection + layer Linears to --type, and\n"
           "the LM's 16385 sampleable lm_head rows and the 7 depth audio heads to int8 (src/kernels/quant.h,\n"
           "src/model/quant_weights.h). Embeddings and norms stay bf16 and are read from the original files,\n"
           "which are never modified. Writes OUT_DIR/mm3-quant/<type>/{language_model,rvq_depth_decoder}\n"
           ".safetensors and quant.json. With a new OUT_DIR, every entry of IN_CKPT is linked into it and\n"
           "OUT_DIR/mm3-quant/default.json makes it load quantized by default (mm3 generate --model OUT_DIR).\n\n"
           "Examples:\n  mm3 quantize /work/synth/full /work/synth/full-int8 --type int8\n"
           "  mm3 quantize ckpt ckpt --type q4        # sidecar inside ckpt; still bf16 by default");
       return [a]() { return run_quantize(*a); };
     },
     "write int8 / 4-bit LM + depth-decoder weights next to a checkpoint"}};

}  // namespace
}  // namespace mm3::cli
