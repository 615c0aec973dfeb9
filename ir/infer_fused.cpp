// Type inference of the fused ops: the operand checks of the ops each one replaces, combined.
#include "ir/infer_checker.h"

namespace xserv::ir::detail {
namespace {

/// linear's checks for x = operand xi, weight = operand wi, bias = operand bi (-1: none);
/// returns the output shape through `s`.
bool linear_part(Checker& c, size_t xi, size_t wi, int bi, Shape& s) {
  if (!(c.min_rank(xi, 1, "x") && c.rank(wi, 2, "weight") && c.floaty(xi, "x") &&
        c.floaty(wi, "weight") &&
        c.same_dim(c.in(xi).shape.back(), c.in(wi).shape[1], "linear input width")))
    return false;
  if (bi >= 0 && !c.bias_of(static_cast<size_t>(bi), wi, "bias"))
    return false;
  s = c.in(xi).shape;
  s.back() = c.in(wi).shape[0];
  return true;
}

/// rms_norm's checks for x = operand 0, norm weight = operand 1.
bool norm_part(Checker& c) {
  return c.min_rank(0, 1, "x") && c.rank(1, 1, "norm weight") && c.floaty(0, "x") &&
         c.floaty(1, "norm weight") &&
         c.same_dim(c.in(0).shape.back(), c.in(1).shape[0], "norm width") &&
         c.has_float_attr("eps", true);
}

/// The residual operand r must match the value it is added to.
bool residual_part(Checker& c, size_t r, const Shape& s) {
  if (!c.floaty(r, "residual"))
    return false;
  if (c.in(r).shape != s)
    return c.fail(fmt::format("residual {} does not match the sum's shape {}", type_str(c.in(r)),
                              shape_str(s)));
  return true;
}

bool infer_qkv_rope(Checker& c, const Node& n, std::vector<Type>& out) {
  if (!(c.rank(0, 2, "x") && norm_part(c) && c.rank(8, 1, "positions") &&
        c.integer(8, "positions") &&
        c.same_dim(c.in(8).shape[0], c.in(0).shape[0], "positions per token") &&
        c.has_int_attr("head_dim", 2, int64_t{1} << 20) && c.has_rope_attrs()))
    return false;
  const int64_t d = n.attr_int("head_dim");
  if (d % 2 != 0)
    return c.fail("rope head_dim must be even");
  static const char* const kNames[] = {"q", "k", "v"};
  int64_t heads[3];
  for (size_t p = 0; p < 3; ++p) {
    const size_t wi = 2 + 2 * p;
    Shape s;
    if (!linear_part(c, 0, wi, static_cast<int>(wi + 1), s))
      return false;
    const Dim& rows = c.in(wi).shape[0];
    if (!rows.is_static() || rows.size % d != 0)
      return c.fail(fmt::format("{} weight rows ({}) must be a static multiple of head_dim {}",
                                kNames[p], shape_str({rows}), d));
    heads[p] = rows.size / d;
  }
  if (heads[1] != heads[2])
    return c.fail(fmt::format("k and v head counts differ: {} and {}", heads[1], heads[2]));
  const Dim& t = c.in(0).shape[0];
  out = {f32({t, heads[0], d}), f32({t, heads[1], d}), f32({t, heads[2], d})};
  return true;
}

} // namespace

bool infer_fused(Checker& c, const Node& n, std::vector<Type>& out) {
  const int arity = static_cast<int>(n.inputs.size());
  Shape s;
  switch (n.op) {
  case Op::RmsNormLinear:
    if (!(norm_part(c) && linear_part(c, 0, 2, arity == 4 ? 3 : -1, s)))
      return false;
    out = {f32(s)};
    return true;
  case Op::QkvRope:
    return infer_qkv_rope(c, n, out);
  case Op::LinearResidual:
    if (!(linear_part(c, 0, 1, arity == 4 ? 2 : -1, s) &&
          residual_part(c, static_cast<size_t>(arity - 1), s)))
      return false;
    out = {f32(s)};
    return true;
  case Op::Router: {
    if (!(c.rank(0, 2, "x") && linear_part(c, 0, 1, arity == 3 ? 2 : -1, s) &&
          c.has_int_attr("k", 1, 1 << 20)))
      return false;
    const int64_t k = n.attr_int("k");
    if (s[1].is_static() && k > s[1].size)
      return c.fail(fmt::format("k = {} exceeds the {} experts", k, s[1].size));
    out = {f32({s[0], k}), Type{DType::I32, {s[0], k}}};
    return true;
  }
  case Op::MoeExpertsResidual:
    if (!infer_moe(c, out))
      return false;
    if (!residual_part(c, 7, out[0].shape)) {
      out.clear();
      return false;
    }
    return true;
  default:
    return c.fail("internal: infer_fused called for a plain op");
  }
}

} // namespace xserv::ir::detail
