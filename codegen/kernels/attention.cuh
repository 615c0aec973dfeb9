// Decode-path attention with sinks over a paged bf16 or fp32 KV cache (optionally a sliding
// window) and the step's own keys, split over keys across blocks with an online softmax and a combine
// kernel.
//
// attention_decode, one block per (token, kv head, key split), 8 warps, no block barrier inside
// the key loop:
//   1. Keys go in passes of kPassKeys consecutive positions (pass a holds keys a*kPassKeys..,
//      masked to the split's range), dealt to the warps in turn, kAttnBatch passes per warp at a
//      time. K rows come as 16-byte chunks (the kKeyLanes lanes of a key hold 8 elements each), V
//      rows as 8-byte pairs (a lane owns element pairs of every value row), straight from global
//      memory into registers. A warp issues its first batch, then the block stages the scaled
//      queries in shared memory (one barrier); after that each warp computes a batch while the
//      next one is in flight (its K loads go out once the scores are done, its V loads once the
//      values are weighed) and the one after is asked of L2.
//   2. Scores: each lane dots its 8 key elements with the kGroup query heads (queries re-read
//      from shared memory), and a reduce-scatter over the key's lanes leaves each lane the full
//      scores of its own heads (D = 64, 8 heads: 8 lanes a key, one head a lane).
//   3. Online softmax per warp and batch: one max per head over the batch's keys (shuffles); p
//      and the correction go through a warp-private shared buffer (__syncwarp only), and the
//      accumulators are rescaled only when a head's max grew (else the factor is exactly 1).
//   4. The warps' (max, sum, output) are merged in shared memory (second barrier) and written:
//      the normalised output with one split, else the split's partial state for
//      attention_combine (an empty split gives max -inf, sum 0, output 0).
// Cached keys and the step's own keys (fp32 k/v) are two ranges walked by the same loop.
#pragma once

#include "xserv_kernels/common.cuh"

