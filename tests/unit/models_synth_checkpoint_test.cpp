// models_synth_checkpoint_test.cpp — tests of model/synth_checkpoint.h: the --full plan against the
// real checkpoint's tensor counts, parameter counts and file sizes (MODEL.md §1.1–1.6); the shard split
// rule; the value generator; and a --tiny checkpoint written to disk against the golden tiny checkpoint
// (configs field for field, tensor names/shapes/dtypes, files, index). The golden comparisons skip
// loudly when ../shared is absent.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "core/errors.h"
#include "core/thread_pool.h"
#include "core_test_util.h"
#include "model/checkpoint.h"
#include "model/synth_checkpoint.h"

namespace mm3 {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const synth::PlannedComponent& comp(const synth::SynthPlan& p, const std::string& name) {
  for (const auto& c : p.components)
    if (c.name == name) return c;
  throw InternalError("no component " + name);
}

const synth::PlannedTensor& tensor(const synth::PlannedComponent& c, const std::string& name) {
  for (const auto& t : c.tensors)
    if (t.name == name) return t;
  throw InternalError("no tensor " + name);
}

fs::path golden_checkpoint() { return test::golden_dir() / "checkpoint"; }

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

// ---------------------------------------------------------------------------------------------

TEST(SynthPlan, FullMatchesRealCheckpointCountsAndFileSizes) {
  const auto p = synth::make_plan(synth::SynthDims::full(), 0);
  // MODEL.md §1.2–1.6: tensor counts and parameter counts.
  EXPECT_EQ(comp(p, "language_model").tensors.size(), 399u);
  EXPECT_EQ(comp(p, "rvq_depth_decoder").tensors.size(), 47u);
  EXPECT_EQ(comp(p, "condition_encoder").tensors.size(), 4u);
  EXPECT_EQ(comp(p, "transformer").tensors.size(), 441u);
  EXPECT_EQ(comp(p, "vocoder").tensors.size(), 121u);
  EXPECT_EQ(comp(p, "language_model").params(), 8584475648ll);
  EXPECT_EQ(comp(p, "rvq_depth_decoder").params(), 646025216ll);
  EXPECT_EQ(comp(p, "condition_encoder").params(), 25167881ll);
  EXPECT_EQ(comp(p, "transformer").params(), 2431905920ll);
  EXPECT_NEAR(comp(p, "vocoder").params() / 1e6, 54.2, 0.05);

  // MODEL.md §1.1 ([C] convert/source_files.json): the exact file names and byte sizes.
  const std::map<std::string, std::vector<std::pair<std::string, uint64_t>>> real = {
      {"language_model",
       {{"model-00001-of-00004.safetensors", 4910103856ull},
        {"model-00002-of-00004.safetensors", 4915960352ull},
        {"model-00003-of-00004.safetensors", 4983068496ull},
        {"model-00004-of-00004.safetensors", 2359864688ull}}},
      {"rvq_depth_decoder", {{"diffusion_pytorch_model.safetensors", 1292055248ull}}},
      {"condition_encoder", {{"diffusion_pytorch_model.safetensors", 100671852ull}}},
      {"transformer",
       {{"diffusion_pytorch_model-00001-of-00002.safetensors", 4959921384ull},
        {"diffusion_pytorch_model-00002-of-00002.safetensors", 4767750800ull}}},
      {"vocoder", {{"diffusion_pytorch_model.safetensors", 216695272ull}}},
  };
  for (const auto& [name, files] : real) {
    const auto& c = comp(p, name);
    ASSERT_EQ(c.files.size(), files.size()) << name;
    for (size_t i = 0; i < files.size(); ++i) {
      EXPECT_EQ(c.files[i].name, files[i].first) << name;
      EXPECT_EQ(c.files[i].file_bytes(), files[i].second) << name << "/" << files[i].first;
    }
  }
  EXPECT_EQ(comp(p, "language_model").index_name, "model.safetensors.index.json");
  EXPECT_EQ(comp(p, "transformer").index_name, "diffusion_pytorch_model.safetensors.index.json");
  EXPECT_TRUE(comp(p, "vocoder").index_name.empty());

  // Dtypes (§1.1) and a few shapes the spec spells out.
  EXPECT_EQ(comp(p, "language_model").dtype, DType::BF16);
  EXPECT_EQ(comp(p, "rvq_depth_decoder").dtype, DType::BF16);
  EXPECT_EQ(comp(p, "condition_encoder").dtype, DType::F32);
  EXPECT_EQ(comp(p, "transformer").dtype, DType::F32);
  EXPECT_EQ(comp(p, "vocoder").dtype, DType::F32);
  const auto& v = comp(p, "vocoder");
  EXPECT_EQ(tensor(v, "blocks.0.conv_t1.weight_v").shape, (Shape{1536, 768, 16}));
  EXPECT_EQ(tensor(v, "blocks.0.conv_t1.weight_g").shape, (Shape{1536, 1, 1}));
  EXPECT_EQ(tensor(v, "blocks.0.res_unit1.conv1.weight_v").shape, (Shape{768, 768, 7}));
  EXPECT_EQ(tensor(v, "dec_in_proj.weight").shape, (Shape{1024, 64, 1}));
  EXPECT_EQ(tensor(v, "snake_out.alpha").shape, (Shape{1, 96, 1}));
  EXPECT_EQ(tensor(v, "conv_out.weight_v").shape, (Shape{1, 96, 7}));
  const auto& t = comp(p, "transformer");
  EXPECT_EQ(tensor(t, "preprocess_conv.weight").shape, (Shape{2304, 2304, 1}));
  EXPECT_EQ(tensor(t, "transformer_blocks.35.ff_in.weight").shape, (Shape{16384, 2048}));
  EXPECT_EQ(tensor(t, "time_proj.weight").shape, (Shape{128, 1}));
  const auto& lm = comp(p, "language_model");
  EXPECT_EQ(tensor(lm, "lm_head.weight").shape, (Shape{200000, 4096}));
  EXPECT_EQ(tensor(lm, "model.layers.35.self_attn.k_proj.weight").shape, (Shape{1024, 4096}));
  EXPECT_EQ(lm.index["metadata"]["total_size"].get<uint64_t>(), 8584475648ull * 2);
  EXPECT_EQ(lm.index["weight_map"].size(), 399u);
}

TEST(SynthPlan, ShardSplitFollowsTheHubRule) {
  // 10 > 8: own shard, placed at once; 3+3 fit; the third 3 opens a new shard; 12: own shard; 1 joins.
  const auto s = synth::split_shards({10, 3, 3, 3, 12, 1}, 8);
  const std::vector<std::vector<size_t>> want = {{0}, {1, 2}, {4}, {3, 5}};
  EXPECT_EQ(s, want);
  EXPECT_EQ(synth::split_shards({8, 8}, 8), (std::vector<std::vector<size_t>>{{0}, {1}}));
  EXPECT_EQ(synth::split_shards({}, 8).size(), 0u);
}

TEST(SynthPlan, HeadersArePaddedPythonFormat) {
  const auto p = synth::make_plan(synth::SynthDims::tiny(), 0);
  const auto& f = comp(p, "condition_encoder").files.at(0);
  EXPECT_EQ(f.header.size() % 8, 0u);
  EXPECT_EQ(f.header.rfind("{\"__metadata__\":{\"format\":\"pt\"},\"layer_scale\":{\"dtype\":\"F32\",\"shape\":[1],"
                           "\"data_offsets\":[0,4]},",
                           0),
            0u);
  EXPECT_NO_THROW(json::parse(f.header));
}

TEST(SynthValues, DeterministicScaledAndFillMatchesValueAt) {
  ThreadPool pool(2);
  const auto init = synth::Init::normal(0.f, 0.02f);
  const uint64_t k0 = synth::tensor_key(0, "language_model", "lm_head.weight");
  EXPECT_EQ(k0, synth::tensor_key(0, "language_model", "lm_head.weight"));
  EXPECT_NE(k0, synth::tensor_key(1, "language_model", "lm_head.weight"));
  EXPECT_NE(k0, synth::tensor_key(0, "language_model", "model.embed_tokens.weight"));

  const int64_t n = 1 << 20;
  std::vector<float> a(n);
  synth::fill(pool, init, k0, 0, n, DType::F32, a.data());
  double sum = 0, sq = 0, mx = 0;
  for (float x : a) sum += x, sq += double(x) * x, mx = std::max(mx, std::abs(double(x)));
  const double mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 1e-4);
  EXPECT_NEAR(sd, 0.02, 2e-4);
  EXPECT_LE(mx, 0.02 * 3.47);
  EXPECT_GT(mx, 0.02 * 2.5);

