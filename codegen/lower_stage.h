// One stage's graph lowered for the GPU: its activation memory plan, kernels, launch table and
// stage layout, what `xserv compile` records per stage and what an in-memory compile runs.
#pragma once

#include <cstdint>

#include "codegen/cuda_lower.h"
#include "compiler/memory_plan.h"
#include "ir/graph.h"
#include "runtime/plan.h"

namespace xserv::codegen {

/// Default tokens per prefill sub-step (`xserv compile --prefill-chunk` takes min(this,
/// max-seq)): a serving step that mixes 64 decode tokens with four 512-token prompts runs as one
/// sub-step (1024 split it in two).
inline constexpr int kPrefillChunk = 2048;

/// What a stage is lowered for: the run's capacities and the compile flags that change launches.
struct StageOptions {
  int64_t max_batch = 1, max_seq = 1; ///< --max-batch, --max-seq
  int prefill_chunk = kPrefillChunk;  ///< --prefill-chunk: tokens per prefill sub-step
  bool gemm_split = true;             ///< --gemm-precision split (true) or bf16
  /// The experts' device format the MoE kernels read (--expert-format).
  runtime::ExpertFormat expert_format = runtime::ExpertFormat::Bf16;
  /// The gemms on sm_90's warpgroup MMA (LoweringContext::wgmma): a plan or device of compute
  /// capability 9.0; false lowers them to mma.sync, which other architectures run.
  bool wgmma = true;
  /// Dense projections above 64 tokens through cuBLAS (LoweringContext::dense_cublas;
  /// --dense-gemm cublas).
  bool dense_cublas = false;
  /// The decode kernels in the gemms' canonical order (LoweringContext::canonical;
  /// --gemm-order canonical).
  bool canonical = false;
  /// ... with the dense linears in the natural K order (LoweringContext::natural; --gemm-order
  /// natural).
  bool natural = false;
  /// Every MXFP4 scale byte of the checkpoint is at most 128 (compile read them; the upload
  /// checks): the MoE gemms scale a pair with one multiply (LoweringContext::mxfp4_small_scales).
  bool mxfp4_small_scales = false;
  /// Debugging (xserv trace): every activation gets its own arena buffer, no reuse, so any
  /// value of a sub-step can be read back after it ran.
  bool keep_activations = false;
  /// A diagnostic plan (compile --timeline): every kernel's source starts with
  /// `#define XSERV_TIMELINE 1`, so its launches stamp the GPU clock (runtime/timeline.h).
  bool timeline = false;
};

/// The lowering of one stage's final graph.
struct LoweredStage {
  compiler::MemoryPlan memory; ///< the activation arena (for T = layout.tokens, B = max_batch)
  KernelSet kernels;           ///< the table's kernels, in its order
  runtime::LaunchTable table;
  runtime::StageLayout layout; ///< what the CUDA model binds and allocates for the table
};

/// Plans `g`'s activation memory for a step of step_token_capacity(max_batch, prefill_chunk)
/// tokens and max_batch sequences, then lowers it (lower_graph) and records its stage layout
/// (stage_layout). Deterministic: the same graph and options give the same table and sources.
LoweredStage lower_stage(const ir::Graph& g, const StageOptions& opts);

} // namespace xserv::codegen
