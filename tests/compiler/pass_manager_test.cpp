// PassManager: pipeline strings, unknown passes, stop-after, dumps, verification, timings.
#include <doctest/doctest.h>

#include <filesystem>
#include <sstream>

#include "base/error.h"
#include "compiler/pass_manager.h"
#include "ir/interpreter.h"
#include "models/config.h"
#include "models/gpt_oss.h"
#include "models/step.h"
#include "tests/step_input.h"
#include "tests/test_util.h"

using namespace xserv;

namespace {
const char* kInput = R"(
  %x = param() {name="x"} : f32[T,8]
  %a = add(%x, %x) : f32[T,8]
  %b = add(%x, %x) : f32[T,8]
  %c = add(%a, %b) : f32[T,8]
  %d = add(%c, %c) : f32[T,8]
  return %c
)";
}

TEST_CASE("a pipeline runs in order and reports timings") {
  std::ostringstream log;
  compiler::PassManagerOptions opts;
  opts.log = &log;
  opts.debug = 1;
  compiler::PassManager pm(opts);
  pm.add_passes("cse, dce");
  ir::Graph out = pm.run(ir::parse(kInput));
  CHECK(out.size() == 3);
  REQUIRE(pm.timings().size() == 2);
  CHECK(pm.timings()[0].name == "cse");
  CHECK(pm.timings()[0].changed);
  CHECK(pm.timings()[1].name == "dce");
  CHECK(log.str().find("cse") != std::string::npos);
  CHECK(log.str().find("changed") != std::string::npos);
}

TEST_CASE("unknown passes are named with the known ones") {
  compiler::PassManager pm;
  CHECK_THROWS_WITH_AS(
      pm.add_passes("cse,fuse_everything"),
      doctest::Contains("unknown pass 'fuse_everything' (known passes: cse, dce, "), Error);
}

TEST_CASE("stop-after runs only the first N passes, dump-after prints the IR") {
  std::ostringstream log;
  compiler::PassManagerOptions opts;
  opts.log = &log;
  opts.stop_after = 1;
  opts.dump_after = {"cse"};
  compiler::PassManager pm(opts);
  pm.add_passes("cse,dce");
  ir::Graph out = pm.run(ir::parse(kInput));
  CHECK(pm.timings().size() == 1);
  CHECK(out.size() == 4); // cse merged %b into %a; the dead %d stays without dce
  CHECK(log.str().find("// ----- IR after cse -----") != std::string::npos);
}

TEST_CASE("dump-dir receives one file per pass") {
  testing::TempDir tmp("pm_dump");
  const std::filesystem::path dir = tmp.path / "dump"; // the pass manager creates it
  compiler::PassManagerOptions opts;
  opts.dump_dir = dir;
  opts.verify_after_all = true;
  compiler::PassManager pm(opts);
  pm.add_passes("cse,dce");
  pm.run(ir::parse(kInput));
  CHECK(std::filesystem::exists(dir / "01_cse.ir"));
  CHECK(std::filesystem::exists(dir / "02_dce.ir"));
}

TEST_CASE("an invalid input graph is refused before any pass runs") {
  ir::Graph g = ir::parse(kInput);
  g.nodes[1].inputs = {4, 0};
  compiler::PassManager pm;
  pm.add("dce");
  CHECK_THROWS_WITH_AS(pm.run(g), doctest::Contains("used before its definition"), Error);
}

TEST_CASE("the default passes on the tiny model keeps the interpreter's answer") {
  auto cfg = models::ModelConfig::load(testing::source_dir() / "examples/tiny");
  ir::Graph g = models::build_gpt_oss(cfg);
  compiler::PassManagerOptions opts;
  opts.verify_after_all = true;
  compiler::PassManager pm(opts);
  pm.add_passes(compiler::kDefaultPasses);
  ir::Graph out = pm.run(g);
  ir::InterpretEnv env;
  env.weights = ir::random_weights(2);
  const models::KvGeometry kv = xserv::testing::row_geometry(g, 1, 8);
  env.dims = xserv::testing::pool_dims(kv);
  env.params = models::step_params(xserv::testing::make_step({{3, 1, 4, 1, 5}}, {0}, {0}, kv));
  // Bitwise, outputs and KV caches: the fused ops run the plain ops' code (measured difference
  // 0), so a rewrite that changes any value, or drops or misroutes a kv_write, fails.
  CHECK(ir::compare_runs(g, out, env, /*rtol=*/0) == "");
}
