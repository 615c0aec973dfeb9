// DType names and sizes, shape printing and resolution.
#include <algorithm>

#include <fmt/format.h>

#include "base/error.h"
#include "ir/shape.h"

namespace xserv::ir {

namespace {
struct DTypeRow {
  DType t;
  std::string_view name;
  uint64_t bytes; // per element; 0 for MXFP4 (see storage_bytes)
};
constexpr DTypeRow kDTypes[] = {
    {DType::BF16, "bf16", 2},   {DType::F16, "f16", 2}, {DType::F32, "f32", 4},
    {DType::I32, "i32", 4},     {DType::I64, "i64", 8}, {DType::U8, "u8", 1},
    {DType::MXFP4, "mxfp4", 0},
};
} // namespace

std::string_view dtype_name(DType t) {
  for (const auto& r : kDTypes)
    if (r.t == t)
      return r.name;
  return "?";
}

std::optional<DType> parse_dtype(std::string_view s) {
  for (const auto& r : kDTypes)
    if (r.name == s)
      return r.t;
  return std::nullopt;
}

uint64_t storage_bytes(DType t, uint64_t numel) {
  if (t == DType::MXFP4) {
    XSERV_CHECK(numel % 32 == 0, "mxfp4 tensors hold whole blocks of 32 values");
    return numel / 32 * 17;
  }
  for (const auto& r : kDTypes)
    if (r.t == t)
      return numel * r.bytes;
  return 0;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i)
      out += ',';
    out += s[i].is_static() ? std::to_string(s[i].size) : s[i].name;
  }
  return out + "]";
}

std::string type_str(const Type& t) {
  return std::string(dtype_name(t.dtype)) + shape_str(t.shape);
}

std::vector<int64_t> concrete(const Shape& s, const DimBindings& b) {
  std::vector<int64_t> out;
  out.reserve(s.size());
  for (const auto& d : s) {
    if (d.is_static()) {
      out.push_back(d.size);
      continue;
    }
    auto it = b.find(d.name);
    if (it == b.end())
      throw Error(fmt::format("dynamic dimension '{}' has no value bound", d.name));
    out.push_back(it->second);
  }
  return out;
}

bool same_numel(const Shape& a, const Shape& b) {
  auto split = [](const Shape& s, int64_t& prod, std::vector<std::string>& names) {
    prod = 1;
    for (const auto& d : s) {
      if (d.is_static())
        prod *= d.size;
      else
        names.push_back(d.name);
    }
    std::sort(names.begin(), names.end());
  };
  int64_t pa, pb;
  std::vector<std::string> na, nb;
  split(a, pa, na);
  split(b, pb, nb);
  return pa == pb && na == nb;
}

} // namespace xserv::ir
