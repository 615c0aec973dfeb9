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
  const Uses uses(g);
  GraphEdit edit(g);
  for (size_t i = 0; i < g.size(); ++i) {
    const ir::ValueId add_id = static_cast<ir::ValueId>(i);
    const ir::Node& add = g.nodes[i];
    if (add.op != ir::Op::Add)
      continue;
    for (size_t side : {size_t{1}, size_t{0}}) {
      const ir::ValueId moe_id = add.inputs[side], h = add.inputs[1 - side];
      const ir::Node& moe = g.node(moe_id);
      if (moe.op != ir::Op::MoeExperts || uses.sole_user(moe_id) != add_id)
        continue;
      std::vector<ir::ValueId> ops = moe.inputs;
      ops.push_back(h);
      edit.replace(add_id, edit.add(add_id, ir::Op::MoeExpertsResidual, std::move(ops), moe.attrs));
      edit.erase(add_id);
      edit.erase(moe_id);
      break;
    }
  }
  if (!edit.changed())
    return {g, false};
  return {edit.finish(), true};
}

} // namespace xserv::compiler
