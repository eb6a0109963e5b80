// model_resolve.h — turning `--model` into a checkpoint folder: a local directory, or a Hugging Face
// repo id (default MiniMaxAI/MiniMax-Music3) looked up in the standard HF cache layout
// ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub: models--ORG--NAME/refs/main ->
// snapshots/<commit>/) and, when it is not there, downloaded into it on first use (hf_download.h):
// only the componentized diffusers files, not the 27 GB legacy duplicate (MODEL.md §0).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "pipeline/hf_download.h"

namespace mm3 {

inline constexpr const char* kDefaultModelRepo = "MiniMaxAI/MiniMax-Music3";

// The component folders of the diffusers layout (modular_model_index.json names them).
inline const std::vector<std::string>& checkpoint_components() {
  static const std::vector<std::string> c = {"language_model", "rvq_depth_decoder", "condition_encoder", "transformer",
                                             "vocoder",        "scheduler",         "tokenizer"};
  return c;
}

// Whether mm3 downloads this repo file: everything but the legacy layout (qwen_7B/**, *.pth).
bool mm3_wants_repo_file(const std::string& path);

// The HF hub cache directory this process would use.
std::string hf_hub_cache_dir();

struct ResolveOptions {
  bool allow_download = true;  // false (or $HF_HUB_OFFLINE=1): the cache only
  std::string revision = "main";
  std::function<void(const HfDownloadEvent&)> on_download;  // progress of a download; may be empty
  std::function<bool()> should_cancel;                      // true -> Cancelled (the .incomplete stays)
};

// Returns a directory holding modular_model_index.json. A repo id missing from the cache is downloaded
// (unless opt says not to). Throws BadModel saying what was looked at and how to fix it.
std::string resolve_model(const std::string& spec, const ResolveOptions& opt);
std::string resolve_model(const std::string& spec);  // default ResolveOptions: downloads, quietly

}  // namespace mm3
