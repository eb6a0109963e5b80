// pipeline_ar_stage_test.cpp — the AR stage (issue 4; MODEL.md §2.3–2.8) end to end on tiny synthetic
// checkpoints: frame budget and refusals, the stop path (end token sampled), zero-frame refusal,
// replay with forced codes, bitwise determinism of two runs in one process, progress and cancellation;
// with the golden checkpoint, determinism and the c0 pre-mask wrong variant.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "models_ar_util.h"
#include "pipeline/ar_stage.h"

namespace mm3 {
namespace {

using artest::TinyModels;

std::vector<int64_t> prompt(int64_t n, int64_t fill) {
  std::vector<int64_t> ids(size_t(n), fill);
  ids[0] = 151644;
  ids[size_t(n - 2)] = 151645;
  ids[size_t(n - 1)] = 151669;
  return ids;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.contiguous().raw(), b.contiguous().raw(), a.nbytes()) == 0;
}

// A model whose LM hidden is +1 or −1 everywhere depending on the last input's embedding sign, with an
// lm_head whose end-token row is 100 (every other row 0): the end token dominates exactly when the
// input embedding is positive. Prompt tokens embed to `prompt_sign`; code c0 embeds to +1 when c0 is
// even. All transformer matrices are zero (the residual stream is the input), depth heads too (codes
// c1..c7 uniform).
std::unique_ptr<TinyModels> sign_model(float prompt_sign) {
  const LmConfig lc = artest::tiny_lm_config();
  const DepthConfig dc = artest::tiny_depth_config();
  const int64_t H = lc.hidden_size;
  auto lm_make = [&](const std::string& n, const Shape& s) {
    if (artest::is_norm(n)) return artest::bf16_tensor(s, artest::constant(1));
    if (n == "model.embed_tokens.weight")
      return artest::bf16_tensor(s, [H, prompt_sign](int64_t i) {
        const int64_t row = i / H;
        if (row >= kAudioCodeOffset) return ((row - kAudioCodeOffset) % 2 == 0) ? 1.f : -1.f;
        return prompt_sign;
      });
    if (n == "lm_head.weight")
      return artest::bf16_tensor(s, [H](int64_t i) { return i / H == kAudioEndToken ? 100.f : 0.f; });
    return artest::bf16_tensor(s, artest::constant(0));
  };
  auto d_make = [](const std::string& n, const Shape& s) {
    return artest::bf16_tensor(s, artest::constant(artest::is_norm(n) ? 1.f : 0.f));
  };
  return std::make_unique<TinyModels>(artest::lm_tensors(lc, lm_make), artest::depth_tensors(dc, d_make));
}

TEST(ArStage, FrameBudget) {
  EXPECT_EQ(frame_budget(60.0), 1500);
  EXPECT_EQ(frame_budget(2.4), 60);
  EXPECT_EQ(frame_budget(9.0), 225);
  EXPECT_EQ(frame_budget(4.0), 100);
  EXPECT_EQ(frame_budget(0.04), 1);
  EXPECT_EQ(frame_budget(360.0), 9000);
  EXPECT_EQ(frame_budget(1e9), 9000);
  for (double bad : {0.0, -1.0, 0.039, std::nan(""), double(INFINITY), -double(INFINITY)}) {
    try {
      frame_budget(bad);
      ADD_FAILURE() << bad;
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find("duration"), std::string::npos) << e.what();
    }
  }
}