  // A chunk starting mid-tensor equals value_at, in F32 and in BF16 (rounded like torch).
  std::vector<float> b(1000);
  std::vector<uint16_t> c(1000);
  synth::fill(pool, init, k0, 123456, 1000, DType::F32, b.data());
  synth::fill(pool, init, k0, 123456, 1000, DType::BF16, c.data());
  for (int i = 0; i < 1000; ++i) {
    ASSERT_EQ(b[i], a[123456 + i]);
    ASSERT_EQ(b[i], synth::value_at(init, k0, 123456 + i));
    ASSERT_EQ(c[i], f32_to_bf16_bits(b[i]));
  }
  const auto u = synth::Init::uniform(0.5f, 1.5f);
  for (int i = 0; i < 10000; ++i) {
    const float x = synth::value_at(u, k0, i);
    ASSERT_GE(x, 0.5f);
    ASSERT_LT(x, 1.5f);
  }
  EXPECT_EQ(synth::value_at(synth::Init::constant(1.f), k0, 77), 1.f);
}

// ---------------------------------------------------------------------------------------------

class SynthTiny : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(golden_checkpoint() / "modular_model_index.json"))
      GTEST_SKIP() << "golden checkpoint absent at " << golden_checkpoint() << " (clone ../shared): the tiny "
                   << "synth checkpoint cannot be compared with it";
  }
  synth::WriteResult write(const fs::path& out, uint64_t seed = 0) {
    synth::WriteOptions o;
    o.tokenizer_from = (golden_checkpoint() / "tokenizer").string();
    o.progress = false;
    o.chunk_bytes = 1 << 20;  // several chunks per LM shard: exercises the buffer hand-over
    return synth::write_checkpoint(synth::make_plan(synth::SynthDims::tiny(), seed), out.string(), o, pool_);
  }
  ThreadPool pool_{2};
  test::TempDir tmp_;
};

