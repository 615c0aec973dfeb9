// Shared machinery for passes: rebuild a graph keeping some nodes and redirecting uses.
#pragma once

#include <vector>

#include "ir/graph.h"

namespace xserv::compiler {

/// Builds the graph that keeps nodes with keep[i] set, in their original order, where every
/// use of value v is first redirected to replace[v] (replace[v] == v when unchanged; the
/// target must be kept and precede its users). Values are renumbered densely.
ir::Graph compact(const ir::Graph& g, const std::vector<bool>& keep,
                  const std::vector<ir::ValueId>& replace);

} // namespace xserv::compiler
