// stage_ar_quant.cpp — `mm3 bench` stages of the AR step with quantized LM + depth-decoder weights
// (issue 8; kernels/quant.h, model/quant_weights.h): ar_frame_int8, ar_frame_q4, depth_frame_int8,
// depth_frame_q4. The same work and JSON fields as ar_frame / depth_frame (stage_ar.cpp): one AR step
// of the 2 CFG rows with a 512-token prompt in the KV cache (rewound after each run), or the depth
// decoder's 7 steps alone. `bytes` are the weight bytes actually streamed: the quantized blocks +
// scales of every layer Linear (x 7 for the depth steps), of the 16385 head rows and of the 7 audio
// heads (bf16_bytes: the same weights in bf16, i.e. the bf16 stages' `bytes`). The weights come from
// the checkpoint's mm3-quant/<type> sidecar when `mm3 quantize` wrote one, else they are quantized in
// setup (quantize_s_setup).
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench_stages.h"
#include "core/errors.h"
#include "model/qwen3_lm.h"
#include "model/rvq_depth.h"
#include "sampling/sampler.h"
#include "sampling/seed.h"
#include "tokenizer/prompt.h"

namespace mm3::bench {
namespace {

constexpr int64_t kPromptTokens = 512;
constexpr DType kPrec = DType::BF16;

double bytes_with_prefix(const TensorStore& st, const std::string& prefix) {
  double b = 0;
  for (const auto& n : st.names())
    if (n.rfind(prefix, 0) == 0) b += static_cast<double>(st.info(n).end - st.info(n).begin);
  return b;
}

// The prompt rows of stage_ar.cpp (the same synthetic text row and its §2.2 unconditional row).
void prompt_rows(std::vector<int64_t>& cond, std::vector<int64_t>& uncond) {
  std::vector<int32_t> c(static_cast<size_t>(kPromptTokens));
  c[0] = music3::kImStart;
  for (int64_t i = 1; i < kPromptTokens - 2; ++i) c[size_t(i)] = static_cast<int32_t>(100 + (i * 7919) % 150000);
  c[size_t(kPromptTokens - 2)] = music3::kImEnd;
  c[size_t(kPromptTokens - 1)] = music3::kAudioStart;
  const std::vector<int32_t> u = make_uncond_ids(c);
  cond.assign(c.begin(), c.end());
  uncond.assign(u.begin(), u.end());
}

struct QuantArBench {
  QuantType quant;
  std::shared_ptr<const Qwen3Lm> lm;
  std::shared_ptr<const RvqDepth> depth;
  int64_t H = 0;
  KvCache cache;
  LmScratch scr;
  DepthState dst;
  std::unique_ptr<SeededSampler> sampler;
  std::vector<int64_t> cond_ids, uncond_ids, codes;
  std::vector<float> x_prompt, h0, h, logits, guided, fb_scratch, x1, d_rows;
  double load_s = 0, prefill_s = 0;
  bool from_sidecar = false;
  float cfg = 1.5f;

  QuantArBench(const Checkpoint& ck, const ThreadPool& pool, QuantType q, bool need_lm_cache) : quant(q) {
    const auto t0 = std::chrono::steady_clock::now();
    from_sidecar = open_quant_sidecar(ck.dir(), "rvq_depth_decoder", q) != nullptr;
    // The depth stages use the LM only for its embedding table: its bf16 form, unquantized.
    lm = Qwen3Lm::load(ck, need_lm_cache ? q : QuantType::None, &pool);
    depth = RvqDepth::load(ck, q, &pool);
    load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    H = lm->hidden();
    if (depth->hidden() != H)
      throw BadModel(fmt::format("depth decoder hidden {} != language model hidden {}", depth->hidden(), H));
    prompt_rows(cond_ids, uncond_ids);
    if (need_lm_cache) {
      cache = lm->make_cache(2, kPromptTokens + 1, kPrec);
      scr = lm->make_scratch(2);
    }
    dst = depth->make_state(2, kPrec);
    sampler = std::make_unique<SeededSampler>(ar_sampling_seed(0), kSampleableColumns, 50);
    x_prompt.resize(size_t(2 * kPromptTokens * H));
    lm->embed(cond_ids.data(), kPromptTokens, x_prompt.data(), H);
    lm->embed(uncond_ids.data(), kPromptTokens, x_prompt.data() + kPromptTokens * H, H);
    for (auto* v : {&h0, &h, &fb_scratch, &x1}) v->resize(size_t(2 * H));
    logits.resize(size_t(2 * kSampleableColumns));
    guided.resize(size_t(kSampleableColumns));
    codes.assign(size_t(depth->codebooks()), 0);
    d_rows.resize(size_t(depth->codebooks() - 1) * size_t(H));
  }

