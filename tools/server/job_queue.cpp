// job_queue.cpp — the job manager (job_queue.h): FIFO queue, single worker, cancellation, progress.
#include "server/job_queue.h"

#include <algorithm>
#include <cmath>

#include "core/errors.h"
#include "core/log.h"

namespace mm3::server {

namespace {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Share of the whole job each stage covers, for the overall progress estimate. The AR stage dominates
// the runtime (MODEL.md §7 reports); these are rough weights, the ETA is labelled an estimate.
bool stage_range(const std::string& stage, double& lo, double& hi) {
  if (stage == "ar") { lo = 0.0; hi = 0.70; return true; }
  if (stage == "dit") { lo = 0.70; hi = 0.95; return true; }
  if (stage == "vocoder") { lo = 0.95; hi = 0.99; return true; }
  if (stage == "writing") { lo = 0.99; hi = 0.99; return true; }
  return false;
}

}  // namespace

JobManager::JobManager(JobStore& store, GeneratorFactory factory, ManagerOptions opt)
    : store_(store), factory_(std::move(factory)), opt_(opt) {}

JobManager::~JobManager() { stop(); }

std::vector<std::string> JobManager::start() {
  store_.lock_exclusive();
  JobStore::Loaded loaded = store_.load_all();
  {
    std::lock_guard<std::mutex> lk(mu_);
    MM3_CHECK(!started_, "JobManager::start called twice");
    started_ = true;
    for (JobRecord& r : loaded.jobs) {
      auto e = std::make_shared<Entry>();
      e->rec = std::move(r);
      e->seq = 1;
      e->persisted_seq = 1;
      jobs_[e->rec.id] = e;
    }
  }
  worker_ = std::thread([this] { worker_main(); });
  return loaded.warnings;
}

void JobManager::stop() {
  std::vector<std::shared_ptr<Entry>> dropped;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!stopping_) {
      stopping_ = true;
      for (const std::string& id : queue_) {
        auto& e = jobs_[id];
        e->rec.state = JobState::failed;
        e->rec.error_code = "interrupted";
        e->rec.error_message = "the server shut down before this job started; submit it again";
        e->rec.stage.clear();
        e->rec.finished_at = unix_now();
        ++e->seq;
        dropped.push_back(e);
      }
      queue_.clear();
    }
  }
  changed_.notify_all();
  for (auto& e : dropped) persist(e);
  if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) worker_.join();
}

bool JobManager::stopping() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stopping_;
}

ModelStatus JobManager::model_status() const {
  std::lock_guard<std::mutex> lk(mu_);
  return model_status_;
}
std::string JobManager::model_error() const {
  std::lock_guard<std::mutex> lk(mu_);
  return model_error_;
}
std::string JobManager::model_id() const {
  std::lock_guard<std::mutex> lk(mu_);
  return model_id_;
}
bool JobManager::test_double() const {
  std::lock_guard<std::mutex> lk(mu_);
  return test_double_;
}

std::string JobManager::submit(const Request& req, const std::string& origin, double mp3_quality) {
  auto e = std::make_shared<Entry>();
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_) throw ModelUnavailable("the server is shutting down");
    if (model_status_ == ModelStatus::failed) throw ModelUnavailable("the model failed to load: " + model_error_);
    if (queue_.size() + reserved_ >= opt_.max_queue) {
      ++rejected_;
      throw QueueFull(queue_.size() + reserved_, retry_after_locked());
    }
    ++reserved_;
    e->order = next_order_++;
    e->rec.created_at = unix_now();
    do e->rec.id = new_job_id();
    while (jobs_.count(e->rec.id));  // 2^-128 odds, but a duplicate id must be impossible, not unlikely
  }
  e->rec.origin = origin;
  e->rec.request = req;
  e->rec.mp3_quality = mp3_quality;
  e->rec.state = JobState::queued;
  e->rec.stage = "queued";
  e->seq = 1;
  // The queued record reaches the disk before the worker can see the job, so a crash right after the
  // 202 still leaves a record (reported interrupted at restart) rather than nothing.
  try {
    store_.save(e->rec);
    e->persisted_seq = 1;
  } catch (...) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      --reserved_;
    }
    changed_.notify_all();
    throw;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    --reserved_;
    jobs_[e->rec.id] = e;
    if (stopping_) {
      // stop() ran while we were writing: record the job as never started.
      e->rec.state = JobState::failed;
      e->rec.error_code = "interrupted";
      e->rec.error_message = "the server shut down before this job started; submit it again";
      e->rec.stage.clear();
      e->rec.finished_at = unix_now();
      ++e->seq;
    } else {
      // Submissions finish writing out of order; the queue stays in the order they were accepted.
      auto pos = queue_.end();
      while (pos != queue_.begin() && jobs_[*std::prev(pos)]->order > e->order) --pos;
      queue_.insert(pos, e->rec.id);
      ++submitted_;
    }
  }
  changed_.notify_all();
  if (e->seq > 1) persist(e);
  return e->rec.id;
}

