// job_store.h — the results directory of `mm3 serve` (issue 7): one folder per job, kept across
// restarts.
//
//   RESULTS/jobs/<id>/job.json          the JobRecord (job.h), rewritten atomically on every state change
//   RESULTS/jobs/<id>/master-f32.wav    the generated audio, float WAV at the generator's output rate
//   RESULTS/jobs/<id>/audio-<fmt>.<ext> the audio in a delivery format at the request's sample rate:
//                                       the requested one at completion, others converted on demand
//   RESULTS/jobs/<id>/codes.npy         [F + 1, 8] int64 codes (replay input for `mm3 generate`)
//
// Every file is written to a temporary name in the same folder and renamed into place, so a crash
// leaves either the old file or the new one, never a torn one. Ids are validated (32 lowercase hex
// digits) before any path is built from them, so no request can name a path outside the folder.
#pragma once

#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "io/audio.h"
#include "pipeline/pipeline.h"
#include "server/job.h"

namespace mm3::server {

// 128 random bits from /dev/urandom as 32 lowercase hex digits. Throws InternalError if it cannot read.
std::string new_job_id();
// ^[0-9a-f]{32}$ — the only ids that ever reach the filesystem.
bool valid_job_id(const std::string& id);

// Writes `data` to `path` atomically: temp file in the same folder, fsync, rename. Throws InternalError.
void write_file_atomic(const std::filesystem::path& path, const std::string& data);
std::string read_file(const std::filesystem::path& path);  // throws InvalidInput when unreadable

class JobStore {
 public:
  // Creates RESULTS/jobs when missing. Throws InvalidInput when RESULTS is not a writable folder.
  explicit JobStore(const std::string& results_dir);
  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  // Takes RESULTS/server.lock (flock, released by the kernel even on kill -9), so a second server on
  // the same folder is refused instead of marking the first one's running job interrupted. Throws
  // InvalidInput when another process holds it.
  void lock_exclusive();

  const std::filesystem::path& root() const { return root_; }
  // RESULTS/jobs/<id>; throws InvalidInput for an invalid id (defence in depth: routes check first).
  std::filesystem::path job_dir(const std::string& id) const;

  void save(const JobRecord& j);  // job.json, atomically

  struct Loaded {
    std::vector<JobRecord> jobs;        // every readable job, oldest first
    std::vector<std::string> warnings;  // folders skipped or repaired, one line each
  };
  // Reads every job folder. A job found queued or running was interrupted by a crash or kill: it is
  // marked failed (code "interrupted") and saved. A done job whose audio is missing is marked failed
  // too. Temporary files left by a crash are removed.
  Loaded load_all();

  // Writes the master, the requested format and the codes of a finished job; fills the result fields
  // of `j` (frames, audio_file, ...). Does not save job.json.
  void write_result(JobRecord& j, const GenerationResult& r);

  // Path of the job's audio in `fmt` at the request's sample rate, converting from the master on first
  // use. Throws InvalidInput when the format is unavailable in this build.
  std::filesystem::path audio_path(const JobRecord& j, AudioFormat fmt);
  std::filesystem::path codes_path(const JobRecord& j) const;

  static std::string audio_file_name(AudioFormat fmt);  // "audio-wav16.wav"

 private:
  std::filesystem::path root_;
  int lock_fd_ = -1;
  std::mutex convert_mu_;  // one conversion at a time (write_audio's temp name is per target path)
};

}  // namespace mm3::server
