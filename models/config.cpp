// Reading and validating gpt-oss config.json files: every problem is collected, then reported once.
#include "models/config.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/error.h"

namespace xserv::models {
namespace {

using nlohmann::json;

/// Collects problems with one config document so the user sees all of them at once.
class Reader {
public:
  Reader(const json& doc, const std::string& source) : doc_(doc), source_(source) {}

  void problem(const std::string& msg) { problems_.push_back(msg); }

  /// An integer field in [lo, hi] (the limits of config_limits.h's table); 0 when it is not.
  int64_t bounded_int(const char* key, int64_t lo, int64_t hi) {
    auto it = doc_.find(key);
    if (it == doc_.end()) {
      problem(fmt::format("missing field '{}'", key));
      return 0;
    }
    if (!it->is_number_integer()) {
      problem(fmt::format("field '{}' must be an integer, found {}", key, it->dump()));
      return 0;
    }
    if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(INT64_MAX)) {
      problem(fmt::format("field '{}' must be in [{}, {}], found {}", key, lo, hi, it->dump()));
      return 0;
    }
    int64_t v = it->get<int64_t>();
    if (v < lo || v > hi) {
      problem(fmt::format("field '{}' must be in [{}, {}], found {}", key, lo, hi, v));
      return 0;
    }
    return v;
  }

  int64_t positive_int(const char* key) {
    for (const FieldLimit& l : kConfigLimits)
      if (std::string_view(l.field) == key)
        return bounded_int(key, l.lo, l.hi);
    return bounded_int(key, 1, int64_t{1} << 31);
  }

  double number(const json& obj, const char* key, const std::string& where, double fallback,
                bool required) {
    auto it = obj.find(key);
    if (it == obj.end()) {
      if (required)
        problem(fmt::format("missing field '{}{}'", where, key));
      return fallback;
    }
    if (!it->is_number()) {
      problem(fmt::format("field '{}{}' must be a number, found {}", where, key, it->dump()));
      return fallback;
    }
    const double v = it->get<double>();
    if (!std::isfinite(v)) {
      problem(
          fmt::format("field '{}{}' must be a finite number, found {}", where, key, it->dump()));
      return fallback;
    }
    return v;
  }

  bool boolean(const char* key, bool fallback) {
    auto it = doc_.find(key);
    if (it == doc_.end())
      return fallback;
    if (!it->is_boolean()) {
      problem(fmt::format("field '{}' must be true or false, found {}", key, it->dump()));
      return fallback;
    }
    return it->get<bool>();
  }

  [[noreturn]] void fail() const {
    std::string msg = fmt::format("{}: not a valid gpt-oss config ({} problem{}):", source_,
                                  problems_.size(), problems_.size() == 1 ? "" : "s");
    for (const auto& p : problems_)
      msg += "\n  - " + p;
    throw Error(msg);
  }

