// Fusion of rms_norm into the linears that read it.
//
// 1. Find each rms_norm that is not returned and whose readers are all linears reading it as
//    operand 0 (x) only, never as a weight or bias.
// 2. For each of those linears add rms_norm_linear(x, ln, W[, b]) {eps} where the linear was,
//    redirect the linear's users to it and drop the linear.
// 3. Drop the norm, which nothing reads any more.
#include "compiler/fuse_rmsnorm_linear.h"

#include "compiler/graph_edit.h"

namespace xserv::compiler {
namespace {

/// Whether every use of norm `v` is as the x operand of a linear.
bool only_linear_inputs(const ir::Graph& g, const Uses& uses, ir::ValueId v) {
  if (uses.returned(v) || uses.users(v).empty())
    return false;
  for (ir::ValueId u : uses.users(v)) {
    const ir::Node& n = g.node(u);
    if (n.op != ir::Op::Linear || n.inputs[0] != v)
      return false;
    for (size_t i = 1; i < n.inputs.size(); ++i)
      if (n.inputs[i] == v)
        return false;
  }
  return true;
}

} // namespace

PassResult fuse_rmsnorm_linear(const ir::Graph& g, const PassOptions&) {
  const Uses uses(g);
  GraphEdit edit(g);
  for (size_t i = 0; i < g.size(); ++i) {
    const ir::ValueId norm_id = static_cast<ir::ValueId>(i);
    const ir::Node& norm = g.nodes[i];
    if (norm.op != ir::Op::RmsNorm || !only_linear_inputs(g, uses, norm_id))
      continue;
    for (ir::ValueId lin_id : uses.users(norm_id)) {
      const ir::Node& lin = g.node(lin_id);
      std::vector<ir::ValueId> ops = {norm.inputs[0], norm.inputs[1]};
      ops.insert(ops.end(), lin.inputs.begin() + 1, lin.inputs.end());
      edit.replace(lin_id, edit.add(lin_id, ir::Op::RmsNormLinear, std::move(ops),
                                    {{"eps", *norm.find_attr("eps")}}));
      edit.erase(lin_id);
    }
    edit.erase(norm_id);
  }
  if (!edit.changed())
    return {g, false};
  return {edit.finish(), true};
}

} // namespace xserv::compiler