namespace xserv_kernels {

/// Threads per block of attention_decode (the emitter's launch block), key passes a warp loads at
/// a time (2: 8 keys, 12 loads a lane for an fp32 cache at D = 64; 4 would need more registers
/// than two blocks per SM leave) and how many batches ahead a warp asks L2 for its rows (0: not).
constexpr int kAttnThreads = 256;
constexpr int kAttnBatch = 2;
constexpr int kAttnPrefetch = 1;

/// Output of one head from a single split's running max m, sum l and unnormalised o, with the
/// sink's logit in the denominator: o exp(m-M) / (l exp(m-M) + exp(sink-M)), M = max(m, sink).
__device__ __forceinline__ float attn_finish(float m, float l, float o, float sink) {
  const float mx = fmaxf(m, sink), c = expf(m - mx);
  return o * c / (l * c + expf(sink - mx));
}

/// Two fp32 values as an fp16 pair (round to nearest even, saturating at +-65504; NaN stays
/// NaN), `lo` in the low half: the operands of the tensor-core prefill attention
/// (attention_mma.cuh).
__device__ __forceinline__ unsigned pack_f16x2(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

/// (x, y) rounded to fp16 as pack_f16x2 rounds them, back in fp32.
__device__ __forceinline__ float2 round_f16x2(float x, float y) {
  const unsigned h = pack_f16x2(x, y);
  float2 r;
  asm("{\n\t.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, %2;\n\tcvt.f32.f16 %0, lo;\n\t"
      "cvt.f32.f16 %1, hi;\n\t}"
      : "=f"(r.x), "=f"(r.y)
      : "r"(h));
  return r;
}

/// softmax_ref_log2: the fp16-operand kernels (attention_mma.cuh) keep the online softmax's
/// running max m in log2 units rounded up to a whole number, so that p = 2^(s log2(e) - m) and
/// every correction 2^(m_old - m_new) are exact powers of two.

namespace attn_detail {

__host__ __device__ constexpr int pow2_at_least(int n) {
  int p = 1;
  while (p < n)
    p *= 2;
  return p;
}

__host__ __device__ constexpr int lanes_for(int pieces) {
  return pow2_at_least(pieces) < kWarp ? pow2_at_least(pieces) : kWarp;
}

/// Eight elements of a K row and two of a V row as loaded, before widening to fp32.
struct F32x8 {
  float4 a, b;
};
template <typename T> struct Raw;
template <> struct Raw<float> {
  using Chunk = F32x8;
  using Pair = float2;
  static constexpr bool kF32 = true;
};
template <> struct Raw<__nv_bfloat16> {
  using Chunk = uint4;
  using Pair = unsigned int;
  static constexpr bool kF32 = false;
};

/// Chunk gc of an fp32 row in the cache's chunk order: with SPLIT (fp32 cache) the quads gc and
/// D/8 + gc, so that the lanes of a key read two contiguous halves of the row; else (bf16 cache)
/// the elements 8gc..8gc+7, as a bf16 row is read.
template <int D, bool SPLIT> __device__ __forceinline__ F32x8 load_chunk(const float* row, int gc) {
  const float4* r = reinterpret_cast<const float4*>(row);
  return SPLIT ? F32x8{__ldg(r + gc), __ldg(r + D / 8 + gc)}
               : F32x8{__ldg(r + 2 * gc), __ldg(r + 2 * gc + 1)};
}
template <int D, bool SPLIT>
__device__ __forceinline__ uint4 load_chunk(const __nv_bfloat16* row, int gc) {
  return __ldg(reinterpret_cast<const uint4*>(row) + gc);
}
__device__ __forceinline__ void widen(const F32x8& c, float (&out)[8]) {
  out[0] = c.a.x, out[1] = c.a.y, out[2] = c.a.z, out[3] = c.a.w;
  out[4] = c.b.x, out[5] = c.b.y, out[6] = c.b.z, out[7] = c.b.w;
}
__device__ __forceinline__ void widen(const uint4& c, float (&out)[8]) {
  unpack_bf16x8(c, out);
}

/// Elements 2i and 2i+1 of a row.
__device__ __forceinline__ float2 load_pair(const float* row, int i) {
  return __ldg(reinterpret_cast<const float2*>(row) + i);
}
__device__ __forceinline__ unsigned int load_pair(const __nv_bfloat16* row, int i) {
  return __ldg(reinterpret_cast<const unsigned int*>(row) + i);
}
__device__ __forceinline__ float2 widen(float2 v) {
  return v;
}
__device__ __forceinline__ float2 widen(unsigned int u) {
  return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}

/// A 16-byte shared-memory load done where it is written: volatile, so that ptxas neither hoists
/// it out of the key loop nor merges it with the same load of another pass (the query quads held
/// in registers would take 64 of them and halve the blocks per SM).
__device__ __forceinline__ float4 lds_f4(const float4* p) {
  float4 r;
  asm volatile("ld.volatile.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w)
               : "r"(static_cast<unsigned int>(__cvta_generic_to_shared(p))));
  return r;
}

/// Sums the N values of v over the lanes that differ only in the bits below 2*OFF (a power of
/// two, L lanes): halving exchanges while more than one value is left, then a plain butterfly.
/// Lane c of such a group ends with the sums of values (c * N) / L + i, i < max(1, N / L), in
/// v[0..]. Call with OFF = L / 2 and COUNT = N.
template <int N, int OFF, int COUNT>
__device__ __forceinline__ void reduce_scatter(float (&v)[N], int lane) {
  if constexpr (OFF >= 1) {
    if constexpr (COUNT > 1) {
      constexpr int kHalf = COUNT / 2;
      const bool upper = (lane & OFF) != 0; // keeps the upper half of the values
#pragma unroll
      for (int i = 0; i < kHalf; ++i) {
        const float send = upper ? v[i] : v[i + kHalf];
        const float keep = upper ? v[i + kHalf] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, OFF);
      }
      reduce_scatter<N, OFF / 2, kHalf>(v, lane);
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], OFF);
      reduce_scatter<N, OFF / 2, 1>(v, lane);
    }
  }
}

