// check_boundary(): what a pipeline rank lets through of the activations a peer sent, against
// the stage program's recv and send types for the step's tokens.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "base/error.h"
#include "engine/pipeline/boundary.h"
#include "ir/graph.h"

TEST_CASE("check_boundary: only the plan's names, dtypes and shapes for the step's tokens pass") {
  using xserv::engine::pipeline::BoundaryTensor;
  using xserv::engine::pipeline::check_boundary;
  using xserv::engine::pipeline::Named;
  using xserv::ir::DType;
  using xserv::ir::Tensor;
  const xserv::ir::Graph g = xserv::ir::parse(R"(
    %h = recv() {name="act.7", peer=0} : f32[T,8]
    %w = weight() {name="model.layers.1.w"} : bf16[8,8]
    %y = linear(%h, %w) : f32[T,8]
    %s = send(%y) {name="act.9", peer=2} : f32[T,8]
    return %s
  )");
  const std::vector<BoundaryTensor> in = xserv::engine::pipeline::stage_receives(g, 3);
  REQUIRE(in.size() == 1);
  CHECK(in[0].name == "act.7");
  CHECK(in[0].shape == std::vector<int64_t>{3, 8});
  const std::vector<BoundaryTensor> out = xserv::engine::pipeline::stage_sends(g, 5);
  REQUIRE(out.size() == 1);
  CHECK(out[0].name == "act.9");
  CHECK(out[0].shape == std::vector<int64_t>{5, 8});

  auto named = [](const char* name, Tensor t) { return Named{{name, std::move(t)}}; };
  CHECK_NOTHROW(check_boundary(named("act.7", Tensor::zeros(DType::F32, {3, 8})), in, "peer"));
  auto refused = [&](const Named& got) {
    std::string msg;
    try {
      check_boundary(got, in, "pipeline rank 4");
    } catch (const xserv::Error& e) {
      msg = e.what();
    }
    return msg;
  };
  // A step of 3 tokens with one token's activation: refused before anything reads 3 rows.
  CHECK(refused(named("act.7", Tensor::zeros(DType::F32, {1, 8}))) ==
        "pipeline rank 4 sent activation 'act.7' as f32[1, 8]; the plan's stage boundary "
        "carries f32[3, 8] for this step");
  CHECK(refused(named("act.7", Tensor::zeros(DType::F32, {3, 9}))).find("as f32[3, 9]") !=
        std::string::npos);
  CHECK(refused(named("act.7", Tensor::zeros(DType::I32, {3, 8}))).find("as i32[3, 8]") !=
        std::string::npos);
  CHECK(refused(named("act.7", Tensor::zeros(DType::F32, {24}))).find("as f32[24]") !=
        std::string::npos);
  // The shape right but the data short (a hand-made tensor): refused too.
  Tensor shortt = Tensor::zeros(DType::F32, {3, 8});
  shortt.f.resize(8);
  CHECK(refused(named("act.7", shortt)).find("as f32[3, 8]") != std::string::npos);
  CHECK(refused(named("act.8", Tensor::zeros(DType::F32, {3, 8}))) ==
        "pipeline rank 4 sent activation 'act.8' (f32[3, 8]), which this stage boundary does "
        "not carry");
  CHECK(refused({}) == "pipeline rank 4 did not send activation 'act.7' (f32[3, 8])");
  Named twice = named("act.7", Tensor::zeros(DType::F32, {3, 8}));
  twice.push_back(twice[0]);
  CHECK(refused(twice) == "pipeline rank 4 sent activation 'act.7' twice");
}

TEST_CASE("boundary_bytes: 4 bytes an element, saturating instead of wrapping") {
  using xserv::engine::pipeline::boundary_bytes;
  using xserv::ir::DType;
  CHECK(boundary_bytes({}) == 0);
  CHECK(boundary_bytes({{"a", DType::F32, {3, 8}}, {"b", DType::I32, {5}}}) == 4 * (24 + 5));
  CHECK(boundary_bytes({{"a", DType::F32, {0, int64_t{1} << 62}}}) == 0);
  // A frame bound computed from a huge step must not wrap around to a small one.
  CHECK(boundary_bytes({{"a", DType::F32, {int64_t{1} << 40, int64_t{1} << 40}}}) == UINT64_MAX);
  CHECK(boundary_bytes({{"a", DType::F32, {int64_t{1} << 61}},
                        {"b", DType::F32, {int64_t{1} << 61}}}) == UINT64_MAX);
}
