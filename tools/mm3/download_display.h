// download_display.h — what `mm3 generate` / `mm3 serve` print while resolve_model downloads a model
// from the Hugging Face hub (src/pipeline/hf_download.h): on a terminal, one line per fetched file,
// rewritten in place while it downloads (bytes, rate, ETA); with --progress json, one JSON line per
// fetched file; nothing otherwise (and nothing for files already in the cache).
#pragma once

#include <functional>
#include <string>

#include "pipeline/hf_download.h"
#include "progress_display.h"

namespace mm3::cli {

class DownloadDisplay {
 public:
  DownloadDisplay(std::string repo, ProgressMode mode);
  ~DownloadDisplay();  // ends an open line, so an error message starts on its own
  DownloadDisplay(const DownloadDisplay&) = delete;
  DownloadDisplay& operator=(const DownloadDisplay&) = delete;
  void operator()(const HfDownloadEvent& e);
  // A callback for ResolveOptions::on_download (empty when nothing is shown); `this` must outlive it.
  std::function<void(const HfDownloadEvent&)> callback();

 private:
  std::string repo_;
  ProgressMode mode_;
  bool open_line_ = false;
  double last_rate_ = 0;
};

}  // namespace mm3::cli
