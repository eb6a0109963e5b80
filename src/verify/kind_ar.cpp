// kind_ar.cpp — golden kinds `language_model` and `rvq_depth_decoder`, and the AR part of `e2e`
// (issue 4; MODEL.md §2.4–2.8). Stages: model/qwen3_lm, model/rvq_depth, pipeline/ar_stage.
//
// * language_model: prefill of the [cond, uncond] rows via inputs_embeds (text_ids embedded), then 3
//   KV-cached decode steps fed feedback_embeds[i]; outputs prefill_hidden [2, n, H], decode_hidden
//   [2, 3, H], code_logits [4, 2, 16384] and end_logits [4, 2] (raw per-row logits, not guided).
// * rvq_depth_decoder: one frame teacher-forced to forced_codes from last_hidden and c0; outputs
//   depth_hidden [1, 7H], guided_logits [7, 1024], feedback_embed [2, 1, H].
// * e2e (AR part), in the reference profile (bf16): (a) codes forced to the golden `codes`:
//   frame_hiddens under the bf16_forced rule (lm_bf16's prefill_hidden bounds) and every recorded guided
//   row under depth_bf16's guided_logits bounds; (b) free-running from meta.seed: codes exact, with a
//   note on the first divergence and the guided margin there.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "pipeline/ar_stage.h"
#include "sampling/sampler.h"
#include "sampling/seed.h"
#include "verify/kinds.h"

namespace mm3::verify {

namespace {

using nlohmann::json;

struct ArModelsHolder {
  std::shared_ptr<const Qwen3Lm> lm;
  std::shared_ptr<const RvqDepth> depth;
};

// Loaded once per verify run, shared by every AR case.
const ArModelsHolder& models(const VerifyContext& ctx, bool need_depth) {
  auto& slot = ctx.cache()["ar.models"];
  if (!slot) slot = std::make_shared<ArModelsHolder>();
  auto* m = static_cast<ArModelsHolder*>(slot.get());
  if (!m->lm) m->lm = Qwen3Lm::load(ctx.checkpoint());
  if (need_depth && !m->depth) m->depth = RvqDepth::load(ctx.checkpoint());
  return *m;
}

DType case_precision(const CaseInput& in) {
  const std::string dt = in.spec.at("meta").value("dtype", "");
  if (dt == "fp32") return DType::F32;
  if (dt == "bf16" || dt == "reference") return DType::BF16;
  throw InvalidInput(fmt::format("case {}: unknown meta.dtype '{}'", in.spec.value("name", "?"), dt));
}

std::vector<float> f32_of(const SafetensorsFile& f, const std::string& name) { return f.get(name).to_f32_vector(); }

// check_bf16 for rows that hold −inf where a mask removed a column (the c0 pre-mask): the masks must
// agree exactly; the columns finite in both are compared under the bf16 bounds.
CheckResult check_masked_bf16(const std::string& output, const Tensor& ours, const Tensor& ref, const json& bounds) {
  CheckResult r{output, "bf16_masked", false, "", ""};
  if (ours.shape() != ref.shape()) {
    r.reason = fmt::format("shape {} != golden {}", shape_str(ours.shape()), shape_str(ref.shape()));
    return r;
  }
  if (bounds.is_null()) {
    r.reason = "no bounds found in the manifest (depth_bf16 guided_logits)";
    return r;
  }
  const auto a = ours.to_f32_vector(), b = ref.to_f32_vector();
  std::vector<float> fa, fb;
  int64_t mask_mismatch = 0, masked = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool ia = std::isinf(a[i]) && a[i] < 0, ib = std::isinf(b[i]) && b[i] < 0;
    if (ia != ib) {
      ++mask_mismatch;
      continue;
    }
    if (ia) {
      ++masked;
      continue;
    }
    fa.push_back(a[i]);
    fb.push_back(b[i]);
  }
  const int64_t nf = static_cast<int64_t>(fa.size());
  CheckResult c = check_bf16(output, Tensor::from_f32(fa, {nf}), Tensor::from_f32(fb, {nf}),
                             bounds.at("bit_identical_min").get<double>(), bounds.at("mean_abs_max").get<double>(),
                             bounds.at("max_abs_max").get<double>());
  r.metrics = fmt::format("{} masked={} mask_mismatch={}", c.metrics, masked, mask_mismatch);
  r.pass = c.pass && mask_mismatch == 0;
  r.reason = mask_mismatch ? fmt::format("{} columns masked (-inf) on one side only", mask_mismatch) : c.reason;
  return r;
}

CheckResult check_bf16_bounds(const std::string& output, const std::string& rule, const Tensor& ours,
                              const Tensor& ref, const json& bounds, const std::string& from) {
  if (bounds.is_null()) return {output, rule, false, "", "no bounds in the manifest (" + from + ")"};
  CheckResult c = check_bf16(output, ours, ref, bounds.at("bit_identical_min").get<double>(),
                             bounds.at("mean_abs_max").get<double>(), bounds.at("max_abs_max").get<double>());
  c.rule = rule;
  return c;
}

// Gumbel-perturbed score of column c in a guided row as the sampler ranks it; −inf when outside the
// top-k (thr) and so unselectable.
double sampler_score(const float* row, int64_t c, float thr, uint64_t s, uint32_t pos) {
  const float g = row[c];
  const float v = std::isnan(g) ? -1e9f : (std::isinf(g) ? (g > 0 ? 1e9f : -1e9f) : g);
  if (v < thr) return -std::numeric_limits<double>::infinity();
  return static_cast<double>(v) + seeded_gumbel(s, pos, static_cast<uint32_t>(c));
}

float nan_to_num_thr(const float* row, int64_t n, int k) {
  std::vector<float> v(row, row + n);
  for (float& x : v) x = std::isnan(x) ? -1e9f : (std::isinf(x) ? (x > 0 ? 1e9f : -1e9f) : x);
  std::nth_element(v.begin(), v.begin() + (k - 1), v.end(), std::greater<float>());
  return v[size_t(k - 1)];
}

}  // namespace

