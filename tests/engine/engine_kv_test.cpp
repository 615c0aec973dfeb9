// The Engine over the paged KV cache: preemption when the pools run dry, prefix caching (a
// shared prompt, a chat's next turn), n > 1 choices sharing a prompt's blocks, on a fake model
// whose logits hash every position it reads through the block tables (any paging mistake
// changes tokens or throws) and do not depend on chunking or on which prefix was cached.
#include <doctest/doctest.h>

#include <map>
#include <numeric>
#include <set>

#include "base/error.h"
#include "engine/engine.h"
#include "tests/engine/fake_model.h"

using namespace xserv;
using engine::Engine;
using engine::EngineOptions;
using engine::Event;
using engine::FinishReason;
using engine::Request;
using xserv::testing::FakeModel;

namespace {

Request make_request(std::vector<int32_t> prompt, int64_t max_tokens) {
  Request r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  return r;
}

std::vector<int32_t> prompt_of(int n, int32_t first) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    p[size_t(i)] = (first + i * 13) % FakeModel::kVocab;
  return p;
}

/// Each (request, choice)'s tokens and last event, stepping until idle.
struct Drained {
  std::map<std::pair<engine::RequestId, int>, std::vector<int32_t>> tokens;
  std::map<std::pair<engine::RequestId, int>, Event> last;
};

Drained drain(Engine& e, Drained d = {}) {
  while (!e.idle())
    for (const Event& ev : e.step()) {
      if (ev.token >= 0)
        d.tokens[{ev.id, ev.choice}].push_back(ev.token);
      d.last[{ev.id, ev.choice}] = ev;
    }
  return d;
}

/// The tokens of `r` alone on a fresh model with roomy pools (window `window`).
std::vector<int32_t> alone(const Request& r, int64_t window = 0) {
  FakeModel m(4, 64, 0, window);
  EngineOptions o;
  o.prefix_caching = false;
  Engine e(m, o);
  const auto id = e.add(r);
  return drain(e).tokens[{id, 0}];
}

/// Tokens the model computed over all its steps.
int64_t computed(const FakeModel& m) {
  int64_t n = 0;
  for (const auto& s : m.steps())
    for (const auto& t : s.tokens)
      n += int64_t(t.size());
  return n;
}

} // namespace

TEST_CASE(
    "engine kv: a dry pool preempts the newest, and every request still gets its own tokens") {
  for (int64_t window : {0, 8}) {
    CAPTURE(window);
    // Room for one sequence of 64 positions and 4 blocks more (the null block aside): eight
    // requests of up to 50 positions cannot all stay.
    const int64_t ring = window > 0 ? (window + 3) / 4 + 1 : 0;
    FakeModel m(8, 64, 16 + 1 + 4, window, window > 0 ? 2 * ring + 1 + 6 : 0);
    EngineOptions o;
    o.max_tokens_per_step = 16; // chunked prompts beside decodes
    Engine e(m, o);
    std::vector<Request> reqs;
    std::vector<engine::RequestId> ids;
    for (int i = 0; i < 8; ++i) {
      reqs.push_back(make_request(prompt_of(10 + 3 * i, i + 1), 20));
      ids.push_back(e.add(reqs.back()));
    }
    const Drained d = drain(e);
    for (size_t i = 0; i < ids.size(); ++i) {
      CAPTURE(i);
      CHECK(d.last.at({ids[i], 0}).finish == FinishReason::Length);
      CHECK(d.tokens.at({ids[i], 0}) == alone(reqs[i], window));
    }
    const engine::EngineStats st = e.stats();
    CHECK(st.preemptions > 0);
    CHECK(st.finished_length == 8);
    CHECK(st.kv_blocks_used == 0);
    CHECK(st.kv_window_blocks_used == 0);
  }
}

