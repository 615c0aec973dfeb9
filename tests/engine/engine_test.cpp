// The Engine's scheduling: join, leave, abort, token budget, queue, row reuse, per-request
// sampling and finishes, on a fake model whose every logit depends on the whole KV row it reads.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <thread>

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

std::vector<int32_t> iota_prompt(int n, int32_t first) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    p[size_t(i)] = (first + i * 7) % FakeModel::kVocab;
  return p;
}

/// Steps until idle; returns each request's tokens and last event.
struct Drained {
  std::map<engine::RequestId, std::vector<int32_t>> tokens;
  std::map<engine::RequestId, Event> last;
  int steps = 0;
};

/// One step, its events recorded in `d`.
void step(Engine& e, Drained& d) {
  for (const Event& ev : e.step()) {
    if (ev.token >= 0)
      d.tokens[ev.id].push_back(ev.token);
    d.last[ev.id] = ev;
  }
  ++d.steps;
}

Drained drain(Engine& e, Drained d = {}) {
  while (!e.idle())
    step(e, d);
  return d;
}

/// The tokens of `r` run alone on a fresh model.
std::vector<int32_t> alone(const Request& r, int64_t rows = 4) {
  FakeModel m(rows, 64);
  Engine e(m);
  const auto id = e.add(r);
  return drain(e).tokens[id];
}

} // namespace

TEST_CASE("engine: a request gets the same greedy tokens alone and sharing steps") {
  const Request r = make_request(iota_prompt(11, 3), 12);
  const std::vector<int32_t> want = alone(r);
  REQUIRE(want.size() == 12);
  // The fake model's tokens depend on everything cached in the row: a wrong context length, a
  // stale row or another sequence's tokens would change them.
  CHECK(std::set<int32_t>(want.begin(), want.end()).size() > 3);

  FakeModel m(4, 64);
  EngineOptions o;
  o.max_tokens_per_step = 7; // the 11-token prompt takes two steps
  Engine e(m, o);
  Drained d;
  const auto a = e.add(make_request(iota_prompt(5, 1), 20));
  step(e, d);
  const auto id = e.add(r);
  step(e, d);
  const auto b = e.add(make_request(iota_prompt(9, 2), 3));
  d = drain(e, d);
  CHECK(d.tokens[id] == want);
  CHECK(d.tokens[a].size() == 20);
  CHECK(d.tokens[b].size() == 3);
  CHECK(m.max_seqs_in_a_step() == 3);
}

TEST_CASE("engine: the token budget puts decodes first, then prompt chunks in arrival order") {
  FakeModel m(8, 64);
  EngineOptions o;
  o.max_tokens_per_step = 10;
  Engine e(m, o);
  for (int i = 0; i < 3; ++i)
    e.add(make_request(iota_prompt(2, i), 30));
  e.step(); // three 2-token prompts: 6 tokens
  CHECK(m.steps().back().tokens.size() == 3);
  e.add(make_request(iota_prompt(25, 9), 2));
  e.step(); // 3 decodes + 7 of the 25 prompt tokens
  const auto& s = m.steps().back();
  REQUIRE(s.tokens.size() == 4);
  for (int b = 0; b < 3; ++b)
    CHECK(s.tokens[size_t(b)].size() == 1);
  CHECK(s.tokens[3].size() == 7);
  CHECK(s.ctx_lens[3] == 0);
  e.step();
  CHECK(m.steps().back().tokens[3].size() == 7);
  CHECK(m.steps().back().ctx_lens[3] == 7);
  for (const auto& st : m.steps()) {
    size_t n = 0;
    for (const auto& t : st.tokens)
      n += t.size();
    CHECK(n <= 10);
  }
}

TEST_CASE("engine: the budget is never below the running sequences' decode tokens") {
  FakeModel m(4, 64);
  EngineOptions o;
  o.max_tokens_per_step = 1; // raised to max_running (4)
  Engine e(m, o);
  CHECK(e.options().max_tokens_per_step == 4);
  for (int i = 0; i < 4; ++i)
    e.add(make_request({int32_t(i)}, 5));
  e.step();
  e.step();
  CHECK(m.steps().back().tokens.size() == 4);
}

