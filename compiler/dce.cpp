// Dead-code elimination.
//
// 1. Roots are the graph's outputs and every node that writes state (kv_write): their effects
//    outlive the step.
// 2. Walk the nodes backwards; a live node makes its operands live.
// 3. Rebuild the graph from the live nodes, order kept.
#include "compiler/dce.h"

#include <algorithm>

#include "compiler/rewrite.h"

namespace xserv::compiler {

PassResult dce(const ir::Graph& g, const PassOptions&) {
  std::vector<bool> live(g.size(), false);
  for (ir::ValueId o : g.outputs)
    live[static_cast<size_t>(o)] = true;
  for (size_t i = 0; i < g.size(); ++i)
    if (ir::has_trait(g.nodes[i].op, ir::kWritesState))
      live[i] = true;
  for (size_t i = g.size(); i-- > 0;)
    if (live[i])
      for (ir::ValueId in : g.nodes[i].inputs)
        live[static_cast<size_t>(in)] = true;
  std::vector<ir::ValueId> same(g.size());
  for (size_t i = 0; i < g.size(); ++i)
    same[i] = static_cast<ir::ValueId>(i);
  bool changed = std::find(live.begin(), live.end(), false) != live.end();
  if (!changed)
    return {g, false};
  return {compact(g, live, same), true};
}

} // namespace xserv::compiler
