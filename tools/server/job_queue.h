// job_queue.h — the job manager of `mm3 serve` (issue 7): a bounded FIFO queue, ONE worker thread that
// runs jobs in submission order on one Generator (the model is not re-entrant and one job uses every
// core), per-job cancellation, live progress for the event stream, persistence through JobStore, and the
// counters /metrics reports.
//
// Cancellation: the worker's RunControl::should_cancel is true once the job's cancel was requested or
// the manager is stopping; the generator checks it between frames and steps. A job stopped by a
// shutdown is recorded failed/"interrupted" (it was not the client's wish), one stopped by DELETE or a
// disconnecting synchronous client is "cancelled".
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "server/generator.h"
#include "server/job.h"
#include "server/job_store.h"

namespace mm3::server {

// Thrown by submit() when the queue holds max_queue jobs already.
struct QueueFull : std::runtime_error {
  QueueFull(size_t depth, int retry_after_s)
      : std::runtime_error(fmt::format("the queue is full ({} jobs waiting); retry in about {} s", depth, retry_after_s)),
        retry_after_seconds(retry_after_s) {}
  int retry_after_seconds;
};
// Thrown by submit() when the model could not be loaded: no job could ever run.
struct ModelUnavailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class ModelStatus { loading, ready, failed };

struct ManagerOptions {
  size_t max_queue = 16;  // jobs waiting (the running one not counted)
};

struct ManagerMetrics {
  size_t queue_depth = 0;
  std::map<std::string, size_t> jobs_by_state;  // every state name present, zero included
  uint64_t submitted = 0, rejected_queue_full = 0;
  uint64_t frames_generated = 0;
  double audio_seconds_generated = 0;
  double generation_seconds = 0;  // worker time spent in finished jobs
  double frames_per_second = 0;   // AR rate of the running job, else of the last finished one
  ModelStatus model = ModelStatus::loading;
};

class JobManager {
 public:
  using GeneratorFactory = std::function<std::unique_ptr<Generator>()>;

  JobManager(JobStore& store, GeneratorFactory factory, ManagerOptions opt = {});
  ~JobManager();  // stop()
  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  // Locks the results folder (JobStore::lock_exclusive), loads the jobs on disk (interrupted ones
  // become failed) and starts the worker, which first builds
  // the generator (model status "loading" until then). Returns the store's warnings.
  std::vector<std::string> start();
  // Stops the worker: the running job is interrupted at its next cancellation point, queued jobs are
  // recorded failed/"interrupted". Wakes every waiter. Idempotent.
  void stop();
  bool stopping() const;

  ModelStatus model_status() const;
  std::string model_error() const;
  std::string model_id() const;  // empty until loaded
  bool test_double() const;

  // Queues a job; returns its id. Throws QueueFull, or ModelUnavailable when the model failed to load.
  // `mp3_quality` >= 0 overrides the MP3 compression level (the MiniMax shape's bitrate).
  std::string submit(const Request& req, const std::string& origin, double mp3_quality = -1);

  std::optional<JobRecord> get(const std::string& id) const;
  std::vector<JobRecord> list(size_t limit) const;  // newest first

  enum class CancelResult { not_found, cancelled, cancelling, already_finished };
  CancelResult cancel(const std::string& id);

  struct Snapshot {
    JobRecord job;
    uint64_t seq = 0;  // bumps on every change of the job
  };
  // Blocks until the job's seq differs from `seen`, it is terminal, the manager stops, or `timeout`.
  // Returns the job's current snapshot (nullopt for an unknown id).
  std::optional<Snapshot> wait_change(const std::string& id, uint64_t seen, std::chrono::milliseconds timeout) const;

  // Path of a finished job's audio / codes (see JobStore). Throws InvalidInput like JobStore.
  std::filesystem::path audio_path(const JobRecord& j, AudioFormat fmt) { return store_.audio_path(j, fmt); }
  std::filesystem::path codes_path(const JobRecord& j) const { return store_.codes_path(j); }

  ManagerMetrics metrics() const;
  size_t max_queue() const { return opt_.max_queue; }
  int retry_after_seconds() const;  // a guess from the mean job time and the queue depth

 private:
  struct Entry {
    JobRecord rec;      // guarded by mu_
    uint64_t seq = 0;   // guarded by mu_
    uint64_t order = 0; // submission order (taken under mu_ when the slot is reserved)
    std::mutex persist_mu;       // orders this job's job.json writes
    uint64_t persisted_seq = 0;  // guarded by persist_mu: the newest seq on disk
  };
  void worker_main();
  void run_one(const std::shared_ptr<Entry>& e);
  // Writes the job's current record unless a newer one is on disk already; logs instead of throwing
  // (the state in memory stays right and is what clients see).
  void persist(const std::shared_ptr<Entry>& e);
  void on_progress(const std::shared_ptr<Entry>& e, const ProgressEvent& ev);
  int retry_after_locked() const;

  JobStore& store_;
  GeneratorFactory factory_;
  ManagerOptions opt_;

  mutable std::mutex mu_;
  mutable std::condition_variable changed_;  // any job changed, queue grew, or stopping
  std::map<std::string, std::shared_ptr<Entry>> jobs_;
  std::deque<std::string> queue_;  // ids of queued jobs, FIFO
  bool stopping_ = false;
  bool started_ = false;
  ModelStatus model_status_ = ModelStatus::loading;
  std::string model_error_, model_id_;
  bool test_double_ = false;
  std::unique_ptr<Generator> gen_;
  std::thread worker_;
  std::string running_id_;
  size_t reserved_ = 0;  // queue slots taken by submissions still writing their job.json
  uint64_t next_order_ = 0;

  uint64_t submitted_ = 0, rejected_ = 0, frames_total_ = 0;
  double audio_seconds_total_ = 0, generation_seconds_total_ = 0, last_rate_ = 0;
  uint64_t finished_jobs_ = 0;
};

}  // namespace mm3::server
