// The MoE decode kernels of steps of 2 to 8 tokens with an expert a block: the tensor-core
// rows of moe_gate_up_mx4_mma and moe_down_part_mx4_mma (moe.cuh), whose MMAs compute 8
// columns, given the step's tokens as those columns. A block takes one of the experts the step
// routes to and every token that picked it, so each expert's rows are read once a step rather
// than once a (token, slot) pair: 8 tokens x 4 slots on 32 random experts touch ~20 of them.
// Every column is summed as the per-pair kernels sum their one token (MMA columns are
// independent), so a pair's outputs are their bits; with CHAIN in the canonical order
// (Mx4ChainRows), as the per-pair kernels' chains.
#pragma once

#include "xserv_kernels/moe.cuh"

namespace xserv_kernels {

/// The expert of block slot j of a step of `pairs` = tokens x KSEL routed (token, slot) pairs
/// (ids), and the slot by which each token picked it: the step's distinct experts in ascending
/// order, j-th of them, or e = -1 past the last (the block has nothing to do). Computed by every
/// warp on its own (no barrier): lane l holds pair l. Column t (token t) is live when slot(t)
/// >= 0.
template <int E, int KSEL> struct MoeColumns {
  static_assert(KSEL >= 1 && 8 * KSEL <= kWarp, "8 tokens' pairs in one warp's lanes");
  int e = -1;
  unsigned slots = 0; // 4 bits a token: its slot + 1, 0 when it did not pick e

  __device__ __forceinline__ int slot(int t) const { return int((slots >> (4 * t)) & 15u) - 1; }

  __device__ __forceinline__ void find(const int* __restrict__ ids, int pairs, int j) {
    const int lane = threadIdx.x % kWarp;
    const int id = lane < pairs ? __ldcg(ids + lane) : -1;
    const bool valid = id >= 0 && id < E; // the router never gives an id outside [0, E)
    int base = 0;
#pragma unroll
    for (int w = 0; w < (E + 31) / 32; ++w) {
      unsigned m = __reduce_or_sync(0xffffffffu, valid && id / 32 == w ? 1u << (id % 32) : 0u);
      const int n = __popc(m);
      if (e < 0 && j < base + n) {
        for (int i = 0; i < j - base; ++i)
          m &= m - 1; // drop the lower set bits
        e = 32 * w + __ffs(m) - 1;
      }
      base += n;
    }
    const unsigned hit = __ballot_sync(0xffffffffu, valid && id == e);
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      const unsigned bits = (hit >> (t * KSEL)) & ((1u << KSEL) - 1u);
      if (e >= 0 && bits != 0)
        slots |= unsigned(__ffs(bits)) << (4 * t);
    }
  }
};

/// A warp's sums (finish_cols: MMA rows g, g + 8 by columns 2c, 2c + 1) into the block's
/// partials red[K part][column][row of the block's 16 RG].
template <int KS, int RG>
__device__ __forceinline__ void moe_cols_partials(float (&red)[KS][8][RG * 16], int ks, int rg,
                                                  const float (&acc)[4]) {
  const int lane = threadIdx.x % kWarp, g = lane / 4, c = lane % 4;
  red[ks][2 * c][rg * 16 + g] = acc[0];
  red[ks][2 * c + 1][rg * 16 + g] = acc[1];
  red[ks][2 * c][rg * 16 + 8 + g] = acc[2];
  red[ks][2 * c + 1][rg * 16 + 8 + g] = acc[3];
}

