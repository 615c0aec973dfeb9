// The graph surgery the fusion passes share: who reads a value, and a batch of edits (add fused
// nodes, redirect uses, drop the nodes they replace) applied in one rebuild.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "compiler/pass.h"
#include "ir/graph.h"

namespace xserv::compiler {

/// Who reads each value of a graph.
class Uses {
public:
  explicit Uses(const ir::Graph& g);
  /// The nodes reading v, in node order, once per operand slot that names v.
  const std::vector<ir::ValueId>& users(ir::ValueId v) const {
    return users_[static_cast<size_t>(v)];
  }
  /// Whether the graph returns v.
  bool returned(ir::ValueId v) const { return returned_[static_cast<size_t>(v)]; }
  /// The one node reading v through one operand slot, when nothing else (an output included)
  /// reads v; -1 otherwise.
  ir::ValueId sole_user(ir::ValueId v) const;

private:
  std::vector<std::vector<ir::ValueId>> users_;
  std::vector<bool> returned_;
};

/// Edits recorded against a graph, applied by finish(). Values are named by their ids in the
/// original graph, or by the ids add() returns (>= the original graph's size).
class GraphEdit {
public:
  explicit GraphEdit(const ir::Graph& g);

  /// A new node emitted right after original node `after` (after those added there earlier),
  /// reading original or added values. Its result types are inferred by finish(); its
  /// operands must then be defined before that point.
  ir::ValueId add(ir::ValueId after, ir::Op op, std::vector<ir::ValueId> inputs,
                  std::vector<std::pair<std::string, ir::Attr>> attrs = {});
  /// Every use of original value `from` (operands and outputs) reads `to` instead.
  void replace(ir::ValueId from, ir::ValueId to);
  /// Drops original node v; after replacement nothing kept may read it.
  void erase(ir::ValueId v);
  bool changed() const { return changed_; }

  /// The edited graph: kept original nodes in order, each followed by the nodes added after
  /// it, values renumbered densely. An added node that is ill-typed or a kept node reading an
  /// erased or not-yet-defined value is a bug in the pass: XSERV_CHECK prints the IR.
  ir::Graph finish() const;

private:
  const ir::Graph& g_;
  std::vector<ir::Node> added_;
  std::vector<std::vector<size_t>> added_after_; ///< per original node, indices into added_
  std::vector<ir::ValueId> replace_;             ///< over original and added ids
  std::vector<bool> erased_;
  bool changed_ = false;
};

/// The shared body of the residual fusions: every `producer` node whose only reader is an add
/// becomes `fused(producer's operands..., the add's other operand)` with the producer's
/// attributes, in the add's place (operand 1 of the add is tried first, then operand 0).
PassResult fuse_into_residual_add(const ir::Graph& g, ir::Op producer, ir::Op fused);

} // namespace xserv::compiler
