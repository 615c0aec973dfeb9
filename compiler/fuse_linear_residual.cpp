// Fusion of a linear into the residual add that consumes it.
//
// 1. For each add, pick the operand that is a linear read only by this add (operand 1 first,
//    then operand 0), not the same value as the other operand.
// 2. Add linear_residual(x, W[, b], h) where the add was (every operand of the linear and h
//    are defined before it), redirect the add's readers to it, drop the add and the linear.
#include "compiler/fuse_linear_residual.h"

#include "compiler/graph_edit.h"

namespace xserv::compiler {

PassResult fuse_linear_residual(const ir::Graph& g, const PassOptions&) {
  return fuse_into_residual_add(g, ir::Op::Linear, ir::Op::LinearResidual);
}

} // namespace xserv::compiler