  bool ok() const { return problems_.empty(); }
  const json& doc() const { return doc_; }

private:
  const json& doc_;
  std::string source_;
  std::vector<std::string> problems_;
};

void read_rope(Reader& r, ModelConfig& c) {
  const json& doc = r.doc();
  auto it = doc.find("rope_scaling");
  if (it == doc.end() || it->is_null()) {
    r.problem("missing field 'rope_scaling' (gpt-oss uses YaRN rope scaling)");
    return;
  }
  if (!it->is_object()) {
    r.problem("field 'rope_scaling' must be an object");
    return;
  }
  const json& rs = *it;
  std::string type = rs.value("rope_type", rs.value("type", std::string()));
  if (type != "yarn")
    r.problem(
        fmt::format("unknown rope type '{}' in 'rope_scaling.rope_type' (expected 'yarn')", type));
  c.rope_scaling.factor = r.number(rs, "factor", "rope_scaling.", 32.0, true);
  c.rope_scaling.beta_fast = r.number(rs, "beta_fast", "rope_scaling.", 32.0, false);
  c.rope_scaling.beta_slow = r.number(rs, "beta_slow", "rope_scaling.", 1.0, false);
  double orig = r.number(rs, "original_max_position_embeddings", "rope_scaling.", 4096, true);
  c.rope_scaling.original_max_position_embeddings =
      orig >= 1 && orig <= double(kMaxPositions) ? static_cast<int64_t>(orig) : 4096;
  if (auto t = rs.find("truncate"); t != rs.end()) {
    if (t->is_boolean())
      c.rope_scaling.truncate = t->get<bool>();
    else
      r.problem("field 'rope_scaling.truncate' must be true or false");
  }
  if (c.rope_scaling.factor <= 0)
    r.problem("field 'rope_scaling.factor' must be positive");
  if (c.rope_scaling.beta_fast <= c.rope_scaling.beta_slow)
    r.problem("'rope_scaling.beta_fast' must exceed 'rope_scaling.beta_slow'");
  if (orig < 1 || orig > double(kMaxPositions))
    r.problem(fmt::format("field 'rope_scaling.original_max_position_embeddings' must be in "
                          "[1, {}], found {}",
                          kMaxPositions, orig));
}

void read_layer_types(Reader& r, ModelConfig& c) {
  const json& doc = r.doc();
  auto it = doc.find("layer_types");
  if (it == doc.end()) {
    // Older exports omit layer_types; gpt-oss alternates sliding (even) and full (odd) layers.
    for (int64_t l = 0; l < c.num_hidden_layers; ++l)
      c.sliding.push_back(l % 2 == 0);
    return;
  }
  if (!it->is_array()) {
    r.problem("field 'layer_types' must be a list");
    return;
  }
  if (static_cast<int64_t>(it->size()) != c.num_hidden_layers)
    r.problem(fmt::format("'layer_types' has {} entries but num_hidden_layers is {}", it->size(),
                          c.num_hidden_layers));
  for (size_t l = 0; l < it->size(); ++l) {
    const json& t = (*it)[l];
    if (t == "sliding_attention") {
      c.sliding.push_back(true);
    } else if (t == "full_attention") {
      c.sliding.push_back(false);
    } else {
      r.problem(fmt::format("'layer_types[{}]' is {}; expected \"sliding_attention\" or "
                            "\"full_attention\"",
                            l, t.dump()));
      c.sliding.push_back(false);
    }
  }
}

/// Products of fields that size one tensor or one row: each must stay within what the kernels
/// index (32-bit offsets in places) and the IR accepts.
void check_products(Reader& r, const ModelConfig& c) {
  auto check = [&](const char* what, std::initializer_list<int64_t> factors, int64_t limit,
                   const char* why) {
    int64_t p = 1;
    for (int64_t f : factors) {
      if (f <= 0)
        return; // already reported
      p *= f;   // each factor is at most 2^24: no overflow before the comparison
      if (p > limit) {
        r.problem(fmt::format("{} is above {} ({})", what, limit, why));
        return;
      }
    }
  };
  check("vocab_size * hidden_size", {c.vocab_size, c.hidden_size}, kMaxTensorElements,
        "elements of the embedding and lm_head");
  check("num_attention_heads * head_dim * hidden_size",
        {c.num_attention_heads, c.head_dim, c.hidden_size}, kMaxTensorElements,
        "elements of q_proj and o_proj");
  check("num_local_experts * intermediate_size * hidden_size",
        {c.num_local_experts, c.intermediate_size, c.hidden_size}, kMaxTensorElements,
        "bytes of one layer's MXFP4 gate_up_proj blocks");
}

} // namespace

