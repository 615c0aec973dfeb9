// Decode-path mixture of experts on bf16 experts: gate_up + clamped SwiGLU into a small
// [T, k, I] scratch, then down + routing weight + sum over the k experts (+ residual).
#pragma once

#include "xserv_kernels/common.cuh"
#include "xserv_kernels/moe_rows.cuh"
#include "xserv_kernels/mxfp4.cuh"

namespace xserv_kernels {

/// Threads per block of the MoE kernels (8 warps).
constexpr int kMoeThreads = 256;

/// ids[tk] for a kernel that reads it before its grid_dependency_sync (moe_down_part: its weight
/// loads go out while gate_up finishes). The router wrote ids two launches back and has completed
/// by then: this grid starts early only once every gate_up block has passed its own wait on the
/// router. Read from L2 (ld.global.cg), never a stale L1 line.
__device__ __forceinline__ int moe_early_id(const int* ids, int tk) {
  return __ldcg(ids + tk);
}

/// The clamped SwiGLU of one (gate, up) pair, biases added: (clamp(up, -limit, limit) + 1) *
/// gate' * sigmoid(alpha gate'), gate' = min(gate, limit).
__device__ __forceinline__ float moe_swiglu(float gate, float up, float limit, float alpha) {
  gate = fminf(gate, limit);
  up = fminf(fmaxf(up, -limit), limit);
  const float glu = gate / (1.0f + expf(-alpha * gate));
  return (up + 1.0f) * glu;
}

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
    act[r] = moe_swiglu(acc[2 * r][0] + bf16_to_float(b[2 * r]),
                        acc[2 * r + 1][0] + bf16_to_float(b[2 * r + 1]), limit, alpha);
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
  const int o0 = (blockIdx.x * kWarps + warp) * R, e = moe_early_id(ids, tk);
  const bool active = o0 < D && e >= 0 && e < E;
  WarpGemv<I, R, 1, UNROLL> gemv; // the first weight loads fly while act is staged
  if (active)
    gemv.start(down + ((size_t)e * D + o0) * I);
  grid_dependency_sync(); // ... and while gate_up finishes
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
  const int o0 = (blockIdx.x * kWarps + warp) * R, e = moe_early_id(ids, tk);
  const bool active = o0 < D && e >= 0 && e < E;
  const size_t row0 = (size_t)e * D + o0;
  WarpGemvMx4<I, R, UNROLL> gemv;
  if (active)
    gemv.start(down + row0 * (I / 2), mxfp4_scales<E * D, I>(down) + row0 * (I / 32));
  grid_dependency_sync(); // ... and while gate_up finishes
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

/// The K splits of a tensor-core GEMV over `blocks` 32-value blocks: each split's first block
/// is even (Mx4MmaRows' paired scale loads).
__host__ __device__ constexpr int mx4_mma_split_blocks(int blocks, int splits) {
  return ((blocks + splits - 1) / splits + 1) / 2 * 2;
}

/// moe_gate_up_mx4 on tensor cores, for plain bf16 activations: block (x, tk) computes the
/// (gate, up) pairs 8 RG x .. 8 RG x + 8 RG - 1 of expert e = ids[tk] with RG x KS warps: warp
/// (rg, ks) takes the 8 pairs of group rg over the ks-th of KS parts of D (Mx4MmaPick: MMA row
/// g is pair i's gate row 2i, row g + 8 its up row 2i + 1), the parts summed in order through
/// shared memory, then moe_swiglu's epilogue. grid.x = I / (8 RG), block 32 RG KS threads;
/// STAGES > 0: the weights stream through a ring of that many chunks a warp (Mx4MmaTileRows,
/// RG KS STAGES 2 KB of dynamic shared memory, then each warp's scale factors: 64 bytes a block
/// of its K split), else CH blocks at a time into registers.
template <int D, int I, int E, int KSEL, int RG, int KS, int CH, int STAGES = 0, bool CHAIN = false>
__device__ __forceinline__ void
moe_gate_up_mx4_mma(const float* __restrict__ x, const int* __restrict__ ids,
                    const unsigned char* __restrict__ gate_up,
                    const __nv_bfloat16* __restrict__ gate_up_b, float limit, float alpha,
                    float* __restrict__ act) {
  static_assert(I % (8 * RG) == 0 && D % 32 == 0, "whole pair groups, whole blocks");
  constexpr int kThreads = kWarp * RG * KS, kBlocks = D / 32;
  constexpr int kPer = mx4_mma_split_blocks(kBlocks, KS);
  __shared__ __align__(16) uint4 xs[kBlocks * 4];
  extern __shared__ __align__(16) uint4 tiles[]; // STAGES > 0: each warp's ring (dynamic)
  __shared__ float red[KS][RG * 16];
  const int tk = blockIdx.y, t = tk / KSEL, warp = threadIdx.x / kWarp;
  const int rg = warp / KS, ks = warp % KS, g = (threadIdx.x % kWarp) / 4;
  const int e = ids[tk], i0 = (blockIdx.x * RG + rg) * 8; // the warp's first pair
  const bool active = e >= 0 && e < E; // the router never gives an id outside [0, E)
  const int b0 = ks * kPer, b1 = b0 + kPer < kBlocks ? b0 + kPer : kBlocks;
  const size_t row0 = (size_t)(active ? e : 0) * 2 * I + 2 * i0;
  static_assert(!CHAIN || (kBlocks / 2) % KS == 0, "the canonical ranges: whole K tiles each");
  using Rows = Mx4MmaPick<STAGES, D, CH, true, kPer, CHAIN>;
  // The tile path's scale factors, after the rings: the warp's kScaleSlots.
  float4* factors =
      reinterpret_cast<float4*>(tiles + RG * KS * STAGES * 16 * 8) + warp * Rows::kScaleSlots;
  Rows rows; // the first weight loads fly while x is staged
  if (active && b0 < b1)
    rows.start(gate_up, mxfp4_scales<E * 2 * I, D>(gate_up), row0, true, b0, b1,
               tiles + warp * (STAGES * 16 * 8), factors);
  // The epilogue's pair (threads below RG 8): its biases now, not a DRAM round trip at the end.
  const int q = threadIdx.x / 8, p = threadIdx.x % 8, pair = (blockIdx.x * RG + q) * 8 + p;
  const size_t brow = (size_t)e * 2 * I + 2 * pair;
  float bg = 0.0f, bu = 0.0f;
  if (active && threadIdx.x < RG * 8) {
    bg = bf16_to_float(gate_up_b[brow]);
    bu = bf16_to_float(gate_up_b[brow + 1]);
  }
  mx4_stage_for<D, kThreads, CHAIN>(x + (size_t)t * D, xs);
  __syncthreads();
  float gate = 0.0f, up = 0.0f;
  if (active && b0 < b1)
    rows.finish(xs, b0, b1, gate, up);
  if (threadIdx.x % 4 == 0) {
    red[ks][rg * 16 + g] = gate;
    red[ks][rg * 16 + 8 + g] = up;
  }
  __syncthreads();
  if (!active || threadIdx.x >= RG * 8)
    return;
  float sg = red[0][q * 16 + p], su = red[0][q * 16 + 8 + p]; // the K parts in order
#pragma unroll
  for (int s = 1; s < KS; ++s) {
    sg += red[s][q * 16 + p];
    su += red[s][q * 16 + 8 + p];
  }
  act[(size_t)tk * I + pair] = moe_swiglu(sg + bg, su + bu, limit, alpha);
}

/// moe_down_part_mx4 on tensor cores, for plain bf16 activations: block (x, tk) computes rows
/// 16 RG x .. 16 RG x + 16 RG - 1 of expert e = ids[tk] with RG x KS warps: warp (rg, ks) the 16
/// rows of group rg over the ks-th of KS parts of I (Mx4MmaPick, STAGES and CH as
/// moe_gate_up_mx4_mma's), the parts summed in order through shared memory; part[tk, o] =
/// w[tk] (sum + down_b[e][o]). The first weight loads go out before the wait on gate_up (ids
/// from L2, as moe_down_part). grid.x = D / (16 RG), block 32 RG KS threads.
template <int D, int I, int E, int KSEL, int RG, int KS, int CH, int STAGES = 0, bool CHAIN = false>
__device__ __forceinline__ void
moe_down_part_mx4_mma(const float* __restrict__ act, const float* __restrict__ weights,
                      const int* __restrict__ ids, const unsigned char* __restrict__ down,
                      const __nv_bfloat16* __restrict__ down_b, float* __restrict__ part) {
  static_assert(D % (16 * RG) == 0 && I % 32 == 0, "whole row groups, whole blocks");
  constexpr int kThreads = kWarp * RG * KS, kBlocks = I / 32;
  constexpr int kPer = mx4_mma_split_blocks(kBlocks, KS);
  __shared__ __align__(16) uint4 xs[kBlocks * 4];
  extern __shared__ __align__(16) uint4 tiles[]; // STAGES > 0: each warp's ring (dynamic)
  __shared__ float red[KS][RG * 16];
  const int tk = blockIdx.y, warp = threadIdx.x / kWarp;
  const int rg = warp / KS, ks = warp % KS, g = (threadIdx.x % kWarp) / 4;
  const int e = moe_early_id(ids, tk), o0 = (blockIdx.x * RG + rg) * 16;
  const bool active = e >= 0 && e < E;
  const int b0 = ks * kPer, b1 = b0 + kPer < kBlocks ? b0 + kPer : kBlocks;
  const size_t row0 = (size_t)(active ? e : 0) * D + o0;
  static_assert(!CHAIN || (kBlocks / 2) % KS == 0, "the canonical ranges: whole K tiles each");
  using Rows = Mx4MmaPick<STAGES, I, CH, false, kPer, CHAIN>;
  // The tile path's scale factors, after the rings: the warp's kScaleSlots.
  float4* factors =
      reinterpret_cast<float4*>(tiles + RG * KS * STAGES * 16 * 8) + warp * Rows::kScaleSlots;
  Rows rows;
  if (active && b0 < b1)
    rows.start(down, mxfp4_scales<E * D, I>(down), row0, false, b0, b1,
               tiles + warp * (STAGES * 16 * 8), factors);
  // The epilogue's row (threads below RG 16): its bias (a weight) and routing weight (written by
  // the router with ids, so as early as moe_early_id reads them) now, not at the end.
  const int o = blockIdx.x * RG * 16 + threadIdx.x;
  float bias = 0.0f, wt = 0.0f;
  if (active && threadIdx.x < RG * 16) {
    bias = bf16_to_float(down_b[(size_t)e * D + o]);
    wt = __ldcg(weights + tk);
  }
  grid_dependency_sync(); // ... and while gate_up finishes
  mx4_stage_for<I, kThreads, CHAIN>(act + (size_t)tk * I, xs);
  __syncthreads();
  float sa = 0.0f, sb = 0.0f;
  if (active && b0 < b1)
    rows.finish(xs, b0, b1, sa, sb);
  if (threadIdx.x % 4 == 0) {
    red[ks][rg * 16 + g] = sa;
    red[ks][rg * 16 + 8 + g] = sb;
  }
  __syncthreads();
  if (!active || threadIdx.x >= RG * 16)
    return;
  float sum = red[0][threadIdx.x]; // the K parts in order
#pragma unroll
  for (int s = 1; s < KS; ++s)
    sum += red[s][threadIdx.x];
  part[(size_t)tk * D + o] = wt * (sum + bias);
}

} // namespace xserv_kernels
