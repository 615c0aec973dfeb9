// Checkpoint directories: the gpt-oss layout, index checks, layout validation messages, and the
// BF16/MXFP4 accessors. Bad checkpoints are made by editing a small synthetic one.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "models/checkpoint.h"
#include "models/mxfp4.h"
#include "models/synth.h"
#include "tests/test_util.h"

namespace xserv::models {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using xserv::testing::TempDir;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void spit(const fs::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary) << s;
}

/// The tiny config with a small vocabulary, so checkpoints are a few hundred KB.
ModelConfig small_config() {
  ModelConfig c = ModelConfig::load(testing::source_dir() / "examples/tiny/config.json");
  c.vocab_size = 64;
  c.pad_token_id = -1; // the tiny example's pad id lies outside this vocabulary
  return c;
}

struct Entry {
  TensorSpec spec;
  std::string data;
};

/// Every tensor of the checkpoint in `dir`, with its bytes.
std::vector<Entry> load_entries(const fs::path& dir) {
  Checkpoint ck = Checkpoint::open(dir, {.map_data = true});
  std::vector<Entry> out;
  for (const std::string& n : ck.tensor_names()) {
    const TensorInfo& t = ck.info(n);
    auto b = ck.bytes(n);
    out.push_back({{n, t.dtype, t.shape}, std::string(b.begin(), b.end())});
  }
  return out;
}

/// Writes a single-file checkpoint (config.json + model.safetensors) holding `entries`.
void write_single(const fs::path& dir, const std::vector<Entry>& entries, const json& config) {
  fs::create_directories(dir);
  spit(dir / "config.json", config.dump());
  std::vector<TensorSpec> specs;
  std::string data;
  for (const Entry& e : entries) {
    specs.push_back(e.spec);
    data += e.data;
  }
  spit(dir / "model.safetensors", make_safetensors_header(specs, {{"format", "pt"}}) + data);
}

Entry* find(std::vector<Entry>& es, const std::string& name) {
  for (Entry& e : es)
    if (e.spec.name == name)
      return &e;
  FAIL("no tensor " << name);
  return nullptr;
}

