// server_test.cpp — `mm3 serve` in process (issue 7): the compat mappings, ids and the results folder,
// the job manager (FIFO, bounded queue, cancel, failure, shutdown), and every HTTP route on loopback
// with the FakeGenerator test double (a synthetic tone, never music): round trip, the bad-input table,
// 20 concurrent submitters, the event stream, a disconnecting synchronous client, auth, restarts.
//
// Every server here binds 127.0.0.1 on a free port (port 0), every client has timeouts, and every wait
// is bounded, so a hang fails the test instead of stalling ctest.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include <httplib.h>

#include "core/errors.h"
#include "server/compat.h"
#include "server/generator.h"
#include "server/http_server.h"
#include "server/job_queue.h"
#include "server/job_store.h"

namespace mm3::server {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;

fs::path fresh_dir(const std::string& name) {
  static std::atomic<int> n{0};
  fs::path d = fs::temp_directory_path() / fmt::format("mm3_server_test_{}_{}_{}", ::getpid(), name, n++);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Polls `pred` every 10 ms for at most `limit`.
template <class F>
bool eventually(F pred, std::chrono::milliseconds limit = 10s) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return pred();
}

const char* kGoodJob = R"({"caption": "Genre: pop. BPM: 96", "lyrics": "[verse]\nhello\n[chorus]\nworld", "duration": 2})";

// ---------------------------------------------------------------------------------------------------
// compat.h: strict JSON and the OpenAI / MiniMax mappings

TEST(Compat, StrictJsonRefusesDuplicatesAndSyntaxErrors) {
  EXPECT_NO_THROW(parse_json_strict(R"({"a": {"b": 1}, "b": 2})", "t"));  // same key in different objects is fine
  EXPECT_THROW(parse_json_strict(R"({"a": 1, "a": 2})", "t"), InvalidInput);
  EXPECT_THROW(parse_json_strict(R"({"x": {"a": 1, "a": 1}})", "t"), InvalidInput);
  EXPECT_THROW(parse_json_strict(R"({"a": 1,})", "t"), InvalidInput);
  EXPECT_THROW(parse_json_strict(R"({"a": 1} // c)", "t"), InvalidInput);
  EXPECT_THROW(parse_json_strict("", "t"), InvalidInput);
}

TEST(Compat, FramesMapExactlyForEveryBudget) {
  // A plain frames / 25 truncates back to frames - 1 for 573 of the 9000 budgets (e.g. 29, 57).
  for (int64_t n = 1; n <= 9000; ++n) {
    Request r;
    r.duration = duration_for_frames(n);
    ASSERT_EQ(frame_budget(r), n) << n;
    ASSERT_LT(r.duration - static_cast<double>(n) / 25.0, 1e-12);
  }
}

TEST(Compat, SpeechMapping) {
  SpeechRequest s = parse_speech_request(json::parse(
      R"({"model": "x", "input": "[verse]\nla", "instructions": "Genre: jazz", "seed": 18446744073709551615,
          "max_new_tokens": 29, "response_format": "flac", "speed": 1, "stream": false})"));
  EXPECT_EQ(s.request.lyrics, "[verse]\nla");
  EXPECT_EQ(s.request.caption, "Genre: jazz");
  EXPECT_EQ(s.request.seed, 18446744073709551615ull);
  EXPECT_EQ(frame_budget(s.request), 29);
  EXPECT_EQ(s.request.format, "flac");
  EXPECT_EQ(s.request.sample_rate, 32000);  // the official server's rate
  SpeechRequest d = parse_speech_request(json::parse(R"({"input": "l", "instructions": "c"})"));
  EXPECT_EQ(frame_budget(d.request), 9000);  // official default max_new_tokens
  EXPECT_EQ(d.request.format, "wav");
  EXPECT_EQ(d.request.seed, 0u);
}

void expect_refused_speech(const std::string& body, std::vector<std::string> fragments) {
  try {
    parse_speech_request(json::parse(body));
    FAIL() << "accepted " << body;
  } catch (const InvalidInput& e) {
    for (const auto& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << f << " not in " << e.what();
  }
}

TEST(Compat, SpeechRefusesUnsupportedFieldsByName) {
  const std::string base = R"("input": "l", "instructions": "c")";
  expect_refused_speech("{" + base + R"(, "temperature": 0.7, "top_p": 0.9, "top_k": 5, "repetition_penalty": 1.1})",
                        {"'temperature'", "'top_p'", "'top_k'", "'repetition_penalty'"});
  expect_refused_speech("{" + base + R"(, "voice": "alloy"})", {"'voice'"});
  expect_refused_speech("{" + base + R"(, "ref_audio": "x.wav"})", {"'ref_audio'"});
  expect_refused_speech("{" + base + R"(, "speed": 1.25})", {"'speed'", "1.25"});
  expect_refused_speech("{" + base + R"(, "stream": true})", {"'stream'"});
  expect_refused_speech("{" + base + R"(, "max_new_tokens": 0})", {"max_new_tokens", "1..9000"});
  expect_refused_speech("{" + base + R"(, "max_new_tokens": 9001})", {"max_new_tokens"});
  expect_refused_speech("{" + base + R"(, "max_new_tokens": "25"})", {"max_new_tokens", "integer"});
  expect_refused_speech("{" + base + R"(, "response_format": "opus"})", {"opus"});
  expect_refused_speech("{" + base + R"(, "seed": -1})", {"seed"});
  expect_refused_speech(R"({"input": "l"})", {"instructions"});
  expect_refused_speech(R"({"instructions": "c"})", {"input"});
  expect_refused_speech(R"({"input": "  ", "instructions": "c"})", {"lyrics"});
}

TEST(Compat, MusicGenerationMapping) {
  MusicGenerationRequest m = parse_music_generation_request(json::parse(
      R"({"model": "music-1.5", "prompt": "Genre: rock", "lyrics": "[verse]\nyeah",
          "audio_setting": {"sample_rate": 32000, "bitrate": 128000, "format": "wav"}, "output_format": "url"})"));
  EXPECT_EQ(m.request.caption, "Genre: rock");
  EXPECT_EQ(m.request.lyrics, "[verse]\nyeah");
  EXPECT_EQ(m.request.sample_rate, 32000);
  EXPECT_EQ(m.request.format, "wav");
  EXPECT_EQ(m.output_format, "url");
  EXPECT_EQ(m.bitrate, 128000);
  MusicGenerationRequest d = parse_music_generation_request(json::parse(R"({"prompt": "p", "lyrics": "l"})"));
  EXPECT_EQ(d.request.format, "mp3");  // the cloud API's defaults
  EXPECT_EQ(d.request.sample_rate, 44100);
  EXPECT_EQ(d.output_format, "hex");
  EXPECT_DOUBLE_EQ(d.request.duration, Request{}.duration);
  for (const char* bad : {R"({"prompt": "p", "lyrics": "l", "audio_setting": {"format": "pcm"}})",
                          R"({"prompt": "p", "lyrics": "l", "audio_setting": {"sample_rate": 16000}})",
                          R"({"prompt": "p", "lyrics": "l", "audio_setting": {"bitrate": 100}})",
                          R"({"prompt": "p", "lyrics": "l", "audio_setting": {"channels": 1}})",
                          R"({"prompt": "p", "lyrics": "l", "output_format": "base64"})",
                          R"({"prompt": "p", "lyrics": "l", "stream": true})",
                          R"({"prompt": "p", "lyrics": "l", "refer_voice": "x"})", R"({"lyrics": "l"})"})
    EXPECT_THROW(parse_music_generation_request(json::parse(bad)), InvalidInput) << bad;
}

// ---------------------------------------------------------------------------------------------------
// job_store.h: ids, atomic files, restart

TEST(JobStore, IdsAreRandomHexAndValidated) {
  std::set<std::string> ids;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = new_job_id();
    ASSERT_TRUE(valid_job_id(id)) << id;
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), 1000u);
  for (const char* bad : {"", "../../etc/passwd", "0123456789abcdef0123456789abcde", "0123456789abcdef0123456789abcdef0",
                          "0123456789ABCDEF0123456789ABCDEF", "0123456789abcdef/123456789abcdef", "..",
                          "0123456789abcdef0123456789abcdeg"})
    EXPECT_FALSE(valid_job_id(bad)) << bad;
  JobStore store(fresh_dir("ids").string());
  EXPECT_THROW(store.job_dir("../x"), InvalidInput);
}

