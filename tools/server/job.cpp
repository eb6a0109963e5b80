// job.cpp — JobState names and the JSON form of a JobRecord (job.h).
#include "server/job.h"

#include "core/errors.h"

namespace mm3::server {

using nlohmann::json;

const char* job_state_name(JobState s) {
  switch (s) {
    case JobState::queued: return "queued";
    case JobState::running: return "running";
    case JobState::done: return "done";
    case JobState::failed: return "failed";
    case JobState::cancelled: return "cancelled";
  }
  return "failed";
}

std::optional<JobState> parse_job_state(const std::string& s) {
  for (JobState st : {JobState::queued, JobState::running, JobState::done, JobState::failed, JobState::cancelled})
    if (s == job_state_name(st)) return st;
  return std::nullopt;
}

const char* error_code_name(ErrorKind k) {
  switch (k) {
    case ErrorKind::invalid_input: return "invalid_input";
    case ErrorKind::bad_model: return "bad_model";
    case ErrorKind::out_of_memory: return "out_of_memory";
    case ErrorKind::cancelled: return "cancelled";
    case ErrorKind::internal: return "internal";
    case ErrorKind::not_implemented: return "not_implemented";
  }
  return "internal";
}

json job_to_json(const JobRecord& j) {
  json out = {
      {"id", j.id},
      {"object", "job"},
      {"origin", j.origin},
      {"state", job_state_name(j.state)},
      {"request", request_to_json(j.request)},
      {"mp3_quality", j.mp3_quality >= 0 ? json(j.mp3_quality) : json(nullptr)},
      {"created_at", j.created_at},
      {"started_at", j.started_at > 0 ? json(j.started_at) : json(nullptr)},
      {"finished_at", j.finished_at > 0 ? json(j.finished_at) : json(nullptr)},
      {"stage", j.stage},
      {"stage_progress", {{"done", j.stage_done}, {"total", j.stage_total}, {"unit", j.stage_unit}, {"rate", j.stage_rate}}},
      {"progress", j.progress},
      {"eta_seconds", j.eta_seconds >= 0 ? json(j.eta_seconds) : json(nullptr)},
      {"cancel_requested", j.cancel_requested},
      {"error", j.error_code.empty() ? json(nullptr) : json{{"code", j.error_code}, {"message", j.error_message}}},
      {"test_tone", j.test_tone},
  };
  if (j.state == JobState::done) {
    out["result"] = {{"frames", j.frames},
                     {"stopped_on_end", j.stopped_on_end},
                     {"prompt_tokens", j.prompt_tokens},
                     {"sample_rate", j.sample_rate},
                     {"audio_seconds", j.audio_seconds},
                     {"seconds_ar", j.seconds_ar},
                     {"seconds_acoustic", j.seconds_acoustic},
                     {"seconds_total", j.seconds_total},
                     {"audio_file", j.audio_file},
                     {"has_codes", j.has_codes}};
  }
  return out;
}

namespace {

template <class T>
T field(const json& j, const char* key, const std::string& where, T fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  try {
    return j[key].get<T>();
  } catch (const json::exception& e) {
    throw InvalidInput(fmt::format("{}: field '{}' has the wrong type ({})", where, key, e.what()));
  }
}

}  // namespace

JobRecord job_from_json(const json& j, const std::string& where) {
  if (!j.is_object()) throw InvalidInput(fmt::format("{}: not a JSON object", where));
  JobRecord r;
  r.id = field<std::string>(j, "id", where, "");
  r.origin = field<std::string>(j, "origin", where, "jobs");
  const auto st = parse_job_state(field<std::string>(j, "state", where, ""));
  if (!st) throw InvalidInput(fmt::format("{}: missing or unknown 'state'", where));
  r.state = *st;
  if (!j.contains("request")) throw InvalidInput(fmt::format("{}: missing 'request'", where));
  r.request = parse_request(j["request"], where + " request");
  r.mp3_quality = field<double>(j, "mp3_quality", where, -1);
  r.created_at = field<double>(j, "created_at", where, 0);
  r.started_at = field<double>(j, "started_at", where, 0);
  r.finished_at = field<double>(j, "finished_at", where, 0);
  r.stage = field<std::string>(j, "stage", where, "");
  if (j.contains("stage_progress") && j["stage_progress"].is_object()) {
    const json& sp = j["stage_progress"];
    r.stage_done = field<int64_t>(sp, "done", where, 0);
    r.stage_total = field<int64_t>(sp, "total", where, 0);
    r.stage_unit = field<std::string>(sp, "unit", where, "");
    r.stage_rate = field<double>(sp, "rate", where, 0);
  }
  r.progress = field<double>(j, "progress", where, 0);
  r.eta_seconds = field<double>(j, "eta_seconds", where, -1);
  r.cancel_requested = field<bool>(j, "cancel_requested", where, false);
  if (j.contains("error") && j["error"].is_object()) {
    r.error_code = field<std::string>(j["error"], "code", where, "");
    r.error_message = field<std::string>(j["error"], "message", where, "");
  }
  r.test_tone = field<bool>(j, "test_tone", where, false);
  if (j.contains("result") && j["result"].is_object()) {
    const json& res = j["result"];
    r.frames = field<int64_t>(res, "frames", where, 0);
    r.stopped_on_end = field<bool>(res, "stopped_on_end", where, false);
    r.prompt_tokens = field<int64_t>(res, "prompt_tokens", where, 0);
    r.sample_rate = field<int>(res, "sample_rate", where, 0);
    r.audio_seconds = field<double>(res, "audio_seconds", where, 0);
    r.seconds_ar = field<double>(res, "seconds_ar", where, 0);
    r.seconds_acoustic = field<double>(res, "seconds_acoustic", where, 0);
    r.seconds_total = field<double>(res, "seconds_total", where, 0);
    r.audio_file = field<std::string>(res, "audio_file", where, "");
    r.has_codes = field<bool>(res, "has_codes", where, false);
  }
  return r;
}

}  // namespace mm3::server
