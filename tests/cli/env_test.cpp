// cli::parse_env: every XSERV_* variable's default, accepted values, and the error naming a
// variable whose value is not one; the xserv binary refusing a bad one before it starts; and a
// plan refusing the developer knobs that would change its launches (they are compile flags).
#include <doctest/doctest.h>

#include <map>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/env.h"
#include "runtime/open_plan.h"
#include "runtime/plan_io.h"
#include "tests/run_xserv.h"
#include "tests/test_util.h"

using namespace xserv;

namespace {

cli::Env parse(const std::map<std::string, std::string>& vars) {
  return cli::parse_env([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

} // namespace

TEST_CASE("env: defaults when nothing is set, and an empty variable counts as unset") {
  for (const auto& vars :
       {std::map<std::string, std::string>{},
        std::map<std::string, std::string>{{"XSERV_PDL", ""}, {"XSERV_PREFILL_CHUNK", ""}}}) {
    const cli::Env e = parse(vars);
    CHECK(e.data.empty());
    CHECK(e.debug == 0);
    CHECK(e.cuda_graphs);
    CHECK_FALSE(e.profile);
    CHECK(e.pdl);
    CHECK(e.profile_repeat.empty());
    CHECK_FALSE(e.prefill_chunk.has_value());
    CHECK_FALSE(e.gemm_split.has_value());
    CHECK(e.pipeline_timeout == std::chrono::seconds(10));
    CHECK(e.pipeline_step_timeout == std::chrono::seconds(60));
    CHECK(e.pipeline_micro_batches == 0);
    CHECK(e.pipeline_transport == "auto");
    CHECK(e.pipeline_token.empty());
    CHECK_FALSE(e.pipeline_fault.has_value());
  }
}

TEST_CASE("env: accepted values") {
  const cli::Env e = parse({{"XSERV_DATA", "/data"},
                            {"XSERV_API_KEY", "k"},
                            {"XSERV_KERNEL_CACHE", "/cache"},
                            {"XSERV_DEBUG", "2"},
                            {"XSERV_CUDA_GRAPHS", "0"},
                            {"XSERV_PROFILE", "1"},
                            {"XSERV_PDL", "0"},
                            {"XSERV_PROFILE_REPEAT", "moe_gate_up:3"},
                            {"XSERV_PREFILL_CHUNK", "1024"},
                            {"XSERV_GEMM_PRECISION", "bf16"},
                            {"XSERV_PIPELINE_TIMEOUT", "2.5"},
                            {"XSERV_PIPELINE_STEP_TIMEOUT", "0.01"},
                            {"XSERV_PIPELINE_MICROBATCHES", "3"},
                            {"XSERV_PIPELINE_TRANSPORT", "tcp"},
                            {"XSERV_PIPELINE_TOKEN", "s3cret"},
                            {"XSERV_PIPELINE_FAULT", "2:stall@17"}});
  CHECK(e.data == "/data");
  CHECK(e.api_key == "k");
  CHECK(e.kernel_cache == "/cache");
  CHECK(e.debug == 2);
  CHECK_FALSE(e.cuda_graphs);
  CHECK(e.profile);
  CHECK_FALSE(e.pdl);
  CHECK(e.profile_repeat == "moe_gate_up");
  CHECK(e.profile_repeat_times == 3);
  CHECK(e.prefill_chunk == 1024);
  CHECK(e.gemm_split == false);
  CHECK(e.pipeline_timeout == std::chrono::milliseconds(2500));
  CHECK(e.pipeline_step_timeout == std::chrono::milliseconds(100)); // at least 0.1 s
  CHECK(e.pipeline_micro_batches == 3);
  CHECK(e.pipeline_transport == "tcp");
  CHECK(e.pipeline_token == "s3cret");
  REQUIRE(e.pipeline_fault.has_value());
  CHECK(e.pipeline_fault->rank == 2);
  CHECK(e.pipeline_fault->what == "stall");
  CHECK(e.pipeline_fault->step == 17);
  CHECK(parse({{"XSERV_GEMM_PRECISION", "split"}}).gemm_split == true);
  const cli::Env twice = parse({{"XSERV_PROFILE_REPEAT", "attention_decode"}});
  CHECK(twice.profile_repeat == "attention_decode");
  CHECK(twice.profile_repeat_times == 2);
}

TEST_CASE("env: a bad value is a usage error naming the variable and what it accepts") {
  const std::string kFault = "RANK:WHAT@STEP (WHAT: exit, hang, stop, stall or narrow)";
  const std::vector<std::pair<std::pair<std::string, std::string>, std::string>> cases = {
      {{"XSERV_DEBUG", "yes"}, "an integer in [0, 3]"},
      {{"XSERV_DEBUG", "9"}, "an integer in [0, 3]"},
      {{"XSERV_CUDA_GRAPHS", "off"}, "0 or 1"},
      {{"XSERV_PROFILE", "2"}, "0 or 1"},
      {{"XSERV_PDL", "false"}, "0 or 1"},
      {{"XSERV_PROFILE_REPEAT", "router:1"}, "NAME or NAME:TIMES with TIMES in [2, 16]"},
      {{"XSERV_PROFILE_REPEAT", "router:x"}, "NAME or NAME:TIMES with TIMES in [2, 16]"},
      {{"XSERV_PROFILE_REPEAT", ":3"}, "NAME or NAME:TIMES with a kernel name fragment NAME"},
      {{"XSERV_PREFILL_CHUNK", "4"}, "an integer in [8, 65536]"},
      {{"XSERV_PREFILL_CHUNK", "1024x"}, "an integer in [8, 65536]"},
      {{"XSERV_GEMM_PRECISION", "fp32"}, "split or bf16"},
      {{"XSERV_PIPELINE_TIMEOUT", "soon"}, "a number of seconds above 0"},
      {{"XSERV_PIPELINE_TIMEOUT", "-1"}, "a number of seconds above 0"},
      {{"XSERV_PIPELINE_STEP_TIMEOUT", "inf"}, "a number of seconds above 0"},
      {{"XSERV_PIPELINE_MICROBATCHES", "0"}, "an integer in [1, 4096]"},
      {{"XSERV_PIPELINE_TRANSPORT", "rdma"}, "auto, tcp or nccl"},
      {{"XSERV_PIPELINE_FAULT", "1:explode@2"}, kFault},
      {{"XSERV_PIPELINE_FAULT", "1:exit"}, kFault},
      {{"XSERV_PIPELINE_FAULT", "x:exit@2"}, kFault},
      {{"XSERV_PIPELINE_FAULT", "1:exit@-2"}, kFault},
  };
  for (const auto& [var, accepts] : cases) {
    CAPTURE(var.first);
    CAPTURE(var.second);
    const std::string want =
        "environment variable " + var.first + " must be " + accepts + ", got '" + var.second + "'";
    CHECK_THROWS_WITH_AS(parse({var}), want.c_str(), cli::UsageError);
  }
}

TEST_CASE("env: xserv refuses a bad variable before running the command (exit 2)") {
  const testing::RunResult r = testing::run_shell(std::string("XSERV_PDL=2 ") + XSERV_BINARY +
                                                  " tokenize /no/such/model hi 2>&1");
  CHECK(r.code == 2);
  CHECK(r.out.find("environment variable XSERV_PDL must be 0 or 1, got '2'") != std::string::npos);
}

TEST_CASE("env: a plan refuses XSERV_PREFILL_CHUNK and XSERV_GEMM_PRECISION other than its own") {
  testing::TempDir tmp("env_plan");
  const std::string config = (testing::source_dir() / "examples/tiny/config.json").string();
  const std::string model = (tmp.path / "m").string(), plan = (tmp.path / "p").string();
  REQUIRE(testing::run_xserv("synth --config " + config + " -o " + model + " --seed 1").code == 0);
  const testing::RunResult c =
      testing::run_xserv("compile " + model + " -o " + plan +
                         " --max-seq 256 --max-batch 2 --no-cubins --gemm-precision bf16");
  INFO(c.out);
  REQUIRE(c.code == 0);
  runtime::OpenedPlan src;
  src.dir = plan;
  src.model_dir = model;
  src.plan = std::make_shared<const runtime::Plan>(runtime::read_plan(plan));
  CHECK_FALSE(src.plan->options.gemm_split);
  const runtime::StageLayout& layout = src.plan->stages.at(0).layout;
  CHECK_FALSE(layout.gemm_split);
  // The settings the commands take from the environment (cli/model_source.cpp: run_settings).
  auto settings = [](const cli::Env& e) {
    return runtime::RunSettings{e.prefill_chunk, e.gemm_split};
  };
  CHECK_NOTHROW(runtime::check_plan_run(src, layout, 2, 256, settings(parse({}))));
  CHECK_NOTHROW(runtime::check_plan_run(
      src, layout, 2, 256,
      settings(parse({{"XSERV_GEMM_PRECISION", "bf16"}, {"XSERV_PREFILL_CHUNK", "256"}}))));
  CHECK_THROWS_WITH_AS(
      runtime::check_plan_run(src, layout, 2, 256,
                              settings(parse({{"XSERV_GEMM_PRECISION", "split"}}))),
      doctest::Contains("recompile it with xserv compile --gemm-precision split"), cli::UsageError);
  CHECK_THROWS_WITH_AS(runtime::check_plan_run(src, layout, 2, 256,
                                               settings(parse({{"XSERV_PREFILL_CHUNK", "64"}}))),
                       doctest::Contains("recompile it with xserv compile --prefill-chunk 64"),
                       cli::UsageError);
  CHECK_THROWS_WITH_AS(runtime::check_plan_run(src, layout, 2, 128, settings(parse({}))),
                       doctest::Contains("recompile it with xserv compile --max-batch 2 --max-seq "
                                         "128"),
                       cli::UsageError);
  const testing::RunResult bad =
      testing::run_xserv("compile " + model + " -o " + plan + "2 --gemm-precision fp8");
  CHECK(bad.code == 2);
  CHECK(bad.out.find("--gemm-precision must be split or bf16, got 'fp8'") != std::string::npos);
}
