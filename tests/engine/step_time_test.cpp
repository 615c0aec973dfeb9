// The step-time model behind EngineOptions::itl_target_ms: decode-only times by bucket, the fit
// of what prompt tokens add, the budget it gives; and the scheduler holding a step's prompt
// tokens to that budget beside its decodes.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "engine/scheduler.h"
#include "engine/step_time.h"

using namespace xserv;
using engine::StepTimeModel;

namespace {

/// A pool of 4-position blocks for 4 sequences of 256 positions.
models::KvGeometry small_kv() {
  models::KvGeometry kv;
  kv.block_size = 4;
  kv.table_blocks = 64;
  kv.blocks = 4 * 64 + 1;
  return kv;
}

/// A request of `len` prompt ids from `first`, 50 tokens out.
engine::Request request(int32_t first, size_t len) {
  engine::Request r;
  for (size_t i = 0; i < len; ++i)
    r.prompt.push_back(first + int32_t(i));
  r.max_tokens = 50;
  return r;
}

/// A step of sequences of these token counts (1: a decode).
engine::ScheduledStep step_of(const std::vector<size_t>& lens) {
  engine::ScheduledStep st;
  for (size_t n : lens)
    st.input.tokens.push_back(std::vector<int32_t>(n, 1));
  return st;
}

} // namespace

TEST_CASE("step time: decode steps average by bucket, the nearest bucket stands in") {
  StepTimeModel m;
  CHECK(m.decode_ms(64) == -1);
  m.observe(64, 0, 10.0);
  CHECK(m.decode_ms(64) == 10.0);
  CHECK(m.decode_ms(40) == 10.0); // 33-64: the same bucket
  CHECK(m.decode_ms(1) == 10.0);  // nothing nearer
  m.observe(64, 0, 20.0);         // a moving average
  CHECK(m.decode_ms(64) == doctest::Approx(0.8 * 10 + 0.2 * 20));
  m.observe(1, 0, 2.0);
  CHECK(m.decode_ms(1) == 2.0);
  CHECK(m.decode_ms(3) == 2.0); // bucket 3-4: 1's bucket is nearer than 33-64's
  // Nonsense is ignored.
  m.observe(1, 0, std::numeric_limits<double>::quiet_NaN());
  m.observe(1, 0, -1);
  CHECK(m.decode_ms(1) == 2.0);
  // A step timed at 0 ms (a clock that did not move) is still a step seen.
  StepTimeModel z;
  CHECK(!z.decode_observed(4));
  z.observe(4, 0, 0.0);
  CHECK(z.decode_observed(4));
  CHECK(z.decode_ms(4) == 0.0);
}

TEST_CASE("step time: a bucket's age counts the steps since its decodes last ran alone") {
  StepTimeModel m;
  CHECK(m.decode_age(64) == INT64_MAX);
  m.observe(64, 0, 10.0);
  CHECK(m.decode_age(64) == 0);
  CHECK(m.decode_age(1) == INT64_MAX); // another bucket
  for (int i = 0; i < 5; ++i)
    m.observe(64, 100, 13.0);
  CHECK(m.decode_age(64) == 5);
  m.observe(40, 0, 9.0); // 33-64: the same bucket, timed again
  CHECK(m.decode_age(64) == 0);
}

TEST_CASE("step time: the prompt tokens' fixed and per-token costs are fitted, and give a budget") {
  StepTimeModel m;
  m.observe(64, 0, 10.0);
  // Steps of 64 decodes plus P prompt tokens at 10 + 2 + 0.03 P ms.
  int seen = 0;
  for (int round = 0; round < 3; ++round)
    for (const int p : {100, 300, 512, 64}) {
      if (seen++ < StepTimeModel::kMinPromptSteps)
        CHECK(m.prompt_budget(64, 20.0, 16) == -1);
      m.observe(64, p, 10.0 + 2.0 + 0.03 * p);
    }
  CHECK(m.prompt_token_ms() == doctest::Approx(0.03).epsilon(1e-6));
  CHECK(m.prompt_fixed_ms() == doctest::Approx(2.0).epsilon(1e-6));
  CHECK(m.prompt_budget(64, 20.0, 16) == 266); // (20 - 10 - 2) / 0.03
  CHECK(m.prompt_budget(64, 11.0, 16) == 16);  // no room: the floor
  CHECK(m.prompt_budget(64, 1e12, 16) > 1000000);
}

