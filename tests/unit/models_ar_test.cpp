// models_ar_test.cpp — the AR models (issue 4; MODEL.md §1.2, §1.3, §2.7, §2.8) on tiny synthetic
// checkpoints: KV-cached incremental LM decode equals the one-shot prefill (and a chunked prefill),
// the incremental depth decoder equals the reference's full causal recompute over 2..8 positions,
// weight binding names missing / misshapen / unused tensors, the sampleable head rows are the right
// rows of lm_head, the RoPE inv_freq quirk; with the golden set, the frame feedback embedding is
// bit-exact.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kernels/kernels.h"
#include "model/checkpoint.h"
#include "models_ar_util.h"
#include "sampling/sampler.h"

namespace mm3 {
namespace {

using artest::TinyModels;

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0, s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, std::fabs(double(a[i]) - b[i]));
    s = std::max(s, std::fabs(double(b[i])));
  }
  return s > 0 ? m / s : m;
}

std::vector<float> embed_ids(const Qwen3Lm& lm, const std::vector<int64_t>& ids) {
  std::vector<float> x(ids.size() * lm.hidden());
  lm.embed(ids.data(), int64_t(ids.size()), x.data(), lm.hidden());
  return x;
}

// [B=2, S] prompt rows: cond ids and a second row of other ids.
std::vector<int64_t> two_rows(int64_t S) {
  std::vector<int64_t> ids(size_t(2 * S));
  for (int64_t i = 0; i < S; ++i) {
    ids[size_t(i)] = (i * 7919) % 151000;
    ids[size_t(S + i)] = 151654;
  }
  ids[size_t(S)] = 151644;
  return ids;
}

void lm_prefill_vs_incremental(DType prec, int64_t S, double tol) {
  const ThreadPool pool(1);
  auto m = TinyModels::random(11);
  const Qwen3Lm& lm = *m->lm;
  const int64_t H = lm.hidden();
  const std::vector<float> x = embed_ids(lm, two_rows(S));  // [2, S, H]
  // one shot
  KvCache c1 = lm.make_cache(2, S, prec);
  LmScratch s1 = lm.make_scratch(2);
  std::vector<float> all(size_t(2 * S * H));
  lm.forward(pool, x.data(), 2, S, c1, s1, all.data(), true, prec);
  // token by token (decode steps with M = 2)
  KvCache c2 = lm.make_cache(2, S, prec);
  LmScratch s2 = lm.make_scratch(2);
  std::vector<float> inc(size_t(2 * S * H)), xi(size_t(2 * H)), h(size_t(2 * H));
  for (int64_t t = 0; t < S; ++t) {
    for (int b = 0; b < 2; ++b) std::memcpy(xi.data() + b * H, x.data() + (b * S + t) * H, sizeof(float) * H);
    lm.forward(pool, xi.data(), 2, 1, c2, s2, h.data(), false, prec);
    for (int b = 0; b < 2; ++b) std::memcpy(inc.data() + (b * S + t) * H, h.data() + b * H, sizeof(float) * H);
  }
  EXPECT_EQ(c2.length(), S);
  EXPECT_LE(max_rel(inc, all), tol) << "S=" << S << " " << dtype_name(prec);
  // last-only output equals the last row of the all-positions output
  KvCache c3 = lm.make_cache(2, S, prec);
  std::vector<float> last(size_t(2 * H));
  lm.forward(pool, x.data(), 2, S, c3, s1, last.data(), false, prec);
  for (int b = 0; b < 2; ++b)
    for (int64_t i = 0; i < H; ++i) ASSERT_EQ(last[b * H + i], all[(b * S + S - 1) * H + i]);
}

TEST(Qwen3Lm, KvIncrementalEqualsPrefillF32) { lm_prefill_vs_incremental(DType::F32, 23, 2e-5); }
// More than one prefill chunk (Qwen3Lm::kChunk = 256 tokens per row).
TEST(Qwen3Lm, KvIncrementalEqualsChunkedPrefillF32) { lm_prefill_vs_incremental(DType::F32, 300, 2e-5); }
// bf16: the GEMM (prefill) and GEMV (decode) paths may round a few values differently; bounded by a
// couple of bf16 ulps of the largest value.
TEST(Qwen3Lm, KvIncrementalEqualsPrefillBf16) { lm_prefill_vs_incremental(DType::BF16, 23, 3e-2); }

