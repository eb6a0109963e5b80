// job_store.cpp — the results directory (job_store.h): ids, atomic writes, loading after a restart.
#include "server/job_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <regex>
#include <sstream>

#include "core/errors.h"
#include "io/npy.h"

namespace mm3::server {

namespace fs = std::filesystem;

std::string new_job_id() {
  unsigned char b[16];
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InternalError("cannot open /dev/urandom for a job id");
  size_t got = 0;
  while (got < sizeof b) {
    const ssize_t n = ::read(fd, b + got, sizeof b - got);
    if (n <= 0) {
      ::close(fd);
      throw InternalError("cannot read /dev/urandom for a job id");
    }
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  static const char* hex = "0123456789abcdef";
  std::string id;
  for (unsigned char c : b) {
    id += hex[c >> 4];
    id += hex[c & 15];
  }
  return id;
}

bool valid_job_id(const std::string& id) {
  static const std::regex re("^[0-9a-f]{32}$");
  return id.size() == 32 && std::regex_match(id, re);
}

void write_file_atomic(const fs::path& path, const std::string& data) {
  // The temp name carries random bits so two writers of one path never share a temp file.
  const fs::path tmp = path.parent_path() / (path.filename().string() + ".tmp-" + new_job_id().substr(0, 12));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw InternalError(fmt::format("cannot create {}: {}", tmp.string(), std::strerror(errno)));
  size_t off = 0;
  while (off < data.size()) {
    const ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw InternalError(fmt::format("writing {} failed: {}", tmp.string(), std::strerror(e)));
    }
    off += static_cast<size_t>(n);
  }
  // fsync before rename: otherwise a power cut can leave the new name pointing at an empty file.
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw InternalError(fmt::format("flushing {} failed: {}", tmp.string(), std::strerror(errno)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw InternalError(fmt::format("renaming {} failed: {}", tmp.string(), std::strerror(e)));
  }
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidInput(fmt::format("cannot read {}", path.string()));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

JobStore::JobStore(const std::string& results_dir) {
  if (results_dir.empty()) throw InvalidInput("--results: give a folder for the job results");
  std::error_code ec;
  fs::create_directories(fs::path(results_dir) / "jobs", ec);
  if (ec) throw InvalidInput(fmt::format("--results {}: cannot create the folder ({})", results_dir, ec.message()));
  root_ = fs::absolute(results_dir) / "jobs";
  if (::access(root_.c_str(), W_OK) != 0)
    throw InvalidInput(fmt::format("--results {}: the folder is not writable", results_dir));
}

JobStore::~JobStore() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

void JobStore::lock_exclusive() {
  if (lock_fd_ >= 0) return;
  const fs::path p = root_.parent_path() / "server.lock";
  const int fd = ::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw InvalidInput(fmt::format("cannot open {}: {}", p.string(), std::strerror(errno)));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    throw InvalidInput(fmt::format("another mm3 serve is using the results folder {} (it holds {})",
                                   root_.parent_path().string(), p.string()));
  }
  lock_fd_ = fd;
}

fs::path JobStore::job_dir(const std::string& id) const {
  if (!valid_job_id(id)) throw InvalidInput(fmt::format("invalid job id '{}'", id.substr(0, 64)));
  return root_ / id;
}

void JobStore::save(const JobRecord& j) {
  const fs::path dir = job_dir(j.id);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw InternalError(fmt::format("cannot create {}: {}", dir.string(), ec.message()));
  write_file_atomic(dir / "job.json", job_to_json(j).dump(2) + "\n");
}

std::string JobStore::audio_file_name(AudioFormat fmt) {
  const char* ext = "wav";
  if (fmt == AudioFormat::flac16 || fmt == AudioFormat::flac24) ext = "flac";
  if (fmt == AudioFormat::mp3) ext = "mp3";
  return fmt::format("audio-{}.{}", audio_format_name(fmt), ext);
}

JobStore::Loaded JobStore::load_all() {
  Loaded out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root_, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || !valid_job_id(name)) continue;
    // Temp files of an interrupted write are garbage: the rename never happened.
    for (const auto& f : fs::directory_iterator(entry.path(), ec)) {
      const std::string fn = f.path().filename().string();
      if (fn.find(".tmp-") != std::string::npos || fn.ends_with(".partial")) fs::remove(f.path(), ec);
    }
    const fs::path meta = entry.path() / "job.json";
    JobRecord j;
    try {
      j = job_from_json(nlohmann::json::parse(read_file(meta)), meta.string());
    } catch (const std::exception& e) {
      out.warnings.push_back(fmt::format("skipped {}: {}", entry.path().string(), e.what()));
      continue;
    }
    if (j.id != name) {
      out.warnings.push_back(fmt::format("skipped {}: its job.json names id '{}'", entry.path().string(), j.id));
      continue;
    }
    bool repaired = false;
    if (j.state == JobState::queued || j.state == JobState::running) {
      j.error_code = "interrupted";
      j.error_message = j.state == JobState::running
                            ? "the server stopped while this job was running (crash, kill or shutdown); submit it again"
                            : "the server stopped before this job started; submit it again";
      j.state = JobState::failed;
      repaired = true;
    } else if (j.state == JobState::done && !fs::exists(entry.path() / "master-f32.wav")) {
      j.state = JobState::failed;
      j.error_code = "internal";
      j.error_message = "the job's audio is missing from the results folder";
      repaired = true;
    }
    if (repaired) {
      j.stage.clear();
      j.eta_seconds = -1;
      if (j.finished_at <= 0) j.finished_at = static_cast<double>(std::time(nullptr));
      try {
        save(j);
      } catch (const std::exception& e) {
        out.warnings.push_back(fmt::format("could not save repaired {}: {}", meta.string(), e.what()));
      }
      out.warnings.push_back(fmt::format("job {} was {}: marked failed ({})", j.id,
                                         j.error_code == "interrupted" ? "interrupted" : "incomplete", j.error_message));
    }
    out.jobs.push_back(std::move(j));
  }
  if (ec) out.warnings.push_back(fmt::format("listing {}: {}", root_.string(), ec.message()));
  std::stable_sort(out.jobs.begin(), out.jobs.end(),
                   [](const JobRecord& a, const JobRecord& b) { return a.created_at < b.created_at; });
  return out;
}

