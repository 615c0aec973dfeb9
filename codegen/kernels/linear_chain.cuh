// Decode kernels of canonical plans (compile --gemm-order canonical) that fuse more than one
// matrix: q, k and v with the rotary embedding and the cache writes, and the MoE router with its
// norm and top-k. Their products run in the gemms' canonical order (docs/DESIGN.md, "The gemms'
// canonical order"): gemm_wg's K slots, the matrix's K ranges each one chain from zero on
// mma.sync, the ranges added in order, then the bias; so a token's results are the bits of the
// gemm path (gemm_act, gemm_wg, gemm_splitk_reduce, then the rope or top-k kernel) in a step of
// any size.
#pragma once

#include "xserv_kernels/linear.cuh"
#include "xserv_kernels/router.cuh"

namespace xserv_kernels {

/// One warp's canonical chains over 16 weight rows (row0 .. row0 + 15, row stride K, bf16) and
/// the K ranges first, first + step, ... < ranges of `len` 64-value tiles each: the tiles stream
/// through a WarpRowRing of STAGES chunks (issued from start(), which may run before the
/// kernel's dependency wait), and each range is one mma.sync chain from zero in gemm_wg's K
/// slots against the tokens' activations (staged by chain_stage_norm); NATURAL: in the natural
/// K order (natural_tile_mma; the activations staged in natural pairs), cuBLAS's chain.
template <int K, int STAGES, bool NATURAL = false> struct ChainWarp {
  static_assert(K % 64 == 0 && STAGES >= 2, "whole K tiles, two stages");
  WarpRowRing ring;
  unsigned base = 0;
  const __nv_bfloat16* src = nullptr;
  int first = 0, step = 1, len = 1, count = 0; // count: the warp's tiles
  unsigned bytes[4] = {16, 16, 16, 16};        // this lane's rows: zeros past the live ones

  __device__ __forceinline__ int tile(int j) const {
    return (first + (j / len) * step) * len + j % len;
  }
  __device__ __forceinline__ void issue(int j, int buf) {
    if (j < count) {
      const __nv_bfloat16* p = src + (size_t)tile(j) * 64;
      const void* const rows[4] = {p, bytes[1] ? p + (size_t)4 * K : p,
                                   bytes[2] ? p + (size_t)8 * K : p,
                                   bytes[3] ? p + (size_t)12 * K : p}; // a dead row: the first
      ring.copy(buf, rows, bytes);
    }
    cp_async_commit(); // one group a tile, empty past the end
  }

  /// `mem`: the warp's STAGES 2 KB of shared memory (16-byte aligned); rows live_rows .. 15 of
  /// the group read as zeros (and from nowhere).
  __device__ __forceinline__ void start(void* mem, const __nv_bfloat16* row0, int first_range,
                                        int range_step, int ranges, int range_len,
                                        int live_rows = 16) {
    const int lane = threadIdx.x % kWarp;
    ring.init(mem);
    base = smem_u32(mem);
#pragma unroll
    for (int r = 0; r < 4; ++r)
      bytes[r] = lane / 8 + 4 * r < live_rows ? 16u : 0u;
    src = row0 + (size_t)(lane / 8) * K + (lane % 8) * 8; // slot l % 8 of rows l / 8 + 4 j
    first = first_range;
    step = range_step;
    len = range_len;
    count = first_range < ranges ? ((ranges - 1 - first_range) / range_step + 1) * range_len : 0;
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st)
      issue(st, st);
  }

