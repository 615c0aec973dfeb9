// compact(): the renumbering step shared by the cleanup passes.
#include "compiler/rewrite.h"

#include "base/error.h"

namespace xserv::compiler {

ir::Graph compact(const ir::Graph& g, const std::vector<bool>& keep,
                  const std::vector<ir::ValueId>& replace) {
  std::vector<ir::ValueId> new_id(g.size(), -1);
  ir::Graph out;
  auto resolve = [&](ir::ValueId v) {
    // Follow replacement chains (a merged node may itself have been merged).
    while (replace[static_cast<size_t>(v)] != v)
      v = replace[static_cast<size_t>(v)];
    ir::ValueId id = new_id[static_cast<size_t>(v)];
    XSERV_CHECK(id >= 0, "compact: a kept node uses a removed value\n" + ir::print(g));
    return id;
  };
  for (size_t i = 0; i < g.size(); ++i) {
    if (!keep[i])
      continue;
    ir::Node n = g.nodes[i];
    for (ir::ValueId& in : n.inputs)
      in = resolve(in);
    new_id[i] = static_cast<ir::ValueId>(out.nodes.size());
    out.nodes.push_back(std::move(n));
  }
  for (ir::ValueId o : g.outputs)
    out.outputs.push_back(resolve(o));
  return out;
}

} // namespace xserv::compiler
