// fake_generator.cpp — the test double of generator.h: a seeded stereo sine, never music. It exists so
// the server's queueing, persistence, routes and cancellation are testable without model weights; the
// server labels its output as a test tone everywhere (health, models, job metadata, the web page).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <numbers>
#include <thread>

#include "core/errors.h"
#include "server/generator.h"

namespace mm3::server {

int64_t frame_budget(const Request& req) {
  // int() truncates, as the reference does (MODEL.md §2.3); validate_request guarantees >= 1.
  return std::min<int64_t>(static_cast<int64_t>(req.duration * 25.0), 9000);
}

namespace {

void nap(double seconds) {
  if (seconds > 0) std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

// splitmix64: a tiny deterministic mixer, so the tone and codes follow the seed.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

GenerationResult FakeGenerator::generate(const Request& req, const RunControl& ctl) {
  if (req.caption.find("FAKE_FAIL") != std::string::npos)
    throw InternalError("fake generator: failure requested by the caption (FAKE_FAIL)");
  const auto t0 = std::chrono::steady_clock::now();
  auto since = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  const int64_t F = frame_budget(req);

  // Time split: 70% "ar", 25% "dit", 5% "vocoder", like the real pipeline's proportions.
  const int64_t ticks = std::min<int64_t>(F, 100);  // progress reports in the AR stage
  StageClock ar_clock;
  for (int64_t i = 1; i <= ticks; ++i) {
    ctl.check_cancel();
    nap(0.70 * seconds_per_job_ / static_cast<double>(ticks));
    const int64_t done = F * i / ticks;
    ctl.progress({"ar", done, F, ar_clock.rate(done), "frames", ""});
  }
  const double seconds_ar = since();
  const int steps = std::max(1, std::min(req.steps, 10));
  StageClock dit_clock;
  for (int s = 1; s <= steps; ++s) {
    ctl.check_cancel();
    nap(0.25 * seconds_per_job_ / steps);
    ctl.progress({"dit", s, steps, dit_clock.rate(s), "steps", "window 1/1"});
  }
  ctl.check_cancel();
  nap(0.05 * seconds_per_job_);
  ctl.progress({"vocoder", 1, 1, 0, "windows", ""});

  GenerationResult r;
  r.sample_rate = 44100;
  r.frames = F;
  r.stopped_on_end = false;
  r.prompt_tokens = static_cast<int64_t>(req.caption.size() + req.lyrics.size());
  const int64_t S = F * r.sample_rate / 25;
  r.audio = Tensor::zeros(DType::F32, {2, S});
  float* a = r.audio.data<float>();
  const uint64_t h = mix(req.seed);
  const double f_left = 220.0 + static_cast<double>(h % 440);  // 220..659 Hz
  const double f_right = f_left * 1.5;                           // a fifth above
  for (int64_t s = 0; s < S; ++s) {
    const double t = static_cast<double>(s) / r.sample_rate;
    a[s] = static_cast<float>(0.25 * std::sin(2 * std::numbers::pi * f_left * t));
    a[S + s] = static_cast<float>(0.25 * std::sin(2 * std::numbers::pi * f_right * t));
  }
  r.codes = Tensor::zeros(DType::I64, {F + 1, 8});
  int64_t* c = r.codes.data<int64_t>();
  for (int64_t i = 0; i < (F + 1) * 8; ++i) c[i] = static_cast<int64_t>(mix(h + static_cast<uint64_t>(i)) % 1024);
  r.seconds_ar = seconds_ar;
  r.seconds_total = since();
  r.seconds_acoustic = r.seconds_total - seconds_ar;
  return r;
}

}  // namespace mm3::server
