// Decode-path mixture of experts on bf16 experts: gate_up + clamped SwiGLU into a small
// [T, k, I] scratch, then down + routing weight + sum over the k experts (+ residual).
#pragma once

#include "xserv_kernels/common.cuh"
#include "xserv_kernels/mxfp4.cuh"

namespace xserv_kernels {

/// Threads per block of the MoE kernels (8 warps).
constexpr int kMoeThreads = 256;

/// The end of moe_gate_up for a warp's RI (gate, up) row pairs: lane r < RI adds the biases
/// b[2r], b[2r + 1] to the pair's dot products acc[2r], acc[2r + 1] (on every lane) and stores
/// the clamped SwiGLU into act[r].
template <int I, int RI>
__device__ __forceinline__ void moe_swiglu_store(const float (&acc)[2 * RI][1],
                                                 const __nv_bfloat16* __restrict__ b, float limit,
                                                 float alpha, float* __restrict__ act) {
  const int lane = threadIdx.x % kWarp;
  if (lane >= RI)
    return;
    // Lane r finishes pair r (register arrays are indexed with unrolled constants).
#pragma unroll
  for (int r = 0; r < RI; ++r) {
    if (r != lane)
      continue;
    const float gate = fminf(acc[2 * r][0] + bf16_to_float(b[2 * r]), limit);
    const float up = fminf(fmaxf(acc[2 * r + 1][0] + bf16_to_float(b[2 * r + 1]), -limit), limit);
    const float glu = gate / (1.0f + expf(-alpha * gate));
    act[r] = (up + 1.0f) * glu;
  }
}

/// First half of moe_experts for one (token, selected expert) pair tk = blockIdx.y (token
/// tk / KSEL, slot tk % KSEL): act[tk, i] = (clamp(up, -limit, limit) + 1) * gate' *
/// sigmoid(alpha gate'), gate' = min(gate, limit), where gate and up are rows 2i and 2i+1 of
/// gate_up[e] x + gate_up_b[e], e = ids[tk]. x fp32 [T, D]; gate_up bf16 [E, 2I, D]; gate_up_b
/// bf16 [E, 2I]; act fp32 [T, KSEL, I]. Each warp computes RI consecutive i (2 RI adjacent
/// rows); grid.x = ceil(I / (8 RI)).
template <int D, int I, int E, int KSEL, int RI, int UNROLL = 4, bool PREFETCH = true,
          bool ROUND = false>
__device__ __forceinline__ void
moe_gate_up(const float* __restrict__ x, const int* __restrict__ ids,
            const __nv_bfloat16* __restrict__ gate_up, const __nv_bfloat16* __restrict__ gate_up_b,
            float limit, float alpha, float* __restrict__ act) {
  static_assert(I % RI == 0, "pairs per warp must divide I");
  constexpr int kWarps = kMoeThreads / kWarp;
  __shared__ __align__(16) float xs[D];
  const int tk = blockIdx.y, t = tk / KSEL;
  const int warp = threadIdx.x / kWarp;
  const int e = ids[tk], i0 = (blockIdx.x * kWarps + warp) * RI;
  const size_t row0 = (size_t)e * 2 * I + 2 * i0;
  const bool active = e >= 0 && e < E && i0 < I; // the router never gives an id outside [0, E)
  if (PREFETCH && active)
    warp_prefetch_rows_l2<D, 2 * RI>(gate_up + row0 * D);
  WarpGemv<D, 2 * RI, 1, UNROLL> gemv; // the first weight loads fly while x is staged
  if (active)
    gemv.start(gate_up + row0 * D);
  for (int i = threadIdx.x; i < D; i += kMoeThreads)
    xs[i] = act_value<ROUND>(x[(size_t)t * D + i]);
  __syncthreads();
  if (!active)
    return; // leave act unwritten rather than read out of bounds
  float acc[2 * RI][1];
  gemv.finish(xs, 1, acc);
  moe_swiglu_store<I, RI>(acc, gate_up_b + row0, limit, alpha, act + (size_t)tk * I + i0);
}

/// moe_gate_up on MXFP4 experts (mxfp4.cuh): gate_up holds the [E, 2I, D] blocks then scales.
/// Its sums are grouped by block (WarpGemvMx4): within a rounding per block of moe_gate_up on
/// the BF16 dequantisation.
template <int D, int I, int E, int KSEL, int RI, int UNROLL = 2, bool PREFETCH = true,
          bool ROUND = false>
__device__ __forceinline__ void moe_gate_up_mx4(const float* __restrict__ x,
                                                const int* __restrict__ ids,
                                                const unsigned char* __restrict__ gate_up,
                                                const __nv_bfloat16* __restrict__ gate_up_b,
                                                float limit, float alpha, float* __restrict__ act) {
  static_assert(I % RI == 0, "pairs per warp must divide I");
  constexpr int kWarps = kMoeThreads / kWarp;
  __shared__ __align__(16) float xs[D / 32 * kMx4XStride];
  const int tk = blockIdx.y, t = tk / KSEL;
  const int warp = threadIdx.x / kWarp;
  const int e = ids[tk], i0 = (blockIdx.x * kWarps + warp) * RI;
  const size_t row0 = (size_t)e * 2 * I + 2 * i0;
  const bool active = e >= 0 && e < E && i0 < I;
  const unsigned char* blocks = gate_up + row0 * (D / 2);
  if (PREFETCH && active)
    warp_prefetch_l2(blocks, size_t(2 * RI) * (D / 2));
  WarpGemvMx4<D, 2 * RI, UNROLL> gemv;
  if (active)
    gemv.start(blocks, mxfp4_scales<E * 2 * I, D>(gate_up) + row0 * (D / 32));
  mxfp4_stage_x<D, kMoeThreads, ROUND>(x + (size_t)t * D, xs);
  __syncthreads();
  if (!active)
    return;
  float acc[2 * RI][1];
  gemv.finish(xs, acc);
  moe_swiglu_store<I, RI>(acc, gate_up_b + row0, limit, alpha, act + (size_t)tk * I + i0);
}

/// Second half as one kernel per token (the engine runs moe_down_part + moe_combine, which puts
/// k times the blocks in flight; this one stays as their reference and measured baseline):
/// y[t, o] = (RESIDUAL ? h[t, o] : 0) + sum over slots j of
/// w[t, j] (down[e_j][o] . act[t, j] + down_b[e_j][o]), slots summed in order. down bf16
/// [E, D, I], down_b bf16 [E, D]; token t = blockIdx.y; each warp computes R consecutive o;
/// grid.x = ceil(D / (8 R)). y may alias h.
template <int D, int I, int E, int KSEL, int R, bool RESIDUAL>
__device__ __forceinline__ void
moe_down(const float* __restrict__ act, const float* __restrict__ weights,
         const int* __restrict__ ids, const __nv_bfloat16* __restrict__ down,
         const __nv_bfloat16* __restrict__ down_b, const float* h, float* y) {
  static_assert(D % R == 0, "rows per warp must divide D");
  constexpr int kWarps = kMoeThreads / kWarp;
  __shared__ __align__(16) float as[I];
  const int t = blockIdx.y, lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int o0 = (blockIdx.x * kWarps + warp) * R;
  if (o0 < D)
    for (int j = 0; j < KSEL; ++j) {
      const int e = ids[t * KSEL + j];
      if (e >= 0 && e < E)
        warp_prefetch_rows_l2<I, R>(down + ((size_t)e * D + o0) * I);
    }
  float total[R];
#pragma unroll
  for (int r = 0; r < R; ++r)
    total[r] = 0.0f;
  for (int j = 0; j < KSEL; ++j) {
    __syncthreads(); // the previous slot's activations are consumed
    for (int i = threadIdx.x; i < I; i += kMoeThreads)
      as[i] = act[((size_t)t * KSEL + j) * I + i];
    __syncthreads();
    const int e = ids[t * KSEL + j];
    if (o0 >= D || e < 0 || e >= E)
      continue;
    const float wt = weights[t * KSEL + j];
    float acc[R][1];
    warp_gemv_rows<I, R, 1>(down + ((size_t)e * D + o0) * I, as, 1, acc);
#pragma unroll
    for (int r = 0; r < R; ++r)
      total[r] += wt * (acc[r][0] + bf16_to_float(down_b[(size_t)e * D + o0 + r]));
  }
  if (o0 >= D || lane != 0)
    return;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const size_t o = (size_t)t * D + o0 + r;
    y[o] = (RESIDUAL ? h[o] : 0.0f) + total[r];
  }
}

