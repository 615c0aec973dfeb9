// The launch table (runtime/plan.h) as compact JSON, for plan.json's "codegen" section.
#pragma once

#include <nlohmann/json.hpp>

#include "runtime/plan.h"

namespace xserv::runtime {

/// `t` as compact JSON: kernels as objects, launches as objects without default fields, each
/// argument as one short string ("a@4096", "w:NAME", "p:positions", "rows", ...). Lossless:
/// launch_table_from_json(launch_table_to_json(t)) == t.
nlohmann::json launch_table_to_json(const LaunchTable& t);

/// Reads launch_table_to_json's output; throws xserv::Error naming the field that is missing
/// or malformed.
LaunchTable launch_table_from_json(const nlohmann::json& j);

} // namespace xserv::runtime
