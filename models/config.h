// ModelConfig: the gpt-oss hyper-parameters read from a checkpoint's config.json, validated.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace xserv::models {

/// YaRN rope scaling parameters (MODEL.md, "YaRN RoPE").
struct RopeScaling {
  double factor = 32.0;
  int64_t original_max_position_embeddings = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = false;
};

/// The hyper-parameters of a gpt-oss checkpoint. Every field is validated by from_json().
struct ModelConfig {
  int64_t num_hidden_layers = 0;
  int64_t hidden_size = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t num_local_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t intermediate_size = 0;
  int64_t vocab_size = 0;
  int64_t sliding_window = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-5;
  double swiglu_limit = 7.0;
  double swiglu_alpha = 1.702; ///< constant in gpt-oss, not in config.json
  double rope_theta = 150000.0;
  RopeScaling rope_scaling;
  bool attention_bias = true;
  bool tie_word_embeddings = false;
  std::vector<bool> sliding; ///< per layer: true for "sliding_attention"
  std::string quant_method;  ///< "mxfp4" for the official checkpoints; empty when absent
  std::vector<int64_t> eos_token_ids;
  int64_t pad_token_id = -1; ///< -1 when config.json has none

  /// True when layer `l` uses sliding-window attention.
  bool is_sliding(int64_t l) const { return sliding.at(static_cast<size_t>(l)); }
  int64_t q_width() const { return num_attention_heads * head_dim; }
  int64_t kv_width() const { return num_key_value_heads * head_dim; }

  /// Parses and validates a config.json document. `source` names the file in messages.
  /// Throws xserv::Error listing every problem found (one line each), e.g. a model_type that
  /// is not gpt_oss, a missing field, a layer_types list of the wrong length.
  static ModelConfig from_json(const nlohmann::json& doc, const std::string& source);

  /// Reads `path`, which is a config.json file or a directory holding one.
  static ModelConfig load(const std::filesystem::path& path);

  /// The config.json document for this configuration, in the official HF layout (with
  /// quantization_config when quant_method is set).
  nlohmann::json to_json() const;
};

} // namespace xserv::models
