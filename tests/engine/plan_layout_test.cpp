// plan.json's stage layout (runtime::StageLayout): what compile records so that the CUDA model
// runs a plan without its graph, checked against the graph it came from, and its JSON reader.
#include <doctest/doctest.h>

#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "runtime/layout_json.h"
#include "tests/run_xserv.h"
#include "tests/test_util.h"

using namespace xserv;
namespace fs = std::filesystem;

TEST_CASE("plan layout: the tiny plan records its arena, output, caches and weights") {
  testing::TempDir dir("plan_layout");
  const std::string config = (testing::source_dir() / "examples/tiny/config.json").string();
  REQUIRE(testing::run_xserv("synth --config " + config + " -o " + (dir.path / "m").string() +
                             " --seed 1")
              .code == 0);
  const fs::path plan = dir.path / "p";
  const auto r = testing::run_xserv("compile " + (dir.path / "m").string() + " -o " +
                                    plan.string() + " --max-seq 256 --max-batch 4 --no-cubins");
  INFO(r.out);
  REQUIRE(r.code == 0);
  std::ifstream in(plan / "plan.json");
  const nlohmann::json pj = nlohmann::json::parse(in);
  const runtime::StageLayout l = runtime::stage_layout_from_json(pj["codegen"]["layout"]);
  CHECK(l.max_batch == 4);
  CHECK(l.max_seq == 256);
  CHECK(l.tokens == 256);    // the prefill chunk: min(2048, max-seq)
  CHECK_FALSE(l.gemm_split); // compile's default: plain bf16 gemm activations
  CHECK(l.arena_bytes == pj["codegen"]["arena_bytes"].get<uint64_t>());
  // Last-token logits: one row of the 201,088-token vocabulary per sequence, in the arena.
  CHECK_FALSE(l.output.per_token);
  CHECK_FALSE(l.output.sends);
  CHECK(l.output.vocab == 201088);
  CHECK(l.output.row_bytes == 201088 * 4);
  CHECK(l.output.offset + 4 * l.output.row_bytes <= l.arena_bytes);
  CHECK(l.recvs.empty());
  // Two layers, a key and a value cache each, paged in blocks of 16: the sliding one from the
  // window pool, the full one from the full pool; 2 KV heads of 16, fp32. A table covers the
  // plan's max sequence in blocks.
  CHECK(l.kv_block == 16);
  CHECK(l.table_blocks == 256 / 16);
  CHECK(l.window == 8);
  REQUIRE(l.caches.size() == 4);
  int windowed = 0;
  for (const auto& c : l.caches) {
    CHECK(c.block_shape == std::vector<int64_t>{16, 2, 16});
    CHECK(c.elem_bytes == 4);
    CHECK(c.block_bytes() == 16 * 2 * 16 * 4);
    windowed += c.window;
  }
  CHECK(windowed == 2);
  bool lm_head = false, experts = false;
  for (const auto& w : l.weights) {
    lm_head |= w.name == "lm_head.weight" && w.shape == std::vector<int64_t>{201088, 64};
    experts |= w.name == "model.layers.1.mlp.experts.down_proj" &&
               w.shape == std::vector<int64_t>{8, 64, 64};
  }
  CHECK(lm_head);
  CHECK(experts);
  CHECK(runtime::stage_layout_from_json(runtime::stage_layout_to_json(l)) == l);
}

TEST_CASE("plan layout: the reader names a missing or out-of-range field") {
  runtime::StageLayout l;
  l.max_batch = 2;
  l.max_seq = 64;
  l.tokens = 64;
  l.arena_bytes = 1 << 20;
  l.output = {0, 400, false, false, 100};
  l.kv_block = 16;
  l.table_blocks = 4;
  l.caches.push_back({{16, 1, 8}, 4, false});
  const nlohmann::json good = runtime::stage_layout_to_json(l);
  CHECK(runtime::stage_layout_from_json(good) == l);
  auto error_of = [](const nlohmann::json& j) -> std::string {
    try {
      runtime::stage_layout_from_json(j);
    } catch (const Error& e) {
      return e.what();
    }
    return "(accepted)";
  };
  nlohmann::json j = good;
  j.erase("tokens");
  CHECK(error_of(j) == "layout: tokens is missing");
  j = good;
  j["output"]["offset"] = (1 << 20) - 100; // two 400-byte rows do not fit
  CHECK(error_of(j).find("ends past the arena") != std::string::npos);
  j = good;
  j["caches"][0]["block_shape"][0] = 8; // a block of 8 positions in a layout of 16
  CHECK(error_of(j) == "layout: a cache's block is not [16, kv heads, head dim]");
  j = good;
  j["kv_block"] = 12;
  CHECK(error_of(j) == "layout: kv_block = 12 is not a power of two");
  j = good;
  j["caches"][0]["window"] = true; // the layout has no sliding window
  CHECK(error_of(j).find("has no window") != std::string::npos);
  j = good;
  j["max_batch"] = "2";
  CHECK(error_of(j) == "layout: max_batch must be an integer");
  j = good;
  j["caches"][0]["block_shape"] = nlohmann::json::array();
  CHECK(error_of(j).find("caches[].block_shape") != std::string::npos);
}
