// Logit adjustments (logit_bias, presence / frequency / repetition penalties): the arithmetic
// against hand-computed rows, the range checks, and the engine picking from the adjusted row,
// greedy and sampled.
#include <doctest/doctest.h>

#include <set>
#include <vector>

#include "base/error.h"
#include "engine/engine.h"
#include "engine/logit_adjust.h"
#include "tests/engine/fake_model.h"

using namespace xserv;
using engine::LogitAdjustments;

TEST_CASE("logit adjustments: bias, presence and frequency over the output, repetition over "
          "prompt and output") {
  // Prompt 1 2; output 2 3 3 (ids), a row of 6 logits.
  const std::vector<int32_t> tokens = {1, 2, 2, 3, 3};
  const std::vector<float> row = {1.0f, 2.0f, -2.0f, 4.0f, 0.5f, -1.0f};
  auto adjusted = [&](const LogitAdjustments& a) {
    std::vector<float> r = row;
    engine::adjust_logits(a, tokens, 2, r);
    return r;
  };
  LogitAdjustments a;
  CHECK_FALSE(a.any());
  CHECK(adjusted(a) == row);
  a.bias = {{0, -100.0f}, {4, 2.5f}, {99, 5.0f}}; // an id past the row is skipped
  CHECK(a.any());
  CHECK(adjusted(a) == std::vector<float>{-99.0f, 2.0f, -2.0f, 4.0f, 3.0f, -1.0f});
  a = {};
  a.presence_penalty = 0.5f;
  a.frequency_penalty = 0.25f;
  // Output counts: 2 once, 3 twice; the prompt's 1 is not output.
  CHECK(adjusted(a) == std::vector<float>{1.0f, 2.0f, -2.75f, 3.0f, 0.5f, -1.0f});
  a = {};
  a.repetition_penalty = 2.0f; // 1, 2, 3 seen: positive halved, negative doubled
  CHECK(adjusted(a) == std::vector<float>{1.0f, 1.0f, -4.0f, 2.0f, 0.5f, -1.0f});
}

TEST_CASE("logit adjustments: out-of-range values are refused naming the field") {
  LogitAdjustments a;
  a.bias = {{100, 1.0f}};
  CHECK_THROWS_WITH_AS(engine::check_adjustments(a, 100),
                       doctest::Contains("logit_bias: id 100 is outside"), Error);
  a.bias = {{3, 100.5f}};
  CHECK_THROWS_WITH_AS(engine::check_adjustments(a, 100), doctest::Contains("[-100, 100]"),
                       Error);
  a.bias.clear();
  a.presence_penalty = -2.5f;
  CHECK_THROWS_WITH_AS(engine::check_adjustments(a, 100), doctest::Contains("presence_penalty"),
                       Error);
  a.presence_penalty = 0;
  a.repetition_penalty = 0;
  CHECK_THROWS_WITH_AS(engine::check_adjustments(a, 100), doctest::Contains("repetition_penalty"),
                       Error);
  // The engine refuses such a request when it is added.
  testing::FakeModel m(1, 64);
  engine::Engine e(m);
  engine::Request r;
  r.prompt = {1, 2};
  r.adjust.frequency_penalty = 3;
  CHECK_THROWS_WITH_AS(e.add(r), doctest::Contains("frequency_penalty 3 is outside"), Error);
}

TEST_CASE("logit adjustments through the engine: a biased id is picked greedy and sampled, a "
          "banned one never, a presence penalty stops repeats") {
  testing::FakeModel m(4, 128);
  std::vector<engine::Request> reqs(4);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].prompt = {int32_t(3 + i), 9, 11};
    reqs[i].max_tokens = 12;
  }
  const std::vector<engine::Generation> plain = engine::generate(m, reqs);
  reqs[0].adjust.bias = {{42, 100.0f}};
  reqs[1].adjust.bias = {{42, 100.0f}};
  reqs[1].sampling.temperature = 1.0f;
  reqs[1].sampling.seed = 5;
  for (int32_t t : plain[2].tokens) // ban every id the plain run chose
    reqs[2].adjust.bias.emplace_back(t, -100.0f);
  // FakeModel's logits lie in [0, 4): a penalty of 4 puts a used id below every unused one.
  reqs[3].adjust.presence_penalty = 2.0f;
  reqs[3].adjust.frequency_penalty = 2.0f;
  const std::vector<engine::Generation> got = engine::generate(m, reqs);
  CHECK(std::set<int32_t>(plain[3].tokens.begin(), plain[3].tokens.end()).size() < 12);
  CHECK(got[0].tokens == std::vector<int32_t>(12, 42));
  CHECK(got[1].tokens == std::vector<int32_t>(12, 42));
  const std::set<int32_t> banned(plain[2].tokens.begin(), plain[2].tokens.end());
  for (int32_t t : got[2].tokens)
    CHECK(banned.count(t) == 0);
  CHECK(std::set<int32_t>(got[3].tokens.begin(), got[3].tokens.end()).size() == 12);
}
