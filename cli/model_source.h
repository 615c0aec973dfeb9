// What a command runs: a plan directory (opened by runtime::open_plan) or a checkpoint directory,
// the model made of it, and the tokenizer; with the engine's settings taken from the flags and
// the environment (cli/env.h) here, so that nothing below reads either.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "cli/args.h"
#include "engine/cuda_options.h"
#include "engine/engine.h"
#include "engine/pipeline/options.h"
#include "models/tokenizer.h"
#include "runtime/open_plan.h"

namespace xserv::cli {

/// Where the weights, programs and limits come from.
struct ModelSource {
  std::filesystem::path model_dir;         ///< checkpoint with config.json and safetensors
  std::optional<runtime::OpenedPlan> plan; ///< unset for a checkpoint directory
  int64_t max_batch = 1;
  int64_t max_seq = 4096;
};

/// Reads PATH (a plan or a checkpoint); `--weights DIR` overrides the checkpoint,
/// `--verify-weights` hashes it whole, `--max-seq` and `--max-batch` lower the limits (never
/// above a plan's). A plan is opened once, here (runtime::open_plan: every check). Throws
/// UsageError for bad paths, and xserv::Error for a bad plan or a checkpoint that no longer
/// matches it.
ModelSource resolve_source(const std::string& path, const ParsedArgs& args);

/// The CUDA model's switches as the environment sets them: the kernel cache and XSERV_CUDA_GRAPHS,
/// XSERV_PROFILE, XSERV_PDL, XSERV_PROFILE_REPEAT.
engine::CudaModelOptions cuda_model_options();

/// The KV pools' size from --kv-memory GIB, else --gpu-memory-utilization F (default 0.9: the
/// share of the GPU's memory the process may hold in all). UsageError for values out of range.
void kv_memory_options(const ParsedArgs& args, engine::CudaModelOptions& o);

/// The engine's --no-prefix-cache, --prefill-budget N and --backlog-steps N.
void engine_kv_options(const ParsedArgs& args, engine::EngineOptions& o);

/// XSERV_PREFILL_CHUNK and XSERV_GEMM_PRECISION, which a plan must have been compiled with.
runtime::RunSettings run_settings();

/// The pipeline token this process was given: --pipeline-token's value, else
/// XSERV_PIPELINE_TOKEN; "" when neither is set. UsageError when the flag is empty.
std::string pipeline_token_given(const ParsedArgs& args);

/// A pipeline's settings from --coordinator, --pipeline-token, --weights and the
/// XSERV_PIPELINE_* variables.
engine::pipeline::PipelineOptions pipeline_options(const ParsedArgs& args);

/// Builds the model `--backend` asks for (auto by default): for a plan engine::load_model, for
/// a checkpoint directory the CPU interpreter or a CUDA model compiled in memory.
std::unique_ptr<engine::Model> make_model(const ModelSource& src, const ParsedArgs& args);

/// The tokenizer: --tokenizer PATH, else the checkpoint's tokenizer.json, else
/// $XSERV_DATA/o200k_base.tiktoken. Throws UsageError saying what was tried.
models::Tokenizer load_tokenizer(const ModelSource& src, const ParsedArgs& args);

} // namespace xserv::cli