CaseOutputs run_language_model_case(const CaseInput& in) {
  const DType prec = case_precision(in);
  const ThreadPool& pool = in.ctx.pool();
  const Qwen3Lm& lm = *models(in.ctx, false).lm;
  const int64_t H = lm.hidden();
  const Tensor ids = in.file.get("text_ids");  // [2, n]
  if (ids.ndim() != 2 || ids.dim(0) != 2) throw InvalidInput("text_ids must be [2, n], got " + ids.describe());
  const int64_t n = ids.dim(1);
  const std::vector<int64_t> idv = ids.to_i64_vector();
  const Tensor fbt = in.file.get("feedback_embeds");  // [steps, 2, 1, H]
  const int64_t steps = fbt.dim(0);
  const std::vector<float> fb = fbt.to_f32_vector();

  KvCache cache = lm.make_cache(2, n + steps, prec);
  LmScratch scr = lm.make_scratch(2);
  std::vector<float> x(size_t(2 * n * H));
  lm.embed(idv.data(), 2 * n, x.data(), H);                   // [2, n, H]
  Tensor prefill = Tensor::empty(DType::F32, {2, n, H});
  float* ph = prefill.data<float>();
  lm.forward(pool, x.data(), 2, n, cache, scr, ph, /*all_positions=*/true, prec);

  Tensor code_logits = Tensor::empty(DType::F32, {steps + 1, 2, kNumSemanticCodes});
  Tensor end_logits = Tensor::empty(DType::F32, {steps + 1, 2});
  Tensor decode = Tensor::empty(DType::F32, {2, steps, H});
  std::vector<float> lg(size_t(2 * kSampleableColumns)), h(size_t(2 * H));
  auto put_logits = [&](int64_t i) {
    for (int b = 0; b < 2; ++b) {
      end_logits.data<float>()[i * 2 + b] = lg[size_t(b * kSampleableColumns)];
      std::memcpy(code_logits.data<float>() + (i * 2 + b) * kNumSemanticCodes, lg.data() + b * kSampleableColumns + 1,
                  sizeof(float) * kNumSemanticCodes);
    }
  };
  lm.sampleable_logits(pool, ph + (n - 1) * H, 2, n * H, lg.data(), prec);  // last prompt position of each row
  put_logits(0);
  for (int64_t i = 0; i < steps; ++i) {
    lm.forward(pool, fb.data() + i * 2 * H, 2, 1, cache, scr, h.data(), false, prec);
    for (int b = 0; b < 2; ++b) std::memcpy(decode.data<float>() + (b * steps + i) * H, h.data() + b * H, sizeof(float) * H);
    lm.sampleable_logits(pool, h.data(), 2, H, lg.data(), prec);
    put_logits(i + 1);
  }
  CaseOutputs out;
  out.outputs["prefill_hidden"] = prefill;
  out.outputs["decode_hidden"] = decode;
  out.outputs["code_logits"] = code_logits;
  out.outputs["end_logits"] = end_logits;
  return out;
}

