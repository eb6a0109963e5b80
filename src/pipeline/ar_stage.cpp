// ar_stage.cpp — run_ar and frame_budget (ar_stage.h; MODEL.md §2.3–2.8).
// Exact torch op order: no fused multiply-add contraction (GCC contracts by default).
#pragma GCC optimize("fp-contract=off")

#include "pipeline/ar_stage.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "sampling/sampler.h"
#include "sampling/seed.h"

namespace mm3 {

int64_t frame_budget(double duration) {
  if (!std::isfinite(duration) || !(duration > 0))
    throw InvalidInput(fmt::format("audio duration must be a finite number of seconds > 0, got {}", duration));
  const double f = duration * kArFrameRate;  // python: int(audio_duration * 25)
  const int64_t frames = f >= double(kArMaxFrames) ? kArMaxFrames : static_cast<int64_t>(f);
  if (frames == 0)
    throw InvalidInput(fmt::format("audio duration {} s gives 0 frames at 25 frames/s (the shortest is 0.04 s)",
                                   duration));
  return frames;
}

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Checks forced codes; returns the number of rows and whether the last one is an end row.
void check_forced(const Tensor& t, int nb, int64_t audio_vocab, int64_t& rows, bool& ends) {
  if (t.dtype() != DType::I64 || t.ndim() != 2 || t.dim(1) != nb || t.dim(0) < 1)
    throw InvalidInput(fmt::format("forced codes must be int64 [F + 1, {}], got {}", nb, t.describe()));
  rows = t.dim(0);
  const std::vector<int64_t> c = t.to_i64_vector();
  ends = false;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t c0 = c[size_t(r * nb)];
    if (c0 == -1) {
      if (r != rows - 1)
        throw InvalidInput(fmt::format("forced codes: row {} is an end row (c0 = -1) but is not the last of {}", r,
                                       rows));
      ends = true;
      continue;
    }
    if (c0 < 0 || c0 >= kNumSemanticCodes)
      throw InvalidInput(fmt::format("forced codes: row {} c0 = {} outside [0, {})", r, c0, kNumSemanticCodes));
    for (int j = 1; j < nb; ++j) {
      const int64_t cj = c[size_t(r * nb + j)];
      if (cj < 0 || cj >= audio_vocab)
        throw InvalidInput(fmt::format("forced codes: row {} c{} = {} outside [0, {})", r, j, cj, audio_vocab));
    }
  }
}

}  // namespace

