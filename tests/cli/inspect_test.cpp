// Roofline arithmetic against the shared TARGETS.md figures, and `xserv inspect` on real plans.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/model_source.h"
#include "engine/pipeline/boundary.h"
#include "engine/roofline.h"
#include "models/config.h"
#include "runtime/plan_io.h"
#include "tests/run_xserv.h"
#include "tests/test_util.h"

using namespace xserv;
using xserv::testing::run_xserv;
using xserv::testing::RunResult;
namespace fs = std::filesystem;

TEST_CASE("20b floors agree with the ceiling arithmetic of TARGETS.md") {
  XSERV_REQUIRE_DATA(data);
  auto cfg = models::ModelConfig::load(data / "gpt-oss-20b");
  const engine::WeightBytes w = engine::weight_bytes(cfg);
  // TARGETS.md: attention 1.27 GB, lm_head 1.16 GB, 4 experts x 24 layers 4.78 GB in BF16.
  CHECK(w.attention / 1e9 == doctest::Approx(1.27).epsilon(0.01));
  CHECK(w.lm_head / 1e9 == doctest::Approx(1.16).epsilon(0.01));
  CHECK(4 * 24 * w.expert_one_layer_one / 1e9 == doctest::Approx(4.78).epsilon(0.01));
  // ... read once at 4.3 TB/s: 1.68 ms, 596 tok/s.
  const engine::DecodeEstimate d = engine::decode_floor(cfg, 1, 0);
  CHECK(d.seconds * 1e3 == doctest::Approx(1.68).epsilon(0.01));
  CHECK(d.tokens_per_s == doctest::Approx(596).epsilon(0.01));
  // Prefill: ~6.1 GFLOP per token.
  CHECK(engine::prefill_flops_per_token(cfg, 0) / 1e9 == doctest::Approx(6.1).epsilon(0.02));
  // 48 KiB of KV cache per token.
  CHECK(engine::kv_bytes_per_token(cfg) == 48 * 1024);
  // A batch of 64 touches (nearly) every expert, so far more bytes but far more tokens.
  const engine::DecodeEstimate b = engine::decode_floor(cfg, 64, 0);
  CHECK(b.bytes > 5 * d.bytes);
  CHECK(b.tokens_per_s > 10 * d.tokens_per_s);
  // MXFP4 experts (TARGETS.md): the 4 x 24 active experts read 1.27 GB, 0.86 ms a token.
  const auto mx = runtime::ExpertFormat::Mxfp4;
  CHECK(4 * 24 * engine::weight_bytes(cfg, mx).expert_one_layer_one / 1e9 ==
        doctest::Approx(1.27).epsilon(0.02));
  CHECK(engine::decode_floor(cfg, 1, 0, {}, mx).seconds * 1e3 ==
        doctest::Approx(0.86).epsilon(0.02));
}

TEST_CASE("inspect prints the stage table and roofline, and --json the same facts") {
  const xserv::testing::TempDir tmp("inspect_plan");
  const fs::path plan = tmp.path / "plan";
  REQUIRE(run_xserv("compile " + (xserv::testing::source_dir() / "examples/gpt-oss-120b").string() +
                    " -o " + plan.string() + " --max-seq 4096 --max-batch 8")
              .code == 0);
  RunResult r = run_xserv("inspect " + plan.string());
  CHECK(r.code == 0);
  CHECK(r.out.find("36 layers (18 sliding, window 128), 128 experts top-4") != std::string::npos);
  CHECK(r.out.find("decode, batch 1, empty context") != std::string::npos);
  CHECK(r.out.find("moe_experts_residual 36") != std::string::npos);
  RunResult j = run_xserv("inspect " + plan.string() + " --json", "", true);
  REQUIRE(j.code == 0);
  auto doc = nlohmann::json::parse(j.out);
  CHECK(doc["stages"].size() == 1);
  CHECK(doc["stages"][0]["layers"][1] == 35);
  CHECK(doc["options"]["max_seq"] == 4096);
  // 120b holds ~117B parameters: ~65 GB with its experts in MXFP4 (the default), 4.25 bits.
  CHECK(doc["weights"]["total"].get<double>() / 1e9 == doctest::Approx(65.2).epsilon(0.02));
  CHECK(doc["stages"][0]["activation_arena_bytes"].get<double>() > 0);
  fs::remove_all(plan);
  r = run_xserv("inspect /tmp");
  CHECK(r.code == 2);
  CHECK(r.out.find("is not a plan directory") != std::string::npos);
}

