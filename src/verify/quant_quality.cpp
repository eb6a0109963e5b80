// quant_quality.cpp — see quant_quality.h. The computations mirror the language_model /
// rvq_depth_decoder runners and the e2e AR part (kind_ar.cpp) step for step, with quantized models.
#include "verify/quant_quality.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <numeric>

#include "core/errors.h"
#include "pipeline/ar_stage.h"
#include "verify/compare.h"

namespace mm3::verify {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Indices of the k largest finite entries of row[0..n) (ties by index).
std::vector<int64_t> topk(const float* row, int64_t n, int k) {
  std::vector<int64_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  auto val = [&](int64_t i) { return std::isfinite(row[i]) ? row[i] : -std::numeric_limits<float>::infinity(); };
  const int kk = static_cast<int>(std::min<int64_t>(k, n));
  std::partial_sort(idx.begin(), idx.begin() + kk, idx.end(), [&](int64_t a, int64_t b) {
    return val(a) > val(b) || (val(a) == val(b) && a < b);
  });
  idx.resize(static_cast<size_t>(kk));
  return idx;
}

// Row-wise argmax agreement and mean top-50 overlap of [rows, n] logits.
void logit_rows(const Tensor& ours, const Tensor& ref, int64_t n, QuantQualityRow& r) {
  const auto a = ours.contiguous().to_f32_vector(), b = ref.contiguous().to_f32_vector();
  const int64_t rows = static_cast<int64_t>(b.size()) / n;
  double agree = 0, overlap = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const auto ta = topk(a.data() + i * n, n, 50), tb = topk(b.data() + i * n, n, 50);
    agree += ta[0] == tb[0];
    int64_t common = 0;
    for (int64_t x : ta) common += std::find(tb.begin(), tb.end(), x) != tb.end();
    overlap += double(common) / double(tb.size());
  }
  r.argmax_agree = rows ? agree / rows : 0;
  r.top50_overlap = rows ? overlap / rows : 0;
}

QuantQualityRow tensor_row(const std::string& cname, const std::string& output, const Tensor& ours, const Tensor& ref,
                           int64_t logits_n = 0) {
  QuantQualityRow r;
  r.case_name = cname;
  r.output = output;
  if (ours.shape() != ref.shape()) {
    r.note = fmt::format("shape {} != golden {}", shape_str(ours.shape()), shape_str(ref.shape()));
    return r;
  }
  const DiffStats d = diff_stats(ours, ref);
  r.bit_identical = d.bit_identical;
  r.rel_rms = d.rel_rms;
  r.max_abs = d.max_abs;
  if (logits_n > 0) logit_rows(ours, ref, logits_n, r);
  return r;
}

std::string row_text(const QuantQualityRow& r) {
  if (!r.note.empty() && r.same_steps < 0) return fmt::format("{}: {}", r.output, r.note);
  if (r.same_steps >= 0)
    return fmt::format("{}: {} of {} AR steps identical before the first divergence{}", r.output, r.same_steps, r.steps,
                       r.note.empty() ? "" : " (" + r.note + ")");
  std::string s = fmt::format("{}: bit_identical={:.4f} rel_rms={:.3g} max_abs={:.3g}", r.output, r.bit_identical,
                              r.rel_rms, r.max_abs);
  if (r.argmax_agree >= 0) s += fmt::format(" argmax_agree={:.3f} top50_overlap={:.3f}", r.argmax_agree, r.top50_overlap);
  return s;
}

struct Models {
  std::shared_ptr<const Qwen3Lm> lm;
  std::shared_ptr<const RvqDepth> depth;
};

