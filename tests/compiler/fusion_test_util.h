// Helpers shared by the fusion pass tests: run a pass with checks, compare graphs numerically.
#pragma once

#include <string>

#include <doctest/doctest.h>

#include "compiler/pass.h"
#include "ir/interpreter.h"

namespace xserv::testing {

/// interpret(a) == interpret(b) within 1e-5 relative L2 on random params (T = 5) and weights;
/// "" when they agree, else what differs.
inline std::string fused_equivalent(const ir::Graph& a, const ir::Graph& b, uint64_t seed) {
  ir::InterpretEnv env;
  env.params = ir::random_params(a, {{"T", 5}}, seed);
  env.weights = ir::random_weights(seed + 1);
  return ir::compare_runs(a, b, env, 1e-5);
}

/// Runs `pass` on the text IR `in`; the result must verify and a second run must change
/// nothing (a fused graph is a fixed point).
inline compiler::PassResult run_fusion(compiler::PassFn pass, const ir::Graph& in) {
  compiler::PassResult out = pass(in, compiler::PassOptions{});
  CHECK(ir::verify(out.graph) == "");
  compiler::PassResult again = pass(out.graph, compiler::PassOptions{});
  CHECK_FALSE(again.changed);
  CHECK(again.graph == out.graph);
  return out;
}

} // namespace xserv::testing
