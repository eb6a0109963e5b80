// kind_acoustic.cpp — golden kinds `condition_encoder`, `transformer`, `vocoder`, `acoustic` and the e2e
// acoustic part (MODEL.md §3, §4, §5; golden/README.md). Every case runs the fp32 reference profile and is
// gated by the manifest's checks; the bf16 compute option of the DiT / vocoder is reported as a note
// (not gated) next to it.
#include <chrono>
#include <cmath>

#include "pipeline/acoustic_stage.h"
#include "verify/kinds.h"

namespace mm3::verify {

namespace {

struct AcousticBundle {
  std::unique_ptr<ConditionEncoder> condition;
  std::unique_ptr<DiT> dit;
  std::unique_ptr<Vocoder> vocoder;
  AcousticModels models() const { return {condition.get(), dit.get(), vocoder.get()}; }
};

// Loaded once per verify run (each component on first use).
AcousticBundle& bundle(const VerifyContext& ctx) {
  auto& slot = ctx.cache()["acoustic_models"];
  if (!slot) slot = std::make_shared<AcousticBundle>();
  return *static_cast<AcousticBundle*>(slot.get());
}
const ConditionEncoder& condition(const VerifyContext& ctx) {
  AcousticBundle& b = bundle(ctx);
  if (!b.condition) {
    const Checkpoint& ck = ctx.checkpoint();
    b.condition = std::make_unique<ConditionEncoder>(ck.store("condition_encoder"), ck.configs().cond);
  }
  return *b.condition;
}
const DiT& dit(const VerifyContext& ctx) {
  AcousticBundle& b = bundle(ctx);
  if (!b.dit) {
    const Checkpoint& ck = ctx.checkpoint();
    b.dit = std::make_unique<DiT>(ck.store("transformer"), ck.configs().dit);
  }
  return *b.dit;
}
const Vocoder& vocoder(const VerifyContext& ctx) {
  AcousticBundle& b = bundle(ctx);
  if (!b.vocoder) {
    const Checkpoint& ck = ctx.checkpoint();
    b.vocoder = std::make_unique<Vocoder>(ck.store("vocoder"), ck.configs().vocoder);
  }
  return *b.vocoder;
}
AcousticModels all_models(const VerifyContext& ctx) { return {&condition(ctx), &dit(ctx), &vocoder(ctx)}; }

std::string bf16_note(const std::string& name, const Tensor& ours, const Tensor& ref) {
  const DiffStats d = diff_stats(ours, ref);
  return fmt::format("bf16 compute (not gated) {}: rel_rms={:.3g} max_abs={:.3g} ref_absmax={:.3g}", name, d.rel_rms,
                     d.max_abs, d.ref_absmax);
}

// When the checkpoint's vocoder holds non-finite tensors the waveform is non-finite in the reference too;
// say so next to the (failing) check, with how much of the golden tensor is non-finite.
void note_nonfinite(const VerifyContext& ctx, const SafetensorsFile& f, const std::string& name, CaseOutputs& out) {
  const auto& bad = vocoder(ctx).nonfinite_tensors();
  if (bad.empty()) return;
  std::string list;
  for (const auto& b : bad) list += (list.empty() ? "" : ", ") + b;
  int64_t nf = 0, total = 0;
  if (f.contains(name))
    for (float v : f.get(name).to_f32_vector()) {
      ++total;
      nf += !std::isfinite(v);
    }
  out.notes.push_back(fmt::format("the checkpoint's vocoder tensor(s) {} hold NaN/inf, so every waveform is "
                                  "non-finite; the golden '{}' has {} of {} non-finite values (a defect of the golden "
                                  "set, not comparable)",
                                  list, name, nf, total));
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Golden noise_k tensors of a case with `n` windows.
std::vector<Tensor> golden_noise(const SafetensorsFile& f, int n) {
  std::vector<Tensor> r;
  for (int k = 0; k < n; ++k) {
    const std::string key = fmt::format("noise_{}", k);
    if (!f.contains(key)) throw InvalidInput(fmt::format("{}: no '{}' for window {} of {}", f.path(), key, k, n));
    r.push_back(f.get(key).to(DType::F32));
  }
  return r;
}

int window_count(const SafetensorsFile& f, int64_t T) {
  const int n = static_cast<int>(window_starts(T).size());
  if (f.contains(fmt::format("noise_{}", n))) throw InvalidInput(fmt::format("{}: more noise tensors than {} windows", f.path(), n));
  return n;
}

}  // namespace

CaseOutputs run_condition_encoder_case(const CaseInput& in) {
  const ConditionEncoder& ce = condition(in.ctx);
  CaseOutputs out;
  const auto t0 = std::chrono::steady_clock::now();
  out.outputs["condition"] = ce.forward(in.ctx.pool(), in.file.get("frame_hiddens"));  // [1, L, out_dim]
  out.notes.push_back(fmt::format("{:.3f} s", since(t0)));
  return out;
}

CaseOutputs run_transformer_case(const CaseInput& in) {
  const DiT& model = dit(in.ctx);
  const Tensor x = in.file.get("latents").to(DType::F32).contiguous();       // [1, C, L]
  const Tensor t = in.file.get("timestep").to(DType::F32);                  // [1]
  const Tensor cond = in.file.get("condition").to(DType::F32).contiguous();  // [1, L, Dc]
  if (x.ndim() != 3 || x.dim(0) != 1) throw InvalidInput("transformer case: latents must be [1, C, L]");
  const int64_t C = x.dim(1), L = x.dim(2);
  CaseOutputs out;
  // Both CFG branches in one batch-2 forward: condition | all-zero condition.
  auto run = [&](DType compute, Tensor& vc, Tensor& vu) {
    vc = Tensor::empty(DType::F32, {1, C, L});
    vu = Tensor::empty(DType::F32, {1, C, L});
    DitWorkspace ws;
    const float tv = t.to_f32_vector()[0];
    model.forward(in.ctx.pool(), {DitItem{x.data<float>(), tv, cond.data<float>()}, DitItem{x.data<float>(), tv, nullptr}},
                  L, {vc.data<float>(), vu.data<float>()}, compute, ws);
  };
  const auto t0 = std::chrono::steady_clock::now();
  Tensor vc, vu;
  run(DType::F32, vc, vu);
  out.notes.push_back(fmt::format("fp32 batch-2 forward {:.3f} s", since(t0)));
  out.outputs["velocity"] = vc;
  out.outputs["velocity_uncond"] = vu;
  Tensor bc, bu;
  run(DType::BF16, bc, bu);
  out.notes.push_back(bf16_note("velocity", bc, in.file.get("velocity")));
  out.notes.push_back(bf16_note("velocity_uncond", bu, in.file.get("velocity_uncond")));
  return out;
}

CaseOutputs run_vocoder_case(const CaseInput& in) {
  const Vocoder& voc = vocoder(in.ctx);
  const Tensor lat = in.file.get("latents");
  CaseOutputs out;
  const auto t0 = std::chrono::steady_clock::now();
  out.outputs["waveform"] = voc.decode(in.ctx.pool(), lat);  // [1, 2, hop·L]
  out.notes.push_back(fmt::format("fp32 decode {:.3f} s", since(t0)));
  out.notes.push_back(bf16_note("waveform", voc.decode(in.ctx.pool(), lat, DType::BF16), in.file.get("waveform")));
  note_nonfinite(in.ctx, in.file, "waveform", out);
  return out;
}

namespace {

// Runs the acoustic stage on a case's golden frame_hiddens + noise_k; fills latents_k and audio.
AcousticResult run_stage(const CaseInput& in, int steps, CaseOutputs& out) {
  const Tensor fh = in.file.get("frame_hiddens");
  const int64_t T = fh.ndim() == 3 ? fh.dim(1) : fh.dim(0);
  AcousticParams p;
  p.steps = steps;
  p.noise = golden_noise(in.file, window_count(in.file, T));
  const auto t0 = std::chrono::steady_clock::now();
  AcousticResult r = run_acoustic(all_models(in.ctx), fh, p, in.ctx.pool());
  out.notes.push_back(fmt::format("{} windows x {} steps: condition {:.3f} s, dit {:.3f} s, vocoder {:.3f} s, total {:.3f} s",
                                  r.windows.size(), steps, r.seconds_condition, r.seconds_dit, r.seconds_vocoder,
                                  since(t0)));
  for (size_t k = 0; k < r.latents.size(); ++k) out.outputs[fmt::format("latents_{}", k)] = r.latents[k];
  out.outputs["audio"] = r.audio.unsqueeze(0);  // [1, 2, S]
  note_nonfinite(in.ctx, in.file, "audio", out);
  return r;
}

}  // namespace

CaseOutputs run_acoustic_case(const CaseInput& in) {
  CaseOutputs out;
  const int steps = in.spec.at("meta").at("steps").get<int>();
  run_stage(in, steps, out);
  // bf16 compute of the whole stage (not gated).
  {
    const Tensor fh = in.file.get("frame_hiddens");
    AcousticParams p;
    p.steps = steps;
    p.precision = DType::BF16;
    p.noise = golden_noise(in.file, window_count(in.file, fh.dim(1)));
    AcousticResult r = run_acoustic(all_models(in.ctx), fh, p, in.ctx.pool());
    out.notes.push_back(bf16_note("audio", r.audio.unsqueeze(0), in.file.get("audio")));
  }
  return out;
}

void e2e_acoustic_part(const CaseInput& in, CaseOutputs& out) {
  const int steps = in.spec.at("meta").at("num_inference_steps").get<int>();
  CaseOutputs mine;
  AcousticResult r = run_stage(in, steps, mine);
  out.outputs["audio"] = mine.outputs.at("audio");  // gated by the manifest's e2e `audio` check
  // latents_k: extra fp32 checks with the acoustic cases' bounds.
  const nlohmann::json bounds = in.ctx.find_check("acoustic", "fp32", "latents_0");
  for (size_t k = 0; k < r.latents.size(); ++k) {
    const std::string name = fmt::format("latents_{}", k);
    if (!in.file.contains(name)) {
      out.extra.push_back({name, "fp32", false, "", "the golden file has no such tensor"});
      continue;
    }
    if (bounds.is_null()) {
      out.notes.push_back("no acoustic fp32 latents bounds in the manifest; " + name + " not checked");
      continue;
    }
    nlohmann::json check = bounds;
    check["output"] = name;
    out.extra.push_back(apply_check(check, r.latents[k], in.file.get(name)));
  }
  for (auto& n : mine.notes) out.notes.push_back("acoustic: " + n);
}

}  // namespace mm3::verify
