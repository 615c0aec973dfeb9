// Tests of the IR text form: canonical printing, parsing, round trips and parse errors.
#include <doctest/doctest.h>

#include <cmath>

#include "base/error.h"
#include "ir/graph.h"

using namespace xserv::ir;

namespace {
const char* kSmall = R"(
  // a norm feeding a projection
  %x = param() {name="x"} : f32[T,64]
  %ln = weight() {name="ln"} : bf16[64]
  %w = weight() {name="w"} : bf16[96,64]
  %n = rms_norm(%x, %ln) {eps=1e-05} : f32[T,64]
  %y = linear(%n, %w) : f32[T,96]
  return %y
)";

std::string parse_error(const std::string& text) {
  try {
    parse(text);
  } catch (const xserv::Error& e) {
    return e.what();
  }
  return "";
}
} // namespace

TEST_CASE("print renumbers values and parse(print(g)) == g") {
  Graph g = parse(kSmall);
  REQUIRE(g.size() == 5);
  CHECK(verify(g) == "");
  const std::string text = print(g);
  CHECK(text == "%0 = param() {name=\"x\"} : f32[T,64]\n"
                "%1 = weight() {name=\"ln\"} : bf16[64]\n"
                "%2 = weight() {name=\"w\"} : bf16[96,64]\n"
                "%3 = rms_norm(%0, %1) {eps=1e-05} : f32[T,64]\n"
                "%4 = linear(%3, %2) : f32[T,96]\n"
                "return %4\n");
  CHECK(parse(text) == g);
  CHECK(print(parse(text)) == text);
}

TEST_CASE("attribute kinds and multi-result types survive the round trip exactly") {
  Graph g;
  Node p;
  p.op = Op::Param;
  p.attrs = {{"name", std::string("odd \"name\"\\x")}};
  p.types = {Type{DType::F32, {Dim::dynamic("T"), 8}}};
  g.nodes.push_back(p);
  Node r;
  r.op = Op::RouterTopK;
  r.inputs = {0};
  r.set_attr("k", int64_t{2});
  r.set_attr("list", std::vector<int64_t>{-1, 0, 7});
  r.set_attr("tiny", 1.0 / 3.0);
  r.set_attr("whole", 7.0);
  r.types = {Type{DType::F32, {Dim::dynamic("T"), 2}}, Type{DType::I32, {Dim::dynamic("T"), 2}}};
  g.nodes.push_back(r);
  Node e;
  e.op = Op::Extract;
  e.inputs = {1};
  e.set_attr("index", int64_t{1});
  e.types = {Type{DType::I32, {Dim::dynamic("T"), 2}}};
  g.nodes.push_back(e);
  g.outputs = {2};
  CHECK(verify(g) == "");
  const std::string text = print(g);
  CHECK(text.find("whole=7.0") != std::string::npos);
  CHECK(text.find(": (f32[T,2], i32[T,2])") != std::string::npos);
  Graph back = parse(text);
  CHECK(back == g);
  CHECK(std::get<double>(*back.nodes[1].find_attr("tiny")) == 1.0 / 3.0);
}

TEST_CASE("parse errors name line and column") {
  CHECK(parse_error("%0 = param() {name=\"x\"} : f32[4]\n%1 = frobnicate(%0) : f32[4]") ==
        "2:6: unknown op 'frobnicate'");
  CHECK(parse_error("%0 = add(%1, %1) : f32[4]") == "1:10: use of undefined value %1");
  CHECK(parse_error("%0 = param() {name=\"x\"} : q7[4]") == "1:27: unknown element type 'q7'");
  CHECK(parse_error("%0 = param() {name=\"x\"} : f32[4]\n%0 = param() {name=\"y\"} : f32[4]") ==
        "2:1: value %0 is defined twice");
  CHECK(parse_error("%0 = param() {name=\"x} : f32[4]").find("unterminated string") !=
        std::string::npos);
  CHECK(parse_error("%0 = param() : f32[4,\n").find("2:1: expected a dimension") !=
        std::string::npos);
  CHECK(parse_error("return %0").find("undefined value %0") != std::string::npos);
}

TEST_CASE("parse errors name the file when given one") {
  auto error_in = [](std::string_view text) {
    try {
      parse(text, "PLAN/graph.ir");
    } catch (const xserv::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(error_in("%0 = param() {name=\"x\"} : f32[4]\n%1 = frobnicate(%0) : f32[4]") ==
        "PLAN/graph.ir:2:6: unknown op 'frobnicate'");
  CHECK(error_in("%0 = add(%1, %1) : f32[4]") == "PLAN/graph.ir:1:10: use of undefined value %1");
  CHECK(error_in("%0 = param() {name=\"x\"} : q7[4]") ==
        "PLAN/graph.ir:1:27: unknown element type 'q7'");
  CHECK(error_in("%0 = param() {name=\"x\"} : f32[4]\n%0 = param() {name=\"y\"} : f32[4]") ==
        "PLAN/graph.ir:2:1: value %0 is defined twice");
  CHECK(error_in("%0 = param() : f32[4,\n").rfind("PLAN/graph.ir:2:1: expected a dimension", 0) ==
        0);
}