TEST_CASE("compile --pp writes one program per stage, inspect shows their share and balance") {
  const xserv::testing::TempDir tmp("inspect_pp");
  const fs::path plan = tmp.path / "plan";
  const std::string model = (xserv::testing::source_dir() / "examples/gpt-oss-120b").string();
  REQUIRE(run_xserv("compile " + model + " -o " + plan.string() +
                    " --max-seq 4096 --max-batch 8 --pp 3 --no-cubins")
              .code == 0);
  for (const char* f : {"stage0.ir", "stage1.ir", "stage2.ir", "graph.ir"})
    CHECK(fs::exists(plan / f));
  RunResult j = run_xserv("inspect " + plan.string() + " --json", "", true);
  REQUIRE(j.code == 0);
  auto doc = nlohmann::json::parse(j.out);
  REQUIRE(doc["stages"].size() == 3);
  int next = 0;
  double weights = 0;
  for (const auto& s : doc["stages"]) {
    CHECK(s["layers"][0] == next);
    next = s["layers"][1].get<int>() + 1;
    weights += s["weight_bytes"].get<double>();
    CHECK(s["activation_arena_bytes"].get<double>() > 0);
    CHECK(s["estimated_decode_ms"].get<double>() > 0);
  }
  CHECK(next == 36);
  // Every stage lowers for the CUDA runtime; their launches add up to the whole model's.
  int launches = 0;
  for (const auto& s : doc["stages"])
    launches += s["launches_per_decode_step"].get<int>();
  CHECK(launches == doc["launches_per_decode_step"].get<int>());
  CHECK(doc["stages"][0]["embedding"] == true);
  CHECK(doc["stages"][2]["head"] == true);
  CHECK(doc["stages"][1]["recvs"].size() == 1);
  CHECK(doc["stages"][1]["sends"].size() == 1);
  CHECK(doc["stages"][1]["recvs"] == doc["stages"][0]["sends"]);
  CHECK(weights == doctest::Approx(doc["weights"]["total"].get<double>()).epsilon(1e-9));
  CHECK(doc["imbalance"].get<double>() < 0.1);
  RunResult r = run_xserv("inspect " + plan.string());
  CHECK(r.out.find("imbalance") != std::string::npos);
  CHECK(r.out.find("+h") != std::string::npos);
  // More stages than layers: one clear error, no plan written.
  const fs::path bad = tmp.path / "bad";
  RunResult e =
      run_xserv("compile " + model + " -o " + bad.string() + " --pp 40 --no-cubins", "", true);
  CHECK(e.code == 1);
  CHECK(e.err.find("cannot split 36 layers into 40 pipeline stages: --pp must be 1 to 36") !=
        std::string::npos);
  CHECK_FALSE(fs::exists(bad / "plan.json"));
}

