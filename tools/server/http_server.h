// http_server.h — the HTTP side of `mm3 serve` (issue 7), on cpp-httplib (Debian's libcpp-httplib).
//
// Routes (all JSON errors are {"error": {"code", "message"}}):
//   GET    /                         the web page (static; see web_page.h)
//   GET    /health                   200 ready | 503 loading / failed / stopping (never needs the token)
//   GET    /v1/models                the one model
//   GET    /metrics                  Prometheus text: queue depth, jobs by state, frames/s, audio seconds
//   POST   /v1/jobs                  body = the `mm3 generate` request schema -> 202 {"id", ...}
//   GET    /v1/jobs                  recent jobs, newest first (?limit=N, default 50)
//   GET    /v1/jobs/{id}             state, stage, progress, ETA, error, result
//   GET    /v1/jobs/{id}/events      Server-Sent Events of progress; ends with the terminal state
//   GET    /v1/jobs/{id}/audio       ?format=wav|wav24|wav_float|flac|flac24|mp3 (default: the request's)
//   GET    /v1/jobs/{id}/codes       codes.npy, [F + 1, 8] int64, for `mm3 generate` replay
//   DELETE /v1/jobs/{id}             cancel (queued: at once; running: at the next frame / step)
//   POST   /v1/audio/speech          OpenAI-style, synchronous (compat.h)
//   POST   /v1/music_generation      MiniMax cloud shape, synchronous (compat.h)
//
// Security: the bearer token (when set) is required on every route except /health and the static page
// (which holds no data, and which a browser cannot fetch with a header; the page sends the token on
// every API call it makes). Bodies are capped (413), must be JSON (415) and are parsed strictly.
// Bound to a loopback address, requests must name a loopback Host (refuses DNS-rebinding pages).
// A synchronous caller that disconnects cancels its job.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "server/job_queue.h"

namespace mm3::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                    // 0: any free port (bind() returns it)
  std::string api_key;                // empty: no token required
  size_t max_body_bytes = 1 << 20;    // request bodies are text; 1 MiB is far above any real lyrics
  int http_threads = 64;              // connections served at once; event streams may hold half of them
  std::string model_name = "mm3";     // /v1/models id until the generator reports its own
};

class HttpServer {
 public:
  HttpServer(JobManager& jobs, ServerOptions opt);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the listening socket; returns the port. Throws InvalidInput when the address cannot be bound.
  int bind();
  // Serves until stop(). Call bind() first.
  void run();
  // Stops accepting and returns run(); streaming handlers end once the JobManager stops. Thread-safe.
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace mm3::server
