// The kernels of a plan: generated CUDA sources, cubins and the launch table of plan.json.
#pragma once

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "ir/graph.h"

namespace xserv::cli {

struct PlanKernelOptions {
  std::string arch = "sm_90"; ///< GPU architecture the cubins are compiled for
  int64_t max_batch = 1, max_seq = 1;
  int prefill_chunk = 2048; ///< tokens per prefill sub-step (`xserv compile --prefill-chunk`)
  bool cubins = true; ///< also compile every kernel with NVRTC (no GPU needed)
};

/// Lowers the final graph as the CUDA engine does, writes each kernel's source to
/// PLAN/kernels/NAME.cu (headed by the IR it implements) and, with cubins, its NVRTC output to
/// PLAN/kernels/NAME.cubin (through the kernel cache). Returns plan.json's "codegen" section:
/// the kernel list (name, files, how many graph nodes use it, launches per decode and prefill
/// step), and the launch table (runtime/plan_json.h) with the activation arena it was lowered
/// for (arena_tokens, arena_bytes). A compile error throws with NVRTC's log and the numbered
/// source, also written to PLAN/kernels/nvrtc.log.
nlohmann::json write_plan_kernels(const ir::Graph& g, const std::filesystem::path& plan,
                                  const PlanKernelOptions& opts);

/// Lowers a pipeline stage like write_plan_kernels (send and recv launch nothing) and returns
/// {launches_per_decode_step, kernels}; throws xserv::Error naming a kernel the stage needs that
/// `plan_kernels` (write_plan_kernels' result for the whole graph) does not hold.
nlohmann::json stage_launches(const ir::Graph& stage, const nlohmann::json& plan_kernels,
                              const PlanKernelOptions& opts);

} // namespace xserv::cli
