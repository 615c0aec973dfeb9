// Request::prompt_logprobs: each prompt token's log-probability given the tokens before it (an
// echoed completion's, for loglikelihood scoring), on the fake model whose logits hash every
// position a step reads, so that each row can be had again from a request of that prefix alone.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "engine/engine.h"
#include "tests/engine/fake_model.h"

using namespace xserv;
using engine::Engine;
using engine::EngineOptions;
using engine::Event;
using engine::FinishReason;
using engine::PromptLogprob;
using engine::Request;
using xserv::testing::FakeModel;

namespace {

Request make_request(std::vector<int32_t> prompt, int64_t max_tokens, int prompt_logprobs = -1) {
  Request r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.prompt_logprobs = prompt_logprobs;
  return r;
}

std::vector<int32_t> prompt_of(int n, int32_t first) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    p[size_t(i)] = (first + i * 11) % FakeModel::kVocab;
  return p;
}

/// Every event of each (request, choice), stepping until idle.
std::map<std::pair<engine::RequestId, int>, std::vector<Event>> drain(Engine& e) {
  std::map<std::pair<engine::RequestId, int>, std::vector<Event>> out;
  while (!e.idle())
    for (Event& ev : e.step())
      out[{ev.id, ev.choice}].push_back(std::move(ev));
  return out;
}

/// The logits row of position p of `prompt`: the first token's row of a request of prompt[0..p]
/// alone, on a fresh model.
std::vector<float> row_at(const std::vector<int32_t>& prompt, size_t p) {
  FakeModel m(2, 64);
  EngineOptions o;
  o.prefix_caching = false;
  Engine e(m, o);
  Request r = make_request({prompt.begin(), prompt.begin() + std::ptrdiff_t(p + 1)}, 1);
  r.return_logits = true;
  const auto id = e.add(r);
  return drain(e).at({id, 0}).front().logits;
}

/// Checks `got` against the rows of `prompt`'s positions: token p + 1 under position p's row,
/// and the `top` most likely ids there in order.
void check_scores(const std::vector<PromptLogprob>& got, const std::vector<int32_t>& prompt,
                  size_t top) {
  REQUIRE(got.size() == prompt.size() - 1);
  for (size_t p = 0; p + 1 < prompt.size(); ++p) {
    CAPTURE(p);
    const std::vector<float> row = row_at(prompt, p);
    REQUIRE(row.size() == size_t(FakeModel::kVocab));
    double z = 0;
    for (float x : row)
      z += std::exp(double(x));
    CHECK(got[p].token == prompt[p + 1]);
    CHECK(got[p].logprob == doctest::Approx(double(row[size_t(prompt[p + 1])]) - std::log(z)));
    REQUIRE(got[p].top.size() == top);
    for (size_t i = 0; i < top; ++i) {
      const auto best =
          static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
      if (i == 0)
        CHECK(got[p].top[0].token == best);
      else
        CHECK(got[p].top[i].logprob <= got[p].top[i - 1].logprob);
      CHECK(got[p].top[i].logprob ==
            doctest::Approx(double(row[size_t(got[p].top[i].token)]) - std::log(z)));
    }
  }
}

/// The generated tokens of an event list.
std::vector<int32_t> tokens_of(const std::vector<Event>& events) {
  std::vector<int32_t> t;
  for (const Event& ev : events)
    if (ev.token >= 0)
      t.push_back(ev.token);
  return t;
}

} // namespace

TEST_CASE("engine: prompt log-probabilities come from each position's row, one position a step") {
  FakeModel m(4, 64);
  Engine e(m);
  const std::vector<int32_t> prompt = prompt_of(12, 3);
  const auto id = e.add(make_request(prompt, 3, 4));
  const auto events = drain(e).at({id, 0});
  REQUIRE(events.size() == 3);
  check_scores(events[0].prompt_logprobs, prompt, 4);
  CHECK(events[1].prompt_logprobs.empty()); // on the first token's event only
  CHECK(events[2].finish == FinishReason::Length);
  // Every position was computed alone, and the tokens are those of the plain request.
  for (const auto& s : m.steps())
    CHECK(s.tokens.at(0).size() == 1);
  CHECK(m.steps().size() == prompt.size() + 2);
  FakeModel plain_model(4, 64);
  Engine plain(plain_model);
  const auto pid = plain.add(make_request(prompt, 3));
  CHECK(tokens_of(events) == tokens_of(drain(plain).at({pid, 0})));
  CHECK(e.stats().prompt_tokens == int64_t(prompt.size()));
}

TEST_CASE("engine: a scored prompt is computed whole even when its prefix is cached") {
  FakeModel m(4, 64);
  Engine e(m);
  const std::vector<int32_t> prompt = prompt_of(17, 5);
  const auto first = e.add(make_request(prompt, 2));
  drain(e);
  const int64_t hits = e.stats().prefix_hits;
  const size_t steps = m.steps().size();
  const auto id = e.add(make_request(prompt, 2, 0));
  const auto events = drain(e).at({id, 0});
  CHECK(e.stats().prefix_hits == hits);
  CHECK(m.steps().size() - steps == prompt.size() + 1);
  check_scores(events.at(0).prompt_logprobs, prompt, 0);
  // A plain request after it still starts from the cached prefix.
  const auto again = e.add(make_request(prompt, 2));
  drain(e);
  CHECK(e.stats().prefix_hits > hits);
  CHECK(first != again);
}