TEST_CASE("engine: max_running caps the rows in use and the rest wait in order") {
  FakeModel m(8, 64);
  EngineOptions o;
  o.max_running = 2;
  Engine e(m, o);
  std::vector<engine::RequestId> ids;
  for (int i = 0; i < 5; ++i)
    ids.push_back(e.add(make_request(iota_prompt(3, i), 4)));
  CHECK(e.stats().waiting == 5);
  Drained d;
  step(e, d);
  CHECK(e.stats().running == 2);
  CHECK(e.stats().waiting == 3);
  d = drain(e, d);
  CHECK(m.max_seqs_in_a_step() == 2);
  std::set<int32_t> blocks; // two rows of the pool: every block the steps used is in them
  for (const auto& st : m.steps())
    for (const auto& t : st.block_tables)
      blocks.insert(t.begin(), t.end());
  CHECK(*blocks.rbegin() < 2 * m.kv_geometry().table_blocks);
  for (size_t i = 0; i < ids.size(); ++i)
    CHECK(d.tokens[ids[i]] == alone(make_request(iota_prompt(3, int(i)), 4)));
  const engine::EngineStats st = e.stats();
  CHECK(st.running == 0);
  CHECK(st.waiting == 0);
  CHECK(st.finished_length == 5);
  CHECK(st.prompt_tokens == 15);
  CHECK(st.generated_tokens == 20);
}

TEST_CASE("engine: a choice's first token reports how long its request waited to be admitted") {
  // One running sequence at a time: the second request is admitted only once the first has
  // finished, so its time in the queue is at least from its add() to the start of the step
  // that finished the first; the first token's event carries it, no other event does.
  using Clock = std::chrono::steady_clock;
  FakeModel m(4, 64);
  EngineOptions o;
  o.max_running = 1;
  Engine e(m, o);
  const auto a = e.add(make_request(iota_prompt(3, 1), 3));
  const auto b = e.add(make_request(iota_prompt(3, 2), 3));
  const Clock::time_point added = Clock::now();
  Clock::time_point a_last_step{};
  std::map<engine::RequestId, std::vector<double>> queue; // per event
  while (!e.idle()) {
    const Clock::time_point start = Clock::now();
    for (const Event& ev : e.step()) {
      queue[ev.id].push_back(ev.queue_s);
      if (ev.id == a && ev.finish != FinishReason::None)
        a_last_step = start;
    }
  }
  for (const auto id : {a, b}) {
    REQUIRE(queue[id].size() == 3);
    CHECK(queue[id][0] >= 0);
    CHECK(queue[id][1] == -1);
    CHECK(queue[id][2] == -1);
  }
  CHECK(queue[b][0] >= std::chrono::duration<double>(a_last_step - added).count());
  CHECK(queue[b][0] > queue[a][0]);
}

TEST_CASE("engine: the queue limit refuses requests beyond it") {
  FakeModel m(1, 64);
  EngineOptions o;
  o.max_queue = 2;
  Engine e(m, o);
  e.add(make_request({1}, 3));
  e.add(make_request({2}, 3));
  CHECK_THROWS_AS(e.add(make_request({3}, 3)), engine::QueueFull);
  e.step(); // one joins (one row), one still waits: room for one more
  e.add(make_request({4}, 3));
  CHECK_THROWS_AS(e.add(make_request({5}, 3)), engine::QueueFull);
}

TEST_CASE("engine: abort mid-prompt and mid-decode frees the row for a fresh sequence") {
  FakeModel m(1, 64);
  EngineOptions o;
  o.max_tokens_per_step = 4;
  Engine e(m, o);
  const auto a = e.add(make_request(iota_prompt(10, 5), 8));
  const auto waiting = e.add(make_request(iota_prompt(3, 1), 8));
  e.step(); // 4 of a's 10 prompt tokens
  e.abort(a);
  e.abort(waiting);
  e.abort(12345); // unknown: ignored
  std::vector<Event> ev = e.step();
  REQUIRE(ev.size() == 2);
  CHECK(ev[0].id == a);
  CHECK(ev[0].finish == FinishReason::Abort);
  CHECK(ev[0].token == -1);
  CHECK(ev[1].id == waiting);
  CHECK(ev[1].finish == FinishReason::Abort);
  CHECK(e.idle());
  CHECK(e.stats().kv_rows_in_use == 0);

  // Mid-decode: the row (row 0, the only one) is taken again; the newcomer's tokens equal a
  // fresh run's, so it read nothing of the aborted sequence's cache.
  const Request fresh = make_request(iota_prompt(6, 2), 6);
  const auto b = e.add(make_request(iota_prompt(9, 4), 30));
  e.step();
  e.step();
  e.step();
  e.abort(b);
  const auto c = e.add(fresh);
  Drained d = drain(e);
  CHECK(d.last[b].finish == FinishReason::Abort);
  CHECK(d.tokens[c] == alone(fresh));
  CHECK(e.stats().finished_abort == 3);
}

