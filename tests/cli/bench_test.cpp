// xserv bench: statistics, the three output formats, argument handling, and a CPU run end to end.
#include <doctest/doctest.h>

#include <string>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sys/wait.h>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "cli/bench_report.h"
#include "cli/serving_report.h"
#include "models/config.h"
#include "tests/run_xserv.h"
#include "tests/test_util.h"

using namespace xserv;
namespace fs = std::filesystem;

using xserv::testing::run_xserv;
using xserv::testing::RunResult;

namespace {

/// Tables go to stdout, progress to stderr: keep them apart.
RunResult run_split(const std::string& args) {
  return run_xserv(args, "", true);
}

cli::BenchRow row(std::string test, std::vector<double> ts, int64_t batch = 1) {
  cli::BenchRow r;
  r.test = std::move(test);
  r.tokens_per_s = std::move(ts);
  r.batch = batch;
  return r;
}

} // namespace

TEST_CASE("mean, sample standard deviation and nearest-rank quantiles") {
  CHECK(xserv::mean({1, 2, 3, 6}) == 3.0);
  CHECK(xserv::stddev({2, 4, 4, 4, 5, 5, 7, 9}) == doctest::Approx(2.138089935));
  CHECK(xserv::stddev({5}) == 0.0);
  std::vector<double> v;
  for (int i = 100; i >= 1; --i)
    v.push_back(i);
  CHECK(xserv::quantile(v, 0.5) == 50);
  CHECK(xserv::quantile(v, 0.99) == 99);
  CHECK(xserv::quantile(v, 1.0) == 100);
  CHECK(xserv::quantile({}, 0.5) == 0);
}

TEST_CASE("the serving report renders its figures as md and json") {
  engine::ServingOptions o;
  o.requests = 12;
  engine::ServingReport rep;
  rep.requests = rep.completed = 12;
  rep.output_tokens = 60;
  rep.output_tps = 30.5;
  rep.ttft.p99 = 7.25;
  const nlohmann::json j = nlohmann::json::parse(cli::render_serving(rep, o, "fake", {}, "json"));
  CHECK(j["completed"] == 12);
  CHECK(j["output_throughput"].get<double>() == doctest::Approx(30.5));
  CHECK(j["p99_ttft_ms"].get<double>() == doctest::Approx(7.25));
  const std::string md = cli::render_serving(rep, o, "fake", {}, "md");
  CHECK(md.find("| TTFT p99 (ms) | 7.25 |") != std::string::npos);
  CHECK_THROWS_AS(cli::render_serving(rep, o, "fake", {}, "xml"), UsageError);
}

TEST_CASE("the 20b model is described as llama-bench would") {
  XSERV_REQUIRE_DATA(data);
  auto cfg = models::ModelConfig::load(data / "gpt-oss-20b");
  cli::BenchModel m = cli::describe_model(cfg, "cuda", 2.0);
  CHECK(m.name == "gpt-oss 21B");
  CHECK(m.params_b == doctest::Approx(20.91).epsilon(0.01));
  CHECK(m.size_gib == doctest::Approx(38.96).epsilon(0.01)); // BF16 experts: ~39 GB
}

TEST_CASE("markdown, json and csv renderings carry the same numbers") {
  cli::BenchModel m{"gpt-oss 1M", 0.5, 0.001, "cpu"};
  std::vector<cli::BenchRow> rows = {row("pp512", {100, 110, 120}), row("tg128 x B4", {40, 44}, 4)};
  rows[1].ttft_ms_median = 12.5;
  rows[1].tpot_ms_median = 3.25;
  rows[1].tpot_ms_p99 = 4.5;
  const std::string md = cli::render_bench(m, rows, "md");
  CHECK(md.find("| model ") == 0);
  CHECK(md.find("110.00 ± 10.00") != std::string::npos);
  CHECK(md.find("tg128 x B4") != std::string::npos);
  CHECK(md.find("12.50") != std::string::npos);
  auto doc = nlohmann::json::parse(cli::render_bench(m, rows, "json"));
  CHECK(doc["results"].size() == 2);
  CHECK(doc["results"][0]["avg_ts"] == doctest::Approx(110));
  CHECK(doc["results"][1]["n_batch"] == 4);
  CHECK(doc["results"][1]["tpot_ms_p99"] == doctest::Approx(4.5));
  const std::string csv = cli::render_bench(m, rows, "csv");
  CHECK(csv.find("gpt-oss 1M,0.5000,0.0010,cpu,pp512,") != std::string::npos);
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 3);
  CHECK_THROWS_AS(cli::render_bench(m, rows, "xml"), Error);
}

