// stage_ar.cpp — `mm3 bench` stages that time the AR stage's parts (MODEL.md §2.4–§2.8) through the
// public model APIs (Qwen3Lm, RvqDepth, the sampler), with the [cond, uncond] CFG rows of a 512-token
// prompt in the KV cache:
//   ar_frame     one whole AR step: sampleable logits (16385 head rows) + CFG + c0 pre-mask + draw,
//                the depth decoder's 7 steps (guided, drawn), the frame feedback embedding and one LM
//                decode step (M = 2), the KV cache rewound to 512 after each run;
//   lm_step      the LM decode step of ar_frame alone (M = 2), the cache rewound after each run;
//   depth_frame  RvqDepth::decode_frame alone (7 depth steps, batch 2, guided draws);
//   prefill_512  Qwen3Lm::forward over 2 × 512 prompt tokens into an empty cache.
// The BF16 profile (the reference's) throughout. The prompt ids are a deterministic synthetic text row
// (ids in the text vocabulary) and its §2.2 unconditional row; with random weights the drawn codes
// differ from a real model's but the work per step does not depend on them.
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

// Sum of data bytes of the store's tensors whose name starts with `prefix`.
double bytes_with_prefix(const TensorStore& st, const std::string& prefix) {
  double b = 0;
  for (const auto& n : st.names())
    if (n.rfind(prefix, 0) == 0) {
      const TensorInfo& ti = st.info(n);
      b += static_cast<double>(ti.end - ti.begin);
    }
  return b;
}

// The 512-token prompt rows: <|im_start|>, synthetic text ids, <|im_end|><|audio_start|>; the uncond row
// by make_uncond_ids (§2.2).
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

// LM + depth decoder + a cache holding the prefilled prompt, and everything one AR step needs.
struct ArBench {
  std::shared_ptr<const Qwen3Lm> lm;
  std::shared_ptr<const RvqDepth> depth;
  int64_t H = 0;
  KvCache cache;
  LmScratch scr;
  DepthState dst;
  std::unique_ptr<SeededSampler> sampler;
  std::vector<int64_t> cond_ids, uncond_ids;
  std::vector<float> x_prompt;       // [2, n, H] prompt embeddings
  std::vector<float> h0;             // [2, H] LM hidden after the prefill (kept for every run)
  std::vector<float> h, logits, guided, fb_scratch, x1;
  std::vector<int64_t> codes;        // [8]
  std::vector<float> d_rows;         // [7, H]
  double prefill_s = 0;
  float cfg = 1.5f;

  ArBench(const Checkpoint& ck, const ThreadPool& pool, int64_t extra_positions) {
    lm = Qwen3Lm::load(ck);
    depth = RvqDepth::load(ck);
    H = lm->hidden();
    if (depth->hidden() != H)
      throw BadModel(fmt::format("depth decoder hidden {} != language model hidden {}", depth->hidden(), H));
    prompt_rows(cond_ids, uncond_ids);
    cache = lm->make_cache(2, kPromptTokens + extra_positions, kPrec);
    scr = lm->make_scratch(2);
    dst = depth->make_state(2, kPrec);
    sampler = std::make_unique<SeededSampler>(ar_sampling_seed(0), kSampleableColumns, 50);
    x_prompt.resize(size_t(2 * kPromptTokens * H));
    lm->embed(cond_ids.data(), kPromptTokens, x_prompt.data(), H);
    lm->embed(uncond_ids.data(), kPromptTokens, x_prompt.data() + kPromptTokens * H, H);
    h0.resize(size_t(2 * H));
    h.resize(size_t(2 * H));
    logits.resize(size_t(2 * kSampleableColumns));
    guided.resize(size_t(kSampleableColumns));
    fb_scratch.resize(size_t(2 * H));
    x1.resize(size_t(2 * H));
    codes.assign(size_t(depth->codebooks()), 0);
    d_rows.resize(size_t(depth->codebooks() - 1) * size_t(H));
    (void)pool;
  }

  void prefill(const ThreadPool& pool, float* out) {
    cache.reset();
    lm->forward(pool, x_prompt.data(), 2, kPromptTokens, cache, scr, out, /*all_positions=*/false, kPrec);
  }

  // The depth procedure of one frame with seeded guided draws (as run_ar, AR step 0).
  void depth_frame(const ThreadPool& pool, const float* hh) {
    auto choose = [this](int j, const float* g, int64_t nc) -> int64_t {
      return sampler->sample(g, nc, static_cast<uint32_t>(j));
    };
    depth->decode_frame(pool, lm->embed_table(), hh, cfg, dst, choose, codes.data(), d_rows.data(), kPrec);
  }

