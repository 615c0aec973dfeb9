// Common-subexpression elimination.
#pragma once

#include "compiler/pass.h"

namespace xserv::compiler {

/// Merges pure nodes that compute the same thing (same op, operands, attributes and types):
/// later duplicates are redirected to the first. Nodes that touch KV-cache state are never
/// merged, since their value depends on where they sit in the order.
PassResult cse(const ir::Graph& g, const PassOptions& opts);

} // namespace xserv::compiler
