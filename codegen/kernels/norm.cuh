// Standalone RMS norm of fp32 rows (the norms that no fusion folded into a matmul).
#pragma once

#include "xserv_kernels/common.cuh"

namespace xserv_kernels {

/// Threads per block of rms_norm.
constexpr int kNormThreads = 256;

/// rms_norm(x, w) {eps} for row r = blockIdx.y: y[r, i] = x[r, i] rsqrt(mean(x[r]^2) + eps)
/// w[i], the sum of squares in fp32 (as linear_decode's fused norm). x, y fp32 [rows, D];
/// w bf16 [D]. y may alias x.
template <int D>
__device__ __forceinline__ void rms_norm(const float* x, const __nv_bfloat16* __restrict__ w,
                                         float eps, float* y) {
  const int r = blockIdx.y, tid = threadIdx.x;
  const float* xr = x + (size_t)r * D;
  const float inv_rms = block_inv_rms<D, kNormThreads>(xr, eps);
  for (int i = tid; i < D; i += kNormThreads)
    y[(size_t)r * D + i] = xr[i] * inv_rms * bf16_to_float(w[i]);
}

} // namespace xserv_kernels
