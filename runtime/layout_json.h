// StageLayout (runtime/plan.h) to and from the JSON of plan.json's "codegen"."layout".
#pragma once

#include <nlohmann/json.hpp>

#include "runtime/plan.h"

namespace xserv::runtime {

nlohmann::json stage_layout_to_json(const StageLayout& layout);

/// Reads what stage_layout_to_json wrote; throws xserv::Error naming the field that is missing,
/// of the wrong type or out of range (sizes must be positive and offsets inside the arena).
StageLayout stage_layout_from_json(const nlohmann::json& j);

} // namespace xserv::runtime
