// One stage of a plan as the CUDA runtime runs it: its layout, its launch table and that table's
// kernels as cubins for this GPU (the plan's own, or its sources compiled through the kernel
// cache), and whether a run fits it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "runtime/plan.h"
#include "runtime/plan_file.h"

namespace xserv::runtime {

/// What the CUDA model runs for one stage: a plan's (load_stage_program) or a graph's compiled
/// in memory. cubins[i] holds table.kernels[i], for the GPU the model runs on.
struct StageProgram {
  StageLayout layout;
  LaunchTable table;
  std::vector<std::vector<char>> cubins;
  /// The values it sends on and receives, by name (a pipeline stage's; empty for pp 1).
  std::vector<PlanTransfer> sends, recvs;
  std::string source; ///< where it came from, for the model's log ("PLAN/plan.json stage 0")
  int compiled = 0;   ///< kernels NVRTC compiled for it (the rest were cubins already)
  double load_ms = 0; ///< time spent reading and compiling the kernels
};

/// Why a run of `max_batch` sequences of up to `max_seq` positions cannot use a stage of layout
/// `l` (a plan runs at the sizes it was compiled for); empty when it can.
std::string run_mismatch(const StageLayout& l, int64_t max_batch, int64_t max_seq);

/// The kernel headers a plan's sources include, as the plan directory holds them
/// (kernels/**/*.cuh, keyed by their path under kernels/): the templates the plan was compiled
/// with, which may differ from this build's. Throws xserv::Error when the plan has none.
std::map<std::string, std::string> plan_kernel_headers(const std::filesystem::path& plan_dir);

/// Stage `stage` of `plan` (read from `plan_dir`) with its kernels for `arch`: the plan's cubins
/// when it was compiled for `arch`, else its kernel sources compiled with the plan's own headers
/// (plan_kernel_headers: the launch table's shared-memory sizes belong to them) through the
/// kernel cache in `cache_dir`. Throws xserv::Error naming a missing or unreadable file.
StageProgram load_stage_program(const std::filesystem::path& plan_dir, const Plan& plan,
                                size_t stage, const std::string& arch,
                                const std::filesystem::path& cache_dir);

} // namespace xserv::runtime
