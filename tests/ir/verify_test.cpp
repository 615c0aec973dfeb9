// Tests of verify(): each invariant violation is reported with the offending node.
#include <doctest/doctest.h>

#include "ir/graph.h"

using namespace xserv::ir;

namespace {
std::string verify_text(const std::string& text) {
  return verify(parse(text));
}
} // namespace

TEST_CASE("a well-typed graph verifies") {
  CHECK(verify_text(R"(
    %0 = param() {name="x"} : f32[T,64]
    %1 = weight() {name="w"} : bf16[32,64]
    %2 = weight() {name="b"} : bf16[32]
    %3 = linear(%0, %1, %2) : f32[T,32]
    return %3
  )") == "");
}

TEST_CASE("wrong arity") {
  CHECK(verify_text(R"(
    %0 = param() {name="x"} : f32[T,64]
    %1 = add(%0) : f32[T,64]
  )") == "%1 = add: takes 2 operands, has 1\n");
}

TEST_CASE("dtype mismatch") {
  CHECK(verify_text(R"(
    %0 = param() {name="ids"} : f32[T]
    %1 = weight() {name="emb"} : bf16[100,64]
    %2 = embedding(%1, %0) : f32[T,64]
  )") == "%2 = embedding: ids must be i32 or i64, is f32[T]\n");
}

TEST_CASE("shape mismatch between operands") {
  CHECK(verify_text(R"(
    %0 = param() {name="x"} : f32[T,64]
    %1 = weight() {name="w"} : bf16[32,48]
    %2 = linear(%0, %1) : f32[T,32]
  )") == "%2 = linear: linear input width: [64] != [48]\n");
}

TEST_CASE("declared type disagrees with the inferred one") {
  CHECK(verify_text(R"(
    %0 = param() {name="x"} : f32[T,64]
    %1 = weight() {name="w"} : bf16[64]
    %2 = rms_norm(%0, %1) {eps=1e-05} : f32[T,65]
  )") == "%2 = rms_norm: declared type f32[T,65] but the operands give f32[T,64]\n");
}

TEST_CASE("use before definition and dangling values") {
  Graph g = parse(R"(
    %0 = param() {name="x"} : f32[4]
    %1 = add(%0, %0) : f32[4]
  )");
  g.nodes[1].inputs[1] = 1; // uses itself
  CHECK(verify(g) == "%1 = add: operand %1 is used before its definition\n");
  g.nodes[1].inputs[1] = 9;
  CHECK(verify(g) == "%1 = add: operand %9 does not exist (dangling value)\n");
  g.nodes[1].inputs[1] = 0;
  g.outputs = {5};
  CHECK(verify(g) == "return: %5 does not exist (dangling value)\n");
}

TEST_CASE("bad attributes") {
  CHECK(verify_text(R"(
    %0 = param() {name="x"} : f32[T,64]
    %1 = weight() {name="w"} : bf16[64]
    %2 = rms_norm(%0, %1) : f32[T,64]
  )") == "%2 = rms_norm: missing numeric attribute 'eps'\n");
  CHECK(verify_text(R"(
    %0 = param() {name="x"} : f32[T,64]
    %1 = weight() {name="w"} : bf16[64]
    %2 = rms_norm(%0, %1) {eps=-1.0} : f32[T,64]
  )") == "%2 = rms_norm: attribute 'eps' must be positive\n");
  CHECK(verify_text(R"(
    %0 = param() {name="r"} : f32[T,8]
    %1 = router_topk(%0) {k=9} : (f32[T,9], i32[T,9])
  )") == "%1 = router_topk: k = 9 exceeds the 8 experts\n");
  CHECK(verify_text(R"(
    %0 = param() : f32[4]
  )") == "%0 = param: missing string attribute 'name'\n");
}

TEST_CASE("a multi-result value must be read through extract") {
  CHECK(verify_text(R"(
    %0 = param() {name="r"} : f32[T,8]
    %1 = router_topk(%0) {k=2} : (f32[T,2], i32[T,2])
    %2 = add(%1, %1) : f32[T,2]
  )") == "%2 = add: operand %1 has several results; read one with extract\n"
         "%2 = add: operand %1 has several results; read one with extract\n");
}

TEST_CASE("reshape must keep the element count, including dynamic dims") {
  CHECK(verify_text(R"(
    %0 = param() {name="x"} : f32[T,64]
    %1 = reshape(%0) : f32[T,4,16]
  )") == "");
  CHECK(verify_text(R"(
    %0 = param() {name="x"} : f32[T,64]
    %1 = reshape(%0) : f32[B,4,16]
  )") == "%1 = reshape: reshape of f32[T,64] to f32[B,4,16] changes the element count\n");
}

TEST_CASE("sources declared twice with different types are rejected") {
  CHECK(verify_text(R"(
    %0 = param() {name="x"} : f32[4]
    %1 = param() {name="x"} : f32[4]
  )") == "%1 = param: 'x' is declared twice\n");
  CHECK(verify_text(R"(
    %0 = weight() {name="w"} : bf16[4]
    %1 = weight() {name="w"} : bf16[4]
  )") == "");
}