TEST(JobStore, SaveLoadAndInterruptedJobsBecomeFailed) {
  const fs::path dir = fresh_dir("store");
  JobStore store(dir.string());
  JobRecord done, running, queued, cancelled;
  done.id = new_job_id();
  done.state = JobState::done;
  done.request.caption = "c";
  done.request.lyrics = "l";
  done.created_at = 1;
  running = done;
  running.id = new_job_id();
  running.state = JobState::running;
  running.created_at = 2;
  queued = done;
  queued.id = new_job_id();
  queued.state = JobState::queued;
  queued.created_at = 3;
  cancelled = done;
  cancelled.id = new_job_id();
  cancelled.state = JobState::cancelled;
  cancelled.created_at = 4;
  for (auto* j : {&done, &running, &queued, &cancelled}) store.save(*j);
  // The done job's master exists; a crash's temp file and a foreign folder are left around.
  std::ofstream(store.job_dir(done.id) / "master-f32.wav") << "x";
  std::ofstream(store.job_dir(done.id) / "job.json.tmp-abc") << "torn";
  fs::create_directories(dir / "jobs" / "not-a-job");

  JobStore again(dir.string());
  JobStore::Loaded l = again.load_all();
  ASSERT_EQ(l.jobs.size(), 4u);
  EXPECT_EQ(l.jobs[0].id, done.id);  // oldest first
  EXPECT_EQ(l.jobs[0].state, JobState::done);
  EXPECT_EQ(l.jobs[1].state, JobState::failed);
  EXPECT_EQ(l.jobs[1].error_code, "interrupted");
  EXPECT_EQ(l.jobs[2].state, JobState::failed);
  EXPECT_EQ(l.jobs[2].error_code, "interrupted");
  EXPECT_EQ(l.jobs[3].state, JobState::cancelled);
  EXPECT_FALSE(fs::exists(store.job_dir(done.id) / "job.json.tmp-abc"));
  // The repair was written back: a third start sees failed, not running.
  JobStore third(dir.string());
  EXPECT_EQ(third.load_all().jobs[1].state, JobState::failed);
}

TEST(JobStore, OneServerPerResultsFolder) {
  const fs::path dir = fresh_dir("lock");
  JobStore a(dir.string()), b(dir.string());
  a.lock_exclusive();
  EXPECT_THROW(b.lock_exclusive(), InvalidInput);
  JobManager m(b, [] { return std::unique_ptr<Generator>(new FakeGenerator(0)); });
  EXPECT_THROW(m.start(), InvalidInput);
}

// ---------------------------------------------------------------------------------------------------
// job_queue.h with the test double

struct Manager {
  fs::path dir;
  JobStore store;
  JobManager jobs;
  Manager(double seconds, size_t max_queue = 16, const std::string& name = "mgr")
      : dir(fresh_dir(name)),
        store(dir.string()),
        jobs(store, [seconds] { return std::unique_ptr<Generator>(new FakeGenerator(seconds)); },
             ManagerOptions{max_queue}) {
    jobs.start();
  }
  Request req(double duration = 1.0, uint64_t seed = 0) {
    Request r;
    r.caption = "Genre: test";
    r.lyrics = "[verse]\nla";
    r.duration = duration;
    r.seed = seed;
    return r;
  }
  JobState state(const std::string& id) { return jobs.get(id)->state; }
};

TEST(JobManager, RunsJobsInSubmissionOrder) {
  Manager m(0.05);
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(m.jobs.submit(m.req(0.4, i), "jobs"));
  ASSERT_TRUE(eventually([&] { return m.state(ids.back()) == JobState::done; }));
  for (size_t i = 1; i < ids.size(); ++i) {
    auto a = *m.jobs.get(ids[i - 1]), b = *m.jobs.get(ids[i]);
    EXPECT_EQ(a.state, JobState::done);
    EXPECT_LE(a.finished_at, b.started_at) << "job " << i << " started before job " << i - 1 << " finished";
  }
}

