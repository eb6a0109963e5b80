// request.h — one generation request: the strict schema shared by `mm3 generate`, request files,
// the C ABI and `mm3 serve` (issue 6). Defaults are the reference's (MODEL.md §7).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace mm3 {

struct Request {
  std::string caption;         // style description (required, non-blank)
  std::string lyrics;          // lyrics with [section] tags (required, non-blank)
  double duration = 60.0;      // seconds, an upper bound: the song may end earlier (0 < d <= 360)
  uint64_t seed = 0;           // sampling + noise seed, any u64
  int steps = 30;              // DiT Euler steps per window (1..200)
  double ar_cfg = 1.5;         // AR classifier-free guidance scale
  double dit_cfg = 1.7;        // DiT classifier-free guidance scale
  int sample_rate = 44100;     // 44100 (native) or 32000 (the official server's rate)
  std::string format = "wav";  // wav | wav24 | wav_float | flac | flac24 | mp3

  static constexpr double kMaxDuration = 360.0;
};

// The exact key set a request file / JSON body may hold. Anything else is an error.
inline constexpr const char* kRequestKeys[] = {"caption", "lyrics",  "duration",    "seed",  "steps",
                                               "ar_cfg",  "dit_cfg", "sample_rate", "format"};

// Parses a JSON object strictly: unknown keys, wrong types and out-of-range values are InvalidInput
// errors naming the key and what is allowed. Missing keys take the defaults (caption and lyrics are
// required). `where` prefixes messages (e.g. the file name).
Request parse_request(const nlohmann::json& j, const std::string& where = "request");
Request parse_request_text(const std::string& text, const std::string& where = "request");
nlohmann::json request_to_json(const Request& r);

// Range checks shared by every entry point (CLI flags included). Throws InvalidInput.
void validate_request(const Request& r);

}  // namespace mm3
