// The Engine over the real model on the CPU interpreter (tiny gpt-oss, random weights): each
// request gets the same tokens alone and in any mix of joins, chunked prompts and reused rows.
#include <doctest/doctest.h>

#include <map>
#include <set>

#include "engine/cpu_model.h"
#include "engine/engine.h"
#include "models/config.h"
#include "models/gpt_oss.h"
#include "models/synth.h"
#include "tests/test_util.h"

using namespace xserv;
using engine::Engine;
using engine::EngineOptions;
using engine::Event;
using engine::Request;

namespace {

/// The tiny example model (2 layers, a sliding window of 8, the full 201k vocabulary),
/// synthesized once per test run.
const std::filesystem::path& tiny() {
  static const xserv::testing::TempDir dir("engine_cpu");
  static const std::filesystem::path model = [] {
    const std::filesystem::path out = dir.path / "tiny";
    models::SynthOptions o;
    o.seed = 3;
    models::synth_checkpoint(
        models::ModelConfig::load(xserv::testing::source_dir() / "examples/tiny/config.json"), out,
        o);
    return out;
  }();
  return model;
}

Request request(size_t len, int32_t seed, int64_t max_tokens) {
  Request r;
  for (size_t i = 0; i < len; ++i)
    r.prompt.push_back(static_cast<int32_t>((seed * 7919 + int32_t(i) * 104729) % 200000));
  r.max_tokens = max_tokens;
  r.return_logits = true;
  return r;
}

struct Output {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
};

/// Steps `e` until idle, `joins[k]` added before step k.
std::map<engine::RequestId, Output> run(Engine& e, std::map<int, std::vector<Request>> joins,
                                        std::vector<engine::RequestId>* ids) {
  std::map<engine::RequestId, Output> out;
  for (int k = 0; !e.idle() || joins.count(k) || k <= joins.rbegin()->first; ++k) {
    for (Request& r : joins[k])
      ids->push_back(e.add(std::move(r)));
    for (Event& ev : e.step())
      if (ev.token >= 0) {
        out[ev.id].tokens.push_back(ev.token);
        out[ev.id].logits.push_back(std::move(ev.logits));
      }
  }
  return out;
}

Output alone(const Request& r) {
  engine::CpuModel m(tiny(), 1, 64);
  Engine e(m);
  std::vector<engine::RequestId> ids;
  auto out = run(e, {{0, {r}}}, &ids);
  return out[ids.at(0)];
}

} // namespace

TEST_CASE("engine on the interpreter: tokens alone equal tokens in a mix with chunked prompts") {
  // Prompts longer than the sliding window (8), so its ring wraps, in chunks of up to 5 tokens
  // that start mid-window; requests join while others decode.
  const std::vector<Request> reqs = {request(3, 1, 9), request(13, 2, 6), request(20, 3, 8),
                                     request(9, 4, 7)};
  std::vector<Output> want;
  for (const Request& r : reqs)
    want.push_back(alone(r));
  // A non-degenerate continuation, so that equal tokens mean something.
  CHECK(std::set<int32_t>(want[2].tokens.begin(), want[2].tokens.end()).size() > 2);

  engine::CpuModel m(tiny(), 3, 64);
  EngineOptions o;
  o.max_tokens_per_step = 5;
  Engine e(m, o);
  std::vector<engine::RequestId> ids;
  auto got = run(e, {{0, {reqs[0], reqs[1]}}, {2, {reqs[2]}}, {3, {reqs[3]}}}, &ids);
  REQUIRE(ids.size() == 4);
  size_t rows = 0, bitwise = 0;
  double worst = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    CAPTURE(i);
    const Output& g = got[ids[i]];
    CHECK(g.tokens == want[i].tokens);
    REQUIRE(g.logits.size() == want[i].logits.size());
    for (size_t t = 0; t < g.logits.size(); ++t) {
      ++rows;
      bitwise += g.logits[t] == want[i].logits[t];
      worst = std::max(worst, xserv::testing::rel_l2(g.logits[t], want[i].logits[t]));
    }
  }
  MESSAGE("interpreter batch invariance: " << bitwise << " of " << rows
                                           << " logits rows bitwise, worst rel L2 " << worst);
  // The interpreter accumulates every dot product in double in a fixed order per row, so the
  // rows of a sequence do not depend on what shares its step, nor on how its prompt is cut.
  CHECK(bitwise == rows);
}

