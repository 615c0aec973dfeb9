// send / recv: the pipeline-boundary ops. Types, verification, text round trip, and the
// interpreter's reading of them (recv takes what the driver passes under its name).
#include <doctest/doctest.h>

#include "base/error.h"
#include "ir/graph.h"
#include "ir/interpreter.h"

using namespace xserv;

namespace {

const char* kStage = R"(
  %h = recv() {name="act.7", peer=0} : f32[T,8]
  %w = weight() {name="model.layers.1.w"} : bf16[8,8]
  %y = linear(%h, %w) : f32[T,8]
  %s = send(%y) {name="act.9", peer=2} : f32[T,8]
  return %s
)";

} // namespace

TEST_CASE("send and recv verify, print and parse back") {
  const ir::Graph g = ir::parse(kStage);
  CHECK(ir::verify(g) == "");
  CHECK(ir::parse(ir::print(g)) == g);
  CHECK(g.node(3).type() == g.node(2).type());
}

TEST_CASE("send and recv: missing attributes and wrong types are verifier errors") {
  CHECK(ir::verify(ir::parse(R"(
    %h = recv() {name="a"} : f32[T,8]
    return %h
  )"))
            .find("missing integer attribute 'peer'") != std::string::npos);
  CHECK(ir::verify(ir::parse(R"(
    %h = recv() {name="a", peer=0} : f32[T,8]
    %s = send(%h) {peer=1} : f32[T,8]
    return %s
  )"))
            .find("missing string attribute 'name'") != std::string::npos);
  CHECK(ir::verify(ir::parse(R"(
    %h = recv() {name="a", peer=0} : f32[T,8]
    %s = send(%h) {name="b", peer=1} : f32[T,4]
    return %s
  )"))
            .find("declared type") != std::string::npos);
}

TEST_CASE("interpret: recv reads the tensor passed under its name, send returns its operand") {
  const ir::Graph g = ir::parse(kStage);
  ir::InterpretEnv env;
  env.weights = ir::random_weights(3);
  env.params["act.7"] = ir::random_params(ir::parse(R"(
    %x = param() {name="x"} : f32[T,8]
    return %x
  )"),
                                          {{"T", 3}}, 4)
                            .at("x");
  const std::vector<ir::Tensor> out = ir::interpret(g, env);
  REQUIRE(out.size() == 1);
  CHECK(out[0].shape == std::vector<int64_t>{3, 8});
  ir::InterpretEnv empty;
  empty.weights = env.weights;
  CHECK_THROWS_WITH(ir::interpret(g, empty), "recv 'act.7': nothing was sent from stage 0");
}
