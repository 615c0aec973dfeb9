// Prefill-path attention with sinks on tensor cores: attention_prefill's math, tiling and masks
// (attention_prefill.cuh), with the scores Q K^T and the weighted values P V as mma.sync
// m16n8k16 products of fp16 operands accumulated in fp32. Plans with plain bf16 gemm activations
// (compile --gemm-precision bf16, the default) lower prompt steps to it; the split (fp32-grade)
// plans keep the SIMT kernel.
//
// Precision: q * scale, k and v are rounded to fp16 (11 significant bits, a relative error of at
// most 2^-12 each: 8x finer than the bf16 the gemms' activations get); the softmax weights p go
// in as an fp16 pair hi + lo (~22 bits); every sum, the running max, the exponentials and the
// normaliser are fp32. attention_decode's ROUND16 rounds q, k and v alike, so that decode and
// prompt steps differ only in summation order. Values beyond fp16's
// range saturate to +-65504 (cvt .satfinite; NaN stays NaN): the projections' outputs of a
// normed residual stream sit orders of magnitude below it. bf16 caches convert to fp16 exactly
// for magnitudes in [2^-14, 65504].
#pragma once

#include "xserv_kernels/attention.cuh" // attn_finish
#include "xserv_kernels/common.cuh"

namespace xserv_kernels {

/// Threads per block of attention_prefill_mma (8 warps of 16 query rows each), query rows (token,
/// head) per block and keys per shared-memory tile.
constexpr int kMmaAttnThreads = 256;
constexpr int kMmaAttnRows = 128;
constexpr int kMmaAttnKeys = 64;

/// Query tokens per block for `group` query heads per kv head (the grid's y tile).
__host__ __device__ constexpr int attention_mma_tokens(int group) {
  return kMmaAttnRows / group;
}

namespace attn_mma {

/// d += a b for a 16x16 fp16 A fragment and a 16x8 fp16 B fragment, fp32 accumulators.
__device__ __forceinline__ void mma_f16(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                        unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

} // namespace attn_mma

/// attention(q, k, v, k_cache, v_cache, sinks, positions, token_seq, ctx_lens, block_table)
/// {window, scale}: operands, layouts, masks, the tile order (the last query tiles first) and the
/// sequence segments of a tile exactly as attention_prefill. A block serves QT = 128 / (H / G)
/// consecutive tokens of kv head g = blockIdx.x: 128 rows r = token-in-tile * (H/G) + head-in-
/// group, warp w owning rows 16w .. 16w + 15 as one MMA row tile.
///
/// Per key tile of 64 (the whole block): keys and values are staged in shared memory as fp16
/// rows of D + 8 halves (the 8 rows one ldmatrix reads start 16 bytes apart modulo 128: no bank
/// conflicts). Per warp, unless none of its rows sees a key of the tile: S = Q K^T (Q's fragments
/// built once from global memory, K's by ldmatrix: D/16 x 8 MMAs), the mask (-inf), the online
/// softmax on the accumulators (a row's max over the 4 lanes that hold it, in log2 units and
/// rounded up to a whole number, as softmax_ref_log2 says; the running sum per lane, summed over
/// the 4 at the end), the weights repacked in
/// registers as the A fragments of P V (V's fragments by transposing ldmatrix: 4 x D/8 MMAs).
/// Deterministic: fixed orders, no atomics.
///
/// Launch: kMmaAttnThreads threads, grid (G, ceil(tokens / QT)), no dynamic shared memory
/// (static: 2 x 64 x (D + 8) halves, 18 KB at D = 64).
template <int H, int G, int D, int BS, int MB, int WINDOW, typename CacheT = __nv_bfloat16>
__device__ __forceinline__ void
attention_prefill_mma(const float* __restrict__ q, const float* __restrict__ k,
                      const float* __restrict__ v, const CacheT* __restrict__ k_cache,
                      const CacheT* __restrict__ v_cache, const __nv_bfloat16* __restrict__ sinks,
                      const int* __restrict__ positions, const int* __restrict__ token_seq,
                      const int* __restrict__ ctx_lens, const int* __restrict__ block_table,
                      float scale, float* __restrict__ out, int tokens) {
  using namespace attn_mma;
  static_assert(H % G == 0, "query heads must be a multiple of kv heads");
  static_assert(D % 16 == 0, "head_dim must be a multiple of 16");
  constexpr int kGroup = H / G;
  static_assert(kMmaAttnRows % kGroup == 0, "query heads per kv head must divide 128");
  static_assert(kMmaAttnThreads == 32 * (kMmaAttnRows / 16), "one warp per 16 rows");
  constexpr int QT = attention_mma_tokens(kGroup);
  constexpr int KT = kMmaAttnKeys;
  constexpr int KS = D + 8;  // halves per shared-memory row
  constexpr int NT = KT / 8; // score tiles of 8 keys
  constexpr int DT = D / 8;  // output tiles of 8 dims
  constexpr int KD = D / 16; // k steps of Q K^T
  constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

  __shared__ __align__(16) unsigned short ks[KT * KS], vs[KT * KS];
  __shared__ int tok_pos[QT], tok_seq[QT];

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int gq = lane / 4, cq = lane % 4; // MMA fragment coordinates
  const int g = blockIdx.x;
  const int tile = gridDim.y - 1 - blockIdx.y;
  const int t0 = tile * QT, ntok = min(QT, tokens - t0);

  // This lane's two rows (fragment rows gq and gq + 8 of the warp's tile).
  int tl[2], head[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = warp * 16 + gq + 8 * i;
    tl[i] = r / kGroup;
    head[i] = g * kGroup + r % kGroup;
  }

  // Q * scale as A fragments: qa[kd] = {(row 0, dims 2cq..), (row 1, ..), (row 0, +8), (row 1,
  // +8)}.
  unsigned qa[KD][4];
#pragma unroll
  for (int kd = 0; kd < KD; ++kd)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float2 x = make_float2(0.0f, 0.0f);
        if (tl[i] < ntok)
          x = *reinterpret_cast<const float2*>(q + ((size_t)(t0 + tl[i]) * H + head[i]) * D +
                                               kd * 16 + h * 8 + 2 * cq);
        qa[kd][2 * h + i] = pack_f16x2(x.x * scale, x.y * scale);
      }
  for (int i = tid; i < ntok; i += kMmaAttnThreads) {
    tok_pos[i] = positions[t0 + i];
    tok_seq[i] = token_seq[t0 + i];
  }

