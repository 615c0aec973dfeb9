// The CUDA model running a plan replays the plan's launch table and cubins (plan.json,
// kernels/*.cubin) and gets the logits of the same graph compiled in memory, bit for bit; a run
// with other sizes than the plan's is refused.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/error.h"
#include "ir/graph.h"
#include "models/step.h"
#include "runtime/device.h"
#include "runtime/plan_io.h"
#include "tests/compiled_model.h"
#include "tests/run_xserv.h"
#include "tests/step_input.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using xserv::testing::run_binary;

TEST_CASE("gpu: a plan's launch table and cubins give an in-memory compile's logits") {
  XSERV_REQUIRE_GPU_AND_BINARY(dev, bin);
  xserv::testing::TempDir tmp("plan_replay");
  const fs::path model = tmp.path / "model", plan = tmp.path / "plan";
  REQUIRE(
      run_binary(bin,
                 fmt::format("synth --config {} -o {} --seed 9",
                             (xserv::testing::source_dir() / "examples/tiny/config.json").string(),
                             model.string()),
                 tmp.path)
          .code == 0);
  const auto compiled =
      run_binary(bin,
                 fmt::format("compile {} -o {} --max-batch 3 --max-seq 512 --arch {}",
                             model.string(), plan.string(), dev.arch()),
                 tmp.path);
  INFO(compiled.err);
  REQUIRE(compiled.code == 0);
  std::ifstream in(plan / "graph.ir");
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const xserv::ir::Graph graph = xserv::ir::parse(text);

  xserv::testing::GraphModelOptions quiet = xserv::testing::quiet();
  quiet.prefill_chunk = 512; // the plan's: compile's default min(2048, max-seq)
  quiet.gemm_split = false;  // and its defaults: plain bf16 gemm activations, MXFP4 experts
  quiet.expert_format = xserv::runtime::ExpertFormat::Mxfp4;
  const xserv::runtime::OpenedPlan src = xserv::testing::read_opened_plan(plan, model);
  const auto replay_model = xserv::testing::plan_cuda_model(src, 3, 512, quiet);
  const auto lowered_model = xserv::testing::graph_cuda_model(model, 3, 512, &graph, quiet);
  xserv::engine::Model& replay = *replay_model;
  xserv::engine::CudaModel& lowered = *lowered_model;
  { // another max batch than the plan's: refused, naming the compile flag
    CHECK_THROWS_WITH_AS(xserv::testing::plan_cuda_model(src, 2, 512, quiet),
                         doctest::Contains("--max-batch 2"), xserv::UsageError);
  }
  // A prefill over three sequences (the gemm path), then decode steps (CUDA graphs).
  xserv::models::StepInput step;
  step.tokens = {{11, 22, 33, 44, 55}, {7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18}, {200005}};
  step.ctx_lens = {0, 0, 0};
  xserv::testing::use_rows(step, {0, 1, 2}, replay.kv_geometry());
  int same = 0, rows = 0;
  for (int s = 0; s < 5; ++s) {
    const auto want = lowered.step(step);
    const auto got = replay.step(step);
    REQUIRE(got.size() == want.size());
    xserv::models::StepInput next;
    for (size_t b = 0; b < want.size(); ++b) {
      ++rows;
      same += got[b] == want[b];
      const auto top = std::max_element(want[b].begin(), want[b].end()) - want[b].begin();
      next.tokens.push_back({static_cast<int32_t>(top)});
      next.ctx_lens.push_back(step.ctx_lens[b] + static_cast<int32_t>(step.tokens[b].size()));
      xserv::testing::keep_tables(next, step, b);
    }
    step = next;
  }
  MESSAGE("plan replay vs lowering: " << same << " of " << rows << " logit rows bitwise equal");
  CHECK(same == rows);
}
