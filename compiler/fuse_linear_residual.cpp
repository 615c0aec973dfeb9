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
  const Uses uses(g);
  GraphEdit edit(g);
  for (size_t i = 0; i < g.size(); ++i) {
    const ir::ValueId add_id = static_cast<ir::ValueId>(i);
    const ir::Node& add = g.nodes[i];
    if (add.op != ir::Op::Add)
      continue;
    for (size_t side : {size_t{1}, size_t{0}}) {
      const ir::ValueId lin_id = add.inputs[side], h = add.inputs[1 - side];
      if (g.node(lin_id).op != ir::Op::Linear || uses.sole_user(lin_id) != add_id)
        continue;
      std::vector<ir::ValueId> ops = g.node(lin_id).inputs;
      ops.push_back(h);
      edit.replace(add_id, edit.add(add_id, ir::Op::LinearResidual, std::move(ops)));
      edit.erase(add_id);
      edit.erase(lin_id);
      break;
    }
  }
  if (!edit.changed())
    return {g, false};
  return {edit.finish(), true};
}

} // namespace xserv::compiler