TEST_CASE("engine: a row reused after a finish reads no stale KV") {
  FakeModel m(1, 64);
  Engine e(m);
  const Request first = make_request(iota_prompt(20, 3), 10);
  const Request second = make_request(iota_prompt(4, 8), 10);
  const auto a = e.add(first);
  const auto b = e.add(second);
  Drained d = drain(e);
  CHECK(d.tokens[a] == alone(first));
  CHECK(d.tokens[b] == alone(second)); // row 0 again, its first 30 slots left by `first`
}

TEST_CASE("engine: stop ids, max_tokens and max_seq end requests with their reasons") {
  FakeModel m(3, 16);
  Engine e(m);
  const Request probe = make_request(iota_prompt(4, 1), 6);
  const std::vector<int32_t> free_run = alone(probe);
  Request stop = probe;
  stop.stop_ids = {free_run[2]};
  const auto s = e.add(stop);
  const auto l = e.add(make_request(iota_prompt(4, 2), 3));
  const auto full = e.add(make_request(iota_prompt(14, 3), 100)); // 16 - 14 + 1 tokens fit
  Drained d = drain(e);
  const size_t first_stop =
      size_t(std::find(free_run.begin(), free_run.end(), free_run[2]) - free_run.begin());
  CHECK(d.last[s].finish == FinishReason::Stop);
  CHECK(d.tokens[s].size() == first_stop + 1);
  CHECK(d.tokens[s].back() == free_run[2]);
  CHECK(d.last[l].finish == FinishReason::Length);
  CHECK_FALSE(d.last[l].hit_max_seq);
  CHECK(d.tokens[l].size() == 3);
  CHECK(d.last[full].finish == FinishReason::Length);
  CHECK(d.last[full].hit_max_seq);
  CHECK(d.tokens[full].size() == 3);
  CHECK(d.last[full].generated_tokens == 3);
  CHECK(d.last[full].prompt_tokens == 14);
}

TEST_CASE("engine: a prompt of exactly max_seq tokens gets one token") {
  FakeModel m(1, 16);
  Engine e(m);
  const auto id = e.add(make_request(iota_prompt(16, 1), 10));
  Drained d = drain(e);
  CHECK(d.tokens[id].size() == 1);
  CHECK(d.last[id].hit_max_seq);
}

TEST_CASE("engine: requests the model cannot run are refused naming the limit") {
  FakeModel m(2, 16);
  Engine e(m);
  auto refused = [&](Request r) -> std::string {
    try {
      e.add(std::move(r));
    } catch (const Error& err) {
      return err.what();
    }
    return "(accepted)";
  };
  CHECK(refused(make_request({}, 4)) == "the prompt is empty");
  const std::string too_long = refused(make_request(iota_prompt(17, 0), 4));
  CHECK(too_long.find("17 tokens") != std::string::npos);
  CHECK(too_long.find("16") != std::string::npos);
  CHECK(refused(make_request({FakeModel::kVocab}, 4)).find("outside the vocabulary") !=
        std::string::npos);
  CHECK(refused(make_request({1}, 0)).find("max_tokens 0") != std::string::npos);
  Request r = make_request({1}, 4);
  r.top_logprobs = 21;
  CHECK(refused(r).find("top_logprobs 21") != std::string::npos);
  r = make_request({1}, 4);
  r.sampling.temperature = std::nanf("");
  CHECK(refused(r).find("temperature") != std::string::npos);
  r = make_request({1}, 4);
  r.sampling.top_p = std::nanf("");
  CHECK(refused(r).find("top_p") != std::string::npos);
  r = make_request({1}, 4);
  r.stop_ids = {-1};
  CHECK(refused(r).find("stop id -1") != std::string::npos);
  CHECK(e.idle());
}

TEST_CASE("engine: sampling is reproducible per request seed, whatever shares the steps") {
  Request r = make_request(iota_prompt(5, 4), 16);
  r.sampling.temperature = 1.5f;
  r.sampling.seed = 77;
  const std::vector<int32_t> want = alone(r);
  CHECK(want == alone(r));
  Request other_seed = r;
  other_seed.sampling.seed = 78;
  CHECK(alone(other_seed) != want);

  FakeModel m(4, 64);
  Engine e(m);
  Request noisy = make_request(iota_prompt(7, 1), 16);
  noisy.sampling.temperature = 1.0f;
  noisy.sampling.seed = 5;
  e.add(noisy);
  e.step();
  const auto id = e.add(r);
  e.add(make_request(iota_prompt(3, 3), 9));
  CHECK(drain(e).tokens[id] == want);
}

