// http_server.cpp — routes of `mm3 serve` (http_server.h) on cpp-httplib 0.11 (Debian bookworm's).
//
// Threads: httplib serves each connection on its own pool thread; handlers only read JobManager state
// or wait on it, the one worker inside JobManager does the generating. Waiting handlers (event streams,
// the synchronous compat routes) poll in short slices so they notice both job changes and shutdown.
#include "server/http_server.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include <httplib.h>

#include "core/errors.h"
#include "core/log.h"
#include "server/compat.h"
#include "server/web_page.h"

namespace mm3::server {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// ---- errors ----

// MiniMax's base_resp status codes for the cloud-shaped route (its documented families: 1002 rate
// limit, 1004 authentication, 2013 invalid parameters, 1000 unknown / 1013 internal).
int minimax_status_code(int http_status) {
  switch (http_status) {
    case 400: case 404: case 411: case 413: case 415: return 2013;
    case 401: return 1004;
    case 429: return 1002;
    case 500: case 501: return 1013;
    default: return 1000;
  }
}

void send_error(const httplib::Request& req, httplib::Response& res, int status, const std::string& code,
                const std::string& message) {
  json body = {{"error", {{"code", code}, {"message", message}}}};
  if (req.path == "/v1/music_generation")
    body["base_resp"] = {{"status_code", minimax_status_code(status)}, {"status_msg", message}};
  res.status = status;
  res.set_content(body.dump() + "\n", "application/json");
}

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump() + "\n", "application/json");
}

// HTTP status for a job that ended in error, from its error code.
int status_for_job_error(const std::string& code) {
  if (code == "invalid_input") return 400;
  if (code == "not_implemented") return 501;
  if (code == "bad_model" || code == "interrupted") return 503;
  return 500;
}

// ---- the peer of a synchronous call ----

// httplib 0.11 gives handlers no way to see that the client left. The connection's socket is found by
// its address pair (unique among this process's sockets), then polled: a peer that closed shows up as
// POLLRDHUP / a zero-byte MSG_PEEK read. The socket stays ours until the handler returns (httplib closes
// it afterwards), so the fd cannot be reused under us.
std::string numeric_host(const sockaddr_storage& a, socklen_t len, int& port) {
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, host, sizeof host, serv, sizeof serv,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "";
  port = std::atoi(serv);
  return host;
}

int find_connection_fd(const httplib::Request& req) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc/self/fd", ec)) {
    const int fd = std::atoi(e.path().filename().c_str());
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof local, pl = sizeof peer;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0) continue;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    int lport = -1, pport = -1;
    const std::string lhost = numeric_host(local, ll, lport), phost = numeric_host(peer, pl, pport);
    if (lport == req.local_port && pport == req.remote_port && lhost == req.local_addr && phost == req.remote_addr)
      return fd;
  }
  return -1;
}

