// build_gpt_oss(): graph structure for the real configs, text round trips, and the tiny model
// run end to end on the interpreter (prefill then decode through the KV cache == one big step).
#include <doctest/doctest.h>

#include <cmath>

#include "ir/interpreter.h"
#include "models/config.h"
#include "models/gpt_oss.h"
#include "models/step.h"
#include "tests/step_input.h"
#include "tests/test_util.h"

using namespace xserv;
using models::ModelConfig;

namespace {

int count_op(const ir::Graph& g, ir::Op op) {
  int n = 0;
  for (const auto& node : g.nodes)
    n += node.op == op;
  return n;
}

int count_sliding(const ir::Graph& g) {
  int n = 0;
  for (const auto& node : g.nodes)
    n += node.op == ir::Op::Attention && node.attr_int("window") > 0;
  return n;
}

ModelConfig tiny() {
  return ModelConfig::load(testing::source_dir() / "examples/tiny");
}

} // namespace

TEST_CASE("gpt-oss-20b graph: 24 layers, 12 sliding, verified, round-trips") {
  XSERV_REQUIRE_DATA(data);
  ModelConfig c = ModelConfig::load(data / "gpt-oss-20b");
  ir::Graph g = models::build_gpt_oss(c);
  CHECK(ir::verify(g) == "");
  CHECK(count_op(g, ir::Op::Attention) == 24);
  CHECK(count_sliding(g) == 12);
  CHECK(count_op(g, ir::Op::MoeExperts) == 24);
  CHECK(count_op(g, ir::Op::KvWrite) == 48);
  CHECK(ir::parse(ir::print(g)) == g);
  // Logits for the last token of each sequence only: f32[B, vocab].
  CHECK(ir::type_str(g.type(g.outputs[0])) == "f32[B,201088]");
}

TEST_CASE("gpt-oss-120b graph: 36 layers, 18 sliding, round-trips") {
  ModelConfig c = ModelConfig::load(testing::source_dir() / "examples/gpt-oss-120b");
  ir::Graph g = models::build_gpt_oss(c, {.last_logits_only = false, .greedy = true});
  CHECK(ir::verify(g) == "");
  CHECK(count_op(g, ir::Op::Attention) == 36);
  CHECK(count_sliding(g) == 18);
  CHECK(ir::type_str(g.type(g.outputs[0])) == "f32[T,201088]");
  CHECK(ir::type_str(g.type(g.outputs[1])) == "i32[T]");
  CHECK(ir::parse(ir::print(g)) == g);
}

TEST_CASE("tiny graph round-trips and runs end to end with finite logits") {
  ir::Graph g = models::build_gpt_oss(tiny());
  CHECK(ir::verify(g) == "");
  CHECK(ir::parse(ir::print(g)) == g);
  ir::InterpretEnv env;
  env.weights = ir::random_weights(5);
  const models::KvGeometry kv = xserv::testing::row_geometry(g, 2, 32);
  env.dims = xserv::testing::pool_dims(kv);
  env.params =
      models::step_params(xserv::testing::make_step({{1, 2, 3, 4, 5}, {7, 8}}, {0, 0}, {0, 1}, kv));
  auto out = ir::interpret(g, env);
  REQUIRE(out.size() == 1);
  CHECK(out[0].shape == std::vector<int64_t>{2, 201088});
  bool finite = true;
  for (float v : out[0].f)
    finite = finite && std::isfinite(v);
  CHECK(finite);
}

TEST_CASE("prefill + decode through the cache equals one step over the whole sequence") {
  ModelConfig c = tiny(); // sliding_window 8: 14 tokens wrap the window's ring of blocks
  ir::Graph all = models::build_gpt_oss(c, {.last_logits_only = false, .greedy = false});
  ir::Graph last = models::build_gpt_oss(c);
  const std::vector<int32_t> tokens = {5, 17, 2000, 3, 99, 100000, 7, 8, 9, 201087, 0, 42, 6, 1};
  auto weights = ir::random_weights(9);

  ir::InterpretEnv whole;
  whole.weights = weights;
  using xserv::testing::make_step;
  const models::KvGeometry kv1 = xserv::testing::row_geometry(all, 1, 16);
  whole.dims = xserv::testing::pool_dims(kv1);
  whole.params = models::step_params(make_step({tokens}, {0}, {0}, kv1));
  whole.params.erase("logit_rows");
  ir::Tensor ref = ir::interpret(all, whole)[0]; // [14, V]
  const int64_t v = c.vocab_size;

  ir::InterpretEnv inc;
  inc.weights = weights;
  const models::KvGeometry kv3 = xserv::testing::row_geometry(last, 3, 16);
  inc.dims = xserv::testing::pool_dims(kv3);
  const size_t prefill = 5;
  std::vector<int32_t> head(tokens.begin(), tokens.begin() + prefill);
  inc.params = models::step_params(make_step({head}, {0}, {2}, kv3)); // row 2 of 3
  std::vector<ir::Tensor> steps = {ir::interpret(last, inc)[0]};
  for (size_t i = prefill; i < tokens.size(); ++i) {
    inc.params = models::step_params(make_step({{tokens[i]}}, {static_cast<int32_t>(i)}, {2}, kv3));
    steps.push_back(ir::interpret(last, inc)[0]);
  }
  for (size_t s = 0; s < steps.size(); ++s) {
    const size_t pos = prefill - 1 + s;
    ir::Tensor want = ir::Tensor::from_floats(
        {1, v}, std::vector<float>(ref.f.begin() + static_cast<int64_t>(pos) * v,
                                   ref.f.begin() + static_cast<int64_t>(pos + 1) * v));
    CAPTURE(pos);
    CHECK(ir::rel_l2(steps[s], want) < 1e-5);
  }
}
