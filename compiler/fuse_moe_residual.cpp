// Fusion of the residual add into the mixture-of-experts combine.
//
// 1. For each add, pick the operand that is a moe_experts read only by this add (operand 1
//    first, then operand 0).
// 2. Add moe_experts_residual(moe operands..., h) {limit, alpha} where the add was, redirect
//    the add's readers to it, drop the add and the moe_experts.
#include "compiler/fuse_moe_residual.h"

#include "compiler/graph_edit.h"

namespace xserv::compiler {

PassResult fuse_moe_residual(const ir::Graph& g, const PassOptions&) {
  return fuse_into_residual_add(g, ir::Op::MoeExperts, ir::Op::MoeExpertsResidual);
}

} // namespace xserv::compiler
