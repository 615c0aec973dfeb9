// fuse_moe_residual: add(h, moe_experts) becoming moe_experts_residual, the cases it must leave
// alone, and the interpreter giving the same outputs before and after.
#include <doctest/doctest.h>

#include <string>

#include "compiler/fuse_moe_residual.h"
#include "tests/compiler/fusion_test_util.h"

using namespace xserv;
using testing::fused_equivalent;
using testing::run_fusion;

namespace {

/// 8 experts, width 8, intermediate 8, top-2; routing from params (ids uniform in [0, 8)).
/// `tail` holds the lines after the moe_experts node, the return included.
std::string moe(const std::string& tail) {
  return std::string(R"(
  %h = param() {name="h"} : f32[T,8]
  %x = param() {name="x"} : f32[T,8]
  %rw = param() {name="rw"} : f32[T,2]
  %ids = param() {name="ids"} : i32[T,2]
  %gu = weight() {name="gate_up"} : bf16[8,16,8]
  %gub = weight() {name="gate_up_bias"} : bf16[8,16]
  %dn = weight() {name="down"} : bf16[8,8,8]
  %dnb = weight() {name="down_bias"} : bf16[8,8]
  %m = moe_experts(%x, %rw, %ids, %gu, %gub, %dn, %dnb) {alpha=1.702, limit=7.0} : f32[T,8]
)") + tail;
}

} // namespace

TEST_CASE("fuse_moe_residual folds the residual add into the expert combine") {
  ir::Graph in = ir::parse(moe("  %s = add(%h, %m) : f32[T,8]\n  return %s\n"));
  auto out = run_fusion(&compiler::fuse_moe_residual, in);
  CHECK(out.changed);
  CHECK(ir::print(out.graph) ==
        "%0 = param() {name=\"h\"} : f32[T,8]\n"
        "%1 = param() {name=\"x\"} : f32[T,8]\n"
        "%2 = param() {name=\"rw\"} : f32[T,2]\n"
        "%3 = param() {name=\"ids\"} : i32[T,2]\n"
        "%4 = weight() {name=\"gate_up\"} : bf16[8,16,8]\n"
        "%5 = weight() {name=\"gate_up_bias\"} : bf16[8,16]\n"
        "%6 = weight() {name=\"down\"} : bf16[8,8,8]\n"
        "%7 = weight() {name=\"down_bias\"} : bf16[8,8]\n"
        "%8 = moe_experts_residual(%1, %2, %3, %4, %5, %6, %7, %0) {alpha=1.702, limit=7.0} "
        ": f32[T,8]\n"
        "return %8\n");
  CHECK(fused_equivalent(in, out.graph, 51) == "");
}

TEST_CASE("fuse_moe_residual with the experts' output as the add's first operand") {
  ir::Graph in = ir::parse(moe("  %s = add(%m, %x) : f32[T,8]\n  return %s\n"));
  auto out = run_fusion(&compiler::fuse_moe_residual, in);
  CHECK(out.changed);
  CHECK(ir::print_node(out.graph, 8) == "%8 = moe_experts_residual(%1, %2, %3, %4, %5, %6, %7, %1) "
                                        "{alpha=1.702, limit=7.0} : f32[T,8]");
  CHECK(fused_equivalent(in, out.graph, 52) == "");
}

TEST_CASE("fuse_moe_residual leaves experts whose output is read elsewhere alone") {
  SUBCASE("a second add reads it") {
    ir::Graph in = ir::parse(moe("  %s = add(%h, %m) : f32[T,8]\n"
                                 "  %t = add(%x, %m) : f32[T,8]\n  return %s, %t\n"));
    CHECK_FALSE(compiler::fuse_moe_residual(in, {}).changed);
  }
  SUBCASE("it is returned") {
    ir::Graph in = ir::parse(moe("  %s = add(%h, %m) : f32[T,8]\n  return %s, %m\n"));
    CHECK_FALSE(compiler::fuse_moe_residual(in, {}).changed);
  }
  SUBCASE("the add's operands are plain values") {
    ir::Graph in = ir::parse(moe("  %s = add(%h, %x) : f32[T,8]\n  return %s, %m\n"));
    CHECK_FALSE(compiler::fuse_moe_residual(in, {}).changed);
  }
}
