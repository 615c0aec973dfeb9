// What a plan holds about its checkpoint, end to end through the xserv binary: the config block
// compile stored in plan.json must still be the checkpoint's.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tests/cli/run_xserv.h"
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
};

const std::string kRun = " --prompt-ids 1,2 --max-tokens 1 --backend cpu";

} // namespace

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
