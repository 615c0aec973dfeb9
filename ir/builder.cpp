// Builder: node construction with type inference.
#include "ir/builder.h"

#include <algorithm>

#include "base/error.h"

namespace xserv::ir {

ValueId Builder::push(Node n, bool infer) {
  std::sort(n.attrs.begin(), n.attrs.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  g_.nodes.push_back(n);
  const ValueId id = static_cast<ValueId>(g_.nodes.size() - 1);
  std::vector<Type> types;
  std::string err = infer_types(g_, g_.nodes.back(), types);
  if (!err.empty()) {
    std::string text = print_node(g_, id);
    g_.nodes.pop_back();
    XSERV_CHECK(false, "builder made an ill-typed node: " + err + "\n  " + text);
  }
  if (infer)
    g_.nodes.back().types = std::move(types);
  return id;
}

ValueId Builder::param(const std::string& name, Type t) {
  Node n;
  n.op = Op::Param;
  n.attrs = {{"name", name}};
  n.types = {std::move(t)};
  return push(std::move(n), false);
}

ValueId Builder::weight(const std::string& name, Type t) {
  Node n;
  n.op = Op::Weight;
  n.attrs = {{"name", name}};
  n.types = {std::move(t)};
  return push(std::move(n), false);
}

ValueId Builder::cache(const std::string& name, Type t) {
  Node n;
  n.op = Op::Cache;
  n.attrs = {{"name", name}};
  n.types = {std::move(t)};
  return push(std::move(n), false);
}

ValueId Builder::add_node(Op op, std::vector<ValueId> inputs,
                          std::vector<std::pair<std::string, Attr>> attrs) {
  Node n;
  n.op = op;
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  n.types = {Type{}}; // placeholder so printing an ill-typed node works
  return push(std::move(n), true);
}

ValueId Builder::add_typed(Op op, std::vector<ValueId> inputs, Type t,
                           std::vector<std::pair<std::string, Attr>> attrs) {
  Node n;
  n.op = op;
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  n.types = {std::move(t)};
  return push(std::move(n), false);
}

} // namespace xserv::ir
