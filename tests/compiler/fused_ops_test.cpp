// The fused ops as IR: verify() types them and names what is wrong with ill-formed ones.
#include <doctest/doctest.h>

#include <string>

#include "ir/graph.h"

using namespace xserv;

namespace {

std::string verify_text(const std::string& body) {
  return ir::verify(ir::parse(R"(
    %x = param() {name="x"} : f32[T,16]
    %pos = param() {name="positions"} : i32[T]
    %ln = weight() {name="ln"} : bf16[16]
    %w8 = weight() {name="w8"} : bf16[8,16]
    %b8 = weight() {name="b8"} : bf16[8]
    %w4 = weight() {name="w4"} : bf16[4,16]
    %b4 = weight() {name="b4"} : bf16[4]
  )" + body));
}

constexpr const char* kRope =
    "beta_fast=32.0, beta_slow=1.0, factor=32.0, original_max=4096.0, theta=150000.0, truncate=0";

} // namespace

TEST_CASE("well-formed fused ops verify") {
  CHECK(verify_text("%a = rms_norm_linear(%x, %ln, %w8, %b8) {eps=1e-05} : f32[T,8]\n"
                    "%b = rms_norm_linear(%x, %ln, %w4) {eps=1e-05} : f32[T,4]\n"
                    "%h = param() {name=\"h\"} : f32[T,8]\n"
                    "%c = linear_residual(%x, %w8, %b8, %h) : f32[T,8]\n"
                    "%d = linear_residual(%x, %w8, %h) : f32[T,8]\n"
                    "%r = router(%x, %w8, %b8) {k=2} : (f32[T,2], i32[T,2])\n"
                    "%q = qkv_rope(%x, %ln, %w8, %b8, %w4, %b4, %w4, %b4, %pos) {eps=1e-05, "
                    "head_dim=4, " +
                    std::string(kRope) + "} : (f32[T,2,4], f32[T,1,4], f32[T,1,4])\n") == "");
}

TEST_CASE("ill-formed fused ops are reported with the offending operand") {
  CHECK(verify_text("%a = rms_norm_linear(%x, %b8, %w8) {eps=1e-05} : f32[T,8]\n") ==
        "%7 = rms_norm_linear: norm width: [16] != [8]\n");
  CHECK(verify_text("%a = rms_norm_linear(%x, %ln, %w8, %b4) {eps=1e-05} : f32[T,8]\n") ==
        "%7 = rms_norm_linear: bias width: [4] != [8]\n");
  CHECK(verify_text("%c = linear_residual(%x, %w8, %b8, %x) : f32[T,8]\n") ==
        "%7 = linear_residual: residual f32[T,16] does not match the sum's shape [T,8]\n");
  CHECK(verify_text("%r = router(%x, %w4) {k=5} : (f32[T,5], i32[T,5])\n") ==
        "%7 = router: k = 5 exceeds the 4 experts\n");
  CHECK(verify_text("%q = qkv_rope(%x, %ln, %w8, %b8, %w8, %b8, %w4, %b4, %pos) {eps=1e-05, "
                    "head_dim=4, " +
                    std::string(kRope) + "} : (f32[T,2,4], f32[T,2,4], f32[T,1,4])\n") ==
        "%7 = qkv_rope: k and v head counts differ: 2 and 1\n");
  CHECK(verify_text("%q = qkv_rope(%x, %ln, %w8, %b8, %w4, %b4, %w4, %b4, %pos) {eps=1e-05, "
                    "head_dim=3, " +
                    std::string(kRope) + "} : (f32[T,2,4], f32[T,1,4], f32[T,1,4])\n") ==
        "%7 = qkv_rope: rope head_dim must be even\n");
  CHECK(verify_text("%q = qkv_rope(%x, %ln, %w8, %b8, %w4, %b4, %w4, %b4, %pos) {eps=1e-05, "
                    "head_dim=4} : (f32[T,2,4], f32[T,1,4], f32[T,1,4])\n") ==
        "%7 = qkv_rope: missing numeric attribute 'theta'\n");
  CHECK(verify_text("%q = qkv_rope(%x, %ln, %w8, %b8, %w4, %b4, %w4, %b4, %pos) {eps=1e-05, "
                    "head_dim=4, " +
                    std::string(kRope) + "} : f32[T,2,4]\n") ==
        "%7 = qkv_rope: declared type f32[T,2,4] but the operands give f32[T,2,4], f32[T,1,4], "
        "f32[T,1,4]\n");
}
