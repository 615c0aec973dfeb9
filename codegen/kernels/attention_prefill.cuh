// Prefill-path attention with sinks (many query tokens per step): the math of attention_decode
// (attention.cuh), but a block serves a tile of consecutive query tokens for all query heads of
// one kv head, so each key/value tile is read from global memory once per query tile instead of
// once per token. SIMT fp32 throughout (scores, online softmax, weighted values).
#pragma once

#include "xserv_kernels/attention.cuh" // attn_finish
#include "xserv_kernels/common.cuh"

namespace xserv_kernels {

/// Threads per block of attention_prefill; query rows (token, head) per block; keys per shared-
/// memory tile. 16 row groups of 16 lanes: each half-warp owns kPrefillRows / 16 rows, each of
/// its lanes a 16th of the tile's keys (scores) and of head_dim (output).
constexpr int kPrefillThreads = 256;
constexpr int kPrefillRows = 128;
constexpr int kPrefillKeys = 64;

/// Query tokens per block for `group` query heads per kv head (the grid's y tile).
__host__ __device__ constexpr int attention_prefill_tokens(int group) {
  return kPrefillRows / group;
}

/// Dynamic shared memory of attention_prefill<.., D, ..>, in bytes: fp32 Q [128][D + 4] and
/// P [128][64 + 4] (each row group of 8 rows followed by 16 floats, so that consecutive row
/// groups start 16 banks apart), K [64][D + 4], V [64][D]. 105,472 bytes for head_dim 64.
__host__ __device__ constexpr int attention_prefill_smem_bytes(int d) {
  return 4 * ((kPrefillRows * (d + 4) + 256) + (kPrefillRows * (kPrefillKeys + 4) + 256) +
              kPrefillKeys * (d + 4) + kPrefillKeys * d);
}

/// attention(q, k, v, k_cache, v_cache, sinks, positions, token_seq, ctx_lens, block_table)
/// {window, scale} for a tile of QT = 128 / (H / G) consecutive tokens (tile index
/// gridDim.y - 1 - blockIdx.y: the last tiles, which see the most keys under causal attention,
/// start first) and kv head g = blockIdx.x, `tokens` tokens in the step. Layouts and semantics
/// as attention_decode: q [T, H, D], k/v [T, G, D] fp32; caches CacheT (bf16 or fp32)
/// [blocks, BS, G, D], paged by the sequences' rows of block_table (MB entries each: kv_slot);
/// sinks bf16 [H]; out [T, H, D] fp32. Token t of sequence token_seq[t] at position p sees keys
/// lo..p, lo = WINDOW ? max(0, p-WINDOW+1) : 0; keys below ctx_lens[seq] come from the
/// sequence's cache blocks, the rest from the step's k/v at token
/// t - (p - j) (tokens of a sequence are contiguous, with consecutive positions).
///
/// Rows: r = token-in-tile * (H/G) + head-in-group, 128 rows. Thread tid = 16 rg + kg owns rows
/// rg*RM .. rg*RM + RM-1 (RM = 8): their scores for keys kg + 16 j (j < 4) of each key tile and
/// their output dims kg*DPT .. kg*DPT + DPT-1 (DPT = D / 16). Each row's running max m is
/// replicated over its half-warp; its running sum l is kept per lane (over that lane's keys)
/// and summed over the half-warp at the end.
///
/// The tile's tokens are processed sequence segment by sequence segment (a tile may hold the
/// end of one sequence and the start of the next): for a segment, key tiles of 64 run over
/// lo(first token) .. p(last token), staged once in shared memory for all rows; a row outside
/// the segment or a key outside the row's lo..p is masked (-inf score, zero weight). A half-warp
/// none of whose rows sees a key of the tile skips it. Per key tile a half-warp computes its
/// rows' scores (8 x 4 per lane), updates m / l / the output with the online softmax, writes
/// the weights P to its own rows of shared memory and accumulates P V: only the K/V staging
/// needs the whole block. Deterministic: fixed summation orders, no atomics.
///
/// Launch: kPrefillThreads threads, grid (G, ceil(tokens / QT)), attention_prefill_smem_bytes(D)
/// bytes of dynamic shared memory; 128 registers with no spills for the 20b shapes (sm_90), so
/// two blocks fit an SM (emit_prefill.cpp asks for that with __launch_bounds__(256, 2)).
template <int H, int G, int D, int BS, int MB, int WINDOW, typename CacheT = __nv_bfloat16>
__device__ __forceinline__ void
attention_prefill(const float* __restrict__ q, const float* __restrict__ k,
                  const float* __restrict__ v, const CacheT* __restrict__ k_cache,
                  const CacheT* __restrict__ v_cache, const __nv_bfloat16* __restrict__ sinks,
                  const int* __restrict__ positions, const int* __restrict__ token_seq,
                  const int* __restrict__ ctx_lens, const int* __restrict__ block_table,
                  float scale, float* __restrict__ out, int tokens) {
  static_assert(H % G == 0, "query heads must be a multiple of kv heads");
  static_assert(D % 16 == 0, "head_dim must be a multiple of 16");
  constexpr int kGroup = H / G; // query heads sharing this kv head
  static_assert(kPrefillRows % kGroup == 0, "query heads per kv head must divide 128");
  constexpr int QT = attention_prefill_tokens(kGroup); // query tokens per block
  constexpr int KT = kPrefillKeys;
  constexpr int RM = kPrefillRows / 16; // rows per thread
  constexpr int KPT = KT / 16;          // keys per thread and key tile
  constexpr int DPT = D / 16;           // output dims per thread
  // Shared-memory row strides in floats (K rows padded: lanes read 16 different key rows).
  constexpr int QS = D + 4, KS = D + 4, VS = D, PS = KT + 4;
  static_assert(kPrefillThreads == 16 * 16, "16 row groups of 16 lanes");
  static_assert(kGroup % RM == 0 || RM % kGroup == 0, "rows of a thread span whole tokens");

  // Dynamic shared memory (attention_prefill_smem_bytes): Q (pre-scaled), P, K, V as fp32.
  extern __shared__ __align__(16) float smem_prefill[];
  float* qs = smem_prefill;
  float* ps = qs + 16 * (RM * QS + 16);
  float* ks = ps + 16 * (RM * PS + 16);
  float* vs = ks + KT * KS;
  __shared__ int tok_pos[QT], tok_seq[QT];

  const int tid = threadIdx.x, g = blockIdx.x;
  const int kg = tid % 16, rg = tid / 16;
  const unsigned hmask = 0xffffu << (tid & 16); // this half-warp's lanes
  const int tile = gridDim.y - 1 - blockIdx.y;
  const int t0 = tile * QT, ntok = min(QT, tokens - t0);
  // Row rg*RM + i lives at qs/ps + base + i * stride; a row group takes RM rows + 16 floats, so
  // the two half-warps of a warp read and write disjoint banks (RM * stride is a multiple of 32).
  const int qbase = rg * (RM * QS + 16), pbase = rg * (RM * PS + 16);
  // A thread's rows belong to TPT tokens (kGroup and RM are powers of two): row rg*RM + i to
  // token-in-tile rg*RM/kGroup + i/(RM/TPT).
  constexpr int TPT = kGroup >= RM ? 1 : RM / kGroup;
  const int tl0 = rg * RM / kGroup;

  // Stage the tile's queries times scale (rows past the step's tokens are zero) and its tokens.
  for (int c = tid; c < kPrefillRows * D / 4; c += kPrefillThreads) {
    const int r = c / (D / 4), e = (c % (D / 4)) * 4, tl = r / kGroup;
    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (tl < ntok) {
      x = *reinterpret_cast<const float4*>(
          q + ((size_t)(t0 + tl) * H + g * kGroup + r % kGroup) * D + e);
      x.x *= scale, x.y *= scale, x.z *= scale, x.w *= scale;
    }
    *reinterpret_cast<float4*>(qs + (r / RM) * (RM * QS + 16) + (r % RM) * QS + e) = x;
  }
  for (int i = tid; i < ntok; i += kPrefillThreads) {
    tok_pos[i] = positions[t0 + i];
    tok_seq[i] = token_seq[t0 + i];
  }

  float m[RM], l[RM], o[RM][DPT];
#pragma unroll
  for (int i = 0; i < RM; ++i) {
    m[i] = neg_inf();
    l[i] = 0.0f;
#pragma unroll
    for (int d = 0; d < DPT; ++d)
      o[i][d] = 0.0f;
  }
  __syncthreads(); // tok_pos / tok_seq visible

  for (int sb = 0; sb < ntok;) {
    // The segment [sb, se) of tokens of one sequence and the keys any of them sees.
    const int seq = tok_seq[sb];
    int se = sb + 1;
    while (se < ntok && tok_seq[se] == seq)
      ++se;
    const int ctx = ctx_lens[seq];
    const int* table = block_table + (size_t)seq * MB;
    const int p_first = tok_pos[sb], p_last = tok_pos[se - 1];
    const int t_first = t0 + sb; // step index of the token at p_first
    const int kmin = WINDOW > 0 ? max(0, p_first - WINDOW + 1) : 0;

    for (int kt = kmin; kt <= p_last; kt += KT) {
      const int n = min(KT, p_last + 1 - kt); // keys of this tile
      __syncthreads();                        // previous K/V tile (and P) fully consumed
      // 1. Stage keys kt .. kt+n-1 as fp32 (zeros past n, so that zero weights stay zero).
      for (int c = tid; c < KT * D / 8; c += kPrefillThreads) {
        const int jj = c / (D / 8), e = (c % (D / 8)) * 8;
        float kf[8], vf[8];
        if (jj < n) {
          const int j = kt + jj;
          if (j < ctx) {
            const size_t off = ((size_t)kv_slot<BS>(table, j) * G + g) * D + e;
            load_cache8(k_cache + off, kf);
            load_cache8(v_cache + off, vf);
          } else {
            const size_t off = ((size_t)(t_first + (j - p_first)) * G + g) * D + e;
            const float4 k0 = *reinterpret_cast<const float4*>(k + off);
            const float4 k1 = *reinterpret_cast<const float4*>(k + off + 4);
            const float4 v0 = *reinterpret_cast<const float4*>(v + off);
            const float4 v1 = *reinterpret_cast<const float4*>(v + off + 4);
            kf[0] = k0.x, kf[1] = k0.y, kf[2] = k0.z, kf[3] = k0.w;
            kf[4] = k1.x, kf[5] = k1.y, kf[6] = k1.z, kf[7] = k1.w;
            vf[0] = v0.x, vf[1] = v0.y, vf[2] = v0.z, vf[3] = v0.w;
            vf[4] = v1.x, vf[5] = v1.y, vf[6] = v1.z, vf[7] = v1.w;
          }
        } else {
#pragma unroll
          for (int i = 0; i < 8; ++i)
            kf[i] = vf[i] = 0.0f;
        }
        float* kd = ks + jj * KS + e;
        float* vd = vs + jj * VS + e;
        *reinterpret_cast<float4*>(kd) = make_float4(kf[0], kf[1], kf[2], kf[3]);
        *reinterpret_cast<float4*>(kd + 4) = make_float4(kf[4], kf[5], kf[6], kf[7]);
        *reinterpret_cast<float4*>(vd) = make_float4(vf[0], vf[1], vf[2], vf[3]);
        *reinterpret_cast<float4*>(vd + 4) = make_float4(vf[4], vf[5], vf[6], vf[7]);
      }
      __syncthreads();

      // Each row's visible keys in tile coordinates: jj in [a, b] (empty outside the segment).
      int a[TPT], b[TPT];
      bool active = false;
#pragma unroll
      for (int u = 0; u < TPT; ++u) {
        const int tl = tl0 + u;
        if (tl >= sb && tl < se) {
          const int p = tok_pos[tl];
          a[u] = (WINDOW > 0 ? max(0, p - WINDOW + 1) : 0) - kt;
          b[u] = p - kt;
        } else {
          a[u] = KT;
          b[u] = -1;
        }
        active |= max(a[u], 0) <= min(b[u], n - 1);
      }
      if (!active) // uniform over the half-warp (same rows)
        continue;

      // 2. Scores s[i][j] of row rg*RM + i and key kg + 16j (the e loop stays rolled: unrolled,
      // its hoisted loads push the kernel past 128 registers).
      float s[RM][KPT];
#pragma unroll
      for (int i = 0; i < RM; ++i)
#pragma unroll
        for (int j = 0; j < KPT; ++j)
          s[i][j] = 0.0f;
#pragma unroll 1
      for (int e = 0; e < D; e += 4) {
        float4 kv[KPT];
#pragma unroll
        for (int j = 0; j < KPT; ++j)
          kv[j] = *reinterpret_cast<const float4*>(ks + (kg + 16 * j) * KS + e);
#pragma unroll
        for (int i = 0; i < RM; ++i) {
          const float4 qv = *reinterpret_cast<const float4*>(qs + qbase + i * QS + e);
#pragma unroll
          for (int j = 0; j < KPT; ++j) {
            float acc = s[i][j];
            acc = fmaf(qv.x, kv[j].x, acc);
            acc = fmaf(qv.y, kv[j].y, acc);
            acc = fmaf(qv.z, kv[j].z, acc);
            acc = fmaf(qv.w, kv[j].w, acc);
            s[i][j] = acc;
          }
        }
      }

      // 3. Online softmax per row: mask, tile max over the half-warp, rescale of l and o,
      // weights to P.
#pragma unroll
      for (int i = 0; i < RM; ++i) {
        const int u = i / (RM / TPT); // the row's token among the thread's
        float mt = neg_inf();
#pragma unroll
        for (int j = 0; j < KPT; ++j) {
          const int jj = kg + 16 * j;
          if (jj < a[u] || jj > b[u])
            s[i][j] = neg_inf();
          mt = fmaxf(mt, s[i][j]);
        }
#pragma unroll
        for (int off = 8; off > 0; off /= 2)
          mt = fmaxf(mt, __shfl_xor_sync(hmask, mt, off, 16));
        const float mx = fmaxf(m[i], mt);
        // A row that has seen no key yet keeps m = -inf: subtract 0 then (all weights are 0).
        const float mu = mx == neg_inf() ? 0.0f : mx;
        const float corr = expf(m[i] - mu);
        m[i] = mx;
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < KPT; ++j) {
          const float w = expf(s[i][j] - mu); // 0 for a masked key
          sum += w;
          ps[pbase + i * PS + kg + 16 * j] = w;
        }
        l[i] = l[i] * corr + sum;
#pragma unroll
        for (int d = 0; d < DPT; ++d)
          o[i][d] *= corr;
      }
      __syncwarp(hmask); // this half-warp's P rows written

      // 4. o[i][d] += sum over the tile's keys of P[row i][key] V[key][kg*DPT + d]. Keys past n
      // have zero weight and zero values.
      for (int kk = 0; kk < n; kk += 4) {
        float vv[4][DPT];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const float* vr = vs + (kk + u) * VS + kg * DPT;
          if constexpr (DPT % 4 == 0) {
#pragma unroll
            for (int d = 0; d < DPT; d += 4) {
              const float4 x = *reinterpret_cast<const float4*>(vr + d);
              vv[u][d] = x.x, vv[u][d + 1] = x.y, vv[u][d + 2] = x.z, vv[u][d + 3] = x.w;
            }
          } else {
#pragma unroll
            for (int d = 0; d < DPT; ++d)
              vv[u][d] = vr[d];
          }
        }
#pragma unroll
        for (int i = 0; i < RM; ++i) {
          const float4 pv = *reinterpret_cast<const float4*>(ps + pbase + i * PS + kk);
#pragma unroll
          for (int d = 0; d < DPT; ++d) {
            float acc = o[i][d];
            acc = fmaf(pv.x, vv[0][d], acc);
            acc = fmaf(pv.y, vv[1][d], acc);
            acc = fmaf(pv.z, vv[2][d], acc);
            acc = fmaf(pv.w, vv[3][d], acc);
            o[i][d] = acc;
          }
        }
      }
    }
    sb = se;
  }

  // Epilogue: sum each row's l over its half-warp, then out = attn_finish per element.
#pragma unroll
  for (int i = 0; i < RM; ++i) {
    float li = l[i];
#pragma unroll
    for (int off = 8; off > 0; off /= 2)
      li += __shfl_xor_sync(hmask, li, off, 16);
    const int r = rg * RM + i, tl = tl0 + i / (RM / TPT);
    if (tl >= ntok)
      continue;
    const int head = g * kGroup + r % kGroup;
    const float sink = bf16_to_float(sinks[head]);
    float* dst = out + ((size_t)(t0 + tl) * H + head) * D + kg * DPT;
#pragma unroll
    for (int d = 0; d < DPT; ++d)
      dst[d] = attn_finish(m[i], li, o[i][d], sink);
  }
}

} // namespace xserv_kernels
