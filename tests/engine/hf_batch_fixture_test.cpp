// Holds the CPU engine to HF transformers on the batch fixtures: prompts of different lengths
// run together, in chunks through the KV cache and through the Engine.
//
// The fixtures (tests/fixtures/*/fixture.json with "prompts"; tools/make_fixtures.py) reach
// what the single-prompt ones do not: the SwiGLU clamp on both sides, the 128-slot ring of a
// sliding layer wrapping, positions past YaRN's original 4096, 8 query heads per KV head, the
// full 201,088-token vocabulary, greedy continuations that are not a cycle. Each test
// re-synthesizes the checkpoint, checks its sha256s, and then:
//   1. teacher-forced: every prompt + HF's continuation, all in one batch (cache rows in reverse
//      order), fed in chunks of a different size per prompt, the later prompts joining a few
//      steps in, so each step mixes chunks at different context lengths and ring offsets and
//      prompts drop out as they end; every stored position's logits must match HF's;
//   2. the Engine: the prompts as requests with a small token budget per step, so long prompts
//      are prefilled in chunks beside the other prompts' decode tokens; the greedy tokens must
//      be HF's exactly and each generated token's logits row HF's.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "engine/cpu_model.h"
#include "engine/engine.h"
#include "ir/interpreter.h"
#include "models/gpt_oss.h"
#include "models/step.h"
#include "tests/engine/hf_batch_fixture.h"
#include "tests/step_input.h"

namespace {

namespace engine = xserv::engine;
namespace ir = xserv::ir;
namespace models = xserv::models;
using xserv::testing::HfBatch;
using xserv::testing::HfJudge;
using xserv::testing::TempDir;

/// Tolerances of one fixture (measured figures at the test cases).
struct Limits {
  double rel_l2; ///< per stored row, over its stored columns
  double lse;    ///< |logsumexp difference| over the full row (sampled columns only)
  double margin; ///< argmax compared where HF's top-2 margin exceeds this
};

/// 1. Teacher-forced batch in chunks: prompt b joins at step `stagger * b` (so a step holds
/// prompts at very different context lengths) and its chunks hold `chunk + 7 b` tokens.
void check_chunked(const std::string& name, size_t chunk, size_t stagger, const Limits& lim) {
  const HfBatch b = xserv::testing::load_hf_batch(name);
  TempDir tmp(name);
  xserv::testing::synthesize_hf_batch(b, tmp.path);
  const auto config = models::ModelConfig::load(tmp.path / "config.json");
  const ir::Graph all = models::build_gpt_oss(config, {.last_logits_only = false});
  const size_t n = b.seqs.size();
  engine::CpuModel model(tmp.path, static_cast<int64_t>(n), b.max_len(), &all);
  HfJudge judge(b, lim.rel_l2, lim.lse, lim.margin);
  std::vector<std::vector<int32_t>> tokens;
  for (const auto& s : b.seqs)
    tokens.push_back(s.tokens());
  std::vector<size_t> done(n, 0);
  size_t step_index = 0;
  size_t steps = 0, mixed = 0;
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
    ++steps;
    mixed += seq_of.size() > 1;
    xserv::testing::use_rows(step, kv_rows, model.kv_geometry());
    const std::vector<ir::Tensor> out = model.run_graph(all, models::step_params(step));
    const ir::Tensor& logits = out.at(0);
    const auto vocab = static_cast<size_t>(logits.shape.back());
    size_t row = 0;
    for (size_t i = 0; i < seq_of.size(); ++i) {
      const size_t s = seq_of[i];
      for (size_t t = 0; t < step.tokens[i].size(); ++t, ++row)
        judge.add(s, static_cast<int64_t>(done[s] + t), logits.f.data() + row * vocab, vocab);
      done[s] += step.tokens[i].size();
    }
    REQUIRE(row * vocab == logits.f.size());
  }
  MESSAGE(fmt::format("{} teacher-forced, {} steps ({} with several prompts): {}", name, steps,
                      mixed, judge.summary()));
  judge.check(xserv::testing::stored_rows(b));
}