TEST_CASE(
    "compile --pp 2 records each stage's launch table and layout, which inspect and run read") {
  const xserv::testing::TempDir tmp("inspect_pp2");
  const fs::path plan = tmp.path / "plan";
  const std::string model = (xserv::testing::source_dir() / "examples/tiny").string();
  RunResult c = run_xserv("compile " + model + " -o " + plan.string() +
                          " --max-seq 256 --max-batch 4 --pp 2 --no-cubins --expert-format mxfp4");
  INFO(c.out);
  REQUIRE(c.code == 0);
  // The typed plan: one stage per program, each with the code the CUDA runtime replays.
  const runtime::Plan p = runtime::read_plan(plan);
  CHECK(p.options.pp == 2);
  CHECK(p.options.expert_format == runtime::ExpertFormat::Mxfp4);
  REQUIRE(p.stages.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    CAPTURE(i);
    const runtime::PlanStage& st = p.stages[i];
    CHECK(st.graph == "stage" + std::to_string(i) + ".ir");
    CHECK(st.layout.expert_format == runtime::ExpertFormat::Mxfp4);
    CHECK(st.layout.max_batch == 4);
    CHECK(st.layout.max_seq == 256);
    CHECK_FALSE(st.table.launches.empty());
    CHECK(st.launches_per_decode_step > 0);
  }
  // Stage 0 sends what stage 1 receives, and stage 1's layout has a buffer for it.
  REQUIRE(p.stages[0].sends.size() == 1);
  CHECK(p.stages[0].sends[0].peer == 1);
  CHECK(p.stages[1].recvs == std::vector<runtime::PlanTransfer>{{p.stages[0].sends[0].name, 0}});
  REQUIRE(p.stages[1].layout.recvs.size() == 1);
  CHECK(p.stages[1].layout.recvs[0].name == p.stages[0].sends[0].name);
  CHECK(p.stages[0].layout.output.sends);
  CHECK_FALSE(p.stages[1].layout.output.sends);
  // The writer writes back what compile wrote.
  std::ifstream in(plan / "plan.json");
  CHECK(runtime::plan_to_json(p) == nlohmann::json::parse(in));

  RunResult j = run_xserv("inspect " + plan.string() + " --json", "", true);
  REQUIRE(j.code == 0);
  const auto doc = nlohmann::json::parse(j.out);
  REQUIRE(doc["stages"].size() == 2);
  CHECK(doc["options"]["expert_format"] == "mxfp4");
  CHECK(doc["stages"][0]["launch_table_entries"] == p.stages[0].table.launches.size());
  CHECK(doc["stages"][0]["masked_pick"] == false); // it sends activations on, no logits
  CHECK(doc["stages"][1]["masked_pick"] == true);  // the last stage ends in the logits
  CHECK(doc["stages"][1]["recvs"][0] == p.stages[0].sends[0].name);
  // The experts' bytes in the plan's format (17 bytes per 32 values), MXFP4 kernels in its code.
  const auto cfg = models::ModelConfig::load(fs::path(model) / "config.json");
  const double mx_bytes = engine::weight_bytes(cfg, runtime::ExpertFormat::Mxfp4).experts;
  CHECK(doc["weights"]["experts"].get<double>() == doctest::Approx(mx_bytes));
  CHECK(mx_bytes < 0.3 * engine::weight_bytes(cfg).experts);
  size_t mx4 = 0;
  for (const auto& k : p.codegen.kernels)
    mx4 += k.name.find("_mx4") != std::string::npos;
  CHECK(mx4 >= 2); // moe_gate_up and moe_down_part on MXFP4 (and the grouped gemms)
  RunResult t = run_xserv("inspect " + plan.string());
  CHECK(t.out.find("experts mxfp4") != std::string::npos);
  CHECK(t.out.find("launches per decode step") != std::string::npos);
  // The guarantee the plan gives, from its launch tables: attention in the canonical order;
  // the experts' decode kernels in the default (fast) order.
  CHECK(doc["batch_invariance"]["attention"] == true);
  CHECK(doc["batch_invariance"]["attention_chunk_keys"] == runtime::kAttnChunkKeys);
  CHECK(doc["batch_invariance"]["experts"] == false);
  CHECK(doc["batch_invariance"]["linears"] == false);
  CHECK(t.out.find("batch invariance: attention (key chunks of 128) in one order for every "
                   "step") != std::string::npos);

  // run's ModelSource carries the plan, whose stages hold the expert format; a checkpoint
  // directory has none.
  const cli::Command* run = nullptr;
  for (const auto& cmd : cli::commands())
    if (cmd.spec.name == "run")
      run = &cmd;
  REQUIRE(run != nullptr);
  const cli::ModelSource src =
      cli::resolve_source(plan.string(), cli::parse_args(run->spec, {plan.string()}));
  REQUIRE(src.plan.has_value());
  for (const runtime::PlanStage& st : src.plan->plan->stages)
    CHECK(st.layout.expert_format == runtime::ExpertFormat::Mxfp4);
  CHECK(*src.plan->plan == p);
  CHECK(src.plan->plan->stages.at(1).graph == "stage1.ir");
  const cli::ModelSource ck = cli::resolve_source(model, cli::parse_args(run->spec, {model}));
  CHECK_FALSE(ck.plan.has_value());
  CHECK(
      run_xserv("compile " + model + " -o " + (tmp.path / "bad").string() + " --expert-format fp8")
          .code == 2);

  // What a rank checks at a stage boundary comes from the plan's layouts (the CUDA runtime reads
  // no stage program) and is what the stage programs declare.
  for (size_t i = 0; i < 2; ++i)
    for (int64_t tokens : {1, 37}) {
      CAPTURE(tokens);
      const ir::Graph g = ir::parse_file(plan / p.stages[i].graph, "stage");
      auto same = [](const std::vector<engine::pipeline::BoundaryTensor>& a,
                     const std::vector<engine::pipeline::BoundaryTensor>& b) {
        bool eq = a.size() == b.size();
        for (size_t k = 0; eq && k < a.size(); ++k)
          eq = a[k].name == b[k].name && a[k].dtype == b[k].dtype && a[k].shape == b[k].shape;
        return eq;
      };
      CHECK(same(engine::pipeline::stage_receives(p.stages[i], tokens),
                 engine::pipeline::stage_receives(g, tokens)));
      CHECK(same(engine::pipeline::stage_sends(p.stages[i], tokens),
                 engine::pipeline::stage_sends(g, tokens)));
    }
  // The IR programs may be deleted (the CUDA runtime replays the tables); the CPU backend, which
  // runs them, names the missing file.
  for (const char* f : {"graph.ir", "stage0.ir", "stage1.ir"})
    fs::remove(plan / f);
  CHECK(run_xserv("inspect " + plan.string()).code == 0);
  const RunResult cpu =
      run_xserv("run " + plan.string() + " --backend cpu --pp-local --prompt-ids 1,2,3");
  CHECK(cpu.code == 1);
  CHECK(cpu.out.find("stage0.ir: pipeline stage program missing") != std::string::npos);
}

