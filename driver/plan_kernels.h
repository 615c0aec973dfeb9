// The kernels of a plan: generated CUDA sources, cubins and the launch table of plan.json.
#pragma once

#include <filesystem>
#include <string>

#include "codegen/lower_stage.h"
#include "ir/graph.h"
#include "runtime/plan_file.h"

namespace xserv::driver {

/// What the plan's kernels are generated for: the stage options (capacities, gemm precision,
/// expert format), the GPU architecture and whether to run NVRTC.
struct PlanKernelOptions : codegen::StageOptions {
  std::string arch = "sm_90";      ///< GPU architecture the cubins are compiled for
  bool cubins = true;              ///< also compile every kernel with NVRTC (no GPU needed)
  std::filesystem::path cache_dir; ///< NVRTC's cubin cache (runtime/kernel_cache.h)
};

/// A graph's code as the plan records it: its launch table and the layout it binds.
struct PlanStageCode {
  runtime::LaunchTable table;
  runtime::StageLayout layout; ///< with the arena the table was lowered for (layout.tokens)
  int launches_per_decode_step = 0;
};

/// What write_plan_kernels makes of the whole graph.
struct PlanKernelsResult {
  runtime::PlanCodegen codegen; ///< the kernel list and launch counts (runtime/plan_file.h)
  PlanStageCode code;
};

/// Lowers the final graph as the CUDA model runs it, writes each kernel's source to
/// PLAN/kernels/NAME.cu (headed by the IR it implements) and, with cubins, its NVRTC output to
/// PLAN/kernels/NAME.cubin (through the kernel cache). Returns the kernel list (name, files,
/// how many graph nodes use it, launches per decode and prefill step), and the launch table
/// with the stage layout it was lowered for. A compile error throws with NVRTC's log and the
/// numbered source, also written to PLAN/kernels/nvrtc.log.
PlanKernelsResult write_plan_kernels(const ir::Graph& g, const std::filesystem::path& plan,
                                     const PlanKernelOptions& opts);

/// Lowers a pipeline stage like write_plan_kernels (send and recv launch nothing) and returns
/// its code; throws xserv::Error naming a kernel the stage needs that `plan_kernels`
/// (write_plan_kernels' list for the whole graph) does not hold.
PlanStageCode stage_launches(const ir::Graph& stage, const runtime::PlanCodegen& plan_kernels,
                             const PlanKernelOptions& opts);

} // namespace xserv::driver
