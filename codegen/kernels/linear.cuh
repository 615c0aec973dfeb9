// Decode-path matrix-vector kernel: y = (h +) W rms_norm(x) + b for a few tokens (T <= MAX_T).
#pragma once

#include "xserv_kernels/common.cuh"

namespace xserv_kernels {

/// Threads per block of linear_decode: 8 warps.
constexpr int kLinearThreads = 256;

/// Stages x [tokens, K] in shared memory xs, as rms_norm(x, ln, eps) when NORM (sum of squares
/// in fp32 per token), ending with a barrier. 256 threads.
template <int K, int MAX_T, bool NORM>
__device__ __forceinline__ void linear_stage_x(const float* __restrict__ x,
                                               const __nv_bfloat16* __restrict__ ln, float eps,
                                               float* xs, int tokens) {
  constexpr int kWarps = kLinearThreads / kWarp;
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
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
}

/// Epilogue of a decode GEMV: lane t of the warp writes token t's R rows row.. of y [tokens, N],
/// plus bias and residual.
template <int N, int MAX_T, int R, bool BIAS, bool RESIDUAL>
__device__ __forceinline__ void linear_store(const float (&acc)[R][MAX_T],
                                             const __nv_bfloat16* __restrict__ b, const float* h,
                                             float* y, int row, int tokens) {
  const int lane = threadIdx.x % kWarp;
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

/// y[t, n] = (RESIDUAL ? h[t, n] : 0) + sum_k W[n, k] xn[t, k] + (BIAS ? b[n] : 0), where
/// xn = NORM ? rms_norm(x, ln, eps) : x. x, h, y are fp32 [tokens, K] / [tokens, N]; W [N, K],
/// ln [K] and b [N] are bf16. Each block stages xn for all tokens in dynamic shared memory
/// (tokens * K floats) and its warps compute R consecutive rows each; grid.x = ceil(N / (8 R)).
/// With PREFETCH each warp first asks L2 for its rows. Requires tokens <= MAX_T, blockDim.x ==
/// kLinearThreads. y may alias h.
template <int K, int N, int MAX_T, int R, bool NORM, bool BIAS, bool RESIDUAL, bool PREFETCH = true,
          int UNROLL = 4>
__device__ __forceinline__ void
linear_decode(const float* __restrict__ x, const __nv_bfloat16* __restrict__ ln, float eps,
              const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* __restrict__ b,
              const float* h, float* y, int tokens) {
  static_assert(N % R == 0, "rows per warp must divide N");
  static_assert(K % 8 == 0, "K must be a multiple of 8");
  constexpr int kWarps = kLinearThreads / kWarp;
  extern __shared__ float4 smem_linear[];
  float* xs = reinterpret_cast<float*>(smem_linear);
  const int warp = threadIdx.x / kWarp;
  const int row = (blockIdx.x * kWarps + warp) * R;
  if (PREFETCH && row < N)
    warp_prefetch_rows_l2<K, R>(w + (size_t)row * K);
  // Each warp owns R consecutive output rows; their first loads fly during the prologue.
  WarpGemv<K, R, MAX_T, UNROLL> gemv;
  if (row < N)
    gemv.start(w + (size_t)row * K);

  linear_stage_x<K, MAX_T, NORM>(x, ln, eps, xs, tokens);

  if (row >= N)
    return;
  float acc[R][MAX_T];
  gemv.finish(xs, tokens, acc);

  linear_store<N, MAX_T, R, BIAS, RESIDUAL>(acc, b, h, y, row, tokens);
}

/// q, k and v of a decode step in one launch: rows [0, NQ) of the concatenated output are
/// y_q = Wq xn + bq, the next NK y_k, the last NV y_v, xn = rms_norm(x, ln, eps) staged once per
/// block. Each block's 8 warps x R rows lie in one projection (NQ and NK multiples of 8 R);
/// grid.x = (NQ + NK + NV) / (8 R). Shapes as linear_decode.
template <int K, int NQ, int NK, int NV, int MAX_T, int R, int UNROLL = 4>
__device__ __forceinline__ void
qkv_decode(const float* __restrict__ x, const __nv_bfloat16* __restrict__ ln, float eps,
           const __nv_bfloat16* __restrict__ wq, const __nv_bfloat16* __restrict__ bq,
           const __nv_bfloat16* __restrict__ wk, const __nv_bfloat16* __restrict__ bk,
           const __nv_bfloat16* __restrict__ wv, const __nv_bfloat16* __restrict__ bv,
           float* __restrict__ yq, float* __restrict__ yk, float* __restrict__ yv, int tokens) {
  constexpr int kWarps = kLinearThreads / kWarp, kRows = kWarps * R;
  static_assert(NQ % kRows == 0 && NK % kRows == 0 && NV % kRows == 0,
                "a block's rows must lie in one projection");
  extern __shared__ float4 smem_linear[];
  float* xs = reinterpret_cast<float*>(smem_linear);
  const int warp = threadIdx.x / kWarp;
  int row = blockIdx.x * kRows; // in the concatenated rows, then within the projection
  const __nv_bfloat16 *w = wq, *b = bq;
  float* y = yq;
  int n = NQ;
  if (row >= NQ + NK) {
    row -= NQ + NK, w = wv, b = bv, y = yv, n = NV;
  } else if (row >= NQ) {
    row -= NQ, w = wk, b = bk, y = yk, n = NK;
  }
  row += warp * R;
  WarpGemv<K, R, MAX_T, UNROLL> gemv; // the first weight loads fly during the norm prologue
  gemv.start(w + (size_t)row * K);
  linear_stage_x<K, MAX_T, true>(x, ln, eps, xs, tokens);
  float acc[R][MAX_T];
  gemv.finish(xs, tokens, acc);
  // n is NQ, NK or NV: the store's row stride.
  if (n == NQ)
    linear_store<NQ, MAX_T, R, true, false>(acc, b, nullptr, y, row, tokens);
  else if (n == NK)
    linear_store<NK, MAX_T, R, true, false>(acc, b, nullptr, y, row, tokens);
  else
    linear_store<NV, MAX_T, R, true, false>(acc, b, nullptr, y, row, tokens);
}

} // namespace xserv_kernels
