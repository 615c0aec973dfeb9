// A CUDA model of a graph compiled in memory, with no plan directory: the default passes, the
// lowering (codegen::lower_stage) and NVRTC, then a CudaModel over the result. For a checkpoint
// directory run as it is, `xserv trace` (every activation kept) and the GPU tests; a plan's
// stages never come here (the CUDA model runs their program as compiled).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>

#include "codegen/lower_stage.h"
#include "compiler/memory_plan.h"
#include "engine/cuda_model.h"
#include "ir/graph.h"
#include "runtime/plan_stage.h"

namespace xserv::cli {

/// How a graph is compiled in memory (the flags `xserv compile` would take) and how its model
/// runs.
struct GraphModelOptions : engine::CudaModelOptions {
  int prefill_chunk = codegen::kPrefillChunk; ///< tokens per prefill sub-step, [8, 65536]
  bool gemm_split = true; ///< gemm activations as bf16 hi + lo pairs, else plain bf16
  runtime::ExpertFormat expert_format = runtime::ExpertFormat::Bf16;
  /// Every activation its own arena buffer (CompiledGraph::offset_of reads any value back).
  bool keep_activations = false;
};

/// CudaModelOptions as the environment sets them (cli/env.h): the kernel cache and the
/// XSERV_CUDA_GRAPHS, XSERV_PROFILE and XSERV_PDL switches.
engine::CudaModelOptions cuda_model_options();

/// GraphModelOptions as the environment sets them (cli/env.h): the kernel cache, the
/// XSERV_CUDA_GRAPHS / XSERV_PROFILE / XSERV_PDL switches, and for the in-memory compile
/// XSERV_PREFILL_CHUNK and XSERV_GEMM_PRECISION; otherwise the struct's defaults (split gemms,
/// BF16 experts: the GPU tests' fp32-grade reference).
GraphModelOptions graph_model_options();

/// What `xserv run MODEL_DIR` (a checkpoint directory, no plan) compiles with: compile's
/// defaults (plain bf16 gemm activations unless XSERV_GEMM_PRECISION says split, MXFP4
/// experts) and graph_model_options()'s environment.
GraphModelOptions checkpoint_model_options();

/// A graph compiled in memory for GPU 0.
struct CompiledGraph {
  ir::Graph graph;               ///< after the default passes
  compiler::MemoryPlan memory;   ///< its activation arena
  runtime::StageProgram program; ///< layout, launch table and cubins, for an engine::CudaModel
  /// Byte offset in the arena of value `v`'s result `r` (a value the lowering gave a buffer).
  uint64_t offset_of(ir::ValueId v, int r = 0) const;
};

/// Runs the default passes over `g`, lowers it for `max_batch` sequences of up to `max_seq`
/// positions and compiles its kernels for GPU 0 through the kernel cache. Throws xserv::Error
/// "no GPU: ..." without one, for a prefill chunk outside [8, 65536] and for an op the lowering
/// does not know.
CompiledGraph compile_graph(const ir::Graph& g, int64_t max_batch, int64_t max_seq,
                            const GraphModelOptions& opts);

/// An engine::CudaModel of `graph` (default: build_gpt_oss of the checkpoint's config, last-token
/// logits) compiled by compile_graph, over the weights in `model_dir`.
std::unique_ptr<engine::CudaModel>
graph_cuda_model(const std::filesystem::path& model_dir, int64_t max_batch, int64_t max_seq,
                 const ir::Graph* graph = nullptr,
                 const GraphModelOptions& opts = graph_model_options());

} // namespace xserv::cli