TEST_CASE("engine kv: a shared prompt prefix is computed once, and tokens do not change") {
  for (int64_t window : {0, 8}) {
    for (bool caching : {true, false}) {
      CAPTURE(window);
      CAPTURE(caching);
      FakeModel m(4, 64, 0, window);
      EngineOptions o;
      o.prefix_caching = caching;
      Engine e(m, o);
      const std::vector<int32_t> system = prompt_of(24, 5); // 6 blocks
      std::vector<Request> reqs;
      for (int i = 0; i < 3; ++i) {
        std::vector<int32_t> p = system;
        for (int j = 0; j < 5; ++j)
          p.push_back((40 + 11 * i + j) % FakeModel::kVocab);
        reqs.push_back(make_request(p, 6));
      }
      // The first alone, then the other two: both start from the cached 24 positions.
      const auto a = e.add(reqs[0]);
      Drained d = drain(e);
      const auto b = e.add(reqs[1]);
      const auto c = e.add(reqs[2]);
      d = drain(e, d);
      CHECK(d.tokens.at({a, 0}) == alone(reqs[0], window));
      CHECK(d.tokens.at({b, 0}) == alone(reqs[1], window));
      CHECK(d.tokens.at({c, 0}) == alone(reqs[2], window));
      const engine::EngineStats st = e.stats();
      CHECK(st.prefix_queries == 3 * 29);
      CHECK(st.prefix_hits == (caching ? 2 * 24 : 0));
      // Prompts of 29, and 6 tokens each (the last never fed back): what was not cached.
      CHECK(computed(m) == 3 * (29 + 5) - st.prefix_hits);
    }
  }
}

TEST_CASE("engine kv: a chat's next turn starts from the cached history, generated tokens too") {
  FakeModel m(2, 64);
  Engine e(m);
  const Request turn1 = make_request(prompt_of(13, 3), 9);
  const auto a = e.add(turn1);
  const Drained d1 = drain(e);
  const std::vector<int32_t>& reply = d1.tokens.at({a, 0});
  REQUIRE(reply.size() == 9);
  // Turn 2: the history (prompt and reply) and 6 new tokens.
  std::vector<int32_t> p2 = turn1.prompt;
  p2.insert(p2.end(), reply.begin(), reply.end());
  for (int j = 0; j < 6; ++j)
    p2.push_back(60 + j);
  const Request turn2 = make_request(p2, 5);
  const int64_t hits_before = e.stats().prefix_hits;
  const auto b = e.add(turn2);
  const Drained d2 = drain(e);
  // The history's KV holds positions 0..20 (13 prompt, 8 fed-back reply tokens): its 5 whole
  // blocks come back.
  CHECK(e.stats().prefix_hits - hits_before == 20);
  CHECK(d2.tokens.at({b, 0}) == alone(turn2));
}

TEST_CASE("engine kv: n choices share the prompt, and greedy ones equal the plain run") {
  for (int64_t window : {0, 8}) {
    CAPTURE(window);
    FakeModel m(8, 64, 0, window);
    Engine e(m);
    Request r = make_request(prompt_of(10, 7), 8); // 10: a partly filled last block, copied
    const std::vector<int32_t> want = alone(r, window);
    r.n = 4;
    const auto id = e.add(r);
    const Drained d = drain(e);
    for (int c = 0; c < 4; ++c) {
      CAPTURE(c);
      CHECK(d.tokens.at({id, c}) == want);
      CHECK(d.last.at({id, c}).finish == FinishReason::Length);
    }
    // The prompt was computed once; then each choice fed back its own 7 tokens.
    CHECK(computed(m) == 10 + 4 * 7);
    size_t copies = 0;
    for (const auto& s : m.steps())
      copies += s.copies.size();
    CHECK(copies == size_t(window > 0 ? 6 : 3)); // the last block, for each of 3 new choices
    CHECK(e.stats().kv_blocks_used == 0);
  }
}

TEST_CASE("engine kv: n choices with a seed equal requests with the derived seeds") {
  FakeModel m(8, 64);
  Engine e(m);
  Request r = make_request(prompt_of(9, 2), 10);
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 1234;
  r.n = 3;
  const auto id = e.add(r);
  const Drained d = drain(e);
  std::set<std::vector<int32_t>> distinct;
  for (int c = 0; c < 3; ++c) {
    Request one = r;
    one.n = 1;
    one.sampling.seed = 1234 + uint64_t(c);
    CAPTURE(c);
    CHECK(d.tokens.at({id, c}) == alone(one));
    distinct.insert(d.tokens.at({id, c}));
  }
  CHECK(distinct.size() == 3); // the seeds differ, and so do the samples
}