TEST_CASE("engine on the interpreter: logits rows are bitwise the same for any prefill chunk") {
  // A 40-token prompt (five sliding windows) prefilled whole, in chunks of 16, 7 and 1 tokens
  // (each chunk a step of its own), then 6 greedy steps: every logits row equal to the whole
  // prompt's run, bit for bit (issue: batch invariance, the interpreter's half).
  const Request r = request(40, 9, 6);
  const Output whole = alone(r);
  REQUIRE(whole.logits.size() == 6);
  for (int64_t chunk : {16, 7, 1}) {
    CAPTURE(chunk);
    engine::CpuModel m(tiny(), 1, 64);
    EngineOptions o;
    o.max_tokens_per_step = chunk;
    Engine e(m, o);
    std::vector<engine::RequestId> ids;
    auto got = run(e, {{0, {r}}}, &ids);
    const Output& g = got[ids.at(0)];
    CHECK(g.tokens == whole.tokens);
    REQUIRE(g.logits.size() == whole.logits.size());
    for (size_t t = 0; t < g.logits.size(); ++t)
      CHECK(g.logits[t] == whole.logits[t]);
  }
}

TEST_CASE("engine on the interpreter: a reused row gives a fresh run's tokens") {
  const Request first = request(17, 5, 5), second = request(6, 6, 8);
  engine::CpuModel m(tiny(), 1, 64);
  Engine e(m);
  std::vector<engine::RequestId> ids;
  auto got = run(e, {{0, {first, second}}}, &ids);
  CHECK(got[ids[0]].tokens == alone(first).tokens);
  CHECK(got[ids[1]].tokens == alone(second).tokens);
}

TEST_CASE("engine on the interpreter: an all-logits graph scores a prompt in chunks, bit for bit "
          "the scores of one position a step") {
  // Request::prompt_logprobs on a model whose steps return every token's row (--all-logits):
  // the scored prompts go in chunks (the token budget cuts them), and each position's scores
  // are those of the one-position steps a last-token graph takes.
  const ir::Graph all = models::build_gpt_oss(models::ModelConfig::load(tiny() / "config.json"),
                                              {.last_logits_only = false});
  engine::CpuModel chunked(tiny(), 4, 64, &all), alone(tiny(), 4, 64);
  CHECK(chunked.all_rows());
  CHECK_FALSE(alone.all_rows());
  std::map<std::string, std::vector<std::vector<engine::PromptLogprob>>> scores;
  std::map<std::string, std::vector<std::vector<int32_t>>> tokens;
  for (auto [name, model] : {std::pair{"chunks", &chunked}, std::pair{"alone", &alone}}) {
    EngineOptions o;
    o.max_tokens_per_step = 16; // 23- and 30-token prompts in two chunks each
    Engine e(*model, o);
    std::vector<engine::RequestId> ids;
    for (size_t len : {23, 30}) {
      Request r = request(len, int32_t(len), 3);
      r.prompt_logprobs = 2;
      r.return_logits = false;
      ids.push_back(e.add(std::move(r)));
    }
    std::map<engine::RequestId, std::vector<engine::PromptLogprob>> got;
    std::map<engine::RequestId, std::vector<int32_t>> toks;
    int64_t steps = 0;
    while (!e.idle()) {
      ++steps;
      for (Event& ev : e.step()) {
        if (!ev.prompt_logprobs.empty())
          got[ev.id] = std::move(ev.prompt_logprobs);
        if (ev.token >= 0)
          toks[ev.id].push_back(ev.token);
      }
    }
    for (engine::RequestId id : ids) {
      scores[name].push_back(got[id]);
      tokens[name].push_back(toks[id]);
    }
    CHECK(steps <= (std::string(name) == "chunks" ? 6 : 32));
  }
  for (size_t i = 0; i < 2; ++i) {
    CAPTURE(i);
    const auto &a = scores["chunks"][i], &b = scores["alone"][i];
    REQUIRE(a.size() == (i == 0 ? 22u : 29u));
    REQUIRE(a.size() == b.size());
    for (size_t p = 0; p < a.size(); ++p) {
      CAPTURE(p);
      CHECK(a[p].token == b[p].token);
      CHECK(a[p].logprob == b[p].logprob);
      REQUIRE(a[p].top.size() == 2);
      for (size_t k = 0; k < 2; ++k) {
        CHECK(a[p].top[k].token == b[p].top[k].token);
        CHECK(a[p].top[k].logprob == b[p].top[k].logprob);
      }
    }
    CHECK(tokens["chunks"][i] == tokens["alone"][i]);
  }
}