void lm_case(const std::string& name, const SafetensorsFile& f, const Qwen3Lm& lm, const ThreadPool& pool,
             std::vector<QuantQualityRow>& rows) {
  const DType prec = DType::BF16;
  const int64_t H = lm.hidden();
  const Tensor ids = f.get("text_ids");  // [2, n]
  const int64_t n = ids.dim(1);
  const std::vector<int64_t> idv = ids.to_i64_vector();
  const Tensor fbt = f.get("feedback_embeds");  // [steps, 2, 1, H]
  const int64_t steps = fbt.dim(0);
  const std::vector<float> fb = fbt.to_f32_vector();
  KvCache cache = lm.make_cache(2, n + steps, prec);
  LmScratch scr = lm.make_scratch(2);
  std::vector<float> x(size_t(2 * n * H));
  lm.embed(idv.data(), 2 * n, x.data(), H);
  Tensor prefill = Tensor::empty(DType::F32, {2, n, H});
  lm.forward(pool, x.data(), 2, n, cache, scr, prefill.data<float>(), true, prec);
  Tensor code_logits = Tensor::empty(DType::F32, {steps + 1, 2, kNumSemanticCodes});
  Tensor decode = Tensor::empty(DType::F32, {2, steps, H});
  std::vector<float> lg(size_t(2 * kSampleableColumns)), h(size_t(2 * H));
  auto put = [&](int64_t i) {
    for (int b = 0; b < 2; ++b)
      std::memcpy(code_logits.data<float>() + (i * 2 + b) * kNumSemanticCodes, lg.data() + b * kSampleableColumns + 1,
                  sizeof(float) * kNumSemanticCodes);
  };
  lm.sampleable_logits(pool, prefill.data<float>() + (n - 1) * H, 2, n * H, lg.data(), prec);
  put(0);
  for (int64_t i = 0; i < steps; ++i) {
    lm.forward(pool, fb.data() + i * 2 * H, 2, 1, cache, scr, h.data(), false, prec);
    for (int b = 0; b < 2; ++b)
      std::memcpy(decode.data<float>() + (b * steps + i) * H, h.data() + b * H, sizeof(float) * H);
    lm.sampleable_logits(pool, h.data(), 2, H, lg.data(), prec);
    put(i + 1);
  }
  rows.push_back(tensor_row(name, "prefill_hidden", prefill, f.get("prefill_hidden")));
  rows.push_back(tensor_row(name, "decode_hidden", decode, f.get("decode_hidden")));
  rows.push_back(tensor_row(name, "code_logits", code_logits, f.get("code_logits"), kNumSemanticCodes));
}

void depth_case(const std::string& name, const SafetensorsFile& f, const Models& m, const ThreadPool& pool,
                std::vector<QuantQualityRow>& rows) {
  const DType prec = DType::BF16;
  const RvqDepth& depth = *m.depth;
  const int64_t H = depth.hidden();
  const int nb = depth.codebooks();
  const std::vector<float> h = f.get("last_hidden").to_f32_vector();
  const std::vector<int64_t> forced = f.get("forced_codes").to_i64_vector();
  std::vector<int64_t> codes(static_cast<size_t>(nb));
  codes[0] = f.get("c0").to_i64_vector().at(0);
  DepthState st = depth.make_state(2, prec);
  Tensor dh = Tensor::empty(DType::F32, {1, int64_t(nb - 1) * H});
  Tensor gl = Tensor::empty(DType::F32, {nb - 1, depth.audio_vocab()});
  auto choose = [&](int j, const float* g, int64_t nc) -> int64_t {
    std::memcpy(gl.data<float>() + int64_t(j - 1) * nc, g, sizeof(float) * size_t(nc));
    return forced.at(size_t(j - 1));
  };
  depth.decode_frame(pool, m.lm->embed_table(), h.data(), 1.5f, st, choose, codes.data(), dh.data<float>(), prec);
  Tensor fe = Tensor::empty(DType::F32, {2, 1, H});
  std::vector<float> scratch(size_t(2 * H));
  frame_feedback_embedding(m.lm->embed_table(), depth, codes.data(), fe.data<float>(), scratch.data(), prec);
  std::memcpy(fe.data<float>() + H, fe.data<float>(), sizeof(float) * H);
  rows.push_back(tensor_row(name, "depth_hidden", dh, f.get("depth_hidden")));
  rows.push_back(tensor_row(name, "guided_logits", gl, f.get("guided_logits"), depth.audio_vocab()));
  rows.push_back(tensor_row(name, "feedback_embed", fe, f.get("feedback_embed")));
}

