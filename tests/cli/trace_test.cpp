// `xserv trace`: the residual stream layer by layer, checked against the checkpoint's embedding
// rows and against `xserv run`'s first greedy token (final norm and unembedding applied here).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "models/checkpoint.h"
#include "tests/run_xserv.h"
#include "tests/test_util.h"

using xserv::testing::read_floats;
using xserv::testing::run_xserv;
using xserv::testing::RunResult;
namespace fs = std::filesystem;

TEST_CASE("xserv trace: the embedding and every layer's output of a teacher-forced prompt") {
  xserv::testing::TempDir tmp("trace");
  const std::string model = (tmp.path / "model").string(), plan = (tmp.path / "plan").string();
  const fs::path out = tmp.path / "t.f32";
  REQUIRE(run_xserv("synth --config " +
                    (xserv::testing::source_dir() / "examples/tiny/config.json").string() + " -o " +
                    model + " --seed 4")
              .code == 0);
  REQUIRE(run_xserv(fmt::format("compile {} -o {} --no-cubins", model, plan)).code == 0);
  const std::string ids = "17,4,99,2048,5";
  RunResult r =
      run_xserv(fmt::format("trace {} --prompt-ids {} -o {}", plan, ids, out.string()), "", true);
  INFO(r.err);
  REQUIRE(r.code == 0);
  std::ifstream jin(out.string() + ".json");
  const auto meta = nlohmann::json::parse(jin);
  const auto ck = xserv::models::Checkpoint::open(model, {.map_data = true, .validate = true});
  const auto& c = ck.config();
  const int64_t tokens = 5, hidden = c.hidden_size, layers = c.num_hidden_layers;
  CHECK(meta["tokens"] == tokens);
  CHECK(meta["hidden"] == hidden);
  REQUIRE(meta["values"].size() == size_t(layers + 1));
  CHECK(meta["values"][0] == "embedding");
  CHECK(meta["values"][size_t(layers)] == fmt::format("layer {}", layers - 1));
  const std::vector<float> x = read_floats(out);
  REQUIRE(x.size() == size_t((layers + 1) * tokens * hidden));

  // The embedding rows are the checkpoint's bf16 rows, widened.
  const std::vector<float> table = ck.read_bf16("model.embed_tokens.weight");
  const int ids_v[] = {17, 4, 99, 2048, 5};
  for (int t = 0; t < tokens; ++t)
    for (int64_t d = 0; d < hidden; ++d)
      CHECK(x[size_t(t * hidden + d)] == table[size_t(ids_v[t] * hidden + d)]);

  // The last layer's output at the last position, normalised and unembedded here, picks the
  // token `xserv run` generates first from the same prompt.
  const std::vector<float> norm = ck.read_bf16("model.norm.weight");
  const std::vector<float> head = ck.read_bf16("lm_head.weight");
  const float* last = x.data() + size_t((layers * tokens + tokens - 1) * hidden);
  double ss = 0;
  for (int64_t d = 0; d < hidden; ++d)
    ss += double(last[d]) * last[d];
  const double inv = 1.0 / std::sqrt(ss / double(hidden) + c.rms_norm_eps);
  int64_t best = 0;
  double best_v = -1e300;
  for (int64_t v = 0; v < c.vocab_size; ++v) {
    double a = 0;
    for (int64_t d = 0; d < hidden; ++d)
      a += double(head[size_t(v * hidden + d)]) * last[d] * inv * norm[size_t(d)];
    if (a > best_v) {
      best_v = a;
      best = v;
    }
  }
  RunResult run = run_xserv(
      fmt::format("run {} --backend cpu --prompt-ids {} --max-tokens 1", plan, ids), "", true);
  REQUIRE(run.code == 0);
  CHECK(run.out.substr(0, run.out.find_first_of(",\n")) == std::to_string(best));

  // A checkpoint directory is not a plan; -o is required; the GPU path says when there is none.
  RunResult dir = run_xserv(fmt::format("trace {} --prompt-ids 1 -o x.f32", model), "", true);
  CHECK(dir.code == 2);
  CHECK(dir.err.find("`xserv compile MODEL_DIR -o PLAN` first") != std::string::npos);
  RunResult no_out = run_xserv(fmt::format("trace {} --prompt-ids 1", plan), "", true);
  CHECK(no_out.code == 2);
  CHECK(no_out.err.find("needs -o FILE") != std::string::npos);
  const std::string nowhere = (tmp.path / "no-such-dir" / "t.f32").string();
  RunResult bad = run_xserv(fmt::format("trace {} --prompt-ids 1 -o {}", plan, nowhere), "", true);
  CHECK(bad.code == 1);
  CHECK(bad.err.find("cannot write " + nowhere) != std::string::npos);
  RunResult bad_run = run_xserv(
      fmt::format("run {} --backend cpu --prompt-ids 1 --logits-out {}", plan, nowhere), "", true);
  CHECK(bad_run.code == 1);
  CHECK(bad_run.err.find("--logits-out: cannot write " + nowhere) != std::string::npos);
}