TEST(Qwen3Lm, KvCacheRefusesOverflow) {
  const ThreadPool pool(1);
  auto m = TinyModels::random(3);
  const std::vector<float> x = embed_ids(*m->lm, two_rows(4));
  KvCache c = m->lm->make_cache(2, 3, DType::F32);
  LmScratch s = m->lm->make_scratch(2);
  std::vector<float> out(2 * 16);
  EXPECT_THROW(m->lm->forward(pool, x.data(), 2, 4, c, s, out.data(), false, DType::F32), InvalidInput);
}

TEST(Qwen3Lm, SampleableLogitsAreTheEndAndCodeRows) {
  const ThreadPool pool(1);
  auto m = TinyModels::random(5);
  const int64_t H = 16;
  std::vector<float> h(2 * H);
  for (int64_t i = 0; i < 2 * H; ++i) h[i] = round_bf16(std::sin(0.37f * i));
  std::vector<float> lg(2 * kSampleableColumns);
  m->lm->sampleable_logits(pool, h.data(), 2, H, lg.data(), DType::F32);
  const Tensor head = m->lm_store->get("lm_head.weight");
  const std::vector<float> w = head.to_f32_vector();
  auto dot = [&](int b, int64_t row) {
    double s = 0;
    for (int64_t k = 0; k < H; ++k) s += double(h[b * H + k]) * w[row * H + k];
    return s;
  };
  for (int b = 0; b < 2; ++b) {
    EXPECT_NEAR(lg[b * kSampleableColumns], dot(b, kAudioEndToken), 1e-5);
    for (int64_t c : {int64_t(0), int64_t(1), int64_t(777), kNumSemanticCodes - 1})
      EXPECT_NEAR(lg[b * kSampleableColumns + 1 + c], dot(b, kAudioCodeOffset + c), 1e-5) << c;
  }
}

TEST(Qwen3Lm, RopeInvFreqIsBf16Rounded) {
  // The reference's inv_freq buffer was cast to bf16: position 1's angles are bf16(1/θ^(2i/D)).
  const int D = 128;
  const int64_t pos[2] = {1, 63};
  std::vector<float> c(2 * D), s(2 * D), kc(2 * D), ks(2 * D);
  lm_rope_tables(pos, 2, D, 1e6, c.data(), s.data(), DType::F32);
  kern::rope_tables(pos, 2, D, 1e6, kc.data(), ks.data(), DType::F32);
  int differ = 0;
  for (int i = 0; i < D / 2; ++i) {
    const float inv = round_bf16(1.0f / static_cast<float>(std::pow(1e6, double(2 * i) / D)));
    EXPECT_NEAR(s[i], std::sin(double(inv)), 1e-7) << i;
    EXPECT_EQ(c[i], c[i + D / 2]);
    differ += s[D + i] != ks[D + i];
  }
  EXPECT_GT(differ, 10);  // a different table from the plain fp32 one (the gate lm_fp32 tells which is right)
}