TEST(JobManager, BoundedQueueRefusesWithRetryAfter) {
  Manager m(2.0, 2);
  const std::string running = m.jobs.submit(m.req(), "jobs");
  ASSERT_TRUE(eventually([&] { return m.state(running) == JobState::running; }));
  m.jobs.submit(m.req(), "jobs");
  m.jobs.submit(m.req(), "jobs");
  try {
    m.jobs.submit(m.req(), "jobs");
    FAIL() << "a third queued job was accepted with --max-queue 2";
  } catch (const QueueFull& e) {
    EXPECT_GE(e.retry_after_seconds, 1);
  }
  EXPECT_EQ(m.jobs.metrics().rejected_queue_full, 1u);
}

TEST(JobManager, CancelQueuedAndRunning) {
  Manager m(3.0);
  const std::string a = m.jobs.submit(m.req(), "jobs"), b = m.jobs.submit(m.req(), "jobs");
  ASSERT_TRUE(eventually([&] { return m.state(a) == JobState::running; }));
  EXPECT_EQ(m.jobs.cancel(b), JobManager::CancelResult::cancelled);
  EXPECT_EQ(m.state(b), JobState::cancelled);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(m.jobs.cancel(a), JobManager::CancelResult::cancelling);
  // Checked between frames: the 3 s job stops well before its end.
  ASSERT_TRUE(eventually([&] { return m.state(a) == JobState::cancelled; }, 1500ms));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  EXPECT_EQ(m.jobs.cancel(a), JobManager::CancelResult::already_finished);
  EXPECT_EQ(m.jobs.cancel(new_job_id()), JobManager::CancelResult::not_found);
  EXPECT_TRUE(m.jobs.get(a)->error_code.empty());  // cancellation is not an error
}

TEST(JobManager, FailureIsRecordedWithItsKind) {
  Manager m(0.01);
  Request r = m.req();
  r.caption = "FAKE_FAIL please";
  const std::string id = m.jobs.submit(r, "jobs");
  ASSERT_TRUE(eventually([&] { return is_terminal(m.state(id)); }));
  const JobRecord j = *m.jobs.get(id);
  EXPECT_EQ(j.state, JobState::failed);
  EXPECT_EQ(j.error_code, "internal");
  EXPECT_NE(j.error_message.find("FAKE_FAIL"), std::string::npos);
  // The worker survives a failed job.
  const std::string ok = m.jobs.submit(m.req(), "jobs");
  ASSERT_TRUE(eventually([&] { return m.state(ok) == JobState::done; }));
}

TEST(JobManager, StopInterruptsTheRunningJobAndFailsTheQueue) {
  Manager m(5.0);
  const std::string a = m.jobs.submit(m.req(), "jobs"), b = m.jobs.submit(m.req(), "jobs");
  ASSERT_TRUE(eventually([&] { return m.state(a) == JobState::running; }));
  const auto t0 = std::chrono::steady_clock::now();
  m.jobs.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  EXPECT_EQ(m.state(a), JobState::failed);
  EXPECT_EQ(m.jobs.get(a)->error_code, "interrupted");
  EXPECT_EQ(m.state(b), JobState::failed);
  EXPECT_EQ(m.jobs.get(b)->error_code, "interrupted");
  EXPECT_THROW(m.jobs.submit(m.req(), "jobs"), ModelUnavailable);
  // On disk too.
  JobStore again(m.dir.string());
  for (const JobRecord& j : again.load_all().jobs) EXPECT_EQ(j.state, JobState::failed) << j.id;
}

// ---------------------------------------------------------------------------------------------------
// HTTP, in process

struct Served {
  fs::path dir;
  std::unique_ptr<JobStore> store;
  std::unique_ptr<JobManager> jobs;
  std::unique_ptr<HttpServer> http;
  std::thread thread;
  int port = 0;

  explicit Served(double seconds, ServerOptions opt = {}, size_t max_queue = 64, fs::path reuse = {},
                  JobManager::GeneratorFactory factory = nullptr)
      : dir(reuse.empty() ? fresh_dir("http") : reuse) {
    store = std::make_unique<JobStore>(dir.string());
    if (!factory) factory = [seconds] { return std::unique_ptr<Generator>(new FakeGenerator(seconds)); };
    jobs = std::make_unique<JobManager>(*store, factory, ManagerOptions{max_queue});
    opt.host = "127.0.0.1";
    opt.port = 0;
    http = std::make_unique<HttpServer>(*jobs, opt);
    port = http->bind();
    jobs->start();
    thread = std::thread([this] { http->run(); });
  }
  ~Served() { shutdown(); }
  void shutdown() {
    if (!thread.joinable()) return;
    jobs->stop();
    http->stop();
    thread.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_connection_timeout(5);
    c.set_read_timeout(20);
    c.set_write_timeout(5);
    return c;
  }
};

json body_of(const httplib::Result& r) {
  if (!r) return json();
  try {
    return json::parse(r->body);
  } catch (...) {
    return json();
  }
}

std::string submit_ok(httplib::Client& c, const std::string& body = kGoodJob, const httplib::Headers& h = {}) {
  auto r = c.Post("/v1/jobs", h, body, "application/json");
  EXPECT_TRUE(r);
  if (!r) return "";
  EXPECT_EQ(r->status, 202) << r->body;
  return body_of(r).value("id", "");
}

json wait_terminal(httplib::Client& c, const std::string& id, std::chrono::milliseconds limit = 15s,
                   const httplib::Headers& h = {}) {
  json j;
  eventually([&] {
    auto r = c.Get(("/v1/jobs/" + id).c_str(), h);
    if (!r || r->status != 200) return false;
    j = json::parse(r->body);
    return j["state"] != "queued" && j["state"] != "running";
  }, limit);
  return j;
}

// Minimal RIFF reader: sample rate, channels, bits, frames of a PCM WAV.
struct WavInfo {
  int rate = 0, channels = 0, bits = 0;
  int64_t frames = 0;
};
WavInfo wav_info(const std::string& b) {
  WavInfo w;
  if (b.size() < 44 || b.compare(0, 4, "RIFF") != 0 || b.compare(8, 4, "WAVE") != 0) return w;
  size_t p = 12;
  auto u32 = [&](size_t o) { uint32_t v; std::memcpy(&v, b.data() + o, 4); return v; };
  auto u16 = [&](size_t o) { uint16_t v; std::memcpy(&v, b.data() + o, 2); return v; };
  while (p + 8 <= b.size()) {
    const std::string id = b.substr(p, 4);
    const uint32_t len = u32(p + 4);
    if (id == "fmt ") {
      w.channels = u16(p + 10);
      w.rate = static_cast<int>(u32(p + 12));
      w.bits = u16(p + 22);
    } else if (id == "data" && w.channels && w.bits) {
      w.frames = len / (w.channels * w.bits / 8);
    }
    p += 8 + len + (len & 1);
  }
  return w;
}

