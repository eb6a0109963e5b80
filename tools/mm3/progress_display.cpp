#include "progress_display.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

namespace mm3::cli {

ProgressMode parse_progress_mode(const std::string& s) {
  if (s == "auto") return ProgressMode::automatic;
  if (s == "bar") return ProgressMode::bar;
  if (s == "json") return ProgressMode::json;
  if (s == "none") return ProgressMode::none;
  throw InvalidInput(fmt::format("--progress '{}': use auto, bar, json or none", s));
}

ProgressDisplay::ProgressDisplay(ProgressMode mode) : mode_(mode) {
  if (mode_ == ProgressMode::automatic) mode_ = isatty(STDERR_FILENO) ? ProgressMode::bar : ProgressMode::none;
}

ProgressDisplay::~ProgressDisplay() { finish(); }

void ProgressDisplay::finish() {
  if (open_line_) std::fputc('\n', stderr);
  open_line_ = false;
}

void ProgressDisplay::operator()(const ProgressEvent& e) {
  if (mode_ == ProgressMode::none) return;
  if (mode_ == ProgressMode::json) {
    nlohmann::json j = {{"event", "progress"}, {"stage", e.stage}, {"done", e.done}, {"total", e.total},
                        {"rate", e.rate},      {"unit", e.unit}};
    if (!e.detail.empty()) j["detail"] = e.detail;
    std::fprintf(stderr, "%s\n", j.dump().c_str());
    return;
  }
  if (e.stage != stage_) {
    finish();
    stage_ = e.stage;
  }
  const int width = 30;
  const double frac = e.total > 0 ? std::min(1.0, static_cast<double>(e.done) / e.total) : 0.0;
  const int fill = static_cast<int>(frac * width);
  std::string bar(fill, '#');
  bar += std::string(width - fill, '.');
  std::string eta = "--:--";
  if (e.rate > 0 && e.total > 0) {
    const int s = static_cast<int>(std::ceil((e.total - e.done) / e.rate));
    eta = fmt::format("{}:{:02d}", s / 60, s % 60);
  }
  std::fprintf(stderr, "\r%-8s [%s] %lld/%lld %s  %.1f %s/s  ETA %s %s\033[K", e.stage.c_str(), bar.c_str(),
               static_cast<long long>(e.done), static_cast<long long>(e.total), e.unit.c_str(), e.rate, e.unit.c_str(),
               eta.c_str(), e.detail.c_str());
  std::fflush(stderr);
  open_line_ = true;
}

}  // namespace mm3::cli