TEST(ArStage, Refusals) {
  const ThreadPool pool(1);
  auto m = TinyModels::random(7);
  const ArModels am{m->lm.get(), m->depth.get()};
  const auto c = prompt(6, 1000), u = prompt(6, 151654);
  ArParams p;
  p.max_frames = 2;
  auto refused = [&](const std::vector<int64_t>& cc, const std::vector<int64_t>& uu, const ArParams& pp,
                     const char* needle) {
    try {
      run_ar(am, cc, uu, pp, pool, RunControl{});
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused({}, {}, p, "empty prompt");
  refused(c, prompt(7, 151654), p, "equal");
  refused(c, {1, 2, 3, 4, 5, 200000}, p, "outside");  // id past the vocabulary
  ArParams q = p;
  q.max_frames = 0;
  refused(c, u, q, "max_frames");
  q.max_frames = 9001;
  refused(c, u, q, "max_frames");
  q = p;
  q.precision = DType::F16;
  refused(c, u, q, "precision");
  q = p;
  q.cfg = std::nan("");
  refused(c, u, q, "cfg");
  q = p;
  q.forced_codes = Tensor::zeros(DType::I64, {3, 7});
  refused(c, u, q, "forced codes must be int64");
  q.forced_codes = Tensor::from_i64({1, 2, 3, 4, 5, 6, 7, 1024, 1, 2, 3, 4, 5, 6, 7, 8}, {2, 8});
  refused(c, u, q, "c7 = 1024");
  q.forced_codes = Tensor::from_i64({-1, -1, -1, -1, -1, -1, -1, -1, 1, 2, 3, 4, 5, 6, 7, 8}, {2, 8});
  refused(c, u, q, "not the last");
  q.forced_codes = Tensor::from_i64({1, 2, 3, 4, 5, 6, 7, 8}, {1, 8});
  refused(c, u, q, "single row");
}

TEST(ArStage, ZeroFramesIsRefused) {
  const ThreadPool pool(1);
  auto m = sign_model(+1.f);  // the prompt already makes <|audio_end|> dominant: sampled at step 0
  const ArModels am{m->lm.get(), m->depth.get()};
  ArParams p;
  p.max_frames = 5;
  try {
    run_ar(am, prompt(5, 1000), prompt(5, 151654), p, pool, RunControl{});
    ADD_FAILURE() << "zero frames accepted";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("zero frames"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("step 0"), std::string::npos) << e.what();
  }
}

TEST(ArStage, StopsOnTheEndTokenAndReplays) {
  const ThreadPool pool(1);
  auto m = sign_model(-1.f);  // codes until an even c0 is fed back; then the end token wins
  const ArModels am{m->lm.get(), m->depth.get()};
  const auto c = prompt(5, 1000), u = prompt(5, 151654);
  int found = 0;
  for (uint64_t seed = 0; seed < 64 && found < 3; ++seed) {
    ArParams p;
    p.seed = seed;
    p.max_frames = 50;
    p.record_guided_steps = 100;
    ArResult r;
    try {
      r = run_ar(am, c, u, p, pool, RunControl{});
    } catch (const InvalidInput&) {
      continue;  // this seed drew an even c0 at step 0: end at step 1, zero frames
    }
    ++found;
    const std::vector<int64_t> codes = r.codes.to_i64_vector();
    const int64_t steps = r.codes.dim(0);
    ASSERT_TRUE(r.stopped_on_end) << seed;
    ASSERT_EQ(r.frames, steps - 2);  // frame 0 not emitted, last row is the end marker
    for (int j = 0; j < 8; ++j) EXPECT_EQ(codes[size_t((steps - 1) * 8 + j)], -1);
    for (int64_t f = 0; f < steps - 2; ++f) EXPECT_EQ(codes[size_t(f * 8)] % 2, 1) << "odd c0 before the stop";
    EXPECT_EQ(codes[size_t((steps - 2) * 8)] % 2, 0) << "the even c0 that made the end token dominant";
    EXPECT_EQ(r.frame_hiddens.dim(0), r.frames);
    EXPECT_EQ(r.frame_hiddens.dim(1), 8 * 16);
    EXPECT_EQ(r.c0_guided.dim(0), steps);
    EXPECT_EQ(r.depth_guided.dim(0), 7 * (steps - 1));  // no depth draws at the end step
    // Replay: the codes forced back give the same frames, hiddens and stop.
    ArParams q = p;
    q.forced_codes = r.codes;
    const ArResult rr = run_ar(am, c, u, q, pool, RunControl{});
    EXPECT_TRUE(rr.stopped_on_end);
    EXPECT_TRUE(same_bits(rr.codes, r.codes));
    EXPECT_TRUE(same_bits(rr.frame_hiddens, r.frame_hiddens));
    EXPECT_TRUE(same_bits(rr.c0_guided, r.c0_guided));
  }
  EXPECT_EQ(found, 3) << "no seed produced a stop after at least one frame";
}

TEST(ArStage, BudgetDeterminismProgressCancel) {
  const ThreadPool pool(2);
  auto m = TinyModels::random(17);
  const ArModels am{m->lm.get(), m->depth.get()};
  const auto c = prompt(9, 4242), u = prompt(9, 151654);
  ArParams p;
  p.seed = 5;
  p.max_frames = 12;
  p.record_guided_steps = 4;
  std::vector<ProgressEvent> ev;
  RunControl ctl;
  ctl.on_progress = [&](const ProgressEvent& e) { ev.push_back(e); };
  const ArResult a = run_ar(am, c, u, p, pool, ctl);
  if (a.stopped_on_end) GTEST_SKIP() << "random model sampled the end token; pick another seed";
  EXPECT_EQ(a.frames, 12);
  EXPECT_EQ(a.codes.dim(0), 13);
  EXPECT_EQ(a.frame_hiddens.dim(0), 12);
  EXPECT_EQ(a.c0_guided.dim(0), 4);
  EXPECT_EQ(a.depth_guided.dim(0), 28);
  ASSERT_EQ(ev.size(), 12u);
  for (size_t i = 0; i < ev.size(); ++i) {
    EXPECT_EQ(ev[i].stage, "ar");
    EXPECT_EQ(ev[i].done, int64_t(i + 1));
    EXPECT_EQ(ev[i].total, 12);
    EXPECT_EQ(ev[i].unit, "frames");
  }
  // Frame hiddens hold bf16 values in the reference profile.
  const std::vector<float> fh = a.frame_hiddens.to_f32_vector();
  for (float v : fh) ASSERT_EQ(v, round_bf16(v));
  // Two runs in one process: bitwise identical (fresh per-request state each time).
  const ArResult b = run_ar(am, c, u, p, pool, RunControl{});
  EXPECT_TRUE(same_bits(a.codes, b.codes));
  EXPECT_TRUE(same_bits(a.frame_hiddens, b.frame_hiddens));
  EXPECT_TRUE(same_bits(a.c0_guided, b.c0_guided));
  EXPECT_TRUE(same_bits(a.depth_guided, b.depth_guided));
  // Another seed draws other codes.
  ArParams p2 = p;
  p2.seed = 6;
  EXPECT_FALSE(same_bits(run_ar(am, c, u, p2, pool, RunControl{}).codes, a.codes));
  // Forced replay of the sampled codes reproduces the run.
  ArParams pf = p;
  pf.forced_codes = a.codes;
  EXPECT_TRUE(same_bits(run_ar(am, c, u, pf, pool, RunControl{}).frame_hiddens, a.frame_hiddens));
  // A shorter budget is a prefix of the longer run.
  ArParams p5 = p;
  p5.max_frames = 5;
  const ArResult s5 = run_ar(am, c, u, p5, pool, RunControl{});
  EXPECT_TRUE(same_bits(s5.codes, a.codes.slice(0, 0, 6)));
  EXPECT_TRUE(same_bits(s5.frame_hiddens, a.frame_hiddens.slice(0, 0, 5)));
  // Cancellation between frames.
  int n = 0;
  RunControl cc;
  cc.on_progress = [&](const ProgressEvent&) { ++n; };
  cc.should_cancel = [&] { return n >= 3; };
  EXPECT_THROW(run_ar(am, c, u, p, pool, cc), Cancelled);
  EXPECT_EQ(n, 3);
}

TEST(ArStageGolden, DeterminismAndPreMaskVariant) {
  const std::string g = artest::golden_dir();
  if (g.empty()) GTEST_SKIP() << "golden set not found at " << MM3_GOLDEN_DIR;
  const ThreadPool pool(2);
  const Checkpoint ck(g + "/checkpoint");
  auto lm = Qwen3Lm::load(ck);
  auto depth = RvqDepth::load(ck);
  const ArModels am{lm.get(), depth.get()};
  SafetensorsFile st(g + "/cases/e2e_p1_s7.safetensors");
  const std::vector<int64_t> ids = st.get("text_ids").to_i64_vector();
  const int64_t n = st.get("text_ids").dim(1);
  const std::vector<int64_t> c(ids.begin(), ids.begin() + n), u(ids.begin() + n, ids.end());
  ArParams p;
  p.seed = 7;
  p.max_frames = 30;
  p.record_guided_steps = 10;
  const ArResult a = run_ar(am, c, u, p, pool, RunControl{});
  const ArResult b = run_ar(am, c, u, p, pool, RunControl{});
  EXPECT_TRUE(same_bits(a.codes, b.codes));
  EXPECT_TRUE(same_bits(a.frame_hiddens, b.frame_hiddens));
  EXPECT_TRUE(same_bits(a.c0_guided, b.c0_guided));
  // Wrong variant: c0 drawn without the cond-top-50 pre-mask (k = every column keeps them all). The
  // recorded c0 rows then lose their −inf pattern, which the golden rows have (16335 of 16385).
  ArParams pf = p;
  pf.forced_codes = st.get("codes").slice(0, 0, 31).contiguous();
  const Tensor gold = st.get("c0_guided");
  auto masked = [](const Tensor& t, int64_t row) {
    const float* r = t.data<float>() + row * kSampleableColumns;
    int64_t k = 0;
    for (int64_t i = 0; i < kSampleableColumns; ++i) k += std::isinf(r[i]);
    return k;
  };
  const ArResult ok = run_ar(am, c, u, pf, pool, RunControl{});
  pf.c0_cond_top_k = int(kSampleableColumns);
  const ArResult wrong = run_ar(am, c, u, pf, pool, RunControl{});
  for (int64_t f = 0; f < 10; ++f) {
    EXPECT_EQ(masked(ok.c0_guided, f), masked(gold, f)) << f;
    EXPECT_EQ(masked(wrong.c0_guided, f), 0) << f;
  }
}

}  // namespace
}  // namespace mm3
