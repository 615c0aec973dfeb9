// The kernels a plan carries: every kernel of the tiny, 20b and 120b plans compiles with NVRTC
// for sm_90 (no GPU needed), the tiny plan's generated source stays byte-stable, a plan's
// sources recompile with the headers it carries, and plan.json's launch table is the lowering's.
#include <doctest/doctest.h>

#include <sstream>
#include <string>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <map>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "codegen/cuda_lower.h"
#include "codegen/emit.h"
#include "compiler/memory_plan.h"
#include "compiler/pass_manager.h"
#include "driver/plan_kernels.h"
#include "models/config.h"
#include "models/gpt_oss.h"
#include "runtime/executor.h"
#include "runtime/plan_json.h"
#include "runtime/plan_stage.h"
#include "tests/run_xserv.h"
#include "tests/test_util.h"

using xserv::testing::run_xserv;
using xserv::testing::RunResult;
namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// Compiles `model` into a fresh plan and returns its plan.json.
nlohmann::json compile_plan(const fs::path& model, const fs::path& plan, const std::string& extra) {
  fs::remove_all(plan);
  RunResult r = run_xserv("compile " + model.string() + " -o " + plan.string() + " " + extra +
                          " --max-seq 4096 --max-batch 8");
  INFO(r.out);
  REQUIRE(r.code == 0);
  std::ifstream in(plan / "plan.json");
  return nlohmann::json::parse(in);
}

void check_cubins(const fs::path& plan, const nlohmann::json& pj, size_t min_kernels) {
  const auto& ks = pj.at("codegen").at("kernels");
  CHECK(ks.size() >= min_kernels);
  CHECK(pj["codegen"]["arch"] == "sm_90");
  for (const auto& k : ks) {
    CAPTURE(k["name"].get<std::string>());
    const std::string src = read_file(plan / k["source"].get<std::string>());
    CHECK(src.rfind("// kernel: " + k["name"].get<std::string>(), 0) == 0);
    const std::string cubin = read_file(plan / k["cubin"].get<std::string>());
    CHECK(cubin.substr(0, 4) == "\x7f"
                                "ELF");
  }
}

} // namespace

TEST_CASE("every kernel of the tiny and 120b plans compiles for sm_90") {
  xserv::testing::TempDir cache("kernel_cache"); // a cold cache: NVRTC really compiles
  setenv("XSERV_KERNEL_CACHE", cache.path.c_str(), 1);
  const fs::path src = xserv::testing::source_dir();
  const xserv::testing::TempDir tmp("plan_kernels");
  const fs::path tiny = tmp.path / "tiny";
  const nlohmann::json tj = compile_plan(src / "examples/tiny", tiny, "");
  check_cubins(tiny, tj, 12);
  // Counted launches. Decode, per layer: qkv_rope_decode (qkv, RoPE and both KV cache writes),
  // attention (one key split at position 0), o_proj, the MoE norm + router GEMV + top-k in one
  // launch, MoE gate_up, down, combine = 7; plus embedding, final norm, select_rows, lm_head and
  // the greedy argmax.
  // A 512-token prefill, per layer: the normed x's bf16 activations (gemm_act) + 3 gemms, rope,
  // attention_prefill, two kv_writes (after attention), gemm_act + o_proj gemm, norm, gemm_act +
  // router gemm + top-k, moe_sort + gate_up (the router's activations) + gemm_act + down +
  // combine = 19; plus the same 5.
  CHECK(tj["codegen"]["launches_per_decode_step"] == 2 * 7 + 5);
  CHECK(tj["codegen"]["prefill_step_tokens"] == 512);
  CHECK(tj["codegen"]["launches_per_prefill_step"] == 2 * 19 + 5);
  const fs::path big = tmp.path / "120b";
  nlohmann::json pj = compile_plan(src / "examples/gpt-oss-120b", big, "--kv-dtype bf16");
  check_cubins(big, pj, 12);
  CHECK(pj["codegen"]["launches_per_decode_step"].get<int>() > 36 * 7);
  // The other kernel families the options select: split activations on BF16 experts, and the
  // gemms' canonical order (NVRTC accepts less than nvcc: a kernel only a GPU run would meet).
  for (const auto& [dir, flags] :
       {std::pair{"split", "--gemm-precision split --expert-format bf16"},
        std::pair{"canonical", "--gemm-order canonical --dense-gemm wg"}}) {
    CAPTURE(flags);
    const fs::path plan = tmp.path / dir;
    check_cubins(plan, compile_plan(src / "examples/tiny", plan, flags), 12);
  }
}

