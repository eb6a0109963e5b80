#include "pipeline/request.h"

#include <cmath>

#include "core/errors.h"

namespace mm3 {

using nlohmann::json;

namespace {

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw InvalidInput(fmt::format("{}: {}", where, what));
}

std::string type_name(const json& v) { return v.type_name(); }

double get_number(const json& v, const std::string& where, const char* key) {
  if (!v.is_number()) bad(where, fmt::format("'{}' must be a number, got {}", key, type_name(v)));
  return v.get<double>();
}

int get_int(const json& v, const std::string& where, const char* key) {
  if (!v.is_number_integer() && !(v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()))
    bad(where, fmt::format("'{}' must be an integer, got {}", key, v.dump()));
  const double d = v.get<double>();
  if (d < -2147483648.0 || d > 2147483647.0) bad(where, fmt::format("'{}' = {} is out of range", key, v.dump()));
  return static_cast<int>(d);
}

}  // namespace

Request parse_request(const json& j, const std::string& where) {
  if (!j.is_object()) bad(where, fmt::format("must be a JSON object, got {}", type_name(j)));
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool known = false;
    for (const char* k : kRequestKeys) known |= it.key() == k;
    if (!known) {
      std::string keys;
      for (const char* k : kRequestKeys) keys += (keys.empty() ? "" : ", ") + std::string(k);
      bad(where, fmt::format("unknown key '{}' (allowed: {})", it.key(), keys));
    }
  }
  Request r;
  auto str = [&](const char* key, std::string& out, bool required) {
    if (!j.contains(key)) {
      if (required) bad(where, fmt::format("'{}' is required", key));
      return;
    }
    if (!j[key].is_string()) bad(where, fmt::format("'{}' must be a string, got {}", key, type_name(j[key])));
    out = j[key].get<std::string>();
  };
  str("caption", r.caption, true);
  str("lyrics", r.lyrics, true);
  str("format", r.format, false);
  if (j.contains("duration")) r.duration = get_number(j["duration"], where, "duration");
  if (j.contains("seed")) {
    const json& s = j["seed"];
    if (s.is_number_unsigned()) r.seed = s.get<uint64_t>();
    else if (s.is_number_integer()) bad(where, fmt::format("'seed' must be in [0, 2^64), got {}", s.dump()));
    else bad(where, fmt::format("'seed' must be an integer in [0, 2^64), got {}", s.dump()));
  }
  if (j.contains("steps")) r.steps = get_int(j["steps"], where, "steps");
  if (j.contains("ar_cfg")) r.ar_cfg = get_number(j["ar_cfg"], where, "ar_cfg");
  if (j.contains("dit_cfg")) r.dit_cfg = get_number(j["dit_cfg"], where, "dit_cfg");
  if (j.contains("sample_rate")) r.sample_rate = get_int(j["sample_rate"], where, "sample_rate");
  try {
    validate_request(r);
  } catch (const InvalidInput& e) {
    bad(where, e.what());
  }
  return r;
}

Request parse_request_text(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    bad(where, fmt::format("not valid JSON ({})", e.what()));
  }
  return parse_request(j, where);
}

json request_to_json(const Request& r) {
  return {{"caption", r.caption}, {"lyrics", r.lyrics},   {"duration", r.duration},       {"seed", r.seed},
          {"steps", r.steps},     {"ar_cfg", r.ar_cfg},   {"dit_cfg", r.dit_cfg},         {"sample_rate", r.sample_rate},
          {"format", r.format}};
}

void validate_request(const Request& r) {
  auto blank = [](const std::string& s) { return s.find_first_not_of(" \t\r\n\v\f") == std::string::npos; };
  if (blank(r.caption)) throw InvalidInput("caption is empty: describe the style, e.g. --caption \"Genre: pop. BPM: 96\"");
  if (blank(r.lyrics)) throw InvalidInput("lyrics are empty: give lyrics with section tags, e.g. --lyrics \"[verse]\\n...\"");
  if (!std::isfinite(r.duration) || r.duration <= 0 || r.duration > Request::kMaxDuration)
    throw InvalidInput(fmt::format("duration {} s is out of range: use 0 < duration <= {} (seconds)", r.duration,
                                   Request::kMaxDuration));
  if (r.duration * 25 < 1)
    throw InvalidInput(fmt::format("duration {} s is shorter than one frame (1/25 s): use at least 0.04", r.duration));
  if (r.steps < 1 || r.steps > 200) throw InvalidInput(fmt::format("steps {} is out of range: use 1..200", r.steps));
  if (!std::isfinite(r.ar_cfg) || r.ar_cfg < 0 || r.ar_cfg > 20)
    throw InvalidInput(fmt::format("ar_cfg {} is out of range: use 0..20 (default 1.5)", r.ar_cfg));
  if (!std::isfinite(r.dit_cfg) || r.dit_cfg < 0 || r.dit_cfg > 20)
    throw InvalidInput(fmt::format("dit_cfg {} is out of range: use 0..20 (default 1.7)", r.dit_cfg));
  if (r.sample_rate != 44100 && r.sample_rate != 32000)
    throw InvalidInput(fmt::format("sample_rate {} is not supported: use 44100 (native) or 32000", r.sample_rate));
  static const char* formats[] = {"wav", "wav16", "wav24", "wav_float", "flac", "flac16", "flac24", "mp3"};
  bool ok = false;
  for (const char* f : formats) ok |= r.format == f;
  if (!ok) throw InvalidInput(fmt::format("format '{}' is not supported: use wav, wav24, wav_float, flac, flac24 or mp3", r.format));
}

}  // namespace mm3
