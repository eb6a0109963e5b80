// progress.h — progress reporting and cancellation for long stages (AR frames, DiT steps, vocoder).
// A stage calls ctl.progress(...) after each unit of work and ctl.check_cancel() between units;
// cancellation throws mm3::Cancelled, which every layer lets through untouched.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "core/errors.h"

namespace mm3 {

struct ProgressEvent {
  std::string stage;   // "ar", "dit", "vocoder", ...
  int64_t done = 0;    // units finished
  int64_t total = 0;   // units planned (0 when unknown)
  double rate = 0;     // units per second since the stage began
  std::string unit;    // "frames", "steps", "windows"
  std::string detail;  // e.g. "window 2/4"
};

struct RunControl {
  std::function<void(const ProgressEvent&)> on_progress;  // may be empty
  std::function<bool()> should_cancel;                    // may be empty

  void check_cancel() const {
    if (should_cancel && should_cancel()) throw Cancelled();
  }
  void progress(const ProgressEvent& e) const {
    if (on_progress) on_progress(e);
  }
};

// Helper that fills `rate` from the time since construction.
class StageClock {
 public:
  StageClock() : t0_(std::chrono::steady_clock::now()) {}
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  double rate(int64_t done) const {
    double s = seconds();
    return s > 0 ? static_cast<double>(done) / s : 0.0;
  }

 private:
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace mm3
