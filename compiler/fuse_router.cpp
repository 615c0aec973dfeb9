// Fusion of the MoE router projection with its top-k selection.
//
// 1. For each router_topk, its logits must be a linear read by nothing else.
// 2. Add router(x, W[, b]) {k} where the router_topk was, redirect its readers (the extracts)
//    to it, drop the router_topk and the linear.
#include "compiler/fuse_router.h"

#include "compiler/graph_edit.h"

namespace xserv::compiler {

PassResult fuse_router(const ir::Graph& g, const PassOptions&) {
  const Uses uses(g);
  GraphEdit edit(g);
  for (size_t i = 0; i < g.size(); ++i) {
    const ir::ValueId top_id = static_cast<ir::ValueId>(i);
    const ir::Node& top = g.nodes[i];
    if (top.op != ir::Op::RouterTopK)
      continue;
    const ir::ValueId lin_id = top.inputs[0];
    if (g.node(lin_id).op != ir::Op::Linear || uses.sole_user(lin_id) != top_id)
      continue;
    edit.replace(top_id, edit.add(top_id, ir::Op::Router, g.node(lin_id).inputs, top.attrs));
    edit.erase(top_id);
    edit.erase(lin_id);
  }
  if (!edit.changed())
    return {g, false};
  return {edit.finish(), true};
}

} // namespace xserv::compiler
