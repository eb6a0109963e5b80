// progress_display.h — progress on a terminal (one line per stage with a bar, rate and ETA) or as
// JSON lines for machines. Quiet when stderr is not a TTY unless asked.
#pragma once

#include <string>

#include "core/progress.h"

namespace mm3::cli {

enum class ProgressMode { automatic, bar, json, none };
ProgressMode parse_progress_mode(const std::string& s);  // auto | bar | json | none

class ProgressDisplay {
 public:
  explicit ProgressDisplay(ProgressMode mode);
  ~ProgressDisplay();
  void operator()(const ProgressEvent& e);
  void finish();  // ends the current bar line

 private:
  ProgressMode mode_;
  std::string stage_;
  bool open_line_ = false;
};

}  // namespace mm3::cli
