// ModelConfig: the gpt-oss hyper-parameters read from a checkpoint's config.json, validated.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace xserv::models {

/// The range config.json's integer fields are checked against: what the graph builder, the IR's
/// attribute checks, the kernels and the memory plan accept, with room far above gpt-oss-120b
/// (36 layers, hidden 2880, 64 heads of 64, 128 experts, vocabulary 201088).
struct FieldLimit {
  const char* field;
  int64_t lo, hi;
};
inline constexpr int64_t kMaxPositions = int64_t{1} << 24; ///< compile's --max-seq bound
inline constexpr FieldLimit kConfigLimits[] = {
    {"num_hidden_layers", 1, 4096}, // ~33 IR nodes each; int32 value ids and intervals
    {"hidden_size", 32, 65536},     // a multiple of 32 (MXFP4 blocks)
    {"num_attention_heads", 1, 1024},
    {"num_key_value_heads", 1, 1024},
    {"head_dim", 2, 1024}, // even (rotary pairs); IR: qkv_rope head_dim <= 2^20
    {"num_local_experts", 1, 1024},
    {"num_experts_per_tok", 1, 1024},
    {"experts_per_token", 1, 1024},
    {"intermediate_size", 32, 262144},   // a multiple of 32 (MXFP4 blocks)
    {"vocab_size", 1, int64_t{1} << 24}, // token ids are int32 in the IR and the sampler
    {"sliding_window", 1, kMaxPositions},
    {"max_position_embeddings", 1, kMaxPositions},
};
/// Elements (bytes for MXFP4 blocks) of one weight tensor: kernels index within a tensor with
/// 32-bit offsets.
inline constexpr int64_t kMaxTensorElements = (int64_t{1} << 31) - 1;

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
  /// eos_token_ids as a generation request's stop ids.
  std::vector<int32_t> eos_ids() const {
    return std::vector<int32_t>(eos_token_ids.begin(), eos_token_ids.end());
  }
  int64_t pad_token_id = -1; ///< -1 when config.json has none

  /// True when layer `l` uses sliding-window attention.
  bool is_sliding(int64_t l) const { return sliding.at(static_cast<size_t>(l)); }
  int64_t q_width() const { return num_attention_heads * head_dim; }
  int64_t kv_width() const { return num_key_value_heads * head_dim; }

  /// Parses and validates a config.json document. `source` names the file in messages.
  /// Throws xserv::Error listing every problem found (one line each), e.g. a model_type that
  /// is not gpt_oss, a missing field, a layer_types list of the wrong length, a size outside
  /// kConfigLimits ("field 'head_dim' must be in [2, 1024], found 2097152") or a product of
  /// sizes above kMaxTensorElements, a non-finite number.
  static ModelConfig from_json(const nlohmann::json& doc, const std::string& source);

  /// Reads `path`, which is a config.json file or a directory holding one.
  static ModelConfig load(const std::filesystem::path& path);

  /// The config.json document for this configuration, in the official HF layout (with
  /// quantization_config when quant_method is set).
  nlohmann::json to_json() const;
};

} // namespace xserv::models
