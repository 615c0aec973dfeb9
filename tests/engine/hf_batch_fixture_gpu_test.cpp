// GPU checks of CudaModel on the batch fixtures (tests/engine/hf_batch_fixture.h): prompts of
// different lengths in one batch, steps split into prefill sub-steps of 64 tokens, and the
// Engine over the CUDA model, all held to HF transformers' float32 logits and greedy tokens.
//
// Tolerances: the CUDA engine's own error on the single-prompt fixtures (cuda_model_gpu_test.cpp:
// 3e-5 for prefill steps on the tensor-core gemm path, 6x the measured 4.9e-6 on an H200) plus
// the CPU engine's limit on these fixtures (hf_batch_fixture_test.cpp: 5e-6, measured 2.0e-6 and
// 2.65e-6: the part of the distance that is HF's and our fp32 rounding). The
// logsumexp limit on the sampled-vocabulary fixture: 5e-7, 6.5x the 7.7e-8 measured on an H200
// (2026-12-01; the CPU's is 4.1e-9). yarn4k_batch3 has a limit of its own: its experts run in
// the SwiGLU clamp regime (15% of the elements clamped, expert outputs ~10x the other
// fixtures'), where the split-bf16 gemm's relative error grows with them: measured 9.9e-5
// teacher-forced and 5.5e-5 through the Engine on the H200 (the CPU engine's 2.65e-6 is 10x
// tiny2l's for the same reason), limit 2e-4 (2x; still 30x below HF bfloat16's own distance
// from its float32). Greedy tokens must equal
// HF's wherever HF's top-2 margin exceeds 0.05 (and the earlier tokens agreed), and each stored
// row's argmax HF's where its margin exceeds 0.01.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "engine/engine.h"
#include "models/gpt_oss.h"
#include "models/step.h"
#include "tests/compiled_model.h"
#include "tests/engine/hf_batch_fixture.h"
#include "tests/step_input.h"