TEST_CASE("step time: prompts alone and steps before a decode-only one teach nothing, and prompt "
          "sizes that barely vary give the mean cost a token") {
  StepTimeModel m;
  m.observe(0, 512, 30.0); // prompts alone: their time holds what every step pays
  m.observe(0, 256, 16.0);
  m.observe(8, 128, 13.0); // decodes, but no decode-only step to subtract yet
  m.observe(0, 128, 9.0);
  CHECK(m.prompt_budget(8, 20.0, 16) == -1);
  m.observe(8, 0, 4.0);
  for (const auto& [p, ms] :
       {std::pair{128, 4.0 + 2 + 0.05 * 128}, std::pair{256, 4.0 + 2 + 0.05 * 256}})
    m.observe(8, p, ms);
  CHECK(m.prompt_budget(8, 20.0, 16) == -1); // two such steps
  m.observe(8, 512, 4.0 + 2 + 0.05 * 512);
  CHECK(m.prompt_token_ms() == doctest::Approx(0.05).epsilon(1e-6));
  CHECK(m.prompt_fixed_ms() == doctest::Approx(2.0).epsilon(1e-6));
  CHECK(m.prompt_budget(8, 20.0, 16) == 280); // (20 - 4 - 2) / 0.05
  // Decodes of a bucket never seen alone (64, where 8 stands in) teach nothing either: 8's time
  // would put 64's extra cost on the prompt tokens.
  CHECK(m.decode_observed(8));
  CHECK(!m.decode_observed(64));
  m.observe(64, 512, 500.0);
  CHECK(m.prompt_token_ms() == doctest::Approx(0.05).epsilon(1e-6));
  // Prompt sizes within a few percent of each other (the budget's own chunks): no slope, the
  // mean cost a token, no fixed part.
  StepTimeModel same;
  same.observe(4, 0, 3.0);
  for (const int p : {100, 101, 99, 100})
    same.observe(4, p, 3.0 + 0.05 * p + (p == 101 ? 1.0 : 0.0)); // one noisy step
  CHECK(same.prompt_fixed_ms() == 0);
  CHECK(same.prompt_token_ms() == doctest::Approx(0.0525).epsilon(0.02));
  CHECK(same.prompt_budget(4, 8.0, 16) == doctest::Approx(95).epsilon(0.03));
}

TEST_CASE("scheduler: under itl_target_ms a step's prompt tokens beside decodes stop at the "
          "learned budget, and a prompt alone is not held back") {
  engine::EngineOptions o;
  o.max_running = 4;
  o.itl_target_ms = 20;
  const models::KvGeometry kv = small_kv();
  engine::Scheduler s(o, kv);
  // Teach it: a decode of 1 costs 10 ms, each prompt token 0.1 ms more: 100 tokens fit 20 ms.
  s.observe_time(step_of({1}), 10.0);
  for (size_t p : {50, 150, 250})
    s.observe_time(step_of({1, p}), 10.0 + 0.1 * double(p));
  CHECK(s.itl_budget(1) == 100);
  s.enqueue(std::make_unique<engine::Sequence>(1, request(1, 8)));
  engine::ScheduledStep first = s.schedule();
  REQUIRE(first.seqs.size() == 1);
  CHECK(first.input.tokens[0].size() == 8); // alone: no decodes, no ITL budget
  s.commit(first);
  first.seqs[0]->tokens.push_back(7); // its first token
  s.enqueue(std::make_unique<engine::Sequence>(2, request(100, 300)));
  const engine::ScheduledStep mixed = s.schedule();
  REQUIRE(mixed.seqs.size() == 2);
  CHECK(mixed.input.tokens[0].size() == 1);
  CHECK(mixed.input.tokens[1].size() == 100); // 300 waiting, 100 within the target
  // Off: the whole prompt.
  o.itl_target_ms = 0;
  engine::Scheduler off(o, kv);
  off.observe_time(step_of({1}), 10.0);
  CHECK(off.itl_budget(1) == -1);
  // A target relative to the decodes alone: 1.5 x 10 ms leaves 5 ms, 50 tokens; unknown before
  // a decode-only step; an absolute target wins over the factor.
  o.itl_factor = 1.5;
  engine::Scheduler rel(o, kv);
  CHECK(rel.itl_budget(1) == 0); // its decodes run alone first, to be timed
  rel.observe_time(step_of({1}), 10.0);
  for (size_t p : {50, 150, 250})
    rel.observe_time(step_of({1, p}), 10.0 + 0.1 * double(p));
  CHECK(rel.itl_budget(1) == 50);
  o.itl_target_ms = 20;
  engine::Scheduler both(o, kv);
  both.observe_time(step_of({1}), 10.0);
  for (size_t p : {50, 150, 250})
    both.observe_time(step_of({1, p}), 10.0 + 0.1 * double(p));
  CHECK(both.itl_budget(1) == 100);
  // A batch whose bucket never ran alone (2 decodes: bucket 2) gets a decode-only step, then the
  // budget again: a deep backlog cannot keep the bound from being learned.
  CHECK(both.itl_budget(2) == 0);
  both.observe_time(step_of({1, 1}), 12.0);
  CHECK(both.itl_budget(2) == 80); // (20 - 12) / 0.1
  // ... and again once its time is kRefreshSteps steps old (contexts have grown since).
  for (int64_t i = 0; i < engine::StepTimeModel::kRefreshSteps; ++i)
    both.observe_time(step_of({1, 1, 100}), 22.0);
  CHECK(both.itl_budget(2) == 80);
  both.observe_time(step_of({1, 1, 100}), 22.0);
  CHECK(both.itl_budget(2) == 0);
}