void JobStore::write_result(JobRecord& j, const GenerationResult& r) {
  const fs::path dir = job_dir(j.id);
  fs::create_directories(dir);
  // The master keeps the generator's float samples untouched, so every later conversion starts from
  // the same data (no double quantisation).
  AudioWriteOptions mopt;
  mopt.format = AudioFormat::wav_float;
  const AudioWriteResult master = write_audio((dir / "master-f32.wav").string(), r.audio, r.sample_rate, mopt);
  const AudioFormat fmt = parse_audio_format(j.request.format);
  AudioWriteOptions aopt;
  aopt.format = fmt;
  aopt.sample_rate = j.request.sample_rate;
  if (fmt == AudioFormat::mp3 && j.mp3_quality >= 0) aopt.mp3_quality = j.mp3_quality;
  {
    std::lock_guard<std::mutex> lk(convert_mu_);
    write_audio((dir / audio_file_name(fmt)).string(), r.audio, r.sample_rate, aopt);
  }
  j.has_codes = r.codes.numel() > 0;
  if (j.has_codes) write_npy((dir / "codes.npy").string(), r.codes);
  j.frames = r.frames;
  j.stopped_on_end = r.stopped_on_end;
  j.prompt_tokens = r.prompt_tokens;
  j.sample_rate = r.sample_rate;
  j.audio_seconds = r.sample_rate > 0 ? static_cast<double>(master.stats.frames) / r.sample_rate : 0;
  j.seconds_ar = r.seconds_ar;
  j.seconds_acoustic = r.seconds_acoustic;
  j.seconds_total = r.seconds_total;
  j.audio_file = audio_file_name(fmt);
}

fs::path JobStore::audio_path(const JobRecord& j, AudioFormat fmt) {
  const fs::path dir = job_dir(j.id);
  const fs::path p = dir / audio_file_name(fmt);
  std::lock_guard<std::mutex> lk(convert_mu_);
  if (fs::exists(p)) return p;
  if (!audio_format_available(fmt))
    throw InvalidInput(fmt::format("format {} is not available in this build (libsndfile)", audio_format_name(fmt)));
  AudioData master = read_audio((dir / "master-f32.wav").string());
  AudioWriteOptions opt;
  opt.format = fmt;
  opt.sample_rate = j.request.sample_rate;
  if (fmt == AudioFormat::mp3 && j.mp3_quality >= 0) opt.mp3_quality = j.mp3_quality;
  write_audio(p.string(), master.samples, master.sample_rate, opt);
  return p;
}

fs::path JobStore::codes_path(const JobRecord& j) const { return job_dir(j.id) / "codes.npy"; }

}  // namespace mm3::server