namespace {

namespace engine = xserv::engine;
namespace models = xserv::models;
using xserv::testing::HfBatch;
using xserv::testing::HfJudge;
using xserv::testing::TempDir;

constexpr int kPrefillChunk = 64;       ///< CUDA sub-steps; the steps below are longer
constexpr double kGpuTol = 3e-5 + 5e-6; ///< relative L2 per row; see the file comment
constexpr double kClampTol = 2e-4;      ///< yarn4k_batch3's; see the file comment
constexpr double kLseTol = 5e-7;        ///< |logsumexp difference|; see the file comment

double gpu_tol(const std::string& fixture) {
  return fixture == "yarn4k_batch3" ? kClampTol : kGpuTol;
}
constexpr double kArgmaxMargin = 0.01;

/// Teacher-forced prompts + continuations in steps of `chunk + 7 b` tokens per prompt b, which
/// joins at step `stagger * b`, each step run as sub-steps of kPrefillChunk tokens.
void check_cuda_chunked(const std::string& name, size_t chunk, size_t stagger) {
  const HfBatch b = xserv::testing::load_hf_batch(name);
  TempDir tmp(name);
  xserv::testing::synthesize_hf_batch(b, tmp.path);
  const auto config = models::ModelConfig::load(tmp.path / "config.json");
  const xserv::ir::Graph all = models::build_gpt_oss(config, {.last_logits_only = false});
  xserv::testing::GraphModelOptions opts = xserv::testing::quiet();
  opts.prefill_chunk = kPrefillChunk;
  const size_t n = b.seqs.size();
  const auto model_ptr =
      xserv::testing::graph_cuda_model(tmp.path, static_cast<int64_t>(n), b.max_len(), &all, opts);
  engine::CudaModel& model = *model_ptr;
  HfJudge judge(b, gpu_tol(b.name), kLseTol, kArgmaxMargin);
  std::vector<std::vector<int32_t>> tokens;
  for (const auto& s : b.seqs)
    tokens.push_back(s.tokens());
  std::vector<size_t> done(n, 0);
  size_t step_index = 0;
  for (;;) {
    models::StepInput step;
    std::vector<size_t> seq_of;
    std::vector<int32_t> kv_rows;
    for (size_t s = 0; s < n; ++s) {
      const size_t take = std::min(chunk + 7 * s, tokens[s].size() - done[s]);
      if (take == 0 || step_index < stagger * s)
        continue;
      step.tokens.emplace_back(tokens[s].begin() + static_cast<ptrdiff_t>(done[s]),
                               tokens[s].begin() + static_cast<ptrdiff_t>(done[s] + take));
      step.ctx_lens.push_back(static_cast<int32_t>(done[s]));
      kv_rows.push_back(static_cast<int32_t>(n - 1 - s));
      seq_of.push_back(s);
    }
    ++step_index;
    if (seq_of.empty()) {
      bool finished = true;
      for (size_t s = 0; s < n; ++s)
        finished = finished && done[s] == tokens[s].size();
      if (finished)
        break;
      continue;
    }
    xserv::testing::use_rows(step, kv_rows, model.kv_geometry());
    const auto rows = model.step_all(step);
    size_t row = 0;
    for (size_t i = 0; i < seq_of.size(); ++i) {
      const size_t s = seq_of[i];
      for (size_t t = 0; t < step.tokens[i].size(); ++t, ++row) {
        REQUIRE(row < rows.size());
        judge.add(s, static_cast<int64_t>(done[s] + t), rows[row].data(), rows[row].size());
      }
      done[s] += step.tokens[i].size();
    }
    REQUIRE(row == rows.size());
  }
  MESSAGE(fmt::format("{} on the GPU, teacher-forced: {}", name, judge.summary()));
  judge.check(xserv::testing::stored_rows(b));
}

/// The Engine over the CUDA model, `budget` tokens per step.
void check_cuda_engine(const std::string& name, int64_t budget) {
  const HfBatch b = xserv::testing::load_hf_batch(name);
  TempDir tmp(name);
  xserv::testing::synthesize_hf_batch(b, tmp.path);
  xserv::testing::GraphModelOptions opts = xserv::testing::quiet();
  opts.prefill_chunk = kPrefillChunk;
  const size_t n = b.seqs.size();
  const auto model_ptr = xserv::testing::graph_cuda_model(tmp.path, static_cast<int64_t>(n),
                                                          b.max_len(), nullptr, opts);
  engine::CudaModel& model = *model_ptr;
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t x, size_t y) { return b.seqs[x].prompt.size() < b.seqs[y].prompt.size(); });
  std::vector<xserv::engine::Request> reqs;
  for (size_t s : order) {
    xserv::engine::Request r;
    r.prompt = b.seqs[s].prompt;
    r.max_tokens = static_cast<int64_t>(b.seqs[s].greedy.size());
    r.return_logits = true;
    reqs.push_back(r);
  }
  HfJudge judge(b, gpu_tol(b.name), kLseTol, kArgmaxMargin);
  std::vector<bool> diverged(n, false);
  const auto on_event = [&](size_t i, const xserv::engine::Event& ev) {
    const size_t s = order[i];
    const auto k = static_cast<size_t>(ev.generated_tokens - 1);
    // Rows are HF's only while the tokens before them are HF's.
    if (ev.token >= 0 && !diverged[s])
      judge.add(s, static_cast<int64_t>(b.seqs[s].prompt.size() + k) - 1, ev.logits.data(),
                ev.logits.size());
    if (ev.token >= 0 && k < b.seqs[s].greedy.size() && ev.token != b.seqs[s].greedy[k])
      diverged[s] = true;
    return true;
  };
  xserv::engine::EngineOptions eo;
  eo.max_running = static_cast<int64_t>(n);
  eo.max_tokens_per_step = budget;
  const auto gens = xserv::engine::generate(model, reqs, on_event, eo);
  REQUIRE(gens.size() == n);
  for (size_t i = 0; i < n; ++i) {
    const auto& s = b.seqs[order[i]];
    const auto& got = gens[i].tokens;
    REQUIRE(got.size() == s.greedy.size());
    for (size_t k = 0; k < got.size() && (k == 0 || got[k - 1] == s.greedy[k - 1]); ++k)
      if (s.greedy_margin[k] > 0.05)
        CHECK_MESSAGE(got[k] == s.greedy[k], name << " prompt " << order[i] << " token " << k
                                                  << ": " << got[k] << " != HF " << s.greedy[k]);
  }
  MESSAGE(fmt::format("{} on the GPU through the Engine: {}", name, judge.summary()));
  CHECK(judge.failures == 0);
  CHECK(judge.argmax_failures == 0);
}

} // namespace

TEST_CASE("cuda engine: hf batch fixture yarn4k_batch3 (past 4096, ring wrap, 3 prompts)") {
  XSERV_REQUIRE_GPU();
  check_cuda_chunked("yarn4k_batch3", 100, 5);
}

TEST_CASE("cuda engine: hf batch fixture yarn4k_batch3 through the Engine") {
  XSERV_REQUIRE_GPU();
  check_cuda_engine("yarn4k_batch3", 96);
}

TEST_CASE("cuda engine: hf batch fixture vocab201k_gqa8 (full vocabulary, 8:1 heads)") {
  XSERV_REQUIRE_GPU();
  check_cuda_chunked("vocab201k_gqa8", 8, 2);
}

TEST_CASE("cuda engine: hf batch fixture vocab201k_gqa8 through the Engine") {
  XSERV_REQUIRE_GPU();
  check_cuda_engine("vocab201k_gqa8", 12);
}
