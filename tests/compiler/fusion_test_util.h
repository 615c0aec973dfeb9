// Helpers shared by the fusion pass tests: run a pass with checks, compare graphs numerically.
#pragma once

#include <string>

#include <doctest/doctest.h>

#include "compiler/pass.h"
#include "ir/interpreter.h"

namespace xserv::testing {

/// interpret(a) == interpret(b) bitwise, outputs and caches, on random params (T = 5) and
/// weights; "" when they agree, else what differs. Exact because each fused reference op runs
/// the plain ops' code (ir/reference_fused.cpp) in the same order: measured difference 0 on
/// every fusion test, so an error as small as eps 1e-5 -> 1e-6 in a rewrite fails.
inline std::string fused_equivalent(const ir::Graph& a, const ir::Graph& b, uint64_t seed) {
  ir::InterpretEnv env;
  env.params = ir::random_params(a, {{"T", 5}}, seed);
  env.weights = ir::random_weights(seed + 1);
  return ir::compare_runs(a, b, env, /*rtol=*/0);
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
