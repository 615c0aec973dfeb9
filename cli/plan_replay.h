// Running a plan as compiled: its launch table (plan.json) and its kernels (kernels/*.cubin, or
// kernels/*.cu through the kernel cache), for the CUDA engine to replay instead of lowering.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/executor.h"
#include "runtime/module.h"
#include "runtime/plan.h"

namespace xserv::cli {

/// The plan's launch table (of loaded_plan(plan_dir): the plan resolve_source read, not
/// plan.json again) when a run is what the plan was compiled for (same max batch and
/// sequence, step capacity `tcap`, gemm precision and activation arena size, pp 1); else
/// nullopt, with the reason in `why`.
std::optional<runtime::LaunchTable> plan_launch_table(const std::filesystem::path& plan_dir,
                                                      int64_t max_batch, int64_t max_seq, int tcap,
                                                      bool gemm_split, int64_t arena_bytes,
                                                      std::string& why);

/// Why a run of max batch `max_batch`, max sequence `max_seq`, step capacity `tcap` and gemm
/// precision `gemm_split` cannot replay a plan stage of layout `l` (sizes first: the one a
/// plan-only run refuses naming the compile flags); empty when it can.
std::string layout_mismatch(const runtime::StageLayout& l, int64_t max_batch, int64_t max_seq,
                            int tcap, bool gemm_split);

/// A launch table's kernels, loaded.
struct PlanKernels {
  std::vector<runtime::Module> modules;
  std::vector<runtime::Kernel> kernels;
  int compiled = 0; ///< how many had to be compiled (no cubin for this arch in the plan)
  /// For runtime::Executor (valid while this lives and is not modified).
  std::vector<runtime::LoadedKernel> loaded() const;
};

/// The kernel headers a plan's sources include, as the plan directory holds them
/// (kernels/**/*.cuh, keyed by their path under kernels/): the templates the plan was compiled
/// with, which may differ from this build's (codegen::kernel_headers()). Throws xserv::Error
/// when the plan has none.
std::map<std::string, std::string> plan_kernel_headers(const std::filesystem::path& plan_dir);

/// Loads `table`'s kernels from the plan directory: the plan's cubins when it was compiled for
/// `arch`, else its kernel sources compiled, with the plan's own headers (plan_kernel_headers:
/// the launch table's shared-memory sizes belong to them), through the kernel cache in
/// `cache_dir`. Throws xserv::Error naming a missing or unreadable file.
PlanKernels load_plan_kernels(const std::filesystem::path& plan_dir,
                              const runtime::LaunchTable& table, const std::string& arch,
                              const std::filesystem::path& cache_dir);

} // namespace xserv::cli