// The shape in a .npy header, e.g. "(51, 8)".
std::string npy_shape(const std::string& b) {
  const auto s = b.find("'shape': ");
  if (b.compare(0, 6, "\x93NUMPY") != 0 || s == std::string::npos) return "";
  return b.substr(s + 9, b.find(')', s) - s - 8);
}

TEST(Http, RoundTripEveryRoute) {
  Served s(0.3);
  auto c = s.client();

  auto page = c.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_NE(page->get_header_value("Content-Type").find("text/html"), std::string::npos);
  for (const char* needle : {"id=\"caption\"", "id=\"lyrics\"", "id=\"duration\"", "id=\"seed\"", "[chorus]",
                             "/events", "id=\"jobs\""})
    EXPECT_NE(page->body.find(needle), std::string::npos) << needle;

  ASSERT_TRUE(eventually([&] { auto r = c.Get("/health"); return r && r->status == 200; }));
  json h = body_of(c.Get("/health"));
  EXPECT_EQ(h["status"], "ok");
  EXPECT_EQ(h["test_tone"], true);
  json models = body_of(c.Get("/v1/models"));
  ASSERT_EQ(models["data"].size(), 1u);
  EXPECT_EQ(models["data"][0]["id"], "mm3-test-tone");

  // Native job: submit, follow the events to the end, fetch every artefact.
  auto post = c.Post("/v1/jobs", kGoodJob, "application/json");
  ASSERT_TRUE(post);
  ASSERT_EQ(post->status, 202) << post->body;
  const std::string id = body_of(post)["id"];
  EXPECT_TRUE(valid_job_id(id));
  EXPECT_EQ(post->get_header_value("Location"), "/v1/jobs/" + id);

  std::string stream;
  auto ev = c.Get(("/v1/jobs/" + id + "/events").c_str(), [&](const char* d, size_t n) {
    stream.append(d, n);
    return stream.size() < (1 << 22);
  });
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->get_header_value("Content-Type"), "text/event-stream");
  EXPECT_NE(stream.find("event: progress"), std::string::npos) << stream.substr(0, 400);
  const auto done_at = stream.find("event: done");
  ASSERT_NE(done_at, std::string::npos) << stream.substr(0, 400);
  EXPECT_EQ(stream.find("event: ", done_at + 5), std::string::npos) << "events after the terminal one";
  // Progress only grows.
  double last = -1;
  for (size_t p = stream.find("data: "); p != std::string::npos; p = stream.find("data: ", p + 1)) {
    json e = json::parse(stream.substr(p + 6, stream.find('\n', p) - p - 6));
    EXPECT_GE(e["progress"].get<double>(), last);
    last = e["progress"];
  }
  EXPECT_DOUBLE_EQ(last, 1.0);

  json job = body_of(c.Get(("/v1/jobs/" + id).c_str()));
  EXPECT_EQ(job["state"], "done");
  EXPECT_EQ(job["result"]["frames"], 50);
  EXPECT_EQ(job["request"]["duration"], 2.0);
  EXPECT_EQ(job["test_tone"], true);

  auto wav = c.Get(("/v1/jobs/" + id + "/audio").c_str());
  ASSERT_TRUE(wav);
  ASSERT_EQ(wav->status, 200);
  EXPECT_EQ(wav->get_header_value("Content-Type"), "audio/wav");
  WavInfo w = wav_info(wav->body);
  EXPECT_EQ(w.rate, 44100);
  EXPECT_EQ(w.channels, 2);
  EXPECT_EQ(w.bits, 16);
  EXPECT_EQ(w.frames, 2 * 44100);
  auto w24 = c.Get(("/v1/jobs/" + id + "/audio?format=wav24").c_str());
  ASSERT_TRUE(w24);
  EXPECT_EQ(wav_info(w24->body).bits, 24);
  auto flac = c.Get(("/v1/jobs/" + id + "/audio?format=flac").c_str());
  ASSERT_TRUE(flac);
  EXPECT_EQ(flac->status, 200);
  EXPECT_EQ(flac->body.substr(0, 4), "fLaC");
  EXPECT_EQ(flac->get_header_value("Content-Type"), "audio/flac");
  auto mp3 = c.Get(("/v1/jobs/" + id + "/audio?format=mp3").c_str());
  ASSERT_TRUE(mp3);
  EXPECT_EQ(mp3->status, 200);
  ASSERT_GE(mp3->body.size(), 3u);
  EXPECT_TRUE(mp3->body.compare(0, 3, "ID3") == 0 ||
              (static_cast<unsigned char>(mp3->body[0]) == 0xFF && (static_cast<unsigned char>(mp3->body[1]) & 0xE0) == 0xE0));
  auto codes = c.Get(("/v1/jobs/" + id + "/codes").c_str());
  ASSERT_TRUE(codes);
  EXPECT_EQ(codes->status, 200);
  EXPECT_EQ(npy_shape(codes->body), "(51,8)");
  EXPECT_NE(codes->body.find("'<i8'"), std::string::npos);

  json list = body_of(c.Get("/v1/jobs"));
  ASSERT_EQ(list["data"].size(), 1u);
  EXPECT_EQ(list["data"][0]["id"], id);

  auto del = c.Delete(("/v1/jobs/" + id).c_str());
  ASSERT_TRUE(del);
  EXPECT_EQ(del->status, 409);

  // OpenAI-style: 25 frames -> 1 s at the official 32 kHz.
  auto sp = c.Post("/v1/audio/speech",
                   R"({"model": "mm3", "input": "[verse]\nla", "instructions": "Genre: pop", "max_new_tokens": 25,
                       "seed": 7})",
                   "application/json");
  ASSERT_TRUE(sp);
  ASSERT_EQ(sp->status, 200) << sp->body;
  WavInfo sw = wav_info(sp->body);
  EXPECT_EQ(sw.rate, 32000);
  EXPECT_EQ(sw.frames, 32000);
  EXPECT_TRUE(valid_job_id(sp->get_header_value("X-Job-Id")));
  auto sp3 = c.Post("/v1/audio/speech",
                    R"({"input": "[verse]\nla", "instructions": "Genre: pop", "max_new_tokens": 29, "response_format": "mp3"})",
                    "application/json");
  ASSERT_TRUE(sp3);
  EXPECT_EQ(sp3->status, 200);
  EXPECT_EQ(sp3->get_header_value("Content-Type"), "audio/mpeg");
  EXPECT_EQ(body_of(c.Get(("/v1/jobs/" + sp3->get_header_value("X-Job-Id")).c_str()))["result"]["frames"], 29);

  // MiniMax shape, hex and url.
  auto mg = c.Post("/v1/music_generation",
                   R"({"model": "music-1.5", "prompt": "Genre: pop", "lyrics": "[verse]\nla",
                       "audio_setting": {"format": "wav", "sample_rate": 44100}})",
                   "application/json");
  ASSERT_TRUE(mg);
  ASSERT_EQ(mg->status, 200) << mg->body.substr(0, 300);
  json mj = json::parse(mg->body);
  EXPECT_EQ(mj["base_resp"]["status_code"], 0);
  EXPECT_EQ(mj["data"]["status"], 2);
  const std::string hex = mj["data"]["audio"];
  ASSERT_EQ(hex.size() % 2, 0u);
  std::string bytes;
  for (size_t i = 0; i < hex.size(); i += 2) bytes += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  WavInfo mw = wav_info(bytes);
  EXPECT_EQ(mw.rate, 44100);
  EXPECT_EQ(mw.frames, 60 * 44100);  // the request default: 60 s
  EXPECT_EQ(mj["extra_info"]["music_size"], bytes.size());
  EXPECT_EQ(mj["extra_info"]["music_duration"], 60000);
  auto mu = c.Post("/v1/music_generation",
                   R"({"prompt": "Genre: pop", "lyrics": "[verse]\nla", "output_format": "url",
                       "audio_setting": {"format": "flac", "sample_rate": 32000}})",
                   "application/json");
  ASSERT_TRUE(mu);
  ASSERT_EQ(mu->status, 200);
  const std::string url = json::parse(mu->body)["data"]["audio"];
  const std::string prefix = fmt::format("http://127.0.0.1:{}", s.port);
  ASSERT_EQ(url.rfind(prefix, 0), 0u) << url;
  auto fetched = c.Get(url.substr(prefix.size()).c_str());
  ASSERT_TRUE(fetched);
  EXPECT_EQ(fetched->status, 200);
  EXPECT_EQ(fetched->get_header_value("Content-Type"), "audio/flac");
  EXPECT_EQ(fetched->body.substr(0, 4), "fLaC");

  const std::string metrics = c.Get("/metrics")->body;
  for (const char* line : {"mm3_queue_depth 0", "mm3_jobs{state=\"done\"} 5", "mm3_jobs_submitted_total 5",
                           "mm3_frames_generated_total 3104", "mm3_audio_seconds_generated_total 124.160",
                           "mm3_model_ready 1"})
    EXPECT_NE(metrics.find(line), std::string::npos) << line << "\n" << metrics;
  EXPECT_NE(metrics.find("# TYPE mm3_frames_per_second gauge"), std::string::npos);
}

