// dit.cpp — flow-matching DiT forward (dit.h; MODEL.md §4.1). Kernels: linear, add, layer_norm,
// rope_tables, rope_apply, attention, silu, silu_mul, transpose_2d.
#include "model/dit.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <numbers>
#include <string>

#include "core/log.h"
#include "model/quant_weights.h"
#include "model/weights.h"

namespace mm3 {

struct DiT::Weights {
  struct Block {
    std::vector<float> ln1_w, ln1_b, ln2_w, ln2_b;  // [D]
    kern::LinearWeight q, k, v, o;                  // [D, D], no bias (q, k, v empty when qkv holds them)
    kern::LinearWeight qkv;                         // bf16 / packed fp32: [q; k; v] [3D, D] as one GEMM
    kern::LinearWeight ff_in;                       // [2F, D] + [2F]; rows [0, F) value a, [F, 2F) gate g
    kern::LinearWeight ff_out;                      // [D, F] + [D]
  };
  std::vector<float> fourier;     // [fourier/2] time_proj.weight[:, 0]
  kern::LinearWeight t1, t2;      // time_embed.linear_1 [D, fourier] + b, linear_2 [D, D] + b
  kern::LinearWeight pre;         // preprocess_conv [Cc, Cc(, 1)], no bias
  kern::LinearWeight proj_in;     // [D, Cc], no bias
  kern::LinearWeight proj_out;    // [C, D], no bias
  kern::LinearWeight post;        // postprocess_conv [C, C(, 1)], no bias
  std::vector<Block> blocks;
};

namespace {

std::vector<float> rounded(const std::vector<float>& v) {
  std::vector<float> r(v);
  round_to_store(r.data(), r.size(), DType::BF16);
  return r;
}

kern::LinearWeight to_bf16(const kern::LinearWeight& w) {
  return kern::LinearWeight(w.weight().to(DType::BF16), w.has_bias() ? w.bias().to(DType::BF16) : Tensor());
}

// [a; b; c] along the output rows, as `dt` (no biases: the DiT's q, k, v have none).
kern::LinearWeight concat_rows(std::initializer_list<const kern::LinearWeight*> parts, DType dt) {
  int64_t N = 0;
  const int64_t K = (*parts.begin())->in_features();
  for (const kern::LinearWeight* w : parts) {
    MM3_CHECK(w->in_features() == K && !w->has_bias(), "transformer: cannot stack weights [{}, {}]", w->out_features(),
              w->in_features());
    N += w->out_features();
  }
  Tensor cat = Tensor::empty(dt, {N, K});
  auto* dst = static_cast<char*>(cat.raw());
  for (const kern::LinearWeight* w : parts) {
    const Tensor part = w->weight().to(dt).contiguous();
    std::memcpy(dst, part.raw(), part.nbytes());
    dst += part.nbytes();
  }
  return kern::LinearWeight(cat);
}

template <class V>
void grow(V& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

}  // namespace

DiT::DiT(const TensorStore& store, const DitConfig& cfg) : cfg_(cfg) {
  const int64_t C = cfg.in_channels, Dc = cfg.condition_dim, D = cfg.inner_dim(), Cc = cfg.concat_channels();
  const int64_t F = cfg.ff_inner_dim, Fd = cfg.fourier_embedding_dim;
  if (C <= 0 || Dc <= 0 || cfg.num_layers <= 0 || cfg.num_attention_heads <= 0 || cfg.attention_head_dim <= 0 ||
      F <= 0 || Fd <= 0 || Fd % 2 || cfg.rotary_dim <= 0 || cfg.rotary_dim % 2 ||
      cfg.rotary_dim > cfg.attention_head_dim)
    throw BadModel(fmt::format("transformer: inconsistent config (in {}, cond {}, heads {}x{}, ff {}, rotary {}, "
                               "fourier {})",
                               C, Dc, cfg.num_attention_heads, cfg.attention_head_dim, F, cfg.rotary_dim, Fd));
  WeightBinder b(store, "transformer");
  const std::vector<DType> f32 = {DType::F32};
  auto lin = [&](const std::string& key, int64_t out, int64_t in, bool bias, bool conv = false) {
    Tensor w = conv ? b.get(key + ".weight", {out, in, 1}, f32).view({out, in}) : b.get(key + ".weight", {out, in}, f32);
    Tensor bb = bias ? b.get(key + ".bias", {out}, f32) : Tensor();
    return kern::LinearWeight(w, bb);
  };
  auto vec = [&](const std::string& key, int64_t n) { return b.get_f32(key, {n}).to_f32_vector(); };

  f32_ = std::make_unique<Weights>();
  Weights& W = *f32_;
  W.fourier = b.get_f32("time_proj.weight", {Fd / 2, 1}).to_f32_vector();
  W.t1 = lin("time_embed.linear_1", D, Fd, true);
  W.t2 = lin("time_embed.linear_2", D, D, true);
  W.pre = lin("preprocess_conv", Cc, Cc, false, true);
  W.proj_in = lin("proj_in", D, Cc, false);
  W.proj_out = lin("proj_out", C, D, false);
  W.post = lin("postprocess_conv", C, C, false, true);
  W.blocks.resize(static_cast<size_t>(cfg.num_layers));
  for (int i = 0; i < cfg.num_layers; ++i) {
    const std::string p = fmt::format("transformer_blocks.{}.", i);
    Weights::Block& bl = W.blocks[static_cast<size_t>(i)];
    bl.ln1_w = vec(p + "norm1.weight", D);
    bl.ln1_b = vec(p + "norm1.bias", D);
    bl.ln2_w = vec(p + "norm2.weight", D);
    bl.ln2_b = vec(p + "norm2.bias", D);
    bl.q = lin(p + "attn.to_q", D, D, false);
    bl.k = lin(p + "attn.to_k", D, D, false);
    bl.v = lin(p + "attn.to_v", D, D, false);
    bl.o = lin(p + "attn.to_out.0", D, D, false);
    bl.ff_in = lin(p + "ff_in", 2 * F, D, true);
    bl.ff_out = lin(p + "ff_out", D, F, true);
  }
  b.finish();
}

DiT::~DiT() = default;

bool DiT::fp32_strassen_requested() {
  const char* e = std::getenv("MM3_STRASSEN");
  return e && std::string(e) == "1";
}

bool DiT::fp32_strassen() const {
  std::lock_guard<std::mutex> lock(weights_mu_);
  return strassen_used_;
}

const char* dit_gemm_name(DitGemm g) { return g == DitGemm::Int8 ? "int8" : "exact"; }

bool DiT::int8_active() const {
  std::lock_guard<std::mutex> lock(weights_mu_);
  return int8_active_;
}

const DiT::Weights& DiT::int8_weights(const ThreadPool& pool) const {
  std::lock_guard<std::mutex> lock(weights_mu_);
  if (int8_) return *int8_;
  const auto t0 = std::chrono::steady_clock::now();
  auto w = std::make_unique<Weights>(*f32_);
  double gb = 0;
  bool all_i8 = true;
  // The small GEMMs at the ends (pre / proj_in / proj_out / post: ~0.1% of the FLOPs, the model's
  // input and output) stay fp32, packed; the time MLP (a GEMV) keeps its views.
  auto pack_f32 = [&](kern::LinearWeight& lw) {
    const Tensor src = lw.weight();
    populate_mapped_pages(src, &pool);
    lw = kern::gemm_only_f32(lw, pool);
    gb += lw.weight_bytes() / 1e9;
    release_mapped_pages(src);
  };
  // Every block GEMM on one level of 127 after the Hadamard rotation (kernels.h I8Options::rotate; K =
  // 2048 and 8192 are powers of two). ff_out reads the GLU output, heavy-tailed (max/rms ~12 over
  // F = 8192 against ~4 for the normed rows): without the rotation one level of it was most of the
  // profile's error, and it went on two levels (twice its GEMM work). Rotated, its rows quantize like
  // Gaussian ones. Random full model, batch-1 forward, rel RMS vs fp32 (twenty-second session): two
  // levels unrotated 0.060 at 3.63-3.92 s; rotated, one level 0.074 at 3.23-3.50 s. The synthetic
  // weights are bounded (Irwin-Hall), which the rotation makes Gaussian, so that 0.074 is its worst case:
  // with Gaussian weights the rotation is neutral, with heavy-tailed ones it halves the weights' error, and
  // with outlier channels in x (common in trained transformers) one level unrotated is off by 5-9% a
  // product where rotated it stays ~1.1% (README, Compute profiles). A width that is not a power of two
  // (no such checkpoint is known) cannot be rotated: ff_out then keeps its two levels.
  auto pack_i8 = [&](kern::LinearWeight& lw, bool heavy_tailed, bool glu = false) {
    const Tensor src = lw.weight();
    populate_mapped_pages(src, &pool);
    const bool rot = kern::rotation_applies(lw.in_features());
    kern::LinearWeight q =
        kern::gemm_only_i8(lw, pool, {.x_two_level = heavy_tailed && !rot, .rotate = rot, .glu_pairs = glu});
    if (q.out_features() == 0) {
      all_i8 = false;
      q = kern::gemm_only_f32(lw, pool);
    }
    lw = std::move(q);
    gb += lw.weight_bytes() / 1e9;
    release_mapped_pages(src);
  };
  for (auto* lw : {&w->pre, &w->proj_in, &w->proj_out, &w->post}) pack_f32(*lw);
  for (auto& bl : w->blocks) {
    for (auto* lw : {&bl.q, &bl.k, &bl.v}) populate_mapped_pages(lw->weight(), &pool);
    bl.qkv = concat_rows({&bl.q, &bl.k, &bl.v}, DType::F32);  // per-row scales: the same as three weights
    for (auto* lw : {&bl.q, &bl.k, &bl.v}) {
      release_mapped_pages(lw->weight());
      *lw = kern::LinearWeight();
    }
    for (auto* lw : {&bl.qkv, &bl.o}) pack_i8(*lw, false);
    pack_i8(bl.ff_in, false, /*glu=*/true);
    pack_i8(bl.ff_out, true);
  }
  int8_ = std::move(w);
  int8_active_ = all_i8;
  if (all_i8)
    MM3_LOG_INFO("transformer: int8 block GEMM weights ({:.1f} GB with the fp32 ends) prepared in {:.1f} s (GEMM: {})",
                 gb, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                 kern::i8_gemm_engine());
  else
    MM3_LOG_WARN(
        "transformer: this CPU has no exact int8 GEMM (it needs AVX2 and FMA, or VNNI for oneDNN's; "
        "MM3_ISA=scalar removes ours): the int8 profile runs its GEMMs in fp32");
  return *int8_;
}

const DiT::Weights& DiT::weights(DType compute, const ThreadPool& pool) const {
  if (compute != DType::F32 && compute != DType::BF16)
    throw InvalidInput(fmt::format("transformer: compute dtype must be F32 or BF16, not {}", dtype_name(compute)));
  std::lock_guard<std::mutex> lock(weights_mu_);
  if (compute == DType::F32) {
    // gemm_nt re-packs a plain weight from its rows at every call, and from 4 KiB file pages that
    // packing stalled on its loads (Zen 5: 12-15% of the forward's samples; software prefetches of
    // the next K block did not move it). So the first fp32 forward packs every GEMM weight once, into
    // huge-page memory (gemm_only_f32: the same bits), and drops the mapped pages. The time MLP (M =
    // batch, a GEMV) keeps its views. Lazy, so that the bf16 profile never holds both; MM3_MMAP_WEIGHTS=1
    // keeps the views for everything.
    if (weights_stay_mapped()) return *f32_;
    if (!f32_packed_) {
      const auto t0 = std::chrono::steady_clock::now();
      auto w = std::make_unique<Weights>(*f32_);
      double gb = 0;
      const bool strassen = fp32_strassen_requested();
      auto pack = [&](kern::LinearWeight& lw, bool s = false) {
        const Tensor src = lw.weight();
        populate_mapped_pages(src, &pool);
        lw = s ? kern::gemm_strassen_f32(lw, pool) : kern::gemm_only_f32(lw, pool);
        gb += lw.weight_bytes() / 1e9;
        release_mapped_pages(src);
      };
      for (auto* lw : {&w->pre, &w->proj_in, &w->proj_out, &w->post}) pack(*lw);
      for (auto& bl : w->blocks) {
        // q | k | v as one [3D, D] GEMM, as in the bf16 profile (one pass over the normed rows, and a
        // dense [tokens, 3D] output, which oneDNN's brgemm needs); gemm_nt's panels give each output the
        // same FMA chain either way.
        for (auto* lw : {&bl.q, &bl.k, &bl.v}) populate_mapped_pages(lw->weight(), &pool);
        bl.qkv = concat_rows({&bl.q, &bl.k, &bl.v}, DType::F32);
        for (auto* lw : {&bl.q, &bl.k, &bl.v}) {
          release_mapped_pages(lw->weight());
          *lw = kern::LinearWeight();
        }
        for (auto* lw : {&bl.qkv, &bl.o}) pack(*lw);
        for (auto* lw : {&bl.ff_in, &bl.ff_out}) pack(*lw, strassen);
      }
      f32_packed_ = std::move(w);
      strassen_used_ = strassen;
      MM3_LOG_INFO("transformer: fp32 GEMM weights ({:.1f} GB{}) packed in {:.1f} s", gb,
                   strassen ? ", FF weights as Strassen's 7 blocks" : "",
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return *f32_packed_;
  }
  if (!bf16_) {
    auto w = std::make_unique<Weights>();
    const Weights& s = *f32_;
    w->fourier = rounded(s.fourier);
    // Weights only ever multiplied as GEMMs (rows = tokens) are held in the backend's blocked bf16
    // form (kernels.h gemm_only_bf16: oneDNN); the time MLP runs with M = batch, a GEMV.
    // The fp32 sources are faulted in before each conversion and their mapped pages dropped after it
    // (as the fp32 packing does): they are read once here, and an fp32 forward would read the files again.
    auto packed = [&](const kern::LinearWeight& lw) {
      populate_mapped_pages(lw.weight(), &pool);
      kern::LinearWeight r = kern::gemm_only_bf16(lw);
      release_mapped_pages(lw.weight());
      return r;
    };
    w->t1 = to_bf16(s.t1);
    w->t2 = to_bf16(s.t2);
    w->pre = packed(s.pre);
    w->proj_in = packed(s.proj_in);
    w->proj_out = packed(s.proj_out);
    w->post = packed(s.post);
    for (const auto& sb : s.blocks) {
      Weights::Block bl;
      bl.ln1_w = rounded(sb.ln1_w);
      bl.ln1_b = rounded(sb.ln1_b);
      bl.ln2_w = rounded(sb.ln2_w);
      bl.ln2_b = rounded(sb.ln2_b);
      // One GEMM for q | k | v (N = 3D): it reads the normed rows once, and its output rows are already
      // the [q | k | v] layout attention takes. Same bits as three calls (oneDNN's K order per output
      // does not depend on N; checked at the real shapes, M = 690 and 1380).
      for (const auto* lw : {&sb.q, &sb.k, &sb.v}) populate_mapped_pages(lw->weight(), &pool);
      bl.qkv = kern::gemm_only_bf16(concat_rows({&sb.q, &sb.k, &sb.v}, DType::BF16));
      for (const auto* lw : {&sb.q, &sb.k, &sb.v}) release_mapped_pages(lw->weight());
      bl.o = packed(sb.o);
      bl.ff_in = packed(sb.ff_in);
      bl.ff_out = packed(sb.ff_out);
      w->blocks.push_back(std::move(bl));
    }
    bf16_ = std::move(w);
  }
  return *bf16_;
}

void DiT::forward(const ThreadPool& pool, const std::vector<DitItem>& items, int64_t L, const std::vector<float*>& out,
                  DType compute, DitWorkspace& ws, DitGemm gemm) const {
  if (gemm == DitGemm::Int8 && compute != DType::F32)
    throw InvalidInput(
        fmt::format("transformer: the int8 GEMMs run under the fp32 compute profile, not {}", dtype_name(compute)));
  const Weights& W = gemm == DitGemm::Int8 ? int8_weights(pool) : weights(compute, pool);
  const DType st = compute;
  const int64_t B = static_cast<int64_t>(items.size());
  const int64_t C = cfg_.in_channels, Dc = cfg_.condition_dim, D = cfg_.inner_dim(), Cc = cfg_.concat_channels();
  const int64_t F = cfg_.ff_inner_dim, Fd = cfg_.fourier_embedding_dim, half = Fd / 2;
  const int H = cfg_.num_attention_heads, hd = cfg_.attention_head_dim, rot = cfg_.rotary_dim;
  const int64_t S = L + 1;  // time token + L latent tokens
  if (B < 1 || L < 1) throw InvalidInput(fmt::format("transformer: empty batch ({} items, length {})", B, L));
  if (static_cast<int64_t>(out.size()) != B) throw InternalError("transformer: one output per item required");
  for (const DitItem& it : items)
    if (!it.x) throw InternalError("transformer: item without latents");

  grow(ws.z, B * L * Cc);
  grow(ws.zp, B * L * Cc);
  grow(ws.h, B * S * D);
  // bf16 compute (below): the normed rows and the GLU live as bf16 bits (n16, act16) instead of n, act.
  const bool b16 = st == DType::BF16;
  if (b16)
    grow(ws.n16, B * S * D);
  else
    grow(ws.n, B * S * D);
  grow(ws.qkv, B * S * 3 * D);
  grow(ws.att, B * S * D);
  // the int8 profile's GEMMs add into h themselves, and its FF keeps its [B·S, 2F] and [B·S, F] floats in
  // cache (kern::linear_add, kern::ff_glu_add): no tmp, ff or act buffers
  const bool i8 = !W.blocks.empty() && W.blocks[0].ff_in.gemm_kind() == kern::GemmKind::I8;
  if (!i8) {
    grow(ws.tmp, B * S * D);
    grow(ws.ff, B * S * 2 * F);
    if (b16)
      grow(ws.act16, B * S * F);
    else
      grow(ws.act, B * S * F);
  }
  grow(ws.tf, B * Fd);
  grow(ws.t1, B * D);
  grow(ws.po, L * C);
  grow(ws.pv, L * C);
  float* h = ws.h.data();
  // The int8 profile's attention is the bf16 profile's (q, k, v and the probabilities rounded to bf16
  // for VDPBF16PS pair dots, the output rounded to bf16) where the CPU has AVX512-BF16: ~1/3 less time
  // than fp32 attention, its rounding (2^-9) far below the u8 levels o's GEMM then reads (DitGemm).
  // Elsewhere (e.g. AVX-VNNI without AVX-512) that form would only add rounding: fp32 attention.
  const DType att_st = i8 && kern::attention_bf16_dots() ? DType::BF16 : st;

  // 1-3. z[b·L + l] = [x[:, l] | 0 | cond[l, :]]                                      [B·L, Cc]
  //      z = z·Wpre^T + z (1×1 conv with residual), proj_in -> h rows b·S + 1 + l    [B·S, D]
  pool.parallel_for(B * L, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / L, l = r % L;
      float* zr = ws.z.data() + r * Cc;
      const float* x = items[static_cast<size_t>(b)].x;
      for (int64_t c = 0; c < C; ++c) zr[c] = round_store(x[c * L + l], st);
      for (int64_t c = C; c < 2 * C; ++c) zr[c] = 0.0f;
      const float* cond = items[static_cast<size_t>(b)].cond;
      if (cond)
        for (int64_t j = 0; j < Dc; ++j) zr[2 * C + j] = round_store(cond[l * Dc + j], st);
      else
        for (int64_t j = 0; j < Dc; ++j) zr[2 * C + j] = 0.0f;
    }
  });
  kern::linear(pool, ws.z.data(), B * L, Cc, W.pre, ws.zp.data(), Cc, st);
  kern::add(ws.zp.data(), ws.z.data(), ws.zp.data(), B * L * Cc, st);
  for (int64_t b = 0; b < B; ++b)
    kern::linear(pool, ws.zp.data() + b * L * Cc, L, Cc, W.proj_in, h + (b * S + 1) * D, D, st);

  // 4-5. Time embedding: a = (2π·t) ⊗ w, f = [cos a | sin a], temb = linear_2(SiLU(linear_1(f))) -> row b·S.
  const float two_pi = static_cast<float>(2.0 * std::numbers::pi);  // Python float, cast to the tensor dtype
  for (int64_t b = 0; b < B; ++b) {
    const float t = round_store(items[static_cast<size_t>(b)].t, st);
    const float tt = round_store(two_pi * t, st);
    float* f = ws.tf.data() + b * Fd;
    for (int64_t j = 0; j < half; ++j) {
      const float a = round_store(tt * W.fourier[static_cast<size_t>(j)], st);
      f[j] = round_store(std::cos(a), st);
      f[half + j] = round_store(std::sin(a), st);
    }
  }
  kern::linear(pool, ws.tf.data(), B, Fd, W.t1, ws.t1.data(), D, st);
  kern::silu(ws.t1.data(), ws.t1.data(), B * D, st);
  kern::linear(pool, ws.t1.data(), B, D, W.t2, h, S * D, st);  // row b lands at h[b·S]

  // 6. Partial RoPE tables over positions 0..S−1 (time token included), cast to the activation dtype.
  if (ws.rope_len != S || ws.rope_store != st) {
    std::vector<int64_t> pos(static_cast<size_t>(S));
    for (int64_t i = 0; i < S; ++i) pos[static_cast<size_t>(i)] = i;
    ws.cos.assign(static_cast<size_t>(S * rot), 0.0f);
    ws.sin.assign(static_cast<size_t>(S * rot), 0.0f);
    kern::rope_tables(pos.data(), S, rot, 10000.0, ws.cos.data(), ws.sin.data(), st);
    ws.rope_len = S;
    ws.rope_store = st;
  }

  // 7. Blocks.
  const int64_t R = B * S;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  float* qkv = ws.qkv.data();
  // bf16 compute: the GEMMs' inputs that a pass of ours produces (the LayerNorms, the GLU) are written
  // as bf16 bits for oneDNN to read directly, and ff_in's output is rounded by the GLU as it reads it:
  // three memory passes fewer per block (f32 -> bf16 copies, a rounding pass over [R, 2F]), same bits.
  auto norm = [&](const std::vector<float>& w, const std::vector<float>& b) {
    pool.parallel_for(R, [&](int64_t r0, int64_t r1) {
      if (b16)
        kern::layer_norm_bf16(h + r0 * D, r1 - r0, D, D, w.data(), b.data(), 1e-5f, ws.n16.data() + r0 * D, D);
      else
        kern::layer_norm(h + r0 * D, r1 - r0, D, D, w.data(), b.data(), 1e-5f, ws.n.data() + r0 * D, D, st);
    });
  };
  for (const Weights::Block& bl : W.blocks) {
    // y = x + Wo·MHA(LN1(x))
    norm(bl.ln1_w, bl.ln1_b);
    if (b16) {
      kern::linear_bf16_in(pool, ws.n16.data(), R, D, bl.qkv, qkv, 3 * D);
    } else if (bl.q.out_features() == 0) {  // the packed fp32 weights: q | k | v fused
      kern::linear(pool, ws.n.data(), R, D, bl.qkv, qkv, 3 * D, st);
    } else {
      kern::linear(pool, ws.n.data(), R, D, bl.q, qkv, 3 * D, st);
      kern::linear(pool, ws.n.data(), R, D, bl.k, qkv + D, 3 * D, st);
      kern::linear(pool, ws.n.data(), R, D, bl.v, qkv + 2 * D, 3 * D, st);
    }
    for (int64_t b = 0; b < B; ++b) {
      float* qb = qkv + b * S * 3 * D;
      kern::rope_apply(qb, S, H, hd, 3 * D, ws.cos.data(), ws.sin.data(), rot, st);
      kern::rope_apply(qb + D, S, H, hd, 3 * D, ws.cos.data(), ws.sin.data(), rot, st);
      kern::attention(pool, qb, 3 * D, qb + D, qb + 2 * D, 3 * D, DType::F32, ws.att.data() + b * S * D, D, S, S, H, H,
                      hd, scale, /*causal=*/false, 0, att_st);
    }
    if (i8) {
      kern::linear_add(pool, ws.att.data(), R, D, bl.o, h, D, st);
    } else {
      kern::linear(pool, ws.att.data(), R, D, bl.o, ws.tmp.data(), D, st);
      kern::add(h, ws.tmp.data(), h, R * D, st);
    }
    // x' = y + ff_out(a ⊙ SiLU(g)), [a | g] = ff_in(LN2(y))
    norm(bl.ln2_w, bl.ln2_b);
    if (i8) {
      // the int8 profile: ff_in's rows through the GLU and onto ff_out's integer levels while in cache,
      // ff_out's rows added to h as they are scaled (kernels.h ff_glu_add; the same bits as below)
      kern::ff_glu_add(pool, ws.n.data(), R, D, bl.ff_in, bl.ff_out, h, D, st);
      continue;
    }
    if (b16) {
      kern::linear_bf16_in(pool, ws.n16.data(), R, D, bl.ff_in, ws.ff.data(), 2 * F, /*round_y=*/false);
      pool.parallel_for(R, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const float* row = ws.ff.data() + r * 2 * F;
          kern::silu_mul_bf16(/*gate=*/row + F, /*up=*/row, ws.act16.data() + r * F, F);
        }
      });
      kern::linear_bf16_in(pool, ws.act16.data(), R, F, bl.ff_out, ws.tmp.data(), D);
    } else {
      kern::linear(pool, ws.n.data(), R, D, bl.ff_in, ws.ff.data(), 2 * F, st);
      pool.parallel_for(R, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const float* row = ws.ff.data() + r * 2 * F;
          kern::silu_mul(/*gate=*/row + F, /*up=*/row, ws.act.data() + r * F, F, st);
        }
      });
      kern::linear(pool, ws.act.data(), R, F, bl.ff_out, ws.tmp.data(), D, st);
    }
    kern::add(h, ws.tmp.data(), h, R * D, st);
  }

  // 8-9. No final norm; proj_out on tokens 1..S−1, then v = Conv1x1(v) + v, out [C, L].
  for (int64_t b = 0; b < B; ++b) {
    kern::linear(pool, h + (b * S + 1) * D, L, D, W.proj_out, ws.po.data(), C, st);  // [L, C]
    kern::linear(pool, ws.po.data(), L, C, W.post, ws.pv.data(), C, st);
    kern::add(ws.pv.data(), ws.po.data(), ws.pv.data(), L * C, st);
    kern::transpose_2d(ws.pv.data(), L, C, C, out[static_cast<size_t>(b)]);
  }
}

