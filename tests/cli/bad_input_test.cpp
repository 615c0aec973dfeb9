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

#include <nlohmann/json.hpp>

#include "runtime/open_plan.h"
#include "runtime/sha256.h"
#include "tests/run_xserv.h"
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
  xserv::testing::TempDir tmp("synth_usage");
  const std::string out = (tmp.path / "x").string();
  RunResult r = run_xserv("synth --config /no/such.json -o " + out);
  CHECK(r.code == 2);
  CHECK(r.out.find("config '/no/such.json' does not exist") != std::string::npos);
  r = run_xserv("synth --config " +
                (xserv::testing::source_dir() / "examples/tiny/config.json").string() + " -o " +
                out + " --shard-size 5XB");
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
  CHECK_NOTHROW(xserv::runtime::check_plan_arch("sm_90", "sm_90", "NVIDIA H200"));
  CHECK_NOTHROW(xserv::runtime::check_plan_arch("", "sm_80", "NVIDIA A100"));
  CHECK_THROWS_WITH(xserv::runtime::check_plan_arch("sm_90", "sm_80", "NVIDIA A100"),
                    "the plan was compiled for sm_90 but GPU 0 (NVIDIA A100) is sm_80: recompile "
                    "it with --arch sm_80");
}

namespace {

/// A tiny checkpoint and its plan (no cubins), with plan.json as a document to mutate.
struct TinyPlan {
  TinyCheckpoint ck;
  fs::path plan;
  nlohmann::json doc;
  explicit TinyPlan(const std::string& tag, const std::string& extra = "")
      : ck(tag), plan(ck.tmp.path / "tiny.plan") {
    REQUIRE(
        run_xserv("compile " + ck.dir.string() + " -o " + plan.string() + " --no-cubins " + extra)
            .code == 0);
    std::ifstream in(plan / "plan.json");
    doc = nlohmann::json::parse(in);
  }
  /// Writes `d` as plan.json and runs `command PLAN rest`.
  RunResult with(const nlohmann::json& d, const std::string& command,
                 const std::string& rest = "") const {
    std::ofstream(plan / "plan.json") << d.dump(2);
    return run_xserv(command + " " + plan.string() + " " + rest);
  }
};

const std::string kRun = "--prompt-ids 1,2 --max-tokens 1 --backend cpu";

std::string sha256_of(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  xserv::runtime::Sha256 h;
  h.update(bytes);
  return h.hex_digest();
}

} // namespace

TEST_CASE("plan.json: wrong types, values out of range and missing fields name file and field") {
  TinyPlan p("plan_json");
  const std::string file = (p.plan / "plan.json").string();
  struct Case {
    const char* pointer;
    nlohmann::json value; // null: erase the field
    std::string want;
  };
  const std::vector<Case> cases = {
      {"/options/max_batch", "x", "field 'options.max_batch': expected an integer, found \"x\""},
      {"/options/max_batch", 0, "field 'options.max_batch': must be in [1, 4096], found 0"},
      {"/options/max_seq", int64_t{1} << 40,
       "field 'options.max_seq': must be in [1, 16777216], found 1099511627776"},
      {"/options/kv_dtype", "f64", "field 'options.kv_dtype': must be \"f32\" or \"bf16\""},
      {"/options", nullptr, "field 'options': missing"},
      {"/version", 999, "field 'version': 999, but this xserv reads version 4"},
      {"/version", 1, "field 'version': 1, but this xserv reads version 4: recompile the plan"},
      {"/model_dir", "", "field 'model_dir': empty (the checkpoint directory the plan was"},
      {"/options/expert_format", "fp8",
       "field 'options.expert_format': must be \"bf16\", \"mxfp4\" or \"both\", found \"fp8\""},
      {"/codegen/layout/expert_format", "bf16",
       "field 'codegen.layout.expert_format': \"bf16\", but options.expert_format is \"mxfp4\""},
      {"/codegen/layout/max_batch", 32,
       "field 'codegen.layout': is for max batch 32 and max sequence"},
      {"/codegen/launch_table/kernels/0/name", "no_such_kernel",
       "field 'codegen.launch_table.kernels[0]': \"no_such_kernel\" is not among"},
      {"/codegen/kernels/0/name", "../../x", "field 'codegen.kernels[0].name': \"../../x\" is not"},
      {"/version", "1", "field 'version': expected an integer, found \"1\""},
      {"/model_digest", nullptr, "field 'model_digest': missing"},
      {"/model_digest", "", "field 'model_digest': empty"},
      {"/model_dir", 7, "field 'model_dir': expected a string, found 7"},
      {"/config", "tiny", "field 'config': expected an object"},
      {"/graph", "../../etc/passwd",
       "field 'graph': \"../../etc/passwd\" is not a path inside the plan directory"},
      {"/graph", "/etc/passwd", "field 'graph': \"/etc/passwd\" is not a path inside the plan"},
      {"/weights", nlohmann::json::array({{{"file", "../../etc/passwd"}, {"bytes", 1}}}),
       "field 'weights[0].file': \"../../etc/passwd\" is not a path inside the checkpoint"},
      {"/weights", nlohmann::json::array({{{"file", "x"}, {"bytes", "big"}}}),
       "field 'weights[0].bytes': expected an integer, found \"big\""},
      {"/memory/arena_bytes", "lots", "field 'memory.arena_bytes': expected an integer"},
      {"/pipeline", nlohmann::json::object({{"stages", 3}}),
       "field 'pipeline.stages': expected a list, found 3"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.pointer);
    CAPTURE(c.value.dump());
    nlohmann::json d = p.doc;
    const nlohmann::json::json_pointer ptr(c.pointer);
    if (c.value.is_null())
      d[ptr.parent_pointer()].erase(ptr.back());
    else
      d[ptr] = c.value;
    for (const std::string& command : {std::string("run"), std::string("inspect")}) {
      CAPTURE(command);
      const RunResult r = p.with(d, command, command == "run" ? kRun : "");
      CHECK(r.code == 1);
      CHECK(r.out.find(file + ": " + c.want) != std::string::npos);
      CHECK(r.out.find("json.exception") == std::string::npos);
    }
  }
  CHECK(p.with(p.doc, "run", kRun).code == 0); // the unmutated plan still runs
}

