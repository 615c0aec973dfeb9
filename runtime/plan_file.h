// runtime::Plan: everything `xserv compile` records in a plan directory's plan.json and `xserv
// run` needs from it, typed. One writer and one checked reader (runtime/plan_io.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/plan.h"

namespace xserv::runtime {

/// The plan.json version this xserv writes and reads; a plan of another version is refused with
/// "recompile the plan". 2: per-stage launch tables and layouts, options.gemm_precision and
/// options.expert_format, named sends and receives; 3: paged KV caches (options.kv_block, block
/// tables instead of cache rows); 4: launches over a part of the step's rows (PlanLaunch::part:
/// an older xserv would run them over every row).
inline constexpr int64_t kPlanVersion = 4;

/// The limits `xserv compile` enforces, which a plan must respect to be run.
inline constexpr int64_t kPlanMaxBatch = 4096;
inline constexpr int64_t kPlanMaxSeq = int64_t{1} << 24;
inline constexpr int64_t kPlanMaxStages = 64;

/// Element type of the KV caches (compile --kv-dtype).
enum class KvDtype { F32, Bf16 };

/// "f32" / "bf16".
inline const char* kv_dtype_name(KvDtype d) {
  return d == KvDtype::Bf16 ? "bf16" : "f32";
}

/// What the plan was compiled for: the compile flags a run may not exceed or change.
struct PlanOptions {
  int64_t max_batch = 1;        ///< --max-batch: sequences per step (decode graphs), [1, 4096]
  int64_t max_seq = 1;          ///< --max-seq: positions of the longest sequence, [1, 2^24]
  int64_t prefill_chunk = 1;    ///< --prefill-chunk: tokens per prefill sub-step, [1, 2^24]
  int pp = 1;                   ///< --pp: pipeline stages, [1, 64]
  bool last_logits_only = true; ///< not --all-logits
  KvDtype kv_dtype = KvDtype::F32;
  int64_t kv_block = 16;      ///< --kv-block: positions per KV-cache block, a power of two
  bool gemm_split = true;     ///< gemm activations as bf16 hi + lo ("split") or plain "bf16"
  std::string arch = "sm_90"; ///< --arch: the GPU architecture of the cubins, "sm_NN"
  ExpertFormat expert_format = ExpertFormat::Bf16; ///< --expert-format
  /// --dense-gemm cublas: dense projections above 64 tokens call cuBLAS (the launch tables'
  /// library calls); "wg" (false) keeps gemm_wg. Absent in older plans: wg.
  bool dense_cublas = false;
  /// --gemm-order canonical: every step's sums in the gemms' canonical order (docs/DESIGN.md).
  /// Absent in other plans.
  bool gemm_canonical = false;
  /// --gemm-order natural (with gemm_canonical): the dense linears' canonical order is the
  /// natural K order, one chain, which cuBLAS keeps with a pinned algorithm (Blas's fixed
  /// order) for the prompt steps.
  bool gemm_natural = false;
  /// --timeline: a diagnostic plan whose kernels stamp their launches (runtime/timeline.h).
  /// Absent in other plans.
  bool timeline = false;
  /// The largest MXFP4 scale byte of the checkpoint compile read, when at most 128: the MoE
  /// gemms then scale with one multiply (LoweringContext::mxfp4_small_scales) and the upload
  /// refuses a scale byte past it. -1 (absent): no such promise, the kernels take any scale.
  int mxfp4_max_scale = -1;

  bool operator==(const PlanOptions&) const = default;
};

/// One safetensors file of the checkpoint the plan was compiled from.
struct PlanWeightFile {
  std::string file; ///< relative to the checkpoint directory, confined to it
  uint64_t bytes = 0;
  std::string sample_sha256; ///< sampled_file_digest() at compile time (plan_checkpoint.h)
  /// SHA-256 of the whole file at compile time (hex), which --verify-weights checks; empty in a
  /// plan from before compile recorded it (--verify-weights then refuses the plan).
  std::string sha256;

  bool operator==(const PlanWeightFile&) const = default;
};

/// The whole graph's activation memory plan, for display.
struct PlanMemory {
  int64_t arena_bytes = 0, peak_live_bytes = 0, unpacked_bytes = 0, buffers = 0;

