// compat.h — request bodies of `mm3 serve` (issue 7): strict JSON parsing and the two compatibility
// shapes mapped onto mm3::Request.
//
// OpenAI-style `POST /v1/audio/speech`, with the official (SGLang-Omni) server's mapping (MODEL.md §2.3):
//   input -> lyrics, instructions -> caption, seed, max_new_tokens = frames (1..9000, default 9000;
//   duration = frames / 25 s), response_format (wav | flac | mp3, default wav), audio at 32 kHz 16-bit
//   like the official server. speed must be 1 and stream false; temperature, top_p, top_k,
//   repetition_penalty, voice, ref_audio and every other key are refused, each named in the message.
//
// MiniMax cloud shape `POST /v1/music_generation`: model, prompt -> caption, lyrics,
//   audio_setting {sample_rate 44100 | 32000, bitrate 32000 | 64000 | 128000 | 256000, format mp3 | wav |
//   flac}, output_format hex | url, stream false. The cloud API has no duration or seed: the request's
//   defaults apply (60 s ceiling, seed 0). bitrate sets libsndfile's MP3 VBR quality (an approximation of
//   the cloud's constant bitrates); the response reports the bitrate actually measured.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "pipeline/request.h"

namespace mm3::server {

// JSON text -> value. Refuses syntax errors and duplicate object keys (nlohmann would keep the last one
// silently) with InvalidInput naming `where`.
nlohmann::json parse_json_strict(const std::string& text, const std::string& where);

struct SpeechRequest {
  Request request;
  std::string response_format;  // wav | flac | mp3
  std::string model;            // echoed; the server has one model
};
SpeechRequest parse_speech_request(const nlohmann::json& body);

struct MusicGenerationRequest {
  Request request;
  std::string model;
  std::string output_format = "hex";  // hex | url
  std::string audio_format = "mp3";   // mp3 | wav | flac
  int bitrate = 256000;
  double mp3_quality = 0.0;           // libsndfile compression level derived from bitrate
};
MusicGenerationRequest parse_music_generation_request(const nlohmann::json& body);

// Duration (seconds) whose frame budget min(int(d * 25), 9000) is exactly `frames`: frames / 25 rounded
// up to the next double where needed (3/25*25 truncates to 2 in binary floating point).
double duration_for_frames(int64_t frames);

}  // namespace mm3::server
