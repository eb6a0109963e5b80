#include "core/log.h"

#include <cstdlib>
#include <cstring>

namespace mm3 {

namespace {
LogLevel initial_level() {
  const char* e = std::getenv("MM3_LOG");
  if (!e) return LogLevel::warn;
  if (!std::strcmp(e, "error")) return LogLevel::error;
  if (!std::strcmp(e, "info")) return LogLevel::info;
  if (!std::strcmp(e, "debug")) return LogLevel::debug;
  return LogLevel::warn;
}
LogLevel g_level = initial_level();
}  // namespace

LogLevel log_level() { return g_level; }
void set_log_level(LogLevel l) { g_level = l; }

}  // namespace mm3