  bool operator==(const PlanMemory&) const = default;
};

/// One pass of the compile's pipeline, for display.
struct PlanPass {
  std::string name;
  double ms = 0;
  bool changed = false;

  bool operator==(const PlanPass&) const = default;
};

/// A generated kernel of the plan: PLAN/kernels/NAME.cu and, when compiled, NAME.cubin.
struct PlanKernelFile {
  std::string name; ///< an identifier (letters, digits, _): it names the files
  int block = 0;    ///< threads per block
  int nodes = 0;    ///< graph nodes it serves
  int decode_launches = 0, prefill_launches = 0; ///< per decode / prefill step (display)
  bool cubin = false;                            ///< kernels/NAME.cubin was written (for `arch`)

  std::string source_path() const { return "kernels/" + name + ".cu"; }
  std::string cubin_path() const { return "kernels/" + name + ".cubin"; }
  bool operator==(const PlanKernelFile&) const = default;
};

/// The kernels of the whole graph, which every stage's launch table indexes by name.
struct PlanCodegen {
  std::string arch; ///< the cubins' architecture (options.arch)
  std::vector<PlanKernelFile> kernels;
  int launches_per_decode_step = 0; ///< one sequence, one token
  int prefill_step_tokens = 0;      ///< the prefill step the next count is for
  int launches_per_prefill_step = 0;

  bool operator==(const PlanCodegen&) const = default;
};

/// A value crossing a stage boundary: a send or recv node of the stage's program.
struct PlanTransfer {
  std::string name; ///< the value's name, the same on both sides
  int peer = 0;     ///< the stage it goes to or comes from

  bool operator==(const PlanTransfer&) const = default;
};

/// A pipeline stage (the whole model when pp is 1): its program, what it costs, and what the
/// CUDA runtime runs for it.
struct PlanStage {
  std::string graph = "graph.ir";      ///< its IR program, relative to the plan directory
  int first_layer = 0, last_layer = 0; ///< inclusive range of decoder layers
  bool embedding = true, head = true;  ///< holds the embedding / final norm and lm_head
  std::vector<PlanTransfer> sends, recvs;
  /// The partition's cost model (pp > 1; display).
  /// kv_cache_bytes: of one KV block of positions of the stage's layers (both pools).
  int64_t weight_bytes = 0, kv_cache_bytes = 0, decode_bytes_per_token = 0;
  double prefill_flops_per_token = 0, estimated_decode_ms = 0, estimated_prefill_us_per_token = 0;
  int64_t activation_arena_bytes = 0;
  int launches_per_decode_step = 0;
  StageLayout layout; ///< arena, output, recvs, caches and weights of its launch table
  LaunchTable table;  ///< its launches, over PlanCodegen's kernels

  bool operator==(const PlanStage&) const = default;
};

/// plan.json, typed. Paths are checked on reading: programs inside the plan directory, weight
/// files inside the checkpoint directory (no absolute path, no "..").
struct Plan {
  std::string model_dir;    ///< the checkpoint compiled from (absolute when compile wrote it)
  std::string model_digest; ///< config_digest() of its config.json; never empty
  nlohmann::json config;    ///< the model's config.json (an object), as compiled
  /// The tokenizer file found beside the config (e.g. "tokenizer.json", relative to model_dir);
  /// empty when there was none.
  std::string tokenizer;
  PlanOptions options;
  std::vector<PlanWeightFile> weights; ///< empty when compiled from config.json alone
  PlanMemory memory;
  std::vector<PlanPass> passes;
  std::string graph = "graph.ir"; ///< the whole model's program (the CPU backend runs it)
  PlanCodegen codegen;
  /// options.pp stages in order; with pp 1 the one stage is the whole graph.
  std::vector<PlanStage> stages;
  double imbalance = 0; ///< the partition's slowest stage over the mean, minus 1 (pp > 1)
  /// SHA-256 (hex) of every file compile wrote beside plan.json, by path relative to the plan
  /// directory: graph.ir, the stage programs, kernels/*.cu, *.cuh, *.cubin.
  std::map<std::string, std::string> digests;

  bool pipelined() const { return options.pp > 1; }
  bool operator==(const Plan&) const = default;
};

} // namespace xserv::runtime
