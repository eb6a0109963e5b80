// rvq_depth.cpp — RvqDepth and frame_feedback_embedding (rvq_depth.h; MODEL.md §1.3, §2.7, §2.8).
// Kernels: kern::linear, linear_multi, rms_norm, attention, silu_mul, add, embedding.
// Exact torch op order: no fused multiply-add contraction (GCC contracts by default).
#pragma GCC optimize("fp-contract=off")

#include "model/rvq_depth.h"

#include <cmath>
#include <cstring>

#include "model/qwen3_lm.h"
#include "model/weights.h"
#include "sampling/sampler.h"

namespace mm3 {

namespace {
std::vector<float> norm_weight(WeightBinder& wb, const std::string& key, int64_t dim) {
  return wb.get_f32(key, {dim}).contiguous().to_f32_vector();
}
}  // namespace

namespace {
const char* const kDepthLinears[7] = {"attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out",
                                      "gate_proj", "up_proj",   "down_proj"};
}  // namespace

RvqDepth::RvqDepth(const TensorStore& store, const DepthConfig& cfg, const QuantLoad& quant)
    : cfg_(cfg), quant_(quant.type) {
  const int64_t H = cfg.hidden_size, I = cfg.intermediate_size, A = cfg.audio_vocab_size;
  const int nb = cfg.num_codebooks;
  if (H <= 0 || I <= 0 || cfg.num_layers <= 0 || cfg.num_attention_heads <= 0 || nb < 2 || A <= 0)
    throw BadModel(fmt::format("rvq_depth_decoder ({}): config has a non-positive dimension", store.dir()));
  const std::vector<DType> wd = {DType::BF16, DType::F32};
  const QuantPlan plan = quant_plan(quant.type);
  auto lin = [&](const Tensor& w, const std::string& key, QuantType t) { return make_linear(w, key, t, quant); };
  WeightBinder wb(store, "rvq_depth_decoder");
  audio_embeddings_ = wb.get("audio_embeddings.weight", {int64_t(nb - 1) * A, H}, wd);
  pos_embedding_ = wb.get("pos_embedding.weight", {cfg.max_position_embeddings, H}, wd);
  projection_ = lin(wb.get("projection.weight", {H, H}, wd), "projection.weight", plan.body);
  final_norm_ = norm_weight(wb, "norm.weight", H);
  for (int j = 0; j < nb - 1; ++j) {
    const std::string key = fmt::format("audio_heads.{}.weight", j);
    heads_.push_back(lin(wb.get(key, {A, H}, wd), key, plan.heads));
  }
  layers_.resize(static_cast<size_t>(cfg.num_layers));
  for (int l = 0; l < cfg.num_layers; ++l) {
    const std::string p = fmt::format("layers.{}.", l);
    Layer& L = layers_[static_cast<size_t>(l)];
    L.input_norm = norm_weight(wb, p + "input_layernorm.weight", H);
    L.post_norm = norm_weight(wb, p + "post_attention_layernorm.weight", H);
    const Shape shapes[7] = {{H, H}, {H, H}, {H, H}, {H, H}, {I, H}, {I, H}, {H, I}};
    kern::LinearWeight* dst[7] = {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down};
    for (int i = 0; i < 7; ++i) {
      const std::string key = p + kDepthLinears[i] + ".weight";
      *dst[i] = lin(wb.get(key, shapes[i], wd), key, plan.body);
    }
  }
  wb.finish();
  pos_f32_ = pos_embedding_.contiguous().to_f32_vector();
}

std::shared_ptr<const RvqDepth> RvqDepth::load(const Checkpoint& ck, QuantType quant, const ThreadPool* pool) {
  QuantLoad q{quant, pool, open_quant_sidecar(ck.dir(), "rvq_depth_decoder", quant)};
  return std::make_shared<const RvqDepth>(ck.store("rvq_depth_decoder"), ck.configs().depth, q);
}

std::vector<std::pair<std::string, const kern::LinearWeight*>> RvqDepth::linears() const {
  std::vector<std::pair<std::string, const kern::LinearWeight*>> out;
  out.emplace_back("projection.weight", &projection_);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    const kern::LinearWeight* src[7] = {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down};
    for (int i = 0; i < 7; ++i) out.emplace_back(fmt::format("layers.{}.{}.weight", l, kDepthLinears[i]), src[i]);
  }
  for (size_t j = 0; j < heads_.size(); ++j) out.emplace_back(fmt::format("audio_heads.{}.weight", j), &heads_[j]);
  return out;
}

double RvqDepth::step_weight_bytes() const {
  double b = static_cast<double>(projection_.weight_bytes());
  for (const Layer& L : layers_)
    for (const kern::LinearWeight* w : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down})
      b += static_cast<double>(w->weight_bytes());
  return b;
}

double RvqDepth::heads_weight_bytes() const {
  double b = 0;
  for (const auto& h : heads_) b += static_cast<double>(h.weight_bytes());
  return b;
}