ModelConfig ModelConfig::from_json(const json& doc, const std::string& source) {
  if (!doc.is_object())
    throw Error(fmt::format("{}: config must be a JSON object", source));
  Reader r(doc, source);
  ModelConfig c;
  auto mt = doc.find("model_type");
  if (mt == doc.end())
    r.problem("missing field 'model_type' (expected \"gpt_oss\")");
  else if (*mt != "gpt_oss") {
    r.problem(fmt::format("model_type is {}, not \"gpt_oss\": xserv runs gpt-oss models only",
                          mt->dump()));
    r.fail(); // the other fields would only add noise
  }
  // The class transformers would build: a gpt_oss config naming another model is not one.
  if (auto ar = doc.find("architectures"); ar != doc.end() && !ar->is_null()) {
    const bool ours = ar->is_array() && std::any_of(ar->begin(), ar->end(), [](const nlohmann::json& a) {
      return a == "GptOssForCausalLM";
    });
    if (!ours) {
      r.problem(fmt::format("architectures is {}, not [\"GptOssForCausalLM\"]: the config "
                            "describes another model",
                            ar->dump().substr(0, 80)));
      r.fail();
    }
  }
  c.num_hidden_layers = r.positive_int("num_hidden_layers");
  c.hidden_size = r.positive_int("hidden_size");
  c.num_attention_heads = r.positive_int("num_attention_heads");
  c.num_key_value_heads = r.positive_int("num_key_value_heads");
  c.head_dim = r.positive_int("head_dim");
  c.num_local_experts = r.positive_int("num_local_experts");
  c.intermediate_size = r.positive_int("intermediate_size");
  c.vocab_size = r.positive_int("vocab_size");
  c.sliding_window = r.positive_int("sliding_window");
  c.max_position_embeddings = r.positive_int("max_position_embeddings");

  // num_experts_per_tok and its duplicate experts_per_token must agree when both are present.
  bool has_k = doc.contains("num_experts_per_tok"), has_dup = doc.contains("experts_per_token");
  if (has_k || !has_dup)
    c.num_experts_per_tok = r.positive_int("num_experts_per_tok");
  if (has_dup) {
    int64_t dup = r.positive_int("experts_per_token");
    if (!has_k)
      c.num_experts_per_tok = dup;
    else if (dup != c.num_experts_per_tok && dup != 0)
      r.problem(fmt::format("'experts_per_token' ({}) contradicts 'num_experts_per_tok' ({})", dup,
                            c.num_experts_per_tok));
  }

  c.rms_norm_eps = r.number(doc, "rms_norm_eps", "", 1e-5, true);
  c.swiglu_limit = r.number(doc, "swiglu_limit", "", 7.0, true);
  c.rope_theta = r.number(doc, "rope_theta", "", 150000.0, true);
  c.attention_bias = r.boolean("attention_bias", true);
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  read_rope(r, c);
  if (c.num_hidden_layers > 0)
    read_layer_types(r, c);

  if (c.rms_norm_eps <= 0 || c.rms_norm_eps > 1)
    r.problem(fmt::format("'rms_norm_eps' must be in (0, 1], found {}", c.rms_norm_eps));
  if (c.num_key_value_heads > c.num_attention_heads && c.num_attention_heads > 0)
    r.problem(fmt::format("num_key_value_heads ({}) exceeds num_attention_heads ({})",
                          c.num_key_value_heads, c.num_attention_heads));
  if (!(c.swiglu_limit > 0 && c.swiglu_limit <= 1e6))
    r.problem(fmt::format("'swiglu_limit' must be in (0, 1e6], found {}", c.swiglu_limit));
  // A window past the longest context changes nothing but the size of the sliding layers' KV
  // ring (which it sets).
  if (c.sliding_window > 0 && c.max_position_embeddings > 0 &&
      c.sliding_window > c.max_position_embeddings)
    r.problem(fmt::format("'sliding_window' ({}) exceeds max_position_embeddings ({})",
                          c.sliding_window, c.max_position_embeddings));
  if (c.rope_theta <= 1)
    r.problem("'rope_theta' must be greater than 1");
  if (!c.attention_bias)
    r.problem("'attention_bias' is false; gpt-oss attention projections carry biases");
  if (c.tie_word_embeddings)
    r.problem("'tie_word_embeddings' is true; gpt-oss keeps a separate lm_head");
  if (c.head_dim > 0 && c.head_dim % 2 != 0)
    r.problem(fmt::format("'head_dim' ({}) must be even for rotary embeddings", c.head_dim));
  if (c.num_attention_heads > 0 && c.num_key_value_heads > 0 &&
      c.num_attention_heads % c.num_key_value_heads != 0)
    r.problem(fmt::format("num_attention_heads ({}) is not a multiple of num_key_value_heads ({})",
                          c.num_attention_heads, c.num_key_value_heads));
  if (c.num_experts_per_tok > 0 && c.num_local_experts > 0 &&
      c.num_experts_per_tok > c.num_local_experts)
    r.problem(fmt::format("num_experts_per_tok ({}) exceeds num_local_experts ({})",
                          c.num_experts_per_tok, c.num_local_experts));
  // MXFP4 packs 32 input values per block: both expert input widths must be multiples of 32.
  if (c.hidden_size > 0 && c.hidden_size % 32 != 0)
    r.problem(
        fmt::format("hidden_size ({}) must be a multiple of 32 (MXFP4 block size)", c.hidden_size));
  if (c.intermediate_size > 0 && c.intermediate_size % 32 != 0)
    r.problem(fmt::format("intermediate_size ({}) must be a multiple of 32 (MXFP4 block size)",
                          c.intermediate_size));
  if (auto it = doc.find("head_dim"), nh = doc.find("num_attention_heads");
      it != doc.end() && nh != doc.end() && c.head_dim > 0 && c.num_attention_heads > 0) {
    // head_dim is explicit in gpt-oss (q width 4096 != hidden 2880); nothing to cross-check
    // beyond positivity, but an explicit q width field must agree if present.
    if (auto qw = doc.find("q_width");
        qw != doc.end() && qw->is_number_integer() && qw->get<int64_t>() != c.q_width())
      r.problem(fmt::format("'q_width' ({}) != num_attention_heads * head_dim ({})",
                            qw->get<int64_t>(), c.q_width()));
  }
  check_products(r, c);
  if (auto q = doc.find("quantization_config"); q != doc.end() && !q->is_null()) {
    if (!q->is_object() || !q->contains("quant_method") || !(*q)["quant_method"].is_string())
      r.problem("'quantization_config' must be an object with a string 'quant_method'");
    else {
      c.quant_method = (*q)["quant_method"].get<std::string>();
      if (c.quant_method != "mxfp4")
        r.problem(fmt::format("unsupported quantization_config.quant_method '{}' (expected "
                              "'mxfp4')",
                              c.quant_method));
    }
  }
  if (auto e = doc.find("eos_token_id"); e != doc.end() && !e->is_null()) {
    const bool list = e->is_array();
    for (const auto& x : list ? *e : nlohmann::json::array({*e})) {
      // Small test vocabularies keep the real model's ids (200002): no upper bound here.
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > (1 << 30)) {
        r.problem(fmt::format("field 'eos_token_id' must be a token id (an integer in [0, "
                              "2^30]) or a list of them, found {}",
                              x.dump()));
        break;
      }
      c.eos_token_ids.push_back(x.get<int64_t>());
    }
  }
  if (auto pad = doc.find("pad_token_id"); pad != doc.end() && !pad->is_null()) {
    if (!pad->is_number_integer())
      r.problem("field 'pad_token_id' must be an integer");
    else
      c.pad_token_id = pad->get<int64_t>();
    if (c.vocab_size > 0 && c.pad_token_id >= c.vocab_size)
      r.problem(fmt::format("pad_token_id ({}) is outside the vocabulary ({} tokens)",
                            c.pad_token_id, c.vocab_size));
  }
  if (!r.ok())
    r.fail();
  return c;
}