CaseOutputs run_rvq_depth_decoder_case(const CaseInput& in) {
  const DType prec = case_precision(in);
  const ThreadPool& pool = in.ctx.pool();
  const ArModelsHolder& m = models(in.ctx, true);
  const RvqDepth& depth = *m.depth;
  const int64_t H = depth.hidden();
  const int nb = depth.codebooks();
  const std::vector<float> h = f32_of(in.file, "last_hidden");  // [2, H]
  const std::vector<int64_t> forced = in.file.get("forced_codes").to_i64_vector();  // [7]
  if (static_cast<int>(forced.size()) != nb - 1) throw InvalidInput("forced_codes must have num_codebooks - 1 codes");
  std::vector<int64_t> codes(static_cast<size_t>(nb));
  codes[0] = in.file.get("c0").to_i64_vector().at(0);

  DepthState st = depth.make_state(2, prec);
  Tensor dh = Tensor::empty(DType::F32, {1, int64_t(nb - 1) * H});
  Tensor gl = Tensor::empty(DType::F32, {nb - 1, depth.audio_vocab()});
  auto choose = [&](int j, const float* g, int64_t n) -> int64_t {
    std::memcpy(gl.data<float>() + int64_t(j - 1) * n, g, sizeof(float) * size_t(n));
    return forced[size_t(j - 1)];
  };
  depth.decode_frame(pool, m.lm->embed_table(), h.data(), 1.5f, st, choose, codes.data(), dh.data<float>(), prec);
  Tensor fe = Tensor::empty(DType::F32, {2, 1, H});
  std::vector<float> scratch(size_t(2 * H));
  frame_feedback_embedding(m.lm->embed_table(), depth, codes.data(), fe.data<float>(), scratch.data(), prec);
  std::memcpy(fe.data<float>() + H, fe.data<float>(), sizeof(float) * H);
  CaseOutputs out;
  out.outputs["depth_hidden"] = dh;
  out.outputs["guided_logits"] = gl;
  out.outputs["feedback_embed"] = fe;
  return out;
}

