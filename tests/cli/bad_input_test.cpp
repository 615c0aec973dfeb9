// Bad input through the xserv binary: corrupt checkpoints, over-long prompts and bad flags each
// give one clear message and a non-zero exit, never a crash.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <sys/wait.h>
#include <vector>

#include "cli/model_source.h"
#include "tests/cli/run_xserv.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;

using xserv::testing::run_xserv;
using xserv::testing::RunResult;

namespace {

/// A fresh tiny checkpoint in its own temp dir, removed at scope exit.
struct TinyCheckpoint {
  xserv::testing::TempDir tmp;
  fs::path dir;
  explicit TinyCheckpoint(const std::string& tag, const std::string& extra = "")
      : tmp("bad_input_" + tag), dir(tmp.path / "model") {
    RunResult r = run_xserv("synth --config " +
                            (xserv::testing::source_dir() / "examples/tiny/config.json").string() +
                            " -o " + dir.string() + " --seed 3 " + extra);
    REQUIRE(r.code == 0);
  }
  fs::path shard() const { return dir / "model-00001-of-00001.safetensors"; }
};

} // namespace

TEST_CASE("a truncated shard is refused by run and compile, naming the file") {
  TinyCheckpoint ck("truncated");
  fs::resize_file(ck.shard(), fs::file_size(ck.shard()) - 100);
  RunResult r =
      run_xserv("run " + ck.dir.string() + " --prompt-ids 1,2 --max-tokens 2 --backend cpu");
  CHECK(r.code == 1);
  CHECK(r.out.find(ck.shard().string()) != std::string::npos);
  CHECK(r.out.find("invalid safetensors file") != std::string::npos);
  r = run_xserv("compile " + ck.dir.string() + " --emit ir");
  CHECK(r.code == 1);
  CHECK(r.out.find(ck.shard().string()) != std::string::npos);
}

TEST_CASE("an index naming a missing shard is refused") {
  TinyCheckpoint ck("missing_shard", "--shard-size 10MB");
  std::vector<std::string> shards;
  for (const auto& e : fs::directory_iterator(ck.dir))
    if (e.path().extension() == ".safetensors")
      shards.push_back(e.path().filename().string());
  std::sort(shards.begin(), shards.end());
  REQUIRE(shards.size() >= 2);
  fs::remove(ck.dir / shards[1]);
  RunResult r = run_xserv("compile " + ck.dir.string() + " --emit ir");
  CHECK(r.code == 1);
  CHECK(r.out.find(shards[1]) != std::string::npos);
}

TEST_CASE("a checkpoint whose tensors disagree with its config lists the problem") {
  TinyCheckpoint ck("wrong_config");
  // Claim a wider model than the tensors hold.
  std::ifstream in(ck.dir / "config.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const std::string from = "\"intermediate_size\": 64", to = "\"intermediate_size\": 96";
  REQUIRE(text.find(from) != std::string::npos);
  text.replace(text.find(from), from.size(), to);
  std::ofstream(ck.dir / "config.json") << text;
  RunResult r = run_xserv("compile " + ck.dir.string() + " --emit ir");
  CHECK(r.code == 1);
  CHECK(r.out.find("gate_up_proj_blocks") != std::string::npos);
  CHECK(r.out.find("expected") != std::string::npos);
}

TEST_CASE("a prompt longer than the maximum sequence is a clear error") {
  TinyCheckpoint ck("long_prompt");
  RunResult r =
      run_xserv("run " + ck.dir.string() + " --prompt-ids 1,2,3,4,5 --max-seq 4 --backend cpu");
  CHECK(r.code == 1);
  CHECK(r.out.find("the prompt has 5 tokens, more than the maximum sequence length of 4") !=
        std::string::npos);
  r = run_xserv("run " + ck.dir.string() + " --prompt-ids 1,300000 --backend cpu");
  CHECK(r.code == 1);
  CHECK(r.out.find("prompt token 300000 is outside the vocabulary") != std::string::npos);
}

TEST_CASE("synth and run usage errors exit 2") {
  RunResult r = run_xserv("synth --config /no/such.json -o /tmp/x");
  CHECK(r.code == 2);
  CHECK(r.out.find("config '/no/such.json' does not exist") != std::string::npos);
  r = run_xserv("synth --config " +
                (xserv::testing::source_dir() / "examples/tiny/config.json").string() +
                " -o /tmp/x --shard-size 5XB");
  CHECK(r.code == 2);
  CHECK(r.out.find("unknown size unit 'XB'") != std::string::npos);
  r = run_xserv("run /no/such/plan --prompt-ids 1");
  CHECK(r.code == 2);
  r = run_xserv("run " + (xserv::testing::source_dir() / "examples/tiny").string());
  CHECK(r.code == 2);
  CHECK(r.out.find("give exactly one of --prompt-ids") != std::string::npos);
}

TEST_CASE("a plan refuses a checkpoint that changed since compile") {
  TinyCheckpoint ck("changed");
  const fs::path plan = ck.dir / "plan";
  REQUIRE(run_xserv("compile " + ck.dir.string() + " -o " + plan.string()).code == 0);
  REQUIRE(
      run_xserv("run " + plan.string() + " --prompt-ids 1,2 --max-tokens 1 --backend cpu").code ==
      0);
  // Another shard size: the checkpoint was rewritten.
  fs::resize_file(ck.shard(), fs::file_size(ck.shard()) + 8);
  RunResult r = run_xserv("run " + plan.string() + " --prompt-ids 1,2 --backend cpu");
  CHECK(r.code == 1);
  CHECK(r.out.find("the checkpoint changed, recompile the plan") != std::string::npos);
  fs::resize_file(ck.shard(), fs::file_size(ck.shard()) - 8);
  // Another config.
  std::ofstream(ck.dir / "config.json", std::ios::app) << "\n";
  r = run_xserv("run " + plan.string() + " --prompt-ids 1,2 --backend cpu");
  CHECK(r.code == 1);
  CHECK(r.out.find("the plan was compiled for another config") != std::string::npos);
}

TEST_CASE("a plan compiled for another GPU architecture is refused with the fix") {
  CHECK_NOTHROW(xserv::cli::check_plan_arch("sm_90", "sm_90", "NVIDIA H200"));
  CHECK_NOTHROW(xserv::cli::check_plan_arch("", "sm_80", "NVIDIA A100"));
  CHECK_THROWS_WITH(xserv::cli::check_plan_arch("sm_90", "sm_80", "NVIDIA A100"),
                    "the plan was compiled for sm_90 but GPU 0 (NVIDIA A100) is sm_80: recompile "
                    "it with --arch sm_80");
}
