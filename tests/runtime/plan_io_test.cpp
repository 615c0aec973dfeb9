// runtime::Plan's writer and reader (runtime/plan_io.h): a written plan reads back equal, and a
// plan.json that is wrong in any field is refused with a message naming the file and the field.
#include <doctest/doctest.h>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "runtime/plan_io.h"
#include "tests/test_util.h"

using namespace xserv;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

runtime::StageLayout sample_layout(bool sends, bool recvs) {
  runtime::StageLayout l;
  l.max_batch = 4;
  l.max_seq = 256;
  l.tokens = 256;
  l.gemm_split = false;
  l.expert_format = runtime::ExpertFormat::Mxfp4;
  l.arena_bytes = 1 << 20;
  l.output = {0, 400, false, sends, 100};
  if (recvs)
    l.recvs.push_back({"act.39", 4096, 256});
  l.kv_block = 16;
  l.table_blocks = 16;
  l.caches.push_back({{16, 1, 8}, 2, false});
  l.weights.push_back({"lm_head.weight", {100, 64}});
  return l;
}

runtime::LaunchTable sample_table() {
  using K = runtime::LaunchArg::Kind;
  runtime::LaunchTable t;
  runtime::PlanKernel k;
  k.name = "linear_k64";
  k.block = 128;
  k.y_per_token = 2;
  k.smem_fixed = 512;
  t.kernels.push_back(k);
  runtime::PlanLaunch l;
  l.kernel = 0;
  l.label = "linear";
  l.max_rows = 8;
  l.args = {{.kind = K::Activation, .offset = 64},
            {.kind = K::Weight, .name = "lm_head.weight"},
            {.kind = K::Rows},
            {.kind = K::Int, .value = -3}};
  t.launches.push_back(l);
  // A library gemm (compile --dense-gemm cublas) over steps above 64 tokens.
  t.library.push_back({runtime::PlanLibraryCall::Op::GemmBf16, 100, 64, true, 0});
  runtime::PlanLaunch g;
  g.library = 0;
  g.label = "linear";
  g.min_rows = 65;
  g.args = {{.kind = K::Activation, .offset = 128},
            {.kind = K::Weight, .name = "lm_head.weight"},
            {.kind = K::Scratch, .index = 0}};
  t.launches.push_back(g);
  t.scratch.push_back({64, {0.5, 0.25, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0}});
  // Structured output's masked pick (the kernel stands in for argmax_masked_rows).
  runtime::PlanLaunch m;
  m.kernel = 0;
  m.label = "argmax_masked";
  m.seq_rows = true;
  for (const uint64_t offset : {0, 16, 32, 48}) { // logits, masks, rows, keys
    runtime::LaunchArg a;
    a.kind = offset == 0 ? K::Activation : K::Scratch;
    a.offset = offset;
    m.args.push_back(a);
  }
  t.masked_pick.push_back(m);
  t.mask_scratch = 0;
  t.mask_rows_scratch = 0;
  t.mask_words = 4;
  return t;
}

