// The IR: a graph of SSA nodes in topological order, each defining one value.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "ir/shape.h"

namespace xserv::ir {

enum class Op : uint8_t {
#define OP(name, printed, lo, hi, traits) name,
#include "ir/ops.def"
};

/// Op traits (bit flags), see ops.def.
enum Trait : uint32_t {
  kSource = 1u << 0,
  kPure = 1u << 1,
  kReadsState = 1u << 2,
  kWritesState = 1u << 3,
  kFused = 1u << 4,
};

struct OpInfo {
  std::string_view name;
  int min_arity;
  int max_arity;
  uint32_t traits;
};

const OpInfo& op_info(Op op);
inline std::string_view op_name(Op op) {
  return op_info(op).name;
}
inline bool has_trait(Op op, Trait t) {
  return (op_info(op).traits & t) != 0;
}
/// Looks an op up by printed name; false when unknown.
bool parse_op(std::string_view name, Op& out);

/// An attribute value: integer, float, string or integer list.
using Attr = std::variant<int64_t, double, std::string, std::vector<int64_t>>;

/// Index of a node (= the value it defines) in its graph.
using ValueId = int32_t;

/// One operation. Most ops have one result (`types` has one entry); multi-result ops
/// (router_topk) list several and are read through `extract` nodes.
struct Node {
  Op op = Op::Param;
  std::vector<ValueId> inputs;
  std::vector<std::pair<std::string, Attr>> attrs; ///< sorted by name, unique
  std::vector<Type> types;

  const Type& type() const { return types.front(); }
  bool has_attr(std::string_view name) const;
  const Attr* find_attr(std::string_view name) const;
  int64_t attr_int(std::string_view name) const;  ///< asserts presence and kind
  double attr_float(std::string_view name) const; ///< accepts int attrs too
  const std::string& attr_str(std::string_view name) const;
  int64_t attr_int_or(std::string_view name, int64_t fallback) const;
  /// Sets (or replaces) an attribute, keeping the list sorted.
  void set_attr(std::string name, Attr value);
  bool operator==(const Node& o) const = default;
};

/// A whole program: nodes in topological order (inputs always precede users) and the values
/// it returns. Stateful nodes (kReadsState / kWritesState) see KV caches in node order.
struct Graph {
  std::vector<Node> nodes;
  std::vector<ValueId> outputs;

  const Node& node(ValueId v) const { return nodes.at(static_cast<size_t>(v)); }
  const Type& type(ValueId v) const { return node(v).type(); }
  size_t size() const { return nodes.size(); }
  bool operator==(const Graph& o) const = default;
};

/// Infers the result types of `n` from its inputs' types and attributes. Source ops, reshape
/// and cast return their declared types unchanged (after checking them). Returns an empty
/// string on success, else a message describing the mismatch.
std::string infer_types(const Graph& g, const Node& n, std::vector<Type>& out);

/// Checks every structural and type invariant: arity, operands defined before use, declared
/// types equal inferred ones, required attributes present with sane values, outputs valid.
/// Returns every problem found, one per line as "%12 = linear: ...", or "" when valid.
std::string verify(const Graph& g);

/// Throws xserv::Error with verify()'s message when the graph is invalid; `what` names the
/// stage ("after pass cse") in the message.
void verify_or_throw(const Graph& g, std::string_view what);

/// Canonical text form: one node per line, values renumbered %0.., then `return ...`.
std::string print(const Graph& g);
/// Prints one node as in print() (its own id and inputs as %N).
std::string print_node(const Graph& g, ValueId v);

/// Parses the text form. Throws xserv::Error with "line:column: message" on bad input, or
/// "SOURCE:line:column: message" when `source` (a file name) is given. Value names in the text
/// may be any %identifier; they are renumbered in order.
Graph parse(std::string_view text, std::string_view source = {});
/// Positions per block of the graph's paged KV caches (their static second dimension); 1 for a
/// graph without caches.
int64_t kv_block_of(const Graph& g);

/// parse() of the text in `file` (a plan's graph.ir or stageN.ir); Error "FILE: WHAT missing"
/// when it cannot be read.
Graph parse_file(const std::filesystem::path& file, std::string_view what);

} // namespace xserv::ir
