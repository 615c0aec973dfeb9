// `xserv eval` and `xserv chat`: data reading and scoring, then both commands end to end.
#include <doctest/doctest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/wait.h>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/eval_data.h"
#include "tests/run_xserv.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using namespace xserv::cli;
using namespace xserv::eval;

using xserv::testing::run_xserv;
using xserv::testing::RunResult;

namespace {

const fs::path& scratch() {
  static const xserv::testing::TempDir dir("eval_test"); // removed when the binary exits
  return dir.path;
}

/// The tiny random-weight model (real vocabulary), synthesized once per test run.
const fs::path& tiny_model() {
  static const fs::path model = [] {
    fs::path dir = scratch() / "tiny";
    const std::string config =
        (xserv::testing::source_dir() / "examples/tiny/config.json").string();
    RunResult r = run_xserv("synth --config " + config + " -o " + dir.string() + " --seed 1");
    INFO(r.out);
    REQUIRE(r.code == 0);
    return dir;
  }();
  return model;
}

fs::path write_file(const std::string& name, const std::string& text) {
  fs::path p = scratch() / name;
  std::ofstream(p) << text;
  return p;
}

std::vector<nlohmann::json> read_jsonl(const fs::path& p) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(p);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    CHECK_MESSAGE(!j.is_discarded(), "not JSON: " << line);
    lines.push_back(j);
  }
  return lines;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

} // namespace

TEST_CASE("read_eval_problems reads both formats and names the malformed line") {
  fs::path gsm = write_file("g.jsonl", "{\"question\": \"q1\", \"answer\": \"so\\n#### 1,600\"}\n"
                                       "\n"
                                       "{\"question\": \"q2\", \"answer\": \"#### 3\"}\n");
  auto probs = read_eval_problems(gsm, EvalTask::Gsm8k);
  REQUIRE(probs.size() == 2);
  CHECK(probs[0].id == "0");
  CHECK(probs[0].reference == "1600");
  CHECK(probs[1].id == "1");
  CHECK(read_eval_problems(gsm, EvalTask::Gsm8k, 1).size() == 1);

  fs::path aime = write_file("a.jsonl", "{\"id\": \"7\", \"question\": \"q\", \"answer\": 70.0}\n"
                                        "{\"id\": 8, \"question\": \"q\", \"answer\": \"042\"}\n");
  probs = read_eval_problems(aime, EvalTask::Aime25);
  REQUIRE(probs.size() == 2);
  CHECK(probs[0].id == "7");
  CHECK(probs[0].reference == "70");
  CHECK(probs[1].id == "8");
  CHECK(probs[1].reference == "42");

  auto error_of = [](const fs::path& p, EvalTask task) -> std::string {
    try {
      read_eval_problems(p, task);
    } catch (const xserv::Error& e) {
      return e.what();
    }
    return "";
  };
  fs::path bad = write_file("bad.jsonl", "{\"question\": \"q\", \"answer\": \"#### 1\"}\n"
                                         "{\"question\": \"q\", \"answer\": \"#### 2\"\n");
  CHECK(error_of(bad, EvalTask::Gsm8k) == bad.string() + ":2: not a JSON object");
  fs::path no_marker = write_file("nm.jsonl", "{\"question\": \"q\", \"answer\": \"18\"}\n");
  CHECK(contains(error_of(no_marker, EvalTask::Gsm8k), "nm.jsonl:1: \"answer\" has no \"#### N\""));
  fs::path frac = write_file("f.jsonl", "{\"question\": \"q\", \"answer\": 70.5}\n");
  CHECK(contains(error_of(frac, EvalTask::Aime25), "f.jsonl:1: \"answer\" 70.5 is not an integer"));
  fs::path no_q = write_file("nq.jsonl", "{\"answer\": 70}\n");
  CHECK(contains(error_of(no_q, EvalTask::Aime25), "nq.jsonl:1: missing string field"));
  CHECK_THROWS_AS(read_eval_problems(scratch() / "none.jsonl", EvalTask::Gsm8k), UsageError);
  CHECK_THROWS_AS(parse_eval_task("mmlu"), UsageError);
}

TEST_CASE("summarize: accuracy over samples, pass@1 over problems, pass@k") {
  // Problem 0: 2 of 3 correct; problem 1: none of 3.
  std::vector<SampleScore> s = {{0, true, true, 10},  {0, true, true, 5},  {0, false, true, 5},
                                {1, false, false, 4}, {1, false, true, 3}, {1, false, true, 3}};
  EvalSummary sum = summarize(s);
  CHECK(sum.problems == 2);
  CHECK(sum.samples == 6);
  CHECK(sum.correct == 2);
  CHECK(sum.answered == 5);
  CHECK(sum.max_samples == 3);
  CHECK(sum.tokens == 30);
  CHECK(sum.accuracy == doctest::Approx(2.0 / 6));
  CHECK(sum.pass_at_1 == doctest::Approx((2.0 / 3 + 0) / 2));
  CHECK(sum.pass_at_k == doctest::Approx(0.5));

  // Unequal sample counts: pass@1 weighs problems equally, accuracy weighs samples.
  sum =
      summarize({{0, true, true, 1}, {1, true, true, 1}, {1, false, true, 1}, {1, false, true, 1}});
  CHECK(sum.accuracy == doctest::Approx(0.5));
  CHECK(sum.pass_at_1 == doctest::Approx((1.0 + 1.0 / 3) / 2));
  CHECK(sum.pass_at_k == doctest::Approx(1.0));

  CHECK(summarize({}).samples == 0);
  const std::string text = format_summary(EvalTask::Gsm8k, summarize(s), 2.0);
  CHECK(contains(text, "accuracy    33.33% (2/6 samples correct, 1 without an answer)"));
  CHECK(contains(text, "pass@1      33.33%"));
  CHECK(contains(text, "pass@3      50.00%"));
  CHECK(contains(text, "tokens      30 generated, 15.0 tok/s"));
}

