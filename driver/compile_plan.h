// compile_plan(): the one straight-line function from a checkpoint directory to a plan directory
// (Halide's lower()): read the config, check the weights' headers, build the graph, run the
// passes, plan memory, partition into pipeline stages, generate and compile the kernels, write
// and seal the plan, each a logged, timed step.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "codegen/lower_stage.h"
#include "ir/dtype.h"
#include "ir/graph.h"
#include "runtime/plan.h"
#include "runtime/plan_file.h"

namespace xserv::driver {

/// What `xserv compile` asks for; every field is a flag of that command, already parsed.
struct CompileOptions {
  std::filesystem::path model;  ///< a checkpoint directory, or a config.json (IR only)
  std::filesystem::path output; ///< the plan directory; empty: build and return the IR only
  int64_t max_batch = 256;      ///< --max-batch: sequences a step holds (decode graph buckets)
  int64_t max_seq = 8192;       ///< --max-seq
  int64_t prefill_chunk = 0;    ///< --prefill-chunk; 0: min(2048, max_seq)
  std::string arch = "sm_90";   ///< --arch (checked by the caller's parser)
  /// --expert-format: mxfp4 keeps the experts as stored; both adds a BF16 copy for prompt
  /// gemms; bf16 dequantises them.
  runtime::ExpertFormat expert_format = runtime::ExpertFormat::Mxfp4;
  bool gemm_split = false; ///< --gemm-precision split (else plain bf16)
  /// --dense-gemm cublas; nullopt: cuBLAS wherever it can serve (bf16 gemms on sm_90).
  std::optional<bool> dense_cublas;
  /// --gemm-order canonical (PlanOptions::gemm_canonical); its projections default to gemm_wg.
  bool gemm_canonical = false;
  /// --gemm-order natural (PlanOptions::gemm_natural, with gemm_canonical): its projections
  /// default to cuBLAS.
  bool gemm_natural = false;
  ir::DType kv_dtype = ir::DType::F32; ///< --kv-dtype
  int64_t kv_block = 16;               ///< --kv-block: positions per KV-cache block
  bool all_logits = false;             ///< --all-logits: logits for every token
  int pp = 1;                          ///< --pp: pipeline stages
  std::string passes;                  ///< --passes; empty: compiler::kDefaultPasses
  // Debugging (docs/DESIGN.md, "Debugging"): dumps, verification, bisection.
  std::vector<std::string> dump_after;
  bool verify_after_all = false;
  int stop_after = -1;
  std::filesystem::path dump_dir;
  int debug = 0;         ///< XSERV_DEBUG
  bool cubins = true;    ///< compile every kernel with NVRTC (--no-cubins: sources only)
  bool timeline = false; ///< --timeline: kernels stamp the GPU clock
  std::filesystem::path kernel_cache; ///< where NVRTC's cubins are cached
};

/// What compile_plan() made.
struct CompileResult {
  ir::Graph graph;     ///< after the passes (what --emit ir prints)
  runtime::Plan plan;  ///< as written (empty when no output was asked for)
  double total_ms = 0; ///< wall time of the whole compile
};

/// Compiles `o.model` as `o` says, logging each step on stderr with its time. With an output
/// directory the plan is written into a temporary sibling and renamed into place at the end, so
/// a failed compile leaves the previous plan (or nothing) behind. Throws UsageError for a flag
/// the model cannot take (--max-seq beyond its positions, -o naming something that is not a
/// plan directory) and xserv::Error naming the file or field for a bad config or checkpoint.
CompileResult compile_plan(const CompileOptions& o);

} // namespace xserv::driver
