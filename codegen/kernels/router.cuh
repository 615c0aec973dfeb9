// Router top-k with the softmax over the k selected logits (MoE routing of one token).
#pragma once

#include "xserv_kernels/common.cuh"

namespace xserv_kernels {

/// ids[j] = pick[j] and weights[j] = exp(val[j] - val[0]) / sum_i exp(val[i] - val[0]): the
/// routing softmax over the picked logits (val[0] the largest), in the order the picks came.
template <int KSEL>
__device__ __forceinline__ void softmax_of_picks(const float (&val)[KSEL], const int (&pick)[KSEL],
                                                 float* __restrict__ weights,
                                                 int* __restrict__ ids) {
  float sum = 0.0f;
  for (int j = 0; j < KSEL; ++j)
    sum += expf(val[j] - val[0]);
  for (int j = 0; j < KSEL; ++j) {
    ids[j] = pick[j];
    weights[j] = expf(val[j] - val[0]) / sum;
  }
}

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
  softmax_of_picks<KSEL>(val, pick, weights, ids);
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

/// topk_softmax by one warp (lanes take logits lane, lane + 32, ...): KSEL rounds of a warp
/// arg-max, ties to the lower index, then lane 0 the softmax as topk_softmax does it, so the
/// picks and weights are topk_softmax's for every input without NaNs (a NaN logit counts as
/// -infinity here).
template <int E, int KSEL>
__device__ __forceinline__ void warp_topk_softmax(const float* r, float* __restrict__ weights,
                                                  int* __restrict__ ids) {
  static_assert(KSEL <= E, "cannot select more experts than exist");
  constexpr int kPer = (E + kWarp - 1) / kWarp;
  const int lane = threadIdx.x % kWarp;
  float v[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + i * kWarp;
    v[i] = e < E && r[e] == r[e] ? r[e] : neg_inf();
  }
  unsigned taken = 0; // bit i: v[i] already picked
  float val[KSEL];
  int pick[KSEL];
#pragma unroll
  for (int j = 0; j < KSEL; ++j) {
    float bv = neg_inf();
    int be = E; // past every index: loses ties to any real one
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int e = lane + i * kWarp;
      if (e < E && !(taken >> i & 1) && (v[i] > bv || (v[i] == bv && e < be))) {
        bv = v[i];
        be = e;
      }
    }
#pragma unroll
    for (int off = kWarp / 2; off > 0; off /= 2) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
      const int oe = __shfl_xor_sync(0xffffffffu, be, off);
      if (ov > bv || (ov == bv && oe < be)) {
        bv = ov;
        be = oe;
      }
    }
    if (be % kWarp == lane)
      taken |= 1u << (be / kWarp);
    val[j] = bv;
    pick[j] = be;
  }
  if (lane != 0)
    return;
  softmax_of_picks<KSEL>(val, pick, weights, ids);
}

/// The end of a gather into block 0's shared memory by the C blocks of a cluster (cluster
/// stores, or a block's own stores when C is 1 or there are no clusters): a barrier over the
/// cluster (or the block); true for block 0, which goes on with what was gathered.
template <int C> __device__ __forceinline__ bool gathered_in_block0(unsigned rank) {
#if XSERV_HAS_CLUSTERS
  if (C > 1) {
    cluster_sync();
    return rank == 0;
  }
#endif
  __syncthreads();
  return rank == 0;
}

/// The routing kernels' norm of token t (THREADS threads, every one calls it): this thread's
/// gains of ln (before the dependency wait, as the weights), the wait, then v = rms_norm(x[t],
/// ln, eps) as rms_norm computes it (block_inv_rms over 256 threads), put(i, v) for each value
/// and, when write_xn, xn[t, i] = v; ends with a barrier.
template <int D, int THREADS, class Put>
__device__ __forceinline__ void
router_norm_row(const float* __restrict__ x, const __nv_bfloat16* __restrict__ ln, float eps,
                float* __restrict__ xn, bool write_xn, int t, Put put) {
  constexpr int kPer = (D + THREADS - 1) / THREADS; // elements of x a thread normalises
  float gain[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + j * THREADS;
    gain[j] = i < D ? bf16_to_float(ln[i]) : 0.0f;
  }
  grid_dependency_sync();
  const float* xr = x + (size_t)t * D;
  const float inv = block_inv_rms<D, THREADS, true>(xr, eps);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + j * THREADS;
    if (i >= D)
      break;
    const float v = xr[i] * inv * gain[j];
    put(i, v);
    if (write_xn)
      xn[(size_t)t * D + i] = v;
  }
  __syncthreads();
}