  // One AR step from the prefilled state: c0 draw, depth, feedback, LM decode step; then rewinds.
  void ar_step(const ThreadPool& pool) {
    lm->sampleable_logits(pool, h0.data(), 2, H, logits.data(), kPrec);
    const float* c = logits.data();
    const float* u = logits.data() + kSampleableColumns;
    cfg_combine(c, u, cfg, guided.data(), kSampleableColumns);
    sampler->cond_top_k_mask(c, guided.data(), kSampleableColumns, 50);
    int64_t col = sampler->sample(guided.data(), kSampleableColumns, 0);
    // With random weights the end token may win; feed code 0 then so the step's work is the full one.
    codes[0] = col == 0 ? 0 : col - 1;
    depth_frame(pool, h0.data());
    frame_feedback_embedding(lm->embed_table(), *depth, codes.data(), x1.data(), fb_scratch.data(), kPrec);
    std::memcpy(x1.data() + H, x1.data(), sizeof(float) * size_t(H));
    lm->forward(pool, x1.data(), 2, 1, cache, scr, h.data(), /*all_positions=*/false, kPrec);
    cache.set_length(kPromptTokens);
  }
};

struct Sizes {
  double lm_layers = 0, lm_head = 0, depth_step = 0, depth_heads = 0, kv_read = 0;
  double lm_layer_params = 0;  // matmul parameters of all LM layers (for flops)
};

Sizes sizes(const Checkpoint& ck, const ArBench& b) {
  Sizes s;
  const TensorStore& lms = ck.store("language_model");
  const TensorStore& ds = ck.store("rvq_depth_decoder");
  const LmConfig& c = b.lm->config();
  s.lm_layers = bytes_with_prefix(lms, "model.layers.") + bytes_with_prefix(lms, "model.norm.");
  const double head_elt = static_cast<double>(dtype_size(lms.info("lm_head.weight").dtype));
  s.lm_head = double(kSampleableColumns) * c.hidden_size * head_elt;
  s.depth_step = bytes_with_prefix(ds, "layers.") + bytes_with_prefix(ds, "projection.") + bytes_with_prefix(ds, "norm.");
  s.depth_heads = bytes_with_prefix(ds, "audio_heads.");
  s.kv_read = double(c.num_hidden_layers) * 2 /*rows*/ * 2 /*k,v*/ * kPromptTokens * c.num_key_value_heads *
              c.head_dim * dtype_size(b.cache.dtype());
  const double qd = double(c.num_attention_heads) * c.head_dim, kvd = double(c.num_key_value_heads) * c.head_dim;
  s.lm_layer_params = double(c.num_hidden_layers) *
                      (2.0 * c.hidden_size * qd + 2.0 * c.hidden_size * kvd + 3.0 * c.hidden_size * c.intermediate_size);
  return s;
}

RegisterStage reg_ar_frame{{
    .name = "ar_frame",
    .description = "one AR step, 2 CFG rows, 512-token prompt in the KV cache (rewound after each run): "
                   "16385-row head + CFG + c0 draw, 7 depth steps, feedback, LM decode step M=2 (BF16); "
                   "bytes = LM layer + 16385 head-row weight bytes + depth weights (7 steps) + 7 heads",
    .needs_model = true,
    .memory_floor = true,
    .setup =
        [](const BenchContext& ctx) {
          const ThreadPool& pool = ctx.pool();
          auto b = std::make_shared<ArBench>(ctx.checkpoint(), pool, 1);
          const auto t0 = std::chrono::steady_clock::now();
          b->prefill(pool, b->h0.data());
          b->prefill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          const Sizes s = sizes(ctx.checkpoint(), *b);
          StageRun r;
          r.run = [b, &pool] { b->ar_step(pool); };
          const double dsteps = b->depth->codebooks() - 1;  // 7
          r.bytes = s.lm_layers + s.lm_head + dsteps * s.depth_step + s.depth_heads;
          r.info = {{"kv_len", kPromptTokens},
                    {"rows", 2},
                    {"precision", "bf16"},
                    {"timed", "sampleable_logits + cfg_combine + cond_top_k_mask + sample, "
                              "RvqDepth::decode_frame (7 steps, seeded draws), frame_feedback_embedding, "
                              "Qwen3Lm::forward(S=1, B=2); prefill not timed"},
                    {"prefill_512_s_setup", b->prefill_s},
                    {"lm_weight_bytes", s.lm_layers + s.lm_head},
                    {"depth_weight_bytes", dsteps * s.depth_step + s.depth_heads},
                    {"kv_bytes_read_not_counted", s.kv_read}};
          return r;
        },
}};