struct BadCase {
  const char* what;
  const char* method;
  std::string path;
  std::string body;
  std::string content_type;
  int status;
  const char* code;
  const char* fragment;  // must appear in the message
};

TEST(Http, BadInputTableAnswersJsonErrorsAndStaysHealthy) {
  ServerOptions opt;
  opt.max_body_bytes = 64 * 1024;
  Served s(0.05, opt);
  auto c = s.client();
  ASSERT_TRUE(eventually([&] { auto r = c.Get("/health"); return r && r->status == 200; }));
  const std::string j = "application/json";
  const std::string unknown = new_job_id();
  std::vector<BadCase> cases = {
      {"malformed JSON", "POST", "/v1/jobs", R"({"caption": "x", )", j, 400, "invalid_json", "not valid JSON"},
      {"trailing comma", "POST", "/v1/jobs", R"({"caption": "x", "lyrics": "y",})", j, 400, "invalid_json", ""},
      {"duplicate key", "POST", "/v1/jobs", R"({"caption": "x", "lyrics": "y", "lyrics": "z"})", j, 400, "invalid_json", "twice"},
      {"not an object", "POST", "/v1/jobs", "[1, 2]", j, 400, "invalid_input", "object"},
      {"wrong type duration", "POST", "/v1/jobs", R"({"caption": "x", "lyrics": "y", "duration": "60"})", j, 400, "invalid_input", "duration"},
      {"wrong type caption", "POST", "/v1/jobs", R"({"caption": 5, "lyrics": "y"})", j, 400, "invalid_input", "caption"},
      {"negative seed", "POST", "/v1/jobs", R"({"caption": "x", "lyrics": "y", "seed": -1})", j, 400, "invalid_input", "seed"},
      {"unknown key", "POST", "/v1/jobs", R"({"caption": "x", "lyrics": "y", "temperature": 1})", j, 400, "invalid_input", "temperature"},
      {"empty lyrics", "POST", "/v1/jobs", R"({"caption": "x", "lyrics": "  \n "})", j, 400, "invalid_input", "lyrics"},
      {"missing caption", "POST", "/v1/jobs", R"({"lyrics": "y"})", j, 400, "invalid_input", "caption"},
      {"duration 0", "POST", "/v1/jobs", R"({"caption": "x", "lyrics": "y", "duration": 0})", j, 400, "invalid_input", "duration"},
      {"duration 10000", "POST", "/v1/jobs", R"({"caption": "x", "lyrics": "y", "duration": 10000})", j, 400, "invalid_input", "duration"},
      {"bad format", "POST", "/v1/jobs", R"({"caption": "x", "lyrics": "y", "format": "ogg"})", j, 400, "invalid_input", "ogg"},
      {"oversize body", "POST", "/v1/jobs",
       R"({"caption": "x", "lyrics": ")" + std::string(100 * 1024, 'a') + R"("})", j, 413, "payload_too_large", ""},
      {"form content type", "POST", "/v1/jobs", "caption=x", "application/x-www-form-urlencoded", 415,
       "unsupported_media_type", "application/json"},
      {"unknown job id", "GET", "/v1/jobs/" + unknown, "", "", 404, "not_found", unknown.c_str()},
      {"malformed job id", "GET", "/v1/jobs/0123456789ABCDEF0123456789ABCDEF", "", "", 404, "not_found", "hex"},
      {"dot-dot job id", "GET", "/v1/jobs/..", "", "", 404, "not_found", "hex"},
      {"encoded traversal", "GET", "/v1/jobs/..%2F..%2Fetc%2Fpasswd", "", "", 404, "not_found", ""},
      {"traversal in audio", "GET", "/v1/jobs/..%2Fjob.json/audio", "", "", 404, "not_found", ""},
      {"unknown job audio", "GET", "/v1/jobs/" + unknown + "/audio", "", "", 404, "not_found", ""},
      {"unknown job codes", "GET", "/v1/jobs/" + unknown + "/codes", "", "", 404, "not_found", ""},
      {"unknown job events", "GET", "/v1/jobs/" + unknown + "/events", "", "", 404, "not_found", ""},
      {"cancel unknown job", "DELETE", "/v1/jobs/" + unknown, "", "", 404, "not_found", ""},
      {"bad list limit", "GET", "/v1/jobs?limit=abc", "", "", 400, "invalid_input", "limit"},
      {"unknown route", "GET", "/v2/everything", "", "", 404, "not_found", "/v2/everything"},
      {"speech voice", "POST", "/v1/audio/speech", R"({"input": "l", "instructions": "c", "voice": "alloy"})", j, 400,
       "invalid_input", "'voice'"},
      {"speech sampling", "POST", "/v1/audio/speech", R"({"input": "l", "instructions": "c", "top_k": 3, "top_p": 0.5})", j,
       400, "invalid_input", "'top_p'"},
      {"speech speed", "POST", "/v1/audio/speech", R"({"input": "l", "instructions": "c", "speed": 2})", j, 400,
       "invalid_input", "speed"},
      {"speech stream", "POST", "/v1/audio/speech", R"({"input": "l", "instructions": "c", "stream": true})", j, 400,
       "invalid_input", "stream"},
      {"speech frames 0", "POST", "/v1/audio/speech", R"({"input": "l", "instructions": "c", "max_new_tokens": 0})", j, 400,
       "invalid_input", "max_new_tokens"},
      {"speech frames 9001", "POST", "/v1/audio/speech", R"({"input": "l", "instructions": "c", "max_new_tokens": 9001})", j,
       400, "invalid_input", "max_new_tokens"},
      {"music pcm", "POST", "/v1/music_generation", R"({"prompt": "p", "lyrics": "l", "audio_setting": {"format": "pcm"}})",
       j, 400, "invalid_input", "pcm"},
      {"music malformed", "POST", "/v1/music_generation", "{", j, 400, "invalid_json", ""},
  };
  for (const BadCase& bc : cases) {
    SCOPED_TRACE(bc.what);
    httplib::Result r = std::string(bc.method) == "POST" ? c.Post(bc.path.c_str(), bc.body, bc.content_type.c_str())
                        : std::string(bc.method) == "DELETE" ? c.Delete(bc.path.c_str())
                                                             : c.Get(bc.path.c_str());
    ASSERT_TRUE(r) << "no response";
    EXPECT_EQ(r->status, bc.status) << r->body;
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
    json e = body_of(r);
    ASSERT_TRUE(e.contains("error")) << r->body;
    EXPECT_EQ(e["error"]["code"], bc.code) << r->body;
    EXPECT_NE(e["error"]["message"].get<std::string>().find(bc.fragment), std::string::npos) << r->body;
    if (bc.path == "/v1/music_generation") {
      EXPECT_EQ(e["base_resp"]["status_code"], 2013) << r->body;
    }
  }
  // Audio of a job that has not finished, and an unknown audio format.
  const std::string id = submit_ok(c);
  auto early = c.Get(("/v1/jobs/" + id + "/codes").c_str());
  ASSERT_TRUE(early);
  EXPECT_TRUE(early->status == 409 || early->status == 200);  // 200 only if it already finished
  ASSERT_EQ(wait_terminal(c, id)["state"], "done");
  auto badfmt = c.Get(("/v1/jobs/" + id + "/audio?format=ogg").c_str());
  ASSERT_TRUE(badfmt);
  EXPECT_EQ(badfmt->status, 400);
  // Nothing refused made a job; the server still works.
  EXPECT_EQ(body_of(c.Get("/v1/jobs"))["data"].size(), 1u);
  EXPECT_EQ(c.Get("/health")->status, 200);
  EXPECT_EQ(wait_terminal(c, submit_ok(c))["state"], "done");
}