/// A plan as compile would write it, with pp stages; nothing in it is a default value.
runtime::Plan sample_plan(int pp) {
  runtime::Plan p;
  p.model_dir = "/models/tiny";
  p.model_digest = "fnv1a64:0123456789abcdef";
  p.config = {{"num_hidden_layers", 2}, {"hidden_size", 64}};
  p.tokenizer = "tokenizer.json";
  p.options = {.max_batch = 4,
               .max_seq = 256,
               .prefill_chunk = 256,
               .pp = pp,
               .last_logits_only = false,
               .kv_dtype = runtime::KvDtype::Bf16,
               .gemm_split = false,
               .arch = "sm_90a",
               .expert_format = runtime::ExpertFormat::Mxfp4,
               .dense_cublas = true};
  p.weights = {{"model-00001.safetensors", 123456, std::string(64, 'a')}};
  p.memory = {1 << 20, 1 << 19, 1 << 21, 12};
  p.passes = {{"cse", 0.25, true}, {"dce", 0.125, false}};
  p.codegen = {.arch = "sm_90a",
               .kernels = {{.name = "linear_k64",
                            .block = 128,
                            .nodes = 2,
                            .decode_launches = 1,
                            .prefill_launches = 1,
                            .cubin = true},
                           {.name = "argmax_rows", .block = 256, .nodes = 1}},
               .launches_per_decode_step = 3,
               .prefill_step_tokens = 256,
               .launches_per_prefill_step = 5};
  p.digests["graph.ir"] = std::string(64, '1');
  p.digests["kernels/linear_k64.cu"] = std::string(64, '2');
  if (pp == 1) {
    // The whole graph's stage, as the reader rebuilds it from "codegen".
    runtime::PlanStage s;
    s.graph = p.graph;
    s.first_layer = 0;
    s.last_layer = 1;
    s.launches_per_decode_step = p.codegen.launches_per_decode_step;
    s.activation_arena_bytes = p.memory.arena_bytes;
    s.layout = sample_layout(false, false);
    s.table = sample_table();
    p.stages.push_back(s);
    return p;
  }
  for (int i = 0; i < pp; ++i) {
    runtime::PlanStage s;
    s.graph = "stage" + std::to_string(i) + ".ir";
    s.first_layer = s.last_layer = i;
    s.embedding = i == 0;
    s.head = i == pp - 1;
    if (i + 1 < pp)
      s.sends.push_back({"act.39", i + 1});
    if (i > 0)
      s.recvs.push_back({"act.39", i - 1});
    s.weight_bytes = 1000 + i;
    s.kv_cache_bytes = 2000 + i;
    s.decode_bytes_per_token = 3000 + i;
    s.prefill_flops_per_token = 1.5e6 + i;
    s.estimated_decode_ms = 0.125 * (i + 1);
    s.estimated_prefill_us_per_token = 0.0625 * (i + 1);
    s.activation_arena_bytes = 5000 + i;
    s.launches_per_decode_step = 7 + i;
    s.layout = sample_layout(i + 1 < pp, i > 0);
    s.table = sample_table();
    p.digests[s.graph] = std::string(64, char('3' + i));
    p.stages.push_back(s);
  }
  p.imbalance = 0.03125;
  return p;
}