bool peer_gone(int fd) {
  if (fd < 0) return false;  // not found: assume present (the job still finishes and is kept)
  pollfd p{fd, static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  if (p.revents & POLLIN) {
    char c;
    const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }
  return false;
}

// ---- small helpers ----

bool constant_time_equal(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
}

bool is_loopback_host(const std::string& h) {
  return h == "127.0.0.1" || h == "localhost" || h == "::1" || h.rfind("127.", 0) == 0;
}

// "127.0.0.1:8080" / "[::1]:8080" / "localhost" -> the host part.
std::string host_of(const std::string& host_header) {
  if (!host_header.empty() && host_header[0] == '[') {
    const auto close = host_header.find(']');
    return close == std::string::npos ? host_header : host_header.substr(1, close - 1);
  }
  const auto colon = host_header.rfind(':');
  return colon == std::string::npos ? host_header : host_header.substr(0, colon);
}

const char* mime_for(AudioFormat f) {
  switch (f) {
    case AudioFormat::flac16: case AudioFormat::flac24: return "audio/flac";
    case AudioFormat::mp3: return "audio/mpeg";
    default: return "audio/wav";
  }
}

std::string ext_for(AudioFormat f) {
  switch (f) {
    case AudioFormat::flac16: case AudioFormat::flac24: return "flac";
    case AudioFormat::mp3: return "mp3";
    default: return "wav";
  }
}

json job_links(const std::string& id) {
  return {{"self", "/v1/jobs/" + id},
          {"events", "/v1/jobs/" + id + "/events"},
          {"audio", "/v1/jobs/" + id + "/audio"},
          {"codes", "/v1/jobs/" + id + "/codes"}};
}

json job_view(const JobRecord& j) {
  json v = job_to_json(j);
  v["links"] = job_links(j.id);
  return v;
}

std::string sse_event(const std::string& event, uint64_t id, const json& data) {
  return fmt::format("event: {}\nid: {}\ndata: {}\n\n", event, id, data.dump());
}

double fmt_num(double x) { return std::isfinite(x) ? x : 0.0; }

// httplib 0.11 listens with a backlog of 5: a burst of clients (20 submitters at once) overflows the
// accept queue and some connections are reset. Linux lets listen() be called again on a listening
// socket to enlarge the backlog; the socket is a protected member, hence this subclass.
struct BacklogServer : httplib::Server {
  void enlarge_backlog() {
    const socket_t fd = svr_sock_;
    if (fd != INVALID_SOCKET) ::listen(fd, SOMAXCONN);
  }
};

}  // namespace

struct HttpServer::Impl {
  JobManager& jobs;
  ServerOptions opt;
  BacklogServer svr;
  std::atomic<bool> stopping{false};
  std::atomic<int> run_state{0};  // 0 run() not entered, 1 serving, 2 returned
  // Each event stream holds an HTTP thread for its whole life; at most half the threads may, so plain
  // requests (health, status, submissions) always find one.
  std::atomic<int> streams{0};
  bool loopback = false;

  Impl(JobManager& j, ServerOptions o) : jobs(j), opt(std::move(o)) {}

  bool shutting_down() const { return stopping.load() || jobs.stopping(); }

  // Looks the id up; answers 404 itself when it is malformed or unknown.
  std::optional<JobRecord> find_job(const httplib::Request& req, httplib::Response& res, const std::string& id) {
    if (!valid_job_id(id)) {
      send_error(req, res, 404, "not_found", "no such job: job ids are 32 lowercase hex digits");
      return std::nullopt;
    }
    auto j = jobs.get(id);
    if (!j) send_error(req, res, 404, "not_found", fmt::format("no such job '{}'", id));
    return j;
  }

  // Parses a JSON body strictly; answers 400 itself on failure.
  std::optional<json> body_json(const httplib::Request& req, httplib::Response& res) {
    try {
      return parse_json_strict(req.body, req.path);
    } catch (const InvalidInput& e) {
      send_error(req, res, 400, "invalid_json", e.what());
      return std::nullopt;
    }
  }

  // Submits; answers 429 / 503 itself on failure.
  std::optional<std::string> submit(const httplib::Request& req, httplib::Response& res, const Request& r,
                                    const std::string& origin, double mp3_quality = -1) {
    try {
      return jobs.submit(r, origin, mp3_quality);
    } catch (const QueueFull& e) {
      res.set_header("Retry-After", std::to_string(e.retry_after_seconds));
      send_error(req, res, 429, "queue_full", e.what());
    } catch (const ModelUnavailable& e) {
      send_error(req, res, 503, "model_unavailable", e.what());
    }
    return std::nullopt;
  }