std::optional<JobRecord> JobManager::get(const std::string& id) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return std::nullopt;
  return it->second->rec;
}

std::vector<JobRecord> JobManager::list(size_t limit) const {
  std::vector<JobRecord> out;
  {
    std::lock_guard<std::mutex> lk(mu_);
    out.reserve(jobs_.size());
    for (const auto& [id, e] : jobs_) out.push_back(e->rec);
  }
  std::sort(out.begin(), out.end(), [](const JobRecord& a, const JobRecord& b) {
    return a.created_at != b.created_at ? a.created_at > b.created_at : a.id < b.id;
  });
  if (out.size() > limit) out.resize(limit);
  return out;
}

JobManager::CancelResult JobManager::cancel(const std::string& id) {
  std::shared_ptr<Entry> e;
  CancelResult result;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return CancelResult::not_found;
    e = it->second;
    if (is_terminal(e->rec.state)) return CancelResult::already_finished;
    if (e->rec.state == JobState::queued) {
      queue_.erase(std::remove(queue_.begin(), queue_.end(), id), queue_.end());
      e->rec.state = JobState::cancelled;
      e->rec.cancel_requested = true;
      e->rec.stage.clear();
      e->rec.finished_at = unix_now();
      result = CancelResult::cancelled;
    } else {
      e->rec.cancel_requested = true;  // the worker sees it at the next frame / step
      result = CancelResult::cancelling;
    }
    ++e->seq;
  }
  changed_.notify_all();
  if (result == CancelResult::cancelled) persist(e);
  return result;
}

std::optional<JobManager::Snapshot> JobManager::wait_change(const std::string& id, uint64_t seen,
                                                            std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lk(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return std::nullopt;
  std::shared_ptr<Entry> e = it->second;
  changed_.wait_for(lk, timeout, [&] { return e->seq != seen || is_terminal(e->rec.state) || stopping_; });
  return Snapshot{e->rec, e->seq};
}

ManagerMetrics JobManager::metrics() const {
  ManagerMetrics m;
  std::lock_guard<std::mutex> lk(mu_);
  for (JobState s : {JobState::queued, JobState::running, JobState::done, JobState::failed, JobState::cancelled})
    m.jobs_by_state[job_state_name(s)] = 0;
  for (const auto& [id, e] : jobs_) ++m.jobs_by_state[job_state_name(e->rec.state)];
  m.queue_depth = queue_.size();
  m.submitted = submitted_;
  m.rejected_queue_full = rejected_;
  m.frames_generated = frames_total_;
  m.audio_seconds_generated = audio_seconds_total_;
  m.generation_seconds = generation_seconds_total_;
  m.frames_per_second = last_rate_;
  m.model = model_status_;
  return m;
}

int JobManager::retry_after_seconds() const {
  std::lock_guard<std::mutex> lk(mu_);
  return retry_after_locked();
}

int JobManager::retry_after_locked() const {
  // A slot frees when the running job ends: about one mean job time (30 s before any job finished).
  const double mean = finished_jobs_ ? generation_seconds_total_ / static_cast<double>(finished_jobs_) : 30.0;
  return static_cast<int>(std::clamp(std::ceil(mean), 1.0, 3600.0));
}

void JobManager::persist(const std::shared_ptr<Entry>& e) {
  std::lock_guard<std::mutex> plk(e->persist_mu);
  JobRecord copy;
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lk(mu_);
    copy = e->rec;
    seq = e->seq;
  }
  if (seq <= e->persisted_seq) return;
  try {
    store_.save(copy);
    e->persisted_seq = seq;
  } catch (const std::exception& ex) {
    MM3_LOG_WARN("serve: could not save job {}: {}", copy.id, ex.what());
  }
}

void JobManager::on_progress(const std::shared_ptr<Entry>& e, const ProgressEvent& ev) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    JobRecord& r = e->rec;
    r.stage = ev.stage;
    r.stage_done = ev.done;
    r.stage_total = ev.total;
    r.stage_unit = ev.unit;
    r.stage_rate = ev.rate;
    double lo, hi;
    if (stage_range(ev.stage, lo, hi)) {
      const double f = ev.total > 0 ? std::clamp(static_cast<double>(ev.done) / static_cast<double>(ev.total), 0.0, 1.0) : 0.0;
      r.progress = std::max(r.progress, lo + (hi - lo) * f);  // never runs backwards
    }
    const double elapsed = unix_now() - r.started_at;
    r.eta_seconds = r.progress >= 0.01 ? elapsed * (1.0 - r.progress) / r.progress : -1;
    if (ev.stage == "ar" && ev.rate > 0) last_rate_ = ev.rate;
    ++e->seq;
  }
  changed_.notify_all();
}

