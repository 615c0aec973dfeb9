// write_plan / plan_to_json: runtime::Plan as plan.json; and the digests of the plan's files.
#include "runtime/plan_io.h"

#include <fstream>
#include <set>
#include <vector>

#include <fmt/format.h>

#include "base/error.h"
#include "runtime/layout_json.h"
#include "runtime/plan_json.h"
#include "runtime/sha256.h"

namespace xserv::runtime {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

json transfers_to_json(const std::vector<PlanTransfer>& ts) {
  json out = json::array();
  for (const PlanTransfer& t : ts)
    out.push_back({{"name", t.name}, {"peer", t.peer}});
  return out;
}

json codegen_to_json(const PlanCodegen& cg) {
  json kernels = json::array();
  for (const PlanKernelFile& k : cg.kernels) {
    json j = {{"name", k.name},
              {"source", k.source_path()},
              {"block", k.block},
              {"nodes", k.nodes},
              {"decode_launches", k.decode_launches},
              {"prefill_launches", k.prefill_launches}};
    if (k.cubin)
      j["cubin"] = k.cubin_path();
    kernels.push_back(std::move(j));
  }
  return {{"arch", cg.arch},
          {"launches_per_decode_step", cg.launches_per_decode_step},
          {"prefill_step_tokens", cg.prefill_step_tokens},
          {"launches_per_prefill_step", cg.launches_per_prefill_step},
          {"kernels", std::move(kernels)}};
}

json stage_to_json(const PlanStage& s, size_t index) {
  return {{"stage", index},
          {"graph", s.graph},
          {"layers", {s.first_layer, s.last_layer}},
          {"embedding", s.embedding},
          {"head", s.head},
          {"sends", transfers_to_json(s.sends)},
          {"recvs", transfers_to_json(s.recvs)},
          {"weight_bytes", s.weight_bytes},
          {"kv_cache_bytes", s.kv_cache_bytes},
          {"decode_bytes_per_token", s.decode_bytes_per_token},
          {"prefill_flops_per_token", s.prefill_flops_per_token},
          {"estimated_decode_ms", s.estimated_decode_ms},
          {"estimated_prefill_us_per_token", s.estimated_prefill_us_per_token},
          {"activation_arena_bytes", s.activation_arena_bytes},
          {"launches_per_decode_step", s.launches_per_decode_step},
          {"layout", stage_layout_to_json(s.layout)},
          {"launch_table", launch_table_to_json(s.table)}};
}

std::string sha256_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw Error(fmt::format("{}: missing (plan.json lists it)", file.string()));
  Sha256 h;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h.update(buf.data(), static_cast<size_t>(in.gcount()));
  }
  return h.hex_digest();
}

} // namespace

json plan_options_to_json(const PlanOptions& o) {
  json j = {{"max_batch", o.max_batch},
            {"max_seq", o.max_seq},
            {"pp", o.pp},
            {"prefill_chunk", o.prefill_chunk},
            {"last_logits_only", o.last_logits_only},
            {"kv_dtype", kv_dtype_name(o.kv_dtype)},
            {"kv_block", o.kv_block},
            {"gemm_precision", o.gemm_split ? "split" : "bf16"},
            {"arch", o.arch},
            {"expert_format", expert_format_name(o.expert_format)}};
  if (o.dense_cublas) // plans with gemm_wg's dense gemms read as before
    j["dense_gemm"] = "cublas";
  if (o.gemm_canonical) // plans in the fast order read as before
    j["gemm_order"] = o.gemm_natural ? "natural" : "canonical";
  if (o.timeline) // a diagnostic plan; others read as before
    j["timeline"] = true;
  if (o.mxfp4_max_scale >= 0) // plans whose kernels take any scale read as before
    j["mxfp4_max_scale"] = o.mxfp4_max_scale;
  return j;
}

