#include "model/config.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/errors.h"

namespace mm3 {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw BadModel(fmt::format("{}: missing (expected a JSON config)", path));
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw BadModel(fmt::format("{}: not valid JSON ({})", path, e.what()));
  }
}

// Reads a required positive integer field.
int req_int(const json& j, const std::string& path, const char* key, int min = 1) {
  if (!j.contains(key)) throw BadModel(fmt::format("{}: missing field '{}'", path, key));
  const json& v = j[key];
  if (!v.is_number_integer()) throw BadModel(fmt::format("{}: field '{}' must be an integer", path, key));
  int64_t x = v.get<int64_t>();
  if (x < min || x > (1ll << 31) - 1)
    throw BadModel(fmt::format("{}: field '{}' = {} is out of range (expected >= {})", path, key, x, min));
  return static_cast<int>(x);
}

double opt_num(const json& j, const char* key, double dflt) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  return j[key].get<double>();
}

bool opt_bool(const json& j, const char* key, bool dflt) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  return j[key].get<bool>();
}

void expect_class(const json& j, const std::string& path, const char* want) {
  if (j.contains("_class_name") && j["_class_name"] != want)
    throw BadModel(fmt::format("{}: _class_name is {} but {} was expected", path, j["_class_name"].dump(), want));
}

[[noreturn]] void mismatch(const std::string& what) { throw BadModel(what); }

}  // namespace

int VocoderConfig::hop() const {
  int h = 1;
  for (int r : upsampling_ratios) h *= r;
  return h;
}

LmConfig parse_lm_config(const std::string& path) {
  json j = read_json(path);
  LmConfig c;
  try {
    if (j.contains("model_type") && j["model_type"] != "qwen3")
      throw BadModel(fmt::format("{}: model_type is {}, expected \"qwen3\"", path, j["model_type"].dump()));
    c.hidden_size = req_int(j, path, "hidden_size");
    c.intermediate_size = req_int(j, path, "intermediate_size");
    c.num_hidden_layers = req_int(j, path, "num_hidden_layers");
    c.num_attention_heads = req_int(j, path, "num_attention_heads");
    c.num_key_value_heads = req_int(j, path, "num_key_value_heads");
    c.head_dim = j.contains("head_dim") ? req_int(j, path, "head_dim") : c.hidden_size / c.num_attention_heads;
    c.vocab_size = req_int(j, path, "vocab_size");
    c.max_position_embeddings = j.contains("max_position_embeddings") ? req_int(j, path, "max_position_embeddings") : 0;
    c.rms_norm_eps = opt_num(j, "rms_norm_eps", 1e-6);
    if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
      const json& rp = j["rope_parameters"];
      c.rope_theta = opt_num(rp, "rope_theta", 1e6);
      if (rp.contains("rope_type") && rp["rope_type"] != "default")
        throw BadModel(fmt::format("{}: rope_parameters.rope_type {} is not supported (only \"default\")", path,
                                   rp["rope_type"].dump()));
    } else {
      c.rope_theta = opt_num(j, "rope_theta", 1e6);
    }
    c.tie_word_embeddings = opt_bool(j, "tie_word_embeddings", false);
    if (j.contains("attention_bias") && j["attention_bias"].get<bool>())
      throw BadModel(fmt::format("{}: attention_bias true is not supported (Music3's LM has none)", path));
    if (j.contains("dtype") && j["dtype"].is_string()) c.dtype = j["dtype"].get<std::string>();
  } catch (const json::exception& e) {
    throw BadModel(fmt::format("{}: bad field type ({})", path, e.what()));
  }
  if (c.num_attention_heads % c.num_key_value_heads)
    throw BadModel(fmt::format("{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", path,
                               c.num_attention_heads, c.num_key_value_heads));
  if (c.head_dim % 2) throw BadModel(fmt::format("{}: head_dim {} must be even for RoPE", path, c.head_dim));
  return c;
}

DepthConfig parse_depth_config(const std::string& path) {
  json j = read_json(path);
  expect_class(j, path, "MiniMaxMusic3RVQDepthDecoder");
  DepthConfig c;
  c.hidden_size = req_int(j, path, "hidden_size");
  c.num_layers = req_int(j, path, "num_layers");
  c.num_attention_heads = req_int(j, path, "num_attention_heads");
  c.intermediate_size = req_int(j, path, "intermediate_size");
  c.audio_vocab_size = req_int(j, path, "audio_vocab_size");
  c.num_codebooks = req_int(j, path, "num_codebooks", 2);
  c.max_position_embeddings = req_int(j, path, "max_position_embeddings");
  if (c.hidden_size % c.num_attention_heads)
    throw BadModel(fmt::format("{}: hidden_size {} is not a multiple of num_attention_heads {}", path,
                               c.hidden_size, c.num_attention_heads));
  if (c.max_position_embeddings < c.num_codebooks)
    throw BadModel(fmt::format("{}: max_position_embeddings {} < num_codebooks {}", path,
                               c.max_position_embeddings, c.num_codebooks));
  return c;
}