  float m[2], l[2], o[DT][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
    m[i] = neg_inf(), l[i] = 0.0f;
#pragma unroll
  for (int dt = 0; dt < DT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      o[dt][e] = 0.0f;
  __syncthreads(); // tok_pos / tok_seq visible

  // ldmatrix row addresses: lane l reads row l % 8 of matrix l / 8.
  const int mi = lane / 8, mr = lane % 8;

  for (int sb = 0; sb < ntok;) {
    const int seq = tok_seq[sb];
    int se = sb + 1;
    while (se < ntok && tok_seq[se] == seq)
      ++se;
    const int ctx = ctx_lens[seq];
    const int* table = block_table + (size_t)seq * MB;
    const int p_first = tok_pos[sb], p_last = tok_pos[se - 1];
    const int t_first = t0 + sb;
    const int kmin = WINDOW > 0 ? max(0, p_first - WINDOW + 1) : 0;

    // Each row's visible keys lo..hi in this segment (an empty range outside it).
    int lo[2], hi[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (tl[i] >= sb && tl[i] < se) {
        const int p = tok_pos[tl[i]];
        lo[i] = WINDOW > 0 ? max(0, p - WINDOW + 1) : 0;
        hi[i] = p;
      } else {
        lo[i] = 1;
        hi[i] = 0;
      }
    }

    for (int kt = kmin; kt <= p_last; kt += KT) {
      const int n = min(KT, p_last + 1 - kt);
      __syncthreads(); // the previous tile fully read
      // 1. Keys kt .. kt+n-1 and their values as fp16 (zeros past n: zero weights stay zero).
      for (int c = tid; c < KT * D / 8; c += kMmaAttnThreads) {
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
            load_cache8(k + off, kf);
            load_cache8(v + off, vf);
          }
        } else {
#pragma unroll
          for (int i = 0; i < 8; ++i)
            kf[i] = vf[i] = 0.0f;
        }
        *reinterpret_cast<uint4*>(ks + jj * KS + e) =
            make_uint4(pack_f16x2(kf[0], kf[1]), pack_f16x2(kf[2], kf[3]), pack_f16x2(kf[4], kf[5]),
                       pack_f16x2(kf[6], kf[7]));
        *reinterpret_cast<uint4*>(vs + jj * KS + e) =
            make_uint4(pack_f16x2(vf[0], vf[1]), pack_f16x2(vf[2], vf[3]), pack_f16x2(vf[4], vf[5]),
                       pack_f16x2(vf[6], vf[7]));
      }
      __syncthreads();

      bool sees = false;
#pragma unroll
      for (int i = 0; i < 2; ++i)
        sees |= max(lo[i], kt) <= min(hi[i], kt + n - 1);
      if (!__any_sync(0xffffffffu, sees))
        continue;

      // 2. Scores of the warp's 16 rows against the tile's 64 keys.
      float s[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          s[nt][e] = 0.0f;
#pragma unroll
      for (int kd = 0; kd < KD; ++kd)
#pragma unroll
        for (int nt = 0; nt < NT; nt += 2) {
          unsigned b[4];
          ldmatrix_x4(b, ks + ((nt + mi / 2) * 8 + mr) * KS + kd * 16 + (mi % 2) * 8);
          mma_f16(s[nt], qa[kd], b[0], b[1]);
          mma_f16(s[nt + 1], qa[kd], b[2], b[3]);
        }

        // 3. Mask, online softmax, weights (in place of the scores).
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float mt = neg_inf();
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = kt + nt * 8 + 2 * cq + e;
            float& x = s[nt][2 * i + e];
            x = key < lo[i] || key > hi[i] ? neg_inf() : __fmul_rn(x, kLog2e); // log2 units
            mt = fmaxf(mt, x);
          }
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
        // The running max as a whole power of two (softmax_ref_log2): a row that has seen no
        // key yet keeps m = -inf and subtracts 0 (all its weights are 0).
        const float mx = fmaxf(m[i], ceilf(mt));
        const float mu = mx == neg_inf() ? 0.0f : mx;
        const float corr = exp2f(m[i] - mu); // a power of two (0 while m = -inf)
        m[i] = mx;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = s[nt][2 * i + e];
            x = exp2f(__fsub_rn(x, mu)); // 0 for a masked key; as attention_decode's ROUND16
            sum += x;
          }
        l[i] = l[i] * corr + sum;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          o[dt][2 * i] *= corr;
          o[dt][2 * i + 1] *= corr;
        }
      }

