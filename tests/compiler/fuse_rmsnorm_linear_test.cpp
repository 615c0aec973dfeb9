// fuse_rmsnorm_linear: text in -> pass -> verify -> expected text, the cases it must leave
// alone, and the interpreter giving the same outputs before and after.
#include <doctest/doctest.h>

#include "compiler/fuse_rmsnorm_linear.h"
#include "tests/compiler/fusion_test_util.h"

using namespace xserv;
using testing::fused_equivalent;
using testing::run_fusion;

namespace {

// One norm read by two linears (with and without bias), as the router and a head would.
const char* kTwoLinears = R"(
  %x = param() {name="x"} : f32[T,16]
  %ln = weight() {name="ln"} : bf16[16]
  %w1 = weight() {name="w1"} : bf16[8,16]
  %b1 = weight() {name="b1"} : bf16[8]
  %w2 = weight() {name="w2"} : bf16[12,16]
  %n = rms_norm(%x, %ln) {eps=1e-05} : f32[T,16]
  %y1 = linear(%n, %w1, %b1) : f32[T,8]
  %y2 = linear(%n, %w2) : f32[T,12]
  return %y1, %y2
)";

} // namespace

TEST_CASE("fuse_rmsnorm_linear folds the norm into every linear that reads it") {
  ir::Graph in = ir::parse(kTwoLinears);
  auto out = run_fusion(&compiler::fuse_rmsnorm_linear, in);
  CHECK(out.changed);
  CHECK(ir::print(out.graph) == "%0 = param() {name=\"x\"} : f32[T,16]\n"
                                "%1 = weight() {name=\"ln\"} : bf16[16]\n"
                                "%2 = weight() {name=\"w1\"} : bf16[8,16]\n"
                                "%3 = weight() {name=\"b1\"} : bf16[8]\n"
                                "%4 = weight() {name=\"w2\"} : bf16[12,16]\n"
                                "%5 = rms_norm_linear(%0, %1, %2, %3) {eps=1e-05} : f32[T,8]\n"
                                "%6 = rms_norm_linear(%0, %1, %4) {eps=1e-05} : f32[T,12]\n"
                                "return %5, %6\n");
  CHECK(fused_equivalent(in, out.graph, 11) == "");
}

TEST_CASE("fuse_rmsnorm_linear keeps a norm that something other than a linear reads") {
  SUBCASE("a residual add reads the norm") {
    ir::Graph in = ir::parse(R"(
      %x = param() {name="x"} : f32[T,16]
      %ln = weight() {name="ln"} : bf16[16]
      %w = weight() {name="w"} : bf16[16,16]
      %n = rms_norm(%x, %ln) {eps=1e-05} : f32[T,16]
      %y = linear(%n, %w) : f32[T,16]
      %s = add(%y, %n) : f32[T,16]
      return %s
    )");
    auto out = compiler::fuse_rmsnorm_linear(in, {});
    CHECK_FALSE(out.changed);
    CHECK(out.graph == in);
  }
  SUBCASE("the norm is returned") {
    ir::Graph in = ir::parse(R"(
      %x = param() {name="x"} : f32[T,16]
      %ln = weight() {name="ln"} : bf16[16]
      %w = weight() {name="w"} : bf16[8,16]
      %n = rms_norm(%x, %ln) {eps=1e-05} : f32[T,16]
      %y = linear(%n, %w) : f32[T,8]
      return %y, %n
    )");
    CHECK_FALSE(compiler::fuse_rmsnorm_linear(in, {}).changed);
  }
  SUBCASE("the linear reads the norm as its bias, not as x") {
    ir::Graph in = ir::parse(R"(
      %x = param() {name="x"} : f32[T,16]
      %ln = weight() {name="ln"} : bf16[16]
      %w = weight() {name="w"} : bf16[16,4]
      %b = rms_norm(%ln, %ln) {eps=1e-05} : f32[16]
      %z = param() {name="z"} : f32[T,4]
      %y = linear(%z, %w, %b) : f32[T,16]
      return %y
    )");
    CHECK_FALSE(compiler::fuse_rmsnorm_linear(in, {}).changed);
  }
}

TEST_CASE("fuse_rmsnorm_linear matches the unfused graph on rank-3 inputs") {
  ir::Graph in = ir::parse(R"(
    %x = param() {name="x"} : f32[T,3,16]
    %ln = weight() {name="ln"} : bf16[16]
    %w = weight() {name="w"} : bf16[5,16]
    %b = weight() {name="b"} : bf16[5]
    %n = rms_norm(%x, %ln) {eps=1e-06} : f32[T,3,16]
    %y = linear(%n, %w, %b) : f32[T,3,5]
    return %y
  )");
  auto out = run_fusion(&compiler::fuse_rmsnorm_linear, in);
  CHECK(out.changed);
  CHECK(out.graph.size() == 5);
  CHECK(ir::type_str(out.graph.type(out.graph.outputs[0])) == "f32[T,3,5]");
  CHECK(fused_equivalent(in, out.graph, 12) == "");
}