TEST_CASE("plan.json: a stage program outside the plan directory is refused") {
  TinyPlan p("plan_stage", "--pp 2");
  nlohmann::json d = p.doc;
  d["pipeline"]["stages"][1]["graph"] = "../model/config.json";
  RunResult r = p.with(d, "run", kRun);
  CHECK(r.code == 1);
  CHECK(r.out.find((p.plan / "plan.json").string() +
                   ": field 'pipeline.stages[1].graph': \"../model/config.json\" is not a path "
                   "inside the plan directory") != std::string::npos);
  d = p.doc;
  d["options"]["pp"] = 3; // two stages listed
  r = p.with(d, "inspect");
  CHECK(r.code == 1);
  CHECK(r.out.find("field 'pipeline.stages': has 2 stages, but options.pp is 3") !=
        std::string::npos);
}

TEST_CASE("graph.ir: a parse error names the file, line and column") {
  TinyPlan p("graph_ir");
  std::ofstream(p.plan / "graph.ir", std::ios::app) << "%999 = frobnicate() : f32[4]\n";
  nlohmann::json d = p.doc; // with the edited file's digest, so that the parser meets it
  d["digests"]["graph.ir"] = sha256_of(p.plan / "graph.ir");
  for (const std::string& command : {std::string("run"), std::string("inspect")}) {
    CAPTURE(command);
    const RunResult r = p.with(d, command, command == "run" ? kRun : "");
    CHECK(r.code == 1);
    CHECK(r.out.find((p.plan / "graph.ir").string() + ":") != std::string::npos);
    CHECK(r.out.find("nothing may follow `return`") != std::string::npos);
  }
}

