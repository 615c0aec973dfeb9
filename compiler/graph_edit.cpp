// Uses and GraphEdit: use lists and the one-pass rebuild behind every fusion pass.
#include "compiler/graph_edit.h"

#include <algorithm>

#include "base/error.h"

namespace xserv::compiler {

Uses::Uses(const ir::Graph& g) : users_(g.size()), returned_(g.size(), false) {
  for (size_t i = 0; i < g.size(); ++i)
    for (ir::ValueId in : g.nodes[i].inputs)
      users_[static_cast<size_t>(in)].push_back(static_cast<ir::ValueId>(i));
  for (ir::ValueId o : g.outputs)
    returned_[static_cast<size_t>(o)] = true;
}

ir::ValueId Uses::sole_user(ir::ValueId v) const {
  const auto& u = users(v);
  return u.size() == 1 && !returned(v) ? u.front() : -1;
}

GraphEdit::GraphEdit(const ir::Graph& g)
    : g_(g), added_after_(g.size()), replace_(g.size()), erased_(g.size(), false) {
  for (size_t i = 0; i < g.size(); ++i)
    replace_[i] = static_cast<ir::ValueId>(i);
}

ir::ValueId GraphEdit::add(ir::ValueId after, ir::Op op, std::vector<ir::ValueId> inputs,
                           std::vector<std::pair<std::string, ir::Attr>> attrs) {
  ir::Node n;
  n.op = op;
  n.inputs = std::move(inputs);
  std::sort(attrs.begin(), attrs.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  n.attrs = std::move(attrs);
  n.types = {ir::Type{}};
  const ir::ValueId id = static_cast<ir::ValueId>(g_.size() + added_.size());
  added_after_.at(static_cast<size_t>(after)).push_back(added_.size());
  added_.push_back(std::move(n));
  replace_.push_back(id);
  changed_ = true;
  return id;
}

void GraphEdit::replace(ir::ValueId from, ir::ValueId to) {
  XSERV_CHECK(static_cast<size_t>(from) < g_.size(), "GraphEdit::replace of an added value");
  replace_[static_cast<size_t>(from)] = to;
  changed_ = true;
}

void GraphEdit::erase(ir::ValueId v) {
  erased_.at(static_cast<size_t>(v)) = true;
  changed_ = true;
}

ir::Graph GraphEdit::finish() const {
  std::vector<ir::ValueId> new_id(replace_.size(), -1);
  ir::Graph out;
  auto resolve = [&](ir::ValueId v) {
    while (replace_[static_cast<size_t>(v)] != v) // a replacement may itself be replaced
      v = replace_[static_cast<size_t>(v)];
    const ir::ValueId id = new_id[static_cast<size_t>(v)];
    XSERV_CHECK(id >= 0, "GraphEdit: a node reads a value that is erased or not yet defined\n" +
                             ir::print(g_));
    return id;
  };
  auto emit = [&](ir::Node n, size_t old_id, bool infer) {
    for (ir::ValueId& in : n.inputs)
      in = resolve(in);
    new_id[old_id] = static_cast<ir::ValueId>(out.nodes.size());
    if (infer) {
      std::vector<ir::Type> types;
      const std::string err = ir::infer_types(out, n, types);
      out.nodes.push_back(std::move(n));
      XSERV_CHECK(err.empty(), "GraphEdit added an ill-typed node: " + err + "\n  " +
                                   ir::print_node(out, new_id[old_id]));
      out.nodes.back().types = std::move(types);
    } else {
      out.nodes.push_back(std::move(n));
    }
  };
  for (size_t i = 0; i < g_.size(); ++i) {
    if (!erased_[i])
      emit(g_.nodes[i], i, false);
    for (size_t a : added_after_[i])
      emit(added_[a], g_.size() + a, true);
  }
  for (ir::ValueId o : g_.outputs)
    out.outputs.push_back(resolve(o));
  return out;
}

PassResult fuse_into_residual_add(const ir::Graph& g, ir::Op producer, ir::Op fused) {
  const Uses uses(g);
  GraphEdit edit(g);
  for (size_t i = 0; i < g.size(); ++i) {
    const ir::ValueId add_id = static_cast<ir::ValueId>(i);
    const ir::Node& add = g.nodes[i];
    if (add.op != ir::Op::Add)
      continue;
    for (size_t side : {size_t{1}, size_t{0}}) {
      const ir::ValueId prod_id = add.inputs[side], h = add.inputs[1 - side];
      const ir::Node& prod = g.node(prod_id);
      if (prod.op != producer || uses.sole_user(prod_id) != add_id)
        continue;
      std::vector<ir::ValueId> ops = prod.inputs;
      ops.push_back(h);
      edit.replace(add_id, edit.add(add_id, fused, std::move(ops), prod.attrs));
      edit.erase(add_id);
      edit.erase(prod_id);
      break;
    }
  }
  if (!edit.changed())
    return {g, false};
  return {edit.finish(), true};
}

} // namespace xserv::compiler
