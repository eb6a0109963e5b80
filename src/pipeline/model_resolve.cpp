#include "pipeline/model_resolve.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/errors.h"

namespace mm3 {

namespace fs = std::filesystem;

std::string hf_hub_cache_dir() {
  if (const char* c = std::getenv("HF_HUB_CACHE"); c && *c) return c;
  if (const char* h = std::getenv("HF_HOME"); h && *h) return (fs::path(h) / "hub").string();
  const char* home = std::getenv("HOME");
  return (fs::path(home ? home : "/root") / ".cache" / "huggingface" / "hub").string();
}

std::string resolve_model(const std::string& spec) {
  if (fs::is_directory(spec)) {
    if (!fs::exists(fs::path(spec) / "modular_model_index.json"))
      throw BadModel(fmt::format("{}: no modular_model_index.json here; expected a MiniMax-Music3 checkpoint folder "
                                 "(diffusers componentized layout)",
                                 spec));
    return spec;
  }
  const auto slash = spec.find('/');
  const bool repo_like = slash != std::string::npos && slash > 0 && slash + 1 < spec.size() &&
                         spec.find('/', slash + 1) == std::string::npos && spec.find("..") == std::string::npos;
  if (!repo_like)
    throw BadModel(fmt::format("model '{}' is neither a directory nor a Hugging Face repo id (ORG/NAME)", spec));
  const fs::path repo = fs::path(hf_hub_cache_dir()) / ("models--" + spec.substr(0, slash) + "--" + spec.substr(slash + 1));
  std::string rev;
  {
    std::ifstream in(repo / "refs" / "main");
    if (in) std::getline(in, rev);
  }
  if (!rev.empty() && fs::exists(repo / "snapshots" / rev / "modular_model_index.json"))
    return (repo / "snapshots" / rev).string();
  // No refs/main: take the only snapshot that is complete.
  if (fs::is_directory(repo / "snapshots"))
    for (const auto& e : fs::directory_iterator(repo / "snapshots"))
      if (fs::exists(e.path() / "modular_model_index.json")) return e.path().string();
  throw BadModel(fmt::format(
      "model '{}' is not in the Hugging Face cache ({}), and this build cannot download it yet. Download it with "
      "`huggingface-cli download {} --exclude 'qwen_7B/*' '*.pth'` (about 28 GB), or pass --model DIR with a local "
      "checkpoint folder",
      spec, repo.string(), spec));
}

}  // namespace mm3