  /// The chains: on_range(r, d) gets range r's sums, d[q] = row g + 8 (q / 2) x token
  /// 2 c + q % 2 (g = lane / 4, c = lane % 4). xs: the activations, kXStride words a token;
  /// B column g reads token min(g, tokens - 1).
  template <int kXStride, class OnRange>
  __device__ __forceinline__ void run(const unsigned* xs, int tokens, OnRange on_range) {
    const int lane = threadIdx.x % kWarp, g = lane / 4, c = lane % 4;
    const unsigned* xb = xs + (g < tokens ? g : tokens - 1) * kXStride + c;
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int buf = 0;
#pragma unroll 1
    for (int j = 0; j < count; ++j) {
      cp_async_wait<STAGES - 2>(); // tile j has landed (this lane's copies)
      __syncwarp();                // ... and every lane's; all are done with the previous buffer
      issue(j + STAGES - 1, buf == 0 ? STAGES - 1 : buf - 1);
      if (j % len == 0)
#pragma unroll
        for (int q = 0; q < 4; ++q)
          d[q] = 0.0f;
      if constexpr (NATURAL)
        natural_tile_mma(ring, buf, xb + tile(j) * 32, d);
      else
        wg_tile_mma(base + buf * WarpRowRing::kChunkBytes, xb + tile(j) * 32, d);
      if (j % len == len - 1)
        on_range(first + (j / len) * step, d);
      buf = buf == STAGES - 1 ? 0 : buf + 1;
    }
    cp_async_wait<0>();
  }
};

/// Stages rms_norm(x[t], ln, eps) of `tokens` fp32 rows as gemm_act writes them: the sum of
/// squares as 256 threads add it (linear_stage_x's and gemm_act's order; a smaller block's
/// warps take the 8 warps' shares in turn), then
/// bf16 pairs in gemm_wg's K slots (NATURAL: K 2 p and 2 p + 1), kXStride words a token. Every
/// thread of the block calls it; it ends with a barrier.
template <int K, int MAX_T, int THREADS, int kXStride, bool NATURAL = false>
__device__ __forceinline__ void chain_stage_norm(const float* __restrict__ x,
                                                 const __nv_bfloat16* __restrict__ ln, float eps,
                                                 unsigned* xs, int tokens) {
  static_assert(THREADS % kWarp == 0 && K % 64 == 0, "whole warps, whole K tiles");
  constexpr int kWarps = THREADS / kWarp;
  __shared__ float partial[8][MAX_T];
  __shared__ float inv[MAX_T];
  const int tid = threadIdx.x, lane = tid % kWarp;
  for (int t = 0; t < tokens; ++t)
    for (int vw = tid / kWarp; vw < 8; vw += kWarps) { // the 256 threads' warps, in turn
      float ss = 0.0f;
      for (int i = vw * kWarp + lane; i < K / 4; i += 256)
        ss += sum_sq4(reinterpret_cast<const float4*>(x + (size_t)t * K)[i]);
      ss = warp_sum(ss);
      if (lane == 0)
        partial[vw][t] = ss;
    }
  __syncthreads();
  if (tid < tokens) {
    float total = 0.0f;
    for (int i = 0; i < 8; ++i)
      total += partial[i][tid];
    inv[tid] = rsqrtf(total / K + eps);
  }
  __syncthreads();
  for (int i = tid; i < tokens * (K / 2); i += THREADS) {
    const int t = i / (K / 2), p = i % (K / 2);
    const int a = NATURAL ? 2 * p : (p / 32) * 64 + wg_k_of_slot(2 * (p % 32));
    const int b = NATURAL ? a + 1 : a + 4;
    const float* xr = x + (size_t)t * K;
    xs[t * kXStride + p] =
        pack_bf16x2(xr[a] * inv[t] * bf16_to_float(ln[a]), xr[b] * inv[t] * bf16_to_float(ln[b]));
  }
  __syncthreads();
}

/// qkv_rope_decode in the canonical order, for canonical plans' decode steps (one token per
/// sequence, up to MAX_T <= 8): y_q = Wq xn + bq, y_k, y_v likewise, xn = rms_norm(x, ln, eps)
/// staged as gemm_act stages it; each output row is its matrix's K ranges (KSQ for q, KSKV for
/// k and v: the lowering's wg_splitk) added in order, then the bias; q and k rotated
/// (rope_cos_sin, rope_rotate: rope_yarn_qk_kv's bits), k and v also stored in the caches at
/// each token's slot, as qkv_rope_decode does.
/// A block: RG groups of 16 rows of one projection, KW warps a group (warp w the ranges w,
/// w + KW, ...); its rows are whole heads (16 RG a multiple of D) or, for wider heads, 8 RG
/// rotation pairs of one head (rows j0 .. j0 + 8 RG - 1 and those D / 2 after). grid.x =
/// (NQ + NK + NV) / (16 RG), 32 RG KW threads; dynamic shared memory: the rings (RG KW STAGES
/// 2 KB), then the activations (K / 2 + 4 words a token).
template <int K, int NQ, int NK, int NV, int D, int BS, int MB, typename CacheT, int MAX_T, int KSQ,
          int KSKV, int RG, int KW, int STAGES, bool NATURAL = false>
