// Decode-path attention with sinks over a bf16 or fp32 KV cache (optionally a sliding-window ring)
// and the step's own keys, split over keys across blocks with an online softmax and a combine
// kernel.
#pragma once

#include "xserv_kernels/common.cuh"

namespace xserv_kernels {

/// Threads per block of attention_decode and keys per shared-memory tile.
constexpr int kAttnThreads = 256;
constexpr int kAttnTile = 32;

/// Output of one head from a single split's running max m, sum l and unnormalised o, with the
/// sink's logit in the denominator: o exp(m-M) / (l exp(m-M) + exp(sink-M)), M = max(m, sink).
__device__ __forceinline__ float attn_finish(float m, float l, float o, float sink) {
  const float mx = fmaxf(m, sink), c = expf(m - mx);
  return o * c / (l * c + expf(sink - mx));
}

/// attention(q, k, v, k_cache, v_cache, sinks, positions, token_seq, ctx_lens, cache_rows)
/// {window, scale} for one (token t = blockIdx.y, kv head g = blockIdx.x, key split
/// s = blockIdx.z of gridDim.z). q [T, H, D], k/v [T, G, D] fp32; caches CacheT (bf16 or fp32)
/// [rows, S, G, D], slot = pos % S; sinks bf16 [H]. Token t at position p sees keys lo..p, lo =
/// WINDOW ? p-WINDOW+1 : 0 (clamped at 0): positions < ctx_len come from the cache, the rest from
/// the step's k/v (tokens of a sequence are contiguous with consecutive positions). The key range
/// is cut into gridDim.z equal parts. With one split the block writes out [T, H, D] directly; else
/// it writes its running max/sum [T, H, splits] and unnormalised output [T, H, splits, D] into
/// part_ml (max then sum, 2 floats) and part_o for attention_combine.
template <int H, int G, int D, int S, int WINDOW, typename CacheT = __nv_bfloat16>
__device__ __forceinline__ void
attention_decode(const float* __restrict__ q, const float* __restrict__ k,
                 const float* __restrict__ v, const CacheT* __restrict__ k_cache,
                 const CacheT* __restrict__ v_cache, const __nv_bfloat16* __restrict__ sinks,
                 const int* __restrict__ positions, const int* __restrict__ token_seq,
                 const int* __restrict__ ctx_lens, const int* __restrict__ cache_rows, float scale,
                 float* __restrict__ out, float* __restrict__ part_ml, float* __restrict__ part_o) {
  static_assert(H % G == 0, "query heads must be a multiple of kv heads");
  static_assert(D % 8 == 0, "head_dim must be a multiple of 8");
  constexpr int kGroup = H / G;              // query heads sharing this kv head
  constexpr int kChunks = kAttnTile * D / 8; // 8-element pieces of one K or V tile
  constexpr int kOutPerThread = (kGroup * D + kAttnThreads - 1) / kAttnThreads;
  __shared__ float qs[kGroup][D];
  __shared__ float ks[kAttnTile][D + 1]; // +1: conflict-free column reads
  __shared__ float vs[kAttnTile][D];
  __shared__ float ps[kGroup][kAttnTile];
  __shared__ float run_m[kGroup], run_l[kGroup], corr[kGroup];

  const int tid = threadIdx.x, g = blockIdx.x, t = blockIdx.y, split = blockIdx.z;
  const int splits = gridDim.z;
  const int seq = token_seq[t], p = positions[t], ctx = ctx_lens[seq], row = cache_rows[seq];
  const int lo = WINDOW > 0 ? max(0, p - WINDOW + 1) : 0;
  const int len = p - lo + 1, per_split = (len + splits - 1) / splits;
  const int begin = lo + split * per_split, end = min(p + 1, begin + per_split);

  for (int i = tid; i < kGroup * D; i += kAttnThreads)
    qs[i / D][i % D] = q[((size_t)t * H + g * kGroup) * D + i] * scale;
  if (tid < kGroup) {
    run_m[tid] = neg_inf();
    run_l[tid] = 0.0f;
  }
  float acc[kOutPerThread];
#pragma unroll
  for (int i = 0; i < kOutPerThread; ++i)
    acc[i] = 0.0f;

  for (int tile = begin; tile < end; tile += kAttnTile) {
    const int n = min(kAttnTile, end - tile);
    __syncthreads(); // previous tile fully consumed
    // 1. Stage the tile's keys and values as fp32.
    for (int c = tid; c < kChunks; c += kAttnThreads) {
      const int jj = c / (D / 8), e = (c % (D / 8)) * 8;
      if (jj >= n)
        continue;
      const int j = tile + jj;
      float kf[8], vf[8];
      if (j < ctx) {
        const size_t off = (((size_t)row * S + j % S) * G + g) * D + e;
        load_cache8(k_cache + off, kf);
        load_cache8(v_cache + off, vf);
      } else {
        const size_t off = ((size_t)(t - (p - j)) * G + g) * D + e;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          kf[i] = k[off + i];
          vf[i] = v[off + i];
        }
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        ks[jj][e + i] = kf[i];
        vs[jj][e + i] = vf[i];
      }
    }
    __syncthreads();
    // 2. Scores of every (head, key) pair of the tile.
    for (int i = tid; i < kGroup * kAttnTile; i += kAttnThreads) {
      const int hh = i / kAttnTile, jj = i % kAttnTile;
      float s = neg_inf();
      if (jj < n) {
        s = 0.0f;
#pragma unroll 8
        for (int e = 0; e < D; ++e)
          s = fmaf(qs[hh][e], ks[jj][e], s);
      }
      ps[hh][jj] = s;
    }
    __syncthreads();
    // 3. Online softmax update per head (the tile has at least one key, so m stays finite).
    if (tid < kGroup) {
      float mx = run_m[tid];
      for (int jj = 0; jj < n; ++jj)
        mx = fmaxf(mx, ps[tid][jj]);
      float sum = 0.0f;
      for (int jj = 0; jj < n; ++jj) {
        const float e = expf(ps[tid][jj] - mx);
        ps[tid][jj] = e;
        sum += e;
      }
      corr[tid] = expf(run_m[tid] - mx);
      run_l[tid] = run_l[tid] * corr[tid] + sum;
      run_m[tid] = mx;
    }
    __syncthreads();
    // 4. Weighted values.
#pragma unroll
    for (int i = 0; i < kOutPerThread; ++i) {
      const int idx = tid + i * kAttnThreads;
      if (idx >= kGroup * D)
        break;
      const int hh = idx / D, e = idx % D;
      float a = acc[i] * corr[hh];
      for (int jj = 0; jj < n; ++jj)
        a = fmaf(ps[hh][jj], vs[jj][e], a);
      acc[i] = a;
    }
  }
  __syncthreads();

