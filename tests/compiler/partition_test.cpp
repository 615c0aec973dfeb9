// partition_pipeline(): stage ranges from the cost model, send/recv at every boundary, and the
// stages chained through the interpreter equal to the whole graph, prefill and decode, bit for
// bit (the same ops on the same values in the same order).
#include <doctest/doctest.h>

#include <algorithm>

#include "compiler/partition.h"
#include "compiler/pass.h"
#include "compiler/pass_manager.h"
#include "ir/interpreter.h"
#include "models/config.h"
#include "models/gpt_oss.h"
#include "models/step.h"
#include "tests/step_input.h"
#include "tests/test_util.h"

using namespace xserv;

namespace {

models::ModelConfig tiny() {
  return models::ModelConfig::load(testing::source_dir() / "examples/tiny");
}

/// The tiny model with `layers` layers (alternating sliding / full attention).
models::ModelConfig tiny_layers(int layers) {
  models::ModelConfig c = tiny();
  c.num_hidden_layers = layers;
  c.sliding.clear();
  for (int l = 0; l < layers; ++l)
    c.sliding.push_back(l % 2 == 0);
  return c;
}

ir::Graph fused(const ir::Graph& g) {
  compiler::PassManager pm;
  pm.add_passes(compiler::kDefaultPasses);
  return pm.run(g);
}

int count_op(const ir::Graph& g, ir::Op op) {
  return static_cast<int>(std::count_if(g.nodes.begin(), g.nodes.end(),
                                        [op](const ir::Node& n) { return n.op == op; }));
}

/// A prefill of two sequences and three decode steps through the whole graph and through the
/// stages: logits and every cache identical.
void check_chained(const ir::Graph& g, int stages) {
  const compiler::Partition p = compiler::partition_pipeline(g, stages, {{"NB", 1}, {"NW", 1}});
  REQUIRE(p.stages.size() == size_t(stages));
  auto weights = ir::random_weights(21);
  ir::InterpretEnv whole, split;
  const models::KvGeometry kv = xserv::testing::row_geometry(g, 2, 16);
  for (ir::InterpretEnv* env : {&whole, &split}) {
    env->weights = weights;
    env->dims = xserv::testing::pool_dims(kv);
  }
  using xserv::testing::make_step;
  const std::vector<std::vector<int32_t>> prompts = {{5, 17, 2000, 3, 99, 12, 8, 1, 4, 9},
                                                     {7, 201087, 0, 42}};
  std::vector<models::StepInput> steps = {make_step(prompts, {0, 0}, {1, 0}, kv)};
  for (int32_t s = 0; s < 3; ++s)
    steps.push_back(make_step({{100 + s}, {200 + s}}, {10 + s, 4 + s}, {1, 0}, kv));
  for (size_t s = 0; s < steps.size(); ++s) {
    CAPTURE(s);
    whole.params = split.params = models::step_params(steps[s]);
    const ir::Tensor want = ir::interpret(g, whole)[0];
    const ir::Tensor got = ir::interpret_stages(p.stages, split)[0];
    REQUIRE(got.shape == want.shape);
    CHECK(got.f == want.f);
  }
  CHECK(split.state.size() == whole.state.size());
  for (const auto& [name, cache] : whole.state) {
    CAPTURE(name);
    REQUIRE(split.state.count(name) == 1);
    CHECK(split.state.at(name)->f == cache->f);
  }
}

} // namespace

