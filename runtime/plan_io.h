// The one writer and the one reader of plan.json (runtime::Plan, runtime/plan_file.h), and the
// integrity check of the files beside it.
#pragma once

#include <filesystem>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/plan_file.h"

namespace xserv::runtime {

/// `plan` as plan.json's document (format "xserv-plan", version kPlanVersion). With pp 1 the
/// stage's layout and launch table go in "codegen"; with pp > 1 each stage's in
/// "pipeline"."stages"[i]. Lossless: plan_from_json(plan_to_json(p), f) == p for every plan
/// the reader accepts.
nlohmann::json plan_to_json(const Plan& plan);

/// plan.json's "options" object: max_batch, max_seq, pp, prefill_chunk, last_logits_only,
/// kv_dtype, gemm_precision ("split" or "bf16"), arch, expert_format.
nlohmann::json plan_options_to_json(const PlanOptions& options);

/// Writes `plan` as `dir`/plan.json (indented). Throws xserv::Error naming the file when it
/// cannot, or when the plan contradicts itself (stage count other than options.pp).
void write_plan(const std::filesystem::path& dir, const Plan& plan);

/// Checks and converts a plan.json document; `file` names it in messages. Throws xserv::Error
/// "FILE: field 'F': WHAT" for a missing field, a value of the wrong type or out of range
/// (max_batch in [1, 4096], max_seq in [1, 2^24], pp in [1, 64] and equal to the stage count,
/// version == kPlanVersion: another one says "recompile the plan"), an empty model_digest, a
/// path leaving its directory, kernel names that are no identifiers, a stage layout that
/// disagrees with the options, a launch table naming a kernel the plan does not hold, and
/// digests that do not cover the programs.
Plan plan_from_json(const nlohmann::json& doc, const std::filesystem::path& file);

/// Reads and checks `dir`/plan.json (plan_from_json); "DIR/plan.json: cannot read" or "...: not
/// valid JSON" when it is neither.
Plan read_plan(const std::filesystem::path& dir);

/// "DIR/plan.json: field 'FIELD': WHAT", the reader's form for errors found after reading.
std::string plan_field_error(const std::filesystem::path& dir, const std::string& field,
                             const std::string& what);

/// Checks the plan's files against its digests: each listed file must exist with its SHA-256
/// (the IR programs, graph.ir and stageN.ir, may be absent: the CUDA runtime does not read
/// them), and kernels/
/// may hold no file that is not listed (a cubin there would be loaded). Throws xserv::Error
/// "DIR/FILE: changed since the plan was compiled ... recompile the plan" otherwise. Reads
/// every byte of the plan's files (a few MB for gpt-oss-20b with cubins).
void verify_plan_files(const std::filesystem::path& dir, const Plan& plan);

/// SHA-256 of every regular file under `dir` except plan.json, by relative path: what compile
/// records as Plan::digests.
std::map<std::string, std::string> digest_plan_files(const std::filesystem::path& dir);

/// True when `rel` is a relative path that stays inside the directory it is joined to: not
/// absolute, not empty, no ".." component.
bool confined_path(const std::string& rel);

} // namespace xserv::runtime
