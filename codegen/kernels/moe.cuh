// Decode-path mixture of experts on bf16 experts: gate_up + clamped SwiGLU into a small
// [T, k, I] scratch, then down + routing weight + sum over the k experts (+ residual).
#pragma once

#include "xserv_kernels/common.cuh"
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

/// The raw MXFP4 pair (nibble k, nibble k + 4) of word q (k = 0..3) as a bf16x2 worth
/// value * 2^-126 each (nibble k in the low half; +-0.5 lands on the bf16 subnormal 2^-127).
__device__ __forceinline__ unsigned mx4_pair_raw(unsigned q, int k) {
  const unsigned x = q << (12 - 4 * k);
  return (x & 0x80008000u) | ((x >> 6) & 0x01c001c0u);
}

/// d = a b (fresh accumulators) on mma.sync m16n8k16, bf16 operands, fp32 sums; then d += a2 b2.
__device__ __forceinline__ void mx4_mma_pair(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                             unsigned b1, const unsigned (&a2)[4], unsigned b2,
                                             unsigned b3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const float z = 0.0f;
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"
               : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(z));
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a2[0]), "r"(a2[1]), "r"(a2[2]), "r"(a2[3]), "r"(b2), "r"(b3));
#endif
}

/// moe_down_part_mx4 on tensor cores, for plain bf16 activations (ROUND): block (x, tk) computes
/// rows 16 x .. 16 x + 15 of expert e = ids[tk], its 8 warps each over 1/8 of the I / 32 blocks,
/// parts added in warp order. A warp's rows are the A operand of mma.sync m16n8k16: thread
/// (g = lane / 4, c = lane % 4) takes word c of rows g and g + 8 of every 32-value block, whose
/// nibble pairs (k, k + 4) are its A registers as raw bf16 pairs (mx4_pair_raw: 4 instructions
/// a pair, no widening); the token's activations (bf16, times 2^64 as mxfp4_stage_x scales them)
/// are staged once per block in the same K order as B's column 0 (every column holds them).
/// Each block's two MMAs start from zero and the sum takes the block's scale
/// (mxfp4_block_sum_scale), so the arithmetic is moe_down_part_mx4's with the 32 products of a
/// block summed by the tensor cores. NORMALIZE: the raw pairs are first multiplied by 2^64 and
/// the activations staged unscaled (no bf16 subnormal operand), the same products.
/// grid.x = D / 16.
template <int D, int I, int E, int KSEL, bool NORMALIZE = false>
__device__ __forceinline__ void
moe_down_part_mx4_mma(const float* __restrict__ act, const float* __restrict__ weights,
                      const int* __restrict__ ids, const unsigned char* __restrict__ down,
                      const __nv_bfloat16* __restrict__ down_b, float* __restrict__ part) {
  static_assert(D % 16 == 0 && I % 32 == 0, "16-row groups of whole blocks");
  constexpr int kBlocks = I / 32, kWarps = kMoeThreads / kWarp;
  constexpr int kPer = (kBlocks + kWarps - 1) / kWarps; // blocks of a warp's part of I
  __shared__ __align__(16) uint4 xs[kBlocks * 4];       // (block, c): B registers of 2 MMAs
  __shared__ float red[kWarps][16];
  const int tk = blockIdx.y, warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int g = lane / 4, c = lane % 4, r0 = blockIdx.x * 16, e = ids[tk];
  const bool active = e >= 0 && e < E;
  const int b0 = warp * kPer, b1 = b0 + kPer < kBlocks ? b0 + kPer : kBlocks;
  const size_t row = (size_t)(active ? e : 0) * D + r0 + g; // rows row and row + 8
  const unsigned* w0 = reinterpret_cast<const unsigned*>(down + row * (I / 2)) + c;
  const unsigned* w8 = reinterpret_cast<const unsigned*>(down + (row + 8) * (I / 2)) + c;
  const unsigned char* s0 = mxfp4_scales<E * D, I>(down) + row * kBlocks;
  const unsigned char* s8 = s0 + 8 * kBlocks;
  unsigned qa[kPer], qb[kPer], sa[kPer], sb[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) { // every load of the warp's part in flight at once
    const int b = b0 + i;
    const bool live = active && b < b1;
    qa[i] = live ? __ldg(w0 + 4 * b) : 0u;
    qb[i] = live ? __ldg(w8 + 4 * b) : 0u;
    sa[i] = live ? __ldg(s0 + b) : 0u;
    sb[i] = live ? __ldg(s8 + b) : 0u;
  }
  constexpr float kScale = NORMALIZE ? 1.0f : kMx4XScale;
  for (int i = threadIdx.x; i < kBlocks * 4; i += kMoeThreads) {
    const float* xr = act + (size_t)tk * I + 32 * (i / 4) + 8 * (i % 4);
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j)
      v[j] = act_value<true>(xr[j]) * kScale;
    uint4 o;
    o.x = pack_exact_bf16x2(v[0], v[4]);
    o.y = pack_exact_bf16x2(v[1], v[5]);
    o.z = pack_exact_bf16x2(v[2], v[6]);
    o.w = pack_exact_bf16x2(v[3], v[7]);
    xs[i] = o;
  }
  __syncthreads();
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    if (b0 + i >= b1)
      break;
    const uint4 bx = xs[(b0 + i) * 4 + c];
    unsigned a[4] = {mx4_pair_raw(qa[i], 0), mx4_pair_raw(qb[i], 0), mx4_pair_raw(qa[i], 1),
                     mx4_pair_raw(qb[i], 1)};
    unsigned a2[4] = {mx4_pair_raw(qa[i], 2), mx4_pair_raw(qb[i], 2), mx4_pair_raw(qa[i], 3),
                      mx4_pair_raw(qb[i], 3)};
    if (NORMALIZE) {
      constexpr unsigned k64 = 0x5f805f80u; // bf16x2 (2^64, 2^64)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(a[j]) : "r"(a[j]), "r"(k64));
        asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(a2[j]) : "r"(a2[j]), "r"(k64));
      }
    }
    float d[4];
    mx4_mma_pair(d, a, bx.x, bx.y, a2, bx.z, bx.w);
    acc[0] += mxfp4_block_sum_scale(d[0], sa[i]);
    acc[2] += mxfp4_block_sum_scale(d[2], sb[i]);
  }
  if (c == 0) { // column 0: rows g and g + 8
    red[warp][g] = acc[0];
    red[warp][g + 8] = acc[2];
  }
  __syncthreads();
  if (threadIdx.x >= 16 || !active)
    return;
  float sum = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w)
    sum += red[w][threadIdx.x];
  const int o = r0 + threadIdx.x;
  part[(size_t)tk * D + o] = weights[tk] * (sum + bf16_to_float(down_b[(size_t)e * D + o]));
}

} // namespace xserv_kernels
