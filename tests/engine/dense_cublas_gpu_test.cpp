// compile --dense-gemm cublas (the default of plain bf16 sm_90 plans): the projections of
// prompt steps as cuBLAS library calls (runtime::PlanLibraryCall; the library gemm itself:
// tests/runtime/blas_gpu_test.cpp), of prompt steps and of decode steps of more than 64
// sequences (with LoweringContext::lm_head_library, lm_head's too: its library sums are the
// logits themselves). A tiny plan compiled both ways: the same greedy tokens, logits within the
// bound below.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "models/step.h"
#include "runtime/device.h"
#include "runtime/plan_io.h"
#include "tests/compiled_model.h"
#include "tests/run_xserv.h"
#include "tests/step_input.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using xserv::testing::run_binary;

// The two plans give the gemms the same bf16 activations and weights; only the fp32 summation
// order of the prompt step's projections differs, and on the tiny model a last-bit change
// upstream moves logits by up to 6.9e-5 (the engine's batch invariance, docs/PERF.md session
// 10, whose kernels differ the same way). kLogitsTol = 1e-3 is 14x that; a wrong operand or
// missing bias is of order 1e-1.
TEST_CASE("gpu: a --dense-gemm cublas plan gives the gemm_wg plan's tokens and logits") {
  XSERV_REQUIRE_GPU_AND_BINARY(dev, bin);
  if (dev.arch() != "sm_90") {
    MESSAGE("skipped: --dense-gemm cublas plans are sm_90 plans");
    return;
  }
  constexpr double kLogitsTol = 1e-3;
  xserv::testing::TempDir tmp("dense_cublas");
  const fs::path model = tmp.path / "model";
  REQUIRE(
      run_binary(bin,
                 fmt::format("synth --config {} -o {} --seed 9",
                             (xserv::testing::source_dir() / "examples/tiny/config.json").string(),
                             model.string()),
                 tmp.path)
          .code == 0);
  auto compile = [&](const char* name, const char* flags) {
    const fs::path plan = tmp.path / name;
    const auto r = run_binary(bin,
                              fmt::format("compile {} -o {} --max-batch 72 --max-seq 512 {}",
                                          model.string(), plan.string(), flags),
                              tmp.path);
    INFO(r.err);
    REQUIRE(r.code == 0);
    return plan;
  };
  const fs::path wg_plan = compile("wg", "--dense-gemm wg"), lib_plan = compile("lib", "");
  auto load = [&](const fs::path& plan) {
    return xserv::testing::plan_cuda_model(xserv::testing::read_opened_plan(plan, model), 72, 512);
  };
  const auto wg_model = load(wg_plan), lib_model = load(lib_plan);
  REQUIRE_FALSE(xserv::runtime::read_plan(lib_plan).stages.at(0).table.library.empty());
  // A 170-token prompt step over two sequences (above 64 tokens: the library calls), then
  // decode steps.
  xserv::models::StepInput step;
  step.tokens.resize(2);
  for (int i = 0; i < 100; ++i)
    step.tokens[0].push_back(1000 + 37 * i);
  for (int i = 0; i < 70; ++i)
    step.tokens[1].push_back(50000 + 911 * i);
  step.ctx_lens = {0, 0};
  xserv::testing::use_rows(step, {0, 1}, wg_model->kv_geometry());
  double worst = 0;
  int same_tokens = 0, rows = 0;
  for (int s = 0; s < 6; ++s) {
    const auto want = wg_model->step(step);
    const auto got = lib_model->step(step);
    REQUIRE(got.size() == want.size());
    xserv::models::StepInput next;
    for (size_t b = 0; b < want.size(); ++b) {
      ++rows;
      worst = std::max(worst, xserv::testing::rel_l2(got[b], want[b]));
      const auto top = std::max_element(want[b].begin(), want[b].end()) - want[b].begin();
      same_tokens += top == std::max_element(got[b].begin(), got[b].end()) - got[b].begin();
      next.tokens.push_back({static_cast<int32_t>(top)});
      next.ctx_lens.push_back(step.ctx_lens[b] + static_cast<int32_t>(step.tokens[b].size()));
      xserv::testing::keep_tables(next, step, b);
    }
    step = next;
  }
  // One token for each of 72 sequences: a decode step above 64 rows (lm_head's are sequences).
  {
    xserv::models::StepInput wide;
    std::vector<int32_t> seqs;
    for (int b = 0; b < 72; ++b) {
      wide.tokens.push_back({static_cast<int32_t>(3000 + 2741 * b)});
      wide.ctx_lens.push_back(0);
      seqs.push_back(b);
    }
    wg_model->reset();
    lib_model->reset();
    xserv::testing::use_rows(wide, seqs, wg_model->kv_geometry());
    const auto want = wg_model->step(wide);
    const auto got = lib_model->step(wide);
    REQUIRE(got.size() == 72);
    REQUIRE(want.size() == 72);
    for (size_t b = 0; b < want.size(); ++b) {
      ++rows;
      worst = std::max(worst, xserv::testing::rel_l2(got[b], want[b]));
      same_tokens += std::max_element(want[b].begin(), want[b].end()) - want[b].begin() ==
                     std::max_element(got[b].begin(), got[b].end()) - got[b].begin();
    }
  }
  MESSAGE("cuBLAS plan against gemm_wg plan: " << same_tokens << " of " << rows
                                               << " greedy tokens equal, worst logits rel L2 "
                                               << worst);
  CHECK(same_tokens == rows);
  CHECK(worst <= kLogitsTol);
}
