// Tensor shapes: static dimensions and named dynamic ones (T tokens, B sequences, ...).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ir/dtype.h"

namespace xserv::ir {

/// One dimension: a static size, or a named dynamic size bound at run time. Names are
/// identifiers: T (tokens in a step), B (sequences in a step), N (cache rows = max batch),
/// S (cache positions = max sequence).
struct Dim {
  int64_t size = 0; ///< meaningful when name is empty
  std::string name; ///< non-empty for a dynamic dimension

  Dim() = default;
  Dim(int64_t s) : size(s) {} // NOLINT: implicit so shapes read like {T, 64}
  static Dim dynamic(std::string n) {
    Dim d;
    d.name = std::move(n);
    return d;
  }
  bool is_static() const { return name.empty(); }
  bool operator==(const Dim& o) const { return size == o.size && name == o.name; }
};

using Shape = std::vector<Dim>;

/// The type of one SSA value.
struct Type {
  DType dtype = DType::F32;
  Shape shape;
  bool operator==(const Type& o) const { return dtype == o.dtype && shape == o.shape; }
};

/// "bf16[T,2880]".
std::string type_str(const Type& t);
std::string shape_str(const Shape& s);

/// Values of dynamic dimensions, by name.
using DimBindings = std::map<std::string, int64_t>;

/// Resolves a shape to concrete sizes; throws xserv::Error naming an unbound dimension.
std::vector<int64_t> concrete(const Shape& s, const DimBindings& b);

/// Product of static dims times the multiset of dynamic names: two shapes have equal element
/// counts for every binding iff their static products and dynamic name multisets agree.
bool same_numel(const Shape& a, const Shape& b);

} // namespace xserv::ir