  // Epilogue: final output (one split) or this split's partial state.
#pragma unroll
  for (int i = 0; i < kOutPerThread; ++i) {
    const int idx = tid + i * kAttnThreads;
    if (idx >= kGroup * D)
      break;
    const int hh = idx / D, e = idx % D, head = g * kGroup + hh;
    const size_t th = (size_t)t * H + head;
    if (splits == 1) {
      out[th * D + e] = attn_finish(run_m[hh], run_l[hh], acc[i], bf16_to_float(sinks[head]));
    } else {
      part_o[(th * splits + split) * D + e] = acc[i];
      if (e == 0) {
        part_ml[(th * splits + split) * 2] = run_m[hh];
        part_ml[(th * splits + split) * 2 + 1] = run_l[hh];
      }
    }
  }
}

/// Merges the key splits of attention_decode: one block per (token, head) = (blockIdx.y,
/// blockIdx.x), D threads; splits as in the decode launch.
template <int H, int D>
__device__ __forceinline__ void
attention_combine(const float* __restrict__ part_ml, const float* __restrict__ part_o,
                  const __nv_bfloat16* __restrict__ sinks, int splits, float* __restrict__ out) {
  const int head = blockIdx.x, t = blockIdx.y, e = threadIdx.x;
  if (e >= D)
    return;
  const size_t th = (size_t)t * H + head;
  const float sink = bf16_to_float(sinks[head]);
  const float* ml = part_ml + th * splits * 2;
  float mx = sink;
  for (int s = 0; s < splits; ++s)
    mx = fmaxf(mx, ml[2 * s]);
  float denom = expf(sink - mx), num = 0.0f;
  for (int s = 0; s < splits; ++s) {
    const float c = expf(ml[2 * s] - mx); // 0 for an empty split
    denom += ml[2 * s + 1] * c;
    num += part_o[(th * splits + s) * D + e] * c;
  }
  out[th * D + e] = num / denom;
}

} // namespace xserv_kernels
