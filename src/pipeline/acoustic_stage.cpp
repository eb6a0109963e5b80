// acoustic_stage.cpp — windowed flow matching + vocoding + stitching (acoustic_stage.h; MODEL.md §4.2–§4.5,
// §5.2). Follows diffusers' MiniMaxMusic3ChunkDenoiseStep / VocoderDecodeStep step by step.
#include "pipeline/acoustic_stage.h"

#include <algorithm>
#include <cstring>

#include "diffusion/noise.h"
#include "diffusion/scheduler.h"
#include "sampling/seed.h"

namespace mm3 {

namespace {

// [1, C, L] or [C, L] noise of window k -> contiguous F32 [C, L].
Tensor checked_noise(const Tensor& n, int k, int64_t C, int64_t L) {
  Tensor t = n;
  if (t.ndim() == 3 && t.dim(0) == 1) t = t.select(0, 0);
  if (t.ndim() != 2 || t.dim(0) != C || t.dim(1) != L)
    throw InvalidInput(fmt::format("acoustic stage: injected noise for window {} must be [1, {}, {}], got {}", k, C,
                                   L, n.describe()));
  return t.to(DType::F32).contiguous();
}

}  // namespace

Tensor stitch_windows(const std::vector<Tensor>& waves, const std::vector<WindowSpec>& plan, int64_t hop) {
  if (waves.size() != plan.size()) throw InternalError("stitch_windows: one waveform per window required");
  int64_t S = 0;
  for (const WindowSpec& w : plan) S += w.kept() * hop;
  Tensor out = Tensor::empty(DType::F32, {2, S});
  float* o = out.data<float>();
  int64_t pos = 0;
  for (size_t k = 0; k < plan.size(); ++k) {
    const WindowSpec& w = plan[k];
    const Tensor wv = waves[k].ndim() == 3 ? waves[k].select(0, 0).contiguous() : waves[k].contiguous();
    const int64_t Lw = wv.dim(1);
    if (wv.dim(0) != 2 || Lw != w.latents * hop)
      throw InternalError(fmt::format("stitch_windows: window {} waveform {} does not match {} latents", k,
                                      wv.describe(), w.latents));
    const int64_t left = w.crop_left * hop, n = w.kept() * hop;
    for (int c = 0; c < 2; ++c) {
      const float* src = wv.data<float>() + c * Lw + left;
      float* dst = o + c * S + pos;
      for (int64_t i = 0; i < n; ++i) dst[i] = std::clamp(src[i], -1.0f, 1.0f);
    }
    pos += n;
  }
  return out;
}

AcousticResult run_acoustic(const AcousticModels& m, const Tensor& frame_hiddens, const AcousticParams& p,
                            const ThreadPool& pool, const RunControl& ctl) {
  if (!m.condition || !m.dit || (p.decode_audio && !m.vocoder))
    throw InternalError("acoustic stage: a model component is missing");
  if (p.steps < 1) throw InvalidInput(fmt::format("acoustic stage: steps must be >= 1 (got {})", p.steps));
  if (p.precision != DType::F32 && p.precision != DType::BF16)
    throw InvalidInput(fmt::format("acoustic stage: precision must be F32 or BF16, not {}", dtype_name(p.precision)));
  if (p.dit_gemm == DitGemm::Int8 && p.precision != DType::F32)
    throw InvalidInput(
        "acoustic stage: the DiT's int8 GEMMs run under the f32 acoustic precision, not bf16 "
        "(choose one of the two)");
  const SolverStep solver = find_solver(p.solver);
  const bool bf16 = p.precision == DType::BF16;
  const DType st = p.precision;

  // Frame hiddens [T, W] F32.
  const ConditionConfig& ccfg = m.condition->config();
  const int64_t W = int64_t{ccfg.num_condition_layers} * ccfg.condition_hidden_dim;
  Tensor fh = frame_hiddens;
  if (fh.ndim() == 3 && fh.dim(0) == 1) fh = fh.select(0, 0);
  if (fh.ndim() != 2 || fh.dim(1) != W)
    throw InvalidInput(fmt::format("acoustic stage: frame hiddens must be [T, {}], got {}", W, frame_hiddens.describe()));
  fh = fh.to(DType::F32).contiguous();
  const int64_t T = fh.dim(0);

  const DitConfig& dcfg = m.dit->config();
  const int64_t C = dcfg.in_channels, Dc = dcfg.condition_dim;
  if (ccfg.out_dim != Dc)
    throw BadModel(fmt::format("condition encoder out_dim {} != transformer condition_dim {}", ccfg.out_dim, Dc));

  AcousticResult res;
  res.windows = plan_windows(T, m.condition->rates());
  const int n = static_cast<int>(res.windows.size());
  if (!p.noise.empty() && static_cast<int>(p.noise.size()) != n)
    throw InvalidInput(fmt::format("acoustic stage: {} injected noise tensors for {} windows", p.noise.size(), n));

  const std::vector<float> grid = flow_time_grid(p.steps);
  const float cfg = static_cast<float>(p.cfg);  // Python float × fp32 tensor: op math in fp32
  DitWorkspace ws;
  std::vector<float> prev_latent, prev_cond;  // [C, carry] and [carry, Dc]
  int64_t prev_len = 0;
  StageClock dit_clock;
  const int64_t total_steps = int64_t{n} * p.steps;

  for (int k = 0; k < n; ++k) {
    const WindowSpec& w = res.windows[static_cast<size_t>(k)];
    const int64_t L = w.latents, ov = w.overlap;

    // 1-2. Condition of this window, cast to the transformer dtype, previous condition spliced in.
    StageClock cc;
    Tensor cond = m.condition->forward(pool, fh.data<float>() + w.start * W, w.end - w.start, W);  // [L, Dc]
    res.seconds_condition += cc.seconds();
    if (cond.dim(0) != L) throw InternalError("acoustic stage: condition length disagrees with the plan");
    float* cp = cond.data<float>();
    round_to_store(cp, static_cast<size_t>(L * Dc), st);
    if (ov > 0) std::memcpy(cp, prev_cond.data(), static_cast<size_t>(ov * Dc) * sizeof(float));

    // 3. Initial noise (injected or drawn); the prompt noise is a copy of its first ov latents.
    Tensor x = p.noise.empty() ? window_noise(derive_seed(p.seed, "dit", k), C, L).select(0, 0).contiguous()
                               : checked_noise(p.noise[static_cast<size_t>(k)], k, C, L).clone();
    float* xp = x.data<float>();
    round_to_store(xp, static_cast<size_t>(C * L), st);
    std::vector<float> noise_prompt(static_cast<size_t>(C * ov));
    for (int64_t c = 0; c < C; ++c)
      std::memcpy(noise_prompt.data() + c * ov, xp + c * L, static_cast<size_t>(ov) * sizeof(float));

    // 4. Euler steps with CFG and prefix prompting.
    std::vector<float> vc(static_cast<size_t>(C * L)), vu(static_cast<size_t>(C * L));
    for (int i = 0; i < p.steps; ++i) {
      ctl.check_cancel();
      const float t = round_store(grid[static_cast<size_t>(i)], st);  // t.to(latents.dtype)
      if (ov > 0) prefix_prompt(xp, C, L, noise_prompt.data(), ov, prev_latent.data(), prev_len, ov, t, bf16);
      m.dit->forward(pool, {DitItem{xp, t, cp}, DitItem{xp, t, nullptr}}, L, {vc.data(), vu.data()}, st, ws,
                     p.dit_gemm);
      // guided = v_u + cfg·(v_c − v_u), each op rounded to the model dtype (into vc).
      for (int64_t j = 0; j < C * L; ++j) {
        const float shift = round_store(vc[j] - vu[j], st);
        vc[j] = round_store(vu[j] + round_store(cfg * shift, st), st);
      }
      solver(xp, vc.data(), C * L, grid[static_cast<size_t>(i)], grid[static_cast<size_t>(i) + 1]);
      round_to_store(xp, static_cast<size_t>(C * L), st);  // the scheduler casts back to the model dtype
      const int64_t done = int64_t{k} * p.steps + i + 1;
      ctl.progress({"dit", done, total_steps, dit_clock.rate(done), "steps",
                    fmt::format("window {}/{} step {}/{}", k + 1, n, i + 1, p.steps)});
    }

    // 5. Restore the prompted prefix; 6. carry [a, b) of latents and (spliced) condition.
    for (int64_t c = 0; c < C; ++c)
      if (ov > 0) std::memcpy(xp + c * L, prev_latent.data() + c * prev_len, static_cast<size_t>(ov) * sizeof(float));
    prev_len = w.carry_end - w.carry_begin;
    prev_latent.assign(static_cast<size_t>(C * prev_len), 0.0f);
    for (int64_t c = 0; c < C; ++c)
      std::memcpy(prev_latent.data() + c * prev_len, xp + c * L + w.carry_begin,
                  static_cast<size_t>(prev_len) * sizeof(float));
    prev_cond.assign(cp + w.carry_begin * Dc, cp + w.carry_end * Dc);

    res.latents.push_back(x.unsqueeze(0));  // [1, C, L]
  }
  res.seconds_dit = dit_clock.seconds() - res.seconds_condition;

  if (p.decode_audio) {
    StageClock vclock;
    const int64_t hop = m.vocoder->hop();
    std::vector<Tensor> waves;
    VocoderWorkspace vws;  // one set of activation buffers for every window
    for (int k = 0; k < n; ++k) {
      ctl.check_cancel();
      const int64_t L = res.windows[static_cast<size_t>(k)].latents;
      Tensor wv = Tensor::empty(DType::F32, {2, hop * L});
      m.vocoder->decode(pool, res.latents[static_cast<size_t>(k)].data<float>(), L, wv.data<float>(), hop * L, st,
                        nullptr, &vws);
      waves.push_back(std::move(wv));
      ctl.progress({"vocoder", k + 1, n, vclock.rate(k + 1), "windows", fmt::format("window {}/{}", k + 1, n)});
    }
    res.audio = stitch_windows(waves, res.windows, hop);
    res.sample_rate = m.vocoder->config().sampling_rate;
    res.seconds_vocoder = vclock.seconds();
  }
  return res;
}

}  // namespace mm3