  // Waits for a synchronous job; cancels it when the caller disconnects. Returns the final record, or
  // nullopt when the caller left or the server stops (the response is then moot or already set).
  std::optional<JobRecord> wait_sync(const httplib::Request& req, httplib::Response& res, const std::string& id) {
    const int fd = find_connection_fd(req);
    uint64_t seen = 0;
    for (;;) {
      auto snap = jobs.wait_change(id, seen, std::chrono::milliseconds(200));
      if (!snap) {
        send_error(req, res, 500, "internal", "the job disappeared");
        return std::nullopt;
      }
      seen = snap->seq;
      if (is_terminal(snap->job.state)) return snap->job;
      if (peer_gone(fd)) {
        jobs.cancel(id);
        MM3_LOG_INFO("serve: client of {} {} left; job {} cancelled", req.method, req.path, id);
        return std::nullopt;
      }
      if (stopping) {
        // The HTTP side is going away: nobody would receive the result.
        jobs.cancel(id);
        send_error(req, res, 503, "stopping", "the server is shutting down");
        return std::nullopt;
      }
    }
  }

  // Answers a failed / cancelled synchronous job.
  void send_job_outcome_error(const httplib::Request& req, httplib::Response& res, const JobRecord& j) {
    res.set_header("X-Job-Id", j.id);
    if (j.state == JobState::cancelled) {
      send_error(req, res, 409, "cancelled", fmt::format("job {} was cancelled", j.id));
    } else {
      send_error(req, res, status_for_job_error(j.error_code), j.error_code.empty() ? "internal" : j.error_code,
                 j.error_message);
    }
  }

  void routes();
  std::string metrics_text();
};

