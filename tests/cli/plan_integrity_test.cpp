// What a plan holds about its checkpoint, end to end through the xserv binary: the config block
// compile stored in plan.json must still be the checkpoint's, and --verify-weights hashes every
// shard whole against the SHA-256 compile recorded (one changed byte in the middle of a shard,
// which the sampled fingerprint never reads, is found).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/plan_checkpoint.h"
#include "runtime/sha256.h"
#include "tests/run_xserv.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using xserv::testing::run_xserv;
using xserv::testing::RunResult;

namespace {

/// The tiny checkpoint in shards of about 1 MB (the embedding and lm_head alone take 26 MB each)
/// and a plan compiled from it.
struct Compiled {
  xserv::testing::TempDir tmp{"plan_integrity"};
  fs::path model = tmp.path / "model", plan = tmp.path / "plan";
  nlohmann::json doc;
  Compiled() {
    REQUIRE(run_xserv("synth --config " +
                      (xserv::testing::source_dir() / "examples/tiny/config.json").string() +
                      " -o " + model.string() + " --seed 3 --shard-size 1MB")
                .code == 0);
    REQUIRE(run_xserv(fmt::format("compile {} -o {} --no-cubins", model.string(), plan.string()))
                .code == 0);
    std::ifstream in(plan / "plan.json");
    doc = nlohmann::json::parse(in);
  }
  void write(const nlohmann::json& d) const { std::ofstream(plan / "plan.json") << d.dump(2); }
  fs::path shard(size_t i) const { return model / doc["weights"][i]["file"].get<std::string>(); }
  /// The index of the largest shard.
  size_t largest() const {
    size_t best = 0;
    for (size_t i = 0; i < doc["weights"].size(); ++i)
      if (doc["weights"][i]["bytes"] > doc["weights"][best]["bytes"])
        best = i;
    return best;
  }
};

const std::string kRun = " --prompt-ids 1,2 --max-tokens 1 --backend cpu";

/// Flips the byte at `offset` of `file`.
void flip_byte(const fs::path& file, uint64_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x40);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

} // namespace

TEST_CASE("compile records each shard's full SHA-256, which --verify-weights checks") {
  Compiled c;
  REQUIRE(c.doc["weights"].size() >= 2);
  for (size_t i = 0; i < c.doc["weights"].size(); ++i)
    CHECK(c.doc["weights"][i]["sha256"] ==
          xserv::runtime::sha256_file_hex(c.shard(i))); // the whole file, as compile read it
  RunResult ok = run_xserv("run " + c.plan.string() + kRun + " --verify-weights");
  CHECK(ok.code == 0);
  CHECK(ok.out.find("[plan] --verify-weights: ") != std::string::npos);
  // One byte in the middle of the largest shard, between the blocks the sampled fingerprint
  // reads: the default check does not see it, --verify-weights does and names the file.
  const fs::path shard = c.shard(c.largest());
  const uint64_t size = fs::file_size(shard);
  const uint64_t mid = (64 << 10) + (size - (64 << 10) - 4096) / 63 / 2; // between blocks 0 and 1
  const std::string before = xserv::runtime::sampled_file_digest(shard);
  flip_byte(shard, mid);
  REQUIRE(xserv::runtime::sampled_file_digest(shard) == before);
  CHECK(run_xserv("run " + c.plan.string() + kRun).code == 0);
  std::ofstream(c.tmp.path / "p.jsonl") << R"({"question": "1+1?", "answer": "#### 2"})"
                                        << "\n";
  for (const char* cmd : {"run", "bench", "chat", "eval", "serve"}) {
    CAPTURE(cmd);
    const std::string rest = std::string(cmd) == "run"    ? kRun
                             : std::string(cmd) == "eval" ? " --backend cpu --task gsm8k --data " +
                                                                (c.tmp.path / "p.jsonl").string()
                                                          : " --backend cpu";
    RunResult bad =
        run_xserv(std::string(cmd) + " " + c.plan.string() + rest + " --verify-weights");
    CHECK(bad.code == 1);
    CHECK(bad.out.find(shard.string() + " holds other bytes than when the plan was "
                                        "compiled (its SHA-256 is ") != std::string::npos);
  }
  RunResult worker = run_xserv(
      "worker " + c.plan.string() +
      " --rank 1 --world 2 --coordinator 127.0.0.1:9 --pipeline-token x --verify-weights");
  CHECK(worker.code == 1);
  CHECK(worker.out.find("holds other bytes than when the plan was compiled (its SHA-256") !=
        std::string::npos);
  flip_byte(shard, mid);
  CHECK(run_xserv("run " + c.plan.string() + kRun + " --verify-weights").code == 0);
  // A plan without the full digests (an older compile, or the field deleted): refused, not
  // skipped; a checkpoint directory has no digests to check against (usage).
  nlohmann::json d = c.doc;
  d["weights"][1].erase("sha256");
  c.write(d);
  RunResult old = run_xserv("run " + c.plan.string() + kRun + " --verify-weights");
  CHECK(old.code == 1);
  CHECK(old.out.find("field 'weights[1].sha256': missing, so --verify-weights has nothing to "
                     "check") != std::string::npos);
  CHECK(run_xserv("run " + c.plan.string() + kRun).code == 0); // the sampled check still runs
  d["weights"][1]["sha256"] = "xyz";
  c.write(d);
  CHECK(run_xserv("run " + c.plan.string() + kRun)
            .out.find("field 'weights[1].sha256': expected a SHA-256 in hex, found \"xyz\"") !=
        std::string::npos);
  RunResult dir = run_xserv("run " + c.model.string() + kRun + " --verify-weights");
  CHECK(dir.code == 2);
  CHECK(dir.out.find("--verify-weights checks a checkpoint against the digests a plan recorded") !=
        std::string::npos);
}

TEST_CASE("plan.json's config block must be the checkpoint's, field by field") {
  Compiled c;
  nlohmann::json d = c.doc;
  d["config"]["num_hidden_layers"] = d["config"]["num_hidden_layers"].get<int>() + 1;
  c.write(d);
  RunResult r = run_xserv("run " + c.plan.string() + kRun);
  CHECK(r.code == 1);
  CHECK(r.out.find(fmt::format(
            "{}: field 'config.num_hidden_layers' is {}, but {} gives {}: "
            "plan.json was edited or belongs to another checkpoint",
            (c.plan / "plan.json").string(), c.doc["config"]["num_hidden_layers"].get<int>() + 1,
            (c.model / "config.json").string(), c.doc["config"]["num_hidden_layers"].get<int>())) !=
        std::string::npos);
  d = c.doc;
  d["config"]["rope_theta"] = 10000.5;
  c.write(d);
  CHECK(
      run_xserv("run " + c.plan.string() + kRun).out.find("field 'config.rope_theta' is 10000.5") !=
      std::string::npos);
  d = c.doc;
  d["config"].erase("sliding_window");
  c.write(d);
  CHECK(run_xserv("run " + c.plan.string() + kRun)
            .out.find("field 'config.sliding_window' is absent, but ") != std::string::npos);
  c.write(c.doc);
  CHECK(run_xserv("run " + c.plan.string() + kRun).code == 0);
}
