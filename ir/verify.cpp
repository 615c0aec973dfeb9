// verify(): every structural and type invariant of a graph, reported all at once.
#include <map>

#include <fmt/format.h>

#include "base/error.h"
#include "ir/graph.h"

namespace xserv::ir {

std::string verify(const Graph& g) {
  std::string out;
  auto problem = [&](ValueId v, const std::string& msg) {
    out +=
        fmt::format("%{} = {}: {}\n", v,
                    v >= 0 && static_cast<size_t>(v) < g.size() ? op_name(g.node(v).op) : "?", msg);
  };
  std::map<std::string, std::pair<Op, Type>> sources;
  for (size_t i = 0; i < g.size(); ++i) {
    const ValueId id = static_cast<ValueId>(i);
    const Node& n = g.nodes[i];
    const OpInfo& info = op_info(n.op);
    int arity = static_cast<int>(n.inputs.size());
    if (arity < info.min_arity || arity > info.max_arity) {
      problem(id, info.min_arity == info.max_arity
                      ? fmt::format("takes {} operands, has {}", info.min_arity, arity)
                      : fmt::format("takes {} to {} operands, has {}", info.min_arity,
                                    info.max_arity, arity));
      continue;
    }
    bool operands_ok = true;
    for (ValueId in : n.inputs) {
      if (in < 0 || static_cast<size_t>(in) >= g.size()) {
        problem(id, fmt::format("operand %{} does not exist (dangling value)", in));
        operands_ok = false;
      } else if (static_cast<size_t>(in) >= i) {
        problem(id, fmt::format("operand %{} is used before its definition", in));
        operands_ok = false;
      } else if (g.node(in).types.size() != 1 && n.op != Op::Extract) {
        problem(id, fmt::format("operand %{} has several results; read one with extract", in));
        operands_ok = false;
      }
    }
    for (size_t a = 1; a < n.attrs.size(); ++a)
      if (!(n.attrs[a - 1].first < n.attrs[a].first)) {
        problem(id, fmt::format("attributes not sorted or repeated at '{}'", n.attrs[a].first));
        operands_ok = false;
      }
    if (n.types.empty()) {
      problem(id, "no result type");
      continue;
    }
    if (!operands_ok)
      continue;
    std::vector<Type> inferred;
    std::string err = infer_types(g, n, inferred);
    if (!err.empty()) {
      problem(id, err);
      continue;
    }
    if (inferred != n.types) {
      std::string want, have;
      for (const auto& t : inferred)
        want += (want.empty() ? "" : ", ") + type_str(t);
      for (const auto& t : n.types)
        have += (have.empty() ? "" : ", ") + type_str(t);
      problem(id, fmt::format("declared type {} but the operands give {}", have, want));
    }
    if (info.traits & kSource) {
      const std::string& name = n.attr_str("name");
      auto [it, fresh] = sources.try_emplace(name, n.op, n.type());
      if (!fresh && (n.op != Op::Weight || it->second.first != Op::Weight ||
                     !(it->second.second == n.type())))
        problem(id, fmt::format("'{}' is declared twice", name));
    }
  }
  for (ValueId o : g.outputs)
    if (o < 0 || static_cast<size_t>(o) >= g.size())
      out += fmt::format("return: %{} does not exist (dangling value)\n", o);
    else if (g.node(o).types.size() != 1)
      out += fmt::format("return: %{} has several results; read one with extract\n", o);
  return out;
}

void verify_or_throw(const Graph& g, std::string_view what) {
  std::string err = verify(g);
  if (!err.empty())
    throw Error(fmt::format("invalid IR {}:\n{}", what, err));
}

} // namespace xserv::ir