ArResult run_ar(const ArModels& m, const std::vector<int64_t>& cond_ids, const std::vector<int64_t>& uncond_ids,
                const ArParams& p, const ThreadPool& pool, const RunControl& ctl) {
  const auto t0 = Clock::now();
  if (!m.lm || !m.depth) throw InternalError("run_ar: models not loaded");
  const Qwen3Lm& lm = *m.lm;
  const RvqDepth& depth = *m.depth;
  const DType prec = p.precision;
  if (prec != DType::BF16 && prec != DType::F32)
    throw InvalidInput(fmt::format("AR precision must be BF16 or F32, got {}", dtype_name(prec)));
  const int64_t H = lm.hidden();
  const int nb = depth.codebooks();
  const int64_t AV = depth.audio_vocab();
  if (depth.hidden() != H)
    throw BadModel(fmt::format("depth decoder hidden {} != language model hidden {}", depth.hidden(), H));
  const int64_t n = static_cast<int64_t>(cond_ids.size());
  if (n == 0) throw InvalidInput("AR stage: empty prompt");
  if (uncond_ids.size() != cond_ids.size())
    throw InvalidInput(fmt::format("AR stage: the cond row has {} tokens, the uncond row {} (they must be equal)", n,
                                   uncond_ids.size()));
  if (p.max_frames < 1 || p.max_frames > kArMaxFrames)
    throw InvalidInput(fmt::format("AR stage: max_frames {} outside 1..{}", p.max_frames, kArMaxFrames));
  if (!std::isfinite(p.cfg)) throw InvalidInput(fmt::format("AR stage: cfg scale {} is not finite", p.cfg));
  if (p.top_k < 1 || p.c0_cond_top_k < 1)
    throw InvalidInput(fmt::format("AR stage: top_k {} / c0_cond_top_k {} must be >= 1", p.top_k, p.c0_cond_top_k));
  if (p.record_guided_steps < 0) throw InvalidInput("AR stage: record_guided_steps < 0");

  int64_t budget = p.max_frames;
  int64_t forced_rows = 0;
  bool forced_ends = false;
  std::vector<int64_t> forced;
  if (p.forced_codes) {
    check_forced(*p.forced_codes, nb, AV, forced_rows, forced_ends);
    forced = p.forced_codes->to_i64_vector();
    // F + 1 rows feed at most F frames (with an end row as the last, F − 1 frames, then the stop).
    budget = std::min(budget, forced_rows - 1);
    if (budget < 1)
      throw InvalidInput("forced codes: a single row (frame 0 only) emits no frame; give at least 2 rows");
  }

  // ---- per-request state, all allocated here ----
  const int64_t steps_max = budget + 1;
  KvCache cache = lm.make_cache(2, n + budget, prec);  // the largest LM position used is n + budget − 1
  LmScratch scr = lm.make_scratch(2);
  DepthState dst = depth.make_state(2, prec);
  SeededSampler sampler(ar_sampling_seed(p.seed), kSampleableColumns, p.top_k);
  std::vector<float> h(size_t(2 * H));                      // [2, H] LM hidden (cond, uncond)
  std::vector<float> logits(size_t(2 * kSampleableColumns)); // [2, 16385]
  std::vector<float> guided(static_cast<size_t>(kSampleableColumns));    // [16385]
  std::vector<float> fb_scratch(size_t(2 * H));
  std::vector<float> x1(size_t(2 * H));                     // [2, 1, H] LM input of a decode step
  std::vector<int64_t> codes(size_t(steps_max * nb), -1);   // [steps, 8]
  const int64_t rec = std::min(p.record_guided_steps, steps_max);
  Tensor c0_rec = rec ? Tensor::empty(DType::F32, {rec, kSampleableColumns}) : Tensor();
  Tensor d_rec = rec ? Tensor::empty(DType::F32, {rec * (nb - 1), AV}) : Tensor();
  Tensor fh = Tensor::empty(DType::F32, {budget, int64_t(nb) * H});  // [T, 8H]
  float* fhp = fh.data<float>();
  const float cfg = static_cast<float>(p.cfg);

  // ---- prefill [cond, uncond] (§2.4): h = final-norm hidden at the last prompt position ----
  ctl.check_cancel();
  {
    std::vector<float> x(size_t(2 * n * H));  // [2, n, H]
    lm.embed(cond_ids.data(), n, x.data(), H);
    lm.embed(uncond_ids.data(), n, x.data() + n * H, H);
    lm.forward(pool, x.data(), 2, n, cache, scr, h.data(), /*all_positions=*/false, prec);
  }
  ArResult res;
  res.prompt_tokens = n;
  res.seconds_prefill = since(t0);
  const auto tloop = Clock::now();

  int64_t frames = 0, steps = 0, d_recorded = 0;
  bool stopped = false;
  int64_t f = 0;  // AR step (frame index; 0 = the non-emitted frame)
  const bool force = !forced.empty();
  // The depth decoder's code chooser, built once (a per-step std::function would allocate): records the
  // guided row, then samples at position 8·f + j or takes the forced code.
  struct ChooseCtx {
    const int64_t& f;
    int64_t rec, AV, nb;
    bool force;
    Tensor& d_rec;
    int64_t& d_recorded;
    const std::vector<int64_t>& forced;
    SeededSampler& sampler;
  } cx{f, rec, AV, nb, force, d_rec, d_recorded, forced, sampler};
  const DepthCodeChooser choose = [&cx](int j, const float* g, int64_t nc) -> int64_t {
    if (cx.f < cx.rec) std::memcpy(cx.d_rec.data<float>() + (cx.d_recorded++) * cx.AV, g, sizeof(float) * size_t(nc));
    return cx.force ? cx.forced[size_t(cx.f * cx.nb + j)]
                    : cx.sampler.sample(g, nc, static_cast<uint32_t>(8 * cx.f + j));
  };
  for (f = 0; f <= budget; ++f) {
    ctl.check_cancel();
    int64_t* cf = codes.data() + f * nb;  // [8] this step's codes
    if (force && f >= forced_rows) throw InternalError("forced codes exhausted");
    // ---- c0: narrowed logits, CFG, cond-top-k pre-mask, draw (§2.4, §2.6) ----
    lm.sampleable_logits(pool, h.data(), 2, H, logits.data(), prec);  // [2, 16385]
    const float* cond = logits.data();
    const float* unc = logits.data() + kSampleableColumns;
    cfg_combine(cond, unc, cfg, guided.data(), kSampleableColumns);
    sampler.cond_top_k_mask(cond, guided.data(), kSampleableColumns, p.c0_cond_top_k);
    if (f < rec) std::memcpy(c0_rec.data<float>() + f * kSampleableColumns, guided.data(), sizeof(float) * kSampleableColumns);
    int64_t col;
    if (force) {
      const int64_t c0f = forced[size_t(f * nb)];
      col = c0f < 0 ? 0 : 1 + c0f;
    } else {
      col = sampler.sample(guided.data(), kSampleableColumns, static_cast<uint32_t>(8 * f));
    }
    steps = f + 1;
    if (col == 0) {  // <|audio_end|>
      stopped = true;
      break;
    }
    cf[0] = col - 1;

    // ---- depth decoder (§2.7): c1..c7, each guided and drawn like c0 but without the pre-mask ----
    depth.decode_frame(pool, lm.embed_table(), h.data(), cfg, dst, choose, cf,
                       f > 0 ? fhp + frames * nb * H + H : nullptr, prec);  // d1..d7 of the cond row

    // ---- emit (frames 1.. only) ----
    if (f > 0) {
      std::memcpy(fhp + frames * nb * H, h.data(), sizeof(float) * H);  // h_LM of the cond row
      ++frames;
      ProgressEvent ev;
      ev.stage = "ar";
      ev.done = frames;
      ev.total = budget;
      ev.rate = frames / std::max(1e-9, since(tloop));
      ev.unit = "frames";
      ctl.progress(ev);
      if (frames >= budget) break;
    }

    // ---- feedback (§2.8) and one LM decode step, both rows, position n + f ----
    frame_feedback_embedding(lm.embed_table(), depth, cf, x1.data(), fb_scratch.data(), prec);
    std::memcpy(x1.data() + H, x1.data(), sizeof(float) * H);
    lm.forward(pool, x1.data(), 2, 1, cache, scr, h.data(), /*all_positions=*/false, prec);
  }

  if (frames == 0)
    throw InvalidInput(fmt::format("the model generated zero frames: it sampled <|audio_end|> at AR step {} before "
                                   "emitting any frame (try another seed or prompt)",
                                   steps - 1));
  res.frames = frames;
  res.stopped_on_end = stopped;
  // codes [steps, 8]; an end row stays all −1.
  codes.resize(size_t(steps * nb));
  res.codes = Tensor::from_i64(codes, {steps, nb});
  res.frame_hiddens = frames == budget ? fh : fh.slice(0, 0, frames);
  if (rec) {
    res.c0_guided = c0_rec.slice(0, 0, std::min(rec, steps));
    res.depth_guided = d_rec.slice(0, 0, d_recorded);
  }
  res.seconds_total = since(t0);
  return res;
}

}  // namespace mm3
