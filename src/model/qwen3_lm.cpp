// qwen3_lm.cpp — Qwen3Lm (qwen3_lm.h; MODEL.md §1.2, §2.4, §2.9). Kernels: kern::embedding, rms_norm,
// linear, linear_multi, rope_apply, attention, silu_mul, add.
// Exact torch op order: no fused multiply-add contraction (GCC contracts by default).
#pragma GCC optimize("fp-contract=off")

#include "model/qwen3_lm.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/weights.h"

namespace mm3 {

namespace {

std::vector<float> norm_weight(WeightBinder& wb, const std::string& key, int64_t dim) {
  return wb.get_f32(key, {dim}).contiguous().to_f32_vector();
}

}  // namespace

void lm_rope_tables(const int64_t* positions, int64_t n_pos, int head_dim, double theta, float* cos, float* sin,
                    DType store) {
  MM3_CHECK(head_dim > 0 && head_dim % 2 == 0, "lm_rope_tables: head_dim {}", head_dim);
  const int half = head_dim / 2;
  const float base = static_cast<float>(theta);
  float inv[512];
  MM3_CHECK(half <= 512, "lm_rope_tables: head_dim {} too large", head_dim);
  for (int i = 0; i < half; ++i) {
    // torch: 1.0 / (base ** (arange(0, dim, 2).float() / dim)) in fp32, then the buffer's bf16 cast.
    const float e = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    const float p = static_cast<float>(std::pow(static_cast<double>(base), static_cast<double>(e)));
    inv[i] = round_bf16(1.0f / p);
  }
  for (int64_t s = 0; s < n_pos; ++s) {
    const float pos = static_cast<float>(positions[s]);
    float* c = cos + s * head_dim;
    float* sn = sin + s * head_dim;
    for (int i = 0; i < half; ++i) {
      const float f = pos * inv[i];  // fp32 product (the reference's K = 1 matmul)
      const float cv = round_store(static_cast<float>(std::cos(static_cast<double>(f))), store);
      const float sv = round_store(static_cast<float>(std::sin(static_cast<double>(f))), store);
      c[i] = c[i + half] = cv;
      sn[i] = sn[i + half] = sv;
    }
  }
}

void LmScratch::reserve(const LmConfig& c, int64_t rows_, int64_t chunk_) {
  if (rows_ <= rows && chunk_ <= chunk) return;
  rows = std::max(rows, rows_);
  chunk = std::max(chunk, chunk_);
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  const int64_t QW = int64_t(c.num_attention_heads) * c.head_dim, KW = int64_t(c.num_key_value_heads) * c.head_dim;
  x.resize(rows * H);
  hn.resize(rows * H);
  q.resize(rows * QW);
  k.resize(rows * KW);
  v.resize(rows * KW);
  att.resize(rows * QW);
  o.resize(rows * H);
  gate.resize(rows * I);
  up.resize(rows * I);
  cos.resize(chunk * c.head_dim);
  sin.resize(chunk * c.head_dim);
  pos.resize(chunk);
}

namespace {
// Sidecar keys of the two sampleable head slices.
const std::string kHeadEndKey = fmt::format("lm_head.weight[{}:{}]", kAudioEndToken, kAudioEndToken + 1);
const std::string kHeadCodesKey =
    fmt::format("lm_head.weight[{}:{}]", kAudioCodeOffset, kAudioCodeOffset + kNumSemanticCodes);
const char* const kLayerLinears[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                      "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
}  // namespace

Qwen3Lm::Qwen3Lm(const TensorStore& store, const LmConfig& cfg, const QuantLoad& quant)
    : cfg_(cfg), quant_(quant.type) {
  const int64_t H = cfg.hidden_size, I = cfg.intermediate_size, D = cfg.head_dim;
  const int64_t QW = int64_t(cfg.num_attention_heads) * D, KW = int64_t(cfg.num_key_value_heads) * D;
  const int64_t V = cfg.vocab_size;
  if (H <= 0 || I <= 0 || D <= 0 || cfg.num_hidden_layers <= 0 || cfg.num_attention_heads <= 0 ||
      cfg.num_key_value_heads <= 0)
    throw BadModel(fmt::format("language_model ({}): config has a non-positive dimension", store.dir()));
  if (V < kAudioCodeOffset + kNumSemanticCodes)
    throw BadModel(fmt::format("language_model ({}): vocab_size {} does not reach the audio codes (needs at least {})",
                               store.dir(), V, kAudioCodeOffset + kNumSemanticCodes));
  if (cfg.tie_word_embeddings)
    throw BadModel(fmt::format("language_model ({}): tie_word_embeddings true is not supported (Music3's head is "
                               "separate)",
                               store.dir()));
  const std::vector<DType> wd = {DType::BF16, DType::F32};
  const QuantPlan plan = quant_plan(quant.type);
  auto lin = [&](const Tensor& w, const std::string& key, QuantType t) { return make_linear(w, key, t, quant); };
  WeightBinder wb(store, "language_model");
  embed_ = wb.get("model.embed_tokens.weight", {V, H}, wd);
  final_norm_ = norm_weight(wb, "model.norm.weight", H);
  Tensor head = wb.get("lm_head.weight", {V, H}, wd);
  layers_.resize(static_cast<size_t>(cfg.num_hidden_layers));
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    Layer& L = layers_[static_cast<size_t>(l)];
    L.input_norm = norm_weight(wb, p + "input_layernorm.weight", H);
    L.post_norm = norm_weight(wb, p + "post_attention_layernorm.weight", H);
    L.q_norm = norm_weight(wb, p + "self_attn.q_norm.weight", D);
    L.k_norm = norm_weight(wb, p + "self_attn.k_norm.weight", D);
    const Shape shapes[7] = {{QW, H}, {KW, H}, {KW, H}, {H, QW}, {I, H}, {I, H}, {H, I}};
    kern::LinearWeight* dst[7] = {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down};
    for (int i = 0; i < 7; ++i) {
      const std::string key = p + kLayerLinears[i] + ".weight";
      *dst[i] = lin(wb.get(key, shapes[i], wd), key, plan.body);
    }
  }
  wb.finish();
  // Only the sampleable rows of the head are ever computed: two zero-copy row slices.
  head_end_ = lin(head.slice(0, kAudioEndToken, kAudioEndToken + 1), kHeadEndKey, plan.heads);
  head_codes_ = lin(head.slice(0, kAudioCodeOffset, kAudioCodeOffset + kNumSemanticCodes), kHeadCodesKey, plan.heads);
}

std::vector<std::pair<std::string, const kern::LinearWeight*>> Qwen3Lm::linears() const {
  std::vector<std::pair<std::string, const kern::LinearWeight*>> out;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    const kern::LinearWeight* src[7] = {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down};
    for (int i = 0; i < 7; ++i) out.emplace_back(fmt::format("model.layers.{}.{}.weight", l, kLayerLinears[i]), src[i]);
  }
  out.emplace_back(kHeadEndKey, &head_end_);
  out.emplace_back(kHeadCodesKey, &head_codes_);
  return out;
}