TEST_CASE("partition: two stages of the tiny model, one boundary value each way") {
  const ir::Graph g = models::build_gpt_oss(tiny());
  const compiler::Partition p = compiler::partition_pipeline(g, 2, {{"NB", 1}, {"NW", 1}});
  REQUIRE(p.stages.size() == 2);
  CHECK(p.info[0].first_layer == 0);
  CHECK(p.info[0].last_layer == 0);
  CHECK(p.info[1].first_layer == 1);
  CHECK(p.info[1].last_layer == 1);
  CHECK(p.info[0].embedding);
  CHECK_FALSE(p.info[0].head);
  CHECK(p.info[1].head);
  // Only the residual stream crosses: one send, one recv, the same name and type.
  CHECK(count_op(p.stages[0], ir::Op::Send) == 1);
  CHECK(count_op(p.stages[0], ir::Op::Recv) == 0);
  CHECK(count_op(p.stages[1], ir::Op::Recv) == 1);
  CHECK(count_op(p.stages[1], ir::Op::Send) == 0);
  const ir::Node& send = p.stages[0].node(p.stages[0].outputs.at(0));
  CHECK(send.op == ir::Op::Send);
  CHECK(send.attr_int("peer") == 1);
  const auto recv = std::find_if(p.stages[1].nodes.begin(), p.stages[1].nodes.end(),
                                 [](const ir::Node& n) { return n.op == ir::Op::Recv; });
  CHECK(recv->attr_str("name") == send.attr_str("name"));
  CHECK(recv->attr_int("peer") == 0);
  CHECK(recv->type() == send.type());
  // Each weight lives in exactly one stage; the stages' weights add up to the model's.
  int weights = 0;
  for (const ir::Graph& s : p.stages)
    weights += count_op(s, ir::Op::Weight);
  CHECK(weights == count_op(g, ir::Op::Weight));
  // Each stage round-trips through the text form.
  for (const ir::Graph& s : p.stages)
    CHECK(ir::parse(ir::print(s)) == s);
  MESSAGE(compiler::describe(p));
}

TEST_CASE("partition: chained stages equal the whole graph, before and after fusion") {
  check_chained(models::build_gpt_oss(tiny()), 2);
  check_chained(fused(models::build_gpt_oss(tiny())), 2);
  check_chained(fused(models::build_gpt_oss(tiny_layers(5))), 3); // uneven: 5 layers, 3 stages
  check_chained(fused(models::build_gpt_oss(tiny_layers(4))), 4); // one layer per stage
}

TEST_CASE("partition: contiguous ranges covering every layer, more stages than layers refused") {
  const ir::Graph g = fused(models::build_gpt_oss(tiny_layers(7)));
  for (int n = 1; n <= 7; ++n) {
    CAPTURE(n);
    const compiler::Partition p = compiler::partition_pipeline(g, n);
    int next = 0;
    for (const compiler::StageInfo& s : p.info) {
      CHECK(s.first_layer == next);
      CHECK(s.last_layer >= s.first_layer);
      next = s.last_layer + 1;
    }
    CHECK(next == 7);
    CHECK(p.imbalance >= 0);
  }
  CHECK_THROWS_WITH(compiler::partition_pipeline(g, 8),
                    "cannot split 7 layers into 8 pipeline stages: --pp must be 1 to 7");
  CHECK_THROWS_WITH(compiler::partition_pipeline(g, 0),
                    "cannot split 7 layers into 0 pipeline stages: --pp must be 1 to 7");
  const compiler::Partition two = compiler::partition_pipeline(g, 2);
  CHECK_THROWS_WITH(compiler::partition_pipeline(two.stages[0], 2),
                    doctest::Contains("already partitioned"));
}

TEST_CASE("partition: gpt-oss-20b balanced by the cost model, lm_head weighing on the last stage") {
  XSERV_REQUIRE_DATA(data);
  const ir::Graph g = fused(models::build_gpt_oss(models::ModelConfig::load(data / "gpt-oss-20b")));
  const compiler::Partition one = compiler::partition_pipeline(g, 1, {{"NB", 1}, {"NW", 1}});
  for (int n : {2, 4}) {
    CAPTURE(n);
    const compiler::Partition p = compiler::partition_pipeline(g, n, {{"NB", 1}, {"NW", 1}});
    MESSAGE("gpt-oss-20b, pp ", n, ":\n", compiler::describe(p));
    int64_t weights = 0, kv = 0, decode = 0;
    for (const compiler::StageInfo& s : p.info) {
      weights += s.weight_bytes;
      kv += s.kv_bytes;
      decode += s.decode_bytes;
    }
    CHECK(weights == one.info[0].weight_bytes);
    CHECK(kv == one.info[0].kv_bytes);
    CHECK(decode == one.info[0].decode_bytes);
    // The 1.16 GB lm_head is read every token: the last stage takes fewer layers.
    const compiler::StageInfo& last = p.info.back();
    CHECK(last.last_layer - last.first_layer + 1 < 24 / n);
    // 24 equal layers plus embedding and head: balanced to within one layer's cost.
    CHECK(p.imbalance < 0.5 * n / 24.0 + 0.02);
  }
}
