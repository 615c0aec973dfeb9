// Type inference: the result types of every op from its operands' types and attributes.
#include "ir/infer_checker.h"

namespace xserv::ir {
namespace {

using detail::Checker;
using detail::f32;

bool infer_source(Checker& c, const Node& n, std::vector<Type>& out) {
  const Attr* name = n.find_attr("name");
  if (!name || !std::holds_alternative<std::string>(*name) || std::get<std::string>(*name).empty())
    return c.fail("missing string attribute 'name'");
  if (n.types.size() != 1)
    return c.fail("a source op declares exactly one result type");
  const Type& t = n.types[0];
  for (const auto& d : t.shape)
    if (d.is_static() && d.size < 0)
      return c.fail("negative dimension");
  if (t.dtype == DType::MXFP4 &&
      (t.shape.empty() || !t.shape.back().is_static() || t.shape.back().size % 32 != 0))
    return c.fail("an mxfp4 tensor's last dimension must be a static multiple of 32");
  if (n.op == Op::Cache && t.shape.size() != 4)
    return c.fail("a cache is [rows, slots, kv_heads, head_dim]");
  out = n.types;
  return true;
}

bool infer_attention(Checker& c, const Node& n, std::vector<Type>& out) {
  if (!(c.rank(0, 3, "q") && c.rank(1, 3, "k") && c.rank(2, 3, "v") && c.rank(3, 4, "k cache") &&
        c.rank(4, 4, "v cache") && c.rank(5, 1, "sinks") && c.rank(6, 1, "positions") &&
        c.rank(7, 1, "token_seq") && c.rank(8, 1, "ctx_lens") && c.rank(9, 2, "block table")))
    return false;
  for (size_t i = 0; i < 6; ++i)
    if (!c.floaty(i, "q/k/v/caches/sinks"))
      return false;
  for (size_t i = 6; i < 10; ++i)
    if (!c.integer(i, "positions/token_seq/ctx_lens/block table"))
      return false;
  const Shape &q = c.in(0).shape, &k = c.in(1).shape, &kc = c.in(3).shape;
  if (!(c.same_dim(q[0], k[0], "q and k tokens") && c.same_dim(q[2], k[2], "head_dim") &&
        c.in(1).shape == c.in(2).shape && c.in(3).shape == c.in(4).shape &&
        c.same_dim(kc[2], k[1], "cache kv heads") && c.same_dim(kc[3], k[2], "cache head_dim") &&
        c.same_dim(c.in(5).shape[0], q[1], "sinks per query head") &&
        c.same_dim(c.in(6).shape[0], q[0], "positions") &&
        c.same_dim(c.in(7).shape[0], q[0], "token_seq") &&
        c.same_dim(c.in(8).shape[0], c.in(9).shape[0], "ctx_lens and block table rows")))
    return c.fail(c.error().empty() ? "k/v or k/v cache shapes differ" : c.error());
  if (q[1].is_static() && k[1].is_static() && (k[1].size == 0 || q[1].size % k[1].size != 0))
    return c.fail("query heads must be a multiple of kv heads");
  if (!c.has_int_attr("window", 0, int64_t{1} << 40) || !c.has_float_attr("scale", true))
    return false;
  if (!kc[1].is_static() || kc[1].size < 1)
    return c.fail("a KV cache's second dimension is its block size, a static size");
  out = {f32(q)};
  return true;
}

} // namespace

namespace detail {

bool infer_moe(Checker& c, std::vector<Type>& out) {
  if (!(c.rank(0, 2, "x") && c.rank(1, 2, "routing weights") && c.rank(2, 2, "expert ids") &&
        c.rank(3, 3, "gate_up") && c.rank(4, 2, "gate_up bias") && c.rank(5, 3, "down") &&
        c.rank(6, 2, "down bias") && c.floaty(0, "x") && c.floaty(1, "routing weights") &&
        c.integer(2, "expert ids") && c.floaty(3, "gate_up") && c.floaty(5, "down")))
    return false;
  const Shape &x = c.in(0).shape, &gu = c.in(3).shape, &dn = c.in(5).shape;
  if (!(c.in(1).shape == c.in(2).shape && c.same_dim(c.in(1).shape[0], x[0], "routing tokens") &&
        c.same_dim(gu[2], x[1], "gate_up input width") &&
        c.same_dim(dn[1], x[1], "down output width") && c.same_dim(gu[0], dn[0], "expert count") &&
        c.same_dim(c.in(4).shape[0], gu[0], "gate_up bias experts") &&
        c.same_dim(c.in(4).shape[1], gu[1], "gate_up bias width") &&
        c.same_dim(c.in(6).shape[0], dn[0], "down bias experts") &&
        c.same_dim(c.in(6).shape[1], dn[1], "down bias width")))
    return c.fail(c.error().empty() ? "routing weights and ids differ in shape" : c.error());
  if (gu[1].is_static() && dn[2].is_static() && gu[1].size != 2 * dn[2].size)
    return c.fail(fmt::format("gate_up rows ({}) must be twice down's input width ({})", gu[1].size,
                              dn[2].size));
  if (!c.has_float_attr("limit", true) || !c.has_float_attr("alpha", true))
    return false;
  out = {f32(x)};
  return true;
}

} // namespace detail

std::string infer_types(const Graph& g, const Node& n, std::vector<Type>& out) {
  Checker c(g, n);
  out.clear();
  switch (n.op) {
  case Op::Param:
  case Op::Weight:
  case Op::Cache:
    infer_source(c, n, out);
    break;
  case Op::Recv:
    if (c.has_int_attr("peer", 0, 1 << 20))
      infer_source(c, n, out);
    break;
  case Op::Send: {
    const Attr* name = n.find_attr("name");
    if (!name || !std::holds_alternative<std::string>(*name) ||
        std::get<std::string>(*name).empty())
      c.fail("missing string attribute 'name'");
    else if (c.has_int_attr("peer", 0, 1 << 20))
      out = {c.in(0)};
    break;
  }
  case Op::Embedding:
    if (c.rank(0, 2, "table") && c.floaty(0, "table") && c.rank(1, 1, "ids") && c.integer(1, "ids"))
      out = {f32({c.in(1).shape[0], c.in(0).shape[1]})};
    break;
  case Op::RmsNorm:
    if (c.min_rank(0, 1, "x") && c.rank(1, 1, "weight") && c.floaty(0, "x") &&
        c.floaty(1, "weight") && c.same_dim(c.in(0).shape.back(), c.in(1).shape[0], "norm width") &&
        c.has_float_attr("eps", true))
      out = {f32(c.in(0).shape)};
    break;
  case Op::Linear:
    if (c.min_rank(0, 1, "x") && c.rank(1, 2, "weight") && c.floaty(0, "x") &&
        c.floaty(1, "weight") &&
        c.same_dim(c.in(0).shape.back(), c.in(1).shape[1], "linear input width")) {
      if (n.inputs.size() == 3 &&
          !(c.rank(2, 1, "bias") && c.same_dim(c.in(2).shape[0], c.in(1).shape[0], "bias width")))
        break;
      Shape s = c.in(0).shape;
      s.back() = c.in(1).shape[0];
      out = {f32(s)};
    }
    break;
  case Op::Add:
    if (c.floaty(0, "lhs") && c.floaty(1, "rhs")) {
      if (c.in(0).shape != c.in(1).shape)
        c.fail(
            fmt::format("add of different shapes {} and {}", type_str(c.in(0)), type_str(c.in(1))));
      else
        out = {f32(c.in(0).shape)};
    }
    break;
  case Op::Reshape:
    if (n.types.size() != 1)
      c.fail("reshape declares one result type");
    else if (!same_numel(n.types[0].shape, c.in(0).shape))
      c.fail(fmt::format("reshape of {} to {} changes the element count", type_str(c.in(0)),
                         type_str(n.types[0])));
    else if (n.types[0].dtype != c.in(0).dtype)
      c.fail("reshape cannot change the element type (use cast)");
    else
      out = n.types;
    break;
  case Op::Cast:
    if (n.types.size() != 1 || n.types[0].shape != c.in(0).shape)
      c.fail("cast keeps the shape");
    else if (n.types[0].dtype == DType::MXFP4)
      c.fail("cannot cast to mxfp4");
    else
      out = n.types;
    break;
  case Op::RopeYarn:
    if (c.rank(0, 3, "x") && c.floaty(0, "x") && c.rank(1, 1, "positions") &&
        c.integer(1, "positions") &&
        c.same_dim(c.in(0).shape[0], c.in(1).shape[0], "positions per token") &&
        c.has_rope_attrs()) {
      const Dim& d = c.in(0).shape[2];
      if (!d.is_static() || d.size % 2 != 0)
        c.fail("rope head_dim must be static and even");
      else
        out = {f32(c.in(0).shape)};
    }
    break;
  case Op::Attention:
    infer_attention(c, n, out);
    break;
  case Op::KvWrite:
    if (c.rank(0, 4, "cache") && c.rank(1, 3, "x") && c.floaty(1, "x") &&
        c.integer(2, "positions") && c.integer(3, "token_seq") && c.rank(4, 2, "block table") &&
        c.integer(4, "block table") && c.same_dim(c.in(0).shape[2], c.in(1).shape[1], "kv heads") &&
        c.same_dim(c.in(0).shape[3], c.in(1).shape[2], "head_dim") &&
        c.same_dim(c.in(2).shape[0], c.in(1).shape[0], "positions") &&
        c.same_dim(c.in(3).shape[0], c.in(1).shape[0], "token_seq")) {
      if (g.node(n.inputs[0]).op != Op::Cache)
        c.fail("kv_write's first operand must be a cache");
      else if (!c.in(0).shape[1].is_static() || c.in(0).shape[1].size < 1)
        c.fail("a KV cache's second dimension is its block size, a static size");
      else if (n.has_attr("window") && !c.has_int_attr("window", 0, int64_t{1} << 40))
        ;
      else
        out = {c.in(0)};
    }
    break;
  case Op::RouterTopK:
    if (c.rank(0, 2, "logits") && c.floaty(0, "logits") && c.has_int_attr("k", 1, 1 << 20)) {
      const Dim& e = c.in(0).shape[1];
      int64_t k = n.attr_int("k");
      if (e.is_static() && k > e.size)
        c.fail(fmt::format("k = {} exceeds the {} experts", k, e.size));
      else
        out = {f32({c.in(0).shape[0], k}), Type{DType::I32, {c.in(0).shape[0], k}}};
    }
    break;
  case Op::Extract: {
    const Node& src = g.node(n.inputs[0]);
    if (src.types.size() < 2)
      c.fail("extract reads a multi-result node");
    else if (c.has_int_attr("index", 0, static_cast<int64_t>(src.types.size()) - 1))
      out = {src.types[static_cast<size_t>(n.attr_int("index"))]};
    break;
  }
  case Op::MoeExperts:
    detail::infer_moe(c, out);
    break;
  case Op::SelectRows:
    if (c.min_rank(0, 1, "x") && c.rank(1, 1, "rows") && c.integer(1, "rows")) {
      Shape s = c.in(0).shape;
      s[0] = c.in(1).shape[0];
      out = {Type{c.in(0).dtype, s}};
    }
    break;
  case Op::Argmax:
    if (c.min_rank(0, 1, "x") && c.floaty(0, "x")) {
      Shape s = c.in(0).shape;
      s.pop_back();
      out = {Type{DType::I32, s}};
    }
    break;
  case Op::RmsNormLinear:
  case Op::QkvRope:
  case Op::LinearResidual:
  case Op::Router:
  case Op::MoeExpertsResidual:
    detail::infer_fused(c, n, out);
    break;
  }
  if (!c.error().empty())
    out.clear();
  else if (out.empty())
    return "internal: no result type inferred";
  return c.error();
}

} // namespace xserv::ir