std::string open_error(const fs::path& dir, CheckpointOptions o = {}) {
  try {
    Checkpoint::open(dir, o);
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("checkpoint " << dir << " opened without error");
  return "";
}

/// A valid small synthetic checkpoint written into `dir` with `shard_size`.
void make_valid(const fs::path& dir, uint64_t shard_size = 5'000'000'000) {
  SynthOptions o;
  o.seed = 3;
  o.shard_size = shard_size;
  synth_checkpoint(small_config(), dir, o);
}

TEST_CASE("checkpoint: expected_tensors follows MODEL.md for 20b") {
  XSERV_REQUIRE_DATA(data);
  ModelConfig c = ModelConfig::load(data / "gpt-oss-20b/config.json");
  std::vector<ExpectedTensor> ts = expected_tensors(c);
  CHECK(ts.size() == 3 + 24 * 19);
  std::map<std::string, ExpectedTensor> by;
  for (const auto& t : ts)
    by[t.name] = t;
  auto shape = [&](const std::string& n) { return by.at(n).shape; };
  using S = std::vector<int64_t>;
  CHECK(shape("model.embed_tokens.weight") == S{201088, 2880});
  CHECK(shape("model.layers.3.self_attn.q_proj.weight") == S{4096, 2880});
  CHECK(shape("model.layers.3.self_attn.k_proj.bias") == S{512});
  CHECK(shape("model.layers.3.self_attn.o_proj.weight") == S{2880, 4096});
  CHECK(shape("model.layers.3.self_attn.sinks") == S{64});
  CHECK(shape("model.layers.3.mlp.router.weight") == S{32, 2880});
  CHECK(shape("model.layers.23.mlp.experts.gate_up_proj_blocks") == S{32, 5760, 90, 16});
  CHECK(shape("model.layers.23.mlp.experts.gate_up_proj_scales") == S{32, 5760, 90});
  CHECK(shape("model.layers.23.mlp.experts.gate_up_proj_bias") == S{32, 5760});
  CHECK(shape("model.layers.23.mlp.experts.down_proj_blocks") == S{32, 2880, 90, 16});
  CHECK(by.at("model.layers.0.mlp.experts.down_proj_scales").dtype == "U8");
  CHECK(by.at("lm_head.weight").dtype == "BF16");
}

TEST_CASE("checkpoint: a valid checkpoint opens headers-only and mapped, sharded and single") {
  TempDir t;
  make_valid(t.path / "sharded", 40'000);
  Checkpoint h = Checkpoint::open(t.path / "sharded");
  CHECK(!h.mapped());
  CHECK(h.files().size() > 1);
  CHECK_THROWS_WITH_AS(h.bytes("model.norm.weight"), doctest::Contains("headers-only"), Error);
  Checkpoint m = Checkpoint::open(t.path / "sharded", {.map_data = true});
  CHECK(m.read_bf16("model.norm.weight").size() == 64);
  CHECK_THROWS_WITH_AS(m.read_bf16("model.layers.0.mlp.experts.down_proj_scales"),
                       doctest::Contains("is U8, expected BF16"), Error);

  std::vector<Entry> es = load_entries(t.path / "sharded");
  write_single(t.path / "single", es, small_config().to_json());
  Checkpoint s = Checkpoint::open(t.path / "single", {.map_data = true});
  CHECK(s.files().size() == 1);
  CHECK(s.file_of("lm_head.weight").filename() == "model.safetensors");

  // decode_expert reads one expert's slice; it agrees with decoding the raw bytes by hand.
  std::string base = "model.layers.1.mlp.experts.gate_up_proj";
  Mxfp4Tensor mx = s.mxfp4(base);
  CHECK(mx.experts == 8);
  CHECK(mx.rows == 128);
  CHECK(mx.cols == 64);
  std::vector<float> e5 = s.decode_expert(base, 5), all = s.decode_mxfp4(base), want(128 * 64);
  auto blocks = s.bytes(base + "_blocks").subspan(5 * 128 * 2 * 16, 128 * 2 * 16);
  auto scales = s.bytes(base + "_scales").subspan(5 * 128 * 2, 128 * 2);
  mxfp4_decode_matrix(blocks, scales, 128, 64, want);
  CHECK(e5 == want);
  CHECK(std::equal(e5.begin(), e5.end(), all.begin() + 5 * 128 * 64));
  CHECK_THROWS_WITH_AS(s.decode_expert(base, 8), doctest::Contains("expert 8 out of range"), Error);
}

TEST_CASE("checkpoint: layout problems are listed together, naming tensor, file and shapes") {
  TempDir t;
  make_valid(t.path / "ok");
  std::vector<Entry> es = load_entries(t.path / "ok");
  std::erase_if(es, [](const Entry& e) { return e.spec.name == "model.layers.0.self_attn.sinks"; });
  Entry* q = find(es, "model.layers.1.self_attn.q_proj.weight");
  q->spec.shape = {63, 64};
  q->data.resize(63 * 64 * 2);
  find(es, "model.layers.0.mlp.router.bias")->spec.dtype = "F16";
  find(es, "model.layers.1.mlp.experts.down_proj_scales")->spec.shape = {8, 32, 4};
  es.push_back({{"model.layers.0.mlp.extra", "F32", {2}}, std::string(8, '\0')});
  write_single(t.path / "bad", es, small_config().to_json());

  std::string msg = open_error(t.path / "bad");
  CHECK(msg.find("(6 problems)") != std::string::npos);
  CHECK(msg.find("- missing tensor model.layers.0.self_attn.sinks: expected BF16 [4]") !=
        std::string::npos);
  CHECK(msg.find("- model.layers.1.self_attn.q_proj.weight in model.safetensors: shape [63, 64], "
                 "expected [64, 64]") != std::string::npos);
  CHECK(msg.find("- model.layers.0.mlp.router.bias in model.safetensors: dtype F16, expected "
                 "BF16") != std::string::npos);
  CHECK(msg.find("- model.layers.1.mlp.experts.down_proj_scales in model.safetensors: shape [8, "
                 "32, 4], expected [8, 64, 2]") != std::string::npos);
  CHECK(msg.find("- MXFP4 pair disagrees: model.layers.1.mlp.experts.down_proj_blocks [8, 64, 2, "
                 "16] in model.safetensors and model.layers.1.mlp.experts.down_proj_scales [8, "
                 "32, 4] in model.safetensors") != std::string::npos);
  CHECK(msg.find("- unexpected tensor model.layers.0.mlp.extra (F32 [2]) in model.safetensors") !=
        std::string::npos);

  // Unvalidated, it opens; validate() against the config reports the same list.
  Checkpoint ck = Checkpoint::open(t.path / "bad", {.validate = false});
  CHECK(ck.problems(ck.config()).size() == 6);
  CHECK_THROWS_WITH_AS(ck.validate(), doctest::Contains("does not match the gpt-oss tensor layout"),
                       Error);
}

TEST_CASE("checkpoint: index naming a missing shard, or a tensor absent from its shard") {
  TempDir t;
  make_valid(t.path, 40'000);
  json index = json::parse(slurp(t.path / "model.safetensors.index.json"));
  std::string shard2 = index["weight_map"]["model.layers.0.self_attn.sinks"];
  std::string last = index["weight_map"]["lm_head.weight"];
  REQUIRE(shard2 != last);
  fs::rename(t.path / last, t.path / "moved.safetensors");
  index["weight_map"]["model.layers.0.extra"] = shard2;
  spit(t.path / "model.safetensors.index.json", index.dump());

  std::string msg = open_error(t.path);
  CHECK(msg.find("model.safetensors.index.json names shard " + last) != std::string::npos);
  CHECK(msg.find("which does not exist") != std::string::npos);
  CHECK(msg.find("model.safetensors.index.json maps model.layers.0.extra to " + shard2 +
                 ", which does not hold it") != std::string::npos);
  // The tensors of the missing shard are reported once, through the shard, not one by one.
  CHECK(msg.find("missing tensor lm_head.weight") == std::string::npos);
  CHECK(msg.find("(2 problems)") != std::string::npos);
}

TEST_CASE("checkpoint: shard tensors missing from the index, and a shard named outside the dir") {
  TempDir t;
  make_valid(t.path, 40'000);
  json index = json::parse(slurp(t.path / "model.safetensors.index.json"));
  std::string shard = index["weight_map"]["model.norm.weight"];
  index["weight_map"].erase("model.norm.weight");
  index["weight_map"]["model.layers.1.self_attn.sinks"] = "../elsewhere.safetensors";
  spit(t.path / "model.safetensors.index.json", index.dump());
  std::string msg = open_error(t.path);
  CHECK(msg.find("tensor model.norm.weight in " + shard +
                 " is missing from model.safetensors.index.json") != std::string::npos);
  CHECK(msg.find("names shard '../elsewhere.safetensors', which is not a plain file name") !=
        std::string::npos);
  CHECK(msg.find("tensor model.layers.1.self_attn.sinks is also in") != std::string::npos);
}

TEST_CASE("checkpoint: a corrupt shard, another model type, and no weights are clear errors") {
  TempDir t;
  make_valid(t.path / "a", 40'000);
  std::string first = "model-00001-of-" + std::string("0000") +
                      std::to_string(Checkpoint::open(t.path / "a").files().size()) +
                      ".safetensors";
  fs::resize_file(t.path / "a" / first, fs::file_size(t.path / "a" / first) - 1);
  CHECK(open_error(t.path / "a").find(first + ": invalid safetensors file") != std::string::npos);

  make_valid(t.path / "b");
  json cfg = json::parse(slurp(t.path / "b" / "config.json"));
  cfg["model_type"] = "llama";
  spit(t.path / "b" / "config.json", cfg.dump());
  CHECK(open_error(t.path / "b").find("model_type is \"llama\", not \"gpt_oss\"") !=
        std::string::npos);

  fs::create_directories(t.path / "c");
  spit(t.path / "c" / "config.json", small_config().to_json().dump());
  CHECK(open_error(t.path / "c").find("no model.safetensors or model.safetensors.index.json") !=
        std::string::npos);
  CHECK(open_error(t.path / "nowhere").find("not a checkpoint directory") != std::string::npos);
}

} // namespace
} // namespace xserv::models

namespace xserv::models {
namespace {

/// The message read_bf16 / decode_mxfp4 throws for tensor `name` of the checkpoint in `dir`.
std::string read_error(const fs::path& dir, const std::string& name, bool mxfp4) {
  Checkpoint ck = Checkpoint::open(dir, {.map_data = true});
  try {
    if (mxfp4)
      ck.decode_mxfp4(name);
    else
      ck.read_bf16(name);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST_CASE("checkpoint: non-finite weights and scale byte 0xFF are refused as they are read") {
  testing::TempDir dir;
  make_valid(dir.path / "ok");
  const std::string norm = "model.norm.weight", lm = "lm_head.weight";
  const std::string experts = "model.layers.1.mlp.experts.gate_up_proj";
  CHECK(read_error(dir.path / "ok", norm, false).empty());
  CHECK(read_error(dir.path / "ok", experts, true).empty());

  std::vector<Entry> es = load_entries(dir.path / "ok");
  const json config = json::parse(slurp(dir.path / "ok" / "config.json"));
  find(es, norm)->data[2 * 3 + 1] = char(0x7F); // element 3: 0x7FC0, NaN
  find(es, norm)->data[2 * 3] = char(0xC0);
  find(es, lm)->data[2 * 70 + 1] = char(0x7F); // element 70: 0x7F80, +inf
  find(es, lm)->data[2 * 70] = char(0x80);
  write_single(dir.path / "bad", es, config);
  const std::string file = (dir.path / "bad" / "model.safetensors").string();
  CHECK(read_error(dir.path / "bad", norm, false) ==
        file + ": tensor model.norm.weight element 3 is NaN: the checkpoint holds non-finite "
               "weights");
  CHECK(read_error(dir.path / "bad", lm, false)
            .find("tensor lm_head.weight element 70 is "
                  "infinite") != std::string::npos);

  es = load_entries(dir.path / "ok");
  const int64_t per_expert = 2 * 64 * (64 / 32); // scales of one expert: rows x blocks
  find(es, experts + "_scales")->data[size_t(per_expert) + 5] = char(0xFF); // expert 1
  write_single(dir.path / "scale", es, config);
  CHECK(read_error(dir.path / "scale", experts, true) ==
        (dir.path / "scale" / "model.safetensors").string() + ": tensor " + experts +
            "_scales holds scale byte 0xFF (E8M0 NaN) at index " + std::to_string(per_expert + 5) +
            ": the checkpoint is corrupt");

  es = load_entries(dir.path / "ok");
  find(es, experts + "_scales")->data[0] = char(0xFE); // 2^127 times
  find(es, experts + "_blocks")->data[0] = char(0x77); // 6.0: infinite
  write_single(dir.path / "big", es, config);
  CHECK(read_error(dir.path / "big", experts, true)
            .find("tensor " + experts + " expert 0 element 0 is infinite after MXFP4 decoding") !=
        std::string::npos);
}

} // namespace
} // namespace xserv::models
