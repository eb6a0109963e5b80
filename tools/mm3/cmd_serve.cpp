// cmd_serve.cpp — `mm3 serve --model DIR [--host H] [--port P] [--results DIR] [--api-key KEY]
// [--max-queue N]`: the HTTP server of issue 7 (tools/server/). Binds first, then loads the model in the
// worker (GET /health answers 503 "loading" meanwhile). SIGINT / SIGTERM stop it gracefully: the
// running job is recorded interrupted, finished results stay in the results folder for the next start.
//
// Hidden testing aid: `--fake-generator SECONDS` replaces the model by the test double of
// tools/server/generator.h — a labelled synthetic tone, never music — so the server's own tests (kill -9
// and restart, the browser test) run without weights.
#if MM3_WITH_SERVER

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "commands.h"
#include "core/errors.h"
#include "core/log.h"
#include "download_display.h"
#include "profile_flags.h"
#include "pipeline/model_resolve.h"
#include "server/generator.h"
#include "server/http_server.h"
#include "server/job_queue.h"
#include "server/job_store.h"

namespace mm3::cli {
namespace {

int g_signal_pipe[2] = {-1, -1};

extern "C" void on_signal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  const int saved = errno;
  if (::write(g_signal_pipe[1], &b, 1) < 0) {
  }
  errno = saved;
}

struct ServeArgs {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string results = "mm3-results";
  std::string api_key;
  size_t max_queue = 16;
  size_t max_body = 1 << 20;
  int threads = 0;
  bool low_memory = false, no_download = false;
  double fake_seconds = -1;
  ProfileArgs profile;
};

int run_serve(const ServeArgs& a) {
  using namespace mm3::server;
  ServerOptions sopt;
  sopt.host = a.host;
  sopt.port = a.port;
  sopt.api_key = a.api_key;
  if (sopt.api_key.empty())
    if (const char* k = std::getenv("MM3_API_KEY")) sopt.api_key = k;
  sopt.max_body_bytes = a.max_body;
  if (a.max_queue < 1) throw InvalidInput("--max-queue must be at least 1");

  JobManager::GeneratorFactory factory;
  if (a.fake_seconds >= 0) {
    std::fprintf(stderr,
                 "mm3 serve: TEST MODE — --fake-generator: every job renders a synthetic test tone, not music\n");
    sopt.model_name = "mm3-test-tone";
    const double s = a.fake_seconds;
    factory = [s] { return std::unique_ptr<Generator>(new FakeGenerator(s)); };
  } else {
    if (a.model.empty())
      throw InvalidInput("--model is required: a checkpoint folder (diffusers layout) or a Hugging Face repo id");
    PipelineOptions popt;
    apply_profile_flags(a.profile, popt);  // a bad flag fails before any download
    std::fprintf(stderr, "mm3 serve: compute profile: %s\n", describe_profile(popt).c_str());
    // Resolve now (downloading a repo id missing from the HF cache), so a wrong model fails before the
    // server binds (exit 3) instead of inside the worker.
    ResolveOptions ropt;
    ropt.allow_download = !a.no_download;
    std::string dir;
    {
      DownloadDisplay download(a.model, ProgressMode::automatic);
      ropt.on_download = download.callback();
      dir = resolve_model(a.model, ropt);
    }
    sopt.model_name = a.model;
    popt.threads = a.threads;
    popt.low_memory = a.low_memory;
    const std::string id = a.model;
    factory = [dir, popt, id] { return make_pipeline_generator(dir, popt, id); };
  }

  JobStore store(a.results);
  store.lock_exclusive();  // before binding: a second server on one folder fails fast (exit 2)
  JobManager jobs(store, factory, ManagerOptions{a.max_queue});
  HttpServer http(jobs, sopt);
  const int port = http.bind();
  for (const std::string& w : jobs.start()) std::fprintf(stderr, "mm3 serve: %s\n", w.c_str());
  const bool loopback = sopt.host == "127.0.0.1" || sopt.host == "localhost" || sopt.host == "::1";
  std::printf("mm3 serve: listening on http://%s:%d (results in %s%s)\n",
              sopt.host.find(':') != std::string::npos ? ("[" + sopt.host + "]").c_str() : sopt.host.c_str(), port,
              store.root().parent_path().lexically_normal().c_str(), sopt.api_key.empty() ? "" : "; bearer token required");
  std::fflush(stdout);
  if (!loopback && sopt.api_key.empty())
    std::fprintf(stderr, "mm3 serve: warning: listening on %s without --api-key: anyone who can reach it can use it\n",
                 sopt.host.c_str());

  // SIGINT / SIGTERM: the handler only writes the signal number to a pipe (async-signal-safe, and it
  // may run on any thread — OpenBLAS starts threads before main, so masking cannot steer the signal);
  // a waiter thread reads the pipe and stops the server.
  if (::pipe2(g_signal_pipe, O_CLOEXEC) != 0) throw InternalError("cannot create the signal pipe");
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::thread waiter([&] {
    unsigned char sig = 0;
    while (::read(g_signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    if (sig != 0) std::fprintf(stderr, "mm3 serve: %s, stopping\n", sig == SIGINT ? "interrupted" : "terminated");
    jobs.stop();  // first: wakes every waiting handler and interrupts the running job
    http.stop();
  });
  http.run();
  // run() also returns if the listener fails; wake the waiter either way (0 = no signal).
  const unsigned char none = 0;
  if (::write(g_signal_pipe[1], &none, 1) < 0) {
  }
  waiter.join();
  jobs.stop();
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  return 0;
}

RegisterCommand reg{{"serve", 40,
                     [](CLI::App& sub) -> std::function<int()> {
                       auto a = std::make_shared<ServeArgs>();
                       sub.add_option("--model", a->model,
                                      "checkpoint folder (diffusers componentized layout), or a Hugging Face repo id "
                                      "(e.g. MiniMaxAI/MiniMax-Music3): taken from the HF cache, downloaded into it "
                                      "before the server starts when missing ($HF_TOKEN, $HF_ENDPOINT, $HF_HUB_OFFLINE)");
                       sub.add_flag("--no-download", a->no_download, "never download the model: the HF cache only");
                       sub.add_option("--host", a->host, "address to listen on (default 127.0.0.1: this machine only)");
                       sub.add_option("--port", a->port, "TCP port (default 8080; 0 = any free port, printed)")
                           ->check(CLI::Range(0, 65535));
                       sub.add_option("--results", a->results,
                                      "folder for job results, kept across restarts (default ./mm3-results)");
                       sub.add_option("--api-key", a->api_key,
                                      "require 'Authorization: Bearer KEY' on every route but /health and the page "
                                      "(default: $MM3_API_KEY)");
                       sub.add_option("--max-queue", a->max_queue, "jobs that may wait; more get 429 (default 16)");
                       sub.add_option("--max-body", a->max_body, "largest request body in bytes (default 1 MiB)");
                       sub.add_option("-t,--threads", a->threads, "compute threads (default: all cores)");
                       sub.add_flag("--low-memory", a->low_memory, "free the LM before the DiT loads");
                       add_profile_flags(sub, a->profile);
                       // Testing aid, hidden from --help (empty group): a synthetic tone instead of the model.
                       sub.add_option("--fake-generator", a->fake_seconds,
                                      "TESTING ONLY: no model; each job renders a labelled test tone in SECONDS")
                           ->group("");
                       sub.footer(
                           "Routes: GET / (web page), GET /health, GET /v1/models, GET /metrics,\n"
                           "POST /v1/jobs, GET /v1/jobs[/{id}[/events|/audio|/codes]], DELETE /v1/jobs/{id},\n"
                           "POST /v1/audio/speech (OpenAI-style), POST /v1/music_generation (MiniMax shape).\n"
                           "One job runs at a time, in submission order.\n\n"
                           "Example:\n"
                           "  mm3 serve --model ./MiniMax-Music3 --port 8080 --results ./results\n"
                           "  curl -s localhost:8080/v1/jobs -H 'Content-Type: application/json' \\\n"
                           "       -d '{\"caption\":\"Genre: pop\",\"lyrics\":\"[verse]\\nhello\",\"duration\":30}'");
                       return [a]() { return run_serve(*a); };
                     },
                     "serve generation over HTTP (jobs, events, OpenAI / MiniMax shapes, web page)"}};

}  // namespace
}  // namespace mm3::cli

#endif  // MM3_WITH_SERVER
