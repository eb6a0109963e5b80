// pipeline_acoustic_stage.cpp — run_acoustic (pipeline/acoustic_stage.h; MODEL.md §4.4, §4.5, §5.2) on
// the golden checkpoint: the whole stage run twice is bitwise identical (seeded noise and injected
// noise), the seeded path draws window k's noise from derive_seed(seed, "dit", k), progress is reported
// per step and per window, cancellation stops between steps, bad inputs are InvalidInput, and the
// stitched length follows §5.2. Skips loudly without ../shared.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "diffusion/noise.h"
#include "model/checkpoint.h"
#include "pipeline/acoustic_stage.h"
#include "sampling/seed.h"

namespace mm3 {
namespace {

namespace fs = std::filesystem;

fs::path golden() { return fs::path(MM3_GOLDEN_DIR); }

struct Models {
  Checkpoint ck{(golden() / "checkpoint").string()};
  ConditionEncoder cond{ck.store("condition_encoder"), ck.configs().cond};
  DiT dit{ck.store("transformer"), ck.configs().dit};
  Vocoder voc{ck.store("vocoder"), ck.configs().vocoder};
  AcousticModels m() const { return {&cond, &dit, &voc}; }
};

class AcousticStage : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(golden() / "manifest.json")) GTEST_SKIP() << "golden set not found at " << golden();
    if (!models_) models_ = std::make_unique<Models>();
  }
  static std::unique_ptr<Models> models_;
  ThreadPool pool_{2};
};
std::unique_ptr<Models> AcousticStage::models_;

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Deterministic synthetic frame hiddens [T, W].
Tensor frames(int64_t T, int64_t W) {
  Tensor t = Tensor::empty(DType::F32, {T, W});
  gaussian_noise(99, t.data<float>(), t.numel());
  return t;
}

TEST_F(AcousticStage, SeededTwiceBitwiseEqualAndUsesDerivedSeeds) {
  const auto& cc = models_->ck.configs().cond;
  const Tensor fh = frames(250, int64_t{cc.num_condition_layers} * cc.condition_hidden_dim);  // 2 windows
  AcousticParams p;
  p.steps = 2;
  p.seed = 3;
  p.decode_audio = false;
  AcousticResult a = run_acoustic(models_->m(), fh, p, pool_);
  AcousticResult b = run_acoustic(models_->m(), fh, p, pool_);
  ASSERT_EQ(a.latents.size(), 2u);
  for (size_t k = 0; k < 2; ++k) EXPECT_TRUE(same_bits(a.latents[k], b.latents[k])) << k;
  // Injecting the noise the seeded path draws gives the same result bitwise.
  const int64_t C = models_->ck.configs().dit.in_channels;
  AcousticParams q = p;
  for (int k = 0; k < 2; ++k)
    q.noise.push_back(window_noise(derive_seed(3, "dit", k), C, a.windows[static_cast<size_t>(k)].latents));
  AcousticResult c = run_acoustic(models_->m(), fh, q, pool_);
  for (size_t k = 0; k < 2; ++k) EXPECT_TRUE(same_bits(a.latents[k], c.latents[k])) << k;
  // Another seed differs.
  p.seed = 4;
  AcousticResult d = run_acoustic(models_->m(), fh, p, pool_);
  EXPECT_FALSE(same_bits(a.latents[0], d.latents[0]));
}

TEST_F(AcousticStage, AudioLengthProgressAndCancel) {
  const auto& cc = models_->ck.configs().cond;
  const Tensor fh = frames(60, int64_t{cc.num_condition_layers} * cc.condition_hidden_dim);
  AcousticParams p;
  p.steps = 3;
  int dit_events = 0, voc_events = 0;
  RunControl ctl;
  ctl.on_progress = [&](const ProgressEvent& e) {
    if (e.stage == "dit") {
      ++dit_events;
      EXPECT_EQ(e.total, 3);
      EXPECT_EQ(e.done, dit_events);
    }
    if (e.stage == "vocoder") ++voc_events;
  };
  AcousticResult r = run_acoustic(models_->m(), fh, p, pool_, ctl);
  EXPECT_EQ(dit_events, 3);
  EXPECT_EQ(voc_events, 1);
  EXPECT_EQ(r.audio.shape(), (Shape{2, stitched_samples(60)}));
  EXPECT_EQ(r.sample_rate, 44100);
  AcousticResult r2 = run_acoustic(models_->m(), fh, p, pool_);
  EXPECT_TRUE(same_bits(r.audio, r2.audio));  // NaN bits too, with the v1 checkpoint's NaN weight_g

  int steps_seen = 0;
  RunControl stop;
  stop.on_progress = [&](const ProgressEvent& e) { steps_seen += e.stage == "dit"; };
  stop.should_cancel = [&] { return steps_seen >= 2; };
  EXPECT_THROW(run_acoustic(models_->m(), fh, p, pool_, stop), Cancelled);
  EXPECT_EQ(steps_seen, 2);
}

TEST_F(AcousticStage, BadInputs) {
  const auto& cc = models_->ck.configs().cond;
  const int64_t W = int64_t{cc.num_condition_layers} * cc.condition_hidden_dim;
  AcousticParams p;
  p.steps = 1;
  p.decode_audio = false;
  EXPECT_THROW(run_acoustic(models_->m(), frames(10, W + 1), p, pool_), InvalidInput);
  EXPECT_THROW(run_acoustic(models_->m(), Tensor::zeros(DType::F32, {0, W}), p, pool_), InvalidInput);
  AcousticParams q = p;
  q.noise.push_back(Tensor::zeros(DType::F32, {1, 3, 5}));
  EXPECT_THROW(run_acoustic(models_->m(), frames(10, W), q, pool_), InvalidInput);
  q.noise.push_back(Tensor::zeros(DType::F32, {1, 3, 5}));
  EXPECT_THROW(run_acoustic(models_->m(), frames(10, W), q, pool_), InvalidInput);  // 2 tensors, 1 window
  AcousticParams s = p;
  s.solver = "heun-nonexistent";
  EXPECT_THROW(run_acoustic(models_->m(), frames(10, W), s, pool_), InvalidInput);
  s = p;
  s.steps = 0;
  EXPECT_THROW(run_acoustic(models_->m(), frames(10, W), s, pool_), InvalidInput);
}

}  // namespace
}  // namespace mm3