void e2e_ar_part(const CaseInput& in, CaseOutputs& out) {
  const ThreadPool& pool = in.ctx.pool();
  const json& meta = in.spec.at("meta");
  const ArModelsHolder& m = models(in.ctx, true);
  const ArModels am{m.lm.get(), m.depth.get()};
  const int64_t H = m.lm->hidden();
  const int nb = m.depth->codebooks();
  const Tensor ids = in.file.get("text_ids");  // [2, n]
  const int64_t n = ids.dim(1);
  const std::vector<int64_t> idv = ids.to_i64_vector();
  const std::vector<int64_t> cond(idv.begin(), idv.begin() + n), unc(idv.begin() + n, idv.end());
  const Tensor gcodes = in.file.get("codes");  // [F + 1, 8]
  const int64_t grows = gcodes.dim(0);

  ArParams p;
  p.seed = meta.at("seed").get<uint64_t>();
  p.max_frames = frame_budget(meta.at("audio_duration").get<double>());
  p.cfg = 1.5;
  p.precision = DType::BF16;  // the reference profile

  // (a) codes forced to the golden codes: frame hiddens and every guided row.
  ArParams pf = p;
  pf.forced_codes = gcodes;
  pf.record_guided_steps = grows;
  const ArResult fr = run_ar(am, cond, unc, pf, pool, RunControl{});
  {
    const Tensor ref = in.file.get("frame_hiddens");  // [1, T, 8H] bf16
    Tensor ours = fr.frame_hiddens.view({1, fr.frames, int64_t(nb) * H});
    out.extra.push_back(check_bf16_bounds("frame_hiddens", "bf16_forced", ours, ref,
                                          in.ctx.find_check("language_model", "bf16", "prefill_hidden"),
                                          "language_model bf16 prefill_hidden"));
    // Reported per condition layer (0 = LM hidden, 1..7 = depth-decoder outputs), to locate a divergence.
    if (ref.shape() == ours.shape()) {
      std::string seg = "frame_hiddens by layer (bit_identical / mean_abs):";
      const Tensor r2 = ref.view({fr.frames, nb, H}), o2 = ours.view({fr.frames, nb, H});
      for (int l = 0; l < nb; ++l) {
        const DiffStats d = diff_stats(o2.slice(1, l, l + 1).contiguous(), r2.slice(1, l, l + 1).contiguous());
        seg += fmt::format(" {}:{:.4f}/{:.3g}", l, d.bit_identical, d.mean_abs);
      }
      out.notes.push_back(seg);
    }
  }
  const json gbounds = in.ctx.find_check("rvq_depth_decoder", "bf16", "guided_logits");
  const Tensor gc0 = in.file.get("c0_guided"), gdep = in.file.get("depth_guided");
  const int64_t nrec = gc0.dim(0);
  out.extra.push_back(check_masked_bf16("c0_guided", fr.c0_guided.slice(0, 0, std::min(nrec, fr.c0_guided.dim(0))),
                                        gc0, gbounds));
  out.extra.push_back(check_bf16_bounds(
      "depth_guided", "bf16", fr.depth_guided.slice(0, 0, std::min(gdep.dim(0), fr.depth_guided.dim(0))), gdep,
      gbounds, "rvq_depth_decoder bf16 guided_logits"));

  // (b) free-running from the seed.
  const ArResult r = run_ar(am, cond, unc, p, pool, RunControl{});
  out.extra.push_back(check_exact("codes", r.codes, gcodes));
  const std::vector<int64_t> a = r.codes.to_i64_vector(), b = gcodes.to_i64_vector();
  const int64_t rows = std::min(r.codes.dim(0), grows);
  int64_t same_rows = 0, div_j = -1;
  for (; same_rows < rows; ++same_rows) {
    for (int j = 0; j < nb && div_j < 0; ++j)
      if (a[size_t(same_rows * nb + j)] != b[size_t(same_rows * nb + j)]) div_j = j;
    if (div_j >= 0) break;
  }
  std::string note = fmt::format(
      "free-running AR (seed {}, sampling seed {}): {} of {} AR steps identical to the golden codes "
      "({} emitted frames before the first divergence); forced run {:.1f} ms/frame",
      p.seed, ar_sampling_seed(p.seed), same_rows, grows, std::max<int64_t>(0, same_rows - 1), fr.ms_per_frame());
  if (div_j >= 0) {
    // Before the divergence the free run had the golden history, so its guided row at the divergent draw
    // is the forced run's recorded row. Rank the two codes as the sampler does, in our row and golden's.
    const int64_t f = same_rows;
    const uint64_t s = ar_sampling_seed(p.seed);
    const uint32_t pos = static_cast<uint32_t>(8 * f + div_j);
    const int64_t ncol = div_j == 0 ? kSampleableColumns : m.depth->audio_vocab();
    const float* ours_row = div_j == 0 ? fr.c0_guided.data<float>() + f * kSampleableColumns
                                       : fr.depth_guided.data<float>() + (f * (nb - 1) + div_j - 1) * ncol;
    const float* gold_row = nullptr;
    if (f < nrec)
      gold_row = div_j == 0 ? gc0.data<float>() + f * kSampleableColumns
                            : gdep.data<float>() + (f * (nb - 1) + div_j - 1) * ncol;
    const int64_t ca = a[size_t(f * nb + div_j)], cb = b[size_t(f * nb + div_j)];
    const int64_t cola = div_j == 0 ? (ca < 0 ? 0 : ca + 1) : ca, colb = div_j == 0 ? (cb < 0 ? 0 : cb + 1) : cb;
    const float thr_o = nan_to_num_thr(ours_row, ncol, 50);
    note += fmt::format(
        "; first divergence at AR step {} codebook {}: ours {} vs golden {}. In our guided row: logit {:.6g} vs "
        "{:.6g}, top-50 threshold {:.6g}, sampler scores {:.6g} vs {:.6g} (gap {:.3g})",
        f, div_j, ca, cb, ours_row[cola], ours_row[colb], thr_o, sampler_score(ours_row, cola, thr_o, s, pos),
        sampler_score(ours_row, colb, thr_o, s, pos),
        sampler_score(ours_row, cola, thr_o, s, pos) - sampler_score(ours_row, colb, thr_o, s, pos));
    if (gold_row) {
      const float thr_g = nan_to_num_thr(gold_row, ncol, 50);
      note += fmt::format(
          "; in the golden row: logit {:.6g} vs {:.6g}, threshold {:.6g}, scores {:.6g} vs {:.6g}; |ours-golden| at "
          "the two columns {:.3g} / {:.3g}, at the threshold {:.3g} (bf16 ulp of the logits ~{:.3g}; "
          "depth_bf16 guided max_abs bound {})",
          gold_row[cola], gold_row[colb], thr_g, sampler_score(gold_row, cola, thr_g, s, pos),
          sampler_score(gold_row, colb, thr_g, s, pos), std::fabs(ours_row[cola] - gold_row[cola]),
          std::fabs(ours_row[colb] - gold_row[colb]), std::fabs(thr_o - thr_g),
          std::ldexp(1.0, std::ilogb(std::max(std::fabs(gold_row[colb]), 1e-30f)) - 7),
          gbounds.is_null() ? 0.0 : gbounds.value("max_abs_max", 0.0));
    }
  }
  out.notes.push_back(note);
}

}  // namespace mm3::verify