void JobManager::worker_main() {
  std::unique_ptr<Generator> g;
  try {
    g = factory_();
    MM3_CHECK(g != nullptr, "the generator factory returned nothing");
  } catch (const std::exception& ex) {
    std::vector<std::shared_ptr<Entry>> failed;
    {
      std::lock_guard<std::mutex> lk(mu_);
      model_status_ = ModelStatus::failed;
      model_error_ = ex.what();
      for (const std::string& id : queue_) {
        auto& e = jobs_[id];
        e->rec.state = JobState::failed;
        e->rec.error_code = "bad_model";
        e->rec.error_message = std::string("the model failed to load: ") + ex.what();
        e->rec.stage.clear();
        e->rec.finished_at = unix_now();
        ++e->seq;
        failed.push_back(e);
      }
      queue_.clear();
    }
    MM3_LOG_WARN("serve: the model failed to load: {}", ex.what());
    changed_.notify_all();
    for (auto& e : failed) persist(e);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    model_id_ = g->model_id();
    test_double_ = g->is_test_double();
    gen_ = std::move(g);
    model_status_ = ModelStatus::ready;
  }
  changed_.notify_all();
  for (;;) {
    std::shared_ptr<Entry> e;
    {
      std::unique_lock<std::mutex> lk(mu_);
      // reserved_ == 0: no earlier-accepted submission is still writing its record, so the front of the
      // queue really is the oldest job (FIFO by acceptance, not by who finished writing first).
      changed_.wait(lk, [&] { return stopping_ || (!queue_.empty() && reserved_ == 0); });
      if (stopping_) break;
      e = jobs_[queue_.front()];
      queue_.pop_front();
      if (e->rec.state != JobState::queued) continue;
      e->rec.state = JobState::running;
      e->rec.started_at = unix_now();
      e->rec.stage = "starting";
      e->rec.test_tone = test_double_;
      running_id_ = e->rec.id;
      ++e->seq;
    }
    changed_.notify_all();
    persist(e);
    run_one(e);
  }
  std::lock_guard<std::mutex> lk(mu_);
  gen_.reset();
}

void JobManager::run_one(const std::shared_ptr<Entry>& e) {
  Request req;
  {
    std::lock_guard<std::mutex> lk(mu_);
    req = e->rec.request;
  }
  RunControl ctl;
  ctl.should_cancel = [this, e] {
    std::lock_guard<std::mutex> lk(mu_);
    return e->rec.cancel_requested || stopping_;
  };
  ctl.on_progress = [this, e](const ProgressEvent& ev) { on_progress(e, ev); };

  JobState final_state = JobState::failed;
  std::string code, message;
  JobRecord result;  // result fields only
  const auto t0 = std::chrono::steady_clock::now();
  try {
    GenerationResult res = gen_->generate(req, ctl);
    on_progress(e, {"writing", 0, 1, 0, "files", ""});
    {
      std::lock_guard<std::mutex> lk(mu_);
      result = e->rec;
    }
    store_.write_result(result, res);
    final_state = JobState::done;
  } catch (const Cancelled&) {
    std::lock_guard<std::mutex> lk(mu_);
    if (e->rec.cancel_requested) {
      final_state = JobState::cancelled;
    } else {
      code = "interrupted";
      message = "the server shut down while this job was running; submit it again";
    }
  } catch (const Error& ex) {
    code = error_code_name(ex.kind());
    message = ex.what();
  } catch (const std::bad_alloc&) {
    code = "out_of_memory";
    message = "an allocation failed while running this job";
  } catch (const std::exception& ex) {
    code = "internal";
    message = ex.what();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  {
    std::lock_guard<std::mutex> lk(mu_);
    JobRecord& r = e->rec;
    r.state = final_state;
    r.finished_at = unix_now();
    r.stage.clear();
    r.eta_seconds = -1;
    r.error_code = code;
    r.error_message = message;
    if (final_state == JobState::done) {
      r.progress = 1.0;
      r.frames = result.frames;
      r.stopped_on_end = result.stopped_on_end;
      r.prompt_tokens = result.prompt_tokens;
      r.sample_rate = result.sample_rate;
      r.audio_seconds = result.audio_seconds;
      r.seconds_ar = result.seconds_ar;
      r.seconds_acoustic = result.seconds_acoustic;
      r.seconds_total = result.seconds_total;
      r.audio_file = result.audio_file;
      r.has_codes = result.has_codes;
      frames_total_ += static_cast<uint64_t>(result.frames);
      audio_seconds_total_ += result.audio_seconds;
      if (result.seconds_ar > 0) last_rate_ = static_cast<double>(result.frames) / result.seconds_ar;
    }
    generation_seconds_total_ += seconds;
    ++finished_jobs_;
    running_id_.clear();
    ++e->seq;
  }
  changed_.notify_all();
  persist(e);
}

}  // namespace mm3::server
