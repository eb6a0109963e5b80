// generator.h — what the server's single worker runs for one job (issue 7): a small job-executor
// interface, so the queue, persistence, routes and cancellation can be built and tested without the
// model. The real implementation wraps mm3::Pipeline (pipeline_generator.cpp); FakeGenerator is a test
// double that renders a labelled synthetic tone (never music) and is reachable from the CLI only through
// the hidden `mm3 serve --fake-generator SECONDS` testing aid.
#pragma once

#include <memory>
#include <string>

#include "core/progress.h"
#include "pipeline/pipeline.h"
#include "pipeline/request.h"

namespace mm3::server {

class Generator {
 public:
  virtual ~Generator() = default;
  // Runs one request. Must call ctl.check_cancel() between units of work (frames, steps) and report
  // progress through ctl.progress(); throws mm3::Cancelled when asked to stop, other mm3 errors on
  // failure. Called from one thread at a time.
  virtual GenerationResult generate(const Request& req, const RunControl& ctl) = 0;
  // The id /v1/models lists and the responses echo.
  virtual std::string model_id() const = 0;
  // True only for the test double: the server labels everything it produces as a test tone.
  virtual bool is_test_double() const { return false; }
};

// The test double. Each job takes about `seconds_per_job` (spread over "ar" frames, "dit" steps and one
// "vocoder" unit, each a cancellation point) and returns a stereo sine whose pitch follows the seed
// (so outputs are deterministic per request), duration = frames / 25 s at 44.1 kHz, and codes
// [F + 1, 8] int64 derived from the seed. Requests whose caption contains "FAKE_FAIL" fail with
// InternalError, so tests can exercise the failure path.
class FakeGenerator : public Generator {
 public:
  explicit FakeGenerator(double seconds_per_job) : seconds_per_job_(seconds_per_job) {}
  GenerationResult generate(const Request& req, const RunControl& ctl) override;
  std::string model_id() const override { return "mm3-test-tone"; }
  bool is_test_double() const override { return true; }

 private:
  double seconds_per_job_;
};

// Frames a request asks for: min(int(duration * 25), 9000) (MODEL.md §2.3).
int64_t frame_budget(const Request& req);

// The real generator: mm3::Pipeline on a checkpoint folder (already resolved with resolve_model), listed
// as `model_id`. Construction validates the configs (weights map lazily); throws BadModel on a bad folder.
std::unique_ptr<Generator> make_pipeline_generator(const std::string& model_dir, const PipelineOptions& opt,
                                                   const std::string& model_id);

}  // namespace mm3::server
