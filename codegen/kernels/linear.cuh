// Decode-path matrix-vector kernel: y = (h +) W rms_norm(x) + b for a few tokens (T <= MAX_T).
#pragma once

#include "xserv_kernels/common.cuh"

namespace xserv_kernels {

/// Threads per block of linear_decode: 8 warps.
constexpr int kLinearThreads = 256;

/// y[t, n] = (RESIDUAL ? h[t, n] : 0) + sum_k W[n, k] xn[t, k] + (BIAS ? b[n] : 0), where
/// xn = NORM ? rms_norm(x, ln, eps) : x. x, h, y are fp32 [tokens, K] / [tokens, N]; W [N, K],
/// ln [K] and b [N] are bf16. Each block stages xn for all tokens in dynamic shared memory
/// (tokens * K floats) and its warps compute R consecutive rows each; grid.x = ceil(N / (8 R)).
/// Requires tokens <= MAX_T, blockDim.x == kLinearThreads. y may alias h.
template <int K, int N, int MAX_T, int R, bool NORM, bool BIAS, bool RESIDUAL>
__device__ __forceinline__ void
linear_decode(const float* __restrict__ x, const __nv_bfloat16* __restrict__ ln, float eps,
              const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* __restrict__ b,
              const float* h, float* y, int tokens) {
  static_assert(N % R == 0, "rows per warp must divide N");
  static_assert(K % 8 == 0, "K must be a multiple of 8");
  constexpr int kWarps = kLinearThreads / kWarp;
  extern __shared__ float4 smem_linear[];
  float* xs = reinterpret_cast<float*>(smem_linear);
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int row = (blockIdx.x * kWarps + warp) * R;
  if (row < N)
    warp_prefetch_rows_l2<K, R>(w + (size_t)row * K);

  // Prologue: stage x (and its sum of squares per token) in shared memory.
  __shared__ float partial[kWarps][MAX_T];
  __shared__ float inv_rms[MAX_T];
  for (int t = 0; t < tokens; ++t) {
    float ss = 0.0f;
    for (int i = tid; i < K / 4; i += kLinearThreads) {
      const float4 v = reinterpret_cast<const float4*>(x + (size_t)t * K)[i];
      reinterpret_cast<float4*>(xs + t * K)[i] = v;
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    if (NORM) {
      ss = warp_sum(ss);
      if (lane == 0)
        partial[warp][t] = ss;
    }
  }
  if (NORM) {
    __syncthreads();
    if (tid < tokens) {
      float ss = 0.0f;
      for (int i = 0; i < kWarps; ++i)
        ss += partial[i][tid];
      inv_rms[tid] = rsqrtf(ss / K + eps);
    }
    __syncthreads();
    for (int t = 0; t < tokens; ++t)
      for (int i = tid; i < K; i += kLinearThreads)
        xs[t * K + i] = xs[t * K + i] * inv_rms[t] * bf16_to_float(ln[i]);
  }
  __syncthreads();

  // Main loop: each warp owns R consecutive output rows.
  if (row >= N)
    return;
  float acc[R][MAX_T];
  warp_gemv_rows<K, R, MAX_T>(w + (size_t)row * K, xs, tokens, acc);

  // Epilogue: bias and residual, lane t of the warp writes token t's values.
#pragma unroll
  for (int t = 0; t < MAX_T; ++t) {
    if (t >= tokens || lane != t)
      continue;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float v = acc[r][t];
      if (BIAS)
        v += bf16_to_float(b[row + r]);
      if (RESIDUAL)
        v += h[(size_t)t * N + row + r];
      y[(size_t)t * N + row + r] = v;
    }
  }
}

} // namespace xserv_kernels