/// Keys b..e-1 of one source: key j's K and V rows are row_of(j) of k and v, row stride G*D
/// elements; CONTIG: the rows of a pass's keys are consecutive (row_of(j0) + i, j0 the first).
template <bool CONTIG, typename ElemT, typename RowOf> struct KeyRange {
  using T = ElemT;
  using Chunk = typename Raw<ElemT>::Chunk;
  using Pair = typename Raw<ElemT>::Pair;
  static constexpr bool kContig = CONTIG;
  const ElemT* k;
  const ElemT* v;
  int b, e;
  RowOf row_of;
  __device__ __forceinline__ bool live(int j) const {
    return unsigned(j - b) < unsigned(e - b); // b <= j < e
  }
};
template <bool CONTIG, typename T, typename RowOf>
__device__ __forceinline__ KeyRange<CONTIG, T, RowOf> key_range(const T* k, const T* v, int b,
                                                                int e, RowOf row_of) {
  return {k, v, b, e, row_of};
}

/// One warp's share of a block of attention_decode: its online-softmax state over the keys it
/// has seen and the loop over key ranges.
template <int H, int G, int D, typename CacheT> struct DecodeWarp {
  static constexpr int kGroup = H / G;                 // query heads of the kv head
  static constexpr int kHeads = pow2_at_least(kGroup); // padded for the reduce-scatter
  static constexpr int kChunks = D / 8;                // 8-element chunks of a K row
  static constexpr int kKeyLanes = lanes_for(kChunks); // lanes sharing a key's scores
  static constexpr int kLaneChunks = (kChunks + kKeyLanes - 1) / kKeyLanes;
  static constexpr int kPassKeys = kWarp / kKeyLanes; // keys of one pass
  static constexpr int kLaneHeads = kHeads > kKeyLanes ? kHeads / kKeyLanes : 1;
  static constexpr int kPairs = D / 2;                // element pairs of a V row
  static constexpr int kRowLanes = lanes_for(kPairs); // lanes sharing a V row
  static constexpr int kLanePairs = (kPairs + kRowLanes - 1) / kRowLanes;
  static constexpr int kRowsPerLoad = kWarp / kRowLanes;     // V rows of one warp-wide load
  static constexpr int kLaneKeys = kPassKeys / kRowsPerLoad; // V rows a lane loads per pass
  static constexpr int kBatchKeys = kAttnBatch * kPassKeys;
  static constexpr int kWarps = kAttnThreads / kWarp;
  static constexpr bool kSplit = Raw<CacheT>::kF32;
  static_assert(kPassKeys % kRowsPerLoad == 0, "a pass's V rows must fill whole loads");

  const float4* qs; // [kHeads][2][kChunks] quads of the scaled queries, in chunk order
  float* ps;        // this warp's [kBatchKeys][kHeads] probabilities of a batch
  float* cs;        // this warp's [kHeads] corrections of a batch
  int warp, lane, kc, kg, rc, rg;     // chunk lane and key of K loads, pair lane and row of V loads
  float m[kLaneHeads], l[kLaneHeads]; // running max and this lane's part of the sum, own heads
  float acc[kGroup][kLanePairs][2];   // unnormalised output, this lane's pairs of every head

  __device__ __forceinline__ DecodeWarp(const float4* q_smem, float* p_smem, float* c_smem)
      : qs(q_smem), ps(p_smem), cs(c_smem), warp(threadIdx.x / kWarp), lane(threadIdx.x % kWarp),
        kc(lane % kKeyLanes), kg(lane / kKeyLanes), rc(lane % kRowLanes), rg(lane / kRowLanes) {
#pragma unroll
    for (int i = 0; i < kLaneHeads; ++i) {
      m[i] = neg_inf();
      l[i] = 0.0f;
    }
#pragma unroll
    for (int h = 0; h < kGroup; ++h)
#pragma unroll
      for (int i = 0; i < kLanePairs; ++i)
        acc[h][i][0] = acc[h][i][1] = 0.0f;
  }

  /// Head of this lane's i-th score after the reduce-scatter.
  __device__ __forceinline__ int own_head(int i) const {
    return kc * kHeads / kKeyLanes + i;
  }

  /// Row of key j0 + i in base (the range's K or V), j0 a pass's first key.
  template <typename R, typename T>
  __device__ __forceinline__ const T* row_ptr(const R& r, const T* base, int j0, int i) const {
    return base + (long long)(R::kContig ? r.row_of(j0) + i : r.row_of(j0 + i)) * (G * D);
  }

  /// Issues the K loads of the batch at pass a (masked keys read nothing and stay zero).
  template <typename R>
  __device__ __forceinline__ void load_k(const R& r, int a,
                                         typename R::Chunk (&kraw)[kAttnBatch][kLaneChunks]) const {
#pragma unroll
    for (int u = 0; u < kAttnBatch; ++u) {
      const int j0 = (a + u * kWarps) * kPassKeys;
      const bool live = r.live(j0 + kg);
#pragma unroll
      for (int i = 0; i < kLaneChunks; ++i) {
        const int gc = kc + i * kKeyLanes;
        kraw[u][i] = typename R::Chunk{};
        if (live && (kChunks % kKeyLanes == 0 || gc < kChunks))
          kraw[u][i] = load_chunk<D, kSplit>(row_ptr(r, r.k, j0, kg), gc);
      }
    }
  }

  /// Issues the V loads of the batch at pass a (masked keys read nothing and stay zero, so that
  /// their p = 0 meets no NaN).
  template <typename R>
  __device__ __forceinline__ void
  load_v(const R& r, int a, typename R::Pair (&vraw)[kAttnBatch][kLaneKeys][kLanePairs]) const {
#pragma unroll
    for (int u = 0; u < kAttnBatch; ++u) {
      const int j0 = (a + u * kWarps) * kPassKeys;
#pragma unroll
      for (int kk = 0; kk < kLaneKeys; ++kk) {
        const bool live = r.live(j0 + rg + kk * kRowsPerLoad);
#pragma unroll
        for (int i = 0; i < kLanePairs; ++i) {
          const int pair = rc + i * kRowLanes;
          vraw[u][kk][i] = typename R::Pair{};
          if (live && (kPairs % kRowLanes == 0 || pair < kPairs))
            vraw[u][kk][i] = load_pair(row_ptr(r, r.v, j0, rg + kk * kRowsPerLoad), pair);
        }
      }
    }
  }

  /// Asks L2 for the K and V rows of the batch at pass a, without waiting.
  template <typename R> __device__ __forceinline__ void prefetch(const R& r, int a) const {
    constexpr int kLines = (D * int(sizeof(typename R::T)) + 127) / 128; // lines of a row
    constexpr int kPoints = kBatchKeys * 2 * kLines;
#pragma unroll
    for (int i = lane; i < kPoints; i += kWarp) {
      const int line = i % kLines, kb = i / (2 * kLines);
      const int j = (a + kb / kPassKeys * kWarps) * kPassKeys + kb % kPassKeys;
      if (r.live(j)) {
        const auto* row = ((i / kLines) % 2 ? r.v : r.k) + (long long)r.row_of(j) * (G * D);
        asm volatile(
            "prefetch.global.L2 [%0];" ::"l"(reinterpret_cast<const char*>(row) + line * 128));
      }
    }
  }

  /// Scores of the lanes' keys of the batch at pass a for their own heads; masked keys get -inf.
  /// The query quads are re-read from shared memory for every pass (lds_f4).
  template <typename R>
  __device__ __forceinline__ void scores(const R& r, int a,
                                         const typename R::Chunk (&kraw)[kAttnBatch][kLaneChunks],
                                         float (&sc)[kAttnBatch][kLaneHeads]) const {
#pragma unroll
    for (int u = 0; u < kAttnBatch; ++u) {
      float s[kHeads];
#pragma unroll
      for (int h = 0; h < kHeads; ++h)
        s[h] = 0.0f;
#pragma unroll
      for (int i = 0; i < kLaneChunks; ++i) {
        const int gc = kc + i * kKeyLanes;
        if (kChunks % kKeyLanes == 0 || gc < kChunks) {
          float kf[8];
          widen(kraw[u][i], kf);
#pragma unroll
          for (int h = 0; h < kGroup; ++h) {
            const float4 q0 = lds_f4(qs + 2 * h * kChunks + gc);
            const float4 q1 = lds_f4(qs + (2 * h + 1) * kChunks + gc);
            float d = s[h];
            d = fmaf(q0.x, kf[0], d);
            d = fmaf(q0.y, kf[1], d);
            d = fmaf(q0.z, kf[2], d);
            d = fmaf(q0.w, kf[3], d);
            d = fmaf(q1.x, kf[4], d);
            d = fmaf(q1.y, kf[5], d);
            d = fmaf(q1.z, kf[6], d);
            d = fmaf(q1.w, kf[7], d);
            s[h] = d;
          }
        }
      }
      reduce_scatter<kHeads, kKeyLanes / 2, kHeads>(s, lane);
      const bool live = r.live((a + u * kWarps) * kPassKeys + kg);
#pragma unroll
      for (int i = 0; i < kLaneHeads; ++i)
        sc[u][i] = live ? s[i] : neg_inf();
    }
  }

  /// Online-softmax step over a batch's scores: new max per head, p and the correction into ps
  /// and cs. The batch's first pass holds a live key, so every head's max is finite, p = 0 for
  /// masked keys and the first correction is exp(-inf) = 0. True (on every lane) when some
  /// head's max grew, i.e. the accumulators need their correction.
  __device__ __forceinline__ bool softmax(const float (&sc)[kAttnBatch][kLaneHeads]) {
    bool grew = false;
#pragma unroll
    for (int i = 0; i < kLaneHeads; ++i) {
      float mx = sc[0][i];
#pragma unroll
      for (int u = 1; u < kAttnBatch; ++u)
        mx = fmaxf(mx, sc[u][i]);
#pragma unroll
      for (int off = kKeyLanes; off < kWarp; off *= 2) // over the keys of a pass
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float m_new = fmaxf(m[i], mx);
      const float corr = expf(m[i] - m_new);
      grew |= m_new > m[i];
      float sum = 0.0f;
      const int head = own_head(i);
#pragma unroll
      for (int u = 0; u < kAttnBatch; ++u) {
        const float p = expf(sc[u][i] - m_new);
        sum += p;
        ps[(u * kPassKeys + kg) * kHeads + head] = p;
      }
      l[i] = l[i] * corr + sum;
      m[i] = m_new;
      if (kg == 0)
        cs[head] = corr;
    }
    grew = __any_sync(0xffffffffu, grew);
    __syncwarp();
    return grew;
  }

  /// Adds a batch's weighted values to the accumulators, corrected first when a max grew.
  template <typename Pair>
  __device__ __forceinline__ void weigh(const Pair (&vraw)[kAttnBatch][kLaneKeys][kLanePairs],
                                        bool grew) {
    if (grew) {
#pragma unroll
      for (int h = 0; h < kGroup; ++h) {
        const float corr = cs[h];
#pragma unroll
        for (int i = 0; i < kLanePairs; ++i) {
          acc[h][i][0] *= corr;
          acc[h][i][1] *= corr;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kAttnBatch; ++u)
#pragma unroll
      for (int kk = 0; kk < kLaneKeys; ++kk) {
        const float* pr = ps + (u * kPassKeys + rg + kk * kRowsPerLoad) * kHeads;
        float p[kGroup];
        if constexpr (kGroup % 4 == 0) {
#pragma unroll
          for (int h = 0; h < kGroup; h += 4) {
            const float4 p4 = *reinterpret_cast<const float4*>(pr + h);
            p[h] = p4.x, p[h + 1] = p4.y, p[h + 2] = p4.z, p[h + 3] = p4.w;
          }
        } else {
#pragma unroll
          for (int h = 0; h < kGroup; ++h)
            p[h] = pr[h];
        }
#pragma unroll
        for (int i = 0; i < kLanePairs; ++i) {
          const float2 vf = widen(vraw[u][kk][i]);
#pragma unroll
          for (int h = 0; h < kGroup; ++h) {
            acc[h][i][0] = fmaf(p[h], vf.x, acc[h][i][0]);
            acc[h][i][1] = fmaf(p[h], vf.y, acc[h][i][1]);
          }
        }
      }
    __syncwarp(); // ps and cs are rewritten by the next batch
  }

  /// Folds the keys of range r into the state. The warp's first batch is issued, then
  /// `between()` runs (the query staging and its barrier: every warp calls keys), then each
  /// iteration computes a batch while the next one's K (after the scores) and V (after the
  /// weighting) are in flight, with the one after that asked of L2.
  template <typename R, typename Between>
  __device__ __forceinline__ void keys(const R& r, Between between) {
    constexpr int kStride = kWarps * kAttnBatch; // passes from one batch of a warp to the next
    typename R::Chunk kraw[kAttnBatch][kLaneChunks];
    typename R::Pair vraw[kAttnBatch][kLaneKeys][kLanePairs];
    const int a_end = (r.e + kPassKeys - 1) / kPassKeys;
    int a = r.b / kPassKeys + warp;
    load_k(r, a, kraw);
    load_v(r, a, vraw);
    between();
    for (; a < a_end; a += kStride) {
      if (kAttnPrefetch > 0 && a + kAttnPrefetch * kStride < a_end)
        prefetch(r, a + kAttnPrefetch * kStride);
      float sc[kAttnBatch][kLaneHeads];
      scores(r, a, kraw, sc);
      load_k(r, a + kStride, kraw);
      const bool grew = softmax(sc);
      weigh(vraw, grew);
      load_v(r, a + kStride, vraw);
    }
  }

  /// Writes the warp's state for the block merge: max and sum per head into wm and wl [kGroup],
  /// the unnormalised output into wo [kGroup][D].
  __device__ __forceinline__ void store(float* wm, float* wl, float* wo) {
#pragma unroll
    for (int i = 0; i < kLaneHeads; ++i)
#pragma unroll
      for (int off = kKeyLanes; off < kWarp; off *= 2) // the keys' lanes of a head
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], off);
#pragma unroll
    for (int h = 0; h < kGroup; ++h)
#pragma unroll
      for (int i = 0; i < kLanePairs; ++i)
#pragma unroll
        for (int off = kRowLanes; off < kWarp; off *= 2) { // the rows of one load
          acc[h][i][0] += __shfl_xor_sync(0xffffffffu, acc[h][i][0], off);
          acc[h][i][1] += __shfl_xor_sync(0xffffffffu, acc[h][i][1], off);
        }
    if (kg == 0)
#pragma unroll
      for (int i = 0; i < kLaneHeads; ++i)
        if (own_head(i) < kGroup) {
          wm[own_head(i)] = m[i];
          wl[own_head(i)] = l[i];
        }
    if (rg == 0)
#pragma unroll
      for (int h = 0; h < kGroup; ++h)
#pragma unroll
        for (int i = 0; i < kLanePairs; ++i) {
          const int pair = rc + i * kRowLanes;
          if (kPairs % kRowLanes == 0 || pair < kPairs)
            reinterpret_cast<float2*>(wo + h * D)[pair] = make_float2(acc[h][i][0], acc[h][i][1]);
        }
  }
};

} // namespace attn_detail