TEST(Http, ChunkedUploadsAndForeignHostsAreRefused) {
  Served s(0.05);
  // Raw request with a chunked body: httplib 0.11 would not apply the body limit to it.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(s.port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const std::string req =
      "POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5\r\n{\"a\":\r\n0\r\n\r\n";
  ASSERT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
  char buf[4096];
  const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
  ::close(fd);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(n)).substr(0, 12), "HTTP/1.1 411");

  auto c = s.client();
  auto r = c.Get("/v1/models", {{"Host", "attacker.example"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 403);
  EXPECT_EQ(body_of(r)["error"]["code"], "forbidden_host");
  auto ok = c.Get("/v1/models", {{"Host", "localhost:1234"}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

TEST(Http, BearerTokenOnEveryRouteButHealthAndPage) {
  ServerOptions opt;
  opt.api_key = "s3cret-token";
  Served s(0.05, opt);
  auto c = s.client();
  ASSERT_TRUE(eventually([&] { auto r = c.Get("/health"); return r && r->status == 200; }));
  EXPECT_EQ(c.Get("/")->status, 200);
  const std::string id = new_job_id();
  for (const std::string& path : std::vector<std::string>{"/v1/models", "/metrics", "/v1/jobs", "/v1/jobs/" + id, "/v1/jobs/" + id + "/audio",
                                 "/v1/jobs/" + id + "/events", "/v1/jobs/" + id + "/codes"}) {
    for (const httplib::Headers& h : {httplib::Headers{}, httplib::Headers{{"Authorization", "Bearer wrong"}},
                                      httplib::Headers{{"Authorization", "s3cret-token"}}}) {
      auto r = c.Get(path.c_str(), h);
      ASSERT_TRUE(r) << path;
      EXPECT_EQ(r->status, 401) << path;
      EXPECT_EQ(body_of(r)["error"]["code"], "unauthorized") << path;
      EXPECT_EQ(r->get_header_value("WWW-Authenticate"), "Bearer");
    }
  }
  for (const char* path : {"/v1/jobs", "/v1/audio/speech", "/v1/music_generation"}) {
    auto r = c.Post(path, kGoodJob, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401) << path;
  }
  EXPECT_EQ(c.Delete(("/v1/jobs/" + id).c_str())->status, 401);
  EXPECT_EQ(body_of(c.Get("/v1/jobs"))["error"]["code"], "unauthorized");
  const httplib::Headers good = {{"Authorization", "Bearer s3cret-token"}};
  const std::string job = submit_ok(c, kGoodJob, good);
  EXPECT_EQ(wait_terminal(c, job, 10s, good)["state"], "done");
  EXPECT_EQ(c.Get(("/v1/jobs/" + job + "/audio").c_str(), good)->status, 200);
}

TEST(Http, TwentyConcurrentSubmittersLoseNothing) {
  Served s(0.02);
  std::vector<std::string> ids(20);
  std::vector<std::thread> ts;
  std::atomic<int> failures{0};
  for (int i = 0; i < 20; ++i) {
    ts.emplace_back([&, i] {
      auto c = s.client();
      auto r = c.Post("/v1/jobs", fmt::format(R"({{"caption": "Genre: test {}", "lyrics": "[verse]\nla", "duration": 0.4, "seed": {}}})", i, i),
                      "application/json");
      if (!r || r->status != 202) {
        ++failures;
        std::fprintf(stderr, "submitter %d: %s\n", i, r ? (std::to_string(r->status) + " " + r->body).c_str() : httplib::to_string(r.error()).c_str());
        return;
      }
      ids[static_cast<size_t>(i)] = json::parse(r->body)["id"];
    });
  }
  for (auto& t : ts) t.join();
  ASSERT_EQ(failures.load(), 0);
  std::set<std::string> unique(ids.begin(), ids.end());
  ASSERT_EQ(unique.size(), 20u) << "duplicate ids";
  auto c = s.client();
  for (size_t i = 0; i < ids.size(); ++i) {
    json j = wait_terminal(c, ids[i], 20s);
    ASSERT_EQ(j["state"], "done") << j.dump();
    EXPECT_EQ(j["request"]["seed"], i) << "job " << ids[i] << " holds another submitter's request";
  }
  json list = body_of(c.Get("/v1/jobs?limit=100"));
  std::set<std::string> listed;
  for (const auto& j : list["data"]) listed.insert(j["id"].get<std::string>());
  EXPECT_EQ(listed, unique);
  // One worker, FIFO: no two jobs overlapped, and they ran in submission order.
  std::vector<std::pair<double, double>> spans;  // (created, started) sorted by created
  std::vector<json> jobs;
  for (const auto& j : list["data"]) jobs.push_back(j);
  std::sort(jobs.begin(), jobs.end(), [](const json& a, const json& b) { return a["created_at"] < b["created_at"]; });
  for (size_t i = 1; i < jobs.size(); ++i)
    EXPECT_LE(jobs[i - 1]["finished_at"].get<double>(), jobs[i]["started_at"].get<double>());
  const std::string metrics = c.Get("/metrics")->body;
  EXPECT_NE(metrics.find("mm3_jobs_submitted_total 20\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("mm3_jobs{state=\"done\"} 20\n"), std::string::npos) << metrics;
}

TEST(Http, FullQueueAnswers429WithRetryAfter) {
  Served s(3.0, {}, 2);
  auto c = s.client();
  const std::string a = submit_ok(c);
  ASSERT_TRUE(eventually([&] { return body_of(c.Get(("/v1/jobs/" + a).c_str()))["state"] == "running"; }));
  const std::string b = submit_ok(c), d = submit_ok(c);
  auto r = c.Post("/v1/jobs", kGoodJob, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 429);
  EXPECT_EQ(body_of(r)["error"]["code"], "queue_full");
  ASSERT_TRUE(r->has_header("Retry-After"));
  EXPECT_GE(std::stoi(r->get_header_value("Retry-After")), 1);
  auto sp = c.Post("/v1/audio/speech", R"({"input": "l", "instructions": "c", "max_new_tokens": 5})", "application/json");
  ASSERT_TRUE(sp);
  EXPECT_EQ(sp->status, 429);
  // Cancel everything: the queued ones at once (200), the running one at its next frame (202).
  EXPECT_EQ(c.Delete(("/v1/jobs/" + b).c_str())->status, 200);
  EXPECT_EQ(c.Delete(("/v1/jobs/" + d).c_str())->status, 200);
  auto ra = c.Delete(("/v1/jobs/" + a).c_str());
  EXPECT_EQ(ra->status, 202);
  EXPECT_EQ(body_of(ra)["cancel_requested"], true);
  EXPECT_EQ(wait_terminal(c, a, 2s)["state"], "cancelled");
  EXPECT_EQ(body_of(c.Get(("/v1/jobs/" + b).c_str()))["state"], "cancelled");
  auto audio = c.Get(("/v1/jobs/" + a + "/audio").c_str());
  EXPECT_EQ(audio->status, 409);
  EXPECT_EQ(body_of(audio)["error"]["code"], "not_ready");
}

TEST(Http, EventStreamOfAFinishedJobIsOneTerminalEvent) {
  Served s(0.05);
  auto c = s.client();
  const std::string id = submit_ok(c);
  ASSERT_EQ(wait_terminal(c, id)["state"], "done");
  std::string stream;
  auto r = c.Get(("/v1/jobs/" + id + "/events").c_str(), [&](const char* d, size_t n) {
    stream.append(d, n);
    return true;
  });
  ASSERT_TRUE(r);
  EXPECT_EQ(stream.find("event: progress"), std::string::npos) << stream;
  EXPECT_NE(stream.find("event: done"), std::string::npos) << stream;
}

// A raw connection that sends one request and can be closed before the answer.
int open_request(int port, const std::string& path, const std::string& body) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return -1;
  const std::string req = fmt::format(
      "POST {} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{}", path,
      body.size(), body);
  ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  return fd;
}

TEST(Http, SynchronousClientThatLeavesCancelsItsJob) {
  Served s(5.0);
  auto c = s.client();
  for (const auto& [path, body] :
       {std::pair<std::string, std::string>{"/v1/audio/speech", R"({"input": "[verse]\nla", "instructions": "pop", "max_new_tokens": 100})"},
        {"/v1/music_generation", R"({"prompt": "pop", "lyrics": "[verse]\nla"})"}}) {
    SCOPED_TRACE(path);
    const int fd = open_request(s.port, path, body);
    ASSERT_GE(fd, 0);
    std::string id;
    ASSERT_TRUE(eventually([&] {
      json l = body_of(c.Get("/v1/jobs?limit=1"));
      if (l["data"].empty() || l["data"][0]["state"] != "running") return false;
      id = l["data"][0]["id"];
      return true;
    }, 3s));
    const auto t0 = std::chrono::steady_clock::now();
    ::close(fd);
    json j = wait_terminal(c, id, 3s);
    EXPECT_EQ(j["state"], "cancelled") << j.dump();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  }
  // A client that stays gets its audio (the disconnect check does not misfire).
  Served quick(0.2);
  auto qc = quick.client();
  auto r = qc.Post("/v1/audio/speech", R"({"input": "[verse]\nla", "instructions": "pop", "max_new_tokens": 10})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST(Http, EventStreamsCannotTakeEveryThread) {
  ServerOptions opt;
  opt.http_threads = 4;  // at most 2 streams
  Served s(3.0, opt);
  auto c = s.client();
  const std::string id = submit_ok(c);
  std::vector<int> fds;
  for (int i = 0; i < 2; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(s.port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    const std::string req = "GET /v1/jobs/" + id + "/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
    fds.push_back(fd);
    // Wait until the server holds this stream (its first event, "retry:", arrived): on a loaded machine
    // the third request below could otherwise take a slot first and wait for the job to end.
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::string got;
    char buf[512];
    while (got.find("retry:") == std::string::npos) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
    ASSERT_NE(got.find("retry:"), std::string::npos) << "stream " << i << " did not start: " << got;
  }
  auto third = [&] {
    auto r = c.Get(("/v1/jobs/" + id + "/events").c_str(), [](const char*, size_t) { return true; });
    return r ? r->status : 0;
  };
  ASSERT_TRUE(eventually([&] { return third() == 503; }, 3s));
  // Plain requests still get through while the streams are open.
  EXPECT_EQ(c.Get(("/v1/jobs/" + id).c_str())->status, 200);
  EXPECT_EQ(c.Delete(("/v1/jobs/" + id).c_str())->status, 202);
  ASSERT_EQ(wait_terminal(c, id, 3s)["state"], "cancelled");
  // The terminal event ended both streams: their slots are free again.
  EXPECT_TRUE(eventually([&] { return third() == 200; }, 3s));
  for (int fd : fds) ::close(fd);
}

TEST(Http, FailedJobsAnswerWithTheirError) {
  Served s(0.05);
  auto c = s.client();
  const std::string id = submit_ok(c, R"({"caption": "FAKE_FAIL", "lyrics": "[verse]\nla", "duration": 1})");
  json j = wait_terminal(c, id);
  EXPECT_EQ(j["state"], "failed");
  EXPECT_EQ(j["error"]["code"], "internal");
  auto sp = c.Post("/v1/audio/speech", R"({"input": "la", "instructions": "FAKE_FAIL", "max_new_tokens": 5})", "application/json");
  ASSERT_TRUE(sp);
  EXPECT_EQ(sp->status, 500);
  EXPECT_EQ(body_of(sp)["error"]["code"], "internal");
  auto mg = c.Post("/v1/music_generation", R"({"prompt": "FAKE_FAIL", "lyrics": "la"})", "application/json");
  ASSERT_TRUE(mg);
  EXPECT_EQ(mg->status, 500);
  EXPECT_EQ(body_of(mg)["base_resp"]["status_code"], 1013);
  EXPECT_NE(c.Get("/metrics")->body.find("mm3_jobs{state=\"failed\"} 3"), std::string::npos);
}

TEST(Http, HealthIs503WhileTheModelLoadsAndWhenItFails) {
  std::atomic<bool> release{false};
  Served s(0, {}, 64, {}, [&release] {
    while (!release) std::this_thread::sleep_for(5ms);
    return std::unique_ptr<Generator>(new FakeGenerator(0.05));
  });
  auto c = s.client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 503);
  EXPECT_EQ(body_of(h)["status"], "loading");
  EXPECT_EQ(body_of(c.Get("/v1/models"))["data"][0]["ready"], false);
  const std::string id = submit_ok(c);  // accepted while loading, runs once loaded
  EXPECT_EQ(body_of(c.Get(("/v1/jobs/" + id).c_str()))["state"], "queued");
  release = true;
  EXPECT_EQ(wait_terminal(c, id)["state"], "done");
  EXPECT_EQ(c.Get("/health")->status, 200);

  Served broken(0, {}, 64, {}, []() -> std::unique_ptr<Generator> { throw BadModel("no modular_model_index.json in /nowhere"); });
  auto bc = broken.client();
  ASSERT_TRUE(eventually([&] { return body_of(bc.Get("/health"))["status"] == "error"; }));
  json bh = body_of(bc.Get("/health"));
  EXPECT_NE(bh["error"]["message"].get<std::string>().find("/nowhere"), std::string::npos);
  auto r = bc.Post("/v1/jobs", kGoodJob, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(body_of(r)["error"]["code"], "model_unavailable");
}

TEST(Http, ResultsSurviveARestart) {
  fs::path dir;
  std::string done_id, wav;
  {
    Served s(0.05);
    dir = s.dir;
    auto c = s.client();
    done_id = submit_ok(c);
    ASSERT_EQ(wait_terminal(c, done_id)["state"], "done");
    wav = c.Get(("/v1/jobs/" + done_id + "/audio").c_str())->body;
  }
  Served again(0.05, {}, 64, dir);
  auto c = again.client();
  json j = body_of(c.Get(("/v1/jobs/" + done_id).c_str()));
  EXPECT_EQ(j["state"], "done");
  auto a = c.Get(("/v1/jobs/" + done_id + "/audio").c_str());
  ASSERT_TRUE(a);
  EXPECT_EQ(a->body, wav);
  // A format never asked for before the restart is converted from the kept master.
  auto f = c.Get(("/v1/jobs/" + done_id + "/audio?format=flac").c_str());
  ASSERT_TRUE(f);
  EXPECT_EQ(f->status, 200);
  EXPECT_EQ(f->body.substr(0, 4), "fLaC");
}

}  // namespace
}  // namespace mm3::server