TEST_CASE("engine: log-probabilities are the softmax of the row the token came from") {
  FakeModel m(2, 64);
  Engine e(m);
  Request r = make_request(iota_prompt(4, 2), 3);
  r.top_logprobs = 5;
  r.return_logits = true;
  const auto id = e.add(r);
  std::vector<Event> events;
  while (!e.idle())
    for (Event& ev : e.step())
      if (ev.id == id)
        events.push_back(std::move(ev));
  REQUIRE(events.size() == 3);
  for (const Event& ev : events) {
    REQUIRE(ev.logits.size() == size_t(FakeModel::kVocab));
    double z = 0;
    for (float x : ev.logits)
      z += std::exp(double(x));
    CHECK(ev.logprob == doctest::Approx(double(ev.logits[size_t(ev.token)]) - std::log(z)));
    REQUIRE(ev.top_logprobs.size() == 5);
    CHECK(ev.top_logprobs[0].token == ev.token); // greedy: the sampled token is the top one
    CHECK(ev.top_logprobs[0].logprob == doctest::Approx(ev.logprob));
    for (size_t i = 1; i < 5; ++i)
      CHECK(ev.top_logprobs[i].logprob <= ev.top_logprobs[i - 1].logprob);
  }
}

TEST_CASE("engine: requests added from another thread while steps run all finish") {
  FakeModel m(4, 64);
  EngineOptions o;
  o.max_queue = 100;
  Engine e(m, o);
  constexpr int kRequests = 40;
  std::thread producer([&] {
    for (int i = 0; i < kRequests; ++i)
      e.add(make_request(iota_prompt(1 + i % 5, i), 1 + i % 4));
  });
  int finished = 0;
  while (finished < kRequests) {
    if (!e.wait_for_work(std::chrono::milliseconds(100)))
      continue;
    for (const Event& ev : e.step())
      finished += ev.finish != FinishReason::None;
  }
  producer.join();
  CHECK(e.idle());
  CHECK(e.stats().finished_length == kRequests);
  CHECK(m.max_seqs_in_a_step() <= 4);
}

TEST_CASE("engine: generate() runs every request to its end and reports the callback's stop") {
  FakeModel m(2, 64);
  std::vector<Request> reqs;
  for (int i = 0; i < 5; ++i)
    reqs.push_back(make_request(iota_prompt(3 + i, i), 4 + i));
  const auto out = engine::generate(m, reqs, [](size_t i, const Event& ev) {
    return !(i == 3 && ev.generated_tokens == 2); // request 3 stops itself after 2 tokens
  });
  REQUIRE(out.size() == 5);
  for (size_t i = 0; i < 5; ++i) {
    if (i == 3) {
      CHECK(out[i].finish == FinishReason::Abort);
      CHECK(out[i].tokens.size() == 2);
      continue;
    }
    CHECK(out[i].finish == FinishReason::Length);
    CHECK(out[i].tokens == alone(reqs[i]));
  }
  std::vector<Request> bad = reqs;
  bad[2].prompt.clear();
  CHECK_THROWS_WITH(engine::generate(m, bad), "request 2: the prompt is empty");
}

TEST_CASE("engine: admit_batch makes newcomers join together, or after max_admit_wait steps") {
  FakeModel m(4, 64);
  EngineOptions o;
  o.admit_batch = 2;
  o.max_admit_wait = 3;
  Engine e(m, o);
  Drained d;
  const auto a = e.add(make_request({1}, 50)); // nothing runs: joins at once
  step(e, d);
  CHECK(e.stats().running == 1);
  const auto b = e.add(make_request({2}, 5)); // one newcomer: waits for a second one
  step(e, d);
  step(e, d);
  CHECK(e.stats().running == 1);
  e.add(make_request({3}, 5)); // two can join: both do
  step(e, d);
  CHECK(e.stats().running == 3);
  CHECK(d.tokens[b].size() == 1);
  const auto c = e.add(make_request({4}, 5)); // alone again: joins after 3 steps of waiting
  for (int i = 0; i < 3; ++i) {
    step(e, d);
    CHECK(d.tokens[c].empty());
  }
  step(e, d);
  CHECK(d.tokens[c].size() == 1);
  e.abort(a);
  d = drain(e, d);
  CHECK(e.stats().finished_length == 3);
}

