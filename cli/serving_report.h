// The report of `xserv bench --requests` (engine/serving_load.h, server/http_load.h) as a
// Markdown table, JSON or CSV.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "engine/serving_load.h"

namespace xserv::cli {

/// Renders the report as "md", "json" or "csv", headed by the workload and where it ran;
/// `extra` rows (name, value) follow the figures (engine counters).
std::string render_serving(const engine::ServingReport& r, const engine::ServingOptions& o,
                           const std::string& target,
                           const std::vector<std::pair<std::string, std::string>>& extra,
                           const std::string& format);

} // namespace xserv::cli