TEST_CASE("engine: a request preempted while scoring its prompt reports each position once") {
  // Room for one sequence of 64 positions and a few blocks more: six scoring requests of up to
  // 30 positions cannot all stay.
  FakeModel m(6, 64, 16 + 1 + 4);
  Engine e(m);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<engine::RequestId> ids;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(prompt_of(14 + 3 * i, 2 * i + 1));
    ids.push_back(e.add(make_request(prompts.back(), 12, 1)));
  }
  const auto events = drain(e);
  CHECK(e.stats().preemptions > 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    CAPTURE(i);
    const auto& ev = events.at({ids[i], 0});
    CHECK(ev.back().finish == FinishReason::Length);
    check_scores(ev.front().prompt_logprobs, prompts[i], 1);
  }
}

TEST_CASE("engine: every choice of an n > 1 request carries the prompt's log-probabilities") {
  FakeModel m(4, 64);
  Engine e(m);
  const std::vector<int32_t> prompt = prompt_of(9, 7);
  Request r = make_request(prompt, 4, 2);
  r.n = 3;
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 5;
  const auto id = e.add(r);
  const auto events = drain(e);
  for (int c = 0; c < 3; ++c) {
    CAPTURE(c);
    check_scores(events.at({id, c}).front().prompt_logprobs, prompt, 2);
  }
}

TEST_CASE("engine: prompt log-probabilities refused out of range, and a broken row ends the "
          "request") {
  FakeModel m(2, 64);
  Engine e(m);
  try {
    e.add(make_request({1, 2, 3}, 2, 21));
    FAIL("prompt_logprobs 21 accepted");
  } catch (const std::exception& ex) {
    CHECK(std::string(ex.what()).find("prompt_logprobs 21 is outside [0, 20]") !=
          std::string::npos);
  }
  m.poison(40, std::nanf(""));
  Request r = make_request({40, 2, 3, 4, 5}, 2, 0);
  r.n = 2;
  const auto id = e.add(r);
  const auto healthy = e.add(make_request(prompt_of(6, 1), 3, 0));
  const auto events = drain(e);
  for (int c = 0; c < 2; ++c) {
    CAPTURE(c);
    const Event& last = events.at({id, c}).back();
    CHECK(last.finish == FinishReason::Error);
    CHECK(last.token == -1);
    CHECK(last.error.find("non-finite logits (NaN or infinity) at engine step 0, prompt "
                          "position 0") == 0);
  }
  CHECK(events.at({healthy, 0}).back().finish == FinishReason::Length);
  check_scores(events.at({healthy, 0}).front().prompt_logprobs, prompt_of(6, 1), 0);
}

TEST_CASE("engine: max_tokens 0 with prompt log-probabilities ends with the scores alone") {
  FakeModel m(4, 64);
  Engine e(m);
  const std::vector<int32_t> prompt = prompt_of(10, 9);
  Request r = make_request(prompt, 0, 3);
  r.n = 2;
  const auto id = e.add(r);
  const auto events = drain(e);
  for (int c = 0; c < 2; ++c) {
    CAPTURE(c);
    const auto& ev = events.at({id, c});
    REQUIRE(ev.size() == 1);
    CHECK(ev[0].token == -1);
    CHECK(ev[0].finish == FinishReason::Length);
    CHECK(ev[0].generated_tokens == 0);
    check_scores(ev[0].prompt_logprobs, prompt, 3);
  }
  CHECK(m.steps().size() == prompt.size() - 1); // the last position is never computed
  CHECK(e.stats().finished_length == 2);
  CHECK(e.idle());
  for (auto [max_tokens, lp, n] : {std::tuple{0, -1, 3}, std::tuple{0, 2, 1}}) {
    try {
      e.add(make_request(prompt_of(n, 1), max_tokens, lp));
      FAIL("accepted");
    } catch (const std::exception& ex) {
      CHECK(std::string(ex.what()).find(lp < 0 ? "max_tokens 0 is below 1 (0 only with "
                                                 "prompt_logprobs)"
                                               : "needs at least 2 tokens") != std::string::npos);
    }
  }
}

TEST_CASE("engine: scored positions spend the step's token budget") {
  // Newcomers scoring their prompts join one position each; with a 30-token prompt waiting too,
  // no step goes past max_tokens_per_step.
  FakeModel m(6, 64);
  EngineOptions o;
  o.max_tokens_per_step = 8;
  Engine e(m, o);
  std::vector<std::pair<engine::RequestId, std::vector<int32_t>>> scored;
  for (int i = 0; i < 5; ++i) {
    const std::vector<int32_t> p = prompt_of(6 + i, i + 2);
    scored.push_back({e.add(make_request(p, 2, 0)), p});
  }
  e.add(make_request(prompt_of(30, 40), 2));
  const auto events = drain(e);
  for (const auto& s : m.steps()) {
    size_t n = 0;
    for (const auto& t : s.tokens)
      n += t.size();
    CHECK(n <= 8);
  }
  for (const auto& [id, p] : scored)
    check_scores(events.at({id, 0}).front().prompt_logprobs, p, 0);
}