ConditionConfig parse_condition_config(const std::string& path) {
  json j = read_json(path);
  expect_class(j, path, "MiniMaxMusic3ConditionEncoder");
  ConditionConfig c;
  c.condition_hidden_dim = req_int(j, path, "condition_hidden_dim");
  c.num_condition_layers = req_int(j, path, "num_condition_layers");
  c.out_dim = req_int(j, path, "out_dim");
  c.input_sampling_rate = req_int(j, path, "input_sampling_rate");
  c.input_hop_length = req_int(j, path, "input_hop_length");
  c.output_sampling_rate = req_int(j, path, "output_sampling_rate");
  c.output_hop_length = req_int(j, path, "output_hop_length");
  return c;
}

DitConfig parse_dit_config(const std::string& path) {
  json j = read_json(path);
  expect_class(j, path, "MiniMaxMusic3Transformer1DModel");
  DitConfig c;
  c.in_channels = req_int(j, path, "in_channels");
  c.condition_dim = req_int(j, path, "condition_dim");
  c.num_layers = req_int(j, path, "num_layers");
  c.num_attention_heads = req_int(j, path, "num_attention_heads");
  c.attention_head_dim = req_int(j, path, "attention_head_dim");
  c.ff_inner_dim = req_int(j, path, "ff_inner_dim");
  c.rotary_dim = req_int(j, path, "rotary_dim");
  c.fourier_embedding_dim = req_int(j, path, "fourier_embedding_dim", 2);
  if (c.rotary_dim > c.attention_head_dim || c.rotary_dim % 2)
    throw BadModel(fmt::format("{}: rotary_dim {} must be even and <= attention_head_dim {}", path, c.rotary_dim,
                               c.attention_head_dim));
  if (c.fourier_embedding_dim % 2)
    throw BadModel(fmt::format("{}: fourier_embedding_dim {} must be even", path, c.fourier_embedding_dim));
  return c;
}

VocoderConfig parse_vocoder_config(const std::string& path) {
  json j = read_json(path);
  expect_class(j, path, "MiniMaxMusic3Vocoder");
  VocoderConfig c;
  c.latent_channels = req_int(j, path, "latent_channels");
  c.decoder_input_dim = req_int(j, path, "decoder_input_dim");
  c.decoder_hidden_dim = req_int(j, path, "decoder_hidden_dim");
  c.sampling_rate = req_int(j, path, "sampling_rate");
  if (!j.contains("upsampling_ratios") || !j["upsampling_ratios"].is_array() || j["upsampling_ratios"].empty())
    throw BadModel(fmt::format("{}: missing array field 'upsampling_ratios'", path));
  for (const json& r : j["upsampling_ratios"]) {
    if (!r.is_number_integer() || r.get<int>() < 1)
      throw BadModel(fmt::format("{}: upsampling_ratios must be positive integers", path));
    c.upsampling_ratios.push_back(r.get<int>());
  }
  int ch = c.decoder_hidden_dim;
  for (size_t i = 0; i < c.upsampling_ratios.size(); ++i) {
    if (ch % 2)
      throw BadModel(fmt::format("{}: decoder_hidden_dim {} cannot be halved {} times", path, c.decoder_hidden_dim,
                                 c.upsampling_ratios.size()));
    ch /= 2;
  }
  if (c.latent_channels % 2)
    throw BadModel(fmt::format("{}: latent_channels {} must be even (stereo fold)", path, c.latent_channels));
  return c;
}

SchedulerConfig parse_scheduler_config(const std::string& path) {
  json j = read_json(path);
  SchedulerConfig c;
  c.class_name = j.value("_class_name", "");
  if (c.class_name != "FlowMatchEulerDiscreteScheduler")
    throw BadModel(fmt::format("{}: _class_name is \"{}\", expected FlowMatchEulerDiscreteScheduler", path,
                               c.class_name));
  c.num_train_timesteps = j.value("num_train_timesteps", 1);
  c.shift = opt_num(j, "shift", 1.0);
  c.invert_sigmas = opt_bool(j, "invert_sigmas", false);
  c.use_dynamic_shifting = opt_bool(j, "use_dynamic_shifting", false);
  c.stochastic_sampling = opt_bool(j, "stochastic_sampling", false);
  if (c.shift != 1.0 || !c.invert_sigmas || c.use_dynamic_shifting || c.stochastic_sampling ||
      opt_bool(j, "use_karras_sigmas", false) || opt_bool(j, "use_exponential_sigmas", false) ||
      opt_bool(j, "use_beta_sigmas", false))
    throw BadModel(fmt::format("{}: only the Music3 schedule is supported (shift 1, invert_sigmas true, no dynamic "
                               "shifting, no stochastic sampling, no karras/exponential/beta sigmas)",
                               path));
  return c;
}

