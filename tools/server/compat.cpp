// compat.cpp — strict JSON and the OpenAI / MiniMax request mappings (compat.h).
#include "server/compat.h"

#include <cmath>
#include <vector>

#include "core/errors.h"
#include "server/generator.h"

namespace mm3::server {

using nlohmann::json;

json parse_json_strict(const std::string& text, const std::string& where) {
  // One set of seen keys per open object; the parser callback sees keys in document order.
  std::vector<std::vector<std::string>> seen;
  std::string duplicate;
  auto cb = [&](int /*depth*/, json::parse_event_t ev, json& parsed) {
    switch (ev) {
      case json::parse_event_t::object_start: seen.emplace_back(); break;
      case json::parse_event_t::object_end:
        if (!seen.empty()) seen.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string k = parsed.get<std::string>();
        auto& s = seen.back();
        for (const auto& x : s)
          if (x == k && duplicate.empty()) duplicate = k;
        s.push_back(k);
        break;
      }
      default: break;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text, cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    throw InvalidInput(fmt::format("{}: not valid JSON ({})", where, e.what()));
  }
  if (!duplicate.empty()) throw InvalidInput(fmt::format("{}: key '{}' appears twice", where, duplicate));
  return j;
}

double duration_for_frames(int64_t frames) {
  double d = static_cast<double>(frames) / 25.0;
  while (static_cast<int64_t>(d * 25.0) < frames) d = std::nextafter(d, INFINITY);
  return d;
}

namespace {

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw InvalidInput(fmt::format("{}: {}", where, what));
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// Collects every key outside `allowed` and refuses them in ONE message, with why for the known
// sampling/voice knobs (MODEL.md §2.3: the official server rejects them too).
void refuse_unknown(const json& j, const std::vector<std::string>& allowed, const std::string& where) {
  static const std::vector<std::pair<std::string, std::string>> why = {
      {"temperature", "sampling uses the model's fixed top-k 50 at temperature 1"},
      {"top_p", "sampling uses the model's fixed top-k 50"},
      {"top_k", "sampling uses the model's fixed top-k 50"},
      {"repetition_penalty", "not part of the model's sampling"},
      {"voice", "MiniMax-Music3 has no voice presets; describe the voice in the caption"},
      {"ref_audio", "reference audio is not supported"},
  };
  std::vector<std::string> unknown;
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool ok = false;
    for (const auto& a : allowed) ok |= it.key() == a;
    if (ok) continue;
    std::string entry = "'" + it.key() + "'";
    for (const auto& [k, w] : why)
      if (k == it.key()) entry += " (" + w + ")";
    unknown.push_back(entry);
  }
  if (!unknown.empty())
    bad(where, fmt::format("unsupported field{} {}; allowed: {}", unknown.size() > 1 ? "s" : "", join(unknown),
                           join(allowed)));
}

std::string get_string(const json& j, const char* key, const std::string& where, bool required, std::string fallback = "") {
  if (!j.contains(key)) {
    if (required) bad(where, fmt::format("'{}' is required", key));
    return fallback;
  }
  if (!j[key].is_string()) bad(where, fmt::format("'{}' must be a string, got {}", key, j[key].type_name()));
  return j[key].get<std::string>();
}

int64_t get_integer(const json& j, const char* key, const std::string& where) {
  const json& v = j[key];
  if (v.is_number_unsigned() || v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>() && std::fabs(v.get<double>()) < 9e15)
    return static_cast<int64_t>(v.get<double>());
  bad(where, fmt::format("'{}' must be an integer, got {}", key, v.dump()));
}

uint64_t get_seed(const json& j, const std::string& where) {
  const json& s = j["seed"];
  if (s.is_number_unsigned()) return s.get<uint64_t>();
  bad(where, fmt::format("'seed' must be an integer in [0, 2^64), got {}", s.dump()));
}

void check_stream_false(const json& j, const std::string& where) {
  if (!j.contains("stream")) return;
  if (!j["stream"].is_boolean()) bad(where, fmt::format("'stream' must be a boolean, got {}", j["stream"].type_name()));
  if (j["stream"].get<bool>())
    bad(where, "'stream': true is not supported: the audio is returned whole when the job finishes "
               "(for live progress use POST /v1/jobs and GET /v1/jobs/{id}/events)");
}

void finish(Request& r, const std::string& where) {
  try {
    validate_request(r);
  } catch (const InvalidInput& e) {
    bad(where, e.what());
  }
}

}  // namespace