DepthState RvqDepth::make_state(int batch, DType prec) const {
  DepthState st;
  const int nb = cfg_.num_codebooks;
  st.cache = KvCache(cfg_.num_layers, batch, nb, cfg_.num_attention_heads, cfg_.head_dim(),
                     prec == DType::BF16 ? DType::BF16 : DType::F32);
  const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size;
  st.rows = int64_t(batch) * nb;
  for (auto* b : {&st.x, &st.hn, &st.q, &st.k, &st.v, &st.att, &st.o}) b->resize(st.rows * H);
  st.gate.resize(st.rows * I);
  st.up.resize(st.rows * I);
  st.pin.resize(size_t(batch) * 2 * H);
  st.seq.resize(size_t(batch) * 2 * H);
  st.y.resize(size_t(batch) * H);
  st.emb.resize(size_t(H));
  st.logits.resize(size_t(batch * cfg_.audio_vocab_size));
  st.guided.resize(size_t(cfg_.audio_vocab_size));
  return st;
}

void RvqDepth::project(const ThreadPool& pool, const float* x, int64_t M, float* out, DType prec) const {
  kern::linear(pool, x, M, cfg_.hidden_size, projection_, out, cfg_.hidden_size, prec);
}

void RvqDepth::residual_embedding(int j, int64_t code, float* out) const {
  if (j < 1 || j >= cfg_.num_codebooks)
    throw InvalidInput(fmt::format("residual codebook {} outside 1..{}", j, cfg_.num_codebooks - 1));
  if (code < 0 || code >= cfg_.audio_vocab_size)
    throw InvalidInput(fmt::format("code {} of codebook {} outside [0, {})", code, j, cfg_.audio_vocab_size));
  const int64_t id = int64_t(j - 1) * cfg_.audio_vocab_size + code;
  kern::embedding(audio_embeddings_, &id, 1, out, cfg_.hidden_size);
}

void RvqDepth::step(const ThreadPool& pool, const float* seq, int B, int64_t S, DepthState& st, float* y,
                    DType prec) const {
  const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size;
  const int Hn = cfg_.num_attention_heads, D = cfg_.head_dim();
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  KvCache& cache = st.cache;
  const int64_t p0 = cache.length();
  MM3_CHECK(B >= 1 && B <= cache.batch() && S >= 1 && int64_t(B) * S <= st.rows, "depth step: B={} S={} rows={}", B,
            S, st.rows);
  MM3_CHECK(cache.dtype() == (prec == DType::BF16 ? DType::BF16 : DType::F32), "depth step: {} cache for {} run",
            dtype_name(cache.dtype()), dtype_name(prec));
  if (p0 + S > cache.capacity() || p0 + S > cfg_.max_position_embeddings)
    throw InvalidInput(fmt::format("depth decoder: positions [{}, {}) exceed its {} positions", p0, p0 + S,
                                   std::min<int64_t>(cache.capacity(), cfg_.max_position_embeddings)));
  const int64_t R = int64_t(B) * S;  // rows r = b * S + i
  // x = seq + pos_embedding[p0 + i]  ([R, H], one rounded add)
  for (int b = 0; b < B; ++b)
    for (int64_t i = 0; i < S; ++i) {
      const int64_t r = int64_t(b) * S + i;
      kern::add(seq + r * H, pos_f32_.data() + (p0 + i) * H, st.x.data() + r * H, H, prec);
    }
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    const int li = static_cast<int>(l);
    kern::rms_norm(st.x.data(), R, H, H, L.input_norm.data(), eps, st.hn.data(), H, prec);  // [R, H]
    // q, k, v [R, Hn*D] each: one pass over the three weights when decoding (linear_multi)
    const kern::LinearOut qkv[3] = {{&L.q, st.q.data(), H}, {&L.k, st.k.data(), H}, {&L.v, st.v.data(), H}};
    kern::linear_multi(pool, st.hn.data(), R, H, qkv, prec);
    for (int b = 0; b < B; ++b) {
      const int64_t r0 = int64_t(b) * S;
      cache.write(li, b, p0, S, st.k.data() + r0 * H, st.v.data() + r0 * H, H);
      kern::attention(pool, st.q.data() + r0 * H, H, cache.k(li, b), cache.v(li, b), cache.key_stride(), cache.dtype(),
                      st.att.data() + r0 * H, H, S, p0 + S, Hn, Hn, D, scale, /*causal=*/true, p0, prec, /*kv_span=*/0,
                      cache.head_stride());
    }
    kern::linear(pool, st.att.data(), R, H, L.o, st.o.data(), H, prec);  // [R, H]
    kern::add(st.x.data(), st.o.data(), st.x.data(), R * H, prec);
    kern::rms_norm(st.x.data(), R, H, H, L.post_norm.data(), eps, st.hn.data(), H, prec);
    const kern::LinearOut gate_up[2] = {{&L.gate, st.gate.data(), I}, {&L.up, st.up.data(), I}};  // [R, I] each
    kern::linear_multi(pool, st.hn.data(), R, H, gate_up, prec);
    kern::silu_mul(st.gate.data(), st.up.data(), st.gate.data(), R * I, prec);
    kern::linear(pool, st.gate.data(), R, I, L.down, st.o.data(), H, prec);  // [R, H]
    kern::add(st.x.data(), st.o.data(), st.x.data(), R * H, prec);
  }
  for (int b = 0; b < B; ++b)  // final norm of the last new position -> y [B, H]
    kern::rms_norm(st.x.data() + (int64_t(b) * S + S - 1) * H, 1, H, H, final_norm_.data(), eps, y + int64_t(b) * H, H,
                   prec);
  cache.set_length(p0 + S);
}

