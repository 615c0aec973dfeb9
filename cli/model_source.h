// Resolving what a command runs: a plan directory (plan.json) or a checkpoint directory.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cli/args.h"
#include "cli/engine.h"
#include "cli/env.h"
#include "ir/graph.h"
#include "models/tokenizer.h"
#include "runtime/plan_file.h"

namespace xserv::engine {
class CudaModel;         // engine/cuda_model.h
struct CudaModelOptions; // engine/cuda_model.h
} // namespace xserv::engine

namespace xserv::cli {

/// Where the weights, graph and limits come from.
struct ModelSource {
  std::filesystem::path model_dir; ///< checkpoint with config.json and safetensors
  std::filesystem::path plan_dir;  ///< empty when given a checkpoint directly
  int64_t max_batch = 1;
  int64_t max_seq = 4096;
  std::string arch; ///< the GPU architecture the plan was compiled for ("sm_90"); empty: any
  std::vector<std::string> stage_graphs; ///< a --pp plan's stage programs, in stage order
  /// The plan as resolve_source read and checked it (null for a checkpoint directory): what
  /// runs it takes this one, plan.json is not read again.
  std::shared_ptr<const runtime::Plan> plan;
};

/// Throws xserv::Error when a plan compiled for `plan_arch` is run on a GPU of `gpu_arch`,
/// saying how to recompile.
void check_plan_arch(const std::string& plan_arch, const std::string& gpu_arch,
                     const std::string& gpu_name);

/// Reads PATH (a plan or a checkpoint); `--weights DIR` overrides the checkpoint, `--max-seq`
/// and `--max-batch` the limits (never above a plan's). A plan is read once, here
/// (runtime::read_plan, then verify_plan_files and check_checkpoint), and shared
/// (cli/loaded_plan.h). Throws UsageError for bad paths, and xserv::Error for a bad plan.json
/// (naming the field), a plan file changed since compile, or a checkpoint that no longer
/// matches the plan (another config, or safetensors files of other sizes or contents).
ModelSource resolve_source(const std::string& path, const ParsedArgs& args);

/// The backend a run takes for `requested`: cpu, cuda (Error "no GPU: ..." without one, and
/// check_plan_arch against the plan) or auto (cuda when a GPU is usable, else cpu). UsageError
/// for anything else.
std::string resolve_backend(const ModelSource& src, const std::string& requested);

/// The IR program in `file` (a plan's graph.ir or stageN.ir), parsed; Error "FILE: WHAT
/// missing" when it cannot be read.
ir::Graph read_graph(const std::filesystem::path& file, std::string_view what);

/// The pipeline token this process was given: --pipeline-token's value, else
/// XSERV_PIPELINE_TOKEN (env()); "" when neither is set. UsageError when the flag is empty.
std::string pipeline_token_given(const ParsedArgs& args);

/// Refuses (UsageError naming the compile flag) a CUDA run of a plan stage of `layout` that the
/// plan was not compiled for: another max batch or max sequence than the layout's, or
/// XSERV_PREFILL_CHUNK / XSERV_GEMM_PRECISION set in `e` to other values than the plan's.
void check_plan_run(const ModelSource& src, const runtime::StageLayout& layout,
                    const Env& e = env());

/// The CUDA model of a pp 1 plan `src` as compiled: check_plan_run, then stage 0's program with
/// its kernels for GPU 0 (runtime::load_stage_program; graph.ir is never read).
std::unique_ptr<engine::CudaModel> plan_cuda_model(const ModelSource& src,
                                                   const engine::CudaModelOptions& opts);

/// Builds the model `--backend` asks for (resolve_backend; auto by default): for CUDA a plan's
/// stage programs as compiled, a checkpoint directory compiled in memory.
std::unique_ptr<Model> make_model(const ModelSource& src, const ParsedArgs& args);

/// The tokenizer: --tokenizer PATH, else the checkpoint's tokenizer.json, else
/// $XSERV_DATA/o200k_base.tiktoken. Throws UsageError saying what was tried.
models::Tokenizer load_tokenizer(const ModelSource& src, const ParsedArgs& args);

} // namespace xserv::cli
