// compile_graph(): what compile_plan() does for one stage, kept in memory and compiled for the
// GPU at hand: the default passes, the lowering (codegen::lower_stage) and NVRTC through the
// kernel cache, returning the stage program a runtime CUDA model runs. For a checkpoint
// directory run without a plan, `xserv trace` (every activation kept) and the GPU tests; a
// plan's stages never come here (they run their program as compiled).
#pragma once

#include <cstdint>
#include <filesystem>

#include "codegen/lower_stage.h"
#include "compiler/memory_plan.h"
#include "ir/graph.h"
#include "runtime/plan_stage.h"

namespace xserv::driver {

/// How a graph is compiled in memory: the flags `xserv compile` would take.
struct GraphCompileOptions {
  int prefill_chunk = codegen::kPrefillChunk; ///< tokens per prefill sub-step, [8, 65536]
  bool gemm_split = true; ///< gemm activations as bf16 hi + lo pairs, else plain bf16
  runtime::ExpertFormat expert_format = runtime::ExpertFormat::Bf16;
  bool gemm_canonical = false; ///< --gemm-order canonical (StageOptions::canonical)
  bool gemm_natural = false;   ///< --gemm-order natural (StageOptions::natural)
  bool dense_cublas = false;   ///< --dense-gemm cublas (StageOptions::dense_cublas; sm_90)
  /// Every activation its own arena buffer (CompiledGraph::offset_of reads any value back).
  bool keep_activations = false;
  std::filesystem::path kernel_cache; ///< NVRTC's cubin cache; empty: no cache
};

/// A graph compiled in memory for GPU 0.
struct CompiledGraph {
  ir::Graph graph;               ///< after the default passes
  compiler::MemoryPlan memory;   ///< its activation arena
  runtime::StageProgram program; ///< layout, launch table and cubins, for a CUDA model
  /// Byte offset in the arena of value `v`'s result `r` (a value the lowering gave a buffer).
  uint64_t offset_of(ir::ValueId v, int r = 0) const;
};

/// Runs the default passes over `g`, lowers it for `max_batch` sequences of up to `max_seq`
/// positions and compiles its kernels for GPU 0 through the kernel cache. Throws xserv::Error
/// "no GPU: ..." without one, for a prefill chunk outside [8, 65536] and for an op the lowering
/// does not know.
CompiledGraph compile_graph(const ir::Graph& g, int64_t max_batch, int64_t max_seq,
                            const GraphCompileOptions& opts);

} // namespace xserv::driver