void e2e_case(const std::string& name, const json& meta, const SafetensorsFile& f, const Models& m,
              const ThreadPool& pool, std::vector<QuantQualityRow>& rows) {
  const ArModels am{m.lm.get(), m.depth.get()};
  const int nb = m.depth->codebooks();
  const int64_t H = m.lm->hidden();
  const Tensor ids = f.get("text_ids");
  const int64_t n = ids.dim(1);
  const std::vector<int64_t> idv = ids.to_i64_vector();
  const std::vector<int64_t> cond(idv.begin(), idv.begin() + n), unc(idv.begin() + n, idv.end());
  const Tensor gcodes = f.get("codes");
  ArParams p;
  p.seed = meta.at("seed").get<uint64_t>();
  p.max_frames = frame_budget(meta.at("audio_duration").get<double>());
  p.cfg = 1.5;
  p.precision = DType::BF16;
  // (a) teacher-forced
  ArParams pf = p;
  pf.forced_codes = gcodes;
  pf.record_guided_steps = gcodes.dim(0);
  const ArResult fr = run_ar(am, cond, unc, pf, pool, RunControl{});
  const Tensor gfh = f.get("frame_hiddens");
  rows.push_back(tensor_row(name, "frame_hiddens(forced)", fr.frame_hiddens.view({1, fr.frames, int64_t(nb) * H}), gfh));
  const Tensor gc0 = f.get("c0_guided"), gdep = f.get("depth_guided");
  const int64_t n0 = std::min(gc0.dim(0), fr.c0_guided.dim(0)), nd = std::min(gdep.dim(0), fr.depth_guided.dim(0));
  rows.push_back(tensor_row(name, "c0_guided(forced)", fr.c0_guided.slice(0, 0, n0).contiguous(),
                            gc0.slice(0, 0, n0).contiguous(), kSampleableColumns));
  rows.push_back(tensor_row(name, "depth_guided(forced)", fr.depth_guided.slice(0, 0, nd).contiguous(),
                            gdep.slice(0, 0, nd).contiguous(), m.depth->audio_vocab()));
  // (b) free-running
  QuantQualityRow fr_row;
  fr_row.case_name = name;
  fr_row.output = "codes(free-running)";
  const std::vector<int64_t> b = gcodes.to_i64_vector();
  fr_row.steps = gcodes.dim(0);
  try {
    const ArResult r = run_ar(am, cond, unc, p, pool, RunControl{});
    const std::vector<int64_t> a = r.codes.to_i64_vector();
    const int64_t steps = std::min(r.codes.dim(0), gcodes.dim(0));
    int64_t same = 0, div_j = -1;
    for (; same < steps; ++same) {
      for (int j = 0; j < nb && div_j < 0; ++j)
        if (a[size_t(same * nb + j)] != b[size_t(same * nb + j)]) div_j = j;
      if (div_j >= 0) break;
    }
    fr_row.same_steps = same;
    if (div_j >= 0) fr_row.note = fmt::format("first divergence at step {} codebook {}", same, div_j);
    if (r.codes.dim(0) != gcodes.dim(0))
      fr_row.note += fmt::format("{}ours {} steps, golden {}", fr_row.note.empty() ? "" : "; ", r.codes.dim(0), gcodes.dim(0));
  } catch (const InvalidInput& e) {
    fr_row.same_steps = 0;
    fr_row.note = std::string("free run stopped: ") + e.what();
  }
  rows.push_back(fr_row);
}

bool selected(const std::vector<std::string>& filter, const std::string& v) {
  return filter.empty() || std::find(filter.begin(), filter.end(), v) != filter.end();
}

}  // namespace

std::vector<QuantQualityRow> run_quant_quality(const fs::path& golden_dir, const VerifyOptions& opt,
                                               kern::QuantType type, const ThreadPool& pool, std::FILE* out) {
  std::ifstream in(golden_dir / "manifest.json");
  if (!in) throw InvalidInput(fmt::format("{}: no manifest.json", golden_dir.string()));
  const json manifest = json::parse(in);
  VerifyContext ctx(golden_dir, manifest, pool);
  Models m;
  std::vector<QuantQualityRow> all;
  const char* qn = kern::quant_name(type);
  for (const json& spec : manifest.value("cases", json::array())) {
    const std::string kind = spec.value("kind", ""), name = spec.value("name", "");
    const std::string dt = spec.value("meta", json::object()).value("dtype", "");
    const bool lmk = kind == "language_model" && dt == "bf16", dk = kind == "rvq_depth_decoder" && dt == "bf16";
    const bool ek = kind == "e2e";
    if (!(lmk || dk || ek) || !selected(opt.kinds, kind) || !selected(opt.cases, name)) continue;
    std::vector<QuantQualityRow> rows;
    try {
      if (!m.lm) m.lm = Qwen3Lm::load(ctx.checkpoint(), type, &pool);
      if ((dk || ek) && !m.depth) m.depth = RvqDepth::load(ctx.checkpoint(), type, &pool);
      const SafetensorsFile f((golden_dir / spec.value("file", "")).string());
      if (lmk) lm_case(name, f, *m.lm, pool, rows);
      if (dk) depth_case(name, f, m, pool, rows);
      if (ek) e2e_case(name, spec.at("meta"), f, m, pool, rows);
    } catch (const std::exception& e) {
      std::fprintf(out, "INFO quant=%s %s %s error: %s\n", qn, name.c_str(), kind.c_str(), e.what());
      continue;
    }
    std::string line = fmt::format("INFO quant={} {} {} (informational, not gated):", qn, name, kind);
    for (const auto& r : rows) line += "\n    " + row_text(r);
    std::fprintf(out, "%s\n", line.c_str());
    std::fflush(out);
    all.insert(all.end(), rows.begin(), rows.end());
  }
  return all;
}

}  // namespace mm3::verify
