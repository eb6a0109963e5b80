// pipeline.cpp — Pipeline (pipeline.h). The stages are joined here as they land.
#include "pipeline/pipeline.h"

#include "core/errors.h"
#include "model/checkpoint.h"

namespace mm3 {

struct Pipeline::Impl {
  std::string dir;
  PipelineOptions opt;
  ThreadPool pool;
  Checkpoint ckpt;
  Impl(const std::string& d, const PipelineOptions& o) : dir(d), opt(o), pool(o.threads), ckpt(d) {}
};

Pipeline::Pipeline(const std::string& model_dir, const PipelineOptions& opt)
    : impl_(std::make_unique<Impl>(model_dir, opt)) {}
Pipeline::~Pipeline() = default;

const std::string& Pipeline::model_dir() const { return impl_->dir; }
const ThreadPool& Pipeline::pool() const { return impl_->pool; }

GenerationResult Pipeline::generate(const Request& req, const RunControl& ctl, const GenerateOptions&) {
  validate_request(req);
  ctl.check_cancel();
  throw NotImplemented("Pipeline::generate: the stages are not joined yet");
}

}  // namespace mm3
