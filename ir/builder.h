// Builder: appends nodes to a graph with their result types inferred and checked on the spot.
#pragma once

#include <string>

#include "ir/graph.h"

namespace xserv::ir {

/// Creates nodes with inferred types; an ill-typed node is an internal error (XSERV_CHECK
/// prints the offending node), since builders are driven by validated configs.
class Builder {
public:
  explicit Builder(Graph& g) : g_(g) {}

  ValueId param(const std::string& name, Type t);
  ValueId weight(const std::string& name, Type t);
  ValueId cache(const std::string& name, Type t);
  /// Any op whose result type follows from its operands.
  ValueId add_node(Op op, std::vector<ValueId> inputs,
                   std::vector<std::pair<std::string, Attr>> attrs = {});
  /// Ops whose result type is declared (reshape, cast).
  ValueId add_typed(Op op, std::vector<ValueId> inputs, Type t,
                    std::vector<std::pair<std::string, Attr>> attrs = {});
  void set_outputs(std::vector<ValueId> outs) { g_.outputs = std::move(outs); }

  const Type& type(ValueId v) const { return g_.type(v); }
  Graph& graph() { return g_; }

private:
  ValueId push(Node n, bool infer);
  Graph& g_;
};

} // namespace xserv::ir