json plan_to_json(const Plan& p) {
  json weights = json::array();
  for (const PlanWeightFile& w : p.weights) {
    json f = {{"file", w.file}, {"bytes", w.bytes}, {"sample_sha256", w.sample_sha256}};
    if (!w.sha256.empty())
      f["sha256"] = w.sha256;
    weights.push_back(std::move(f));
  }
  json passes = json::array();
  for (const PlanPass& pass : p.passes)
    passes.push_back({{"name", pass.name}, {"ms", pass.ms}, {"changed", pass.changed}});
  json doc = {
      {"format", "xserv-plan"},
      {"version", kPlanVersion},
      {"model_dir", p.model_dir},
      {"model_digest", p.model_digest},
      {"config", p.config},
      {"options", plan_options_to_json(p.options)},
      {"weights", std::move(weights)},
      {"memory",
       {{"arena_bytes", p.memory.arena_bytes},
        {"peak_live_bytes", p.memory.peak_live_bytes},
        {"unpacked_bytes", p.memory.unpacked_bytes},
        {"buffers", p.memory.buffers}}},
      {"graph", p.graph},
      {"passes", std::move(passes)},
      {"codegen", codegen_to_json(p.codegen)},
      {"digests", p.digests},
  };
  if (!p.tokenizer.empty())
    doc["tokenizer"] = p.tokenizer;
  if (p.options.pp == 1 && p.stages.size() == 1) {
    // The whole graph's stage: its layout and table beside the kernels, as version 1 had them.
    const PlanStage& s = p.stages[0];
    json& cg = doc["codegen"];
    cg["arena_tokens"] = s.layout.tokens;
    cg["gemm_precision"] = s.layout.gemm_split ? "split" : "bf16";
    cg["arena_bytes"] = s.layout.arena_bytes;
    cg["layout"] = stage_layout_to_json(s.layout);
    cg["launch_table"] = launch_table_to_json(s.table);
  } else {
    json stages = json::array();
    for (size_t i = 0; i < p.stages.size(); ++i)
      stages.push_back(stage_to_json(p.stages[i], i));
    doc["pipeline"] = {{"stages", std::move(stages)}, {"imbalance", p.imbalance}};
  }
  return doc;
}

void write_plan(const fs::path& dir, const Plan& plan) {
  const fs::path file = dir / "plan.json";
  if (plan.stages.size() != static_cast<size_t>(plan.options.pp) || plan.stages.empty())
    throw Error(fmt::format("{}: the plan has {} stages, but options.pp is {}", file.string(),
                            plan.stages.size(), plan.options.pp));
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out << plan_to_json(plan).dump(2) << "\n";
  if (!out.flush())
    throw Error(fmt::format("{}: cannot write", file.string()));
}

void verify_plan_files(const fs::path& dir, const Plan& plan) {
  const fs::path plan_file = dir / "plan.json";
  std::set<std::string> programs = {plan.graph};
  for (const PlanStage& s : plan.stages)
    programs.insert(s.graph);
  for (const auto& [file, want] : plan.digests) {
    // The IR programs (graph.ir, stageN.ir) may be deleted: the CUDA runtime replays the launch
    // tables without them, and what reads them (the CPU backend, xserv trace) fails naming the
    // file. Changed, never.
    if (programs.count(file) && !fs::exists(dir / file))
      continue;
    const std::string have = sha256_file(dir / file);
    if (have != want)
      throw Error(fmt::format("{}: changed since the plan was compiled (sha256 {}, {} says {}): "
                              "recompile the plan",
                              (dir / file).string(), have.substr(0, 16), plan_file.string(),
                              want.substr(0, 16)));
  }
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir / "kernels", ec), end; !ec && it != end;
       it.increment(ec))
    if (!it->is_directory() && !plan.digests.count(fs::relative(it->path(), dir).generic_string()))
      throw Error(fmt::format("{}: not part of the plan as compiled ({} lists no such file): "
                              "remove it or recompile the plan",
                              it->path().string(), plan_file.string()));
}

std::map<std::string, std::string> digest_plan_files(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename() != "plan.json")
      out[fs::relative(e.path(), dir).generic_string()] = sha256_file(e.path());
  return out;
}

bool confined_path(const std::string& rel) {
  if (rel.empty())
    return false;
  const fs::path p(rel);
  if (p.is_absolute() || p.has_root_name() || p.has_root_directory())
    return false;
  for (const fs::path& part : p)
    if (part == "..")
      return false;
  return true;
}

std::string plan_field_error(const fs::path& dir, const std::string& field,
                             const std::string& what) {
  return fmt::format("{}: field '{}': {}", (dir / "plan.json").string(), field, what);
}

} // namespace xserv::runtime
