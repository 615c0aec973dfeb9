// load_model(): a plan opened by runtime::open_plan() as the Model the engine runs, on the
// backend asked for: the CPU interpreter over the plan's programs, the CUDA model over its launch
// table and cubins, every pipeline stage on this GPU, or a multi-process pipeline whose rank 0
// this process becomes. The caller brings every setting (flags and environment alike).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/cuda_options.h"
#include "engine/model.h"
#include "engine/pipeline/options.h"
#include "runtime/open_plan.h"

namespace xserv::engine {

/// How a plan is loaded.
struct LoadOptions {
  std::string backend = "auto"; ///< auto (cuda when a GPU is usable), cpu or cuda
  /// This run's sizes, at most the plan's; 0: the plan's. The CUDA backend runs a plan at the
  /// sizes it was compiled for (runtime::check_plan_run refuses others, naming the flag).
  int64_t max_batch = 0, max_seq = 0;
  /// A pipelined plan: every stage in this process on one GPU (the same-device transport), or
  /// with the CPU backend one after another, instead of one process per stage.
  bool pp_local = false;
  int world = 0; ///< the ranks the caller expects (--world); 0: the plan's stages
  CudaModelOptions cuda;
  runtime::RunSettings settings;
  pipeline::PipelineOptions pipeline; ///< backend is filled in by load_model
};

/// The backend a run of a plan compiled for `plan_arch` takes for `requested`: cpu, cuda
/// (xserv::Error "no GPU: ..." without one, and runtime::check_plan_arch) or auto (cuda when a
/// GPU is usable, else cpu). UsageError for anything else.
std::string resolve_backend(const std::string& plan_arch, const std::string& requested);

/// The Model of `plan` as `options` say. Throws UsageError for sizes or settings the plan was not
/// compiled for and a --world other than its stages, and xserv::Error for anything the load
/// finds wrong (no GPU, a weight that does not fit, a rank that does not join).
std::unique_ptr<Model> load_model(const runtime::OpenedPlan& plan, const LoadOptions& options);

} // namespace xserv::engine