TEST_CASE("engine: a request aborted before any step ends without a token") {
  FakeModel m(2, 64);
  Engine e(m);
  const auto a = e.add(make_request({1, 2, 3}, 5));
  const auto b = e.add(make_request({4, 5}, 3));
  e.abort(a); // still pending: step() meets the add and the abort together
  Drained d = drain(e);
  CHECK(d.last[a].finish == FinishReason::Abort);
  CHECK(d.tokens[a].empty());
  CHECK(d.tokens[b] == alone(make_request({4, 5}, 3)));
  CHECK(e.stats().waiting == 0);
  CHECK(e.stats().finished_abort == 1);
}

namespace {

/// Throws from its step number `fail_at` (0-based), once.
class FailingModel : public FakeModel {
public:
  FailingModel(int64_t rows, int64_t max_seq, int fail_at)
      : FakeModel(rows, max_seq), fail_at_(fail_at) {}
  std::vector<std::vector<float>> step(const xserv::models::StepInput& in) override {
    if (calls_++ == fail_at_)
      throw xserv::Error("device lost");
    return FakeModel::step(in);
  }

private:
  int fail_at_, calls_ = 0;
};

} // namespace

TEST_CASE("engine: a model error leaves the engine consistent and the requests resumable") {
  const Request r = make_request(iota_prompt(6, 2), 5);
  FailingModel m(2, 64, 1);
  Engine e(m);
  Drained d;
  const auto a = e.add(r);
  step(e, d); // the prompt: one token
  const auto b = e.add(make_request({9}, 2));
  e.abort(12345);
  CHECK_THROWS_WITH(e.step(), "device lost"); // b was admitted, a decoding: nothing advanced
  CHECK(e.stats().waiting == 0);
  CHECK(e.stats().running == 2);
  d = drain(e, d);
  CHECK(d.tokens[a] == alone(r)); // the failed step ran again, and the tokens are a fresh run's
  CHECK(d.tokens[b].size() == 2);
  CHECK(e.idle());
}

TEST_CASE("engine: non-finite logits end that request with an error naming step and position") {
  for (const float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    for (const float temperature : {0.0f, 1.0f}) { // the greedy pick, the sampler's row
      INFO("poison " << bad << ", temperature " << temperature);
      FakeModel m(2, 64);
      Engine e(m);
      Request broken = make_request({1, 2, 3}, 10);
      broken.sampling.temperature = temperature;
      const Request healthy = make_request(iota_prompt(5, 4), 6);
      const auto a = e.add(broken);
      const auto b = e.add(healthy);
      Drained d;
      step(e, d); // both prompts: a's first token
      step(e, d); // a decodes its second
      REQUIRE(d.tokens[a].size() == 2);
      m.poison(1, bad); // a's first token
      step(e, d);       // engine step 2: a's third token would come from position 4's logits
      CHECK(d.last[a].finish == FinishReason::Error);
      CHECK(d.last[a].token == -1);
      CHECK(d.last[a].generated_tokens == 2);
      CHECK(d.last[a].error.find("non-finite logits (NaN or infinity) at engine step 2, "
                                 "position 4 of the sequence (generated token 3)") == 0);
      CHECK(d.tokens[a].size() == 2); // no garbage token
      CHECK(e.stats().finished_error == 1);
      CHECK(e.stats().running == 1); // a's row is free, b goes on
      d = drain(e, d);
      CHECK(d.last[b].finish == FinishReason::Length);
      CHECK(d.tokens[b] == alone(healthy));
    }
  }
}

TEST_CASE(
    "engine: generate() reports a non-finite finish, throw_if_failed turns it into an error") {
  FakeModel m(1, 64);
  m.poison(iota_prompt(3, 1)[0], std::nanf(""));
  const std::vector<engine::Generation> out =
      engine::generate(m, {make_request(iota_prompt(3, 1), 4)});
  REQUIRE(out.size() == 1);
  CHECK(out[0].finish == FinishReason::Error);
  CHECK(out[0].tokens.empty());
  CHECK(out[0].error.find("non-finite logits") == 0);
  CHECK(std::string(engine::finish_name(FinishReason::Error)) == "error");
  CHECK_THROWS_WITH_AS(engine::throw_if_failed(out), doctest::Contains("at engine step 0"), Error);
  CHECK_NOTHROW(engine::throw_if_failed({}));
}
