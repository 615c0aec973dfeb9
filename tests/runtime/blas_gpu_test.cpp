// runtime::Blas, the launch table's library gemm (cuBLAS), against ir::ref on bf16 inputs.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "ir/reference.h"
#include "models/bf16.h"
#include "runtime/blas.h"
#include "runtime/device.h"
#include "tests/test_util.h"

namespace {

/// Device memory holding `v`.
template <typename T> void* upload(const std::vector<T>& v) {
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, v.size() * sizeof(T)) == cudaSuccess);
  REQUIRE(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  return p;
}

/// Uniform values in [-scale, scale) rounded to bf16: the bits and the values ref sees.
void random_bf16(uint64_t seed, size_t n, float scale, std::vector<uint16_t>& bits,
                 xserv::ir::Tensor& t) {
  bits.resize(n);
  for (size_t i = 0; i < n; ++i) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    const float u = float(seed >> 40) / float(1 << 24) * 2.0f - 1.0f;
    bits[i] = xserv::models::float_to_bf16(u * scale);
    t.f[i] = xserv::models::bf16_to_float(bits[i]);
  }
}

} // namespace

// x and w are bf16 values, which ref gets exactly as floats; ref sums in double, cuBLAS in fp32
// (CUBLAS_COMPUTE_32F: no TF32 or reduced-precision reductions): the difference is fp32
// summation over K <= 4096 terms, ~1e-6 relative; 1e-5 fails a wrong layout or transpose
// (errors of order 1).
TEST_CASE("gpu: the library gemm (cuBLAS) is x w^T, accumulating when asked") {
  const xserv::runtime::DeviceInfo dev = xserv::runtime::probe_device();
  if (!dev.available) {
    MESSAGE("skipped: no GPU (" << dev.reason << ")");
    return;
  }
  xserv::runtime::Blas blas;
  struct Shape {
    int rows, k, n;
    bool accumulate;
  };
  for (const Shape s : {Shape{65, 64, 32, false}, Shape{100, 2880, 4096, false},
                        Shape{513, 4096, 2880, true}, Shape{2048, 2880, 512, false}}) {
    CAPTURE(s.rows);
    CAPTURE(s.n);
    using xserv::ir::DType;
    using xserv::ir::Tensor;
    Tensor x = Tensor::zeros(DType::F32, {s.rows, s.k}), w = Tensor::zeros(DType::F32, {s.n, s.k});
    std::vector<uint16_t> xb, wb;
    random_bf16(11 + uint64_t(s.rows), x.f.size(), 2.0f, xb, x);
    random_bf16(23 + uint64_t(s.n), w.f.size(), 1.0f / std::sqrt(float(s.k)), wb, w);
    Tensor h = Tensor::zeros(DType::F32, {s.rows, s.n});
    for (size_t i = 0; i < h.f.size(); ++i)
      h.f[i] = float(i % 7) - 3.0f;
    Tensor want = xserv::ir::ref::linear(x, w, nullptr);
    if (s.accumulate)
      want = xserv::ir::ref::add(h, want);
    void *dx = upload(xb), *dw = upload(wb), *dy = upload(h.f);
    blas.gemm_bf16(nullptr, s.n, s.k, s.rows, s.accumulate, dx, dw, dy);
    std::vector<float> got(want.f.size());
    REQUIRE(cudaMemcpy(got.data(), dy, got.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    for (void* p : {dx, dw, dy})
      cudaFree(p);
    const double err = xserv::testing::rel_l2(got, want.f);
    MESSAGE(fmt::format("library gemm {} rows x {} -> {}{}: rel L2 {:.3g}", s.rows, s.k, s.n,
                        s.accumulate ? " (+ y)" : "", err));
    CHECK(err <= 1e-5);
  }
}
