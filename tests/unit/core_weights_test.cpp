// core_weights_test.cpp — binding by key and shape (missing, wrong shape, wrong dtype and unused keys
// are all reported), and weight-norm folding for Conv1d and ConvTranspose1d layouts.
#include <gtest/gtest.h>

#include <cmath>

#include "core_test_util.h"
#include "model/weights.h"

namespace mm3 {
namespace {

TEST(WeightBinder, ReportsEveryDefectAndUnusedKey) {
  test::TempDir d;
  write_safetensors(d.file("w.safetensors"), {{"a", Tensor::from_f32({1, 2, 3, 4, 5, 6}, {2, 3})},
                                              {"b", Tensor::from_f32({1, 2}, {2})},
                                              {"i", Tensor::from_i64({1}, {1})},
                                              {"extra", Tensor::from_f32({0}, {1})}});
  TensorStore st = TensorStore::open_dir(d.path().string());
  {
    WeightBinder wb(st, "comp");
    EXPECT_EQ(wb.get("a", {2, 3}).to_f32_vector()[5], 6.0f);
    wb.get("b", {2});
    wb.get("i", {1}, {DType::I64});
    EXPECT_EQ(wb.unused(), (std::vector<std::string>{"extra"}));
    try {
      wb.finish();
      FAIL() << "unused key not reported";
    } catch (const BadModel& e) {
      EXPECT_NE(std::string(e.what()).find("'extra' is not used"), std::string::npos) << e.what();
    }
  }
  {
    WeightBinder wb(st, "comp");
    wb.get("a", {3, 2});           // wrong shape
    wb.get("b", {2}, {DType::BF16});  // wrong dtype
    wb.get("zzz", {4});            // missing
    wb.get("i", {1}, {DType::I64});
    wb.get("extra", {1});
    try {
      wb.finish();
      FAIL() << "defects not reported";
    } catch (const BadModel& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("'a'"), std::string::npos) << m;
      EXPECT_NE(m.find("has shape [2, 3], expected [3, 2]"), std::string::npos) << m;
      EXPECT_NE(m.find("'b'"), std::string::npos) << m;
      EXPECT_NE(m.find("is F32, expected BF16"), std::string::npos) << m;
      EXPECT_NE(m.find("missing tensor 'zzz'"), std::string::npos) << m;
      EXPECT_NE(m.find("3 problem(s)"), std::string::npos) << m;
    }
  }
}

// W = g * V / ||V|| with the norm over all dims but 0. Expected values computed by hand.
TEST(WeightNorm, FoldsPerDim0) {
  // V [2, 1, 2] (a Conv1d [out, in, k] or a ConvTranspose1d [in, out, k]): rows (3,4) and (0,2).
  const float g[2] = {10.0f, -1.0f};
  const float v[4] = {3, 4, 0, 2};
  float w[4];
  fold_weight_norm(g, v, w, 2, 2);
  EXPECT_FLOAT_EQ(w[0], 6.0f);
  EXPECT_FLOAT_EQ(w[1], 8.0f);
  EXPECT_FLOAT_EQ(w[2], 0.0f);
  EXPECT_FLOAT_EQ(w[3], -1.0f);
}

TEST(WeightNorm, BinderFoldsConvTransposeOverInputChannels) {
  // ConvTranspose1d V is [in=2, out=3, k=2]; g is [in, 1, 1]: one norm per INPUT channel.
  test::TempDir d;
  std::vector<float> v(12);
  for (int i = 0; i < 12; ++i) v[i] = static_cast<float>(i + 1);
  write_safetensors(d.file("w.safetensors"), {{"up.weight_g", Tensor::from_f32({2.0f, 3.0f}, {2, 1, 1})},
                                              {"up.weight_v", Tensor::from_f32(v, {2, 3, 2})}});
  TensorStore st = TensorStore::open_dir(d.path().string());
  WeightBinder wb(st, "vocoder");
  Tensor w = wb.get_weight_norm("up", {2, 3, 2});
  wb.finish();
  double n0 = 0, n1 = 0;
  for (int i = 0; i < 6; ++i) n0 += v[i] * v[i], n1 += v[6 + i] * v[6 + i];
  const auto wv = w.to_f32_vector();
  for (int i = 0; i < 6; ++i) {
    EXPECT_NEAR(wv[i], 2.0 * v[i] / std::sqrt(n0), 1e-6);
    EXPECT_NEAR(wv[6 + i], 3.0 * v[6 + i] / std::sqrt(n1), 1e-6);
  }
}

}  // namespace
}  // namespace mm3
