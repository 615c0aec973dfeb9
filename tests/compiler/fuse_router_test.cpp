// fuse_router: the router projection + router_topk becoming one router, the cases it must leave
// alone, and the interpreter giving the same weights and expert ids before and after.
#include <doctest/doctest.h>

#include "compiler/fuse_router.h"
#include "tests/compiler/fusion_test_util.h"

using namespace xserv;
using testing::fused_equivalent;
using testing::run_fusion;

TEST_CASE("fuse_router folds the logits projection into top-k + softmax") {
  ir::Graph in = ir::parse(R"(
    %x = param() {name="x"} : f32[T,16]
    %wr = weight() {name="wr"} : bf16[8,16]
    %br = weight() {name="br"} : bf16[8]
    %r = linear(%x, %wr, %br) : f32[T,8]
    %top = router_topk(%r) {k=2} : (f32[T,2], i32[T,2])
    %w = extract(%top) {index=0} : f32[T,2]
    %ids = extract(%top) {index=1} : i32[T,2]
    return %w, %ids
  )");
  auto out = run_fusion(&compiler::fuse_router, in);
  CHECK(out.changed);
  CHECK(ir::print(out.graph) == "%0 = param() {name=\"x\"} : f32[T,16]\n"
                                "%1 = weight() {name=\"wr\"} : bf16[8,16]\n"
                                "%2 = weight() {name=\"br\"} : bf16[8]\n"
                                "%3 = router(%0, %1, %2) {k=2} : (f32[T,2], i32[T,2])\n"
                                "%4 = extract(%3) {index=0} : f32[T,2]\n"
                                "%5 = extract(%3) {index=1} : i32[T,2]\n"
                                "return %4, %5\n");
  CHECK(fused_equivalent(in, out.graph, 41) == "");
}

TEST_CASE("fuse_router without a bias") {
  ir::Graph in = ir::parse(R"(
    %x = param() {name="x"} : f32[T,16]
    %wr = weight() {name="wr"} : bf16[6,16]
    %r = linear(%x, %wr) : f32[T,6]
    %top = router_topk(%r) {k=3} : (f32[T,3], i32[T,3])
    %ids = extract(%top) {index=1} : i32[T,3]
    return %ids
  )");
  auto out = run_fusion(&compiler::fuse_router, in);
  CHECK(out.changed);
  CHECK(ir::print_node(out.graph, 2) == "%2 = router(%0, %1) {k=3} : (f32[T,3], i32[T,3])");
  CHECK(fused_equivalent(in, out.graph, 42) == "");
}

TEST_CASE("fuse_router leaves logits that are read elsewhere, or not made by a linear") {
  SUBCASE("the logits are also returned") {
    ir::Graph in = ir::parse(R"(
      %x = param() {name="x"} : f32[T,16]
      %wr = weight() {name="wr"} : bf16[8,16]
      %r = linear(%x, %wr) : f32[T,8]
      %top = router_topk(%r) {k=2} : (f32[T,2], i32[T,2])
      %w = extract(%top) {index=0} : f32[T,2]
      return %w, %r
    )");
    CHECK_FALSE(compiler::fuse_router(in, {}).changed);
  }
  SUBCASE("the logits come from an add") {
    ir::Graph in = ir::parse(R"(
      %x = param() {name="x"} : f32[T,8]
      %r = add(%x, %x) : f32[T,8]
      %top = router_topk(%r) {k=2} : (f32[T,2], i32[T,2])
      %w = extract(%top) {index=0} : f32[T,2]
      return %w
    )");
    CHECK_FALSE(compiler::fuse_router(in, {}).changed);
  }
}