TEST_CASE("compile --timeline: every kernel defines XSERV_TIMELINE and carries the stamps") {
  const fs::path src = xserv::testing::source_dir();
  const xserv::testing::TempDir tmp("plan_timeline");
  const fs::path plan = tmp.path / "tiny";
  const nlohmann::json pj = compile_plan(src / "examples/tiny", plan, "--timeline");
  check_cubins(plan, pj, 12); // the sources still start with their "// kernel:" header
  CHECK(pj["options"]["timeline"] == true);
  for (const auto& k : pj["codegen"]["kernels"]) {
    CAPTURE(k["name"].get<std::string>());
    const std::string source = read_file(plan / k["source"].get<std::string>());
    const size_t def = source.find("#define XSERV_TIMELINE 1");
    REQUIRE(def != std::string::npos);
    CHECK(def < source.find("#include")); // before the headers that read it
    // The stamps' array is in every cubin, where the runtime looks it up by name.
    CHECK(read_file(plan / k["cubin"].get<std::string>()).find("xserv_timeline") !=
          std::string::npos);
  }
  RunResult r = run_xserv("inspect " + plan.string());
  CHECK(r.code == 0);
  CHECK(r.out.find("timeline stamps in every kernel") != std::string::npos);
  // A plain plan has neither the option nor the define.
  const fs::path plain = tmp.path / "plain";
  const nlohmann::json plj = compile_plan(src / "examples/tiny", plain, "");
  CHECK_FALSE(plj["options"].contains("timeline"));
  for (const auto& k : plj["codegen"]["kernels"])
    CHECK(read_file(plain / k["source"].get<std::string>()).find("XSERV_TIMELINE 1") ==
          std::string::npos);
}

TEST_CASE("compile reads the MXFP4 scales: up to 128 the MoE gemms multiply once") {
  // synth's default scale bytes 116..118 (real checkpoints' lie there too): the plan records
  // the largest, in its options and each stage's layout, and its grouped MXFP4 gemms take
  // gemm_wg's one-multiply form (names ending _mx4s); scales past 128: neither.
  const xserv::testing::TempDir tmp("plan_scales");
  const fs::path src = xserv::testing::source_dir();
  struct Case {
    std::string range;
    bool small;
  };
  for (const Case& c : {Case{"", true}, Case{"120,140", false}}) {
    CAPTURE(c.range);
    const fs::path model = tmp.path / ("model" + c.range);
    RunResult syn = run_xserv("synth --config " + (src / "examples/tiny/config.json").string() +
                              " -o " + model.string() + " --seed 3" +
                              (c.range.empty() ? "" : " --expert-scale-range " + c.range));
    INFO(syn.out);
    REQUIRE(syn.code == 0);
    const fs::path plan = tmp.path / ("plan" + c.range);
    const nlohmann::json pj = compile_plan(model, plan, "");
    int grouped = 0, one_multiply = 0;
    for (const auto& k : pj["codegen"]["kernels"]) {
      const std::string name = k["name"].get<std::string>();
      if (name.find("_mx4") == std::string::npos || name.rfind("gemmwg_", 0) != 0)
        continue;
      ++grouped;
      one_multiply += name.find("_mx4s") != std::string::npos ? 1 : 0;
      // gemm_wg's SMALL: its 19th template argument, written only where it or one after it is set
      const std::string text = read_file(plan / k["source"].get<std::string>());
      const size_t at = text.find("gemm_wg<"), end = text.find(">(", at);
      REQUIRE(end != std::string::npos);
      std::vector<std::string> args;
      std::stringstream list(text.substr(at + 8, end - at - 8));
      for (std::string a; std::getline(list, a, ',');)
        args.push_back(a.substr(a.find_first_not_of(' ')));
      CHECK((args.size() > 18 && args[18] == "true") == c.small);
    }
    CHECK(grouped >= 2); // gate_up and down at least
    if (c.small) {
      CHECK(pj["options"]["mxfp4_max_scale"] == 118);
      CHECK(one_multiply == grouped);
      CHECK(pj["codegen"]["layout"]["mxfp4_max_scale"] == 118); // pp 1: the stage's layout
      RunResult r = run_xserv("inspect " + plan.string());
      CHECK(r.out.find("MXFP4 scales up to 118: one multiply a pair") != std::string::npos);
    } else {
      CHECK_FALSE(pj["options"].contains("mxfp4_max_scale"));
      CHECK(one_multiply == 0);
    }
  }
}

TEST_CASE("every kernel of the 20b plan compiles for sm_90") {
  XSERV_REQUIRE_DATA(data);
  xserv::testing::TempDir cache("kernel_cache");
  setenv("XSERV_KERNEL_CACHE", cache.path.c_str(), 1);
  const xserv::testing::TempDir tmp("plan_20b");
  const fs::path plan = tmp.path / "plan";
  check_cubins(plan, compile_plan(data / "gpt-oss-20b", plan, ""), 12);
}

