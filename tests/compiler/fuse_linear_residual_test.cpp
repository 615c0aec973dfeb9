// fuse_linear_residual: add(h, linear) becoming linear_residual, the cases it must leave alone,
// and the interpreter giving the same outputs before and after.
#include <doctest/doctest.h>

#include "compiler/fuse_linear_residual.h"
#include "tests/compiler/fusion_test_util.h"

using namespace xserv;
using testing::fused_equivalent;
using testing::run_fusion;

TEST_CASE("fuse_linear_residual folds the residual add into the projection, either order") {
  ir::Graph in = ir::parse(R"(
    %h = param() {name="h"} : f32[T,16]
    %a = param() {name="a"} : f32[T,8]
    %wo = weight() {name="wo"} : bf16[16,8]
    %bo = weight() {name="bo"} : bf16[16]
    %o = linear(%a, %wo, %bo) : f32[T,16]
    %h1 = add(%h, %o) : f32[T,16]
    %w2 = weight() {name="w2"} : bf16[16,16]
    %p = linear(%h1, %w2) : f32[T,16]
    %h2 = add(%p, %h1) : f32[T,16]
    return %h2
  )");
  auto out = run_fusion(&compiler::fuse_linear_residual, in);
  CHECK(out.changed);
  CHECK(ir::print(out.graph) == "%0 = param() {name=\"h\"} : f32[T,16]\n"
                                "%1 = param() {name=\"a\"} : f32[T,8]\n"
                                "%2 = weight() {name=\"wo\"} : bf16[16,8]\n"
                                "%3 = weight() {name=\"bo\"} : bf16[16]\n"
                                "%4 = linear_residual(%1, %2, %3, %0) : f32[T,16]\n"
                                "%5 = weight() {name=\"w2\"} : bf16[16,16]\n"
                                "%6 = linear_residual(%4, %5, %4) : f32[T,16]\n"
                                "return %6\n");
  CHECK(fused_equivalent(in, out.graph, 31) == "");
}

TEST_CASE("fuse_linear_residual leaves a linear with other readers, and other adds, alone") {
  SUBCASE("the projection is also returned") {
    ir::Graph in = ir::parse(R"(
      %h = param() {name="h"} : f32[T,16]
      %w = weight() {name="w"} : bf16[16,16]
      %o = linear(%h, %w) : f32[T,16]
      %s = add(%h, %o) : f32[T,16]
      return %s, %o
    )");
    CHECK_FALSE(compiler::fuse_linear_residual(in, {}).changed);
  }
  SUBCASE("the projection feeds two adds") {
    ir::Graph in = ir::parse(R"(
      %h = param() {name="h"} : f32[T,16]
      %g = param() {name="g"} : f32[T,16]
      %w = weight() {name="w"} : bf16[16,16]
      %o = linear(%h, %w) : f32[T,16]
      %s = add(%h, %o) : f32[T,16]
      %t = add(%g, %o) : f32[T,16]
      return %s, %t
    )");
    CHECK_FALSE(compiler::fuse_linear_residual(in, {}).changed);
  }
  SUBCASE("an add of a projection with itself, and of two params") {
    ir::Graph in = ir::parse(R"(
      %h = param() {name="h"} : f32[T,16]
      %w = weight() {name="w"} : bf16[16,16]
      %o = linear(%h, %w) : f32[T,16]
      %s = add(%o, %o) : f32[T,16]
      %t = add(%h, %s) : f32[T,16]
      return %t
    )");
    CHECK_FALSE(compiler::fuse_linear_residual(in, {}).changed);
  }
}

TEST_CASE("fuse_linear_residual fuses one side of an add of two projections") {
  ir::Graph in = ir::parse(R"(
    %x = param() {name="x"} : f32[T,3,8]
    %w1 = weight() {name="w1"} : bf16[16,8]
    %w2 = weight() {name="w2"} : bf16[16,8]
    %b2 = weight() {name="b2"} : bf16[16]
    %a = linear(%x, %w1) : f32[T,3,16]
    %b = linear(%x, %w2, %b2) : f32[T,3,16]
    %s = add(%a, %b) : f32[T,3,16]
    return %s
  )");
  auto out = run_fusion(&compiler::fuse_linear_residual, in);
  CHECK(out.changed);
  CHECK(ir::print_node(out.graph, out.graph.outputs[0]) ==
        "%5 = linear_residual(%0, %2, %3, %4) : f32[T,3,16]");
  CHECK(fused_equivalent(in, out.graph, 32) == "");
}