/// attention(q, k, v, k_cache, v_cache, sinks, positions, token_seq, ctx_lens, block_table)
/// {window, scale} for one (token t = blockIdx.y, kv head g = blockIdx.x, key split
/// s = blockIdx.z of gridDim.z), kAttnThreads threads. q [T, H, D], k/v [T, G, D] fp32; caches
/// CacheT (bf16 or fp32) [blocks, BS, G, D], position j of sequence b in slot
/// kv_slot<BS>(block_table + b * MB, j); sinks bf16 [H]. Token t at position p
/// sees keys lo..p, lo = WINDOW ? p-WINDOW+1 : 0 (clamped at 0): positions < ctx_len come from the
/// cache, the rest from the step's k/v (tokens of a sequence are contiguous with consecutive
/// positions). The key range is cut into gridDim.z equal parts. With one split the block writes
/// out [T, H, D] directly; else it writes its running max/sum [T, H, splits] and unnormalised
/// output [T, H, splits, D] into part_ml (max then sum, 2 floats) and part_o for
/// attention_combine. k, v and the caches are read in 16-byte pieces: 16-byte aligned. The fp32
/// kernel of the split (fp32-grade) plans; plain bf16 plans run attention_decode_mma
/// (attention_mma.cuh) in the canonical order.
template <int H, int G, int D, int BS, int MB, int WINDOW, typename CacheT = __nv_bfloat16>
__device__ __forceinline__ void
attention_decode(const float* __restrict__ q, const float* __restrict__ k,
                 const float* __restrict__ v, const CacheT* __restrict__ k_cache,
                 const CacheT* __restrict__ v_cache, const __nv_bfloat16* __restrict__ sinks,
                 const int* __restrict__ positions, const int* __restrict__ token_seq,
                 const int* __restrict__ ctx_lens, const int* __restrict__ block_table,
                 float scale, float* __restrict__ out, float* __restrict__ part_ml,
                 float* __restrict__ part_o) {
  static_assert(H % G == 0, "query heads must be a multiple of kv heads");
  static_assert(D % 8 == 0, "head_dim must be a multiple of 8");
  using Warp = attn_detail::DecodeWarp<H, G, D, CacheT>;
  constexpr int kGroup = H / G, kWarps = Warp::kWarps;
  __shared__ float4 qs[Warp::kHeads * D / 4];
  __shared__ float4 ps[kWarps][Warp::kBatchKeys * Warp::kHeads / 4];
  __shared__ float cs[kWarps][Warp::kHeads];
  __shared__ float wm[kWarps][kGroup], wl[kWarps][kGroup];
  __shared__ float2 wo[kWarps][kGroup * D / 2];

  const int tid = threadIdx.x, g = blockIdx.x, t = blockIdx.y, split = blockIdx.z;
  const int splits = gridDim.z;
  const int seq = token_seq[t], p = positions[t], ctx = ctx_lens[seq];
  const int* table = block_table + (size_t)seq * MB;
  const int lo = WINDOW > 0 ? max(0, p - WINDOW + 1) : 0;
  const int len = p - lo + 1, per_split = (len + splits - 1) / splits;
  const int begin = lo + split * per_split, end = min(p + 1, begin + per_split);
  // The sinks of this thread's outputs (a weight: loaded now, not at the kernel's end).
  constexpr int kOuts = (kGroup * D + kAttnThreads - 1) / kAttnThreads;
  float sink[kOuts];
#pragma unroll
  for (int u = 0; u < kOuts; ++u) {
    const int idx = tid + u * kAttnThreads;
    sink[u] = splits == 1 && idx < kGroup * D ? bf16_to_float(sinks[g * kGroup + idx / D]) : 0.0f;
  }

  // The scaled queries in chunk order (element r of a head's row: half r / (D/2) of chunk
  // (r % (D/2)) / 4), staged once the warps' first K/V loads are in flight. Those loads come
  // before the wait for the previous kernel (qkv, which wrote q and the step's k and v and,
  // with one token a sequence, the cache slot of position p: never a key read here, see
  // rope_yarn_qk_kv); the cached keys they read were written by earlier steps.
  const int cached_end = min(end, ctx), step_begin = max(begin, ctx);
  auto stage_q = [&] {
    grid_dependency_sync();
    // The step's own keys (qkv's k and v rows, the last of the range): asked of L1 now, so that
    // the warp that folds them in after the cached keys does not start with an L2 round trip
    // while the others wait at the merge's barrier (a decode step has one such key).
    if (tid < kWarp && step_begin < end) {
      constexpr int kLines = (D * 4 + 127) / 128; // lines of an fp32 row
      const int rows = min(end - step_begin, 4);
      for (int i = tid; i < rows * 2 * kLines; i += kWarp) {
        const int j = step_begin + i / (2 * kLines), line = i % kLines;
        const float* row = ((i / kLines) % 2 ? v : k) + (size_t)(t - (p - j)) * (G * D) + g * D;
        asm volatile("prefetch.global.L1 [%0];" ::"l"(reinterpret_cast<const char*>(row) +
                                                     line * 128));
      }
    }
    float* qf = reinterpret_cast<float*>(qs);
    for (int i = tid; i < Warp::kHeads * D; i += kAttnThreads) {
      const int h = i / D, r = i % D;
      const int dim = Warp::kSplit ? r : (r % (D / 2)) / 4 * 8 + r / (D / 2) * 4 + r % 4;
      const float x = h < kGroup ? q[((size_t)t * H + g * kGroup + h) * D + dim] * scale : 0.0f;
      qf[i] = x;
    }
    __syncthreads();
  };
  const int warp = tid / kWarp;
  Warp w(qs, reinterpret_cast<float*>(ps[warp]), cs[warp]);
  if (begin < cached_end) // a pass's slots are consecutive when it lies in one block
    w.keys(attn_detail::key_range<BS % Warp::kPassKeys == 0>(
               k_cache + g * D, v_cache + g * D, begin, cached_end,
               [=](int j) { return kv_slot<BS>(table, j); }),
           stage_q);
  else
    stage_q();
  if (step_begin < end)
    w.keys(attn_detail::key_range<true>(k + g * D, v + g * D, step_begin, end,
                                        [=](int j) { return t - (p - j); }),
           [] {});
  w.store(wm[warp], wl[warp], reinterpret_cast<float*>(wo[warp]));
  __syncthreads();

  // Merge the warps (an empty warp has max -inf and adds nothing) and write out.
#pragma unroll
  for (int u = 0; u < kOuts; ++u) {
    const int idx = tid + u * kAttnThreads;
    if (idx >= kGroup * D)
      break;
    const int hh = idx / D, e = idx % D, head = g * kGroup + hh;
    float mx = neg_inf();
#pragma unroll
    for (int i = 0; i < kWarps; ++i)
      mx = fmaxf(mx, wm[i][hh]);
    float sum = 0.0f, o = 0.0f;
#pragma unroll
    for (int i = 0; i < kWarps; ++i) {
      const float c = wm[i][hh] == neg_inf() ? 0.0f : expf(wm[i][hh] - mx);
      sum += wl[i][hh] * c;
      o += reinterpret_cast<const float*>(wo[i])[idx] * c;
    }
    const size_t th = (size_t)t * H + head;
    if (splits == 1) {
      out[th * D + e] = attn_finish(mx, sum, o, sink[u]);
    } else {
      part_o[(th * splits + split) * D + e] = o;
      if (e == 0) {
        part_ml[(th * splits + split) * 2] = mx;
        part_ml[(th * splits + split) * 2 + 1] = sum;
      }
    }
  }
}

