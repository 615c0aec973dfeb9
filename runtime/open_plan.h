// open_plan(): the one door from a plan directory to a run. Every check a plan passes before
// anything is loaded from it lives here: plan.json's fields, the plan's own files against their
// digests, the checkpoint against the fingerprints compile recorded, the GPU architecture, and
// whether a run's sizes and settings are the ones the plan was compiled for.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/plan_file.h"

namespace xserv::runtime {

/// What open_plan() is told besides the directory.
struct OpenPlanOptions {
  /// The checkpoint to run (--weights); empty: the one the plan was compiled from.
  std::filesystem::path weights;
  /// Hash every checkpoint file whole against compile's SHA-256 (--verify-weights).
  bool verify_weights = false;
  /// The checkpoint's config.json in the normalised form compile stored in plan.json (the
  /// models layer's ModelConfig::to_json, which this layer does not know); when set, plan.json's
  /// config block is held to it field by field.
  std::function<nlohmann::json(const std::filesystem::path& config_file)> read_config;
};

/// A plan that passed every check, and the checkpoint it runs on.
struct OpenedPlan {
  std::filesystem::path dir;       ///< the plan directory
  std::filesystem::path model_dir; ///< the checkpoint
  std::shared_ptr<const Plan> plan;
};

/// Reads `dir`/plan.json once (read_plan), checks the plan's files (verify_plan_files), picks the
/// checkpoint (options.weights, else the plan's) and checks it (check_checkpoint, the config
/// block, and with verify_weights every file's SHA-256, logging the time it took). Throws
/// UsageError for a checkpoint directory that does not exist, and xserv::Error naming plan.json
/// and the field or file for everything else.
OpenedPlan open_plan(const std::filesystem::path& dir, const OpenPlanOptions& options = {});

/// Throws xserv::Error when a plan compiled for `plan_arch` ("sm_90"; empty: any) is run on a
/// GPU of `gpu_arch`, saying how to recompile.
void check_plan_arch(const std::string& plan_arch, const std::string& gpu_arch,
                     const std::string& gpu_name);

/// Settings a run may bring from its environment that change what a plan's kernels compute
/// (XSERV_PREFILL_CHUNK, XSERV_GEMM_PRECISION); unset ones are the plan's.
struct RunSettings {
  std::optional<int> prefill_chunk;
  std::optional<bool> gemm_split; ///< true: split
};

/// Refuses (UsageError naming the compile flag) a CUDA run of a stage of `layout` of `plan` that
/// the plan was not compiled for: another max batch or max sequence than the layout's, or run
/// settings other than the plan's.
void check_plan_run(const OpenedPlan& plan, const StageLayout& layout, int64_t max_batch,
                    int64_t max_seq, const RunSettings& settings = {});

} // namespace xserv::runtime
