// config.h — typed configs of every component, parsed from the checkpoint's config.json files and
// validated (MODEL.md §1.1 and the cross-component constraints). Errors name the file and the field.
#pragma once

#include <string>
#include <vector>

namespace mm3 {

struct LmConfig {  // language_model/config.json (Qwen3ForCausalLM), MODEL.md §1.2
  int hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0;
  int num_attention_heads = 0, num_key_value_heads = 0, head_dim = 0;
  int vocab_size = 0, max_position_embeddings = 0;
  double rms_norm_eps = 1e-6, rope_theta = 1e6;
  bool tie_word_embeddings = false;
  std::string dtype;  // "bfloat16"
};

struct DepthConfig {  // rvq_depth_decoder/config.json, MODEL.md §1.3
  int hidden_size = 0, num_layers = 0, num_attention_heads = 0, intermediate_size = 0;
  int audio_vocab_size = 0, num_codebooks = 0, max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;  // not in the config; the reference's constant
  int head_dim() const { return hidden_size / num_attention_heads; }
};

struct ConditionConfig {  // condition_encoder/config.json, MODEL.md §1.4 / §3
  int condition_hidden_dim = 0, num_condition_layers = 0, out_dim = 0;
  int input_sampling_rate = 0, input_hop_length = 0, output_sampling_rate = 0, output_hop_length = 0;
};

struct DitConfig {  // transformer/config.json, MODEL.md §1.5 / §4
  int in_channels = 0, condition_dim = 0, num_layers = 0, num_attention_heads = 0;
  int attention_head_dim = 0, ff_inner_dim = 0, rotary_dim = 0, fourier_embedding_dim = 0;
  int inner_dim() const { return num_attention_heads * attention_head_dim; }
  int concat_channels() const { return 2 * in_channels + condition_dim; }
};

struct VocoderConfig {  // vocoder/config.json, MODEL.md §1.6 / §5
  int latent_channels = 0, decoder_input_dim = 0, decoder_hidden_dim = 0, sampling_rate = 0;
  std::vector<int> upsampling_ratios;
  int hop() const;  // product of the ratios (512)
};

struct SchedulerConfig {  // scheduler/scheduler_config.json, MODEL.md §4.2
  std::string class_name;
  int num_train_timesteps = 1;
  double shift = 1.0;
  bool invert_sigmas = true, use_dynamic_shifting = false, stochastic_sampling = false;
};

// modular_model_index.json: which component folders exist and which class each is.
struct ModelIndex {
  std::string class_name;
  struct Component {
    std::string name, library, class_name;
  };
  std::vector<Component> components;
};

LmConfig parse_lm_config(const std::string& path);
DepthConfig parse_depth_config(const std::string& path);
ConditionConfig parse_condition_config(const std::string& path);
DitConfig parse_dit_config(const std::string& path);
VocoderConfig parse_vocoder_config(const std::string& path);
SchedulerConfig parse_scheduler_config(const std::string& path);
ModelIndex parse_model_index(const std::string& path);

// All configs of a checkpoint directory, with the cross-component checks applied.
struct ModelConfigs {
  ModelIndex index;
  LmConfig lm;
  DepthConfig depth;
  ConditionConfig cond;
  DitConfig dit;
  VocoderConfig vocoder;
  SchedulerConfig scheduler;
};
ModelConfigs load_model_configs(const std::string& model_dir);
void validate_model_configs(const ModelConfigs& c, const std::string& model_dir);

}  // namespace mm3