SpeechRequest parse_speech_request(const json& body) {
  const std::string where = "/v1/audio/speech";
  if (!body.is_object()) bad(where, fmt::format("the body must be a JSON object, got {}", body.type_name()));
  refuse_unknown(body, {"model", "input", "instructions", "seed", "max_new_tokens", "response_format", "speed", "stream"},
                 where);
  check_stream_false(body, where);
  SpeechRequest out;
  out.model = get_string(body, "model", where, false);
  Request& r = out.request;
  r.lyrics = get_string(body, "input", where, true);
  if (!body.contains("instructions"))
    bad(where, "'instructions' is required: it carries the style caption (e.g. \"Genre: pop. BPM: 96\")");
  r.caption = get_string(body, "instructions", where, true);
  if (body.contains("seed")) r.seed = get_seed(body, where);
  int64_t frames = 9000;  // the official server's default
  if (body.contains("max_new_tokens")) {
    frames = get_integer(body, "max_new_tokens", where);
    if (frames < 1 || frames > 9000)
      bad(where, fmt::format("'max_new_tokens' = {} is out of range: use 1..9000 frames (25 frames per second)", frames));
  }
  r.duration = duration_for_frames(frames);
  if (body.contains("speed")) {
    if (!body["speed"].is_number()) bad(where, fmt::format("'speed' must be a number, got {}", body["speed"].type_name()));
    if (body["speed"].get<double>() != 1.0)
      bad(where, fmt::format("'speed' = {} is not supported: only 1 (the model has no tempo control here; put the "
                             "BPM in the caption)", body["speed"].dump()));
  }
  out.response_format = get_string(body, "response_format", where, false, "wav");
  if (out.response_format != "wav" && out.response_format != "flac" && out.response_format != "mp3")
    bad(where, fmt::format("'response_format' '{}' is not supported: use wav, flac or mp3", out.response_format));
  r.format = out.response_format;
  r.sample_rate = 32000;  // the official server writes 32 kHz 16-bit (MODEL.md §5.3)
  finish(r, where);
  return out;
}

MusicGenerationRequest parse_music_generation_request(const json& body) {
  const std::string where = "/v1/music_generation";
  if (!body.is_object()) bad(where, fmt::format("the body must be a JSON object, got {}", body.type_name()));
  refuse_unknown(body, {"model", "prompt", "lyrics", "audio_setting", "output_format", "stream"}, where);
  check_stream_false(body, where);
  MusicGenerationRequest out;
  out.model = get_string(body, "model", where, false);
  Request& r = out.request;
  r.caption = get_string(body, "prompt", where, true);
  r.lyrics = get_string(body, "lyrics", where, true);
  out.output_format = get_string(body, "output_format", where, false, "hex");
  if (out.output_format != "hex" && out.output_format != "url")
    bad(where, fmt::format("'output_format' '{}' is not supported: use hex or url", out.output_format));
  r.sample_rate = 44100;
  if (body.contains("audio_setting")) {
    const json& a = body["audio_setting"];
    const std::string aw = where + " audio_setting";
    if (!a.is_object()) bad(where, fmt::format("'audio_setting' must be an object, got {}", a.type_name()));
    refuse_unknown(a, {"sample_rate", "bitrate", "format"}, aw);
    if (a.contains("sample_rate")) {
      const int64_t sr = get_integer(a, "sample_rate", aw);
      if (sr != 44100 && sr != 32000)
        bad(aw, fmt::format("'sample_rate' {} is not supported: use 44100 (native) or 32000", sr));
      r.sample_rate = static_cast<int>(sr);
    }
    if (a.contains("bitrate")) {
      const int64_t br = get_integer(a, "bitrate", aw);
      if (br != 32000 && br != 64000 && br != 128000 && br != 256000)
        bad(aw, fmt::format("'bitrate' {} is not supported: use 32000, 64000, 128000 or 256000", br));
      out.bitrate = static_cast<int>(br);
    }
    out.audio_format = get_string(a, "format", aw, false, "mp3");
    if (out.audio_format != "mp3" && out.audio_format != "wav" && out.audio_format != "flac")
      bad(aw, fmt::format("'format' '{}' is not supported: use mp3, wav or flac{}", out.audio_format,
                          out.audio_format == "pcm" ? " (raw pcm is not offered; wav holds the same 16-bit samples)" : ""));
  }
  // libsndfile's MP3 encoder is VBR with a compression level 0 (best) .. 1 (smallest).
  switch (out.bitrate) {
    case 256000: out.mp3_quality = 0.0; break;
    case 128000: out.mp3_quality = 0.5; break;
    case 64000: out.mp3_quality = 0.8; break;
    default: out.mp3_quality = 1.0; break;
  }
  r.format = out.audio_format;
  finish(r, where);
  return out;
}

}  // namespace mm3::server