TEST_CASE("scheduler: with a bound, the batch a step heads for is timed alone once its decodes "
          "fill its bucket, and until it forms prompts go without the bound") {
  engine::EngineOptions o;
  o.max_running = 4;
  o.itl_factor = 3;
  const models::KvGeometry kv = small_kv();
  engine::Scheduler s(o, kv);
  // Three sequences decode; a fourth waits: the step heads for 4 (bucket 3-4, the decodes'
  // own), never timed alone, so its decodes run alone first.
  std::vector<engine::Sequence*> seqs;
  for (int32_t i = 0; i < 3; ++i)
    s.enqueue(std::make_unique<engine::Sequence>(i + 1, request(100 * i + 1, 8)));
  engine::ScheduledStep first = s.schedule();
  REQUIRE(first.seqs.size() == 3);
  s.commit(first);
  for (engine::Sequence* q : first.seqs)
    q->tokens.push_back(7);
  s.observe_time(first, 5.0);
  s.enqueue(std::make_unique<engine::Sequence>(4, request(1000, 40)));
  engine::ScheduledStep probe = s.schedule();
  CHECK(probe.itl_batch == 4);
  REQUIRE(probe.seqs.size() == 3);
  CHECK(probe.prompt_tokens == 0);
  s.commit(probe);
  for (engine::Sequence* q : probe.seqs)
    q->tokens.push_back(8);
  s.observe_time(probe, 10.0);
  const engine::ScheduledStep next = s.schedule(); // timed: the prompt joins (no cost known yet)
  REQUIRE(next.seqs.size() == 4);
  CHECK(next.input.tokens[3].size() == 40);

  // One decode and three prompts waiting: the step heads for 4, a bucket never timed alone that
  // the one decode cannot time, so the prompts go without the bound (the burst of a cold start).
  engine::Scheduler c(o, kv);
  c.enqueue(std::make_unique<engine::Sequence>(1, request(1, 8)));
  engine::ScheduledStep one = c.schedule();
  REQUIRE(one.seqs.size() == 1);
  c.commit(one);
  one.seqs[0]->tokens.push_back(7);
  c.observe_time(one, 5.0);
  for (int32_t i = 0; i < 3; ++i)
    c.enqueue(std::make_unique<engine::Sequence>(i + 2, request(100 * i + 100, 40)));
  const engine::ScheduledStep burst = c.schedule();
  CHECK(burst.itl_batch == 4);
  CHECK(c.itl_budget(1, 4) == -1);
  REQUIRE(burst.seqs.size() == 4);
  CHECK(burst.prompt_tokens == 120);
}

