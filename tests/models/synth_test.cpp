// Synthetic checkpoints: deterministic across thread counts, valid, distributed as asked, and
// split into consistent shards.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <string>

#include <csignal>
#include <sys/wait.h>
#include <unistd.h>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "models/checkpoint.h"
#include "models/synth.h"
#include "tests/test_util.h"

namespace xserv::models {
namespace {

namespace fs = std::filesystem;
using xserv::testing::TempDir;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

ModelConfig tiny() {
  return ModelConfig::load(testing::source_dir() / "examples/tiny/config.json");
}

std::pair<double, double> mean_std(const std::vector<float>& v) {
  double s = 0, s2 = 0;
  for (float x : v) {
    s += x;
    s2 += double(x) * x;
  }
  double m = s / v.size();
  return {m, std::sqrt(s2 / v.size() - m * m)};
}

TEST_CASE("synth: tiny seed 1 is byte-identical across thread counts, valid and well spread") {
  TempDir a, b;
  std::vector<std::string> lines;
  SynthOptions o;
  o.seed = 1;
  o.threads = 1;
  o.progress = [&](const std::string& s) { lines.push_back(s); };
  synth_checkpoint(tiny(), a.path, o);
  o.threads = 3;
  o.progress = nullptr;
  synth_checkpoint(tiny(), b.path, o);

  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(a.path))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"config.json", "model-00001-of-00001.safetensors",
                                          "model.safetensors.index.json"});
  for (const std::string& n : names)
    CHECK_MESSAGE(slurp(a.path / n) == slurp(b.path / n), n << " differs between thread counts");
  REQUIRE(!lines.empty());
  CHECK(lines.back().find("shard 1/1:") == 0);
  CHECK(lines.back().find("B/s") != std::string::npos);

  Checkpoint ck = Checkpoint::open(a.path, {.map_data = true});
  CHECK(ck.config().quant_method == "mxfp4");
  CHECK(ck.files()[0].metadata().at("format") == "pt");

  auto [m, s] = mean_std(ck.read_bf16("model.embed_tokens.weight")); // 12.9M values
  CHECK(std::abs(m) < 1e-4);
  CHECK(std::abs(s - 0.02) < 0.0005);
  std::vector<float> norms = ck.read_bf16("model.norm.weight");
  for (int l = 0; l < 2; ++l)
    for (const char* n : {"input_layernorm.weight", "post_attention_layernorm.weight"}) {
      std::vector<float> v = ck.read_bf16("model.layers." + std::to_string(l) + "." + n);
      norms.insert(norms.end(), v.begin(), v.end());
    }
  auto [nm, ns] = mean_std(norms); // 320 values
  CHECK(std::abs(nm - 1.0) < 0.03);
  CHECK(std::abs(ns - 0.1) < 0.03);
  auto [rm, rs] = mean_std(ck.read_bf16("model.layers.0.mlp.router.weight")); // 512 values
  CHECK(std::abs(rm) < 0.05);
  CHECK(std::abs(rs - 0.2) < 0.03);
  auto [bm, bs] = mean_std(ck.read_bf16("model.layers.1.mlp.experts.down_proj_bias"));
  CHECK(std::abs(bs - 0.02) < 0.005);

  std::vector<int> scale_hist(256), nibble_hist(16);
  for (int l = 0; l < 2; ++l)
    for (const char* p : {"gate_up_proj", "down_proj"}) {
      std::string base = "model.layers." + std::to_string(l) + ".mlp.experts." + p;
      for (uint8_t x : ck.bytes(base + "_scales"))
        ++scale_hist[x];
      for (uint8_t x : ck.bytes(base + "_blocks")) {
        ++nibble_hist[x & 15];
        ++nibble_hist[x >> 4];
      }
      std::vector<float> w = ck.decode_expert(base, 7);
      CHECK(std::all_of(w.begin(), w.end(), [](float x) { return std::isfinite(x); }));
    }
  for (int v = 0; v < 256; ++v)
    CHECK_MESSAGE((scale_hist[v] > 0) == (v >= 116 && v < 119), "scale byte " << v);
  int total = 0;
  for (int c : nibble_hist)
    total += c;
  for (int c : nibble_hist) // 98304 nibbles: each code within 5% of 1/16
    CHECK(std::abs(c - total / 16.0) < 0.05 * total / 16.0);
}