/// 2. The Engine with `budget` tokens per step: HF's greedy tokens, and each generated token's
/// logits row within the limits.
void check_engine(const std::string& name, int64_t budget, const Limits& lim) {
  const HfBatch b = xserv::testing::load_hf_batch(name);
  TempDir tmp(name);
  xserv::testing::synthesize_hf_batch(b, tmp.path);
  const size_t n = b.seqs.size();
  engine::CpuModel model(tmp.path, static_cast<int64_t>(n), b.max_len());
  // Shortest prompt first: it decodes while the longer ones are still being prefilled.
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t x, size_t y) { return b.seqs[x].prompt.size() < b.seqs[y].prompt.size(); });
  std::vector<xserv::engine::Request> reqs;
  size_t expected_rows = 0;
  for (size_t s : order) {
    xserv::engine::Request r;
    r.prompt = b.seqs[s].prompt;
    r.max_tokens = static_cast<int64_t>(b.seqs[s].greedy.size());
    r.return_logits = true;
    reqs.push_back(r);
    const auto first = static_cast<int64_t>(r.prompt.size()) - 1;
    for (const auto& [pos, row] : b.seqs[s].row_of)
      expected_rows += pos >= first && pos < first + r.max_tokens;
  }
  HfJudge judge(b, lim.rel_l2, lim.lse, lim.margin);
  xserv::engine::EngineOptions opts;
  opts.max_running = static_cast<int64_t>(n);
  opts.max_tokens_per_step = budget;
  const auto on_event = [&](size_t i, const xserv::engine::Event& ev) {
    if (ev.token >= 0) {
      const size_t s = order[i];
      const auto pos = static_cast<int64_t>(b.seqs[s].prompt.size()) + ev.generated_tokens - 2;
      judge.add(s, pos, ev.logits.data(), ev.logits.size());
    }
    return true;
  };
  const auto gens = xserv::engine::generate(model, reqs, on_event, opts);
  REQUIRE(gens.size() == n);
  for (size_t i = 0; i < n; ++i)
    CHECK_MESSAGE(gens[i].tokens == b.seqs[order[i]].greedy, name << " prompt " << order[i]);
  MESSAGE(fmt::format("{} engine, budget {} tokens per step: {}", name, budget, judge.summary()));
  judge.check(expected_rows);
}

} // namespace

// Measured 2026-12-01 against HF transformers 5.24 / torch 2.15 float32 on the CPU (this file's
// MESSAGEs), worst stored row of the teacher-forced and the Engine runs alike:
//   yarn4k_batch3   2.65e-6 (1.4e-6 past position 4096)
//   vocab201k_gqa8  1.98e-6; |logsumexp difference| 4.1e-9
// About ten times tiny2l's 2.4e-7, at short positions as much as past 4096: these checkpoints'
// experts run with scale bytes 124..126 (so that the clamp bites), their outputs far larger than
// the rest of the residual stream, which is the likely cause (not separated further: HF's and
// our fp32 roundings of those sums both reach the logits). Limits are 2x to 2.5x the worst
// figure; the argmax must be HF's wherever HF's margin exceeds the near-tie bound
// make_fixtures.py keeps greedy steps above (1e-4).
constexpr Limits kYarn4k{.rel_l2 = 5e-6, .lse = 0, .margin = 1e-4};
constexpr Limits kVocab{.rel_l2 = 5e-6, .lse = 4e-8, .margin = 1e-4};

TEST_CASE("hf batch fixture yarn4k_batch3: 3 prompts in chunks, past position 4096, ring wrap") {
  check_chunked("yarn4k_batch3", 100, 5, kYarn4k);
}

TEST_CASE("hf batch fixture yarn4k_batch3: the Engine, chunked prefill beside decode") {
  check_engine("yarn4k_batch3", 96, kYarn4k);
}

TEST_CASE("hf batch fixture vocab201k_gqa8: full vocabulary, 8:1 heads, in chunks") {
  check_chunked("vocab201k_gqa8", 8, 2, kVocab);
}

TEST_CASE("hf batch fixture vocab201k_gqa8: the Engine, chunked prefill beside decode") {
  check_engine("vocab201k_gqa8", 12, kVocab);
}
