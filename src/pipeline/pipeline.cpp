// pipeline.cpp — Pipeline (pipeline.h): tokenize (MODEL.md §2.1–2.2) → AR stage (§2.3–2.8) → acoustic
// stage (§3–§5.2) → optional 32 kHz resample (§5.3). The model store loads each component the first
// time its stage runs and keeps it for the next request; with low_memory the LM and the depth decoder
// are dropped before the acoustic components load (the full model does not fit twice in 24 GB).
#include "pipeline/pipeline.h"

#include <filesystem>

#include "core/errors.h"
#include "io/audio.h"
#include "io/npy.h"
#include "model/checkpoint.h"
#include "pipeline/acoustic_stage.h"
#include "pipeline/ar_stage.h"
#include "pipeline/memory_plan.h"
#include "tokenizer/prompt.h"

namespace mm3 {

namespace fs = std::filesystem;

struct Pipeline::Impl {
  std::string dir;
  PipelineOptions opt;
  ThreadPool pool;
  Checkpoint ckpt;
  // The model store: null until a stage needs the component.
  std::unique_ptr<Tokenizer> tokenizer;
  std::shared_ptr<const Qwen3Lm> lm;
  std::shared_ptr<const RvqDepth> depth;
  std::unique_ptr<ConditionEncoder> cond;
  std::unique_ptr<DiT> dit;
  std::unique_ptr<Vocoder> vocoder;

  Impl(const std::string& d, const PipelineOptions& o) : dir(d), opt(o), pool(o.threads), ckpt(d) {}

  const Tokenizer& get_tokenizer() {
    if (!tokenizer) tokenizer = std::make_unique<Tokenizer>(load_music3_tokenizer(dir));
    return *tokenizer;
  }
  ArModels ar_models() {
    const kern::QuantType q = opt.ar_quant ? *opt.ar_quant : checkpoint_default_quant(dir);
    if (!lm) lm = Qwen3Lm::load(ckpt, q, &pool);
    if (!depth) depth = RvqDepth::load(ckpt, q, &pool);
    return {lm.get(), depth.get()};
  }
  void drop_ar_models() {
    lm.reset();
    depth.reset();
    ckpt.release("language_model");
    ckpt.release("rvq_depth_decoder");
  }
  AcousticModels acoustic_models() {
    const ModelConfigs& c = ckpt.configs();
    if (!cond) cond = std::make_unique<ConditionEncoder>(ckpt.store("condition_encoder"), c.cond);
    if (!dit) dit = std::make_unique<DiT>(ckpt.store("transformer"), c.dit);
    if (!vocoder) vocoder = std::make_unique<Vocoder>(ckpt.store("vocoder"), c.vocoder);
    return {cond.get(), dit.get(), vocoder.get()};
  }
};

Pipeline::Pipeline(const std::string& model_dir, const PipelineOptions& opt)
    : impl_(std::make_unique<Impl>(model_dir, opt)) {}
Pipeline::~Pipeline() = default;

const std::string& Pipeline::model_dir() const { return impl_->dir; }
const ThreadPool& Pipeline::pool() const { return impl_->pool; }

namespace {

std::vector<int64_t> widen(const std::vector<int32_t>& v) { return std::vector<int64_t>(v.begin(), v.end()); }

void dump(const std::string& dir, const std::string& name, const Tensor& t) {
  if (dir.empty() || t.numel() == 0) return;
  write_npy((fs::path(dir) / (name + ".npy")).string(), t);
}

}  // namespace

GenerationResult Pipeline::generate(const Request& req, const RunControl& ctl, const GenerateOptions& gopt) {
  validate_request(req);
  Impl& m = *impl_;
  if (!gopt.dump_dir.empty()) {
    std::error_code ec;
    fs::create_directories(gopt.dump_dir, ec);
    if (!fs::is_directory(gopt.dump_dir))
      throw InvalidInput(fmt::format("--dump {}: cannot create the directory", gopt.dump_dir));
  }
  StageClock total;
  GenerationResult out;

  // Tokenize: refusals (blank inputs, > 5000 tokens) surface here as InvalidInput.
  const Prompt prompt = build_prompt(m.get_tokenizer(), req.caption, req.lyrics);
  out.prompt_tokens = static_cast<int64_t>(prompt.cond_ids.size());
  dump(gopt.dump_dir, "text_ids", prompt.ids_tensor());
  ctl.check_cancel();

  // AR stage (sampling, or teacher-forced replay of given codes).
  ArParams ap;
  ap.seed = req.seed;
  ap.max_frames = frame_budget(req.duration);
  // Memory: a stage that cannot fit fails now (OutOfMemory, exit 4) with the figures; when only the
  // two stages together do not fit, the AR models are freed before the acoustic stage (--low-memory).
  const bool must_drop = check_memory(plan_memory(m.ckpt, out.prompt_tokens, ap.max_frames, m.opt.ar_precision,
                                                  m.opt.acoustic_precision, m.opt.dit_gemm));
  if (must_drop && !m.opt.low_memory)
    out.notes.push_back("the LM and the acoustic models do not fit in memory together: freeing the LM before the "
                        "acoustic stage (as --low-memory does)");
  ap.cfg = req.ar_cfg;
  ap.precision = m.opt.ar_precision;
  if (gopt.codes) ap.forced_codes = *gopt.codes;
  StageClock ar_clock;
  ArResult ar = run_ar(m.ar_models(), widen(prompt.cond_ids), widen(prompt.uncond_ids), ap, m.pool, ctl);
  out.seconds_ar = ar_clock.seconds();
  out.codes = ar.codes;
  out.frames = ar.frames;
  out.stopped_on_end = ar.stopped_on_end;
  dump(gopt.dump_dir, "codes", ar.codes);
  dump(gopt.dump_dir, "frame_hiddens", ar.frame_hiddens);
  if (m.opt.low_memory || must_drop) m.drop_ar_models();
  ctl.check_cancel();

  // Acoustic stage.
  AcousticParams cp;
  cp.steps = req.steps;
  cp.cfg = req.dit_cfg;
  cp.seed = req.seed;
  cp.precision = m.opt.acoustic_precision;
  cp.dit_gemm = m.opt.dit_gemm;
  StageClock ac_clock;
  AcousticResult ac = run_acoustic(m.acoustic_models(), ar.frame_hiddens, cp, m.pool, ctl);
  out.seconds_acoustic = ac_clock.seconds();
  for (size_t k = 0; k < ac.latents.size(); ++k) dump(gopt.dump_dir, "latents_" + std::to_string(k), ac.latents[k]);
  dump(gopt.dump_dir, "audio", ac.audio);

  out.sample_rate = req.sample_rate;
  out.audio = req.sample_rate == ac.sample_rate ? ac.audio : resample_audio(ac.audio, ac.sample_rate, req.sample_rate);
  out.seconds_total = total.seconds();
  return out;
}

}  // namespace mm3