/// The error plan_from_json gives for `doc`, or "" when it accepts it.
std::string error_of(const json& doc) {
  try {
    runtime::plan_from_json(doc, "PLAN/plan.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

} // namespace

TEST_CASE("plan round trip: write_plan then read_plan gives the same plan, pp 1 and pp 2") {
  testing::TempDir dir("plan_io");
  for (int pp : {1, 2, 3}) {
    CAPTURE(pp);
    const runtime::Plan p = sample_plan(pp);
    runtime::write_plan(dir.path, p);
    const runtime::Plan back = runtime::read_plan(dir.path);
    CHECK(back == p);
    CHECK(back.stages.size() == size_t(pp));
    CHECK(back.options.expert_format == runtime::ExpertFormat::Mxfp4);
    CHECK(back.stages.back().layout.expert_format == runtime::ExpertFormat::Mxfp4);
    // The document says what it is, and a pp 1 plan keeps version 1's "codegen" layout.
    std::ifstream in(dir.path / "plan.json");
    const json doc = json::parse(in);
    CHECK(doc["format"] == "xserv-plan");
    CHECK(doc["version"] == runtime::kPlanVersion);
    CHECK(doc["options"]["expert_format"] == "mxfp4");
    CHECK(doc.contains("pipeline") == (pp > 1));
    CHECK(doc["codegen"].contains("launch_table") == (pp == 1));
    CHECK_FALSE(doc["options"].contains("timeline")); // written only for a timeline plan
  }
  // A timeline plan (compile --timeline) says so, and reads back as one.
  runtime::Plan t = sample_plan(1);
  t.options.timeline = true;
  runtime::write_plan(dir.path, t);
  const runtime::Plan back = runtime::read_plan(dir.path);
  CHECK(back.options.timeline);
  CHECK(back == t);
  // So does a plan in the gemms' canonical order (compile --gemm-order canonical).
  runtime::Plan c = sample_plan(1);
  c.options.gemm_canonical = true;
  runtime::write_plan(dir.path, c);
  std::ifstream cin(dir.path / "plan.json");
  CHECK(json::parse(cin)["options"]["gemm_order"] == "canonical");
  const runtime::Plan cback = runtime::read_plan(dir.path);
  CHECK(cback.options.gemm_canonical);
  CHECK(cback == c);
  // ... and one in the natural K order (--gemm-order natural), with a library call pinned to
  // one algorithm (Blas's fixed order).
  c.options.gemm_natural = true;
  c.options.dense_cublas = true;
  c.stages[0].table.library.push_back(
      {runtime::PlanLibraryCall::Op::GemmBf16, 5120, 2880, false, 2048});
  runtime::write_plan(dir.path, c);
  std::ifstream nin(dir.path / "plan.json");
  CHECK(json::parse(nin)["options"]["gemm_order"] == "natural");
  const runtime::Plan nback = runtime::read_plan(dir.path);
  CHECK(nback.options.gemm_natural);
  CHECK(nback.stages[0].table.library.back().fixed_rows == 2048);
  CHECK(nback == c);
  // And one compiled from a checkpoint whose MXFP4 scales are at most 128, in the options and
  // the stage's layout (the upload holds the weights to it).
  runtime::Plan m = sample_plan(1);
  m.options.mxfp4_max_scale = 121;
  m.stages[0].layout.mxfp4_max_scale = 121;
  runtime::write_plan(dir.path, m);
  std::ifstream min(dir.path / "plan.json");
  const json mdoc = json::parse(min);
  CHECK(mdoc["options"]["mxfp4_max_scale"] == 121);
  CHECK(mdoc["codegen"]["layout"]["mxfp4_max_scale"] == 121);
  CHECK(runtime::read_plan(dir.path) == m);
}

TEST_CASE("write_plan refuses a plan whose stages disagree with options.pp") {
  testing::TempDir dir("plan_io_bad");
  runtime::Plan p = sample_plan(2);
  p.options.pp = 3;
  CHECK_THROWS_WITH_AS(runtime::write_plan(dir.path, p),
                       doctest::Contains("the plan has 2 stages, but options.pp is 3"), Error);
  CHECK_FALSE(fs::exists(dir.path / "plan.json"));
}

TEST_CASE("plan reader: a wrong field is refused naming plan.json and the field") {
  const json good1 = runtime::plan_to_json(sample_plan(1));
  const json good2 = runtime::plan_to_json(sample_plan(2));
  REQUIRE(error_of(good1).empty());
  REQUIRE(error_of(good2).empty());
  struct Case {
    int pp;
    const char* pointer;
    json value; // null: erase the field
    std::string want;
  };
  const std::vector<Case> cases = {
      {1, "/version", 1, "field 'version': 1, but this xserv reads version 4: recompile the plan"},
      {1, "/format", "xserv", "field 'format': expected \"xserv-plan\""},
      {1, "/options/expert_format", "fp8",
       "field 'options.expert_format': must be \"bf16\", \"mxfp4\" or \"both\", found \"fp8\""},
      {1, "/options/expert_format", nullptr, "field 'options.expert_format': missing"},
      {1, "/options/gemm_precision", "fp32",
       "field 'options.gemm_precision': must be \"split\" or \"bf16\""},
      {1, "/options/arch", "../sm_90", "field 'options.arch': expected a GPU architecture"},
      {1, "/options/prefill_chunk", 0, "field 'options.prefill_chunk': must be in [1, 16777216]"},
      {1, "/options/pp", 65, "field 'options.pp': must be in [1, 64], found 65"},
      {1, "/tokenizer", "/etc/passwd",
       "field 'tokenizer': \"/etc/passwd\" is not a path inside the checkpoint directory"},
      {1, "/passes/0/ms", "fast", "field 'passes[0].ms': expected a number, found \"fast\""},
      {1, "/codegen/arch", "sm_80", "field 'codegen.arch': \"sm_80\", but options.arch is"},
      {1, "/codegen/kernels/0/name", "../x",
       "field 'codegen.kernels[0].name': \"../x\" is not a kernel name"},
      {1, "/codegen/kernels/1/name", "linear_k64",
       "field 'codegen.kernels[1].name': \"linear_k64\" is listed twice"},
      {1, "/codegen/kernels/0/cubin", "/tmp/x.cubin",
       "field 'codegen.kernels[0].cubin': expected \"kernels/linear_k64.cubin\""},
      {1, "/codegen/layout/expert_format", "bf16",
       "field 'codegen.layout.expert_format': \"bf16\", but options.expert_format is \"mxfp4\""},
      {1, "/codegen/layout/max_batch", 8,
       "field 'codegen.layout': is for max batch 8 and max sequence 256, options say 4 and 256"},
      {1, "/codegen/layout/kv_block", 8,
       "field 'codegen.layout': layout: table_blocks = 16 is not max_seq 256 in blocks of 8"},
      {1, "/codegen/layout/tokens", "x", "field 'codegen.layout': layout: tokens must be an"},
      {1, "/codegen/arena_bytes", 7,
       "field 'codegen.arena_bytes': disagrees with codegen.layout.arena_bytes"},
      {1, "/codegen/launch_table/kernels/0/name", "gemm_k64",
       "field 'codegen.launch_table.kernels[0]': \"gemm_k64\" is not among codegen.kernels"},
      {1, "/codegen/launch_table/launches/0/args/3", "int:x",
       "field 'codegen.launch_table': launch table: bad number 'x'"},
      {1, "/codegen/launch_table", nullptr, "field 'codegen.launch_table': missing"},
      {1, "/codegen/launch_table/library/0/op", "sgemm",
       "field 'codegen.launch_table': launch table: library[0].op \"sgemm\" is not a library "
       "routine this runtime knows (gemm_bf16)"},
      {1, "/codegen/launch_table/library/0/n", 0,
       "field 'codegen.launch_table': launch table: library[0] is a 0 x 64 gemm"},
      {1, "/codegen/launch_table/launches/1/library", 1,
       "field 'codegen.launch_table': launch table: launches[1] calls library[1] (k -1), but "
       "there are 1 library calls"},
      {1, "/codegen/launch_table/launches/1/k", 0,
       "field 'codegen.launch_table': launch table: launches[1] calls library[0] (k 0)"},
      {1, "/codegen/launch_table/launches/1/args", json::array({"null", "null"}),
       "field 'codegen.launch_table': launch table: launches[1] calls a gemm with 2 arguments"},
      {1, "/codegen/launch_table/masked_pick/0/k", 1,
       "field 'codegen.launch_table': launch table: masked_pick[0] launches kernel 1 (library "
       "-1); it takes one of the 1 kernels"},
      {1, "/codegen/launch_table/mask_rows_scratch", 1,
       "field 'codegen.launch_table': launch table: mask_rows_scratch is 1, outside the 1 "
       "scratch buffers"},
      {1, "/codegen/launch_table/mask_words", 0,
       "field 'codegen.launch_table': launch table: mask_words is 0, and a masked pick needs"},
      {1, "/codegen/launch_table/masked_pick/0/label", nullptr,
       "field 'codegen.launch_table': launch table in plan.json is malformed: masked_pick[0]"},
      {1, "/options/dense_gemm", "rocblas",
       "field 'options.dense_gemm': must be \"wg\" or \"cublas\", found \"rocblas\""},
      {1, "/options/gemm_order", "exact",
       "field 'options.gemm_order': must be \"fast\", \"canonical\" or \"natural\", found "
       "\"exact\""},
      {1, "/options/mxfp4_max_scale", 129,
       "field 'options.mxfp4_max_scale': must be in [0, 128], found 129"},
      {1, "/options/mxfp4_max_scale", 120,
       "field 'codegen.layout.mxfp4_max_scale': -1, but options.mxfp4_max_scale is 120"},
      {1, "/config/num_hidden_layers", "2",
       "field 'config.num_hidden_layers': expected an integer"},
      {1, "/digests/graph.ir", "abc", "field 'digests.graph.ir': expected a SHA-256 in hex"},
      {1, "/digests", json::object(), "field 'digests': has no entry for graph.ir"},
      {2, "/pipeline/stages/1/recvs/0/peer", 2,
       "field 'pipeline.stages[1].recvs[0].peer': must be in [0, 1], found 2"},
      {2, "/pipeline/stages/0/sends", 1, "field 'pipeline.stages[0].sends': expected a list"},
      {2, "/pipeline/stages/1/graph", "stage0.ir",
       "field 'pipeline.stages[1].graph': stage 1's program is stage1.ir, found \"stage0.ir\""},
      {2, "/pipeline/stages/1/layout/expert_format", "bf16",
       "field 'pipeline.stages[1].layout.expert_format'"},
      {2, "/pipeline/stages/0/launch_table/argmax_chunks", "many",
       "field 'pipeline.stages[0].launch_table': launch table in plan.json is malformed"},
      {2, "/pipeline/stages/1/stage", 0, "field 'pipeline.stages[1].stage': must be in [1, 1]"},
      {2, "/pipeline/stages/1/graph", "../stage1.ir",
       "field 'pipeline.stages[1].graph': \"../stage1.ir\" is not a path inside the plan"},
      {2, "/pipeline/stages/1/layers", json::array({3, 1}),
       "field 'pipeline.stages[1].layers': expected [FIRST, LAST]"},
      {2, "/pipeline", nullptr, "field 'pipeline': missing, but options.pp is 2"},
      {2, "/options/pp", 3, "field 'pipeline.stages': has 2 stages, but options.pp is 3"},
      {2, "/digests/stage1.ir", nullptr, "field 'digests': has no entry for stage1.ir"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.pointer);
    CAPTURE(c.value.dump());
    json d = c.pp == 1 ? good1 : good2;
    const json::json_pointer ptr(c.pointer);
    if (c.value.is_null())
      d[ptr.parent_pointer()].erase(ptr.back());
    else
      d[ptr] = c.value;
    const std::string e = error_of(d);
    CHECK(e.find("PLAN/plan.json: " + c.want) != std::string::npos);
    CHECK(e.find("json.exception") == std::string::npos);
  }
  CHECK(error_of(json::array()).find("not an xserv plan") != std::string::npos);
}

TEST_CASE("read_plan names plan.json when it is missing or not JSON") {
  testing::TempDir dir("plan_io_read");
  const std::string missing = (dir.path / "plan.json").string() + ": cannot read";
  CHECK_THROWS_WITH_AS(runtime::read_plan(dir.path), doctest::Contains(missing.c_str()), Error);
  std::ofstream(dir.path / "plan.json") << "{\"format\": ";
  CHECK_THROWS_WITH_AS(runtime::read_plan(dir.path), doctest::Contains("not valid JSON"), Error);
}

TEST_CASE("verify_plan_files: a changed or unlisted file is refused, a deleted graph.ir is not") {
  testing::TempDir dir("plan_io_files");
  fs::create_directories(dir.path / "kernels");
  std::ofstream(dir.path / "graph.ir") << "graph";
  std::ofstream(dir.path / "kernels" / "linear_k64.cu") << "// kernel";
  runtime::Plan p = sample_plan(1);
  p.digests = runtime::digest_plan_files(dir.path);
  CHECK(p.digests.size() == 2);
  CHECK_NOTHROW(runtime::verify_plan_files(dir.path, p));
  fs::remove(dir.path / "graph.ir");
  CHECK_NOTHROW(runtime::verify_plan_files(dir.path, p));
  std::ofstream(dir.path / "kernels" / "linear_k64.cu", std::ios::app) << "// edited";
  CHECK_THROWS_WITH_AS(runtime::verify_plan_files(dir.path, p),
                       doctest::Contains("linear_k64.cu: changed since the plan was compiled"),
                       Error);
  p.digests = runtime::digest_plan_files(dir.path);
  std::ofstream(dir.path / "kernels" / "x.cubin") << "?";
  CHECK_THROWS_WITH_AS(runtime::verify_plan_files(dir.path, p),
                       doctest::Contains("x.cubin: not part of the plan as compiled"), Error);
  CHECK(runtime::confined_path("kernels/a.cu"));
  CHECK_FALSE(runtime::confined_path("../a"));
  CHECK_FALSE(runtime::confined_path("/a"));
  CHECK_FALSE(runtime::confined_path(""));
}
