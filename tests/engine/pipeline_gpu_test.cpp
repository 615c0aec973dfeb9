// Pipelined plans on the CUDA backend, one process per stage: `xserv run` on a --pp plan spawns a
// worker per stage, each on its own GPU when there are enough (else they share GPU 0). Runs the
// xserv binary (testing::find_xserv_binary).
#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "runtime/device.h"
#include "runtime/nccl.h"
#include "tests/run_xserv.h"
#include "tests/test_util.h"

using xserv::testing::run_binary;
using xserv::testing::RunResult;
using xserv::testing::source_dir;
using xserv::testing::TempDir;
namespace fs = std::filesystem;

TEST_CASE("gpu: pp 2 as two CUDA processes gives the whole model's greedy tokens, and a dead "
          "rank ends the run") {
  XSERV_REQUIRE_GPU_AND_BINARY(dev, bin);
  TempDir tmp("pp_cuda");
  const fs::path model = tmp.path / "model", pp1 = tmp.path / "pp1", pp2 = tmp.path / "pp2";
  REQUIRE(
      run_binary(bin,
                 fmt::format("synth --config {} -o {} --seed 5",
                             (source_dir() / "examples/tiny/config.json").string(), model.string()),
                 tmp.path)
          .code == 0);
  REQUIRE(run_binary(bin,
                     fmt::format("compile {} -o {} --no-cubins --max-batch 4", model.string(),
                                 pp1.string()),
                     tmp.path)
              .code == 0);
  REQUIRE(run_binary(bin,
                     fmt::format("compile {} -o {} --no-cubins --max-batch 4 --pp 2",
                                 model.string(), pp2.string()),
                     tmp.path)
              .code == 0);
  // 40 prompt tokens: the prefill takes the gemm path, then 12 decode steps as CUDA graphs.
  std::string ids;
  for (int i = 0; i < 40; ++i)
    ids += fmt::format("{}{}", i ? "," : "", 1000 + 37 * i);
  const std::string prompt = " --backend cuda --prompt-ids " + ids + " --max-tokens 12";
  const RunResult whole = run_binary(bin, "run " + pp1.string() + prompt, tmp.path);
  REQUIRE(whole.code == 0);
  const RunResult ranks = run_binary(bin, "run " + pp2.string() + prompt, tmp.path);
  INFO(ranks.err);
  REQUIRE(ranks.code == 0);
  CHECK(!whole.out.empty());
  CHECK(ranks.out == whole.out); // same kernels on the same shapes: the same tokens
  // The default transport: NCCL with a GPU per rank (and NCCL), else TCP through rank 0 with
  // the reason.
  const bool two = dev.count >= 2 && xserv::runtime::nccl_available();
  CHECK(ranks.err.find(two ? "[pipeline] 2 ranks ready (cuda, activations over NCCL)"
                           : "[pipeline] 2 ranks ready (cuda, activations over TCP)") !=
        std::string::npos);
  if (dev.count < 2)
    CHECK(ranks.err.find("NCCL needs a GPU per rank") != std::string::npos);
  MESSAGE("pp 2 over " << std::min(dev.count, 2) << " GPU(s): " << ranks.out);

  if (two) { // the other transport, and a rank that dies while NCCL waits on it
    const RunResult tcp =
        run_binary(bin, "run " + pp2.string() + prompt, tmp.path, "XSERV_PIPELINE_TRANSPORT=tcp");
    INFO(tcp.err);
    REQUIRE(tcp.code == 0);
    CHECK(tcp.out == whole.out);
    CHECK(tcp.err.find("activations over TCP") != std::string::npos);
    const auto t0 = std::chrono::steady_clock::now();
    const RunResult dead =
        run_binary(bin, "run " + pp2.string() + prompt, tmp.path,
                   "XSERV_PIPELINE_TRANSPORT=nccl XSERV_PIPELINE_FAULT=1:exit@3");
    INFO(dead.err);
    CHECK(dead.code != 0);
    CHECK(dead.err.find("rank 1") != std::string::npos);
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 30.0);
  } else {
    MESSAGE("NCCL transport not checked: it needs two GPUs and NCCL");
  }

  // Rank 1 exits during step 3 (activations over TCP): rank 0 stops at once naming it.
  const auto t0 = std::chrono::steady_clock::now();
  const RunResult dead = run_binary(bin, "run " + pp2.string() + prompt, tmp.path,
                                    "XSERV_PIPELINE_TRANSPORT=tcp XSERV_PIPELINE_FAULT=1:exit@3");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(dead.err);
  CHECK(dead.code != 0);
  CHECK(dead.err.find("pipeline rank 1") != std::string::npos);
  CHECK(s < 30.0);
}