TEST_CASE("compile writes a plan only when complete: a failed compile keeps the old plan") {
  TinyPlan p("compile_atomic");
  auto slurp = [](const fs::path& f) {
    std::ifstream in(f, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const std::string plan_json = slurp(p.plan / "plan.json"), graph = slurp(p.plan / "graph.ir");
  // 40 pipeline stages for 2 layers: fails after the graph is built and optimised.
  RunResult r = run_xserv("compile " + p.ck.dir.string() + " -o " + p.plan.string() +
                          " --pp 40 --no-cubins --max-seq 64");
  CHECK(r.code != 0);
  CHECK(slurp(p.plan / "plan.json") == plan_json);
  CHECK(slurp(p.plan / "graph.ir") == graph);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(p.ck.tmp.path))
    left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  CHECK(left == std::vector<std::string>{"model", "tiny.plan"}); // no temporary directory left
  // A successful compile over it replaces it whole.
  REQUIRE(run_xserv("compile " + p.ck.dir.string() + " -o " + p.plan.string() +
                    " --no-cubins --max-seq 64")
              .code == 0);
  CHECK(slurp(p.plan / "plan.json") != plan_json);
  // A directory that is not a plan is never replaced.
  const fs::path other = p.ck.tmp.path / "notes";
  fs::create_directories(other);
  std::ofstream(other / "todo.txt") << "keep me";
  r = run_xserv("compile " + p.ck.dir.string() + " -o " + other.string() + " --no-cubins");
  CHECK(r.code == 2);
  CHECK(r.out.find("holds no plan.json") != std::string::npos);
  CHECK(slurp(other / "todo.txt") == "keep me");
}

TEST_CASE("empty list elements, non-finite numbers and bad ids are usage errors (exit 2)") {
  TinyCheckpoint ck("lists");
  RunResult r = run_xserv("run " + ck.dir.string() + " --prompt-ids 1,,2 --backend cpu");
  CHECK(r.code == 2);
  CHECK(r.out.find("--prompt-ids: empty element in '1,,2'") != std::string::npos);
  r = run_xserv("run " + ck.dir.string() + " --prompt-ids 1,2, --backend cpu");
  CHECK(r.code == 2);
  CHECK(r.out.find("empty element") != std::string::npos);
  r = run_xserv("run " + ck.dir.string() + " --prompt-ids 1,2 --temperature nan --backend cpu");
  CHECK(r.code == 2);
  CHECK(r.out.find("--temperature expects a finite number, got 'nan'") != std::string::npos);
  r = run_xserv("run " + ck.dir.string() + " --prompt-ids 1,2 --top-p inf --backend cpu");
  CHECK(r.code == 2);
  CHECK(r.out.find("--top-p expects a finite number") != std::string::npos);
}

TEST_CASE("flags that shape the chat prompt are usage errors where they would be ignored") {
  TinyCheckpoint ck("chat_flags");
  const std::string run = "run " + ck.dir.string() + " --backend cpu ";
  for (const char* flag :
       {"--reasoning low", "--date 2025-01-01", "--system hi", "--show-reasoning"}) {
    CAPTURE(flag);
    const std::string name = std::string(flag).substr(0, std::string(flag).find(' '));
    RunResult r = run_xserv(run + "--prompt-ids 1,2 " + flag);
    CHECK(r.code == 2);
    CHECK(r.out.find(name + " shapes the chat prompt of --prompt; with --prompt-ids it would be "
                            "ignored") != std::string::npos);
    r = run_xserv(run + "--prompt hi --raw " + flag);
    CHECK(r.code == 2);
    CHECK(r.out.find(name + " shapes the chat prompt of --prompt; with --prompt --raw") !=
          std::string::npos);
  }
  RunResult r = run_xserv(run + "--prompt hi --stop-at-eos");
  CHECK(r.code == 2);
  CHECK(r.out.find("--stop-at-eos goes with --prompt-ids") != std::string::npos);
  // A reasoning effort that does not exist is a usage mistake in every command that takes one.
  r = run_xserv(run + "--prompt hi --reasoning extreme");
  CHECK(r.code == 2);
  CHECK(r.out.find("--reasoning: reasoning effort must be low, medium or high, not 'extreme'") !=
        std::string::npos);
  r = run_xserv("chat " + ck.dir.string() + " --backend cpu --reasoning extreme");
  CHECK(r.code == 2);
  CHECK(r.out.find("--reasoning: reasoning effort must be") != std::string::npos);
  std::ofstream(ck.tmp.path / "problems.jsonl") << "";
  r = run_xserv("eval " + ck.dir.string() + " --backend cpu --task gsm8k --data " +
                (ck.tmp.path / "problems.jsonl").string() + " --reasoning extreme");
  CHECK(r.code == 2);
  CHECK(r.out.find("--reasoning: reasoning effort must be") != std::string::npos);
}

// Apart from the case above: a skip marks the whole ctest entry skipped, failures before it too.
TEST_CASE("tokenize --decode: empty elements and ids outside the vocabulary are usage errors") {
  XSERV_REQUIRE_DATA(data);
  RunResult r;
  const std::string tok = (data / "o200k_base.tiktoken").string();
  r = run_xserv("tokenize " + tok + " --decode abc");
  CHECK(r.code == 2);
  CHECK(r.out.find("--decode: 'abc' is not a token id") != std::string::npos);
  r = run_xserv("tokenize " + tok + " --decode 1,,2");
  CHECK(r.code == 2);
  r = run_xserv("tokenize " + tok + " --decode 999999999999");
  CHECK(r.code == 2);
  CHECK(r.out.find("ids are integers in [0, 201088)") != std::string::npos);
  r = run_xserv("tokenize " + tok + " --decode 13225,2375");
  CHECK(r.code == 0);
  CHECK(r.out == "Hello world\n");
}

TEST_CASE("sizes outside what the compiler accepts are refused at the config, naming the field") {
  xserv::testing::TempDir dir("bad_sizes");
  std::ifstream in(xserv::testing::source_dir() / "examples/tiny/config.json");
  nlohmann::json cfg = nlohmann::json::parse(in);
  cfg["head_dim"] = 1 << 21; // used to abort in GraphEdit (exit 134)
  fs::create_directories(dir.path / "m");
  std::ofstream(dir.path / "m" / "config.json") << cfg.dump();
  RunResult r = run_xserv("compile " + (dir.path / "m").string() + " --emit ir");
  CHECK(r.code == 1);
  CHECK(r.out.find("field 'head_dim' must be in [2, 1024], found 2097152") != std::string::npos);
  r = run_xserv("synth --config " + (dir.path / "m" / "config.json").string() + " -o " +
                (dir.path / "out").string());
  CHECK(r.code == 1);
  CHECK_FALSE(fs::exists(dir.path / "out"));
}

TEST_CASE("plan files: an edited graph, an edited or added kernel file are refused") {
  TinyPlan p("digests");
  // An attention scale changed: graph.ir still parses and verifies, but it is not the compile's.
  {
    std::ifstream in(p.plan / "graph.ir");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    const size_t at = text.find("scale=");
    REQUIRE(at != std::string::npos);
    text.insert(at + 6, "1");
    std::ofstream(p.plan / "graph.ir") << text;
  }
  for (const std::string& command : {std::string("run"), std::string("inspect")}) {
    CAPTURE(command);
    const RunResult r = p.with(p.doc, command, command == "run" ? kRun : "");
    CHECK(r.code == 1);
    CHECK(r.out.find((p.plan / "graph.ir").string() + ": changed since the plan was compiled") !=
          std::string::npos);
  }
  TinyPlan q("digests_kernels");
  const fs::path kernels = q.plan / "kernels";
  std::string a_kernel;
  for (const auto& e : fs::directory_iterator(kernels))
    if (e.path().extension() == ".cu")
      a_kernel = e.path().filename().string();
  REQUIRE(!a_kernel.empty());
  std::ofstream(kernels / a_kernel, std::ios::app) << "// edited\n";
  RunResult r = q.with(q.doc, "run", kRun);
  CHECK(r.code == 1);
  CHECK(r.out.find((kernels / a_kernel).string() + ": changed since the plan was compiled") !=
        std::string::npos);
  TinyPlan k("digests_added");
  const fs::path extra = k.plan / "kernels" / "rms_norm_x.cubin";
  std::ofstream(extra) << "not a cubin";
  r = k.with(k.doc, "run", kRun);
  CHECK(r.code == 1);
  CHECK(r.out.find(extra.string() + ": not part of the plan as compiled") != std::string::npos);
  nlohmann::json d = k.doc;
  d.erase("digests");
  r = k.with(d, "inspect");
  CHECK(r.code == 1);
  CHECK(r.out.find((k.plan / "plan.json").string() + ": field 'digests': missing") !=
        std::string::npos);
}

TEST_CASE("a plan refuses a shard replaced by another of the same size") {
  TinyPlan p("swapped_shard");
  // Same config, another seed: every tensor has the same size, the bytes differ.
  TinyCheckpoint other("swapped_shard_other", "--seed 4");
  REQUIRE(fs::file_size(other.shard()) == fs::file_size(p.ck.shard()));
  fs::copy_file(other.shard(), p.ck.shard(), fs::copy_options::overwrite_existing);
  RunResult r = p.with(p.doc, "run", kRun);
  CHECK(r.code == 1);
  CHECK(r.out.find(p.ck.shard().string() + " holds other bytes than when the plan was compiled") !=
        std::string::npos);
  nlohmann::json d = p.doc;
  d["weights"][0].erase("sample_sha256");
  r = p.with(d, "run", kRun);
  CHECK(r.code == 1);
  CHECK(r.out.find("field 'weights[0].sample_sha256': missing") != std::string::npos);
}