TEST_CASE("compile --gemm-order canonical: decode kernels in the gemms' order, inspect says so") {
  const xserv::testing::TempDir tmp("inspect_canonical");
  const fs::path plan = tmp.path / "plan";
  const std::string model = (xserv::testing::source_dir() / "examples/tiny").string();
  RunResult c = run_xserv("compile " + model + " -o " + plan.string() +
                          " --max-seq 256 --max-batch 4 --no-cubins --gemm-order canonical");
  INFO(c.out);
  REQUIRE(c.code == 0);
  const runtime::Plan p = runtime::read_plan(plan);
  CHECK(p.options.gemm_canonical);
  CHECK_FALSE(p.options.dense_cublas); // cuBLAS sums in an order of its own
  RunResult j = run_xserv("inspect " + plan.string() + " --json", "", true);
  REQUIRE(j.code == 0);
  const auto doc = nlohmann::json::parse(j.out);
  CHECK(doc["options"]["gemm_order"] == "canonical");
  // On sm_90 (the lowering's gemm_wg order) the experts' decode kernels are all chained.
  const bool sm90 = doc["options"]["arch"] == "sm_90";
  CHECK(doc["batch_invariance"]["experts"] == sm90);
  CHECK(doc["batch_invariance"]["linears"] == sm90);
  size_t chained = 0, moe_decode = 0;
  for (const auto& k : p.codegen.kernels)
    if (k.name.starts_with("moe_gate_up") || k.name.starts_with("moe_down")) {
      ++moe_decode;
      chained += k.name.ends_with("_chain");
    }
  CHECK(moe_decode >= 2);
  CHECK(chained == (sm90 ? moe_decode : 0));
  RunResult t = run_xserv("inspect " + plan.string());
  CHECK(t.out.find("decode kernels in the gemms' canonical order") != std::string::npos);
  if (sm90)
    CHECK(t.out.find("batch invariance: the whole step, attention (key chunks of 128), the "
                     "experts and the linears (gemm_wg's K order in every kernel)") !=
          std::string::npos);
  // cuBLAS's projections are not in that order: refused, one clear line.
  RunResult bad = run_xserv("compile " + model + " -o " + (tmp.path / "bad").string() +
                                " --no-cubins --gemm-order canonical --dense-gemm cublas");
  CHECK(bad.code != 0);
  CHECK(bad.out.find("--gemm-order canonical takes gemm_wg's projections") != std::string::npos);
  RunResult bad2 = run_xserv("compile " + model + " -o " + (tmp.path / "bad2").string() +
                                 " --no-cubins --gemm-order exact");
  CHECK(bad2.code != 0);
  CHECK(bad2.out.find("--gemm-order must be fast, canonical or natural") != std::string::npos);
}