TEST_CASE("engine kv: a fork without blocks waits and recomputes, and an abort ends every choice") {
  // Room for the parent's whole sequence and little more: the choices cannot all fork at once.
  FakeModel m(4, 64, 16 + 1 + 1);
  Engine e(m);
  Request r = make_request(prompt_of(6, 4), 5);
  const std::vector<int32_t> want = alone(r);
  r.n = 3;
  const auto id = e.add(r);
  const Drained d = drain(e);
  for (int c = 0; c < 3; ++c)
    CHECK(d.tokens.at({id, c}) == want);

  FakeModel m2(4, 64);
  Engine e2(m2);
  Request long_one = make_request(prompt_of(6, 4), 40);
  long_one.n = 3;
  const auto id2 = e2.add(long_one);
  for (int i = 0; i < 4; ++i)
    e2.step();
  e2.abort(id2);
  std::vector<Event> ev = e2.step();
  REQUIRE(ev.size() == 3);
  for (int c = 0; c < 3; ++c) {
    CHECK(ev[size_t(c)].id == id2);
    CHECK(ev[size_t(c)].choice == c);
    CHECK(ev[size_t(c)].finish == FinishReason::Abort);
  }
  CHECK(e2.idle());
  CHECK(e2.stats().finished_abort == 3);
}

TEST_CASE("engine kv: n is checked against the choices limit and the running limit") {
  FakeModel m(4, 64);
  Engine e(m);
  Request r = make_request({1, 2, 3}, 4);
  r.n = 0;
  CHECK_THROWS_WITH_AS(e.add(r), doctest::Contains("n 0 is outside [1, 4]"), Error);
  r.n = 5;
  CHECK_THROWS_WITH_AS(e.add(r), doctest::Contains("n 5 is outside [1, 4]"), Error);
  r.n = 4;
  CHECK_NOTHROW(e.add(r));
  r.n = 2;
  CHECK_THROWS_WITH_AS(engine::generate(m, {r}), doctest::Contains("one choice a request"), Error);
}

TEST_CASE("engine kv: with decodes in the step, prompt tokens stop at the prefill budget or the "
          "backlog share") {
  FakeModel m(4, 64);
  EngineOptions o;
  o.prefill_budget = 8;
  o.backlog_steps = 0; // a fixed budget
  Engine e(m, o);
  e.add(make_request(prompt_of(5, 1), 30));
  e.step(); // its prompt, alone: no budget but the step's
  e.add(make_request(prompt_of(40, 2), 3));
  e.add(make_request(prompt_of(40, 3), 3));
  Drained d = drain(e);
  for (const auto& s : m.steps()) {
    size_t decodes = 0, prompt = 0;
    for (const auto& t : s.tokens)
      (t.size() == 1 ? decodes : prompt) += t.size();
    if (decodes > 0)
      CHECK(prompt <= 8);
  }
  // Alone, a prompt takes the whole step budget.
  FakeModel m2(4, 64);
  Engine e2(m2, o);
  e2.add(make_request(prompt_of(40, 2), 3));
  e2.step();
  REQUIRE(m2.steps().size() == 1);
  CHECK(m2.steps()[0].tokens[0].size() == 40);

  // A backlog of 80 prompt tokens over 4 steps: 20 a step beside the decodes, not 8.
  o.backlog_steps = 4;
  FakeModel m3(4, 64);
  Engine e3(m3, o);
  e3.add(make_request(prompt_of(5, 1), 30));
  e3.step();
  e3.add(make_request(prompt_of(40, 2), 3));
  e3.add(make_request(prompt_of(40, 3), 3));
  e3.step();
  REQUIRE(m3.steps().size() == 2);
  size_t prompt = 0;
  for (const auto& t : m3.steps()[1].tokens)
    prompt += t.size() == 1 ? 0 : t.size();
  CHECK(prompt == 20);
  drain(e3);
}

TEST_CASE("engine kv: a preempted sequence feeds back its uncached generated tokens one a step") {
  // Two requests whose blocks cannot all stay: the younger is preempted mid-decode. With its
  // blocks still in the prefix cache when it comes back, it recomputes only the tokens past
  // them, one a step as a decode (a prompt chunk of them would run other kernels).
  FakeModel m(2, 64, 16 + 1 + 10);
  Engine e(m);
  const Request a = make_request(prompt_of(20, 1), 40), b = make_request(prompt_of(16, 2), 40);
  const auto ia = e.add(a);
  const auto ib = e.add(b);
  const Drained d = drain(e);
  CHECK(d.tokens.at({ia, 0}) == alone(a));
  CHECK(d.tokens.at({ib, 0}) == alone(b));
  REQUIRE(e.stats().preemptions > 0);
  CHECK(e.stats().prefix_hits > 16); // it came back from its own cached blocks
  // Every step entry of several tokens is a prompt (a's 20 or b's 16), never generated tokens.
  for (const auto& s : m.steps())
    for (size_t i = 0; i < s.tokens.size(); ++i)
      if (s.tokens[i].size() > 1)
        CHECK(s.ctx_lens[i] + int64_t(s.tokens[i].size()) <= 20);
}