void RvqDepth::head_logits(const ThreadPool& pool, int j, const float* y, int64_t B, float* logits,
                           DType prec) const {
  if (j < 1 || j >= cfg_.num_codebooks) throw InternalError(fmt::format("depth head {} out of range", j));
  kern::linear(pool, y, B, cfg_.hidden_size, heads_[static_cast<size_t>(j - 1)], logits, cfg_.audio_vocab_size, prec);
}

void RvqDepth::decode_frame(const ThreadPool& pool, const Tensor& lm_embed, const float* h, float cfg, DepthState& st,
                            const DepthCodeChooser& choose, int64_t* codes, float* d_rows, DType prec) const {
  const int64_t H = cfg_.hidden_size, AV = cfg_.audio_vocab_size;
  const int nb = cfg_.num_codebooks;
  if (codes[0] < 0 || codes[0] >= kNumSemanticCodes)
    throw InvalidInput(fmt::format("c0 = {} outside [0, {})", codes[0], kNumSemanticCodes));
  st.reset();
  const int64_t id0 = kAudioCodeOffset + codes[0];
  for (int b = 0; b < 2; ++b) {  // pin [2, 2, H] = [[h_b, E_LM(c0 + 151675)]]
    std::memcpy(st.pin.data() + (2 * b) * H, h + b * H, sizeof(float) * size_t(H));
    kern::embedding(lm_embed, &id0, 1, st.pin.data() + (2 * b + 1) * H, H);
  }
  project(pool, st.pin.data(), 4, st.seq.data(), prec);       // [4, H]: one pass of the projection
  step(pool, st.seq.data(), 2, 2, st, st.y.data(), prec);     // positions 0, 1 -> y [2, H]
  for (int j = 1; j < nb; ++j) {
    if (j > 1) {  // append P(A(c_{j-1} + (j−2)·1024)) at position j, the same row for both
      residual_embedding(j - 1, codes[j - 1], st.emb.data());
      std::memcpy(st.pin.data(), st.emb.data(), sizeof(float) * size_t(H));
      std::memcpy(st.pin.data() + H, st.emb.data(), sizeof(float) * size_t(H));
      project(pool, st.pin.data(), 2, st.seq.data(), prec);    // [2, 1, H]
      step(pool, st.seq.data(), 2, 1, st, st.y.data(), prec);  // -> y [2, H]
    }
    if (d_rows) std::memcpy(d_rows + int64_t(j - 1) * H, st.y.data(), sizeof(float) * size_t(H));
    head_logits(pool, j, st.y.data(), 2, st.logits.data(), prec);  // [2, 1024]
    cfg_combine(st.logits.data(), st.logits.data() + AV, cfg, st.guided.data(), AV);
    const int64_t c = choose(j, st.guided.data(), AV);
    if (c < 0 || c >= AV) throw InvalidInput(fmt::format("code {} of codebook {} outside [0, {})", c, j, AV));
    codes[j] = c;
  }
}

void frame_feedback_embedding(const Tensor& lm_embed, const RvqDepth& depth, const int64_t* codes, float* out,
                              float* scratch, DType prec) {
  const int64_t H = depth.hidden();
  const int nb = depth.codebooks();
  if (codes[0] < 0 || codes[0] >= kNumSemanticCodes)
    throw InvalidInput(fmt::format("c0 = {} outside [0, {})", codes[0], kNumSemanticCodes));
  const int64_t id = kAudioCodeOffset + codes[0];
  kern::embedding(lm_embed, &id, 1, out, H);  // E_LM(c0 + 151675), [H]
  // Σ_j A(c_j + (j−1)·1024): fp32 accumulation in codebook order, one rounding (torch's sum over dim).
  std::fill(scratch, scratch + H, 0.f);
  float* row = scratch + H;  // [H] one residual embedding
  for (int j = 1; j < nb; ++j) {
    depth.residual_embedding(j, codes[j], row);
    for (int64_t i = 0; i < H; ++i) scratch[i] += row[i];
  }
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(nb)));
  for (int64_t i = 0; i < H; ++i) {
    const float s7 = round_store(scratch[i], prec);
    const float e = round_store(out[i] + s7, prec);
    out[i] = round_store(e * scale, prec);
  }
}

}  // namespace mm3
