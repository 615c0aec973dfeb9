// Fusion of an attention block's input norm, q/k/v projections and rotary embedding.
//
// 1. For each rms_norm xn with a rank-2 input, collect its readers: exactly three linears with
//    bias, each reading xn as x only; xn is not returned.
// 2. Follow each linear to its sole reader, a reshape to [T, heads, D] (one D for all three),
//    and each reshape to its sole reader if that is a rope_yarn of it. Exactly two chains end
//    in a rope (q first in node order, then k), sharing the positions operand and attributes;
//    the third (v) ends at its reshape; k and v have equal head counts.
// 3. Every reader of the three results (rotated q, rotated k, v) must come after the last
//    matched node, where the fused node goes, so the order stays topological.
// 4. Add qkv_rope there plus extracts 0/1/2, redirect q, k, v to the extracts and drop the
//    nine matched nodes.
#include "compiler/fuse_qkv.h"

#include <algorithm>
#include <optional>

#include "compiler/graph_edit.h"

namespace xserv::compiler {
namespace {

using ir::ValueId;

/// One matched attention input block.
struct QkvMatch {
  ValueId norm;
  ValueId lin[3];     ///< q, k, v projections
  ValueId reshape[3]; ///< q, k, v as [T, heads, D]
  ValueId rope[2];    ///< rotated q, k
  int64_t head_dim;
};

/// The last node of a match, where the fused node goes.
ValueId last_node(const QkvMatch& m) {
  return std::max({m.norm, m.lin[0], m.lin[1], m.lin[2], m.reshape[0], m.reshape[1], m.reshape[2],
                   m.rope[0], m.rope[1]});
}

/// Steps 1-3 for the norm `norm_id`.
std::optional<QkvMatch> match(const ir::Graph& g, const Uses& uses, ValueId norm_id) {
  const ir::Node& norm = g.node(norm_id);
  if (norm.op != ir::Op::RmsNorm || uses.returned(norm_id) ||
      g.type(norm.inputs[0]).shape.size() != 2)
    return std::nullopt;
  const std::vector<ValueId>& readers = uses.users(norm_id);
  if (readers.size() != 3)
    return std::nullopt;
  QkvMatch m{};
  m.norm = norm_id;
  ValueId chain_lin[3], chain_reshape[3], chain_rope[3];
  const ir::Dim& tokens = g.type(norm.inputs[0]).shape[0];
  for (size_t p = 0; p < 3; ++p) {
    const ValueId lin = readers[p];
    const ir::Node& ln = g.node(lin);
    if (ln.op != ir::Op::Linear || ln.inputs.size() != 3 || ln.inputs[0] != norm_id ||
        ln.inputs[1] == norm_id || ln.inputs[2] == norm_id)
      return std::nullopt;
    const ValueId rs = uses.sole_user(lin);
    if (rs < 0 || g.node(rs).op != ir::Op::Reshape)
      return std::nullopt;
    const ir::Shape& s = g.type(rs).shape;
    if (s.size() != 3 || !(s[0] == tokens) || !s[2].is_static() ||
        (p > 0 && s[2].size != m.head_dim))
      return std::nullopt;
    m.head_dim = s[2].size;
    const ValueId rope = uses.sole_user(rs);
    chain_lin[p] = lin;
    chain_reshape[p] = rs;
    chain_rope[p] = rope >= 0 && g.node(rope).op == ir::Op::RopeYarn &&
                            g.node(rope).inputs[0] == rs && g.node(rope).inputs[1] != rs
                        ? rope
                        : -1;
  }
  // Readers are in node order, so the rotated chains come out q then k.
  size_t roped = 0, v = 3;
  for (size_t p = 0; p < 3; ++p) {
    if (chain_rope[p] < 0) {
      v = p;
      continue;
    }
    if (roped == 2)
      return std::nullopt;
    m.lin[roped] = chain_lin[p];
    m.reshape[roped] = chain_reshape[p];
    m.rope[roped++] = chain_rope[p];
  }
  if (roped != 2 || v == 3)
    return std::nullopt;
  m.lin[2] = chain_lin[v];
  m.reshape[2] = chain_reshape[v];
  const ir::Node &rq = g.node(m.rope[0]), &rk = g.node(m.rope[1]);
  if (rq.inputs[1] != rk.inputs[1] || rq.attrs != rk.attrs ||
      !(g.type(m.reshape[1]).shape[1] == g.type(m.reshape[2]).shape[1]))
    return std::nullopt;
  const ValueId last = last_node(m);
  for (ValueId result : {m.rope[0], m.rope[1], m.reshape[2]})
    for (ValueId u : uses.users(result))
      if (u <= last)
        return std::nullopt;
  return m;
}

} // namespace

PassResult fuse_qkv(const ir::Graph& g, const PassOptions&) {
  const Uses uses(g);
  GraphEdit edit(g);
  for (size_t i = 0; i < g.size(); ++i) {
    const std::optional<QkvMatch> m = match(g, uses, static_cast<ValueId>(i));
    if (!m)
      continue;
    const ir::Node& norm = g.node(m->norm);
    std::vector<ValueId> ops = {norm.inputs[0], norm.inputs[1]};
    for (ValueId lin : m->lin)
      ops.insert(ops.end(), g.node(lin).inputs.begin() + 1, g.node(lin).inputs.end());
    ops.push_back(g.node(m->rope[0]).inputs[1]);
    std::vector<std::pair<std::string, ir::Attr>> attrs = g.node(m->rope[0]).attrs;
    attrs.emplace_back("eps", *norm.find_attr("eps"));
    attrs.emplace_back("head_dim", m->head_dim);
    const ValueId last = last_node(*m);
    const ValueId fused = edit.add(last, ir::Op::QkvRope, std::move(ops), std::move(attrs));
    const ValueId results[3] = {m->rope[0], m->rope[1], m->reshape[2]};
    for (int64_t r = 0; r < 3; ++r)
      edit.replace(results[r], edit.add(last, ir::Op::Extract, {fused}, {{"index", r}}));
    for (ValueId v : {m->norm, m->lin[0], m->lin[1], m->lin[2], m->reshape[0], m->reshape[1],
                      m->reshape[2], m->rope[0], m->rope[1]})
      edit.erase(v);
  }
  if (!edit.changed())
    return {g, false};
  return {edit.finish(), true};
}

} // namespace xserv::compiler