std::string HttpServer::Impl::metrics_text() {
  const ManagerMetrics m = jobs.metrics();
  std::string s;
  auto metric = [&](const char* name, const char* type, const char* help) {
    s += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  metric("mm3_model_ready", "gauge", "1 once the model is loaded and jobs can run.");
  s += fmt::format("mm3_model_ready {}\n", m.model == ModelStatus::ready ? 1 : 0);
  metric("mm3_queue_depth", "gauge", "Jobs waiting in the queue (the running one not counted).");
  s += fmt::format("mm3_queue_depth {}\n", m.queue_depth);
  metric("mm3_queue_capacity", "gauge", "Most jobs the queue holds (--max-queue).");
  s += fmt::format("mm3_queue_capacity {}\n", jobs.max_queue());
  metric("mm3_jobs", "gauge", "Jobs known to the server (kept on disk), by state.");
  for (const auto& [state, n] : m.jobs_by_state) s += fmt::format("mm3_jobs{{state=\"{}\"}} {}\n", state, n);
  metric("mm3_jobs_submitted_total", "counter", "Jobs accepted since the server started.");
  s += fmt::format("mm3_jobs_submitted_total {}\n", m.submitted);
  metric("mm3_jobs_rejected_total", "counter", "Submissions refused because the queue was full.");
  s += fmt::format("mm3_jobs_rejected_total{{reason=\"queue_full\"}} {}\n", m.rejected_queue_full);
  metric("mm3_frames_generated_total", "counter", "Audio frames (25 per second) generated by finished jobs.");
  s += fmt::format("mm3_frames_generated_total {}\n", m.frames_generated);
  metric("mm3_audio_seconds_generated_total", "counter", "Seconds of audio generated by finished jobs.");
  s += fmt::format("mm3_audio_seconds_generated_total {:.3f}\n", fmt_num(m.audio_seconds_generated));
  metric("mm3_generation_seconds_total", "counter", "Worker seconds spent on jobs.");
  s += fmt::format("mm3_generation_seconds_total {:.3f}\n", fmt_num(m.generation_seconds));
  metric("mm3_frames_per_second", "gauge", "AR frames per second of the running job, else of the last finished one.");
  s += fmt::format("mm3_frames_per_second {:.3f}\n", fmt_num(m.frames_per_second));
  return s;
}

void HttpServer::Impl::routes() {
  // ---- gatekeeping, before any body is read ----
  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (loopback && req.has_header("Host") && !is_loopback_host(host_of(req.get_header_value("Host")))) {
      send_error(req, res, 403, "forbidden_host",
                 "this server listens on loopback and only answers requests addressed to a loopback host");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!opt.api_key.empty() && req.path != "/health" && req.path != "/") {
      const std::string auth = req.get_header_value("Authorization");
      const std::string want = "Bearer " + opt.api_key;
      if (!constant_time_equal(auth, want)) {
        res.set_header("WWW-Authenticate", "Bearer");
        send_error(req, res, 401, "unauthorized",
                   auth.empty() ? "missing 'Authorization: Bearer <key>' header" : "wrong API key");
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    if (req.method == "POST") {
      // httplib 0.11 enforces the body limit only for Content-Length bodies; refuse chunked uploads.
      if (req.get_header_value("Transfer-Encoding").find("chunked") != std::string::npos) {
        res.set_header("Connection", "close");
        send_error(req, res, 411, "length_required", "send the body with a Content-Length (no chunked uploads)");
        return httplib::Server::HandlerResponse::Handled;
      }
      const std::string ct = req.get_header_value("Content-Type");
      if (!ct.empty() && ct.rfind("application/json", 0) != 0) {
        send_error(req, res, 415, "unsupported_media_type",
                   fmt::format("the body must be JSON (Content-Type: application/json), got '{}'", ct));
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  // Responses >= 400 with no body (httplib's own 404 / 413 / 400) get the JSON error shape.
  svr.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    switch (res.status) {
      case 404: send_error(req, res, 404, "not_found", fmt::format("no route {} {}", req.method, req.path)); break;
      case 413: send_error(req, res, 413, "payload_too_large", "the request body is larger than the server accepts"); break;
      case 400: send_error(req, res, 400, "bad_request", "malformed HTTP request"); break;
      default: send_error(req, res, res.status, "http_error", fmt::format("HTTP {}", res.status)); break;
    }
    return httplib::Server::HandlerResponse::Handled;
  }));
  svr.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    try {
      std::rethrow_exception(ep);
    } catch (const InvalidInput& e) {
      send_error(req, res, 400, "invalid_input", e.what());
    } catch (const Error& e) {
      send_error(req, res, 500, error_code_name(e.kind()), e.what());
    } catch (const std::exception& e) {
      send_error(req, res, 500, "internal", e.what());
    } catch (...) {
      send_error(req, res, 500, "internal", "unknown exception");
    }
  });
  svr.set_logger([](const httplib::Request& req, const httplib::Response& res) {
    MM3_LOG_INFO("serve: {} {} -> {}", req.method, req.path, res.status);
  });

  // ---- the page, health, models, metrics ----
  svr.Get("/", [this](const httplib::Request&, httplib::Response& res) {
    res.set_header("Content-Security-Policy",
                   "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; media-src 'self' blob:; "
                   "connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'");
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_header("Cache-Control", "no-store");
    res.set_content(web_page_html(), "text/html; charset=utf-8");
  });
  svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (shutting_down()) return send_json(res, 503, {{"status", "stopping"}});
    switch (jobs.model_status()) {
      case ModelStatus::loading: return send_json(res, 503, {{"status", "loading"}});
      case ModelStatus::failed:
        return send_json(res, 503, {{"status", "error"}, {"error", {{"code", "bad_model"}, {"message", jobs.model_error()}}}});
      case ModelStatus::ready: break;
    }
    send_json(res, 200, {{"status", "ok"}, {"model", jobs.model_id()}, {"test_tone", jobs.test_double()},
                         {"queue_depth", jobs.metrics().queue_depth}});
  });
  svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const bool ready = jobs.model_status() == ModelStatus::ready;
    const std::string id = ready ? jobs.model_id() : opt.model_name;
    send_json(res, 200, {{"object", "list"},
                         {"data", json::array({{{"id", id}, {"object", "model"}, {"owned_by", "mm3"},
                                                {"ready", ready}, {"test_tone", ready && jobs.test_double()},
                                                {"sample_rates", {44100, 32000}},
                                                {"max_duration_seconds", Request::kMaxDuration}}})}});
  });
  svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4; charset=utf-8");
  });

  // ---- native jobs ----
  svr.Post("/v1/jobs", [this](const httplib::Request& req, httplib::Response& res) {
    auto body = body_json(req, res);
    if (!body) return;
    Request r;
    try {
      r = parse_request(*body, "POST /v1/jobs");
    } catch (const InvalidInput& e) {
      return send_error(req, res, 400, "invalid_input", e.what());
    }
    auto id = submit(req, res, r, "jobs");
    if (!id) return;
    res.set_header("Location", "/v1/jobs/" + *id);
    send_json(res, 202, {{"id", *id}, {"object", "job"}, {"state", "queued"}, {"links", job_links(*id)}});
  });
  svr.Get("/v1/jobs", [this](const httplib::Request& req, httplib::Response& res) {
    size_t limit = 50;
    if (req.has_param("limit")) {
      const std::string v = req.get_param_value("limit");
      if (v.empty() || v.size() > 4 || v.find_first_not_of("0123456789") != std::string::npos || std::stoul(v) < 1 ||
          std::stoul(v) > 500)
        return send_error(req, res, 400, "invalid_input", "'limit' must be an integer in 1..500");
      limit = std::stoul(v);
    }
    json data = json::array();
    for (const JobRecord& j : jobs.list(limit)) data.push_back(job_view(j));
    send_json(res, 200, {{"object", "list"}, {"data", data}});
  });
  svr.Get(R"(/v1/jobs/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
    auto j = find_job(req, res, req.matches[1]);
    if (j) send_json(res, 200, job_view(*j));
  });
  svr.Delete(R"(/v1/jobs/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    if (!find_job(req, res, id)) return;
    switch (jobs.cancel(id)) {
      case JobManager::CancelResult::not_found:
        return send_error(req, res, 404, "not_found", fmt::format("no such job '{}'", id));
      case JobManager::CancelResult::already_finished: {
        auto j = jobs.get(id);
        return send_error(req, res, 409, "already_finished",
                          fmt::format("job {} is already {}; nothing to cancel", id, j ? job_state_name(j->state) : "finished"));
      }
      case JobManager::CancelResult::cancelled:
        return send_json(res, 200, {{"id", id}, {"state", "cancelled"}});
      case JobManager::CancelResult::cancelling:
        return send_json(res, 202, {{"id", id}, {"state", "running"}, {"cancel_requested", true}});
    }
  });
  svr.Get(R"(/v1/jobs/([^/]+)/events)", [this](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    if (!find_job(req, res, id)) return;
    if (streams.fetch_add(1) >= std::max(1, opt.http_threads / 2)) {
      --streams;
      res.set_header("Retry-After", "5");
      return send_error(req, res, 503, "too_many_streams",
                        "too many event streams are open; poll GET /v1/jobs/{id} or retry later");
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    auto last = std::make_shared<uint64_t>(0);
    auto first = std::make_shared<bool>(true);
    res.set_chunked_content_provider("text/event-stream", [this, id, last, first](size_t, httplib::DataSink& sink) {
      if (*first) {
        *first = false;
        const std::string hello = "retry: 2000\n\n";
        if (!sink.write(hello.data(), hello.size())) return false;
      }
      // Wait up to 15 s for a change (then a comment keeps proxies and clients from timing out).
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
      std::optional<JobManager::Snapshot> snap;
      while (std::chrono::steady_clock::now() < until) {
        snap = jobs.wait_change(id, *last, std::chrono::milliseconds(250));
        if (!snap || snap->seq != *last || is_terminal(snap->job.state) || shutting_down()) break;
        snap.reset();
      }
      if (!snap) {
        const std::string ping = ": keep-alive\n\n";
        return sink.write(ping.data(), ping.size());
      }
      *last = snap->seq;
      const JobRecord& j = snap->job;
      const bool terminal = is_terminal(j.state);
      std::string ev = sse_event(terminal ? job_state_name(j.state) : "progress", snap->seq, job_view(j));
      if (!terminal && shutting_down())
        ev += sse_event("error", snap->seq, {{"error", {{"code", "stopping"}, {"message", "the server is shutting down"}}}});
      if (!sink.write(ev.data(), ev.size())) return false;
      if (terminal || shutting_down()) {
        sink.done();
        return true;
      }
      // Coalesce bursts (the AR stage reports every frame): at most ~10 events per second.
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      return true;
    }, [this](bool) { --streams; });
  });
  svr.Get(R"(/v1/jobs/([^/]+)/audio)", [this](const httplib::Request& req, httplib::Response& res) {
    auto j = find_job(req, res, req.matches[1]);
    if (!j) return;
    if (j->state != JobState::done)
      return send_error(req, res, 409, "not_ready",
                        fmt::format("job {} is {}: audio exists only once it is done", j->id, job_state_name(j->state)));
    AudioFormat fmt;
    try {
      fmt = parse_audio_format(req.has_param("format") ? req.get_param_value("format") : j->request.format);
    } catch (const InvalidInput& e) {
      return send_error(req, res, 400, "invalid_input", e.what());
    }
    const fs::path p = jobs.audio_path(*j, fmt);
    const std::string name = fmt::format("mm3-{}{}.{}", j->test_tone ? "test-tone-" : "", j->id.substr(0, 12), ext_for(fmt));
    res.set_header("Content-Disposition", fmt::format("inline; filename=\"{}\"", name));
    if (j->test_tone) res.set_header("X-MM3-Test-Tone", "1");
    res.set_content(read_file(p), mime_for(fmt));
  });
  svr.Get(R"(/v1/jobs/([^/]+)/codes)", [this](const httplib::Request& req, httplib::Response& res) {
    auto j = find_job(req, res, req.matches[1]);
    if (!j) return;
    if (j->state != JobState::done)
      return send_error(req, res, 409, "not_ready",
                        fmt::format("job {} is {}: codes exist only once it is done", j->id, job_state_name(j->state)));
    const fs::path p = jobs.codes_path(*j);
    if (!j->has_codes || !fs::exists(p)) return send_error(req, res, 404, "not_found", "this job has no codes");
    res.set_header("Content-Disposition", fmt::format("attachment; filename=\"codes-{}.npy\"", j->id.substr(0, 12)));
    res.set_content(read_file(p), "application/octet-stream");
  });

  // ---- compatibility surfaces (synchronous) ----
  svr.Post("/v1/audio/speech", [this](const httplib::Request& req, httplib::Response& res) {
    auto body = body_json(req, res);
    if (!body) return;
    SpeechRequest sr;
    try {
      sr = parse_speech_request(*body);
    } catch (const InvalidInput& e) {
      return send_error(req, res, 400, "invalid_input", e.what());
    }
    auto id = submit(req, res, sr.request, "speech");
    if (!id) return;
    auto j = wait_sync(req, res, *id);
    if (!j) return;
    if (j->state != JobState::done) return send_job_outcome_error(req, res, *j);
    const AudioFormat fmt = parse_audio_format(sr.request.format);
    res.set_header("X-Job-Id", j->id);
    if (j->test_tone) res.set_header("X-MM3-Test-Tone", "1");
    res.set_content(read_file(jobs.audio_path(*j, fmt)), mime_for(fmt));
  });
  svr.Post("/v1/music_generation", [this](const httplib::Request& req, httplib::Response& res) {
    auto body = body_json(req, res);
    if (!body) return;
    MusicGenerationRequest mr;
    try {
      mr = parse_music_generation_request(*body);
    } catch (const InvalidInput& e) {
      return send_error(req, res, 400, "invalid_input", e.what());
    }
    auto id = submit(req, res, mr.request, "music_generation", mr.mp3_quality);
    if (!id) return;
    auto j = wait_sync(req, res, *id);
    if (!j) return;
    if (j->state != JobState::done) return send_job_outcome_error(req, res, *j);
    const AudioFormat fmt = parse_audio_format(mr.request.format);
    const fs::path p = jobs.audio_path(*j, fmt);
    const std::string bytes = read_file(p);
    std::string audio;
    if (mr.output_format == "hex") {
      static const char* hex = "0123456789abcdef";
      audio.resize(bytes.size() * 2);
      for (size_t i = 0; i < bytes.size(); ++i) {
        const auto c = static_cast<unsigned char>(bytes[i]);
        audio[2 * i] = hex[c >> 4];
        audio[2 * i + 1] = hex[c & 15];
      }
    } else {
      const std::string host = req.has_header("Host") ? req.get_header_value("Host") : opt.host;
      audio = fmt::format("http://{}/v1/jobs/{}/audio?format={}", host, j->id, audio_format_name(fmt));
    }
    // The bitrate reported is the one measured on the file, not the one asked for (libsndfile's MP3 is VBR).
    const double secs = j->audio_seconds;
    const int measured_bitrate = secs > 0 ? static_cast<int>(std::lround(static_cast<double>(bytes.size()) * 8.0 / secs)) : 0;
    res.set_header("X-Job-Id", j->id);
    send_json(res, 200,
              {{"data", {{"audio", audio}, {"status", 2}}},
               {"trace_id", j->id},
               {"extra_info", {{"music_duration", static_cast<int64_t>(std::lround(secs * 1000))},
                               {"music_sample_rate", j->request.sample_rate},
                               {"music_channel", 2},
                               {"bitrate", measured_bitrate},
                               {"music_size", bytes.size()},
                               {"test_tone", j->test_tone}}},
               {"base_resp", {{"status_code", 0}, {"status_msg", "success"}}}});
  });
}