Tensor DiT::forward(const ThreadPool& pool, const Tensor& x, const Tensor& t, const Tensor& cond, DType compute,
                    DitGemm gemm) const {
  const int64_t C = cfg_.in_channels, Dc = cfg_.condition_dim;
  if (x.ndim() != 3 || x.dim(1) != C)
    throw InvalidInput(fmt::format("transformer: latents must be [B, {}, L], got {}", C, x.describe()));
  const int64_t B = x.dim(0), L = x.dim(2);
  if (t.numel() != B) throw InvalidInput(fmt::format("transformer: timestep must be [{}], got {}", B, t.describe()));
  if (cond.ndim() != 3 || cond.dim(0) != B || cond.dim(1) != L || cond.dim(2) != Dc)
    throw InvalidInput(fmt::format("transformer: condition must be [{}, {}, {}], got {}", B, L, Dc, cond.describe()));
  const Tensor xf = x.to(DType::F32).contiguous(), cf = cond.to(DType::F32).contiguous();
  const std::vector<float> tv = t.to_f32_vector();
  Tensor v = Tensor::empty(DType::F32, {B, C, L});
  std::vector<DitItem> items;
  std::vector<float*> outs;
  for (int64_t b = 0; b < B; ++b) {
    items.push_back({xf.data<float>() + b * C * L, tv[static_cast<size_t>(b)], cf.data<float>() + b * L * Dc});
    outs.push_back(v.data<float>() + b * C * L);
  }
  DitWorkspace ws;
  forward(pool, items, L, outs, compute, ws, gemm);
  return v;
}

}  // namespace mm3
