// ModelConfig parsing: the real 20b file, the 120b and tiny examples, and every kind of bad config.
#include <doctest/doctest.h>

#include <fstream>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "models/config.h"
#include "tests/test_util.h"

using nlohmann::json;
using xserv::models::ModelConfig;

namespace {
json tiny_doc() {
  std::ifstream in(xserv::testing::source_dir() / "examples/tiny/config.json");
  return json::parse(in);
}
std::string error_of(const json& doc) {
  try {
    ModelConfig::from_json(doc, "config.json");
  } catch (const xserv::Error& e) {
    return e.what();
  }
  return "";
}
} // namespace

TEST_CASE("the real gpt-oss-20b config") {
  XSERV_REQUIRE_DATA(data);
  ModelConfig c = ModelConfig::load(data / "gpt-oss-20b");
  CHECK(c.num_hidden_layers == 24);
  CHECK(c.hidden_size == 2880);
  CHECK(c.q_width() == 4096);
  CHECK(c.kv_width() == 512);
  CHECK(c.num_local_experts == 32);
  CHECK(c.num_experts_per_tok == 4);
  CHECK(c.vocab_size == 201088);
  CHECK(c.sliding_window == 128);
  CHECK(c.rope_scaling.factor == 32.0);
  CHECK(c.rope_scaling.original_max_position_embeddings == 4096);
  CHECK(c.quant_method == "mxfp4");
  CHECK(c.is_sliding(0));
  CHECK(!c.is_sliding(1));
  CHECK(c.eos_token_ids == std::vector<int64_t>{200002});
  // to_json round-trips through from_json.
  ModelConfig back = ModelConfig::from_json(c.to_json(), "round trip");
  CHECK(back.to_json() == c.to_json());
}

TEST_CASE("the 120b and tiny example configs") {
  ModelConfig big = ModelConfig::load(xserv::testing::source_dir() / "examples/gpt-oss-120b");
  CHECK(big.num_hidden_layers == 36);
  CHECK(big.num_local_experts == 128);
  ModelConfig tiny = ModelConfig::load(xserv::testing::source_dir() / "examples/tiny");
  CHECK(tiny.num_hidden_layers == 2);
  CHECK(tiny.hidden_size % 32 == 0);
}

TEST_CASE("a config of another model is refused with one clear line") {
  json doc = tiny_doc();
  doc["model_type"] = "llama";
  CHECK(error_of(doc) == "config.json: not a valid gpt-oss config (1 problem):\n"
                         "  - model_type is \"llama\", not \"gpt_oss\": xserv runs gpt-oss "
                         "models only");
}

TEST_CASE("a gpt_oss config whose architectures name another model is refused") {
  json doc = tiny_doc();
  doc["architectures"] = {"LlamaForCausalLM"};
  CHECK(error_of(doc) == "config.json: not a valid gpt-oss config (1 problem):\n"
                         "  - architectures is [\"LlamaForCausalLM\"], not "
                         "[\"GptOssForCausalLM\"]: the config describes another model");
  doc["architectures"] = "GptOssForCausalLM"; // a string, not a list
  CHECK(error_of(doc).find("architectures is \"GptOssForCausalLM\"") != std::string::npos);
  doc.erase("architectures"); // absent: model_type decides
  CHECK(error_of(doc).empty());
}

TEST_CASE("every problem is listed, each naming its field") {
  json doc = tiny_doc();
  doc.erase("hidden_size");
  doc["num_key_value_heads"] = 3;              // 4 heads not a multiple of 3
  doc["layer_types"] = {"sliding_attention"};  // 1 entry for 2 layers
  doc["rope_scaling"]["rope_type"] = "linear"; // not yarn
  doc["experts_per_token"] = 3;                // contradicts num_experts_per_tok = 2
  const std::string e = error_of(doc);
  CHECK(e.find("(5 problems)") != std::string::npos);
  CHECK(e.find("missing field 'hidden_size'") != std::string::npos);
  CHECK(e.find("num_attention_heads (4) is not a multiple of num_key_value_heads (3)") !=
        std::string::npos);
  CHECK(e.find("'layer_types' has 1 entries but num_hidden_layers is 2") != std::string::npos);
  CHECK(e.find("unknown rope type 'linear'") != std::string::npos);
  CHECK(e.find("'experts_per_token' (3) contradicts 'num_experts_per_tok' (2)") !=
        std::string::npos);
}

TEST_CASE("bad values") {
  json doc = tiny_doc();
  doc["hidden_size"] = 70;
  CHECK(error_of(doc).find("hidden_size (70) must be a multiple of 32") != std::string::npos);
  doc = tiny_doc();
  doc["head_dim"] = "sixteen";
  CHECK(error_of(doc).find("field 'head_dim' must be an integer, found \"sixteen\"") !=
        std::string::npos);
  doc = tiny_doc();
  doc["layer_types"][1] = "global";
  CHECK(error_of(doc).find("'layer_types[1]' is \"global\"") != std::string::npos);
  doc = tiny_doc();
  doc["num_experts_per_tok"] = 9;
  doc["experts_per_token"] = 9;
  CHECK(error_of(doc).find("num_experts_per_tok (9) exceeds num_local_experts (8)") !=
        std::string::npos);
  doc = tiny_doc();
  doc["quantization_config"]["quant_method"] = "gptq";
  CHECK(error_of(doc).find("unsupported quantization_config.quant_method 'gptq'") !=
        std::string::npos);
}

