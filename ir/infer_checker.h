// The operand checker behind infer_types(), shared by the plain ops (infer.cpp) and the fused
// ones (infer_fused.cpp). Internal to ir/.
#pragma once

#include <fmt/format.h>

#include "ir/graph.h"

namespace xserv::ir::detail {

/// Accumulates the first problem found while checking one node.
class Checker {
public:
  Checker(const Graph& g, const Node& n) : g_(g), n_(n) {}

  const Type& in(size_t i) const { return g_.node(n_.inputs[i]).type(); }
  std::string name(size_t i) const { return fmt::format("operand {}", i); }

  bool fail(std::string msg) {
    if (err_.empty())
      err_ = std::move(msg);
    return false;
  }
  bool rank(size_t i, size_t r, const char* what) {
    if (in(i).shape.size() != r)
      return fail(fmt::format("{} ({}) must have rank {}, has {}", what, type_str(in(i)), r,
                              in(i).shape.size()));
    return true;
  }
  bool min_rank(size_t i, size_t r, const char* what) {
    if (in(i).shape.size() < r)
      return fail(fmt::format("{} ({}) must have rank >= {}", what, type_str(in(i)), r));
    return true;
  }
  bool floaty(size_t i, const char* what) {
    if (!is_float(in(i).dtype))
      return fail(fmt::format("{} must be a float tensor, is {}", what, type_str(in(i))));
    return true;
  }
  bool integer(size_t i, const char* what) {
    if (in(i).dtype != DType::I32 && in(i).dtype != DType::I64)
      return fail(fmt::format("{} must be i32 or i64, is {}", what, type_str(in(i))));
    return true;
  }
  bool same_dim(const Dim& a, const Dim& b, const std::string& what) {
    if (!(a == b))
      return fail(fmt::format("{}: {} != {}", what, shape_str({a}), shape_str({b})));
    return true;
  }
  bool has_float_attr(const char* a, bool positive) {
    const Attr* v = n_.find_attr(a);
    if (!v || !(std::holds_alternative<double>(*v) || std::holds_alternative<int64_t>(*v)))
      return fail(fmt::format("missing numeric attribute '{}'", a));
    if (positive && n_.attr_float(a) <= 0)
      return fail(fmt::format("attribute '{}' must be positive", a));
    return true;
  }
  bool has_int_attr(const char* a, int64_t lo, int64_t hi) {
    const Attr* v = n_.find_attr(a);
    if (!v || !std::holds_alternative<int64_t>(*v))
      return fail(fmt::format("missing integer attribute '{}'", a));
    int64_t x = std::get<int64_t>(*v);
    if (x < lo || x > hi)
      return fail(fmt::format("attribute '{}' = {} outside [{}, {}]", a, x, lo, hi));
    return true;
  }
  /// rope_yarn's attributes: theta, factor, original_max, beta_fast, beta_slow, truncate.
  bool has_rope_attrs() {
    return has_float_attr("theta", true) && has_float_attr("factor", true) &&
           has_float_attr("original_max", true) && has_float_attr("beta_fast", true) &&
           has_float_attr("beta_slow", true) && has_int_attr("truncate", 0, 1);
  }
  /// Operand i is a linear's bias for weight operand w: rank 1, one value per output row.
  bool bias_of(size_t i, size_t w, const char* what) {
    return rank(i, 1, what) && floaty(i, what) &&
           same_dim(in(i).shape[0], in(w).shape[0], std::string(what) + " width");
  }
  const std::string& error() const { return err_; }

private:
  const Graph& g_;
  const Node& n_;
  std::string err_;
};

inline Type f32(Shape s) {
  return Type{DType::F32, std::move(s)};
}

/// moe_experts' operands 0..6 (also the first seven of moe_experts_residual).
bool infer_moe(Checker& c, std::vector<Type>& out);
/// The fused ops (kFused); false with c's error set when the operands do not fit.
bool infer_fused(Checker& c, const Node& n, std::vector<Type>& out);

} // namespace xserv::ir::detail
