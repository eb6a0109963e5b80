// log.h — minimal leveled logging to stderr. Level from MM3_LOG (error|warn|info|debug), default warn.
#pragma once

#include <cstdio>

#include <fmt/format.h>

namespace mm3 {

enum class LogLevel { error = 0, warn = 1, info = 2, debug = 3 };
LogLevel log_level();
void set_log_level(LogLevel l);

template <class... A>
void log_at(LogLevel l, fmt::format_string<A...> f, A&&... a) {
  if (static_cast<int>(l) > static_cast<int>(log_level())) return;
  static const char* names[] = {"error", "warn", "info", "debug"};
  std::fprintf(stderr, "mm3 %s: %s\n", names[static_cast<int>(l)],
               fmt::format(f, std::forward<A>(a)...).c_str());
}
#define MM3_LOG_INFO(...) ::mm3::log_at(::mm3::LogLevel::info, __VA_ARGS__)
#define MM3_LOG_WARN(...) ::mm3::log_at(::mm3::LogLevel::warn, __VA_ARGS__)
#define MM3_LOG_DEBUG(...) ::mm3::log_at(::mm3::LogLevel::debug, __VA_ARGS__)

}  // namespace mm3