TEST_F(SynthTiny, EqualsGoldenLayout) {
  const fs::path out = tmp_.path() / "tiny";
  const auto r = write(out);
  EXPECT_GT(r.bytes, 40'000'000u);

  const Checkpoint ours(out.string()), gold(golden_checkpoint().string());
  const ModelConfigs &a = ours.configs(), &g = gold.configs();
  // Typed configs, field for field.
  EXPECT_EQ(a.index.class_name, g.index.class_name);
  ASSERT_EQ(a.index.components.size(), g.index.components.size());
  for (size_t i = 0; i < g.index.components.size(); ++i) {
    EXPECT_EQ(a.index.components[i].name, g.index.components[i].name);
    EXPECT_EQ(a.index.components[i].library, g.index.components[i].library);
    EXPECT_EQ(a.index.components[i].class_name, g.index.components[i].class_name);
  }
  EXPECT_EQ(a.lm.hidden_size, g.lm.hidden_size);
  EXPECT_EQ(a.lm.intermediate_size, g.lm.intermediate_size);
  EXPECT_EQ(a.lm.num_hidden_layers, g.lm.num_hidden_layers);
  EXPECT_EQ(a.lm.num_attention_heads, g.lm.num_attention_heads);
  EXPECT_EQ(a.lm.num_key_value_heads, g.lm.num_key_value_heads);
  EXPECT_EQ(a.lm.head_dim, g.lm.head_dim);
  EXPECT_EQ(a.lm.vocab_size, g.lm.vocab_size);
  EXPECT_EQ(a.lm.max_position_embeddings, g.lm.max_position_embeddings);
  EXPECT_EQ(a.lm.rms_norm_eps, g.lm.rms_norm_eps);
  EXPECT_EQ(a.lm.rope_theta, g.lm.rope_theta);
  EXPECT_EQ(a.lm.tie_word_embeddings, g.lm.tie_word_embeddings);
  EXPECT_EQ(a.lm.dtype, g.lm.dtype);
  EXPECT_EQ(a.depth.hidden_size, g.depth.hidden_size);
  EXPECT_EQ(a.depth.num_layers, g.depth.num_layers);
  EXPECT_EQ(a.depth.num_attention_heads, g.depth.num_attention_heads);
  EXPECT_EQ(a.depth.intermediate_size, g.depth.intermediate_size);
  EXPECT_EQ(a.depth.audio_vocab_size, g.depth.audio_vocab_size);
  EXPECT_EQ(a.depth.num_codebooks, g.depth.num_codebooks);
  EXPECT_EQ(a.depth.max_position_embeddings, g.depth.max_position_embeddings);
  EXPECT_EQ(a.cond.condition_hidden_dim, g.cond.condition_hidden_dim);
  EXPECT_EQ(a.cond.num_condition_layers, g.cond.num_condition_layers);
  EXPECT_EQ(a.cond.out_dim, g.cond.out_dim);
  EXPECT_EQ(a.cond.input_sampling_rate, g.cond.input_sampling_rate);
  EXPECT_EQ(a.cond.input_hop_length, g.cond.input_hop_length);
  EXPECT_EQ(a.cond.output_sampling_rate, g.cond.output_sampling_rate);
  EXPECT_EQ(a.cond.output_hop_length, g.cond.output_hop_length);
  EXPECT_EQ(a.dit.in_channels, g.dit.in_channels);
  EXPECT_EQ(a.dit.condition_dim, g.dit.condition_dim);
  EXPECT_EQ(a.dit.num_layers, g.dit.num_layers);
  EXPECT_EQ(a.dit.num_attention_heads, g.dit.num_attention_heads);
  EXPECT_EQ(a.dit.attention_head_dim, g.dit.attention_head_dim);
  EXPECT_EQ(a.dit.ff_inner_dim, g.dit.ff_inner_dim);
  EXPECT_EQ(a.dit.rotary_dim, g.dit.rotary_dim);
  EXPECT_EQ(a.dit.fourier_embedding_dim, g.dit.fourier_embedding_dim);
  EXPECT_EQ(a.vocoder.latent_channels, g.vocoder.latent_channels);
  EXPECT_EQ(a.vocoder.decoder_input_dim, g.vocoder.decoder_input_dim);
  EXPECT_EQ(a.vocoder.decoder_hidden_dim, g.vocoder.decoder_hidden_dim);
  EXPECT_EQ(a.vocoder.sampling_rate, g.vocoder.sampling_rate);
  EXPECT_EQ(a.vocoder.upsampling_ratios, g.vocoder.upsampling_ratios);
  EXPECT_EQ(a.scheduler.class_name, g.scheduler.class_name);
  EXPECT_EQ(a.scheduler.num_train_timesteps, g.scheduler.num_train_timesteps);
  EXPECT_EQ(a.scheduler.shift, g.scheduler.shift);
  EXPECT_EQ(a.scheduler.invert_sigmas, g.scheduler.invert_sigmas);
  EXPECT_EQ(a.scheduler.use_dynamic_shifting, g.scheduler.use_dynamic_shifting);
  EXPECT_EQ(a.scheduler.stochastic_sampling, g.scheduler.stochastic_sampling);

  // Every JSON file, every key (also those the typed configs do not read), and byte for byte.
  for (const char* rel : {"modular_model_index.json", "language_model/config.json",
                          "language_model/generation_config.json", "language_model/model.safetensors.index.json",
                          "rvq_depth_decoder/config.json", "condition_encoder/config.json", "transformer/config.json",
                          "vocoder/config.json", "scheduler/scheduler_config.json", "tokenizer/tokenizer_config.json"}) {
    EXPECT_EQ(read_json(out / rel), read_json(golden_checkpoint() / rel)) << rel;
    EXPECT_EQ(test::read_bytes((out / rel).string()), test::read_bytes((golden_checkpoint() / rel).string())) << rel;
  }

  // Tensors: the same names, shapes, dtypes, in the same files of the same sizes.
  for (const char* c : {"language_model", "rvq_depth_decoder", "condition_encoder", "transformer", "vocoder"}) {
    const TensorStore &sa = ours.store(c), &sg = gold.store(c);
    EXPECT_EQ(sa.names(), sg.names()) << c;
    EXPECT_EQ(sa.sharded(), sg.sharded()) << c;
    for (const auto& n : sg.names()) {
      if (!sa.contains(n)) continue;
      EXPECT_EQ(sa.info(n).shape, sg.info(n).shape) << c << " " << n;
      EXPECT_EQ(sa.info(n).dtype, sg.info(n).dtype) << c << " " << n;
      EXPECT_EQ(sa.info(n).begin, sg.info(n).begin) << c << " " << n;
      EXPECT_EQ(fs::path(sa.file_of(n)).filename(), fs::path(sg.file_of(n)).filename()) << c << " " << n;
    }
    std::map<std::string, uint64_t> fa, fg;
    for (const auto& f : sa.files()) fa[fs::path(f->path()).filename().string()] = f->file_bytes();
    for (const auto& f : sg.files()) fg[fs::path(f->path()).filename().string()] = f->file_bytes();
    EXPECT_EQ(fa, fg) << c;
  }
  // Nothing left behind but the layout.
  for (const auto& e : fs::recursive_directory_iterator(out)) EXPECT_NE(e.path().extension(), ".partial") << e.path();
  EXPECT_EQ(test::read_bytes((out / "tokenizer/tokenizer.json").string()).size(),
            fs::file_size(golden_checkpoint() / "tokenizer/tokenizer.json"));
}