double Qwen3Lm::decode_weight_bytes() const {
  double b = 0;
  for (const auto& [key, w] : linears()) b += static_cast<double>(w->weight_bytes());
  return b;
}

std::shared_ptr<const Qwen3Lm> Qwen3Lm::load(const Checkpoint& ck, QuantType quant, const ThreadPool* pool) {
  QuantLoad q{quant, pool, open_quant_sidecar(ck.dir(), "language_model", quant)};
  return std::make_shared<const Qwen3Lm>(ck.store("language_model"), ck.configs().lm, q);
}

KvCache Qwen3Lm::make_cache(int batch, int64_t capacity, DType precision) const {
  return KvCache(cfg_.num_hidden_layers, batch, capacity, cfg_.num_key_value_heads, cfg_.head_dim,
                 precision == DType::BF16 ? DType::BF16 : DType::F32);
}

LmScratch Qwen3Lm::make_scratch(int batch) const {
  LmScratch s;
  s.reserve(cfg_, int64_t(batch) * kChunk, kChunk);
  return s;
}

void Qwen3Lm::embed(const int64_t* ids, int64_t n, float* out, int64_t ldo) const {
  kern::embedding(embed_, ids, n, out, ldo);
}

void Qwen3Lm::forward(const ThreadPool& pool, const float* x, int B, int64_t S, KvCache& cache, LmScratch& scr,
                      float* out, bool all_positions, DType prec) const {
  const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size;
  const int D = cfg_.head_dim, Hq = cfg_.num_attention_heads, Hkv = cfg_.num_key_value_heads;
  const int64_t QW = int64_t(Hq) * D, KW = int64_t(Hkv) * D;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  MM3_CHECK(B >= 1 && B <= cache.batch() && S >= 1, "LM forward: B={} S={} cache batch {}", B, S, cache.batch());
  MM3_CHECK(cache.dtype() == (prec == DType::BF16 ? DType::BF16 : DType::F32), "LM forward: {} cache for {} run",
            dtype_name(cache.dtype()), dtype_name(prec));
  const int64_t p0 = cache.length();
  if (p0 + S > cache.capacity())
    throw InvalidInput(fmt::format("LM forward: positions [{}, {}) exceed the KV cache capacity {}", p0, p0 + S,
                                   cache.capacity()));
  const int64_t chunk = std::min<int64_t>(S, kChunk);
  scr.reserve(cfg_, int64_t(B) * chunk, chunk);

  for (int64_t s0 = 0; s0 < S; s0 += chunk) {
    const int64_t c = std::min(chunk, S - s0);  // tokens per row in this chunk
    const int64_t R = int64_t(B) * c;           // rows: r = b * c + i
    for (int b = 0; b < B; ++b)                 // x rows [B, c, H] <- input [B, S, H]
      std::memcpy(scr.x.data() + int64_t(b) * c * H, x + (int64_t(b) * S + s0) * H, size_t(c * H) * sizeof(float));
    for (int64_t i = 0; i < c; ++i) scr.pos[size_t(i)] = p0 + s0 + i;
    lm_rope_tables(scr.pos.data(), c, D, cfg_.rope_theta, scr.cos.data(), scr.sin.data(), prec);  // [c, D]

    for (size_t l = 0; l < layers_.size(); ++l) {
      const Layer& L = layers_[l];
      // ---- self-attention ----
      kern::rms_norm(scr.x.data(), R, H, H, L.input_norm.data(), eps, scr.hn.data(), H, prec);  // [R, H]
      // q [R, Hq*D], k and v [R, Hkv*D]: one pass over the three weights when decoding (linear_multi)
      const kern::LinearOut qkv[3] = {{&L.q, scr.q.data(), QW}, {&L.k, scr.k.data(), KW}, {&L.v, scr.v.data(), KW}};
      kern::linear_multi(pool, scr.hn.data(), R, H, qkv, prec);
      // qk-norm: RMSNorm over head_dim of each head ([R*Hq, D] rows), before RoPE.
      kern::rms_norm(scr.q.data(), R * Hq, D, D, L.q_norm.data(), eps, scr.q.data(), D, prec);
      kern::rms_norm(scr.k.data(), R * Hkv, D, D, L.k_norm.data(), eps, scr.k.data(), D, prec);
      const int li = static_cast<int>(l);
      // A decode step (one token per row) attends for all B rows in one call: row b's query is heads
      // [b·Hq, (b+1)·Hq) of one [B·Hq, D] query row, and row b's cache, which follows row b−1's in the
      // head-major KvCache, is KV heads [b·Hkv, (b+1)·Hkv). Each (row, head) is computed as a call per
      // row would compute it (same bits); one call halves the pool's dispatches and gives its threads
      // 2·Hkv items to share. Checked, not assumed: any other cache layout takes a call per row.
      const int64_t elt = static_cast<int64_t>(dtype_size(cache.dtype()));
      const auto gap = [&](const void* a, const void* z) {
        return static_cast<const char*>(z) - static_cast<const char*>(a);
      };
      const bool one_call = c == 1 && B > 1 && gap(cache.k(li, 0), cache.k(li, 1)) == Hkv * cache.head_stride() * elt &&
                            gap(cache.v(li, 0), cache.v(li, 1)) == Hkv * cache.head_stride() * elt;
      for (int b = 0; b < B; ++b) {
        float* qb = scr.q.data() + int64_t(b) * c * QW;  // [c, Hq, D]
        float* kb = scr.k.data() + int64_t(b) * c * KW;  // [c, Hkv, D]
        kern::rope_apply(qb, c, Hq, D, QW, scr.cos.data(), scr.sin.data(), D, prec);
        kern::rope_apply(kb, c, Hkv, D, KW, scr.cos.data(), scr.sin.data(), D, prec);
        cache.write(li, b, p0 + s0, c, kb, scr.v.data() + int64_t(b) * c * KW, KW);
        // [c, Hq, D] queries at positions p0+s0.. over keys [0, p0+s0+c) of this row.
        if (!one_call)
          kern::attention(pool, qb, QW, cache.k(li, b), cache.v(li, b), cache.key_stride(), cache.dtype(),
                          scr.att.data() + int64_t(b) * c * QW, QW, c, p0 + s0 + c, Hq, Hkv, D, scale,
                          /*causal=*/true, p0 + s0, prec, /*kv_span=*/p0 + S, cache.head_stride());
      }
      if (one_call)
        kern::attention(pool, scr.q.data(), B * QW, cache.k(li, 0), cache.v(li, 0), cache.key_stride(), cache.dtype(),
                        scr.att.data(), B * QW, 1, p0 + s0 + 1, B * Hq, B * Hkv, D, scale, /*causal=*/true, p0 + s0,
                        prec, /*kv_span=*/p0 + S, cache.head_stride());
      kern::linear(pool, scr.att.data(), R, QW, L.o, scr.o.data(), H, prec);  // [R, H]
      kern::add(scr.x.data(), scr.o.data(), scr.x.data(), R * H, prec);       // residual
      // ---- MLP (SwiGLU) ----
      kern::rms_norm(scr.x.data(), R, H, H, L.post_norm.data(), eps, scr.hn.data(), H, prec);
      const kern::LinearOut gate_up[2] = {{&L.gate, scr.gate.data(), I}, {&L.up, scr.up.data(), I}};  // [R, I] each
      kern::linear_multi(pool, scr.hn.data(), R, H, gate_up, prec);
      kern::silu_mul(scr.gate.data(), scr.up.data(), scr.gate.data(), R * I, prec);
      kern::linear(pool, scr.gate.data(), R, I, L.down, scr.o.data(), H, prec);   // [R, H]
      kern::add(scr.x.data(), scr.o.data(), scr.x.data(), R * H, prec);
    }
    // ---- final norm ----
    if (all_positions) {
      for (int b = 0; b < B; ++b)
        kern::rms_norm(scr.x.data() + int64_t(b) * c * H, c, H, H, final_norm_.data(), eps,
                       out + (int64_t(b) * S + s0) * H, H, prec);
    } else if (s0 + c == S) {
      for (int b = 0; b < B; ++b)  // last position of each row -> out [B, H]
        kern::rms_norm(scr.x.data() + (int64_t(b) * c + c - 1) * H, 1, H, H, final_norm_.data(), eps,
                       out + int64_t(b) * H, H, prec);
    }
  }
  cache.set_length(p0 + S);
}

void Qwen3Lm::sampleable_logits(const ThreadPool& pool, const float* h, int64_t B, int64_t ldh, float* out,
                                DType prec) const {
  kern::linear(pool, h, B, ldh, head_end_, out, kSampleableColumns, prec);        // column 0
  kern::linear(pool, h, B, ldh, head_codes_, out + 1, kSampleableColumns, prec);  // columns 1..16384
}

}  // namespace mm3