HttpServer::HttpServer(JobManager& jobs, ServerOptions opt) : impl_(std::make_unique<Impl>(jobs, std::move(opt))) {
  Impl& s = *impl_;
  s.loopback = is_loopback_host(s.opt.host);
  const int threads = std::max(4, s.opt.http_threads);
  s.svr.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  s.svr.set_payload_max_length(s.opt.max_body_bytes);
  s.svr.set_keep_alive_timeout(2);  // idle keep-alive connections delay shutdown by at most this
  s.svr.set_read_timeout(10, 0);
  s.svr.set_write_timeout(30, 0);
  s.routes();
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::bind() {
  Impl& s = *impl_;
  if (s.opt.port == 0) {
    const int port = s.svr.bind_to_any_port(s.opt.host);
    if (port <= 0) throw InvalidInput(fmt::format("cannot listen on {} (any port)", s.opt.host));
    s.opt.port = port;
  } else if (!s.svr.bind_to_port(s.opt.host, s.opt.port)) {
    throw InvalidInput(fmt::format("cannot listen on {}:{} (in use, or not an address of this machine)", s.opt.host,
                                   s.opt.port));
  }
  s.svr.enlarge_backlog();
  return s.opt.port;
}

void HttpServer::run() {
  Impl& s = *impl_;
  s.run_state = 1;
  if (!s.stopping) s.svr.listen_after_bind();
  s.run_state = 2;
}

void HttpServer::stop() {
  Impl& s = *impl_;
  s.stopping = true;
  // httplib's stop() does nothing until listen_after_bind() has marked the server running; a stop that
  // races a run() just entering would leave run() serving forever, so wait (bounded) for one or the other.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (s.run_state == 1 && !s.svr.is_running() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  s.svr.stop();
}

}  // namespace mm3::server