// The LM decode step of ar_frame alone, so its distance from the weight-stream floor shows apart from
// the depth decoder's and the head's.
RegisterStage reg_lm_step{{
    .name = "lm_step",
    .description = "Qwen3Lm::forward(S=1, B=2): one LM decode step of the 2 CFG rows over a 512-token cached "
                   "prompt (rewound after each run), BF16; bytes = LM layer weights (KV reads not counted)",
    .needs_model = true,
    .memory_floor = true,
    .setup =
        [](const BenchContext& ctx) {
          const ThreadPool& pool = ctx.pool();
          auto b = std::make_shared<ArBench>(ctx.checkpoint(), pool, 1);
          b->prefill(pool, b->h0.data());
          const Sizes s = sizes(ctx.checkpoint(), *b);
          // The input rows: the prefill's last hiddens stand in for a frame embedding (same work).
          std::memcpy(b->x1.data(), b->h0.data(), sizeof(float) * b->x1.size());
          StageRun r;
          r.run = [b, &pool] {
            b->lm->forward(pool, b->x1.data(), 2, 1, b->cache, b->scr, b->h.data(), /*all_positions=*/false, kPrec);
            b->cache.set_length(kPromptTokens);
          };
          r.bytes = s.lm_layers;
          r.info = {{"kv_len", kPromptTokens},
                    {"rows", 2},
                    {"precision", "bf16"},
                    {"kv_bytes_read_not_counted", s.kv_read}};
          return r;
        },
}};

RegisterStage reg_depth_frame{{
    .name = "depth_frame",
    .description = "RvqDepth::decode_frame: the 7 depth steps of one frame for the 2 CFG rows (guided, seeded "
                   "draws; BF16); bytes = (layers + projection) x 7 steps + the 7 audio heads",
    .needs_model = true,
    .memory_floor = true,
    .setup =
        [](const BenchContext& ctx) {
          const ThreadPool& pool = ctx.pool();
          auto b = std::make_shared<ArBench>(ctx.checkpoint(), pool, 0);
          // The depth input: the prompt's last embedding rows (cond, uncond) stand in for the LM hiddens
          // (the work does not depend on the values; this saves a prefill).
          std::memcpy(b->h0.data(), b->x_prompt.data() + (kPromptTokens - 1) * b->H, sizeof(float) * size_t(b->H));
          std::memcpy(b->h0.data() + b->H, b->x_prompt.data() + (2 * kPromptTokens - 1) * b->H,
                      sizeof(float) * size_t(b->H));
          const Sizes s = sizes(ctx.checkpoint(), *b);
          StageRun r;
          r.run = [b, &pool] { b->depth_frame(pool, b->h0.data()); };
          const DepthConfig& dc = b->depth->config();
          const double dsteps = dc.num_codebooks - 1;  // 7
          r.bytes = dsteps * s.depth_step + s.depth_heads;
          const double step_params =
              double(dc.num_layers) * (4.0 * dc.hidden_size * dc.hidden_size + 3.0 * dc.hidden_size * dc.intermediate_size) +
              double(dc.hidden_size) * dc.hidden_size;
          // 2 CFG rows x positions (2 on the first step, 1 on each later one: num_codebooks in all) through
          // the layers + projection; each head once for 2 rows.
          r.flops = 2.0 * step_params * 2.0 * dc.num_codebooks + dsteps * 2.0 * 2.0 * dc.audio_vocab_size * dc.hidden_size;
          r.info = {{"rows", 2}, {"steps", dsteps}, {"precision", "bf16"}, {"flops_counts", "matmuls only"}};
          return r;
        },
}};

RegisterStage reg_prefill{{
    .name = "prefill_512",
    .description = "Qwen3Lm::forward over the 2 x 512 prompt tokens (cond, uncond) into an empty KV cache "
                   "(BF16, last-position hidden only); bytes = LM layer weight bytes (read once per 256-token "
                   "chunk: counted once)",
    .needs_model = true,
    .setup =
        [](const BenchContext& ctx) {
          const ThreadPool& pool = ctx.pool();
          auto b = std::make_shared<ArBench>(ctx.checkpoint(), pool, 0);
          const Sizes s = sizes(ctx.checkpoint(), *b);
          const LmConfig& c = b->lm->config();
          StageRun r;
          r.run = [b, &pool] { b->prefill(pool, b->h.data()); };
          r.bytes = s.lm_layers;
          const double S = double(kPromptTokens);
          // matmuls: 2 · params · tokens; causal attention: QK^T + PV ≈ 2 · S² · Hq·D per row and layer.
          r.flops = 2.0 * s.lm_layer_params * 2.0 * S +
                    2.0 * 2.0 * S * S * c.num_attention_heads * c.head_dim * c.num_hidden_layers;
          r.info = {{"tokens", 2 * kPromptTokens},
                    {"rows", 2},
                    {"precision", "bf16"},
                    {"chunk", Qwen3Lm::kChunk},
                    {"tokens_per_s", "tokens / median_s (info is fixed at setup, so not computed here)"}};
          return r;
        },
}};

}  // namespace
}  // namespace mm3::bench