/// moe_down for one (token, slot) pair tk = blockIdx.y (token tk / KSEL, slot tk % KSEL):
/// part[tk, o] = w[tk] (down[e][o] . act[tk] + down_b[e][o]), e = ids[tk]; moe_combine then sums
/// the slots in order (+ residual), the same arithmetic as moe_down with KSEL times the blocks in
/// flight. grid.x = ceil(D / (8 R)).
template <int D, int I, int E, int KSEL, int R, int UNROLL = 4, bool ROUND = false>
__device__ __forceinline__ void
moe_down_part(const float* __restrict__ act, const float* __restrict__ weights,
              const int* __restrict__ ids, const __nv_bfloat16* __restrict__ down,
              const __nv_bfloat16* __restrict__ down_b, float* __restrict__ part) {
  static_assert(D % R == 0, "rows per warp must divide D");
  constexpr int kWarps = kMoeThreads / kWarp;
  __shared__ __align__(16) float as[I];
  const int tk = blockIdx.y, lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int o0 = (blockIdx.x * kWarps + warp) * R, e = ids[tk];
  const bool active = o0 < D && e >= 0 && e < E;
  WarpGemv<I, R, 1, UNROLL> gemv; // the first weight loads fly while act is staged
  if (active)
    gemv.start(down + ((size_t)e * D + o0) * I);
  for (int i = threadIdx.x; i < I; i += kMoeThreads)
    as[i] = act_value<ROUND>(act[(size_t)tk * I + i]);
  __syncthreads();
  if (!active)
    return;
  float acc[R][1];
  gemv.finish(as, 1, acc);
  if (lane != 0)
    return;
  const float wt = weights[tk];
#pragma unroll
  for (int r = 0; r < R; ++r)
    part[(size_t)tk * D + o0 + r] =
        wt * (acc[r][0] + bf16_to_float(down_b[(size_t)e * D + o0 + r]));
}

