// Host tensors for the CPU reference interpreter: fp32 for float types, int32 for integers.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/dtype.h"

namespace xserv::ir {

/// A dense row-major host tensor. Float element types (bf16, f32, mxfp4) are held as fp32
/// values, unrounded: the interpreter is the fp32 reference. Integer types are held as int32.
struct Tensor {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<float> f;   ///< float data (is_float(dtype))
  std::vector<int32_t> i; ///< integer data

  static Tensor zeros(DType dt, std::vector<int64_t> shape);
  static Tensor from_floats(std::vector<int64_t> shape, std::vector<float> data);
  static Tensor from_ints(std::vector<int64_t> shape, std::vector<int32_t> data);

  int64_t numel() const;
  int64_t dim(size_t k) const { return shape.at(k); }
  bool is_int() const { return !is_float(dtype); }
};

} // namespace xserv::ir