TEST_CASE("scheduler: the batch a step heads for counts queued requests only while the free "
          "blocks hold them") {
  engine::EngineOptions o;
  o.max_running = 4;
  o.itl_factor = 2;
  models::KvGeometry kv;
  kv.block_size = 4;
  kv.table_blocks = 16;
  kv.blocks = 21; // 20 and the null block
  engine::Scheduler s(o, kv);
  for (int32_t i = 0; i < 2; ++i)
    s.enqueue(std::make_unique<engine::Sequence>(i + 1, request(100 * i + 1, 30)));
  engine::ScheduledStep first = s.schedule(); // 8 blocks each: 4 left
  REQUIRE(first.seqs.size() == 2);
  s.commit(first);
  for (engine::Sequence* q : first.seqs)
    q->tokens.push_back(7);
  s.enqueue(std::make_unique<engine::Sequence>(3, request(1000, 30))); // 8 blocks: no room
  CHECK(s.schedule().itl_batch == 2);
  engine::Scheduler t(o, kv);
  for (int32_t i = 0; i < 2; ++i)
    t.enqueue(std::make_unique<engine::Sequence>(i + 1, request(100 * i + 1, 30)));
  engine::ScheduledStep again = t.schedule();
  t.commit(again);
  for (engine::Sequence* q : again.seqs)
    q->tokens.push_back(7);
  t.enqueue(std::make_unique<engine::Sequence>(3, request(1000, 10))); // 3 blocks: it fits
  t.enqueue(std::make_unique<engine::Sequence>(4, request(2000, 10))); // 3 more: not after it
  CHECK(t.schedule().itl_batch == 3);
}

TEST_CASE("scheduler: the ITL bound is judged at the batch the step heads for, the prompt "
          "tokens' cost at its own decodes") {
  engine::EngineOptions o;
  o.max_running = 4;
  o.itl_factor = 2;
  const models::KvGeometry kv = small_kv();
  engine::Scheduler s(o, kv);
  // One decode alone 10 ms, four 20 ms; a prompt token 0.1 ms beside one decode.
  s.observe_time(step_of({1, 1, 1, 1}), 20.0);
  s.observe_time(step_of({1}), 10.0);
  for (size_t p : {50, 150, 250})
    s.observe_time(step_of({1, p}), 10.0 + 0.1 * double(p));
  CHECK(s.itl_budget(1) == 100);    // 2 x 10 ms: 10 ms of prompt tokens
  CHECK(s.itl_budget(1, 4) == 300); // 2 x 20 ms: 30 ms of prompt tokens beside 10 of decodes
  // Heading for a batch never timed alone: the largest timed one between it and the decodes.
  CHECK(s.itl_budget(1, 8) == 300); // 5-8 never ran alone: 3-4's 20 ms
  CHECK(s.itl_budget(1, 2) == 100); // 2 never ran alone: the decodes' own 10 ms
  CHECK(s.itl_budget(2, 2) == 0);   // the decodes' bucket, the heading one too: timed first
  // With nothing timed between them (a cold start's first wave), no bound.
  engine::Scheduler cold(o, kv);
  CHECK(cold.itl_budget(1, 4) == -1);
  CHECK(cold.itl_budget(3, 4) == 0); // the decodes fill the heading bucket: timed first
  // Through schedule(): one sequence decodes, three 200-token prompts wait; the step heads for
  // 4 and takes 300 prompt tokens.
  s.enqueue(std::make_unique<engine::Sequence>(1, request(1, 8)));
  engine::ScheduledStep first = s.schedule();
  REQUIRE(first.seqs.size() == 1);
  s.commit(first);
  first.seqs[0]->tokens.push_back(7);
  for (int32_t i = 0; i < 3; ++i)
    s.enqueue(std::make_unique<engine::Sequence>(i + 2, request(1000 * i + 100, 200)));
  engine::ScheduledStep mixed = s.schedule();
  CHECK(mixed.itl_batch == 4);
  CHECK(mixed.prompt_tokens == 300);
  REQUIRE(mixed.itl_bound.has_value());
  CHECK(*mixed.itl_bound == doctest::Approx(40));
  // The tail counts a step as past the bound it was scheduled under: at 35 ms this one is
  // within its 40, where its one decode's own bound (20) would count it over.
  constexpr double keep = engine::Scheduler::kItlTailKeep;
  const double before = s.itl_over();
  s.observe_time(mixed, 35.0);
  CHECK(s.itl_over() == doctest::Approx(before * keep));
  mixed.itl_bound.reset();
  s.observe_time(mixed, 35.0);
  CHECK(s.itl_over() == doctest::Approx(before * keep * keep + 1));
  // Heading for 8 (bucket 5-8 never timed): the largest timed batch below, 4's 20 ms.
  CHECK(s.itl_budget(1, 8) == s.itl_budget(1, 4));
}

