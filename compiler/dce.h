// Dead-code elimination.
#pragma once

#include "compiler/pass.h"

namespace xserv::compiler {

/// Removes nodes whose values reach neither an output nor a state write (kv_write).
PassResult dce(const ir::Graph& g, const PassOptions& opts);

} // namespace xserv::compiler
