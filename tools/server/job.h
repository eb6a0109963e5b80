// job.h — one job of `mm3 serve` (issue 7): its state machine, its record (what GET /v1/jobs/{id}
// returns and what job.json holds on disk) and their JSON forms.
//
// States: queued -> running -> done | failed | cancelled; queued -> cancelled. Terminal states never
// change again. A job found queued or running when the server starts was interrupted (crash, kill -9,
// shutdown) and is reported failed with code "interrupted" — never dropped silently.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/errors.h"
#include "pipeline/request.h"

namespace mm3::server {

enum class JobState { queued, running, done, failed, cancelled };

const char* job_state_name(JobState s);
std::optional<JobState> parse_job_state(const std::string& s);
inline bool is_terminal(JobState s) {
  return s == JobState::done || s == JobState::failed || s == JobState::cancelled;
}

struct JobRecord {
  std::string id;              // 32 lowercase hex digits (128 random bits)
  std::string origin = "jobs"; // which route made it: "jobs", "speech" (OpenAI), "music_generation" (MiniMax)
  JobState state = JobState::queued;
  Request request;
  double mp3_quality = -1;     // libsndfile MP3 compression level (0 best .. 1 smallest); < 0: io/audio's default
  double created_at = 0, started_at = 0, finished_at = 0;  // unix seconds; 0 = not yet

  // Live progress (not all of it persisted mid-run; see JobManager).
  std::string stage;           // "queued", "ar", "dit", "vocoder", "writing", or "" when finished
  int64_t stage_done = 0, stage_total = 0;
  std::string stage_unit;
  double stage_rate = 0;       // units per second in this stage
  double progress = 0;         // 0..1 over the whole job, an estimate (stage weights)
  double eta_seconds = -1;     // estimate; < 0 when unknown
  bool cancel_requested = false;

  // Outcome.
  std::string error_code;      // snake_case kind: invalid_input, bad_model, out_of_memory, internal, not_implemented, interrupted
  std::string error_message;
  int64_t frames = 0;
  bool stopped_on_end = false;
  int64_t prompt_tokens = 0;
  int sample_rate = 0;         // of the stored master (native rate)
  double audio_seconds = 0;
  double seconds_ar = 0, seconds_acoustic = 0, seconds_total = 0;
  std::string audio_file;      // the audio in the requested format, a file name inside the job folder
  bool has_codes = false;
  bool test_tone = false;      // made by the fake generator: a synthetic tone, not music
};

// snake_case name of an mm3 error kind, used as the error "code" in job records and HTTP errors.
const char* error_code_name(ErrorKind k);

// Full record: what job.json stores and what GET /v1/jobs/{id} returns.
nlohmann::json job_to_json(const JobRecord& j);
// Reads a job.json. Throws InvalidInput naming the file when it is malformed.
JobRecord job_from_json(const nlohmann::json& j, const std::string& where);

}  // namespace mm3::server
