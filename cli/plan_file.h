// The plan this process runs, read once: resolve_source reads and checks a plan directory
// (runtime::read_plan) and shares it here, so that what loads the model later (the CUDA
// model's plan mode, the launch-table replay) takes the same Plan instead of reading plan.json
// again.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/plan_file.h"

namespace xserv::cli {

/// Makes `plan` the one later loaded_plan(dir) calls return (replacing any earlier one).
void share_plan(const std::filesystem::path& dir, std::shared_ptr<const runtime::Plan> plan);

/// The plan of `dir`: the one share_plan() gave for the same directory, else read and checked
/// now (runtime::read_plan: throws xserv::Error naming plan.json and the field).
std::shared_ptr<const runtime::Plan> loaded_plan(const std::filesystem::path& dir);

/// Transitional: the view of a plan that cli/cuda_model_setup.cpp (CudaModel::Impl::plan_stage)
/// and tests/cli/pipeline_test.cpp still take. `doc` holds only "codegen"."layout" and
/// "codegen"."launch_table" of a pp 1 plan, written from the typed plan (loaded_plan), not read
/// from the file again. To go when CudaModel takes the runtime::Plan itself.
struct PlanFile {
  std::filesystem::path dir;  ///< the plan directory
  std::filesystem::path file; ///< dir / "plan.json", as named in messages
  bool has_codegen = false;   ///< a pp 1 plan: doc holds its stage's layout and launch table
  nlohmann::json doc;
  std::vector<std::string> stage_graphs; ///< a pipelined plan's stage programs, in order
  /// "PLAN/plan.json: field 'F': WHAT".
  std::string field_error(const std::string& field, const std::string& what) const;
};

/// PlanFile of loaded_plan(dir).
PlanFile read_plan_file(const std::filesystem::path& dir);

} // namespace xserv::cli
