// model_resolve.h — turning `--model` into a checkpoint folder: a local directory, or a Hugging Face
// repo id (default MiniMaxAI/MiniMax-Music3) looked up in the standard HF cache layout
// ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub: models--ORG--NAME/refs/main ->
// snapshots/<commit>/).
#pragma once

#include <string>

namespace mm3 {

inline constexpr const char* kDefaultModelRepo = "MiniMaxAI/MiniMax-Music3";

// The HF hub cache directory this process would use.
std::string hf_hub_cache_dir();

// Returns a directory holding modular_model_index.json. Throws BadModel saying where it looked and
// how to get the model when nothing is found.
std::string resolve_model(const std::string& spec);

}  // namespace mm3
