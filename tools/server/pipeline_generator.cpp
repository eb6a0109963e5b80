// pipeline_generator.cpp — the real Generator (generator.h): mm3::Pipeline, one instance for the
// server's lifetime, so components loaded by the first job stay resident for the next (the model store
// inside Pipeline decides residency). The worker calls generate() from one thread only, which is the
// serialisation Pipeline asks of its callers.
#include <memory>

#include "server/generator.h"

namespace mm3::server {

namespace {

class PipelineGenerator : public Generator {
 public:
  PipelineGenerator(const std::string& dir, const PipelineOptions& opt, std::string id)
      : pipeline_(dir, opt), id_(std::move(id)) {}
  GenerationResult generate(const Request& req, const RunControl& ctl) override { return pipeline_.generate(req, ctl); }
  std::string model_id() const override { return id_; }

 private:
  Pipeline pipeline_;
  std::string id_;
};

}  // namespace

std::unique_ptr<Generator> make_pipeline_generator(const std::string& model_dir, const PipelineOptions& opt,
                                                   const std::string& model_id) {
  return std::make_unique<PipelineGenerator>(model_dir, opt, model_id);
}

}  // namespace mm3::server
