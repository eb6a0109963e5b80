// core_config_test.cpp — typed configs: the golden checkpoint parses, and every cross-component
// constraint of MODEL.md is enforced with an error naming the field.
#include <gtest/gtest.h>

#include <filesystem>

#include "core_test_util.h"
#include "model/checkpoint.h"
#include "model/config.h"

namespace mm3 {
namespace {

namespace fs = std::filesystem;

// Copies the golden checkpoint's JSON files (not the weights) into a temp dir for mutation.
void copy_configs(const fs::path& from, const fs::path& to) {
  for (const auto& e : fs::recursive_directory_iterator(from)) {
    const fs::path rel = fs::relative(e.path(), from);
    if (e.is_directory()) fs::create_directories(to / rel);
    else if (e.path().extension() == ".json") fs::copy_file(e.path(), to / rel);
  }
}

void replace_in(const fs::path& file, const std::string& from, const std::string& to) {
  std::string s = test::read_bytes(file.string());
  auto pos = s.find(from);
  ASSERT_NE(pos, std::string::npos) << from << " not in " << file;
  s.replace(pos, from.size(), to);
  test::write_bytes(file.string(), s);
}

void expect_config_error(const fs::path& dir, const char* frag) {
  try {
    load_model_configs(dir.string());
    FAIL() << "no error, expected one mentioning " << frag;
  } catch (const BadModel& e) {
    EXPECT_NE(std::string(e.what()).find(frag), std::string::npos) << e.what();
  }
}

class GoldenConfigs : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::have_golden()) GTEST_SKIP() << "golden set absent at " << test::golden_dir() << " (clone ../shared)";
    copy_configs(test::golden_dir() / "checkpoint", tmp_.path());
  }
  test::TempDir tmp_;
};

TEST_F(GoldenConfigs, ParseGolden) {
  ModelConfigs c = load_model_configs((test::golden_dir() / "checkpoint").string());
  EXPECT_EQ(c.lm.hidden_size, 64);
  EXPECT_EQ(c.lm.num_hidden_layers, 2);
  EXPECT_EQ(c.lm.head_dim, 16);
  EXPECT_EQ(c.lm.vocab_size, 168100);
  EXPECT_DOUBLE_EQ(c.lm.rope_theta, 1e6);
  EXPECT_EQ(c.depth.head_dim(), 16);
  EXPECT_EQ(c.cond.out_dim, 32);
  EXPECT_EQ(c.dit.concat_channels(), 64);
  EXPECT_EQ(c.dit.rotary_dim, 4);
  EXPECT_EQ(c.vocoder.hop(), 512);
  EXPECT_EQ(c.index.components.size(), 7u);
}

TEST_F(GoldenConfigs, HiddenMismatchNamesBothFields) {
  replace_in(tmp_.path() / "rvq_depth_decoder/config.json", "\"hidden_size\": 64", "\"hidden_size\": 32");
  expect_config_error(tmp_.path(), "rvq_depth_decoder hidden_size 32 != language_model hidden_size 64");
}

TEST_F(GoldenConfigs, ConditionDimMismatch) {
  replace_in(tmp_.path() / "condition_encoder/config.json", "\"out_dim\": 32", "\"out_dim\": 48");
  expect_config_error(tmp_.path(), "out_dim 48 != transformer condition_dim 32");
}

TEST_F(GoldenConfigs, OddLatentChannels) {
  replace_in(tmp_.path() / "vocoder/config.json", "\"latent_channels\": 16", "\"latent_channels\": 15");
  expect_config_error(tmp_.path(), "latent_channels 15 must be even");
}

TEST_F(GoldenConfigs, LatentChannelsDisagree) {
  replace_in(tmp_.path() / "vocoder/config.json", "\"latent_channels\": 16", "\"latent_channels\": 18");
  expect_config_error(tmp_.path(), "in_channels 16 != vocoder latent_channels 18");
}

TEST_F(GoldenConfigs, MissingFieldAndBadType) {
  replace_in(tmp_.path() / "transformer/config.json", "\"rotary_dim\": 4", "\"rotary_dimension\": 4");
  expect_config_error(tmp_.path(), "missing field 'rotary_dim'");
}

TEST_F(GoldenConfigs, WrongType) {
  replace_in(tmp_.path() / "language_model/config.json", "\"num_hidden_layers\": 2", "\"num_hidden_layers\": \"2\"");
  expect_config_error(tmp_.path(), "'num_hidden_layers' must be an integer");
}

TEST_F(GoldenConfigs, VocabTooSmallForCodes) {
  replace_in(tmp_.path() / "language_model/config.json", "\"vocab_size\": 168100", "\"vocab_size\": 151936");
  expect_config_error(tmp_.path(), "vocab_size 151936");
}

TEST_F(GoldenConfigs, UnsupportedScheduler) {
  replace_in(tmp_.path() / "scheduler/scheduler_config.json", "\"use_karras_sigmas\": false", "\"use_karras_sigmas\": true");
  expect_config_error(tmp_.path(), "karras");
}

TEST_F(GoldenConfigs, MissingComponentFolder) {
  fs::remove_all(tmp_.path() / "vocoder");
  expect_config_error(tmp_.path(), "vocoder/config.json: missing");
}

}  // namespace
}  // namespace mm3