namespace attn_detail {

/// Folds W or fewer splits (n) into the running merge (mx, denom, num) of one output element: all
/// their loads at once, then the sums in split order from the new max.
template <int W>
__device__ __forceinline__ void combine_splits(const float* ml, const float* po, int stride, int n,
                                               float& mx, float& denom, float& num) {
  float m[W], l[W], o[W];
#pragma unroll
  for (int i = 0; i < W; ++i) {
    m[i] = i < n ? ml[2 * i] : neg_inf();
    l[i] = i < n ? ml[2 * i + 1] : 0.0f;
    o[i] = i < n ? po[i * stride] : 0.0f;
  }
  float cm = mx;
#pragma unroll
  for (int i = 0; i < W; ++i)
    cm = fmaxf(cm, m[i]);
  const float r = expf(mx - cm); // rescales what the sink and the earlier splits gave
  denom *= r;
  num *= r;
  mx = cm;
#pragma unroll
  for (int i = 0; i < W; ++i)
    if (i < n) {
      const float c = expf(m[i] - mx); // 0 for an empty split
      denom += l[i] * c;
      num += o[i] * c;
    }
}

} // namespace attn_detail

/// Merges the key splits of attention_decode: one block per (token, head) = (blockIdx.y,
/// blockIdx.x), D threads; splits as in the decode launch. The splits go in chunks of up to
/// kCombineChunk whose loads are all issued at once (a loop over the splits would wait on one L2
/// round trip after another; a chunk of 8 or fewer takes a narrower body). With one chunk
/// (attention_splits' cap) the sums run in split order from the global max, as a two-pass merge
/// would.
constexpr int kCombineChunk = 32;
template <int H, int D>
__device__ __forceinline__ void
attention_combine(const float* __restrict__ part_ml, const float* __restrict__ part_o,
                  const __nv_bfloat16* __restrict__ sinks, int splits, float* __restrict__ out) {
  const int head = blockIdx.x, t = blockIdx.y, e = threadIdx.x;
  if (e >= D)
    return;
  const size_t th = (size_t)t * H + head;
  float mx = bf16_to_float(sinks[head]), denom = 1.0f, num = 0.0f; // the sink: exp(sink - mx)
  for (int base = 0; base < splits; base += kCombineChunk) {
    const int n = min(kCombineChunk, splits - base);
    const float* ml = part_ml + (th * splits + base) * 2; // (max, sum) per split
    const float* po = part_o + (th * splits + base) * D + e;
    if (n <= 8)
      attn_detail::combine_splits<8>(ml, po, D, n, mx, denom, num);
    else
      attn_detail::combine_splits<kCombineChunk>(ml, po, D, n, mx, denom, num);
  }
  out[th * D + e] = num / denom;
}

} // namespace xserv_kernels
