// The cleanup passes (dce, cse): text in -> pass -> verify -> expected text, changed flag, and
// the interpreter giving the same outputs before and after.
#include <string>

#include <doctest/doctest.h>

#include "compiler/cse.h"
#include "compiler/dce.h"
#include "ir/interpreter.h"

using namespace xserv;
using compiler::PassOptions;

namespace {

/// interpret(before) == interpret(after) bitwise, outputs and caches, on random inputs and
/// weights: dce and cse only remove nodes, so nothing is computed differently.
std::string equivalent(const ir::Graph& a, const ir::Graph& b, uint64_t seed) {
  ir::InterpretEnv env;
  env.params = ir::random_params(a, {{"T", 5}}, seed);
  env.weights = ir::random_weights(seed + 1);
  return ir::compare_runs(a, b, env, /*rtol=*/0);
}

/// Inputs for a graph with one paged cache k_cache[NB=2 blocks of 16]: 5 tokens of one sequence
/// at positions 0..4 in block 1, random keys.
ir::InterpretEnv kv_env(const ir::Graph& g) {
  ir::InterpretEnv env;
  env.params = ir::random_params(g, {{"T", 5}, {"B", 1}, {"MB", 1}}, 4, /*int_hi=*/1);
  env.params.at("positions").i = {0, 1, 2, 3, 4};
  env.params.at("block_table").i = {1};
  env.dims = {{"NB", 2}};
  return env;
}

const char* kDeadBranch = R"(
  %x = param() {name="x"} : f32[T,64]
  %ln = weight() {name="ln"} : bf16[64]
  %w = weight() {name="w"} : bf16[32,64]
  %n = rms_norm(%x, %ln) {eps=1e-05} : f32[T,64]
  %unused = linear(%n, %w) : f32[T,32]
  %y = add(%n, %x) : f32[T,64]
  return %y
)";

} // namespace

TEST_CASE("dce removes values that reach no output") {
  ir::Graph in = ir::parse(kDeadBranch);
  auto out = compiler::dce(in, PassOptions{});
  CHECK(out.changed);
  CHECK(ir::verify(out.graph) == "");
  CHECK(ir::print(out.graph) == "%0 = param() {name=\"x\"} : f32[T,64]\n"
                                "%1 = weight() {name=\"ln\"} : bf16[64]\n"
                                "%2 = rms_norm(%0, %1) {eps=1e-05} : f32[T,64]\n"
                                "%3 = add(%2, %0) : f32[T,64]\n"
                                "return %3\n");
  CHECK(equivalent(in, out.graph, 3) == "");
  auto again = compiler::dce(out.graph, PassOptions{});
  CHECK_FALSE(again.changed);
  CHECK(again.graph == out.graph);
}

TEST_CASE("dce keeps cache writes, whose effect outlives the step") {
  ir::Graph in = ir::parse(R"(
    %pos = param() {name="positions"} : i32[T]
    %seq = param() {name="token_seq"} : i32[T]
    %rows = param() {name="block_table"} : i32[B,MB]
    %k = param() {name="k"} : f32[T,2,8]
    %c = cache() {name="k_cache"} : bf16[NB,16,2,8]
    %w = kv_write(%c, %k, %pos, %seq, %rows) : bf16[NB,16,2,8]
    %dead = add(%k, %k) : f32[T,2,8]
    return
  )");
  auto out = compiler::dce(in, PassOptions{});
  CHECK(out.changed);
  REQUIRE(out.graph.size() == 6);
  CHECK(out.graph.nodes.back().op == ir::Op::KvWrite);
  // The cache holds the same keys afterwards: compare_runs compares the caches too.
  ir::InterpretEnv env = kv_env(in);
  CHECK(ir::compare_runs(in, out.graph, env, /*rtol=*/0) == "");
}

TEST_CASE("compare_runs reports a dropped or misrouted cache write though outputs agree") {
  const char* head = R"(
    %pos = param() {name="positions"} : i32[T]
    %seq = param() {name="token_seq"} : i32[T]
    %rows = param() {name="block_table"} : i32[B,MB]
    %k = param() {name="k"} : f32[T,2,8]
    %c = cache() {name="k_cache"} : bf16[NB,16,2,8]
  )";
  ir::Graph in = ir::parse(std::string(head) + R"(
    %w = kv_write(%c, %k, %pos, %seq, %rows) : bf16[NB,16,2,8]
    %y = add(%k, %k) : f32[T,2,8]
    return %y
  )");
  ir::Graph dropped = ir::parse(std::string(head) + R"(
    %y = add(%k, %k) : f32[T,2,8]
    return %y
  )");
  ir::Graph misrouted = ir::parse(std::string(head) + R"(
    %k2 = add(%k, %k) : f32[T,2,8]
    %w = kv_write(%c, %k2, %pos, %seq, %rows) : bf16[NB,16,2,8]
    %y = add(%k, %k) : f32[T,2,8]
    return %y
  )");
  ir::InterpretEnv env = kv_env(in);
  CHECK(ir::compare_runs(in, in, env, 0) == "");
  CHECK(ir::compare_runs(in, dropped, env, 0).find("cache 'k_cache'") == 0);
  CHECK(ir::compare_runs(in, misrouted, env, 0).find("cache 'k_cache'") == 0);
  // Keys doubled: relative L2 0.5 against the second run's cache.
  CHECK(ir::compare_runs(in, misrouted, env, 0.4).find("cache 'k_cache': relative L2 0.5") == 0);
}

TEST_CASE("cse merges identical pure nodes, including duplicate weights") {
  ir::Graph in = ir::parse(R"(
    %x = param() {name="x"} : f32[T,64]
    %w1 = weight() {name="w"} : bf16[32,64]
    %w2 = weight() {name="w"} : bf16[32,64]
    %a = linear(%x, %w1) : f32[T,32]
    %b = linear(%x, %w2) : f32[T,32]
    %c = linear(%x, %w1) : f32[T,32]
    %s = add(%a, %b) : f32[T,32]
    %t = add(%s, %c) : f32[T,32]
    return %t
  )");
  auto out = compiler::cse(in, PassOptions{});
  CHECK(out.changed);
  CHECK(ir::verify(out.graph) == "");
  CHECK(ir::print(out.graph) == "%0 = param() {name=\"x\"} : f32[T,64]\n"
                                "%1 = weight() {name=\"w\"} : bf16[32,64]\n"
                                "%2 = linear(%0, %1) : f32[T,32]\n"
                                "%3 = add(%2, %2) : f32[T,32]\n"
                                "%4 = add(%3, %2) : f32[T,32]\n"
                                "return %4\n");
  CHECK(equivalent(in, out.graph, 4) == "");
  CHECK_FALSE(compiler::cse(out.graph, PassOptions{}).changed);
}

TEST_CASE("cse leaves nodes with different attributes and stateful nodes alone") {
  ir::Graph in = ir::parse(R"(
    %x = param() {name="x"} : f32[T,64]
    %ln = weight() {name="ln"} : bf16[64]
    %a = rms_norm(%x, %ln) {eps=1e-05} : f32[T,64]
    %b = rms_norm(%x, %ln) {eps=1e-06} : f32[T,64]
    %c1 = cache() {name="c1"} : bf16[N,4,1,64]
    %c2 = cache() {name="c2"} : bf16[N,4,1,64]
    %s = add(%a, %b) : f32[T,64]
    return %s
  )");
  auto out = compiler::cse(in, PassOptions{});
  CHECK_FALSE(out.changed);
  CHECK(out.graph == in);
}
