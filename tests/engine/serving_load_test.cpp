// The serving benchmark's workload, in-process driver and report (engine/serving_load.h).
#include <doctest/doctest.h>

#include <set>

#include <nlohmann/json.hpp>

#include "engine/serving_load.h"
#include "tests/engine/fake_model.h"

using namespace xserv;
using namespace xserv::engine;
using xserv::testing::FakeModel;

TEST_CASE("serving bench: workloads are seeded, bounded and arrive in order") {
  ServingOptions o;
  o.requests = 50;
  o.input_len = 20;
  o.output_len = 10;
  o.len_range = 0.5;
  o.rate = 100;
  o.vocab = FakeModel::kVocab;
  const Workload a = make_workload(o), b = make_workload(o);
  CHECK(a.prompts == b.prompts);
  CHECK(a.arrivals == b.arrivals);
  REQUIRE(a.prompts.size() == 50);
  std::set<size_t> lens;
  for (size_t i = 0; i < 50; ++i) {
    CHECK(a.prompts[i].size() >= 10);
    CHECK(a.prompts[i].size() <= 30);
    CHECK(a.output_lens[i] >= 5);
    CHECK(a.output_lens[i] <= 15);
    lens.insert(a.prompts[i].size());
    for (int32_t id : a.prompts[i])
      CHECK((id >= 0 && id < FakeModel::kVocab));
    if (i > 0)
      CHECK(a.arrivals[i] >= a.arrivals[i - 1]);
  }
  CHECK(lens.size() > 5);
  // Poisson at 100/s: 49 gaps of mean 10 ms; their sum is within 4 standard deviations (4 x 70 ms).
  CHECK(a.arrivals.back() == doctest::Approx(0.49).epsilon(0.6));
  o.rate = 0;
  CHECK(make_workload(o).arrivals.back() == 0);
}

TEST_CASE("serving bench: concurrency above the rows queues the excess and every request ends") {
  FakeModel m(2, 128);
  ServingOptions o;
  o.requests = 12;
  o.concurrency = 8; // four times the model's rows
  o.input_len = 9;
  o.output_len = 5;
  o.vocab = FakeModel::kVocab;
  const Workload w = make_workload(o);
  EngineStats st;
  double seconds = 0;
  const auto rec = run_engine_load(m, w, o, {}, &st, &seconds);
  REQUIRE(rec.size() == 12);
  for (const RequestRecord& r : rec) {
    CHECK(r.ok);
    CHECK(r.output_tokens == 5);
    CHECK(r.token_times.size() == 5);
    CHECK(r.first_token >= r.sent);
    CHECK(r.end >= r.first_token);
  }
  CHECK(m.max_seqs_in_a_step() == 2);
  CHECK(st.generated_tokens == 60);
  CHECK(st.prompt_tokens == 12 * 9);
  const ServingReport rep = summarize(rec, seconds);
  CHECK(rep.completed == 12);
  CHECK(rep.failed == 0);
  CHECK(rep.output_tokens == 60);
  CHECK(rep.output_tps == doctest::Approx(60 / seconds));
}

TEST_CASE("serving bench: the report's latencies follow the records") {
  // Two requests: tokens at known times (seconds).
  RequestRecord a, b;
  a.ok = b.ok = true;
  a.sent = 0;
  a.token_times = {0.1, 0.2, 0.4};
  a.first_token = 0.1;
  a.end = 0.4;
  a.prompt_tokens = 10;
  a.output_tokens = 3;
  b.sent = 1;
  b.token_times = {1.3};
  b.first_token = 1.3;
  b.end = 1.3;
  b.prompt_tokens = 5;
  b.output_tokens = 1;
  RequestRecord failed;
  failed.error = "HTTP 500";
  const ServingReport r = summarize({a, b, failed}, 2.0);
  CHECK(r.completed == 2);
  CHECK(r.failed == 1);
  CHECK(r.first_error == "HTTP 500");
  CHECK(r.ttft.mean == doctest::Approx(200));  // (100 + 300) / 2
  CHECK(r.tpot.mean == doctest::Approx(150));  // a only: 300 ms over 2 tokens
  CHECK(r.itl.mean == doctest::Approx(150));   // 100 and 200
  CHECK(r.e2e.median == doctest::Approx(300)); // nearest rank: the first of {300, 400}
  CHECK(r.e2e.p99 == doctest::Approx(400));
  CHECK(r.output_tps == doctest::Approx(2.0)); // 4 tokens in 2 s
  CHECK(r.total_tps == doctest::Approx(9.5));  // 19 tokens in 2 s
}