TEST_CASE("the tiny plan's generated source is byte-stable (golden file)") {
  // An intended change to the generated code regenerates the golden file in the same commit:
  //   XSERV_UPDATE_GOLDEN=1 build/tests/driver_tests -tc="*byte-stable*"
  const fs::path src = xserv::testing::source_dir();
  const xserv::testing::TempDir tmp("plan_golden");
  const fs::path plan = tmp.path / "plan";
  nlohmann::json pj = compile_plan(src / "examples/tiny", plan, "--no-cubins");
  std::string all;
  for (const auto& k : pj["codegen"]["kernels"]) {
    CHECK_FALSE(k.contains("cubin"));
    all += read_file(plan / k["source"].get<std::string>());
  }
  const fs::path golden = src / "tests/fixtures/golden/tiny_plan_kernels.cu";
  if (const char* u = std::getenv("XSERV_UPDATE_GOLDEN"); u && std::string(u) == "1")
    std::ofstream(golden, std::ios::binary) << all;
  const std::string want = read_file(golden);
  CHECK_MESSAGE(all == want,
                "generated kernels differ from " << golden.string() << " (see the comment above)");
  // Same input, same bytes: a second compile gives identical sources.
  nlohmann::json again = compile_plan(src / "examples/tiny", plan, "--no-cubins");
  std::string second;
  for (const auto& k : again["codegen"]["kernels"])
    second += read_file(plan / k["source"].get<std::string>());
  CHECK(second == all);
}

TEST_CASE("a plan's kernel sources compile with the headers the plan carries") {
  // A plan replayed without usable cubins recompiles its kernels/*.cu: with the templates it was
  // compiled with (its launch table's shared-memory sizes belong to them), not this build's.
  const fs::path src = xserv::testing::source_dir();
  xserv::testing::TempDir tmp("plan_headers");
  const fs::path plan = tmp.path / "plan";
  compile_plan(src / "examples/tiny", plan, "--no-cubins");
  std::map<std::string, std::string> headers = xserv::runtime::plan_kernel_headers(plan);
  CHECK(headers == xserv::codegen::kernel_headers());
  const fs::path gemm = plan / "kernels" / "xserv_kernels" / "gemm.cuh";
  REQUIRE(fs::exists(gemm));
  std::ofstream(gemm, std::ios::app) << "// as an older build wrote it\n";
  headers = xserv::runtime::plan_kernel_headers(plan);
  CHECK(headers.at("xserv_kernels/gemm.cuh").ends_with("// as an older build wrote it\n"));
  CHECK(headers.size() == xserv::codegen::kernel_headers().size());
  fs::remove_all(plan / "kernels" / "xserv_kernels");
  try {
    xserv::runtime::plan_kernel_headers(plan);
    FAIL("a plan without headers must be refused");
  } catch (const xserv::Error& e) {
    CHECK(std::string(e.what()).find((plan / "kernels").string()) != std::string::npos);
    CHECK(std::string(e.what()).find("recompile the plan") != std::string::npos);
  }
}

TEST_CASE("plan.json's launch table is the engine's, and counts its launches") {
  using namespace xserv;
  constexpr int64_t kMaxBatch = 8, kMaxSeq = 8192;
  constexpr int kChunk = 1024;
  const fs::path src = testing::source_dir();
  testing::TempDir dir("launch_table_plan");
  const models::ModelConfig cfg = models::ModelConfig::load(src / "examples/tiny/config.json");
  compiler::PassManager pm;
  pm.add_passes(compiler::kDefaultPasses);
  const ir::Graph g = pm.run(models::build_gpt_oss(cfg));
  driver::PlanKernelOptions opts;
  opts.cubins = false;
  opts.max_batch = kMaxBatch;
  opts.max_seq = kMaxSeq;
  opts.prefill_chunk = kChunk;
  const driver::PlanKernelsResult out = driver::write_plan_kernels(g, dir.path, opts);
  // Through plan.json's form and back, as run reads it.
  const runtime::LaunchTable t =
      runtime::launch_table_from_json(runtime::launch_table_to_json(out.code.table));
  // The same graph lowered directly, as the CUDA engine lowers it.
  const int capacity = codegen::step_token_capacity(kMaxBatch, kChunk);
  const compiler::MemoryPlan memory =
      compiler::plan_memory(g, {{ir::dims::kTokens, capacity},
                                {ir::dims::kSeqs, kMaxBatch},
                                {ir::dims::kTableBlocks, (kMaxSeq + 15) / 16}});
  codegen::LoweringContext ctx;
  ctx.max_tokens = capacity;
  ctx.max_seqs = int(kMaxBatch);
  ctx.max_seq = kMaxSeq;
  ctx.memory = &memory;
  codegen::KernelSet kernels;
  CHECK(t == codegen::lower_graph(g, kernels, ctx));
  CHECK(out.code.layout.tokens == capacity);
  CHECK(int64_t(out.code.layout.arena_bytes) == memory.arena_bytes);
  const runtime::Executor ex(t, runtime::placeholder_bindings(t));
  CHECK(ex.record({1, 1, 0}).size() == size_t(out.codegen.launches_per_decode_step));
  CHECK(out.code.launches_per_decode_step == out.codegen.launches_per_decode_step);
  CHECK(ex.record({512, 1, 511}).size() == size_t(out.codegen.launches_per_prefill_step));
}