TEST_CASE(
    "compile --gemm-order natural: the linears in cuBLAS's K order, pinned, and inspect says so") {
  const xserv::testing::TempDir tmp("inspect_natural");
  const fs::path plan = tmp.path / "plan";
  const std::string model = (xserv::testing::source_dir() / "examples/tiny").string();
  RunResult c = run_xserv("compile " + model + " -o " + plan.string() +
                          " --max-seq 256 --max-batch 4 --no-cubins --gemm-order natural");
  INFO(c.out);
  REQUIRE(c.code == 0);
  const runtime::Plan p = runtime::read_plan(plan);
  CHECK(p.options.gemm_canonical);
  CHECK(p.options.gemm_natural);
  RunResult j = run_xserv("inspect " + plan.string() + " --json", "", true);
  REQUIRE(j.code == 0);
  const auto doc = nlohmann::json::parse(j.out);
  CHECK(doc["options"]["gemm_order"] == "natural");
  if (doc["options"]["arch"] != "sm_90")
    return;                      // the natural order is sm_90's (cuBLAS and gemm_wg's natural form)
  CHECK(p.options.dense_cublas); // the prompt projections on cuBLAS, pinned
  CHECK(doc["batch_invariance"]["linears"] == true);
  CHECK(doc["batch_invariance"]["experts"] == true);
  // Every library call keeps one algorithm from the largest step; the decode kernels of the
  // linears chain in natural K (qkv and the router fused, lm_head and o_proj on tensor cores).
  size_t calls = 0;
  for (const runtime::PlanStage& st : p.stages)
    for (const runtime::PlanLibraryCall& l : st.table.library) {
      ++calls;
      CHECK(l.fixed_rows > 64);
    }
  CHECK(calls >= 5); // q, k, v, o_proj, the router (lm_head when a step's rows pass 64)
  size_t natural = 0;
  for (const auto& k : p.codegen.kernels) {
    const bool nat = k.name.ends_with("_natural");
    natural += nat;
    if (k.name.starts_with("qkv") || k.name.starts_with("rmsnorm_router_topk"))
      CHECK(nat);
  }
  CHECK(natural >= 4); // qkv, the router, o_proj, lm_head
  RunResult t = run_xserv("inspect " + plan.string());
  CHECK(t.out.find("dense linears in the natural K order, cuBLAS pinned") != std::string::npos);
  CHECK(t.out.find("the linears (the natural K order: cuBLAS's fixed order and the decode "
                   "kernels)") != std::string::npos);
  // With every token's logits, lm_head takes the final norm: no chained kernel fits it, so the
  // gemm serves it from one row and the guarantee stands.
  RunResult all = run_xserv("compile " + model + " -o " + (tmp.path / "all").string() +
                            " --max-seq 256 --max-batch 4 --no-cubins --gemm-order natural "
                            "--all-logits");
  REQUIRE(all.code == 0);
  const auto adoc = nlohmann::json::parse(
      run_xserv("inspect " + (tmp.path / "all").string() + " --json", "", true).out);
  CHECK(adoc["batch_invariance"]["linears"] == true);
  for (const auto& k : runtime::read_plan(tmp.path / "all").codegen.kernels)
    CHECK_FALSE(k.name.starts_with("rmsnorm_linear"));
  // Refused with one clear line: without cuBLAS's projections, or with split activations.
  for (const char* flags : {" --dense-gemm wg", " --gemm-precision split"}) {
    RunResult bad = run_xserv("compile " + model + " -o " + (tmp.path / "bad").string() +
                              " --no-cubins --gemm-order natural" + flags);
    CHECK(bad.code != 0);
    CHECK(bad.out.find("--gemm-order natural needs --gemm-precision bf16, an sm_90 plan and "
                       "cuBLAS's projections") != std::string::npos);
  }
  RunResult split = run_xserv("compile " + model + " -o " + (tmp.path / "bad").string() +
                              " --no-cubins --gemm-order canonical --gemm-precision split");
  CHECK(split.code != 0);
  CHECK(split.out.find("--gemm-order canonical needs --gemm-precision bf16") != std::string::npos);
  CHECK_FALSE(fs::exists(tmp.path / "bad" / "plan.json"));
}