      // 4. o += P V: the weights of keys 16kk .. 16kk+15 are the A fragment
      // {s[2kk][0..1], s[2kk][2..3], s[2kk+1][0..1], s[2kk+1][2..3]}, as an fp16 pair hi + lo
      // (~22 significant bits: two MMAs), so that the weights' rounding is fp32-grade and a
      // decode step, which weighs in fp32, sees the same products up to the sums' order.
#pragma unroll
      for (int kk = 0; kk < KT / 16; ++kk) {
        unsigned hi[4], lo[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const float* w = &s[2 * kk + r / 2][2 * (r % 2)];
          hi[r] = pack_f16x2(w[0], w[1]);
          const float2 h = round_f16x2(w[0], w[1]);
          lo[r] = pack_f16x2(w[0] - h.x, w[1] - h.y);
        }
#pragma unroll
        for (int dt = 0; dt < DT; dt += 2) {
          unsigned b[4];
          ldmatrix_x4_trans(b, vs + (kk * 16 + (mi % 2) * 8 + mr) * KS + (dt + mi / 2) * 8);
          mma_f16(o[dt], hi, b[0], b[1]);
          mma_f16(o[dt + 1], hi, b[2], b[3]);
          mma_f16(o[dt], lo, b[0], b[1]);
          mma_f16(o[dt + 1], lo, b[2], b[3]);
        }
      }
    }
    sb = se;
  }

  // Epilogue: each row's sum over its 4 lanes, then out = attn_finish per element.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float li = l[i];
    li += __shfl_xor_sync(0xffffffffu, li, 1);
    li += __shfl_xor_sync(0xffffffffu, li, 2);
    if (tl[i] >= ntok)
      continue;
    const float sink = bf16_to_float(sinks[head[i]]), mn = m[i] * kLn2; // natural units
    float* dst = out + ((size_t)(t0 + tl[i]) * H + head[i]) * D + 2 * cq;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
      *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(
          attn_finish(mn, li, o[dt][2 * i], sink), attn_finish(mn, li, o[dt][2 * i + 1], sink));
  }
}

} // namespace xserv_kernels