/// moe_gate_up_mx4_mma with the step's tokens as the MMA's columns: block (x, j) computes the
/// (gate, up) pairs 8 RG x .. 8 RG x + 8 RG - 1 of the j-th expert the step routes to
/// (MoeColumns) for every token that picked it, and writes act[t KSEL + slot] for each. The
/// tiling, K parts, rounding and epilogue are moe_gate_up_mx4_mma's. grid (I / (8 RG), tokens x
/// KSEL: at least the step's distinct experts), block 32 RG KS threads; dynamic shared memory:
/// the rings and scale factors of moe_gate_up_mx4_mma, then one staged activation row a token
/// (mx4_stage_for: D / 32 x 64 bytes).
template <int D, int I, int E, int KSEL, int RG, int KS, int CH, int STAGES = 0, bool CHAIN = false>
__device__ __forceinline__ void
moe_gate_up_mx4_cols(const float* __restrict__ x, const int* __restrict__ ids,
                     const unsigned char* __restrict__ gate_up,
                     const __nv_bfloat16* __restrict__ gate_up_b, float limit, float alpha,
                     float* __restrict__ act) {
  static_assert(I % (8 * RG) == 0 && D % 32 == 0, "whole pair groups, whole blocks");
  constexpr int kThreads = kWarp * RG * KS, kBlocks = D / 32;
  constexpr int kPer = mx4_mma_split_blocks(kBlocks, KS);
  static_assert(!CHAIN || (kBlocks / 2) % KS == 0, "the canonical ranges: whole K tiles each");
  using Rows = Mx4MmaPick<STAGES, D, CH, true, kPer, CHAIN>;
  extern __shared__ __align__(16) uint4 tiles[]; // rings, factors, then the tokens' rows
  float4* factors = reinterpret_cast<float4*>(tiles + RG * KS * STAGES * 16 * 8) +
                    (threadIdx.x / kWarp) * Rows::kScaleSlots;
  uint4* xs = tiles + RG * KS * (STAGES * 16 * 8 + Rows::kScaleSlots);
  __shared__ float red[KS][8][RG * 16];
  __shared__ float bias[RG * 8][2];
  const int tokens = gridDim.y / KSEL, warp = threadIdx.x / kWarp;
  const int rg = warp / KS, ks = warp % KS, g = (threadIdx.x % kWarp) / 4;
  MoeColumns<E, KSEL> cols;
  cols.find(ids, gridDim.y, blockIdx.y);
  if (cols.e < 0)
    return; // past the step's distinct experts (every warp of the block agrees)
  const int e = cols.e, i0 = (blockIdx.x * RG + rg) * 8;
  const int b0 = ks * kPer, b1 = b0 + kPer < kBlocks ? b0 + kPer : kBlocks;
  Rows rows; // the first weight loads fly while the tokens are staged
  if (b0 < b1)
    rows.start(gate_up, mxfp4_scales<E * 2 * I, D>(gate_up), (size_t)e * 2 * I + 2 * i0, true, b0,
               b1, tiles + warp * (STAGES * 16 * 8), factors);
  if (threadIdx.x < RG * 8) { // the pairs' biases, shared by every column
    const size_t brow = (size_t)e * 2 * I + 2 * (blockIdx.x * RG * 8 + threadIdx.x);
    bias[threadIdx.x][0] = bf16_to_float(gate_up_b[brow]);
    bias[threadIdx.x][1] = bf16_to_float(gate_up_b[brow + 1]);
  }
  for (int t = 0; t < tokens; ++t)
    if (cols.slot(t) >= 0)
      mx4_stage_for<D, kThreads, CHAIN>(x + (size_t)t * D, xs + t * kBlocks * 4);
  __syncthreads();
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (b0 < b1) // column g reads token g's row (a column past the tokens reads token 0's)
    rows.finish_cols(xs + (g < tokens ? g : 0) * kBlocks * 4, b0, b1, acc);
  // acc: pair row g (gate) and g + 8 (up) of the warp's group, columns 2c and 2c + 1
  moe_cols_partials<KS, RG>(red, ks, rg, acc);
  __syncthreads();
  for (int w = threadIdx.x; w < tokens * RG * 8; w += kThreads) {
    const int t = w / (RG * 8), qp = w % (RG * 8), q = qp / 8, p = qp % 8;
    if (cols.slot(t) < 0)
      continue;
    float sg = red[0][t][q * 16 + p], su = red[0][t][q * 16 + 8 + p]; // the K parts in order
#pragma unroll
    for (int s = 1; s < KS; ++s) {
      sg += red[s][t][q * 16 + p];
      su += red[s][t][q * 16 + 8 + p];
    }
    const int tk = t * KSEL + cols.slot(t), pair = blockIdx.x * RG * 8 + qp;
    act[(size_t)tk * I + pair] = moe_swiglu(sg + bias[qp][0], su + bias[qp][1], limit, alpha);
  }
}