TEST_CASE("scheduler: a cold start's wave goes without the bound for at most kWaveSteps steps, "
          "and a batch timed long ago stops being the reference") {
  engine::EngineOptions o;
  o.max_running = 5;
  o.itl_factor = 2;
  models::KvGeometry kv = small_kv();
  kv.blocks = 5 * 64 + 1;
  // Four sequences decode and a fifth place serves one-token requests: the batch of 5 it heads
  // for never forms. Its prompts go without the bound for kWaveSteps steps, then the four are
  // timed alone and bound the prompts.
  engine::Scheduler s(o, kv);
  for (int32_t i = 0; i < 4; ++i)
    s.enqueue(std::make_unique<engine::Sequence>(i + 1, request(100 * i + 1, 8)));
  engine::ScheduledStep first = s.schedule();
  REQUIRE(first.seqs.size() == 4);
  s.commit(first);
  for (engine::Sequence* q : first.seqs)
    q->tokens.push_back(7);
  int64_t unbounded = 0, timing = -1;
  for (int64_t step = 0; step < 2 * engine::Scheduler::kWaveSteps && timing < 0; ++step) {
    s.enqueue(std::make_unique<engine::Sequence>(1000 + step, request(5000, 40)));
    engine::ScheduledStep st = s.schedule();
    if (st.prompt_tokens == 0)
      timing = step;
    else
      unbounded += *st.itl_bound < 0 ? 1 : 0;
    std::vector<bool> yields(st.seqs.size());
    for (size_t b = 0; b < st.seqs.size(); ++b)
      yields[b] = st.yields(b);
    s.commit(st);
    for (size_t b = 0; b < st.seqs.size(); ++b)
      if (yields[b])
        st.seqs[b]->tokens.push_back(7);
    s.observe_time(st, st.prompt_tokens == 0 ? 10.0 : 10.0 + 0.1 * double(st.prompt_tokens));
    for (engine::Sequence* q : st.seqs) // the one-token requests leave once they have a token
      if (q->id >= 1000 && q->tokens.size() > q->prompt_len)
        s.release(q);
  }
  CHECK(unbounded == engine::Scheduler::kWaveSteps);
  CHECK(timing == engine::Scheduler::kWaveSteps);

  // A batch of 8 timed alone once, then 600 steps of 2 decodes: 8 is no longer the reference.
  o.max_running = 8;
  engine::Scheduler t(o, kv);
  t.observe_time(step_of({1, 1, 1, 1, 1, 1, 1, 1}), 30.0);
  t.observe_time(step_of({1, 1}), 10.0);
  for (size_t p : {50, 150, 250})
    t.observe_time(step_of({1, 1, p}), 10.0 + 0.1 * double(p));
  CHECK(t.itl_budget(2, 8) == 500); // 2 x 30 ms: 50 ms of prompt tokens beside 10 of decodes
  for (int i = 0; i < 600; ++i)
    t.observe_time(step_of({1, 1}), 10.0);
  CHECK(t.itl_budget(2, 8) == 100); // 2 x 10 ms: the decodes' own, timed just now
}

