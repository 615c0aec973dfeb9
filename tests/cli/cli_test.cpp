// The xserv binary as a user meets it: help, exit codes, clear messages, compile --emit ir.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <sys/wait.h>

#include <fmt/format.h>

#include "tests/run_xserv.h"
#include "tests/test_util.h"

using xserv::testing::run_xserv;
using xserv::testing::RunResult;

namespace {

std::string tiny() {
  return (xserv::testing::source_dir() / "examples/tiny").string();
}

} // namespace

TEST_CASE("--help lists the commands and exits 0") {
  RunResult r = run_xserv("--help");
  CHECK(r.code == 0);
  CHECK(r.out.find("compile") != std::string::npos);
  RunResult c = run_xserv("compile --help");
  CHECK(c.code == 0);
  CHECK(c.out.find("--emit") != std::string::npos);
}

TEST_CASE("usage mistakes: one clear message, exit code 2") {
  RunResult r = run_xserv("frobnicate");
  CHECK(r.code == 2);
  CHECK(r.out.find("unknown command 'frobnicate'") != std::string::npos);
  r = run_xserv("compile " + tiny() + " --emit ir --bogus");
  CHECK(r.code == 2);
  CHECK(r.out.find("unknown option '--bogus'") != std::string::npos);
  r = run_xserv("compile /no/such/model --emit ir");
  CHECK(r.code == 2);
  CHECK(r.out.find("model directory '/no/such/model' does not exist") != std::string::npos);
  r = run_xserv("compile " + tiny());
  CHECK(r.code == 2);
  CHECK(r.out.find("missing -o PLAN_DIR") != std::string::npos);
  r = run_xserv("compile " + tiny() + " --emit ir --max-seq 0");
  CHECK(r.code == 2);
  CHECK(r.out.find("--max-seq must be in") != std::string::npos);
  r = run_xserv("run " + tiny() + " --prompt hi --date 2024-13-45");
  CHECK(r.code == 2);
  CHECK(r.out.find("--date must be a date YYYY-MM-DD, got '2024-13-45'") != std::string::npos);
  r = run_xserv("compile " + tiny() + " --emit ir --passes cse,nope");
  CHECK(r.code == 1);
  CHECK(r.out.find("unknown pass 'nope'") != std::string::npos);
}

TEST_CASE("a config of another model fails with exit 1 and names the field") {
  const xserv::testing::TempDir tmp("cli_llama");
  const std::filesystem::path& dir = tmp.path;
  std::ofstream(dir / "config.json") << R"({"model_type": "llama"})";
  RunResult r = run_xserv("compile " + dir.string() + " --emit ir");
  CHECK(r.code == 1);
  CHECK(r.out.find("model_type is \"llama\", not \"gpt_oss\"") != std::string::npos);
}

TEST_CASE("compile --emit ir prints a verified graph, -o writes a plan directory") {
  RunResult r = run_xserv("compile " + tiny() + " --emit ir");
  CHECK(r.code == 0);
  CHECK(r.out.find("= attention(") != std::string::npos);
  CHECK(r.out.find("return %") != std::string::npos);
  const xserv::testing::TempDir tmp("cli_plan");
  const auto plan = tmp.path / "plan", dump = tmp.path / "dump";
  r = run_xserv("compile " + tiny() + " -o " + plan.string() + " --dump-dir " + dump.string());
  CHECK(r.code == 0);
  CHECK(std::filesystem::exists(plan / "graph.ir"));
  CHECK(std::filesystem::exists(plan / "plan.json"));
  CHECK(std::filesystem::exists(dump / "00_input.ir"));
  CHECK(std::filesystem::exists(dump / "01_cse.ir"));
}

TEST_CASE("compile --dense-gemm: cuBLAS by default where it can run, wg on request, refusals") {
  const xserv::testing::TempDir tmp("dense_gemm");
  const std::string model = (tmp.path / "model").string();
  REQUIRE(run_xserv("synth --config " +
                    (xserv::testing::source_dir() / "examples/tiny/config.json").string() + " -o " +
                    model + " --seed 5")
              .code == 0);
  const std::string plan = (tmp.path / "plan").string();
  const std::string base = "compile " + model + " -o " + plan + " --max-batch 2 --max-seq 512 ";
  // The default: cuBLAS with plain bf16 gemms on sm_90; gemm_wg where cuBLAS cannot serve the
  // plan (split activations, another architecture) or when asked.
  auto dense_of = [&](const std::string& flags) {
    REQUIRE(run_xserv(base + "--no-cubins " + flags).code == 0);
    const auto doc = nlohmann::json::parse(run_xserv("inspect " + plan + " --json").out);
    return doc["options"].value("dense_gemm", std::string("wg"));
  };
  CHECK(dense_of("") == "cublas");
  CHECK(dense_of("--dense-gemm wg") == "wg");
  CHECK(dense_of("--gemm-precision split") == "wg");
  CHECK(dense_of("--arch sm_80") == "wg");
  REQUIRE(run_xserv(base + "--no-cubins --dense-gemm cublas").code == 0);
  const RunResult shown = run_xserv("inspect " + plan);
  CHECK(shown.out.find("dense gemms of prompt steps on cuBLAS") != std::string::npos);
  const RunResult js = run_xserv("inspect " + plan + " --json");
  const auto doc = nlohmann::json::parse(js.out);
  CHECK(doc["options"]["dense_gemm"] == "cublas");
  // The CPU reference runs such a plan like any other (it reads the checkpoint).
  const RunResult r =
      run_xserv("run " + plan + " --prompt-ids 11,22,33 --max-tokens 3 --backend cpu", "", true);
  INFO(r.err);
  CHECK(r.code == 0);
  for (const char* bad : {"--dense-gemm rocblas", "--dense-gemm cublas --gemm-precision split",
                          "--dense-gemm cublas --arch sm_80"}) {
    CAPTURE(bad);
    const RunResult b = run_xserv(base + "--no-cubins " + bad, "", true);
    CHECK(b.code == 2);
    CHECK(b.err.find("--dense-gemm") != std::string::npos);
  }
}

TEST_CASE("plans of every --expert-format run on the CPU backend to the same tokens") {
  // The CPU reference reads the checkpoint itself: the experts' device format changes nothing
  // there, so an mxfp4 or both plan gives the bf16 plan's greedy tokens.
  const xserv::testing::TempDir tmp("expert_formats");
  const std::string model = (tmp.path / "model").string();
  REQUIRE(run_xserv("synth --config " +
                    (xserv::testing::source_dir() / "examples/tiny/config.json").string() + " -o " +
                    model + " --seed 5")
              .code == 0);
  std::string first;
  for (const std::string f : {"bf16", "mxfp4", "both"}) {
    const std::string plan = (tmp.path / ("plan_" + f)).string();
    REQUIRE(run_xserv("compile " + model + " -o " + plan +
                      " --max-batch 2 --max-seq 64 --no-cubins --expert-format " + f)
                .code == 0);
    const RunResult r =
        run_xserv("run " + plan + " --prompt-ids 11,22,33 --max-tokens 5 --backend cpu", "", true);
    INFO(f << ": " << r.err);
    REQUIRE(r.code == 0);
    CHECK(!r.out.empty());
    if (first.empty())
      first = r.out;
    CHECK(r.out == first);
  }
}
