// print(): the canonical text form of a graph.
#include <fmt/format.h>

#include "ir/graph.h"

namespace xserv::ir {
namespace {

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

/// Shortest text that parses back to the same double, always recognisable as a float.
std::string float_str(double v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eEn") == std::string::npos) // n: nan, inf
    s += ".0";
  return s;
}

std::string attr_str(const Attr& a) {
  if (auto* i = std::get_if<int64_t>(&a))
    return std::to_string(*i);
  if (auto* d = std::get_if<double>(&a))
    return float_str(*d);
  if (auto* s = std::get_if<std::string>(&a))
    return quote(*s);
  const auto& l = std::get<std::vector<int64_t>>(a);
  return fmt::format("[{}]", fmt::join(l, ","));
}

} // namespace

std::string print_node(const Graph& g, ValueId v) {
  const Node& n = g.node(v);
  std::string s = fmt::format("%{} = {}(", v, op_name(n.op));
  for (size_t i = 0; i < n.inputs.size(); ++i)
    s += fmt::format("{}%{}", i ? ", " : "", n.inputs[i]);
  s += ")";
  if (!n.attrs.empty()) {
    s += " {";
    for (size_t i = 0; i < n.attrs.size(); ++i)
      s += fmt::format("{}{}={}", i ? ", " : "", n.attrs[i].first, attr_str(n.attrs[i].second));
    s += "}";
  }
  s += " : ";
  if (n.types.size() == 1) {
    s += type_str(n.types[0]);
  } else {
    s += "(";
    for (size_t i = 0; i < n.types.size(); ++i)
      s += (i ? ", " : "") + type_str(n.types[i]);
    s += ")";
  }
  return s;
}

std::string print(const Graph& g) {
  std::string out;
  for (size_t i = 0; i < g.size(); ++i)
    out += print_node(g, static_cast<ValueId>(i)) + "\n";
  out += "return";
  for (size_t i = 0; i < g.outputs.size(); ++i)
    out += fmt::format("{}%{}", i ? ", " : " ", g.outputs[i]);
  return out + "\n";
}

} // namespace xserv::ir
