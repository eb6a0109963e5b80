#include "download_display.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <utility>

namespace mm3::cli {
namespace {

std::string gb(uint64_t b) {
  if (b < 1000 * 1000) return fmt::format("{:.1f} KB", b / 1e3);
  if (b < 1000ull * 1000 * 1000) return fmt::format("{:.1f} MB", b / 1e6);
  return fmt::format("{:.2f} GB", b / 1e9);
}

std::string duration(double s) {
  const long long t = static_cast<long long>(std::ceil(s));
  return t >= 3600 ? fmt::format("{}:{:02d}:{:02d}", t / 3600, static_cast<int>(t / 60 % 60), static_cast<int>(t % 60))
                   : fmt::format("{}:{:02d}", t / 60, static_cast<int>(t % 60));
}

}  // namespace

DownloadDisplay::DownloadDisplay(std::string repo, ProgressMode mode) : repo_(std::move(repo)), mode_(mode) {
  if (mode_ == ProgressMode::automatic) mode_ = isatty(STDERR_FILENO) ? ProgressMode::bar : ProgressMode::none;
}

DownloadDisplay::~DownloadDisplay() {
  if (open_line_) std::fputc('\n', stderr);
}

std::function<void(const HfDownloadEvent&)> DownloadDisplay::callback() {
  if (mode_ == ProgressMode::none) return {};
  return [this](const HfDownloadEvent& e) { (*this)(e); };
}

void DownloadDisplay::operator()(const HfDownloadEvent& e) {
  using K = HfDownloadEvent::Kind;
  if (mode_ == ProgressMode::none) return;
  if (mode_ == ProgressMode::json) {
    if (e.kind == K::plan && e.bytes > 0)
      std::fprintf(stderr, "%s\n",
                   nlohmann::json{{"event", "download"}, {"repo", repo_}, {"files", e.count}, {"bytes", e.bytes}}
                       .dump()
                       .c_str());
    if (e.kind == K::done && !e.cached)
      std::fprintf(
          stderr, "%s\n",
          nlohmann::json{
              {"event", "downloaded"}, {"path", e.path}, {"bytes", e.total}, {"index", e.index}, {"count", e.count}}
              .dump()
              .c_str());
    return;
  }
  if (e.kind == K::plan) {
    if (e.bytes > 0)
      std::fprintf(stderr,
                   "mm3: downloading %s into the Hugging Face cache: %s to fetch (Ctrl-C keeps what "
                   "arrived; run again to resume)\n",
                   repo_.c_str(), gb(e.bytes).c_str());
    return;
  }
  const std::string head = fmt::format("[{}/{}] {}", e.index, e.count, e.path);
  if (e.kind == K::progress) {
    last_rate_ = e.rate;
    const std::string eta =
        e.rate > 0 && e.total > e.done ? duration(static_cast<double>(e.total - e.done) / e.rate) : "--:--";
    std::fprintf(stderr, "\r%s  %s / %s  %.1f MB/s  ETA %s\033[K", head.c_str(), gb(e.done).c_str(),
                 gb(e.total).c_str(), e.rate / 1e6, eta.c_str());
    open_line_ = true;
  } else if (!e.cached) {
    std::fprintf(stderr, "\r%s  %s  done (%.1f MB/s)\033[K\n", head.c_str(), gb(e.total).c_str(), last_rate_ / 1e6);
    open_line_ = false;
  }
  std::fflush(stderr);
}

}  // namespace mm3::cli