/// moe_down_part_mx4_mma with the step's tokens as the MMA's columns: block (x, j) computes rows
/// 16 RG x .. 16 RG x + 16 RG - 1 of the j-th expert the step routes to for every token that
/// picked it (column t: act row t KSEL + slot), part[tk, o] = w[tk] (sum + down_b[e][o]). The
/// first weight loads go out before the wait on gate_up (ids from L2). Launch as
/// moe_gate_up_mx4_cols (grid.x = D / (16 RG); the staged rows are I / 32 x 64 bytes).
template <int D, int I, int E, int KSEL, int RG, int KS, int CH, int STAGES = 0, bool CHAIN = false>
__device__ __forceinline__ void
moe_down_part_mx4_cols(const float* __restrict__ act, const float* __restrict__ weights,
                       const int* __restrict__ ids, const unsigned char* __restrict__ down,
                       const __nv_bfloat16* __restrict__ down_b, float* __restrict__ part) {
  static_assert(D % (16 * RG) == 0 && I % 32 == 0, "whole row groups, whole blocks");
  constexpr int kThreads = kWarp * RG * KS, kBlocks = I / 32;
  constexpr int kPer = mx4_mma_split_blocks(kBlocks, KS);
  static_assert(!CHAIN || (kBlocks / 2) % KS == 0, "the canonical ranges: whole K tiles each");
  using Rows = Mx4MmaPick<STAGES, I, CH, false, kPer, CHAIN>;
  extern __shared__ __align__(16) uint4 tiles[];
  float4* factors = reinterpret_cast<float4*>(tiles + RG * KS * STAGES * 16 * 8) +
                    (threadIdx.x / kWarp) * Rows::kScaleSlots;
  uint4* xs = tiles + RG * KS * (STAGES * 16 * 8 + Rows::kScaleSlots);
  __shared__ float red[KS][8][RG * 16];
  __shared__ float bias[RG * 16];
  const int tokens = gridDim.y / KSEL, warp = threadIdx.x / kWarp;
  const int rg = warp / KS, ks = warp % KS, g = (threadIdx.x % kWarp) / 4;
  MoeColumns<E, KSEL> cols;
  cols.find(ids, gridDim.y, blockIdx.y); // the router's ids, written two kernels before
  if (cols.e < 0)
    return;
  const int e = cols.e, o0 = (blockIdx.x * RG + rg) * 16;
  const int b0 = ks * kPer, b1 = b0 + kPer < kBlocks ? b0 + kPer : kBlocks;
  Rows rows;
  if (b0 < b1)
    rows.start(down, mxfp4_scales<E * D, I>(down), (size_t)e * D + o0, false, b0, b1,
               tiles + warp * (STAGES * 16 * 8), factors);
  if (threadIdx.x < RG * 16)
    bias[threadIdx.x] = bf16_to_float(down_b[(size_t)e * D + blockIdx.x * RG * 16 + threadIdx.x]);
  grid_dependency_sync(); // ... and while gate_up finishes
  for (int t = 0; t < tokens; ++t)
    if (cols.slot(t) >= 0)
      mx4_stage_for<I, kThreads, CHAIN>(act + (size_t)(t * KSEL + cols.slot(t)) * I,
                                        xs + t * kBlocks * 4);
  __syncthreads();
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (b0 < b1)
    rows.finish_cols(xs + (g < tokens ? g : 0) * kBlocks * 4, b0, b1, acc);
  moe_cols_partials<KS, RG>(red, ks, rg, acc);
  __syncthreads();
  for (int w = threadIdx.x; w < tokens * RG * 16; w += kThreads) {
    const int t = w / (RG * 16), r = w % (RG * 16);
    if (cols.slot(t) < 0)
      continue;
    float sum = red[0][t][r]; // the K parts in order
#pragma unroll
    for (int s = 1; s < KS; ++s)
      sum += red[s][t][r];
    const int tk = t * KSEL + cols.slot(t);
    part[(size_t)tk * D + blockIdx.x * RG * 16 + r] = __ldcg(weights + tk) * (sum + bias[r]);
  }
}

} // namespace xserv_kernels