TEST_CASE("xserv eval: usage mistakes exit 2, a malformed data line exits 1 naming it") {
  XSERV_REQUIRE_DATA(data);
  const std::string model = tiny_model().string();
  const std::string gsm = (data / "gsm8k_test.jsonl").string();
  RunResult r = run_xserv("eval " + model + " --data " + gsm);
  CHECK(r.code == 2);
  CHECK(contains(r.out, "missing --task gsm8k|aime25"));
  r = run_xserv("eval " + model + " --task mmlu --data " + gsm);
  CHECK(r.code == 2);
  CHECK(contains(r.out, "unknown task 'mmlu'"));
  r = run_xserv("eval " + model + " --task gsm8k --data /no/such.jsonl");
  CHECK(r.code == 2);
  CHECK(contains(r.out, "data file '/no/such.jsonl' does not exist"));
  r = run_xserv("eval " + model + " --task gsm8k --data " + gsm + " --limit 0");
  CHECK(r.code == 2);
  CHECK(contains(r.out, "--limit must be in"));
  fs::path bad =
      write_file("bad_cli.jsonl", "{\"question\": \"q\", \"answer\": \"#### 1\"}\nnope\n");
  r = run_xserv("eval " + model + " --task gsm8k --data " + bad.string());
  CHECK(r.code == 1);
  CHECK(contains(r.out, bad.string() + ":2: not a JSON object"));
}

TEST_CASE("xserv eval runs GSM8K and AIME on the tiny model and writes one line per sample") {
  XSERV_REQUIRE_DATA(data);
  const std::string common = " --max-tokens 8 --backend cpu --tokenizer " +
                             (data / "o200k_base.tiktoken").string() + " --out ";
  const std::string model = tiny_model().string();
  const fs::path out = scratch() / "r.jsonl";
  RunResult r =
      run_xserv("eval " + model + " --task gsm8k --data " + (data / "gsm8k_test.jsonl").string() +
                " --limit 2" + common + out.string());
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(contains(r.out, "[eval] gsm8k summary"));
  CHECK(contains(r.out, "problems    2"));
  CHECK(contains(r.out, "samples     2 (1 per problem)"));
  CHECK(contains(r.out, "pass@1"));
  CHECK(contains(r.out, "tokens      16 generated"));
  auto lines = read_jsonl(out);
  REQUIRE(lines.size() == 2);
  for (const auto& j : lines) {
    for (const char* key : {"task", "id", "sample", "prompt", "output", "completion", "extracted",
                            "reference", "correct", "tokens", "seconds"})
      CHECK_MESSAGE(j.contains(key), key);
    CHECK(j["task"] == "gsm8k");
    CHECK(j["tokens"] == 8);
    CHECK(j["correct"].is_boolean());
    CHECK(j["seconds"].is_number());
    CHECK(contains(j["prompt"].get<std::string>(), "Answer:"));
  }
  CHECK(lines[0]["reference"] == "18");

  const fs::path out2 = scratch() / "r2.jsonl";
  r = run_xserv("eval " + model + " --task aime25 --data " + (data / "aime2025.jsonl").string() +
                " --limit 1 --samples 2 --temperature 1 --seed 3" + common + out2.string());
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(contains(r.out, "samples     2 (2 per problem)"));
  CHECK(contains(r.out, "pass@2"));
  lines = read_jsonl(out2);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0]["task"] == "aime25");
  CHECK(lines[0]["id"] == "0");
  CHECK(lines[0]["reference"] == "70");
  CHECK(lines[0]["sample"] == 0);
  CHECK(lines[1]["sample"] == 1);
  // The two samples are different draws at temperature 1 (8 tokens each from the random tiny
  // model's near-uniform 201k-way distribution: equal only by a bug) ...
  CHECK(lines[0]["completion"] != lines[1]["completion"]);
  // ... and the same seed draws them again.
  const fs::path out3 = scratch() / "r3.jsonl";
  r = run_xserv("eval " + model + " --task aime25 --data " + (data / "aime2025.jsonl").string() +
                " --limit 1 --samples 2 --temperature 1 --seed 3" + common + out3.string());
  REQUIRE(r.code == 0);
  const auto again = read_jsonl(out3);
  REQUIRE(again.size() == 2);
  for (size_t i = 0; i < 2; ++i)
    CHECK(again[i]["completion"] == lines[i]["completion"]);
}

TEST_CASE("xserv chat keeps a conversation and answers commands from stdin") {
  XSERV_REQUIRE_DATA(data);
  RunResult r =
      run_xserv("chat " + tiny_model().string() + " --backend cpu --max-tokens 4 --tokenizer " +
                    (data / "o200k_base.tiktoken").string(),
                "hello\n/stats\n/set reasoning=low\nhi\n/reset\n/set bogus=1\n/quit\n");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(contains(r.out, "last turn: "));
  CHECK(contains(r.out, "4 generated tokens"));
  CHECK(contains(r.out, "conversation: 2 messages, reasoning medium"));
  CHECK(contains(r.out, "(conversation cleared)"));
  CHECK(contains(r.out, "unknown setting 'bogus'"));
  CHECK(!contains(r.out, "> ")); // no prompt when stdin is not a terminal
}