TEST_F(SynthTiny, SeedChangesValuesNotLayout) {
  write(tmp_.path() / "s1", 1);
  write(tmp_.path() / "s2", 2);
  const Checkpoint a((tmp_.path() / "s1").string()), b((tmp_.path() / "s2").string());
  const Tensor ta = a.store("language_model").get("model.layers.0.mlp.gate_proj.weight");
  const Tensor tb = b.store("language_model").get("model.layers.0.mlp.gate_proj.weight");
  ASSERT_EQ(ta.shape(), tb.shape());
  EXPECT_NE(std::memcmp(ta.raw(), tb.raw(), ta.nbytes()), 0);
  // Norm weights are ones whatever the seed.
  const auto w = a.store("language_model").get("model.norm.weight").to_f32_vector();
  for (float x : w) ASSERT_EQ(x, 1.f);
}

TEST_F(SynthTiny, ValidateCatchesCorruptionAndRefusesNonEmptyOut) {
  const fs::path out = tmp_.path() / "t";
  write(out);
  const auto plan = synth::make_plan(synth::SynthDims::tiny(), 0);
  EXPECT_NO_THROW(synth::validate(plan, out.string(), 8));
  // Another seed's plan: same layout, other values — the spot checks must notice.
  EXPECT_THROW(synth::validate(synth::make_plan(synth::SynthDims::tiny(), 5), out.string(), 8), BadModel);
  // Flip the first data byte of the condition encoder (layer_scale = 1.0 becomes something else).
  const fs::path f = out / "condition_encoder" / "diffusion_pytorch_model.safetensors";
  std::string bytes = test::read_bytes(f.string());
  const auto& pf = comp(plan, "condition_encoder").files.at(0);
  bytes[8 + pf.header.size() + 3] ^= 0x01;
  test::write_bytes(f.string(), bytes);
  EXPECT_THROW(synth::validate(plan, out.string(), 8), BadModel);
  // A non-empty OUT is refused without force.
  EXPECT_THROW(write(out), InvalidInput);
  // A missing tokenizer source is an input error.
  synth::WriteOptions o;
  o.tokenizer_from = (tmp_.path() / "nowhere").string();
  o.progress = false;
  EXPECT_THROW(synth::write_checkpoint(plan, (tmp_.path() / "u").string(), o, pool_), InvalidInput);
}

}  // namespace
}  // namespace mm3