TEST_CASE("synth: a small shard_size gives several shards with a consistent index") {
  ModelConfig c = tiny();
  c.vocab_size = 1000; // keeps embed/lm_head small so that layers spread over shards
  c.pad_token_id = -1;
  TempDir one, many;
  SynthOptions o;
  o.seed = 5;
  synth_checkpoint(c, one.path, o);
  o.shard_size = 100'000;
  synth_checkpoint(c, many.path, o);

  nlohmann::json index = nlohmann::json::parse(slurp(many.path / "model.safetensors.index.json"));
  std::set<std::string> shards;
  std::map<std::string, int> count;
  for (const auto& [tensor, shard] : index["weight_map"].items()) {
    shards.insert(shard.get<std::string>());
    ++count[shard.get<std::string>()];
  }
  REQUIRE(shards.size() > 3);
  int n = 1;
  uint64_t sum = 0;
  for (const std::string& s : shards) {
    char want[64];
    std::snprintf(want, sizeof want, "model-%05d-of-%05zu.safetensors", n++, shards.size());
    CHECK(s == want);
    // Over shard_size only by its header, unless it holds a single larger tensor (embed, lm_head).
    CHECK((fs::file_size(many.path / s) <= 100'000 + 4096 || count[s] == 1));
  }
  Checkpoint a = Checkpoint::open(one.path, {.map_data = true});
  Checkpoint b = Checkpoint::open(many.path, {.map_data = true});
  CHECK(a.files().size() == 1);
  CHECK(b.files().size() == shards.size());
  CHECK(a.tensor_names() == b.tensor_names());
  for (const std::string& t : a.tensor_names()) {
    sum += b.info(t).size;
    CHECK(index["weight_map"][t] == b.file_of(t).filename().string());
    auto x = a.bytes(t), y = b.bytes(t); // sharding must not change any tensor's bytes
    CHECK_MESSAGE(std::equal(x.begin(), x.end(), y.begin(), y.end()), t);
  }
  CHECK(index["metadata"]["total_size"] == sum);
  for (const auto& e : fs::directory_iterator(many.path))
    CHECK(e.path().extension() != ".tmp");
}

TEST_CASE("synth: seeds differ, bad options are refused") {
  ModelConfig c = tiny();
  c.vocab_size = 64;
  c.pad_token_id = -1; // the tiny example's pad id lies outside this vocabulary
  TempDir a, b;
  SynthOptions o;
  o.seed = 1;
  synth_checkpoint(c, a.path, o);
  o.seed = 2;
  synth_checkpoint(c, b.path, o);
  CHECK(slurp(a.path / "model-00001-of-00001.safetensors") !=
        slurp(b.path / "model-00001-of-00001.safetensors"));
  o.expert_scale_lo = 120;
  o.expert_scale_hi = 120;
  CHECK_THROWS_WITH_AS(synth_checkpoint(c, a.path, o), doctest::Contains("expert scale range"),
                       Error);
  o.expert_scale_lo = 254;
  o.expert_scale_hi = 256; // would write 0xFF, E8M0's NaN
  CHECK_THROWS_WITH_AS(synth_checkpoint(c, a.path, o), doctest::Contains("0xFF is NaN"), Error);
}

TEST_CASE("synth: a checkpoint larger than the free space is refused before anything is written") {
  ModelConfig c = tiny();
  c.num_hidden_layers = 4096; // 4096 layers of 1024 experts of 2880 x 2 * 16384: ~300 TB
  c.sliding.assign(4096, false);
  c.hidden_size = 2880;
  c.num_local_experts = 1024;
  c.intermediate_size = 16384;
  TempDir dir;
  const fs::path out = dir.path / "big";
  const std::string want = out.string() + ": the checkpoint needs";
  CHECK_THROWS_WITH_AS(synth_checkpoint(c, out, {}), doctest::Contains(want.c_str()), Error);
  CHECK_FALSE(fs::exists(out));
}

TEST_CASE("synth: SIGTERM while writing leaves no temporary behind") {
  ModelConfig c = tiny();
  c.vocab_size = 64;
  c.pad_token_id = -1;
  TempDir dir;
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    SynthOptions o;
    o.shard_size = 1; // one shard per tensor: progress is reported after each
    o.threads = 1;
    int shards = 0;
    o.progress = [&](const std::string&) {
      if (++shards == 3) // two shards complete, the third's temporary exists
        ::raise(SIGTERM);
    };
    synth_checkpoint(c, dir.path, o);
    ::_exit(0); // not reached when the signal works
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGTERM);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir.path))
    left.push_back(e.path().filename().string());
  CHECK(left.empty());
}

} // namespace
} // namespace xserv::models
