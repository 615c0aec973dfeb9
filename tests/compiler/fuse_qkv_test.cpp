// fuse_qkv: an attention block's norm + q/k/v projections + rope becoming one qkv_rope, the
// shapes it must leave alone, and the interpreter giving the same outputs before and after.
#include <doctest/doctest.h>

#include <string>

#include "compiler/fuse_qkv.h"
#include "tests/compiler/fusion_test_util.h"

using namespace xserv;
using testing::fused_equivalent;
using testing::run_fusion;

namespace {

constexpr const char* kRope =
    "{beta_fast=32.0, beta_slow=1.0, factor=32.0, original_max=4096.0, theta=150000.0, "
    "truncate=0}";

/// An attention input block as build_gpt_oss emits it: 2 query heads, 1 kv head, head_dim 4.
/// `extra` lines go before the return; `ret` is the return list.
std::string block(const std::string& k_rope, const std::string& extra, const std::string& ret) {
  return std::string(R"(
  %x = param() {name="x"} : f32[T,16]
  %pos = param() {name="positions"} : i32[T]
  %ln = weight() {name="ln"} : bf16[16]
  %wq = weight() {name="wq"} : bf16[8,16]
  %bq = weight() {name="bq"} : bf16[8]
  %n = rms_norm(%x, %ln) {eps=1e-05} : f32[T,16]
  %q = linear(%n, %wq, %bq) : f32[T,8]
  %wk = weight() {name="wk"} : bf16[4,16]
  %bk = weight() {name="bk"} : bf16[4]
  %k = linear(%n, %wk, %bk) : f32[T,4]
  %wv = weight() {name="wv"} : bf16[4,16]
  %bv = weight() {name="bv"} : bf16[4]
  %v = linear(%n, %wv, %bv) : f32[T,4]
  %qh = reshape(%q) : f32[T,2,4]
  %qr = rope_yarn(%qh, %pos) )") +
         kRope + R"( : f32[T,2,4]
  %kh = reshape(%k) : f32[T,1,4]
  %kr = rope_yarn(%kh, %pos) )" +
         k_rope + R"( : f32[T,1,4]
  %vh = reshape(%v) : f32[T,1,4]
)" + extra +
         "  return " + ret + "\n";
}

} // namespace

TEST_CASE("fuse_qkv turns norm, three projections and rope into one qkv_rope") {
  ir::Graph in = ir::parse(block(kRope, "  %s = add(%kr, %vh) : f32[T,1,4]\n", "%qr, %s, %vh"));
  auto out = run_fusion(&compiler::fuse_qkv, in);
  CHECK(out.changed);
  CHECK(ir::print(out.graph) ==
        "%0 = param() {name=\"x\"} : f32[T,16]\n"
        "%1 = param() {name=\"positions\"} : i32[T]\n"
        "%2 = weight() {name=\"ln\"} : bf16[16]\n"
        "%3 = weight() {name=\"wq\"} : bf16[8,16]\n"
        "%4 = weight() {name=\"bq\"} : bf16[8]\n"
        "%5 = weight() {name=\"wk\"} : bf16[4,16]\n"
        "%6 = weight() {name=\"bk\"} : bf16[4]\n"
        "%7 = weight() {name=\"wv\"} : bf16[4,16]\n"
        "%8 = weight() {name=\"bv\"} : bf16[4]\n"
        "%9 = qkv_rope(%0, %2, %3, %4, %5, %6, %7, %8, %1) {beta_fast=32.0, beta_slow=1.0, "
        "eps=1e-05, factor=32.0, head_dim=4, original_max=4096.0, theta=150000.0, truncate=0} "
        ": (f32[T,2,4], f32[T,1,4], f32[T,1,4])\n"
        "%10 = extract(%9) {index=0} : f32[T,2,4]\n"
        "%11 = extract(%9) {index=1} : f32[T,1,4]\n"
        "%12 = extract(%9) {index=2} : f32[T,1,4]\n"
        "%13 = add(%11, %12) : f32[T,1,4]\n"
        "return %10, %13, %12\n");
  CHECK(fused_equivalent(in, out.graph, 21) == "");
}

TEST_CASE("fuse_qkv leaves blocks that do not fit the fused op alone") {
  SUBCASE("the norm has a fourth reader") {
    ir::Graph in = ir::parse(block(kRope, "  %s = add(%n, %x) : f32[T,16]\n", "%qr, %kr, %vh, %s"));
    CHECK_FALSE(compiler::fuse_qkv(in, {}).changed);
  }
  SUBCASE("the unrotated q projection is read elsewhere") {
    ir::Graph in = ir::parse(block(kRope, "", "%qr, %kr, %vh, %q"));
    CHECK_FALSE(compiler::fuse_qkv(in, {}).changed);
  }
  SUBCASE("q and k are rotated with different attributes") {
    std::string other(kRope);
    other.replace(other.find("theta=150000.0"), 14, "theta=10000.0");
    ir::Graph in = ir::parse(block(other, "", "%qr, %kr, %vh"));
    CHECK(ir::verify(in) == "");
    CHECK_FALSE(compiler::fuse_qkv(in, {}).changed);
  }
  SUBCASE("v is rotated too") {
    std::string text = block(kRope, "", "%qr, %kr, %vr");
    text.insert(text.find("  return"),
                std::string("  %vr = rope_yarn(%vh, %pos) ") + kRope + " : f32[T,1,4]\n");
    ir::Graph in = ir::parse(text);
    CHECK(ir::verify(in) == "");
    CHECK_FALSE(compiler::fuse_qkv(in, {}).changed);
  }
}

TEST_CASE("fuse_qkv fuses each block of a two-layer stack") {
  // The second block reads the first's q through a projection back to the model width.
  std::string text = block(kRope, "", "");
  text = text.substr(0, text.find("  return"));
  text += R"(
  %qf = reshape(%qr) : f32[T,8]
  %wo = weight() {name="wo"} : bf16[16,8]
  %h = linear(%qf, %wo) : f32[T,16]
  %ln2 = weight() {name="ln2"} : bf16[16]
  %n2 = rms_norm(%h, %ln2) {eps=1e-05} : f32[T,16]
  %q2 = linear(%n2, %wq, %bq) : f32[T,8]
  %k2 = linear(%n2, %wk, %bk) : f32[T,4]
  %v2 = linear(%n2, %wv, %bv) : f32[T,4]
  %q2h = reshape(%q2) : f32[T,2,4]
  %q2r = rope_yarn(%q2h, %pos) )" +
          std::string(kRope) + R"( : f32[T,2,4]
  %k2h = reshape(%k2) : f32[T,1,4]
  %k2r = rope_yarn(%k2h, %pos) )" +
          std::string(kRope) + R"( : f32[T,1,4]
  %v2h = reshape(%v2) : f32[T,1,4]
  return %kr, %vh, %q2r, %k2r, %v2h
)";
  ir::Graph in = ir::parse(text);
  auto out = run_fusion(&compiler::fuse_qkv, in);
  CHECK(out.changed);
  int fused = 0;
  for (const auto& n : out.graph.nodes)
    fused += n.op == ir::Op::QkvRope;
  CHECK(fused == 2);
  CHECK(out.graph.size() == in.size() - 2 * 9 + 2 * 4);
  CHECK(fused_equivalent(in, out.graph, 22) == "");
}
