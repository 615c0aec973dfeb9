// YaRN rotary embedding (rotate-half) of one token's heads, angles in float64.
#pragma once

#include "xserv_kernels/common.cuh"

namespace xserv_kernels {

/// Threads per block of rope_yarn.
constexpr int kRopeThreads = 256;

/// cos and sin (times the attention factor) of position p's angles p inv_freq[j], j < D/2, in
/// float64 into shared memory (rope_cos_sin), then a barrier.
template <int D>
__device__ __forceinline__ void rope_angles(int position, const double* __restrict__ inv_freq,
                                            double att, double* cs, double* sn) {
  for (int j = threadIdx.x; j < D / 2; j += kRopeThreads)
    rope_cos_sin(position, inv_freq[j], att, cs[j], sn[j]);
  __syncthreads();
}

/// rope_yarn(x, positions) for token t = blockIdx.y: with p = positions[t] and, for pair
/// j < D/2, c = cos(p inv_freq[j]) att and s = sin(p inv_freq[j]) att (angle and its sine and
/// cosine in float64, as the host reference computes them), y[t, h, j] = x1 c - x2 s and
/// y[t, h, j + D/2] = x2 c + x1 s, x1 = x[t, h, j], x2 = x[t, h, j + D/2]. x, y fp32 [T, H, D];
/// inv_freq float64 [D/2] (the host's yarn_inv_freq). y may alias x.
template <int H, int D>
__device__ __forceinline__ void rope_yarn(const float* x, const int* __restrict__ positions,
                                          const double* __restrict__ inv_freq, double att,
                                          float* y) {
  constexpr int kHalf = D / 2;
  __shared__ double cs[kHalf], sn[kHalf];
  const int t = blockIdx.y;
  rope_angles<D>(positions[t], inv_freq, att, cs, sn);
  for (int i = threadIdx.x; i < H * kHalf; i += kRopeThreads) {
    const int h = i / kHalf, j = i % kHalf;
    const size_t base = ((size_t)t * H + h) * D;
    // In float64 like the reference, so the result matches it to the last fp32 rounding.
    float y1, y2;
    rope_rotate(x[base + j], x[base + j + kHalf], cs[j], sn[j], y1, y2);
    y[base + j] = y1;
    y[base + j + kHalf] = y2;
  }
}

/// The rotations of token t's q [T, HQ, D] and k [T, HK, D] heads in place, pairs (head, j)
/// spread over the grid.x blocks of the token, with the angles in cs, sn (rope_angles);
/// on_k(kv head, j, y1, y2) sees each rotated pair of k.
template <int HQ, int HK, int D, typename OnK>
__device__ __forceinline__ void rotate_qk(float* q, float* k, int t, const double* cs,
                                          const double* sn, OnK on_k) {
  constexpr int kHalf = D / 2;
  for (int i = blockIdx.x * kRopeThreads + threadIdx.x; i < (HQ + HK) * kHalf;
       i += gridDim.x * kRopeThreads) {
    const int h = i / kHalf, j = i % kHalf;
    float* base = h < HQ ? q + ((size_t)t * HQ + h) * D : k + ((size_t)t * HK + h - HQ) * D;
    float y1, y2;
    rope_rotate(base[j], base[j + kHalf], cs[j], sn[j], y1, y2);
    base[j] = y1;
    base[j + kHalf] = y2;
    if (h >= HQ)
      on_k(h - HQ, j, y1, y2);
  }
}

/// rope_yarn of q [T, HQ, D] and k [T, HK, D] in place in one launch (the same rotation as
/// rope_yarn for each), token t = blockIdx.y; the (HQ + HK) D / 2 rotations are spread over
/// the grid.x blocks of the token (each computes the angles itself), one per thread when
/// grid.x = ceil((HQ + HK) D / 2 / 256).
template <int HQ, int HK, int D>
__device__ __forceinline__ void rope_yarn_qk(float* q, float* k, const int* __restrict__ positions,
                                             const double* __restrict__ inv_freq, double att) {
  constexpr int kHalf = D / 2;
  __shared__ double cs[kHalf], sn[kHalf];
  const int t = blockIdx.y;
  rope_angles<D>(positions[t], inv_freq, att, cs, sn);
  rotate_qk<HQ, HK, D>(q, k, t, cs, sn, [](int, int, float, float) {});
}

/// rope_yarn_qk plus the KV cache writes of a step with ONE token per sequence (a decode step):
/// token t = blockIdx.y rotates q and k in place, then stores the rotated k[t] and v[t] (fp32
/// [T, HK, D]) into k_cache and v_cache (CacheT [blocks, BS, HK, D]) at slot
/// kv_slot<BS>(block_table + token_seq[t] * MB, positions[t]): what kv_write does after
/// attention, done here because with one token per sequence attention never reads that slot
/// before this step (position p is new; in a ring of a sequence's own blocks it held a
/// position outside every window). Steps with several tokens of a sequence keep kv_write after
/// attention (a chunk longer than a window would overwrite keys its first tokens still need).
/// Spread over grid.x blocks per token as rope_yarn_qk.
template <int HQ, int HK, int D, int BS, int MB, typename CacheT>
__device__ __forceinline__ void
rope_yarn_qk_kv(float* q, float* k, const float* __restrict__ v, const int* __restrict__ positions,
                const int* __restrict__ token_seq, const int* __restrict__ block_table,
                const double* __restrict__ inv_freq, double att, CacheT* __restrict__ k_cache,
                CacheT* __restrict__ v_cache) {
  constexpr int kHalf = D / 2;
  __shared__ double cs[kHalf], sn[kHalf];
  const int t = blockIdx.y, p = positions[t];
  rope_angles<D>(p, inv_freq, att, cs, sn);
  const size_t slot = (size_t)kv_slot<BS>(block_table + (size_t)token_seq[t] * MB, p) * HK * D;
  rotate_qk<HQ, HK, D>(q, k, t, cs, sn, [&](int kh, int j, float y1, float y2) {
    CacheT* dst = k_cache + slot + (size_t)kh * D;
    store_cache(dst + j, y1);
    store_cache(dst + j + kHalf, y2);
  });
  for (int i = blockIdx.x * kRopeThreads + threadIdx.x; i < HK * D; i += gridDim.x * kRopeThreads)
    store_cache(v_cache + slot + i, v[(size_t)t * HK * D + i]);
}

} // namespace xserv_kernels
