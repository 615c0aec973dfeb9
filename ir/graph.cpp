// Op table lookups and node attribute access.
#include "ir/graph.h"

#include <algorithm>

#include "base/error.h"

namespace xserv::ir {

namespace {
constexpr OpInfo kOps[] = {
#define OP(name, printed, lo, hi, traits) {printed, lo, hi, traits},
#include "ir/ops.def"
};
} // namespace

const OpInfo& op_info(Op op) {
  return kOps[static_cast<size_t>(op)];
}

bool parse_op(std::string_view name, Op& out) {
  for (size_t i = 0; i < std::size(kOps); ++i)
    if (kOps[i].name == name) {
      out = static_cast<Op>(i);
      return true;
    }
  return false;
}

const Attr* Node::find_attr(std::string_view name) const {
  for (const auto& [k, v] : attrs)
    if (k == name)
      return &v;
  return nullptr;
}

bool Node::has_attr(std::string_view name) const {
  return find_attr(name) != nullptr;
}

int64_t Node::attr_int(std::string_view name) const {
  const Attr* a = find_attr(name);
  XSERV_CHECK(a && std::holds_alternative<int64_t>(*a),
              "node " + std::string(op_name(op)) + " lacks int attribute " + std::string(name));
  return std::get<int64_t>(*a);
}

int64_t Node::attr_int_or(std::string_view name, int64_t fallback) const {
  const Attr* a = find_attr(name);
  if (!a || !std::holds_alternative<int64_t>(*a))
    return fallback;
  return std::get<int64_t>(*a);
}

double Node::attr_float(std::string_view name) const {
  const Attr* a = find_attr(name);
  XSERV_CHECK(a && (std::holds_alternative<double>(*a) || std::holds_alternative<int64_t>(*a)),
              "node " + std::string(op_name(op)) + " lacks float attribute " + std::string(name));
  if (std::holds_alternative<int64_t>(*a))
    return static_cast<double>(std::get<int64_t>(*a));
  return std::get<double>(*a);
}

const std::string& Node::attr_str(std::string_view name) const {
  const Attr* a = find_attr(name);
  XSERV_CHECK(a && std::holds_alternative<std::string>(*a),
              "node " + std::string(op_name(op)) + " lacks string attribute " + std::string(name));
  return std::get<std::string>(*a);
}

void Node::set_attr(std::string name, Attr value) {
  auto it = std::lower_bound(attrs.begin(), attrs.end(), name,
                             [](const auto& kv, const std::string& n) { return kv.first < n; });
  if (it != attrs.end() && it->first == name)
    it->second = std::move(value);
  else
    attrs.insert(it, {std::move(name), std::move(value)});
}

int64_t kv_block_of(const Graph& g) {
  for (const Node& n : g.nodes)
    if (n.op == Op::Cache && n.type().shape.size() > 1 && n.type().shape[1].is_static())
      return n.type().shape[1].size;
  return 1;
}

} // namespace xserv::ir
