// Fusion of a linear into the residual add that consumes it.
#pragma once

#include "compiler/pass.h"

namespace xserv::compiler {

/// Rewrites add(h, linear(x, W[, b])) (either operand order) whose linear has no other reader
/// into linear_residual(x, W[, b], h): the GEMM epilogue adds the bias and the residual
/// stream, so the projection never goes to memory on its own. When both operands of the add
/// qualify, the second (the model's add(h, o_proj)) is fused.
PassResult fuse_linear_residual(const ir::Graph& g, const PassOptions& opts);

} // namespace xserv::compiler