TEST_CASE("bench argument errors exit 2 with a clear line") {
  const std::string tiny = (testing::source_dir() / "examples/tiny").string();
  RunResult r = run_split("bench " + tiny + " -o xml");
  CHECK(r.code == 2);
  CHECK(r.err.find("-o must be md, json or csv") != std::string::npos);
  r = run_split("bench " + tiny + " -p 12x");
  CHECK(r.code == 2);
  CHECK(r.err.find("-p: '12x' is not an integer") != std::string::npos);
  r = run_split("bench " + tiny + " -b 0");
  CHECK(r.code == 2);
}

TEST_CASE("bench runs on the CPU backend and prints one row per test") {
  const testing::TempDir tmp("bench_tiny");
  const fs::path dir = tmp.path / "model";
  REQUIRE(run_split("synth --config " +
                    (testing::source_dir() / "examples/tiny/config.json").string() + " -o " +
                    dir.string() + " --seed 2")
              .code == 0);
  RunResult r = run_split("bench " + dir.string() +
                          " -p 4 -n 2 -b 1,2 -d 0,3 -r 2 --mixed 3 -o json --backend cpu");
  REQUIRE(r.code == 0);
  auto doc = nlohmann::json::parse(r.out);
  std::vector<std::string> tests;
  for (const auto& row : doc["results"]) {
    tests.push_back(row["test"]);
    CHECK(row["samples_ts"].size() == 2);
    CHECK(row["avg_ts"].get<double>() > 0);
  }
  CHECK(tests == std::vector<std::string>{
                     "pp4", "tg2", "tg2 x B1 + p3", "tg2 x B2", "tg2 x B2 + p3", "pp4 @ d3",
                     "tg2 @ d3", "tg2 @ d3 x B1 + p3", "tg2 @ d3 x B2", "tg2 @ d3 x B2 + p3"});
  CHECK(doc["backend"] == "cpu");
  // A plan caps the cache: asking for more is refused before anything runs.
  const fs::path plan = dir / "plan";
  REQUIRE(
      run_split("compile " + dir.string() + " -o " + plan.string() + " --max-seq 8 --max-batch 1")
          .code == 0);
  r = run_split("bench " + plan.string() + " -p 16 -n 1 -r 1");
  CHECK(r.code == 2);
  CHECK(r.err.find("the plan allows 8 and 1") != std::string::npos);
  // A mixed step holds one sequence more than the decodes: B1 + a prompt needs a batch of 2.
  r = run_split("bench " + plan.string() + " -p 0 -n 1 -r 1 --mixed 2");
  CHECK(r.code == 2);
  CHECK(r.err.find("batches of 2, the plan allows 8 and 1") != std::string::npos);
  // A pipelined plan benches with its stages in this process (--pp-local) or one per rank.
  const fs::path pp2 = dir / "pp2";
  REQUIRE(
      run_split("compile " + dir.string() + " -o " + pp2.string() + " --pp 2 --no-cubins").code ==
      0);
  for (const char* where : {" --pp-local", ""}) {
    CAPTURE(where);
    r = run_split("bench " + pp2.string() + " -p 4 -n 2 -r 1 -o json --backend cpu" + where);
    REQUIRE(r.code == 0);
    CHECK(nlohmann::json::parse(r.out)["results"].size() == 2);
  }
}
