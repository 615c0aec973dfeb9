// The one reader of a plan directory's plan.json: every field typed and checked, every error
// naming the file and the field.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace xserv::cli {

/// The plan.json version this xserv writes and reads; a plan of another version is refused
/// (recompile it).
inline constexpr int64_t kPlanVersion = 1;

/// The limits `xserv compile` enforces, which a plan must respect to be run.
inline constexpr int64_t kPlanMaxBatch = 4096;
inline constexpr int64_t kPlanMaxSeq = int64_t{1} << 24;
inline constexpr int64_t kPlanMaxStages = 64;

/// One safetensors file of the checkpoint the plan was compiled from.
struct PlanWeightFile {
  std::string file; ///< relative to the checkpoint directory, confined to it
  uint64_t bytes = 0;
  std::string sample_digest; ///< sampled_file_digest() at compile time
};

/// What plan.json holds. Paths are checked: graph and stage files lie inside the plan
/// directory, weight files inside the checkpoint directory (no absolute path, no "..").
struct PlanFile {
  std::filesystem::path dir;  ///< the plan directory
  std::filesystem::path file; ///< dir / "plan.json", as named in messages
  std::filesystem::path model_dir;
  std::string model_digest; ///< of the checkpoint's config.json (config_digest); never empty
  nlohmann::json config;    ///< the config.json document (an object)
  int64_t max_batch = 1, max_seq = 1, pp = 1, prefill_chunk = 0;
  bool last_logits_only = true;
  std::string kv_dtype = "f32"; ///< "f32" or "bf16"
  std::string arch;             ///< "sm_90"; empty when the plan names none
  std::vector<PlanWeightFile> weights;
  std::string graph = "graph.ir";        ///< relative to dir
  std::vector<std::string> stage_graphs; ///< a --pp plan's stage programs, relative to dir
  bool has_codegen = false; ///< "codegen" present: its scalar fields and kernels are checked
  /// SHA-256 (hex) of every file compile wrote beside plan.json, by path relative to dir:
  /// graph.ir, the stage programs, kernels/*.cu, *.cuh, *.cubin.
  std::map<std::string, std::string> digests;
  nlohmann::json doc; ///< the whole document, for display (already checked)

  std::filesystem::path graph_path() const { return dir / graph; }
  /// Names `field` of this plan in a message: "PLAN/plan.json: field 'options.max_seq': WHAT".
  std::string field_error(const std::string& field, const std::string& what) const;
};

/// Reads and checks `dir`/plan.json. Throws xserv::Error "DIR/plan.json: ..." when it cannot
/// be read or is not JSON, and "DIR/plan.json: field 'F': ..." for a missing field, a value of
/// the wrong type, a value out of range (max_batch in [1, 4096], max_seq in [1, 2^24], pp in
/// [1, 64], version == kPlanVersion), an empty model_digest, a path leaving its directory, or
/// pipeline stages that disagree with options.pp, digests that do not cover the graph and stage
/// programs.
PlanFile read_plan_file(const std::filesystem::path& dir);

/// Checks the plan's files against plan.json's digests: each listed file must exist with its
/// SHA-256 (graph.ir may be absent: the CUDA runtime does not read it), and kernels/ may hold no file that is not listed (a cubin there would be loaded).
/// Throws xserv::Error "PLAN/FILE: changed since the plan was compiled ..." otherwise. Reads
/// every byte of the plan's files (a few MB for gpt-oss-20b with cubins).
void verify_plan_files(const PlanFile& plan);

/// SHA-256 of every regular file under `dir` except plan.json, by relative path: what compile
/// records as "digests".
std::map<std::string, std::string> digest_plan_files(const std::filesystem::path& dir);

/// A cheap fingerprint of a large file: SHA-256 over its size, its first 64 KiB (a safetensors
/// header and more) and 64 blocks of 4 KiB spread evenly over the rest: about 320 KiB read
/// per shard. It tells a shard replaced by another of the same size (other weights) from the
/// original; an edit confined to bytes it does not sample goes unnoticed.
std::string sampled_file_digest(const std::filesystem::path& file);

/// True when `rel` is a relative path that stays inside the directory it is joined to: not
/// absolute, not empty, no ".." component.
bool confined_path(const std::string& rel);

} // namespace xserv::cli
