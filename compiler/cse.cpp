// Common-subexpression elimination.
//
// 1. Walk the nodes in order, rewriting each node's operands through the replacements so far.
// 2. A pure, stateless node is keyed by (op, operands, attributes, types); if the key was seen,
//    the node is dropped and its value redirected to the earlier node.
// 3. Rebuild the graph without the dropped nodes.
#include "compiler/cse.h"

#include <map>

#include "compiler/rewrite.h"
#include "ir/graph.h"

namespace xserv::compiler {

PassResult cse(const ir::Graph& g, const PassOptions&) {
  std::vector<ir::ValueId> replace(g.size());
  std::vector<bool> keep(g.size(), true);
  // print_node of a node with rewritten operands is a canonical key: it spells op, operands,
  // attributes and types, and nothing else.
  std::map<std::string, ir::ValueId> seen;
  bool changed = false;
  ir::Graph scratch;
  for (size_t i = 0; i < g.size(); ++i) {
    replace[i] = static_cast<ir::ValueId>(i);
    ir::Node n = g.nodes[i];
    for (ir::ValueId& in : n.inputs)
      in = replace[static_cast<size_t>(in)];
    scratch.nodes.push_back(n);
    const uint32_t traits = ir::op_info(n.op).traits;
    if (!(traits & ir::kPure) || (traits & (ir::kReadsState | ir::kWritesState)))
      continue;
    std::string key = ir::print_node(scratch, static_cast<ir::ValueId>(i));
    key = key.substr(key.find('=')); // drop the node's own id
    auto [it, fresh] = seen.try_emplace(std::move(key), static_cast<ir::ValueId>(i));
    if (!fresh) {
      replace[i] = it->second;
      keep[i] = false;
      changed = true;
    }
  }
  if (!changed)
    return {g, false};
  return {compact(g, keep, replace), true};
}

} // namespace xserv::compiler