__device__ __forceinline__ void
qkv_rope_decode_chain(const float* __restrict__ x, const __nv_bfloat16* __restrict__ ln, float eps,
                      const __nv_bfloat16* __restrict__ wq, const __nv_bfloat16* __restrict__ bq,
                      const __nv_bfloat16* __restrict__ wk, const __nv_bfloat16* __restrict__ bk,
                      const __nv_bfloat16* __restrict__ wv, const __nv_bfloat16* __restrict__ bv,
                      float* __restrict__ yq, float* __restrict__ yk, float* __restrict__ yv,
                      int tokens, const int* __restrict__ positions,
                      const int* __restrict__ token_seq, const int* __restrict__ block_table,
                      const double* __restrict__ inv_freq, double att, CacheT* __restrict__ k_cache,
                      CacheT* __restrict__ v_cache) {
  constexpr int kRows = 16 * RG, kHalf = D / 2, kPairs = kRows / 2;
  constexpr int kThreads = 32 * RG * KW, kXStride = K / 2 + 4, kTiles = K / 64;
  constexpr bool kWhole = kRows % D == 0; // else pairs of one head
  static_assert(kWhole || (RG % 2 == 0 && kHalf % kPairs == 0), "whole heads or whole pairs");
  static_assert(NQ % kRows == 0 && NK % kRows == 0 && NV % kRows == 0 && NQ % D == 0 &&
                    NK % D == 0 && NV % D == 0,
                "a block's rows lie in one projection of whole heads");
  static_assert(kTiles % KSQ == 0 && kTiles % KSKV == 0 && MAX_T >= 1 && MAX_T <= 8,
                "whole tiles a K range; the tokens are the MMA's 8 columns");
  constexpr int kRanges = KSQ > KSKV ? KSQ : KSKV;
  constexpr int kEpi = (kPairs * MAX_T + kThreads - 1) / kThreads;
  extern __shared__ __align__(16) uint4 smem_qkv_chain[];
  unsigned* xs = reinterpret_cast<unsigned*>(smem_qkv_chain + RG * KW * STAGES * 128);
  __shared__ float red[kRanges][kRows][MAX_T];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int rg = warp / KW, kw = warp % KW, g = lane / 4, c = lane % 4;
  int first = blockIdx.x * kRows; // in the concatenated rows, then within the projection
  const __nv_bfloat16 *w = wq, *b = bq;
  float* y = yq;
  int part = 0;
  if (first >= NQ + NK) {
    first -= NQ + NK, w = wv, b = bv, y = yv, part = 2;
  } else if (first >= NQ) {
    first -= NQ, w = wk, b = bk, y = yk, part = 1;
  }
  const int ks = part == 0 ? KSQ : KSKV;
  // Row of the projection at the block's row lr (pairs: the first halves, then their partners).
  const int head = first / D;
  const int j0 = kWhole ? 0 : (first / kRows) % (kHalf / kPairs) * kPairs;
  auto row_of = [&](int lr) {
    if (kWhole)
      return first + lr;
    return head * D + j0 + (lr < kPairs ? lr : kHalf + lr - kPairs);
  };
  ChainWarp<K, STAGES, NATURAL> chain; // the weights owe nothing to the previous kernel
  chain.start(smem_qkv_chain + warp * STAGES * 128, w + (size_t)row_of(16 * rg) * K, kw, KW, ks,
              kTiles / ks);
  // Before the wait, as the weights: the epilogue's biases, and its tokens' angles and cache
  // slots (the step's inputs were uploaded before the step's first kernel).
  float b1[kEpi], b2[kEpi];
  double cs[kEpi], sn[kEpi];
  size_t slot[kEpi];
#pragma unroll
  for (int u = 0; u < kEpi; ++u) {
    const int i = threadIdx.x + u * kThreads, pr = i / MAX_T, t = i % MAX_T;
    b1[u] = b2[u] = 0.0f;
    cs[u] = 1.0;
    sn[u] = 0.0;
    slot[u] = 0;
    if (pr >= kPairs || t >= tokens)
      continue;
    const int lr = kWhole ? (pr / kHalf) * D + pr % kHalf : pr;
    const int row = row_of(lr), j = row % D;
    b1[u] = bf16_to_float(b[row]);
    b2[u] = bf16_to_float(b[row + kHalf]);
    const int p = positions[t];
    slot[u] = (size_t)kv_slot<BS>(block_table + (size_t)token_seq[t] * MB, p) * NK + row - j;
    if (part < 2)
      rope_cos_sin(p, inv_freq[j], att, cs[u], sn[u]);
  }
  grid_dependency_sync();
  chain_stage_norm<K, MAX_T, kThreads, kXStride, NATURAL>(x, ln, eps, xs, tokens);
  chain.template run<kXStride>(xs, tokens, [&](int r, const float(&d)[4]) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int t = 2 * c + q % 2;
      if (t < tokens && t < MAX_T)
        red[r][16 * rg + g + 8 * (q / 2)][t] = d[q];
    }
  });
  __syncthreads();
  const int n = part == 0 ? NQ : part == 1 ? NK : NV;
