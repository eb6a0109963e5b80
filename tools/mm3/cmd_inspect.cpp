// cmd_inspect.cpp — `mm3 inspect MODEL_DIR`: validates a checkpoint and describes it.
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/errors.h"
#include "model/checkpoint.h"

namespace mm3::cli {
namespace {

namespace fs = std::filesystem;

std::string human_bytes(uint64_t b) {
  const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int i = 0;
  while (v >= 1024 && i < 4) v /= 1024, ++i;
  return i ? fmt::format("{:.2f} {}", v, u[i]) : fmt::format("{} B", b);
}

std::string human_count(int64_t n) {
  if (n >= 1000000000) return fmt::format("{:.2f} B", n / 1e9);
  if (n >= 1000000) return fmt::format("{:.2f} M", n / 1e6);
  if (n >= 1000) return fmt::format("{:.1f} K", n / 1e3);
  return std::to_string(n);
}

std::string config_summary(const std::string& comp, const ModelConfigs& c) {
  if (comp == "language_model")
    return fmt::format("Qwen3: {} layers, hidden {}, heads {}/{} kv, head_dim {}, ffn {}, vocab {}, rope theta {:g}",
                       c.lm.num_hidden_layers, c.lm.hidden_size, c.lm.num_attention_heads, c.lm.num_key_value_heads,
                       c.lm.head_dim, c.lm.intermediate_size, c.lm.vocab_size, c.lm.rope_theta);
  if (comp == "rvq_depth_decoder")
    return fmt::format("{} layers, hidden {}, {} heads (head_dim {}), ffn {}, {} codebooks x {}", c.depth.num_layers,
                       c.depth.hidden_size, c.depth.num_attention_heads, c.depth.head_dim(), c.depth.intermediate_size,
                       c.depth.num_codebooks, c.depth.audio_vocab_size);
  if (comp == "condition_encoder")
    return fmt::format("{} layers x {} -> conv k3 -> {}, {} Hz/{} -> {} Hz/{}", c.cond.num_condition_layers,
                       c.cond.condition_hidden_dim, c.cond.out_dim, c.cond.input_sampling_rate, c.cond.input_hop_length,
                       c.cond.output_sampling_rate, c.cond.output_hop_length);
  if (comp == "transformer")
    return fmt::format("DiT: {} layers, {} heads x {}, ff {}, rotary {}, fourier {}, latent {}, condition {}",
                       c.dit.num_layers, c.dit.num_attention_heads, c.dit.attention_head_dim, c.dit.ff_inner_dim,
                       c.dit.rotary_dim, c.dit.fourier_embedding_dim, c.dit.in_channels, c.dit.condition_dim);
  if (comp == "vocoder") {
    std::string r;
    for (int x : c.vocoder.upsampling_ratios) r += (r.empty() ? "" : "x") + std::to_string(x);
    return fmt::format("latent {} -> {} -> {}, upsampling {} = {}, {} Hz", c.vocoder.latent_channels,
                       c.vocoder.decoder_input_dim, c.vocoder.decoder_hidden_dim, r, c.vocoder.hop(),
                       c.vocoder.sampling_rate);
  }
  return "";
}

int run_inspect(const std::string& dir, bool list_tensors) {
  Checkpoint ck(dir);
  const ModelConfigs& c = ck.configs();
  std::printf("checkpoint %s\n  pipeline %s\n", dir.c_str(), c.index.class_name.c_str());
  uint64_t total_bytes = 0;
  int64_t total_params = 0;
  for (const auto& comp : c.index.components) {
    if (comp.name == "scheduler") {
      std::printf("\n%-18s %s (%s): Euler flow matching, shift %g, invert_sigmas %s\n", comp.name.c_str(),
                  comp.class_name.c_str(), comp.library.c_str(), c.scheduler.shift,
                  c.scheduler.invert_sigmas ? "true" : "false");
      continue;
    }
    if (comp.name == "tokenizer") {
      const fs::path tj = fs::path(dir) / "tokenizer" / "tokenizer.json";
      if (!fs::exists(tj)) throw BadModel(fmt::format("{}: missing", tj.string()));
      nlohmann::json j;
      try {
        std::ifstream in(tj);
        j = nlohmann::json::parse(in);
      } catch (const nlohmann::json::exception& e) {
        throw BadModel(fmt::format("{}: not valid JSON ({})", tj.string(), e.what()));
      }
      const auto& model = j.value("model", nlohmann::json::object());
      std::printf("\n%-18s %s (%s): %s, %zu vocab, %zu merges, %zu added tokens, %s\n", comp.name.c_str(),
                  comp.class_name.c_str(), comp.library.c_str(), model.value("type", "?").c_str(),
                  model.value("vocab", nlohmann::json::object()).size(),
                  model.value("merges", nlohmann::json::array()).size(),
                  j.value("added_tokens", nlohmann::json::array()).size(),
                  human_bytes(fs::file_size(tj)).c_str());
      continue;
    }
    const TensorStore& st = ck.store(comp.name);
    std::map<std::string, int64_t> dtype_params;
    for (const auto& n : st.names()) dtype_params[dtype_name(st.info(n).dtype)] += shape_numel(st.info(n).shape);
    std::string dts;
    for (const auto& [d, p] : dtype_params) dts += (dts.empty() ? "" : ", ") + d;
    std::printf("\n%-18s %s (%s)\n", comp.name.c_str(), comp.class_name.c_str(), comp.library.c_str());
    std::printf("  %s\n", config_summary(comp.name, c).c_str());
    std::printf("  %zu tensors, %s parameters (%s), %s in %zu file%s%s\n", st.names().size(),
                human_count(st.total_params()).c_str(), dts.c_str(), human_bytes(st.total_bytes()).c_str(),
                st.files().size(), st.files().size() == 1 ? "" : "s", st.sharded() ? " (sharded, index ok)" : "");
    for (const auto& f : st.files())
      std::printf("    %-48s %6zu tensors %12s\n", fs::path(f->path()).filename().string().c_str(),
                  f->tensors().size(), human_bytes(f->file_bytes()).c_str());
    if (list_tensors)
      for (const auto& n : st.names())
        std::printf("      %-60s %-5s %s\n", n.c_str(), dtype_name(st.info(n).dtype), shape_str(st.info(n).shape).c_str());
    total_bytes += st.total_bytes();
    total_params += st.total_params();
  }
  std::printf("\ntotal: %s parameters, %s of tensor data\n", human_count(total_params).c_str(),
              human_bytes(total_bytes).c_str());
  return 0;
}

struct InspectArgs {
  std::string dir;
  bool tensors = false;
};

RegisterCommand reg{{"inspect", 10,
                     [](CLI::App& sub) -> std::function<int()> {
                       auto a = std::make_shared<InspectArgs>();
                       sub.add_option("MODEL_DIR", a->dir, "checkpoint folder (diffusers componentized layout)")
                           ->required();
                       sub.add_flag("--tensors", a->tensors, "list every tensor with dtype and shape");
                       sub.footer(
                           "Validates every config (and the cross-component constraints) and every safetensors\n"
                           "header and shard index, then prints components, dtypes, parameter counts, shards and\n"
                           "bytes. Any defect: a one-line message naming the file and field, exit code 2.\n\n"
                           "Example:\n  mm3 inspect ../shared/golden/v1/checkpoint --tensors");
                       return [a]() {
                         try {
                           return run_inspect(a->dir, a->tensors);
                         } catch (const BadModel& e) {
                           // For inspect the checkpoint *is* the input: a defect exits 2 (as bad input
                           // does elsewhere), while `generate` reports a bad model with exit 3.
                           std::fflush(stdout);
                           std::fprintf(stderr, "mm3: error (bad model): %s\n", e.what());
                           return 2;
                         }
                       };
                     },
                     "validate and describe a checkpoint folder"}};

}  // namespace
}  // namespace mm3::cli