TEST_CASE("unreadable files") {
  CHECK_THROWS_WITH_AS(ModelConfig::load("/nonexistent/dir"),
                       doctest::Contains("/nonexistent/dir: cannot open config"), xserv::Error);
  xserv::testing::TempDir dir("config");
  const auto tmp = dir.path / "config.json";
  std::ofstream(tmp) << "{ not json";
  CHECK_THROWS_WITH_AS(ModelConfig::load(tmp), doctest::Contains("not valid JSON"), xserv::Error);
}

TEST_CASE("pad_token_id must lie inside the vocabulary and survives to_json") {
  json doc = tiny_doc();
  ModelConfig c = ModelConfig::from_json(doc, "config.json");
  CHECK(c.pad_token_id == 199999);
  CHECK(c.to_json()["pad_token_id"] == 199999);
  doc["vocab_size"] = 1024;
  CHECK(error_of(doc).find("pad_token_id (199999) is outside the vocabulary (1024 tokens)") !=
        std::string::npos);
  doc.erase("pad_token_id");
  CHECK_FALSE(ModelConfig::from_json(doc, "config.json").to_json().contains("pad_token_id"));
}

TEST_CASE("every integer field is bounded by the limits the compiler and kernels accept") {
  for (const auto& l : xserv::models::kConfigLimits) {
    CAPTURE(l.field);
    json doc = tiny_doc();
    doc[l.field] = l.hi + 1;
    CHECK(error_of(doc).find(fmt::format("field '{}' must be in [{}, {}], found {}", l.field, l.lo,
                                         l.hi, l.hi + 1)) != std::string::npos);
    doc[l.field] = l.lo - 1;
    CHECK(error_of(doc).find(fmt::format("field '{}' must be in [{}, {}], found {}", l.field, l.lo,
                                         l.hi, l.lo - 1)) != std::string::npos);
  }
  json doc = tiny_doc();
  doc["head_dim"] = int64_t{1} << 21; // used to pass here and abort in GraphEdit
  CHECK(error_of(doc).find("field 'head_dim' must be in [2, 1024], found 2097152") !=
        std::string::npos);
  doc["head_dim"] = 18446744073709551615ull;
  CHECK(error_of(doc).find("field 'head_dim' must be in [2, 1024], found 18446744073709551615") !=
        std::string::npos);
  doc = tiny_doc();
  doc["num_hidden_layers"] = 200000;
  doc.erase("layer_types");
  CHECK(error_of(doc).find("field 'num_hidden_layers' must be in [1, 4096], found 200000") !=
        std::string::npos);
}

TEST_CASE("products of sizes are bounded: tensor elements and row widths") {
  json doc = tiny_doc();
  doc["hidden_size"] = 65536; // x vocabulary 201088: an embedding of 13e9 elements
  CHECK(error_of(doc).find("vocab_size * hidden_size is above 2147483647") != std::string::npos);
  doc = tiny_doc();
  doc["num_attention_heads"] = 1024;
  doc["num_key_value_heads"] = 1024;
  doc["head_dim"] = 1024;
  doc["hidden_size"] = 4096;
  doc["vocab_size"] = 1000;
  doc.erase("pad_token_id");
  CHECK(error_of(doc).find("num_attention_heads * head_dim * hidden_size is above") !=
        std::string::npos);
  doc = tiny_doc();
  doc["num_local_experts"] = 1024;
  doc["intermediate_size"] = 262144;
  CHECK(error_of(doc).find("num_local_experts * intermediate_size * hidden_size is above") !=
        std::string::npos);
  doc = tiny_doc();
  doc["num_key_value_heads"] = 8; // more kv heads than the 4 query heads
  CHECK(error_of(doc).find("num_key_value_heads (8) exceeds num_attention_heads (4)") !=
        std::string::npos);
}

TEST_CASE("floating-point fields must be finite and rope's original length bounded") {
  json doc = tiny_doc();
  doc["rope_theta"] = std::numeric_limits<double>::infinity(); // a document built in code
  CHECK(error_of(doc).find("field 'rope_theta' must be a finite number") != std::string::npos);
  doc = tiny_doc();
  doc["rope_scaling"]["original_max_position_embeddings"] = 1e30;
  CHECK(error_of(doc).find("field 'rope_scaling.original_max_position_embeddings' must be in "
                           "[1, 16777216]") != std::string::npos);
}

TEST_CASE("swiglu_limit, sliding_window and eos_token_id are checked against what they feed") {
  // Found by tools/hostile_probe.py: a limit of 1e308 reached the kernel emitter, a window of
  // 4,000,000 sized a KV ring far past any context, a string eos_token_id was dropped silently.
  json doc = tiny_doc();
  doc["swiglu_limit"] = 1e308;
  CHECK(error_of(doc).find("'swiglu_limit' must be in (0, 1e6]") != std::string::npos);
  doc = tiny_doc();
  doc["sliding_window"] = doc["max_position_embeddings"].get<int64_t>() + 1;
  CHECK(error_of(doc).find("'sliding_window'") != std::string::npos);
  const json huge = json::array({int64_t{1} << 40});
  for (const json& bad : {json("x"), huge, json(-1), json::array({1, "2"})}) {
    doc = tiny_doc();
    doc["eos_token_id"] = bad;
    CAPTURE(bad.dump());
    CHECK(error_of(doc).find("field 'eos_token_id' must be a token id") != std::string::npos);
  }
  doc = tiny_doc();
  doc["eos_token_id"] = json::array({200002, 199999});
  CHECK(ModelConfig::from_json(doc, "config.json").eos_token_ids ==
        std::vector<int64_t>{200002, 199999});
}
