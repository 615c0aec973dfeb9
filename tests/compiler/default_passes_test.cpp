// The default pass list on whole gpt-oss graphs: every fused op where expected, fewer
// nodes, the same answers as the unfused graph through prefill and decode, text round trips.
#include <doctest/doctest.h>

#include <map>

#include "compiler/pass_manager.h"
#include "ir/interpreter.h"
#include "models/config.h"
#include "models/gpt_oss.h"
#include "models/step.h"
#include "tests/step_input.h"
#include "tests/test_util.h"

using namespace xserv;

namespace {

std::map<ir::Op, int> op_counts(const ir::Graph& g) {
  std::map<ir::Op, int> n;
  for (const auto& node : g.nodes)
    ++n[node.op];
  return n;
}

ir::Graph run_default(const ir::Graph& g) {
  compiler::PassManagerOptions opts;
  opts.verify_after_all = true;
  compiler::PassManager pm(opts);
  pm.add_passes(compiler::kDefaultPasses);
  return pm.run(g);
}

/// The ops a gpt-oss layer fuses into, `layers` of each; and none of what they replace left.
void check_fused_layers(const ir::Graph& g, int layers) {
  auto n = op_counts(g);
  CHECK(n[ir::Op::QkvRope] == layers);
  CHECK(n[ir::Op::Router] == layers);
  CHECK(n[ir::Op::LinearResidual] == layers);
  CHECK(n[ir::Op::MoeExpertsResidual] == layers);
  CHECK(n[ir::Op::Attention] == layers);
  CHECK(n[ir::Op::KvWrite] == 2 * layers);
  CHECK(n[ir::Op::RopeYarn] == 0);
  CHECK(n[ir::Op::RouterTopK] == 0);
  CHECK(n[ir::Op::MoeExperts] == 0);
  CHECK(n[ir::Op::Add] == 0);
  // Left: the post-attention norm (it feeds the router and the experts) and the final norm.
  CHECK(n[ir::Op::RmsNorm] == layers + 1);
}

models::ModelConfig tiny() {
  return models::ModelConfig::load(testing::source_dir() / "examples/tiny");
}

} // namespace

TEST_CASE("default passes on the tiny model: fused ops, fewer nodes, a fixed point") {
  ir::Graph g = models::build_gpt_oss(tiny());
  ir::Graph out = run_default(g);
  CHECK(ir::verify(out) == "");
  check_fused_layers(out, 2);
  CHECK(op_counts(out)[ir::Op::RmsNormLinear] == 0); // select_rows sits between norm and lm_head
  MESSAGE("tiny: ", g.size(), " nodes -> ", out.size());
  CHECK(out.size() < g.size());
  CHECK(ir::parse(ir::print(out)) == out);
  CHECK(run_default(out) == out);

  // With logits for every token the final norm feeds lm_head directly.
  ir::Graph all = models::build_gpt_oss(tiny(), {.last_logits_only = false, .greedy = true});
  ir::Graph all_out = run_default(all);
  CHECK(op_counts(all_out)[ir::Op::RmsNormLinear] == 1);
  CHECK(op_counts(all_out)[ir::Op::RmsNorm] == 2);
  ir::InterpretEnv env;
  env.weights = ir::random_weights(6);
  const models::KvGeometry kv = xserv::testing::row_geometry(all, 1, 16);
  env.dims = xserv::testing::pool_dims(kv);
  env.params = models::step_params(xserv::testing::make_step({{3, 1, 4, 1, 5, 9}}, {0}, {0}, kv));
  env.params.erase("logit_rows");
  // Bitwise, outputs and caches (measured difference 0: fused ops share the plain ops' code).
  CHECK(ir::compare_runs(all, all_out, env, /*rtol=*/0) == "");
}

TEST_CASE("default passes on the tiny model: prefill + decode through the cache unchanged") {
  ir::Graph g = models::build_gpt_oss(tiny());
  ir::Graph fused = run_default(g);
  auto weights = ir::random_weights(13);
  ir::InterpretEnv plain_env, fused_env;
  const models::KvGeometry kv = xserv::testing::row_geometry(g, 2, 16);
  for (ir::InterpretEnv* env : {&plain_env, &fused_env}) {
    env->weights = weights;
    env->dims = xserv::testing::pool_dims(kv);
  }
  // Two sequences: a 5-token prefill, then 3 decode steps, each on its own cache row.
  using xserv::testing::make_step;
  const std::vector<std::vector<int32_t>> prompts = {{5, 17, 2000, 3, 99}, {7, 201087, 0, 42, 6}};
  std::vector<models::StepInput> steps = {make_step(prompts, {0, 0}, {1, 0}, kv)};
  for (int32_t s = 0; s < 3; ++s)
    steps.push_back(make_step({{100 + s}, {200 + s}}, {5 + s, 5 + s}, {1, 0}, kv));
  for (size_t s = 0; s < steps.size(); ++s) {
    CAPTURE(s);
    plain_env.params = fused_env.params = models::step_params(steps[s]);
    ir::Tensor want = ir::interpret(g, plain_env)[0];
    ir::Tensor got = ir::interpret(fused, fused_env)[0];
    REQUIRE(got.shape == want.shape);
    CHECK(got.f == want.f); // exact: fused ops share the plain ops' code (measured difference 0)
  }
  // Both graphs wrote the same keys and values.
  for (const auto& [name, cache] : plain_env.state) {
    CAPTURE(name);
    REQUIRE(fused_env.state.count(name) == 1);
    CHECK(fused_env.state[name]->f == cache->f);
  }
}

TEST_CASE("default passes on gpt-oss-20b: 24 of each fused op, verified, round-trips") {
  XSERV_REQUIRE_DATA(data);
  ir::Graph g = models::build_gpt_oss(models::ModelConfig::load(data / "gpt-oss-20b"));
  ir::Graph out = run_default(g);
  CHECK(ir::verify(out) == "");
  check_fused_layers(out, 24);
  MESSAGE("gpt-oss-20b: ", g.size(), " nodes -> ", out.size());
  CHECK(out.size() < g.size());
  CHECK(ir::parse(ir::print(out)) == out);
}