ModelConfig ModelConfig::load(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  fs::path file = fs::is_directory(path) ? path / "config.json" : path;
  std::ifstream in(file);
  if (!in)
    throw Error(fmt::format("{}: cannot open config (expected a checkpoint directory holding "
                            "config.json, or the file itself)",
                            file.string()));
  std::stringstream ss;
  ss << in.rdbuf();
  json doc = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded())
    throw Error(fmt::format("{}: not valid JSON", file.string()));
  return from_json(doc, file.string());
}

json ModelConfig::to_json() const {
  json layer_types = json::array();
  for (bool s : sliding)
    layer_types.push_back(s ? "sliding_attention" : "full_attention");
  json doc = {
      {"architectures", {"GptOssForCausalLM"}},
      {"attention_bias", attention_bias},
      {"attention_dropout", 0.0},
      {"eos_token_id", eos_token_ids.size() == 1 ? json(eos_token_ids[0]) : json(eos_token_ids)},
      {"experts_per_token", num_experts_per_tok},
      {"head_dim", head_dim},
      {"hidden_act", "silu"},
      {"hidden_size", hidden_size},
      {"initial_context_length", rope_scaling.original_max_position_embeddings},
      {"initializer_range", 0.02},
      {"intermediate_size", intermediate_size},
      {"layer_types", layer_types},
      {"max_position_embeddings", max_position_embeddings},
      {"model_type", "gpt_oss"},
      {"num_attention_heads", num_attention_heads},
      {"num_experts_per_tok", num_experts_per_tok},
      {"num_hidden_layers", num_hidden_layers},
      {"num_key_value_heads", num_key_value_heads},
      {"num_local_experts", num_local_experts},
      {"output_router_logits", false},
      {"rms_norm_eps", rms_norm_eps},
      {"rope_scaling",
       {{"beta_fast", rope_scaling.beta_fast},
        {"beta_slow", rope_scaling.beta_slow},
        {"factor", rope_scaling.factor},
        {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings},
        {"rope_type", "yarn"},
        {"truncate", rope_scaling.truncate}}},
      {"rope_theta", rope_theta},
      {"router_aux_loss_coef", 0.9},
      {"sliding_window", sliding_window},
      {"swiglu_limit", swiglu_limit},
      {"tie_word_embeddings", tie_word_embeddings},
      {"use_cache", true},
      {"vocab_size", vocab_size},
  };
  if (eos_token_ids.empty())
    doc.erase("eos_token_id");
  if (pad_token_id >= 0)
    doc["pad_token_id"] = pad_token_id;
  if (!quant_method.empty())
    doc["quantization_config"] = {{"modules_to_not_convert",
                                   {"model.layers.*.self_attn", "model.layers.*.mlp.router",
                                    "model.embed_tokens", "lm_head"}},
                                  {"quant_method", quant_method}};
  return doc;
}

} // namespace xserv::models
