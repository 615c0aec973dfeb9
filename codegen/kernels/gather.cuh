// Row-copy kernels of a step: embedding gather (bf16 -> fp32), select_rows, and kv_write
// (fp32 into a bf16 or fp32 KV cache row and slot).
#pragma once

#include "xserv_kernels/common.cuh"

namespace xserv_kernels {

/// Threads per block of the row-copy kernels.
constexpr int kGatherThreads = 256;

/// embedding(table, ids): out[t, :] = table[ids[t], :] as fp32 for token t = blockIdx.y. table
/// bf16 [V, D]; out fp32 [T, D]. An id outside [0, V) (the host checks ids first) gives zeros.
template <int V, int D>
__device__ __forceinline__ void embedding_gather(const __nv_bfloat16* __restrict__ table,
                                                 const int* __restrict__ ids,
                                                 float* __restrict__ out) {
  const int t = blockIdx.y, id = ids[t];
  const bool ok = id >= 0 && id < V;
  for (int i = threadIdx.x; i < D; i += kGatherThreads)
    out[(size_t)t * D + i] = ok ? bf16_to_float(table[(size_t)id * D + i]) : 0.0f;
}

/// select_rows(x, rows): out[r, :] = x[rows[r], :] for row r = blockIdx.y; x and out fp32 with
/// W values per row. The host checks the row indices.
template <int W>
__device__ __forceinline__ void select_rows(const float* __restrict__ x,
                                            const int* __restrict__ rows, float* __restrict__ out) {
  const int r = blockIdx.y;
  const size_t src = (size_t)rows[r] * W;
  for (int i = threadIdx.x; i < W; i += kGatherThreads)
    out[(size_t)r * W + i] = x[src + i];
}

/// kv_write(cache, x, positions, token_seq, block_table) {window} for token t = blockIdx.y: the
/// W = G * D fp32 values x[t, :, :] into slot kv_slot<BS>(block_table + seq * MB, positions[t])
/// of the paged cache (CacheT [blocks, BS, G, D]), rounded to bf16 for a bf16 cache. With a
/// window (a sliding layer) a token is left out when its sequence's token R = ceil(WINDOW / BS)
/// + 1 blocks later is in the step and lands in the same block (a table that reuses a ring of
/// R blocks): no query after the step reaches back to it, and the two stores would race (tokens
/// of a sequence are contiguous with consecutive positions, so that token is t + R * BS). Table
/// entries the engine does not keep point at the null block, where stores go unread.
template <int W, int BS, int MB, int WINDOW, typename CacheT = __nv_bfloat16>
__device__ __forceinline__ void
kv_write(CacheT* __restrict__ cache, const float* __restrict__ x, const int* __restrict__ positions,
         const int* __restrict__ token_seq, const int* __restrict__ block_table) {
  const int t = blockIdx.y, seq = token_seq[t];
  const int* row = block_table + (size_t)seq * MB;
  if (WINDOW > 0) {
    constexpr int R = (WINDOW + BS - 1) / BS + 1;
    const int t2 = t + R * BS, j = positions[t] / BS;
    if (t2 < (int)gridDim.y && token_seq[t2] == seq && row[j] == row[j + R])
      return;
  }
  CacheT* dst = cache + (size_t)kv_slot<BS>(row, positions[t]) * W;
  for (int i = threadIdx.x; i < W; i += kGatherThreads)
    store_cache(dst + i, x[(size_t)t * W + i]);
}

} // namespace xserv_kernels
