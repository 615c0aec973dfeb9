// Pipelined plans on the CPU backend: one process per stage (xserv run spawns `xserv worker`s, or
// they are started by hand with --coordinator), the same tokens as the whole model, a handshake
// that refuses another compile's plan, and a dead or hung rank ending the run with its name.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tests/cli/run_xserv.h"
#include "tests/test_util.h"

using xserv::testing::read_floats;
using xserv::testing::run_shell;
using xserv::testing::run_xserv;
using xserv::testing::RunResult;
namespace fs = std::filesystem;

namespace {

/// A tiny checkpoint with plans for pp 1 and 2 (and a pp 2 plan of another compile).
struct Plans {
  xserv::testing::TempDir tmp{"pipeline"};
  std::string model = (tmp.path / "model").string();
  std::string pp1 = (tmp.path / "pp1").string(), pp2 = (tmp.path / "pp2").string();
  std::string other = (tmp.path / "pp2_other").string();
  Plans() {
    REQUIRE(run_xserv("synth --config " +
                      (xserv::testing::source_dir() / "examples/tiny/config.json").string() +
                      " -o " + model + " --seed 3")
                .code == 0);
    REQUIRE(run_xserv(fmt::format("compile {} -o {} --no-cubins", model, pp1)).code == 0);
    REQUIRE(run_xserv(fmt::format("compile {} -o {} --pp 2 --no-cubins", model, pp2)).code == 0);
    REQUIRE(
        run_xserv(fmt::format("compile {} -o {} --pp 2 --max-seq 2048 --no-cubins", model, other))
            .code == 0);
  }
};

const char* kPrompt = " --backend cpu --prompt-ids 5,6,7,8,9 --max-tokens 5";

std::string read_file(const fs::path& f) {
  std::ifstream in(f);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// `xserv ARGS` with environment assignments `env` in front; stderr kept apart.
RunResult run_with_env(const std::string& env, const std::string& args, const fs::path& dir) {
  return xserv::testing::run_binary(XSERV_BINARY, args, dir, env);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

} // namespace

TEST_CASE("pipelined plan, one process per stage: the tokens of the whole model") {
  Plans p;
  RunResult whole = run_xserv("run " + p.pp1 + kPrompt, "", true);
  RunResult ranks = run_xserv("run " + p.pp2 + kPrompt, "", true);
  RunResult local = run_xserv("run " + p.pp2 + kPrompt + " --pp-local", "", true);
  REQUIRE(whole.code == 0);
  REQUIRE(ranks.code == 0);
  REQUIRE(local.code == 0);
  CHECK(!whole.out.empty());
  CHECK(ranks.out == whole.out);
  CHECK(local.out == whole.out);
  CHECK(ranks.err.find("[pipeline] 2 ranks ready") != std::string::npos);
  CHECK(local.err.find("run one after another in this process") != std::string::npos);
}

TEST_CASE("run --logits-out: each step's logits; the pipeline's equal the whole model's") {
  Plans p;
  const fs::path f1 = p.tmp.path / "pp1.f32", f2 = p.tmp.path / "pp2.f32";
  RunResult whole = run_xserv("run " + p.pp1 + kPrompt + " --logits-out " + f1.string(), "", true);
  RunResult ranks = run_xserv("run " + p.pp2 + kPrompt + " --logits-out " + f2.string(), "", true);
  RunResult plain = run_xserv("run " + p.pp1 + kPrompt, "", true);
  REQUIRE(whole.code == 0);
  REQUIRE(ranks.code == 0);
  CHECK(whole.out == plain.out); // greedy on the host picks what the engine's greedy path picks
  CHECK(whole.err.find("[run] 5 logits rows of 201088 float32 values in") != std::string::npos);
  const std::vector<float> a = read_floats(f1), b = read_floats(f2);
  REQUIRE(a.size() == size_t(5) * 201088);
  CHECK(a == b); // the CPU interpreter's stages chain bit for bit
  // Each row's arg-max (lowest id on ties) is the token generated at that step.
  std::vector<std::string> ids;
  std::string cur;
  for (char c : whole.out + ",")
    if (c == ',' || c == '\n') {
      if (!cur.empty())
        ids.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  REQUIRE(ids.size() == 5);
  for (size_t r = 0; r < 5; ++r) {
    const auto row = a.begin() + static_cast<std::ptrdiff_t>(r * 201088);
    const auto best = std::max_element(row, row + 201088) - row;
    CHECK(std::to_string(best) == ids[r]);
  }
  RunResult text =
      run_xserv("run " + p.pp1 + " --backend cpu --prompt hi --logits-out x.f32", "", true);
  CHECK(text.code == 2);
  CHECK(text.err.find("--logits-out goes with --prompt-ids") != std::string::npos);
}

TEST_CASE("pipelined plan: a rank holding another compile's plan is refused at the handshake") {
  Plans p;
  const int port = 20000 + static_cast<int>(getpid() % 20000);
  const fs::path log0 = p.tmp.path / "rank0.log";
  // Rank 0 waits for its worker; the worker (whose connect retries until rank 0 listens) brings
  // a plan compiled with other options.
  RunResult w = run_shell(fmt::format(
      "({x} run {plan} {prompt} --coordinator 127.0.0.1:{port} --world 2 > {log} 2>&1; "
      "echo rc=$? >> {log}) & {x} worker {other} --rank 1 --world 2 "
      "--coordinator 127.0.0.1:{port} 2>&1; echo worker_rc=$?; wait",
      fmt::arg("x", XSERV_BINARY), fmt::arg("plan", p.pp2), fmt::arg("prompt", kPrompt),
      fmt::arg("port", port), fmt::arg("log", log0.string()), fmt::arg("other", p.other)));
  CHECK(w.out.find("refused by rank 0: rank 1 holds a plan from another compile") !=
        std::string::npos);
  CHECK(w.out.find("worker_rc=1") != std::string::npos);
  const std::string r0 = read_file(log0);
  CHECK(r0.find("pipeline handshake: rank 1 holds a plan from another compile") !=
        std::string::npos);
  CHECK(r0.find("rc=1") != std::string::npos);
}

TEST_CASE("pipelined plan, micro-batches: a batch of prompts gives the whole model's outputs") {
  // eval decodes 3 problems together: the prefill step and every decode step are cut into
  // micro-batches (3 per step with XSERV_PIPELINE_MICROBATCHES=3; pieces of one sequence cross
  // micro-batches during the prefill), so the two ranks work on different ones at once.
  XSERV_REQUIRE_DATA(data);
  Plans p;
  const std::string args = " --task gsm8k --data " + (data / "gsm8k_test.jsonl").string() +
                           " --limit 3 --batch 3 --max-tokens 6 --backend cpu --tokenizer " +
                           (data / "o200k_base.tiktoken").string() + " --out ";
  const fs::path whole = p.tmp.path / "whole.jsonl", ranks = p.tmp.path / "ranks.jsonl";
  const fs::path autom = p.tmp.path / "auto.jsonl";
  REQUIRE(run_with_env("", "eval " + p.pp1 + args + whole.string(), p.tmp.path).code == 0);
  const RunResult r = run_with_env("XSERV_PIPELINE_MICROBATCHES=3",
                                   "eval " + p.pp2 + args + ranks.string(), p.tmp.path);
  INFO(r.err);
  REQUIRE(r.code == 0);
  REQUIRE(run_with_env("", "eval " + p.pp2 + args + autom.string(), p.tmp.path).code == 0);
  // Each line has the problem, the generated tokens and text, and its timing: all but the
  // timing must agree.
  auto outputs = [](const fs::path& f) {
    std::string all;
    std::ifstream in(f);
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      all += j.at("completion").dump() + j.at("tokens").dump() + "\n";
    }
    return all;
  };
  CHECK(!outputs(whole).empty());
  CHECK(outputs(ranks) == outputs(whole));
  CHECK(outputs(autom) == outputs(whole));
}

TEST_CASE("pipelined plan: the NCCL transport is for the CUDA backend; a bad transport name") {
  Plans p;
  RunResult cpu =
      run_with_env("XSERV_PIPELINE_TRANSPORT=nccl", "run " + p.pp2 + kPrompt, p.tmp.path);
  CHECK(cpu.code == 1);
  CHECK(cpu.err.find("NCCL transport") != std::string::npos);
  CHECK(cpu.err.find("--backend cuda") != std::string::npos);
  RunResult bad =
      run_with_env("XSERV_PIPELINE_TRANSPORT=carrier-pigeon", "run " + p.pp2 + kPrompt, p.tmp.path);
  CHECK(bad.code == 2);
  CHECK(bad.err.find("XSERV_PIPELINE_TRANSPORT must be auto, tcp or nccl") != std::string::npos);
}

TEST_CASE("pipelined plan: a worker that dies or hangs ends the run with its rank named") {
  Plans p;
  auto t0 = std::chrono::steady_clock::now();
  RunResult dead =
      run_with_env("XSERV_PIPELINE_FAULT=1:exit@2", "run " + p.pp2 + kPrompt, p.tmp.path);
  CHECK(dead.code == 1);
  CHECK(dead.err.find("pipeline rank 1 (pid") != std::string::npos);
  CHECK(dead.err.find("exited with status 3") != std::string::npos);
  CHECK(seconds_since(t0) < 30);

  t0 = std::chrono::steady_clock::now();
  RunResult hung = run_with_env("XSERV_PIPELINE_FAULT=1:hang@1 XSERV_PIPELINE_TIMEOUT=2",
                                "run " + p.pp2 + kPrompt, p.tmp.path);
  CHECK(hung.code == 1);
  CHECK(hung.err.find("pipeline rank 1 stopped") != std::string::npos);
  CHECK(hung.err.find("sent nothing for 2 s") != std::string::npos);
  CHECK(seconds_since(t0) < 30);
}