ModelIndex parse_model_index(const std::string& path) {
  json j = read_json(path);
  ModelIndex m;
  m.class_name = j.value("_class_name", "");
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key().starts_with("_")) continue;
    if (!it.value().is_array() || it.value().size() < 2)
      throw BadModel(fmt::format("{}: entry '{}' must be [library, class, ...]", path, it.key()));
    m.components.push_back({it.key(), it.value()[0].get<std::string>(), it.value()[1].get<std::string>()});
  }
  return m;
}

ModelConfigs load_model_configs(const std::string& dir) {
  if (!fs::is_directory(dir))
    throw BadModel(fmt::format("{}: not a directory (expected a MiniMax-Music3 checkpoint folder)", dir));
  auto p = [&](const char* sub) { return (fs::path(dir) / sub).string(); };
  ModelConfigs c;
  c.index = parse_model_index(p("modular_model_index.json"));
  c.lm = parse_lm_config(p("language_model/config.json"));
  c.depth = parse_depth_config(p("rvq_depth_decoder/config.json"));
  c.cond = parse_condition_config(p("condition_encoder/config.json"));
  c.dit = parse_dit_config(p("transformer/config.json"));
  c.vocoder = parse_vocoder_config(p("vocoder/config.json"));
  c.scheduler = parse_scheduler_config(p("scheduler/scheduler_config.json"));
  validate_model_configs(c, dir);
  return c;
}

void validate_model_configs(const ModelConfigs& c, const std::string& dir) {
  for (const char* need : {"language_model", "rvq_depth_decoder", "condition_encoder", "transformer", "vocoder",
                           "scheduler", "tokenizer"}) {
    bool found = false;
    for (const auto& comp : c.index.components) found |= comp.name == need;
    if (!found) throw BadModel(fmt::format("{}/modular_model_index.json: no '{}' component", dir, need));
  }
  if (c.depth.hidden_size != c.lm.hidden_size)
    mismatch(fmt::format("{}: rvq_depth_decoder hidden_size {} != language_model hidden_size {}", dir,
                         c.depth.hidden_size, c.lm.hidden_size));
  if (c.cond.condition_hidden_dim != c.lm.hidden_size)
    mismatch(fmt::format("{}: condition_encoder condition_hidden_dim {} != language_model hidden_size {}", dir,
                         c.cond.condition_hidden_dim, c.lm.hidden_size));
  if (c.cond.num_condition_layers != c.depth.num_codebooks)
    mismatch(fmt::format("{}: condition_encoder num_condition_layers {} != rvq_depth_decoder num_codebooks {}", dir,
                         c.cond.num_condition_layers, c.depth.num_codebooks));
  if (c.cond.out_dim != c.dit.condition_dim)
    mismatch(fmt::format("{}: condition_encoder out_dim {} != transformer condition_dim {}", dir, c.cond.out_dim,
                         c.dit.condition_dim));
  if (c.dit.in_channels != c.vocoder.latent_channels)
    mismatch(fmt::format("{}: transformer in_channels {} != vocoder latent_channels {}", dir, c.dit.in_channels,
                         c.vocoder.latent_channels));
  if (c.dit.in_channels % 2)
    mismatch(fmt::format("{}: transformer in_channels {} must be even (stereo fold)", dir, c.dit.in_channels));
  if (c.cond.output_hop_length != c.vocoder.hop())
    mismatch(fmt::format("{}: condition_encoder output_hop_length {} != product of vocoder upsampling_ratios {}", dir,
                         c.cond.output_hop_length, c.vocoder.hop()));
  if (c.cond.output_sampling_rate != c.vocoder.sampling_rate)
    mismatch(fmt::format("{}: condition_encoder output_sampling_rate {} != vocoder sampling_rate {}", dir,
                         c.cond.output_sampling_rate, c.vocoder.sampling_rate));
  const int codes_end = 151675 + 16384;
  if (c.lm.vocab_size < codes_end)
    mismatch(fmt::format("{}: language_model vocab_size {} < {} (the audio code ids 151675..168058 must exist)", dir,
                         c.lm.vocab_size, codes_end));
  if (c.depth.audio_vocab_size != 1024)
    mismatch(fmt::format("{}: rvq_depth_decoder audio_vocab_size {} != 1024", dir, c.depth.audio_vocab_size));
}

}  // namespace mm3