TEST_CASE("scheduler: itl_tail lets a step's prompts go without the bound while the decodes of "
          "steps past it stay within that share") {
  engine::EngineOptions o;
  o.max_running = 4;
  o.itl_target_ms = 20;
  o.itl_tail = 0.25;
  const models::KvGeometry kv = small_kv();
  constexpr double keep = engine::Scheduler::kItlTailKeep;
  engine::Scheduler s(o, kv);
  // A decode alone at 10 ms, prompt tokens 0.1 ms each beside it: 100 fit the 20 ms bound.
  s.observe_time(step_of({1}), 10.0);
  for (size_t p : {50, 150, 250})
    s.observe_time(step_of({1, p}), 10.0 + 0.1 * double(p));
  // 4 decodes seen, two of them (150 and 250 tokens: 25 and 35 ms) past the bound; each step's
  // weight kept `keep` a step after it.
  CHECK(s.itl_samples() == doctest::Approx(1 + keep + keep * keep + keep * keep * keep));
  CHECK(s.itl_over() == doctest::Approx(keep + 1));
  CHECK(s.itl_budget(1) == 100); // 2 + 1 > 0.25 x (4 + 1)
  // Steps within the bound: after 4, 3 > 0.25 x 9; after 12, 3 <= 0.25 x 17 and the next
  // step's prompts go without the bound.
  for (int i = 0; i < 4; ++i)
    s.observe_time(step_of({1, 50}), 15.0);
  CHECK(s.itl_budget(1) == 100);
  for (int i = 0; i < 8; ++i)
    s.observe_time(step_of({1, 50}), 15.0);
  CHECK(s.itl_samples() == doctest::Approx(16).epsilon(0.01));
  CHECK(s.itl_over() == doctest::Approx(2).epsilon(0.01));
  CHECK(s.itl_budget(1) == -1);
  // ... a batch size never timed alone still runs its decodes alone first.
  CHECK(s.itl_budget(2) == 0);
  // Two steps past the bound (300-token prompts whole, 40 ms): 4 + 1 > 0.25 x 19, bounded again.
  s.observe_time(step_of({1, 300}), 40.0);
  CHECK(s.itl_budget(1) == -1); // 3 + 1 <= 0.25 x 18
  s.observe_time(step_of({1, 300}), 40.0);
  CHECK(s.itl_over() == doctest::Approx(4).epsilon(0.01));
  CHECK(s.itl_budget(1) == 100);
  // The counts forget: ~1,000 steps later the two over steps weigh a third as much.
  for (int i = 0; i < 1024; ++i)
    s.observe_time(step_of({1, 50}), 15.0);
  CHECK(s.itl_over() < 1.6);
  CHECK(s.itl_samples() < 1 / (1 - keep)); // one decode a step tends to 1 / (1 - keep) = 1024

  // Through schedule(): once the tail opens, a waiting 300-token prompt joins whole beside the
  // decode (100 tokens under the bound alone).
  engine::Scheduler t(o, kv);
  t.observe_time(step_of({1}), 10.0);
  for (size_t p : {50, 150, 250})
    t.observe_time(step_of({1, p}), 10.0 + 0.1 * double(p));
  for (int i = 0; i < 12; ++i)
    t.observe_time(step_of({1, 50}), 15.0);
  t.enqueue(std::make_unique<engine::Sequence>(1, request(1, 8)));
  engine::ScheduledStep first = t.schedule();
  REQUIRE(first.seqs.size() == 1);
  t.commit(first);
  first.seqs[0]->tokens.push_back(7);
  t.enqueue(std::make_unique<engine::Sequence>(2, request(100, 300)));
  const engine::ScheduledStep mixed = t.schedule();
  REQUIRE(mixed.seqs.size() == 2);
  CHECK(mixed.input.tokens[0].size() == 1);
  CHECK(mixed.input.tokens[1].size() == 300);

  // A factor's bound counts a step as over only for a batch whose bucket was timed alone: a
  // step of 2 decodes (bucket never alone) at 30 ms is not over 2 x the 1-decode time.
  engine::EngineOptions f = o;
  f.itl_target_ms = 0;
  f.itl_factor = 2;
  engine::Scheduler u(f, kv);
  u.observe_time(step_of({1}), 10.0);
  u.observe_time(step_of({1, 1, 100}), 30.0);
  CHECK(u.itl_over() == 0);
  u.observe_time(step_of({1, 1}), 12.0); // now timed alone: 2 x 12 = 24
  u.observe_time(step_of({1, 1, 100}), 30.0);
  CHECK(u.itl_over() == doctest::Approx(2));
  // Without a bound the tail means nothing.
  f.itl_factor = 0;
  engine::Scheduler off(f, kv);
  off.observe_time(step_of({1}), 10.0);
  CHECK(off.itl_budget(1) == -1);
  CHECK(off.itl_over() == 0);
}