/// moe_down_part on MXFP4 experts (mxfp4.cuh): down holds the [E, D, I] blocks then scales.
/// Within a rounding per block of moe_down_part on the BF16 dequantisation (WarpGemvMx4).
template <int D, int I, int E, int KSEL, int R, int UNROLL = 2, bool ROUND = false>
__device__ __forceinline__ void
moe_down_part_mx4(const float* __restrict__ act, const float* __restrict__ weights,
                  const int* __restrict__ ids, const unsigned char* __restrict__ down,
                  const __nv_bfloat16* __restrict__ down_b, float* __restrict__ part) {
  static_assert(D % R == 0, "rows per warp must divide D");
  constexpr int kWarps = kMoeThreads / kWarp;
  __shared__ __align__(16) float as[I / 32 * kMx4XStride];
  const int tk = blockIdx.y, lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int o0 = (blockIdx.x * kWarps + warp) * R, e = ids[tk];
  const bool active = o0 < D && e >= 0 && e < E;
  const size_t row0 = (size_t)e * D + o0;
  WarpGemvMx4<I, R, UNROLL> gemv;
  if (active)
    gemv.start(down + row0 * (I / 2), mxfp4_scales<E * D, I>(down) + row0 * (I / 32));
  mxfp4_stage_x<I, kMoeThreads, ROUND>(act + (size_t)tk * I, as);
  __syncthreads();
  if (!active)
    return;
  float acc[R][1];
  gemv.finish(as, acc);
  if (lane != 0)
    return;
  const float wt = weights[tk];
#pragma unroll
  for (int r = 0; r < R; ++r)
    part[(size_t)tk * D + o0 + r] = wt * (acc[r][0] + bf16_to_float(down_b[row0 + r]));
}

} // namespace xserv_kernels
