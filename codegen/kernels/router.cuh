// Router top-k with the softmax over the k selected logits (MoE routing of one token).
#pragma once

#include "xserv_kernels/common.cuh"

namespace xserv_kernels {

/// The KSEL largest of one token's E logits r[0..E) in descending order, ties to the lower
/// index, into ids[0..KSEL), and weights[j] = exp(l_j - l_0) / sum_i exp(l_i - l_0) over the
/// selected. One thread.
template <int E, int KSEL>
__device__ __forceinline__ void topk_softmax(const float* r, float* __restrict__ weights,
                                             int* __restrict__ ids) {
  static_assert(KSEL <= E, "cannot select more experts than exist");
  int pick[KSEL];
  float val[KSEL];
  for (int j = 0; j < KSEL; ++j) {
    int best = -1;
    float bv = 0.0f;
    for (int e = 0; e < E; ++e) {
      bool taken = false;
      for (int i = 0; i < j; ++i)
        taken = taken || pick[i] == e;
      if (!taken && (best < 0 || r[e] > bv)) { // strict: an equal later value loses
        best = e;
        bv = r[e];
      }
    }
    pick[j] = best;
    val[j] = bv;
  }
  float sum = 0.0f;
  for (int j = 0; j < KSEL; ++j)
    sum += expf(val[j] - val[0]);
  for (int j = 0; j < KSEL; ++j) {
    ids[j] = pick[j];
    weights[j] = expf(val[j] - val[0]) / sum;
  }
}

/// router_topk(logits) {k = KSEL} for token t = blockIdx.y, computed by thread 0 (E is small):
/// topk_softmax of logits[t, :] into weights[t, :] and ids[t, :]. logits fp32 [T, E]; weights
/// fp32 [T, KSEL]; ids int [T, KSEL].
template <int E, int KSEL>
__device__ __forceinline__ void router_topk(const float* __restrict__ logits,
                                            float* __restrict__ weights, int* __restrict__ ids) {
  if (threadIdx.x != 0)
    return;
  const int t = blockIdx.y;
  topk_softmax<E, KSEL>(logits + (size_t)t * E, weights + (size_t)t * KSEL, ids + (size_t)t * KSEL);
}

/// The MoE's routing of a decode step in one launch, for token t = blockIdx.y (256 threads):
/// xn[t] = rms_norm(x[t], ln, eps) (written for the experts), the router's E logits
/// W xn[t] + b by warps of 2 rows each, then topk_softmax into weights[t] and ids[t].
/// The same arithmetic as rms_norm, the router's linear_decode and router_topk one after the
/// other, so the results are bitwise theirs. x, xn fp32 [T, D]; ln bf16 [D]; w bf16 [E, D];
/// b bf16 [E] (nullptr: none).
/// grid.x = C: with clusters (sm_90) the C blocks of a token form one cluster, each normalises
/// x (cheap) and computes E / C of the logits, so the router's rows stream through C SMs; block
/// 0 gathers the logits from the others' shared memory and picks. Without clusters block 0 does
/// everything and the others return.
template <int D, int E, int KSEL, bool BIAS, int C>
__device__ __forceinline__ void
norm_router_topk(const float* __restrict__ x, const __nv_bfloat16* __restrict__ ln, float eps,
                 const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* __restrict__ b,
                 float* __restrict__ xn, float* __restrict__ weights, int* __restrict__ ids) {
  constexpr int kThreads = 256, kWarps = kThreads / kWarp, kRows = 2;
  static_assert(E % (kRows * C) == 0, "each block of the cluster takes whole pairs of experts");
  static_assert(D % 4 == 0, "rows of whole float4s");
  static_assert(E <= kThreads, "block 0 gathers one logit per thread");
#if XSERV_HAS_CLUSTERS
  constexpr int kBlockRows = E / C;
  const unsigned rank = blockIdx.x;
#else
  constexpr int kBlockRows = E;
  const unsigned rank = 0;
  if (blockIdx.x != 0)
    return;
#endif
  __shared__ __align__(16) float xs[D];
  __shared__ float logits[E]; // this block's kBlockRows, then (block 0) all E
  const int t = blockIdx.y, warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const float* xr = x + (size_t)t * D;
  const float inv = block_inv_rms<D, kThreads>(xr, eps);
  for (int i = threadIdx.x; i < D; i += kThreads) {
    const float v = xr[i] * inv * bf16_to_float(ln[i]);
    xs[i] = v;
    if (rank == 0)
      xn[(size_t)t * D + i] = v;
  }
  __syncthreads();
  const int first = rank * kBlockRows;
  for (int r0 = warp * kRows; r0 < kBlockRows; r0 += kWarps * kRows) {
    WarpGemv<D, kRows, 1> gemv;
    gemv.start(w + (size_t)(first + r0) * D);
    float acc[kRows][1];
    gemv.finish(xs, 1, acc);
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        logits[r0 + r] =
            BIAS ? acc[r][0] + bf16_to_float(b[first + r0 + r]) : acc[r][0];
  }
#if XSERV_HAS_CLUSTERS
  if (C > 1) {
    cluster_sync(); // every block's logits written
    float mine = 0.0f;
    if (rank == 0 && threadIdx.x < E)
      mine = cluster_load(&logits[threadIdx.x % kBlockRows], threadIdx.x / kBlockRows);
    cluster_sync(); // read before any block exits or block 0 overwrites its own
    if (rank != 0)
      return;
    if (threadIdx.x < E)
      logits[threadIdx.x] = mine;
  }
#endif
  __syncthreads();
  if (threadIdx.x == 0)
    topk_softmax<E, KSEL>(logits, weights + (size_t)t * KSEL, ids + (size_t)t * KSEL);
}

} // namespace xserv_kernels