TEST(Qwen3Lm, BindingReportsMissingMisshapenAndUnused) {
  const LmConfig cfg = artest::tiny_lm_config();
  auto good = artest::lm_tensors(cfg, artest::random_maker(1));
  auto expect_bad = [&](artest::Named t, const std::vector<std::string>& needles) {
    artest::TempDir d;
    const std::string dir = d.sub("language_model");
    write_safetensors(dir + "/model.safetensors", t);
    const TensorStore st = TensorStore::open_dir(dir);
    try {
      Qwen3Lm lm(st, cfg);
      ADD_FAILURE() << "no error";
    } catch (const BadModel& e) {
      for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
  };
  {
    auto t = good;
    t.erase(t.begin() + 5);  // model.layers.0.self_attn.q_proj.weight ... whichever, by name below
    const std::string gone = good[5].first;
    expect_bad(t, {gone, "missing"});
  }
  {
    auto t = good;
    for (auto& [n, v] : t)
      if (n == "model.layers.1.self_attn.k_norm.weight") v = artest::bf16_tensor({9}, artest::constant(1));
    expect_bad(t, {"model.layers.1.self_attn.k_norm.weight", "[9]", "[8]"});
  }
  {
    auto t = good;
    t.emplace_back("model.layers.0.self_attn.q_proj.bias", artest::bf16_tensor({32}, artest::constant(0)));
    expect_bad(t, {"model.layers.0.self_attn.q_proj.bias", "not used"});
  }
}

// ---- depth decoder ----

void depth_incremental_vs_recompute(DType prec, double tol) {
  const ThreadPool pool(1);
  auto m = TinyModels::random(21);
  const RvqDepth& d = *m->depth;
  const int64_t H = d.hidden();
  const int nb = d.codebooks();
  // The 8 sequence entries per row (already projected): row-specific first entry, shared others.
  std::vector<float> seq(size_t(2 * nb * H));  // [2, 8, H]
  auto f = artest::rnd(99, 1.0f);
  for (int b = 0; b < 2; ++b)
    for (int p = 0; p < nb; ++p)
      for (int64_t i = 0; i < H; ++i)
        seq[size_t((b * nb + p) * H + i)] = round_bf16(f((p == 0 ? b * 1000 : 0) + p * 100 + i));
  // incremental: positions 0-1 together, then one at a time (what decode_frame does)
  DepthState st = d.make_state(2, prec);
  std::vector<std::vector<float>> inc;
  std::vector<float> y(size_t(2 * H)), in(size_t(2 * 2 * H));
  for (int b = 0; b < 2; ++b) std::memcpy(in.data() + b * 2 * H, seq.data() + b * nb * H, sizeof(float) * 2 * H);
  d.step(pool, in.data(), 2, 2, st, y.data(), prec);
  inc.push_back(y);
  for (int p = 2; p < nb; ++p) {
    for (int b = 0; b < 2; ++b) std::memcpy(in.data() + b * H, seq.data() + (b * nb + p) * H, sizeof(float) * H);
    d.step(pool, in.data(), 2, 1, st, y.data(), prec);
    inc.push_back(y);
  }
  // recompute: a fresh causal pass over positions 0..p for each p = 1..7, last position's output
  for (int p = 1; p < nb; ++p) {
    DepthState fresh = d.make_state(2, prec);
    std::vector<float> sq(size_t(2 * (p + 1) * H));
    for (int b = 0; b < 2; ++b)
      std::memcpy(sq.data() + b * (p + 1) * H, seq.data() + b * nb * H, sizeof(float) * (p + 1) * H);
    d.step(pool, sq.data(), 2, p + 1, fresh, y.data(), prec);
    EXPECT_LE(max_rel(inc[size_t(p - 1)], y), tol) << "position " << p << " " << dtype_name(prec);
  }
  // Past the 8 positions: refused.
  EXPECT_THROW(d.step(pool, in.data(), 2, 1, st, y.data(), prec), InvalidInput);
}

TEST(RvqDepth, IncrementalEqualsRecomputeF32) { depth_incremental_vs_recompute(DType::F32, 2e-6); }
TEST(RvqDepth, IncrementalEqualsRecomputeBf16) { depth_incremental_vs_recompute(DType::BF16, 3e-2); }

TEST(RvqDepth, DecodeFrameFeedsTheChosenCodes) {
  const ThreadPool pool(1);
  auto m = TinyModels::random(31);
  const RvqDepth& d = *m->depth;
  const int64_t H = 16;
  std::vector<float> h(2 * H);
  for (int64_t i = 0; i < 2 * H; ++i) h[i] = round_bf16(std::cos(0.3f * i));
  DepthState st = d.make_state(2, DType::BF16);
  int64_t codes[8] = {1234, -1, -1, -1, -1, -1, -1, -1};
  std::vector<int> seen;
  auto choose = [&](int j, const float* g, int64_t n) -> int64_t {
    seen.push_back(j);
    EXPECT_EQ(n, 1024);
    EXPECT_TRUE(std::isfinite(g[0]));
    return (j * 131) % 1024;
  };
  std::vector<float> drows(7 * H);
  d.decode_frame(pool, m->lm->embed_table(), h.data(), 1.5f, st, choose, codes, drows.data(), DType::BF16);
  EXPECT_EQ(seen, (std::vector<int>{1, 2, 3, 4, 5, 6, 7}));
  for (int j = 1; j < 8; ++j) EXPECT_EQ(codes[j], (j * 131) % 1024);
  // positions 0 (P(h)), 1 (P(E(c0))), 2..7 (P(A(c1..c6))): c7 is never fed into the depth decoder
  EXPECT_EQ(st.cache.length(), 8);
  // A chooser returning an out-of-range code is refused.
  auto bad = [](int, const float*, int64_t) -> int64_t { return 1024; };
  EXPECT_THROW(d.decode_frame(pool, m->lm->embed_table(), h.data(), 1.5f, st, bad, codes, nullptr, DType::BF16),
               InvalidInput);
}

TEST(RvqDepthGolden, FeedbackEmbeddingBitExact) {
  const std::string g = artest::golden_dir();
  if (g.empty()) GTEST_SKIP() << "golden set not found at " << MM3_GOLDEN_DIR;
  const Checkpoint ck(g + "/checkpoint");
  auto lm = Qwen3Lm::load(ck);
  auto depth = RvqDepth::load(ck);
  for (const char* name : {"depth_bf16", "depth_fp32"}) {
    const DType prec = std::string(name) == "depth_bf16" ? DType::BF16 : DType::F32;
    SafetensorsFile st(g + "/cases/" + name + ".safetensors");
    const std::vector<int64_t> fc = st.get("frame_codes").to_i64_vector();  // [2, 8]
    const std::vector<float> ref = st.get("feedback_embed").to_f32_vector();  // [2, 1, H]
    const int64_t H = lm->hidden();
    std::vector<float> out(H), scratch(2 * H);
    frame_feedback_embedding(lm->embed_table(), *depth, fc.data(), out.data(), scratch.data(), prec);
    int64_t diff = 0;
    for (int64_t i = 0; i < H; ++i) diff += out[i] != ref[i];
    EXPECT_EQ(diff, 0) << name;
    if (prec == DType::BF16) {
      // Wrong variant: adding the seven residual rows one by one in bf16 (rounding each partial sum).
      std::vector<float> acc(H), row(H), e0(H);
      const int64_t id = kAudioCodeOffset + fc[0];
      kern::embedding(lm->embed_table(), &id, 1, e0.data(), H);
      for (int j = 1; j < 8; ++j) {
        depth->residual_embedding(j, fc[j], row.data());
        for (int64_t i = 0; i < H; ++i) acc[i] = j == 1 ? row[i] : round_bf16(acc[i] + row[i]);
      }
      int64_t wrong = 0;
      for (int64_t i = 0; i < H; ++i)
        wrong += round_bf16(round_bf16(e0[i] + acc[i]) * static_cast<float>(1 / std::sqrt(8.0))) != ref[i];
      EXPECT_GT(wrong, 0) << "the sequential-bf16 variant should not match the golden";
    }
  }
}

// The fp32 gate's bound (rel_rms 1e-5) is too loose to tell the reference's bf16-rounded inv_freq from a
// plain fp32 one (that variant measures 6.3e-6 prefill / 9.95e-6 decode on lm_fp32); the bf16 one gives
// ~6e-8. This test holds the LM to 1e-6 so that variant fails here.
TEST(Qwen3LmGolden, Fp32PrefillTightBoundCatchesInvFreqVariant) {
  const std::string g = artest::golden_dir();
  if (g.empty()) GTEST_SKIP() << "golden set not found at " << MM3_GOLDEN_DIR;
  const ThreadPool pool(1);
  const Checkpoint ck(g + "/checkpoint");
  auto lm = Qwen3Lm::load(ck);
  SafetensorsFile st(g + "/cases/lm_fp32.safetensors");
  const Tensor ids = st.get("text_ids");
  const int64_t n = ids.dim(1), H = lm->hidden();
  const std::vector<float> x = embed_ids(*lm, ids.to_i64_vector());
  KvCache c = lm->make_cache(2, n + 3, DType::F32);
  LmScratch s = lm->make_scratch(2);
  std::vector<float> out(size_t(2 * n * H)), h(size_t(2 * H)), dec;
  lm->forward(pool, x.data(), 2, n, c, s, out.data(), true, DType::F32);
  const std::vector<float> fb = st.get("feedback_embeds").to_f32_vector();  // [3, 2, 1, H]
  for (int i = 0; i < 3; ++i) {
    lm->forward(pool, fb.data() + i * 2 * H, 2, 1, c, s, h.data(), false, DType::F32);
    dec.insert(dec.end(), h.begin(), h.end());  // [3, 2, H]
  }
  auto rel_rms = [](const std::vector<float>& a, const std::vector<float>& b) {
    double e = 0, r = 0;
    for (size_t i = 0; i < a.size(); ++i) e += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), r += double(b[i]) * b[i];
    return std::sqrt(e / r);
  };
  EXPECT_LT(rel_rms(out, st.get("prefill_hidden").to_f32_vector()), 1e-6);
  const std::vector<float> gd = st.get("decode_hidden").to_f32_vector();  // [2, 3, H]
  std::vector<float> gdt(gd.size());
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 3; ++i)
      std::memcpy(gdt.data() + (i * 2 + b) * H, gd.data() + (b * 3 + i) * H, sizeof(float) * H);
  EXPECT_LT(rel_rms(dec, gdt), 1e-6);
}

}  // namespace
}  // namespace mm3
