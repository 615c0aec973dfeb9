// The plan this process runs, read once: resolve_source reads and checks a plan directory
// (runtime::read_plan) and shares it here, so that what loads the model later (the CUDA
// model's stage programs, the pipeline's digest) takes the same Plan instead of reading
// plan.json again.
#pragma once

#include <filesystem>
#include <memory>

#include "runtime/plan_file.h"

namespace xserv::cli {

/// Makes `plan` the one later loaded_plan(dir) calls return (replacing any earlier one).
void share_plan(const std::filesystem::path& dir, std::shared_ptr<const runtime::Plan> plan);

/// The plan of `dir`: the one share_plan() gave for the same directory, else read and checked
/// now (runtime::read_plan: throws xserv::Error naming plan.json and the field).
std::shared_ptr<const runtime::Plan> loaded_plan(const std::filesystem::path& dir);

} // namespace xserv::cli
