#include "pipeline/model_resolve.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/errors.h"

namespace mm3 {

namespace fs = std::filesystem;

namespace {

constexpr const char* kIndexFile = "modular_model_index.json";

bool has_index(const fs::path& dir) {
  std::error_code ec;
  return fs::exists(dir / kIndexFile, ec);
}

// A cached snapshot holds the index and every component folder. mm3 links the index last, so a
// snapshot it was still filling has no index; one made by a python tool with narrower patterns may
// lack folders.
bool complete_snapshot(const fs::path& dir) {
  if (!has_index(dir)) return false;
  std::error_code ec;
  for (const auto& c : checkpoint_components())
    if (!fs::is_directory(dir / c, ec)) return false;
  return true;
}

// The cached snapshot of `revision` (refs/<revision>, or snapshots/<revision> for a commit), else any
// snapshot with an index; "" when none.
fs::path cached_snapshot(const fs::path& repo, const std::string& revision) {
  std::string rev;
  {
    std::ifstream in(repo / "refs" / revision);
    if (in) std::getline(in, rev);
  }
  if (rev.empty()) rev = revision;
  if (!rev.empty() && has_index(repo / "snapshots" / rev)) return repo / "snapshots" / rev;
  std::error_code ec;
  fs::path any;
  if (fs::is_directory(repo / "snapshots", ec))
    for (const auto& e : fs::directory_iterator(repo / "snapshots", ec)) {
      if (complete_snapshot(e.path())) return e.path();
      if (any.empty() && has_index(e.path())) any = e.path();
    }
  return any;
}

}  // namespace

bool mm3_wants_repo_file(const std::string& path) {
  if (path.rfind("qwen_7B/", 0) == 0) return false;
  if (path.size() >= 4 && path.compare(path.size() - 4, 4, ".pth") == 0) return false;
  return true;
}

std::string hf_hub_cache_dir() {
  if (const char* c = std::getenv("HF_HUB_CACHE"); c && *c) return c;
  if (const char* h = std::getenv("HF_HOME"); h && *h) return (fs::path(h) / "hub").string();
  const char* home = std::getenv("HOME");
  return (fs::path(home ? home : "/root") / ".cache" / "huggingface" / "hub").string();
}

std::string resolve_model(const std::string& spec) { return resolve_model(spec, ResolveOptions{}); }

std::string resolve_model(const std::string& spec, const ResolveOptions& opt) {
  if (fs::is_directory(spec)) {
    if (!fs::exists(fs::path(spec) / kIndexFile))
      throw BadModel(
          fmt::format("{}: no modular_model_index.json here; expected a MiniMax-Music3 checkpoint folder "
                      "(diffusers componentized layout)",
                      spec));
    return spec;
  }
  if (!is_hf_repo_id(spec))
    throw BadModel(fmt::format("model '{}' is neither a directory nor a Hugging Face repo id (ORG/NAME)", spec));
  const std::string cache = hf_hub_cache_dir();
  const fs::path repo = hf_repo_cache_dir(cache, spec);
  const std::string revision = opt.revision.empty() ? "main" : opt.revision;
  const fs::path cached = cached_snapshot(repo, revision);
  if (!cached.empty() && complete_snapshot(cached)) return cached.string();

  const bool offline = hf_hub_offline();
  if (!opt.allow_download || offline) {
    if (!cached.empty()) return cached.string();  // incomplete, but all there is; loading will say what lacks
    throw BadModel(fmt::format(
        "model '{}' is not in the Hugging Face cache ({}), and downloading is off ({} to let mm3 download it), or "
        "download it with `huggingface-cli download {} --exclude 'qwen_7B/*' '*.pth'` (about 28 GB), or pass "
        "--model DIR with a local checkpoint folder",
        spec, repo.string(), offline ? "HF_HUB_OFFLINE is set: unset it" : "--no-download: drop it", spec));
  }

  HfDownloadOptions dopt;
  dopt.cache_dir = cache;
  dopt.revision = revision;
  dopt.include = mm3_wants_repo_file;
  dopt.required.push_back(kIndexFile);
  for (const auto& c : checkpoint_components()) dopt.required.push_back(c + "/");
  dopt.on_progress = opt.on_download;
  dopt.should_cancel = opt.should_cancel;
  const std::string dir = hf_download_snapshot(spec, dopt, {kIndexFile});
  if (!complete_snapshot(dir))
    throw BadModel(
        fmt::format("{}: the download finished but the snapshot lacks {} or a component folder", dir, kIndexFile));
  return dir;
}

}  // namespace mm3