#pragma unroll
  for (int u = 0; u < kEpi; ++u) {
    const int i = threadIdx.x + u * kThreads, pr = i / MAX_T, t = i % MAX_T;
    if (pr >= kPairs || t >= tokens)
      continue;
    const int lr1 = kWhole ? (pr / kHalf) * D + pr % kHalf : pr;
    const int lr2 = kWhole ? lr1 + kHalf : pr + kPairs;
    const int row = row_of(lr1), j = row % D;
    float x1 = red[0][lr1][t], x2 = red[0][lr2][t]; // the K ranges in order, then the bias
    for (int r = 1; r < ks; ++r) {
      x1 += red[r][lr1][t];
      x2 += red[r][lr2][t];
    }
    x1 += b1[u];
    x2 += b2[u];
    float y1 = x1, y2 = x2;
    if (part < 2)
      rope_rotate(x1, x2, cs[u], sn[u], y1, y2);
    y[(size_t)t * n + row] = y1;
    y[(size_t)t * n + row + kHalf] = y2;
    if (part > 0) {
      CacheT* dst = (part == 1 ? k_cache : v_cache) + slot[u];
      store_cache(dst + j, y1);
      store_cache(dst + j + kHalf, y2);
    }
  }
}

/// norm_router_topk in the canonical order, for canonical plans' decode steps, token t =
/// blockIdx.y: xn[t] = rms_norm(x[t], ln, eps) (block_inv_rms over 256 threads, as the rms_norm
/// kernel and norm_router_topk write it, for the experts), the router's E logits as the gemm
/// path sums them (xn in gemm_wg's slots, KS K ranges a row each one chain, added in order, then
/// the bias), then the top KSEL and their softmax (warp_topk_softmax: router_topk's picks).
/// The E / 16 row groups (the last one padded with zero rows) x KS ranges are the warps' tasks
/// (task i: group i / KS, range i % KS), dealt over the C blocks of a cluster (sm_90; block b's
/// warp w takes tasks 8 b + w, + 8 C,
/// ...), whose range sums land in block 0's shared memory; without clusters block 0 takes
/// every task. 256 threads a block; dynamic shared memory 8 STAGES 2 KB.
template <int D, int E, int KSEL, bool BIAS, int C, int KS, int STAGES, bool NATURAL = false>
__device__ __forceinline__ void
norm_router_topk_chain(const float* __restrict__ x, const __nv_bfloat16* __restrict__ ln, float eps,
                       const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* __restrict__ b,
                       float* __restrict__ xn, float* __restrict__ weights, int* __restrict__ ids) {
  constexpr int kThreads = 256, kWarps = 8, kGroups = (E + 15) / 16, kTasks = kGroups * KS;
  constexpr int kXStride = D / 2 + 4, kTiles = D / 64;
  static_assert(E % 8 == 0 && E <= kThreads && D % 64 == 0 && kTiles % KS == 0,
                "whole 8-row halves of groups, a logit a thread, whole tiles a K range");
#if XSERV_HAS_CLUSTERS
  const unsigned rank = blockIdx.x;
  constexpr int kBlocks = C;
#else
  const unsigned rank = 0;
  constexpr int kBlocks = 1;
  if (blockIdx.x != 0)
    return;
#endif
  extern __shared__ __align__(16) uint4 smem_router_chain[];
  __shared__ __align__(16) unsigned xs[kXStride];
  __shared__ float red[KS][E]; // block 0's: every task's range sums
  const int t = blockIdx.y, warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
#if XSERV_HAS_CLUSTERS
  if (C > 1)
    cluster_arrive_relaxed();
#endif
  // The warp's tasks: one group, ranges r, r + step, ... when the blocks' warps divide KS
  // evenly over the groups; else one task each (at most as many tasks as warps in the cluster).
  constexpr int kAll = kWarps * kBlocks;
  static_assert(kTasks <= kAll || kAll % kGroups == 0,
                "the cluster's warps take every task: one each, or a group's ranges in turn");
  const int task = rank * kWarps + warp;
  const int group = kTasks <= kAll ? task / KS : task % kGroups;
  const int range = kTasks <= kAll ? task % KS : task / kGroups;
  const int step = kTasks <= kAll ? KS : kAll / kGroups;
  const bool active = kTasks <= kAll ? task < kTasks : true;
  ChainWarp<D, STAGES, NATURAL> chain;
  if (active)
    chain.start(smem_router_chain + warp * STAGES * 128, w + (size_t)group * 16 * D, range, step,
                KS, kTiles / KS, E - group * 16);
  const float bias = BIAS && rank == 0 && threadIdx.x < E ? bf16_to_float(b[threadIdx.x]) : 0.0f;
  __shared__ float xf[D]; // the normalised row, then its slots
  router_norm_row<D, kThreads>(x, ln, eps, xn, rank == 0, t, [&](int i, float v) { xf[i] = v; });
  for (int p = threadIdx.x; p < D / 2; p += kThreads) { // gemm_act's slots and rounding
    const int a = NATURAL ? 2 * p : (p / 32) * 64 + wg_k_of_slot(2 * (p % 32));
    xs[p] = pack_bf16x2(xf[a], xf[NATURAL ? a + 1 : a + 4]);
  }
  __syncthreads();
#if XSERV_HAS_CLUSTERS
  if (C > 1)
    cluster_wait(); // every block has started: block 0's sums may be written
#endif
  if (active)
    chain.template run<kXStride>(xs, 1, [&](int r, const float(&d)[4]) {
      const int g = lane / 4, c = lane % 4;
      if (c != 0) // column 0 is the token: rows g and g + 8
        return;
#pragma unroll
      for (int q = 0; q < 4; q += 2) {
        if (group * 16 + g + 4 * q >= E)
          continue;
        float* at = &red[r][group * 16 + g + 4 * q];
#if XSERV_HAS_CLUSTERS
        if (C > 1) {
          cluster_store(at, 0, d[q]);
          continue;
        }
#endif
        *at = d[q];
      }
    });
  if (!gathered_in_block0<C>(rank)) // every range sum is in block 0's shared memory
    return;
  __shared__ float logits[E];
  if (threadIdx.x < E) {
    float v = red[0][threadIdx.x]; // the K ranges in order, then the bias
#pragma unroll
    for (int r = 1; r < KS; ++r)
      v += red[r][threadIdx.x];
    logits[threadIdx.x] = BIAS ? v + bias : v;
  }
  __syncthreads();
  if (warp == 0)
    warp_topk_softmax<E, KSEL>(logits, weights + (size_t)t * KSEL, ids + (size_t)t * KSEL);
}

} // namespace xserv_kernels