  void prefill(const ThreadPool& pool) {
    const auto t0 = std::chrono::steady_clock::now();
    cache.reset();
    lm->forward(pool, x_prompt.data(), 2, kPromptTokens, cache, scr, h0.data(), /*all_positions=*/false, kPrec);
    prefill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  void depth_frame(const ThreadPool& pool, const float* hh) {
    auto choose = [this](int j, const float* g, int64_t nc) -> int64_t {
      return sampler->sample(g, nc, static_cast<uint32_t>(j));
    };
    depth->decode_frame(pool, lm->embed_table(), hh, cfg, dst, choose, codes.data(), d_rows.data(), kPrec);
  }

  // As stage_ar.cpp's ArBench::ar_step.
  void ar_step(const ThreadPool& pool) {
    lm->sampleable_logits(pool, h0.data(), 2, H, logits.data(), kPrec);
    const float* c = logits.data();
    const float* u = logits.data() + kSampleableColumns;
    cfg_combine(c, u, cfg, guided.data(), kSampleableColumns);
    sampler->cond_top_k_mask(c, guided.data(), kSampleableColumns, 50);
    const int64_t col = sampler->sample(guided.data(), kSampleableColumns, 0);
    codes[0] = col == 0 ? 0 : col - 1;
    depth_frame(pool, h0.data());
    frame_feedback_embedding(lm->embed_table(), *depth, codes.data(), x1.data(), fb_scratch.data(), kPrec);
    std::memcpy(x1.data() + H, x1.data(), sizeof(float) * size_t(H));
    lm->forward(pool, x1.data(), 2, 1, cache, scr, h.data(), /*all_positions=*/false, kPrec);
    cache.set_length(kPromptTokens);
  }
};

// bf16 bytes of the same weights (the bf16 stages' `bytes`).
struct Bf16Bytes {
  double lm = 0, depth = 0;
};
Bf16Bytes bf16_bytes(const Checkpoint& ck, const QuantArBench& b) {
  const TensorStore& lms = ck.store("language_model");
  const TensorStore& ds = ck.store("rvq_depth_decoder");
  const double head_elt = static_cast<double>(dtype_size(lms.info("lm_head.weight").dtype));
  const double dsteps = b.depth->codebooks() - 1;
  Bf16Bytes r;
  r.lm = bytes_with_prefix(lms, "model.layers.") + bytes_with_prefix(lms, "model.norm.") +
         double(kSampleableColumns) * b.lm->hidden() * head_elt;
  r.depth = dsteps * (bytes_with_prefix(ds, "layers.") + bytes_with_prefix(ds, "projection.") +
                      bytes_with_prefix(ds, "norm.")) +
            bytes_with_prefix(ds, "audio_heads.");
  return r;
}

// Norm weights the quantized step still reads (fp32 copies; tiny, counted so `bytes` is complete).
double lm_norm_bytes(const LmConfig& c) {
  return 4.0 * (double(c.num_hidden_layers) * (2.0 * c.hidden_size + 2.0 * c.head_dim) + c.hidden_size);
}
double depth_norm_bytes(const DepthConfig& c) { return 4.0 * (double(c.num_layers) * 2.0 + 1.0) * c.hidden_size; }

Stage ar_stage(QuantType q) {
  const std::string qn = kern::quant_name(q);
  return Stage{
      .name = "ar_frame_" + qn,
      .description = "ar_frame with " + qn + " weights (layer Linears " + qn +
                     ", 16385 head rows + 7 audio heads int8; kernels/quant.h): one AR step, 2 CFG rows, "
                     "512-token prompt in the KV cache; bytes = quantized LM layer + head-row bytes + depth "
                     "weights (7 steps) + 7 heads, as streamed",
      .needs_model = true,
      .memory_floor = true,
      .setup =
          [q, qn](const BenchContext& ctx) {
            const ThreadPool& pool = ctx.pool();
            auto b = std::make_shared<QuantArBench>(ctx.checkpoint(), pool, q, true);
            b->prefill(pool);
            const Bf16Bytes bb = bf16_bytes(ctx.checkpoint(), *b);
            const LmConfig& c = b->lm->config();
            const double dsteps = b->depth->codebooks() - 1;
            const double lm_b = b->lm->decode_weight_bytes() + lm_norm_bytes(c);
            const double depth_b = dsteps * (b->depth->step_weight_bytes() + depth_norm_bytes(b->depth->config())) +
                                   b->depth->heads_weight_bytes();
            StageRun r;
            r.run = [b, &pool] { b->ar_step(pool); };
            r.bytes = lm_b + depth_b;
            r.info = {{"kv_len", kPromptTokens},
                      {"rows", 2},
                      {"precision", "bf16"},
                      {"quant", qn},
                      {"timed", "as ar_frame, with quantized weights"},
                      {"prefill_512_s_setup", b->prefill_s},
                      {"lm_weight_bytes", lm_b},
                      {"depth_weight_bytes", depth_b},
                      {"bf16_bytes", bb.lm + bb.depth},
                      {"weights_from", b->from_sidecar ? "sidecar (mm3 quantize)" : "quantized in setup"},
                      {"load_quantize_s_setup", b->load_s},
                      {"kv_bytes_read_not_counted", double(c.num_hidden_layers) * 2 * 2 * kPromptTokens *
                                                        c.num_key_value_heads * c.head_dim *
                                                        dtype_size(b->cache.dtype())}};
            return r;
          },
  };
}

Stage depth_stage(QuantType q) {
  const std::string qn = kern::quant_name(q);
  return Stage{
      .name = "depth_frame_" + qn,
      .description = "depth_frame with " + qn + " weights (projection + layer Linears " + qn +
                     ", audio heads int8): the 7 depth steps of one frame for the 2 CFG rows; bytes = "
                     "(quantized layers + projection) x 7 steps + the 7 int8 heads",
      .needs_model = true,
      .memory_floor = true,
      .setup =
          [q, qn](const BenchContext& ctx) {
            const ThreadPool& pool = ctx.pool();
            auto b = std::make_shared<QuantArBench>(ctx.checkpoint(), pool, q, false);
            std::memcpy(b->h0.data(), b->x_prompt.data() + (kPromptTokens - 1) * b->H, sizeof(float) * size_t(b->H));
            std::memcpy(b->h0.data() + b->H, b->x_prompt.data() + (2 * kPromptTokens - 1) * b->H,
                        sizeof(float) * size_t(b->H));
            const Bf16Bytes bb = bf16_bytes(ctx.checkpoint(), *b);
            const DepthConfig& dc = b->depth->config();
            const double dsteps = dc.num_codebooks - 1;
            StageRun r;
            r.run = [b, &pool] { b->depth_frame(pool, b->h0.data()); };
            r.bytes = dsteps * (b->depth->step_weight_bytes() + depth_norm_bytes(dc)) + b->depth->heads_weight_bytes();
            const double step_params =
                double(dc.num_layers) * (4.0 * dc.hidden_size * dc.hidden_size + 3.0 * dc.hidden_size * dc.intermediate_size) +
                double(dc.hidden_size) * dc.hidden_size;
            r.flops = 2.0 * step_params * 2.0 * dc.num_codebooks + dsteps * 2.0 * 2.0 * dc.audio_vocab_size * dc.hidden_size;
            r.info = {{"rows", 2},
                      {"steps", dsteps},
                      {"precision", "bf16"},
                      {"quant", qn},
                      {"flops_counts", "matmuls only (int8 dot products)"},
                      {"bf16_bytes", bb.depth},
                      {"weights_from", b->from_sidecar ? "sidecar (mm3 quantize)" : "quantized in setup"},
                      {"load_quantize_s_setup", b->load_s}};
            return r;
          },
  };
}

RegisterStage reg_ar_int8{ar_stage(QuantType::Int8)};
RegisterStage reg_ar_q4{ar_stage(QuantType::Q4)};
RegisterStage reg_depth_int8{depth_stage(QuantType::Int8)};
RegisterStage reg_depth_q4{depth_stage(QuantType::Q4)};

}  // namespace
}  // namespace mm3::bench