/// The MoE's routing of a decode step in one launch, for token t = blockIdx.y (256 threads):
/// xn[t] = rms_norm(x[t], ln, eps) (written for the experts), the router's E logits
/// W xn[t] + b, then the top KSEL and their softmax into weights[t] and ids[t]. Each pair of
/// logit rows is summed by KS warps, each over 1/KS of D, parts added in order (when the block's
/// pairs times KS fit its 8 warps, else whole rows): the arithmetic of rms_norm, linear_decode
/// with the same K splits and router_topk one after the other, so on sm_90 the results are
/// bitwise theirs. x, xn fp32 [T, D]; ln bf16 [D]; w bf16 [E, D]; b bf16 [E]
/// (nullptr: none).
/// grid.x = C: with clusters (sm_90) the C blocks of a token form one cluster, each normalises
/// x (cheap) and computes E / C of the logits, so the router's rows stream through C SMs in one
/// round of loads; each block stores its logits straight into block 0's shared memory (the
/// blocks have all started: a relaxed arrive at the start, its wait before the stores) and one
/// cluster barrier later block 0 picks. Without clusters block 0 does everything and the others
/// return.
template <int D, int E, int KSEL, bool BIAS, int C, int KS, bool ROUND = false>
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
  constexpr int kPairs = kBlockRows / kRows;
  static_assert(kWarps % KS == 0, "K splits must divide the block's warps");
  __shared__ __align__(16) float xs[D];
  __shared__ float logits[E]; // block 0's: every block's logits (from the others remotely)
  const int t = blockIdx.y, warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int first = rank * kBlockRows;
#if XSERV_HAS_CLUSTERS
  if (C > 1)
    cluster_arrive_relaxed();
#endif
  // Logit first + i into block 0's logits (its own shared memory with one block).
  auto put = [&](int i, float v) {
#if XSERV_HAS_CLUSTERS
    if (C > 1) {
      cluster_store(&logits[first + i], 0, v);
      return;
    }
#endif
    logits[first + i] = v;
  };
  // Split-K when every pair gets its own KS warps (the cluster path); else whole rows.
  constexpr bool kSplit = KS > 1 && kPairs * KS <= kWarps;
  constexpr int kParts = kSplit ? KS : 1;
  WarpGemv<D, kRows, 1, kSplit ? 8 : 4, kParts> gemv;
  const int pair0 = kSplit ? warp / KS : warp;
  if (kSplit && pair0 < kPairs) // loads fly during the norm (and the previous kernel's end)
    gemv.start(w + (size_t)(first + pair0 * kRows) * D, warp % KS);
  // The pair's biases (split path) and this thread's norm gains before the wait, as the weights.
  float bias[kRows] = {0.0f, 0.0f};
  if (BIAS && kSplit && pair0 < kPairs && warp % KS == 0)
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      bias[r] = bf16_to_float(b[first + pair0 * kRows + r]);
  // The router's input; the experts get v (xn) and round it themselves.
  router_norm_row<D, kThreads>(x, ln, eps, xn, rank == 0, t,
                               [&](int i, float v) { xs[i] = act_value<ROUND>(v); });
#if XSERV_HAS_CLUSTERS
  if (C > 1)
    cluster_wait(); // every block has started: block 0's logits may be written
#endif
  if (kSplit) {
    __shared__ float parts[kWarps][kRows];
    float acc[kRows][1] = {{0.0f}, {0.0f}};
    if (pair0 < kPairs)
      gemv.finish(xs, 1, acc);
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        parts[warp][r] = acc[r][0];
    __syncthreads();
    if (pair0 < kPairs && warp % KS == 0 && lane == 0)
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float v = parts[warp][r];
#pragma unroll
        for (int p = 1; p < kParts; ++p)
          v += parts[warp + p][r];
        put(pair0 * kRows + r, BIAS ? v + bias[r] : v);
      }
  } else {
    for (int p = warp; p < kPairs; p += kWarps) {
      WarpGemv<D, kRows, 1> whole;
      whole.start(w + (size_t)(first + p * kRows) * D);
      float acc[kRows][1];
      whole.finish(xs, 1, acc);
      if (lane == 0)
#pragma unroll
        for (int r = 0; r < kRows; ++r)
          put(p * kRows + r,
              BIAS ? acc[r][0] + bf16_to_float(b[first + p * kRows + r]) : acc[r][0]);
    }
  }
  if (!gathered_in_block0<C>(rank)) // every block's logits are in block 0's shared memory
    return;
  if (warp == 0)
    warp_topk_softmax<E, KSEL>(logits, weights + (size_t)t * KSEL, ids + (size_t)t * KSEL);
}

} // namespace xserv_kernels
