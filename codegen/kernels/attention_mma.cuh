// Attention with sinks on tensor cores in one canonical order for every step (see "The
// canonical order" below): the prompt kernel attention_prefill_mma (attention_prefill's masks
// and sequence segments), the decode kernel attention_decode_mma and attention_combine_chunks,
// the scores Q K^T and the weighted values P V as mma.sync m16n8k16 products of fp16 operands
// accumulated in fp32. Plans with plain bf16 gemm activations (compile --gemm-precision bf16,
// the default) run every attention step on them; the split (fp32-grade) plans keep the SIMT
// kernels (attention_prefill.cuh, attention.cuh).
//
// Precision: q * scale, k and v are rounded to fp16 (11 significant bits, a relative error of at
// most 2^-12 each: 8x finer than the bf16 the gemms' activations get); the softmax weights p go
// in as an fp16 pair hi + lo (~22 bits); every sum, the running max, the exponentials and the
// normaliser are fp32. Values beyond fp16's range saturate to +-65504 (cvt .satfinite; NaN
// stays NaN): the projections' outputs of a normed residual stream sit orders of magnitude
// below it. bf16 caches convert to fp16 exactly for magnitudes in [2^-14, 65504].
#pragma once

#include "xserv_kernels/attention.cuh" // pack_f16x2, round_f16x2
#include "xserv_kernels/common.cuh"

namespace xserv_kernels {

/// Threads per block of attention_prefill_mma (8 warps of 16 query rows each), query rows (token,
/// head) per block and keys per shared-memory tile.
constexpr int kMmaAttnThreads = 256;
constexpr int kMmaAttnRows = 128;
constexpr int kMmaAttnKeys = 64;

/// Dynamic shared memory of attention_prefill_mma for head_dim D: every thread's D / 2 folded
/// output values.
__host__ __device__ constexpr int attention_prefill_mma_smem(int D) {
  return kMmaAttnThreads * (D / 2) * 4;
}

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

namespace attn_mma {

constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

/// A lane's softmax state of its two fragment rows (gq and gq + 8 of its warp's 16) in
/// registers: the max m in log2 units (a whole number; -inf before the first visible key), the
/// sum of the weights l and the accumulators of NDT output tiles of 8 dims (o[j][2 i + e]: row
/// i, dim 8 (dt0 + j) + 2 cq + e). Over one chunk (ChunkState) l is this lane's share (its key
/// columns); over the chunks folded so far (TotalState) it is the row's whole sum, on every
/// lane of the row.
template <int NDT> struct RowState {
  float m[2], l[2], o[NDT][4];
  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int i = 0; i < 2; ++i)
      m[i] = neg_inf(), l[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < NDT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        o[j][e] = 0.0f;
  }
};
template <int NDT> using ChunkState = RowState<NDT>;
template <int NDT> using TotalState = RowState<NDT>;

/// Folding a chunk (max cm, sum cl, values co) into a total (tm, tl, to): with M = max(tm, cm),
/// to <- to 2^(tm - M) + co 2^(cm - M), the same for the sums, both factors exact powers of two
/// and each a single rounded add, written with explicit roundings so that every kernel (the
/// prompt kernel in registers, attention_combine_chunks from the decode kernel's partials)
/// computes it alike. Callers skip an empty chunk (cm = -inf) and copy a chunk into an empty
/// total: neither is an operation.
struct Fold {
  float a, b;
  __device__ __forceinline__ Fold(float& tm, float cm) {
    const float mx = fmaxf(tm, cm);
    a = exp2f(__fsub_rn(tm, mx));
    b = exp2f(__fsub_rn(cm, mx));
    tm = mx;
  }
  __device__ __forceinline__ float operator()(float t, float c) const {
    return __fadd_rn(__fmul_rn(t, a), __fmul_rn(c, b));
  }
};

/// The output of a row from its total (m in log2 units) and its sink: attn_finish's formula
/// with explicit roundings (the prompt kernel, the decode kernel and the combine all end here).
__device__ __forceinline__ float finish_log2(float m, float l, float o, float sink) {
  const float mn = __fmul_rn(m, kLn2), mx = fmaxf(mn, sink);
  const float c = expf(__fsub_rn(mn, mx));
  return __fdiv_rn(__fmul_rn(o, c), __fadd_rn(__fmul_rn(l, c), expf(__fsub_rn(sink, mx))));
}

/// TotalState with its output accumulators in shared memory (the prompt kernel's: its registers
/// hold the chunk's), element (j, e) of thread tid at o[(4 j + e) * threads + tid].
template <int NDT> struct TotalShared {
  float m[2], l[2];
  float* o;
  int stride;
  __device__ __forceinline__ TotalShared(float* smem, int threads) : o(smem + threadIdx.x), stride(threads) {}
  __device__ __forceinline__ float get(int j, int e) const { return o[(4 * j + e) * stride]; }
  __device__ __forceinline__ void set(int j, int e, float v) { o[(4 * j + e) * stride] = v; }
  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int i = 0; i < 2; ++i)
      m[i] = neg_inf(), l[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < NDT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        set(j, e, 0.0f);
  }
};

/// Register totals, with TotalShared's accessors.
template <int NDT> __device__ __forceinline__ float total_get(const TotalState<NDT>& t, int j, int e) {
  return t.o[j][e];
}
template <int NDT> __device__ __forceinline__ void total_set(TotalState<NDT>& t, int j, int e, float v) {
  t.o[j][e] = v;
}
template <int NDT> __device__ __forceinline__ float total_get(const TotalShared<NDT>& t, int j, int e) {
  return t.get(j, e);
}
template <int NDT> __device__ __forceinline__ void total_set(TotalShared<NDT>& t, int j, int e, float v) {
  t.set(j, e, v);
}

/// Folds the lane's chunk state into its total state (TotalState or TotalShared) and resets the
/// chunk (every lane of the warp calls it: the row sums are summed over the row's 4 lanes by
/// shuffles).
template <int NDT, typename Total>
__device__ __forceinline__ void fold_chunk(Total& tot, ChunkState<NDT>& ch) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float l = ch.l[i];
    l = __fadd_rn(l, __shfl_xor_sync(0xffffffffu, l, 1));
    l = __fadd_rn(l, __shfl_xor_sync(0xffffffffu, l, 2));
    if (ch.m[i] == neg_inf())
      continue; // an empty chunk (its sums are 0)
    if (tot.m[i] == neg_inf()) {
      tot.m[i] = ch.m[i];
      tot.l[i] = l;
#pragma unroll
      for (int j = 0; j < NDT; ++j)
#pragma unroll
        for (int e = 2 * i; e < 2 * i + 2; ++e)
          total_set(tot, j, e, ch.o[j][e]);
      continue;
    }
    const Fold f(tot.m[i], ch.m[i]);
    tot.l[i] = f(tot.l[i], l);
#pragma unroll
    for (int j = 0; j < NDT; ++j)
#pragma unroll
      for (int e = 2 * i; e < 2 * i + 2; ++e)
        total_set(tot, j, e, f(total_get(tot, j, e), ch.o[j][e]));
  }
  ch.reset();
}

/// Halves per shared-memory row of a staged key or value tile (D + 8: the 8 rows one ldmatrix
/// reads start 16 bytes apart modulo 128, no bank conflicts), and halves per plane of a tile
/// (SPLIT stages a second plane: what fp16 left of each value).
template <int D> constexpr int kTileRow = D + 8;
template <int D> constexpr int kTilePlane = kMmaAttnKeys * (D + 8);

/// Q * scale of a lane's two rows as A fragments: hi[kd] = {(row 0, dims 16kd + 2cq..), (row 1,
/// ..), (row 0, +8), (row 1, +8)} in fp16; with SPLIT lo holds what fp16 left of each (hi + lo
/// keeps ~22 significant bits).
template <int D, bool SPLIT> struct QFrags {
  unsigned hi[D / 16][4];
  unsigned lo[SPLIT ? D / 16 : 1][4];
};

/// Two values as the fp16 pair hi (and with SPLIT the pair of what it left, lo).
template <bool SPLIT>
__device__ __forceinline__ void f16_pair(float x, float y, unsigned& hi, unsigned& lo) {
  hi = pack_f16x2(x, y);
  if constexpr (SPLIT) {
    const float2 h = round_f16x2(x, y);
    lo = pack_f16x2(__fsub_rn(x, h.x), __fsub_rn(y, h.y));
  }
}

/// One key tile of the canonical attention order for a warp's 16 query rows: keys kt ..
/// kt + kMmaAttnKeys - 1, staged in shared memory as fp16 rows of kTileRow<D> halves (ks, vs;
/// with SPLIT a second plane kTilePlane<D> further holds the remainders; zeros for keys outside
/// the staged range), row i of this lane seeing keys lo[i]..hi[i]. S = Q K^T (q: Q * scale as A
/// fragments; SPLIT: hi k_hi + hi k_lo + lo k_hi), the mask (-inf), the online softmax into `st`
/// (a row's max over its 4 lanes in log2 units rounded up to a whole number, as softmax_ref_log2
/// says; p = 2^(s - max); every rescale a power of two) and o += P V for the NDT output tiles
/// from dt0 on (the weights as an fp16 pair hi + lo; SPLIT: p_hi v_hi + p_hi v_lo + p_lo v_hi,
/// else p_hi v + p_lo v; V's fragments by transposing ldmatrix). The prompt kernel calls it with
/// every tile (dt0 0), the decode kernel's warps each with their share: a row's arithmetic is
/// this function's whatever kernel runs it.
template <int D, int NDT, bool SPLIT>
__device__ __forceinline__ void tile_step(const QFrags<D, SPLIT>& q, const unsigned short* ks,
                                          const unsigned short* vs, int kt, const int (&lo)[2],
                                          const int (&hi)[2], ChunkState<NDT>& st, int dt0) {
  static_assert(NDT % 2 == 0, "output tiles go in pairs (one ldmatrix.x4)");
  constexpr int KT = kMmaAttnKeys;
  constexpr int KS = kTileRow<D>;
  constexpr int PL = kTilePlane<D>;
  constexpr int NT = KT / 8; // score tiles of 8 keys
  constexpr int KD = D / 16; // k steps of Q K^T
  const int lane = threadIdx.x % 32, cq = lane % 4;
  const int mi = lane / 8, mr = lane % 8; // ldmatrix: lane l reads row l % 8 of matrix l / 8

  // 1. Scores of the 16 rows against the tile's 64 keys.
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
      const int at = ((nt + mi / 2) * 8 + mr) * KS + kd * 16 + (mi % 2) * 8;
      unsigned b[4];
      ldmatrix_x4(b, ks + at);
      mma_f16(s[nt], q.hi[kd], b[0], b[1]);
      mma_f16(s[nt + 1], q.hi[kd], b[2], b[3]);
      if constexpr (SPLIT) {
        unsigned bl[4];
        ldmatrix_x4(bl, ks + PL + at);
        mma_f16(s[nt], q.hi[kd], bl[0], bl[1]);
        mma_f16(s[nt + 1], q.hi[kd], bl[2], bl[3]);
        mma_f16(s[nt], q.lo[kd], b[0], b[1]);
        mma_f16(s[nt + 1], q.lo[kd], b[2], b[3]);
      }
    }

  // 2. Mask, online softmax, weights (in place of the scores).
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
    // The running max as a whole power of two (softmax_ref_log2): a row that has seen no key
    // yet keeps m = -inf and subtracts 0 (all its weights are 0).
    const float mx = fmaxf(st.m[i], ceilf(mt));
    const float mu = mx == neg_inf() ? 0.0f : mx;
    const float corr = exp2f(__fsub_rn(st.m[i], mu)); // a power of two (0 while m = -inf)
    st.m[i] = mx;
    float sum = 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[nt][2 * i + e];
        x = exp2f(__fsub_rn(x, mu)); // 0 for a masked key
        sum = __fadd_rn(sum, x);
      }
    st.l[i] = __fadd_rn(__fmul_rn(st.l[i], corr), sum);
#pragma unroll
    for (int j = 0; j < NDT; ++j) {
      st.o[j][2 * i] = __fmul_rn(st.o[j][2 * i], corr);
      st.o[j][2 * i + 1] = __fmul_rn(st.o[j][2 * i + 1], corr);
    }
  }

  // 3. o += P V: the weights of keys 16kk .. 16kk+15 are the A fragment
  // {s[2kk][0..1], s[2kk][2..3], s[2kk+1][0..1], s[2kk+1][2..3]}, as an fp16 pair hi + lo
  // (~22 significant bits).
#pragma unroll
  for (int kk = 0; kk < KT / 16; ++kk) {
    unsigned whi[4], wlo[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float* w = &s[2 * kk + r / 2][2 * (r % 2)];
      f16_pair<true>(w[0], w[1], whi[r], wlo[r]);
    }
#pragma unroll
    for (int j = 0; j < NDT; j += 2) {
      const int at = (kk * 16 + (mi % 2) * 8 + mr) * KS + (dt0 + j + mi / 2) * 8;
      unsigned b[4];
      ldmatrix_x4_trans(b, vs + at);
      mma_f16(st.o[j], whi, b[0], b[1]);
      mma_f16(st.o[j + 1], whi, b[2], b[3]);
      if constexpr (SPLIT) {
        unsigned bl[4];
        ldmatrix_x4_trans(bl, vs + PL + at);
        mma_f16(st.o[j], whi, bl[0], bl[1]);
        mma_f16(st.o[j + 1], whi, bl[2], bl[3]);
      }
      mma_f16(st.o[j], wlo, b[0], b[1]);
      mma_f16(st.o[j + 1], wlo, b[2], b[3]);
    }
  }
}

/// Eight values of a key or value row of the step itself (fp32 k or v) as the cache would give
/// them back: through bf16 for a bf16 cache, so that a key reads the same whether its step
/// wrote it or an earlier one did.
template <typename CacheT> __device__ __forceinline__ void load_step8(const float* p, float (&f)[8]) {
  load_cache8(p, f);
  if constexpr (sizeof(CacheT) == 2) {
#pragma unroll
    for (int i = 0; i < 8; ++i)
      f[i] = __bfloat162float(__float2bfloat16_rn(f[i]));
  }
}

/// Stores 8 fp32 values as fp16 at a shared-memory row position of a tile (with SPLIT what fp16
/// left of each also, kTilePlane<D> further).
template <int D, bool SPLIT>
__device__ __forceinline__ void store_operand8(unsigned short* dst, const float (&f)[8]) {
  uint4 hi, lo;
  f16_pair<SPLIT>(f[0], f[1], hi.x, lo.x);
  f16_pair<SPLIT>(f[2], f[3], hi.y, lo.y);
  f16_pair<SPLIT>(f[4], f[5], hi.z, lo.z);
  f16_pair<SPLIT>(f[6], f[7], hi.w, lo.w);
  *reinterpret_cast<uint4*>(dst) = hi;
  if constexpr (SPLIT)
    *reinterpret_cast<uint4*>(dst + kTilePlane<D>) = lo;
}

/// Stages key tile kt .. kt + kMmaAttnKeys - 1 of kv head g (the block's THREADS threads; the
/// caller's barriers around it): keys lo..hi as fp16 (store_operand8), zeros outside (zero
/// weights stay zero, and a key no row sees is never read). Keys below ctx come from the
/// sequence's cache blocks (`table`), the others from the step's k and v at row j + row_offset
/// (load_step8). PART splits the staging in two for a kernel that starts before the step's k
/// and v exist: 1 stages the cached keys and the zeros, 2 the step's own keys; 0 stages all.
template <int G, int D, int BS, int THREADS, bool SPLIT, typename CacheT, int PART = 0>
__device__ __forceinline__ void stage_tile(unsigned short* ks, unsigned short* vs, int kt, int lo,
                                           int hi, int ctx, const int* table, int g, int row_offset,
                                           const float* k, const float* v, const CacheT* k_cache,
                                           const CacheT* v_cache) {
  constexpr int KS = kTileRow<D>;
  for (int c = threadIdx.x; c < kMmaAttnKeys * D / 8; c += THREADS) {
    const int jj = c / (D / 8), e = (c % (D / 8)) * 8, j = kt + jj;
    const bool step_row = j >= lo && j <= hi && j >= ctx;
    if ((PART == 1 && step_row) || (PART == 2 && !step_row))
      continue;
    float kf[8], vf[8];
    if (j >= lo && j <= hi) {
      if (j < ctx) {
        const size_t off = ((size_t)kv_slot<BS>(table, j) * G + g) * D + e;
        load_cache8(k_cache + off, kf);
        load_cache8(v_cache + off, vf);
      } else {
        const size_t off = ((size_t)(j + row_offset) * G + g) * D + e;
        load_step8<CacheT>(k + off, kf);
        load_step8<CacheT>(v + off, vf);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i)
        kf[i] = vf[i] = 0.0f;
    }
    store_operand8<D, SPLIT>(ks + jj * KS + e, kf);
    store_operand8<D, SPLIT>(vs + jj * KS + e, vf);
  }
}

} // namespace attn_mma

/// The canonical order, in plans with plain bf16 gemm activations (the default):
/// a query's keys go in tiles of kMmaAttnKeys at multiples of kMmaAttnKeys, grouped into chunks
/// of CHUNK keys at multiples of CHUNK; within a chunk the tiles run an online softmax from
/// nothing (tile_step), and the chunks' states are folded in key order (fold_chunk, Fold), then
/// finished with the sink (finish_log2). Every boundary is a key position, never a property of
/// the step, so a query's output is bitwise the same whether its step holds 1 token or 8,192,
/// is a decode or a prompt step, or its prompt came whole or in pieces: the prompt kernel below
/// folds its chunks in registers; the decode kernel folds them itself or leaves one partial
/// state a chunk for attention_combine_chunks, which folds them in the same order.
///
/// attention(q, k, v, k_cache, v_cache, sinks, positions, token_seq, ctx_lens, block_table)
/// {window, scale} for prompt steps: operands, layouts and masks as attention_prefill, the
/// sequence segments of a query tile the same. A block serves QT = 128 / (H / G) consecutive
/// tokens of kv head g = blockIdx.x (the last query tiles first): 128 rows r = token-in-tile *
/// (H/G) + head-in-group, warp w owning rows 16w .. 16w + 15 as one MMA row tile. Per key tile
/// (the whole block): keys and values are staged in shared memory as fp16 rows of D + 8 halves
/// (the 8 rows one ldmatrix reads start 16 bytes apart modulo 128: no bank conflicts); a warp
/// none of whose rows sees a key of the tile skips it. Keys of the step itself (positions >=
/// ctx_len) come from k and v as the cache would hold them (load_step8).
///
/// SPLIT (the fp32-grade plans): every operand as an fp16 pair hi + lo (tile_step).
///
/// Launch: kMmaAttnThreads threads, grid (G, ceil(tokens / QT)), attention_prefill_mma_smem(D)
/// bytes of dynamic shared memory (the rows' folded outputs: their registers hold the chunk's;
/// 32 KB at D = 64) besides the static tiles (2 x 64 x (D + 8) halves, 18 KB at D = 64; twice
/// that with SPLIT).
template <int H, int G, int D, int BS, int MB, int WINDOW, int CHUNK,
          typename CacheT = __nv_bfloat16, bool SPLIT = false>
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
  static_assert(CHUNK % KT == 0, "a chunk is whole key tiles");
  constexpr int DT = D / 8; // output tiles of 8 dims
  constexpr int KD = D / 16;

  __shared__ __align__(16) unsigned short ks[(SPLIT ? 2 : 1) * kTilePlane<D>],
      vs[(SPLIT ? 2 : 1) * kTilePlane<D>];
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

  QFrags<D, SPLIT> qf;
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
        f16_pair<SPLIT>(__fmul_rn(x.x, scale), __fmul_rn(x.y, scale), qf.hi[kd][2 * h + i],
                        qf.lo[SPLIT ? kd : 0][2 * h + i]);
      }
  for (int i = tid; i < ntok; i += kMmaAttnThreads) {
    tok_pos[i] = positions[t0 + i];
    tok_seq[i] = token_seq[t0 + i];
  }

  extern __shared__ __align__(16) float total_o[];
  ChunkState<DT> ch;
  TotalShared<DT> tot(total_o, kMmaAttnThreads);
  ch.reset();
  tot.reset(); // each thread its own elements: no barrier needed
  __syncthreads(); // tok_pos / tok_seq visible

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

    // Tiles from the chunk that holds the segment's first key: the boundaries are positions.
    for (int kt = kmin / CHUNK * CHUNK; kt <= p_last; kt += KT) {
      __syncthreads(); // the previous tile fully read
      stage_tile<G, D, BS, kMmaAttnThreads, SPLIT>(ks, vs, kt, kmin, p_last, ctx, table, g,
                                                   t_first - p_first, k, v, k_cache, v_cache);
      __syncthreads();

      bool sees = false;
#pragma unroll
      for (int i = 0; i < 2; ++i)
        sees |= max(lo[i], kt) <= min(hi[i], kt + KT - 1);
      if (__any_sync(0xffffffffu, sees))
        tile_step<D, DT, SPLIT>(qf, ks, vs, kt, lo, hi, ch, 0);
      if ((kt + KT) % CHUNK == 0 || kt + KT > p_last)
        fold_chunk(tot, ch); // the chunk ends (or the segment's keys do)
    }
    sb = se;
  }

  // Epilogue: out = finish_log2 per element.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (tl[i] >= ntok)
      continue;
    const float sink = bf16_to_float(sinks[head[i]]);
    float* dst = out + ((size_t)(t0 + tl[i]) * H + head[i]) * D + 2 * cq;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
      *reinterpret_cast<float2*>(dst + dt * 8) =
          make_float2(finish_log2(tot.m[i], tot.l[i], tot.get(dt, 2 * i), sink),
                      finish_log2(tot.m[i], tot.l[i], tot.get(dt, 2 * i + 1), sink));
  }
}

/// Warps per block of attention_decode_mma for head_dim D: each takes an equal share of the D / 8
/// output tiles, in pairs (4 warps where the pairs allow, else 2 or 1).
__host__ __device__ constexpr int attention_decode_mma_warps(int D) {
  return (D / 16) % 4 == 0 ? 4 : (D / 16) % 2 == 0 ? 2 : 1;
}

/// The same attention for steps of few tokens (and decode steps of any size), in the canonical
/// order above: one block per (kv head g = blockIdx.x, token t = blockIdx.y, split z =
/// blockIdx.z of Z = gridDim.z), attention_decode_mma_warps(D) warps. The block's rows are the
/// token's H / G query heads (fragment rows 0 .. H/G - 1 of a 16-row tile; the rest are empty):
/// every warp computes the same scores and weights and its share of the output dims. With Z = 1 the
/// block runs every chunk of the token's keys, folds them and writes out [T, H, D]; else block z
/// runs chunk first + z alone (first: the chunk of the token's first key; an empty state past its
/// last) and writes its state for attention_combine_chunks: part_ml [T, H, Z] (max in log2 units,
/// sum) and part_o [T, H, Z, D]. Keys below ctx_len come from the cache, the step's own from k and
/// v as the cache would hold them (tokens of a sequence are contiguous with consecutive positions).
/// SPLIT as the prompt kernel's. WARPS (0: attention_decode_mma_warps(D)) splits the output
/// dims; every warp computes the block's scores, so the bits do not depend on it. The kernel
/// calls grid_dependency_sync itself (its wrapper does not).
template <int H, int G, int D, int BS, int MB, int WINDOW, int CHUNK,
          typename CacheT = __nv_bfloat16, bool SPLIT = false, int WARPS = 0>
__device__ __forceinline__ void
attention_decode_mma(const float* __restrict__ q, const float* __restrict__ k,
                     const float* __restrict__ v, const CacheT* __restrict__ k_cache,
                     const CacheT* __restrict__ v_cache, const __nv_bfloat16* __restrict__ sinks,
                     const int* __restrict__ positions, const int* __restrict__ token_seq,
                     const int* __restrict__ ctx_lens, const int* __restrict__ block_table,
                     float scale, float* __restrict__ out, float* __restrict__ part_ml,
                     float* __restrict__ part_o) {
  using namespace attn_mma;
  static_assert(H % G == 0, "query heads must be a multiple of kv heads");
  constexpr int kGroup = H / G;
  static_assert(kGroup <= 16, "a token's query heads per kv head fit one 16-row tile");
  static_assert(D % 16 == 0, "head_dim must be a multiple of 16 (pairs of 8-dim output tiles)");
  constexpr int KT = kMmaAttnKeys;
  static_assert(CHUNK % KT == 0, "a chunk is whole key tiles");
  constexpr int KD = D / 16;
  constexpr int kWarps = WARPS > 0 ? WARPS : attention_decode_mma_warps(D);
  constexpr int kThreads = 32 * kWarps;
  static_assert((D / 16) % kWarps == 0, "each warp whole pairs of output tiles");
  constexpr int NDT = D / 8 / kWarps; // output tiles a warp

  __shared__ __align__(16) unsigned short ks[(SPLIT ? 2 : 1) * kTilePlane<D>],
      vs[(SPLIT ? 2 : 1) * kTilePlane<D>];

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int gq = lane / 4, cq = lane % 4;
  const int g = blockIdx.x, t = blockIdx.y, z = blockIdx.z, splits = gridDim.z;
  const int seq = token_seq[t], p = positions[t], ctx = ctx_lens[seq];
  const int* table = block_table + (size_t)seq * MB;
  const int lo = WINDOW > 0 ? max(0, p - WINDOW + 1) : 0;
  const int c_first = lo / CHUNK, c_last = p / CHUNK;
  const int cb = splits == 1 ? c_first : c_first + z, ce = splits == 1 ? c_last : c_first + z;

  int row[2], lo_r[2], hi_r[2];
  bool live[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    row[i] = gq + 8 * i;
    live[i] = row[i] < kGroup;
    lo_r[i] = live[i] ? lo : 1;
    hi_r[i] = live[i] ? p : 0;
  }
  // The block's first key tile, its cached keys (written by earlier steps) and zeros staged
  // before the wait for the previous kernel (qkv, which writes q and the step's k and v and,
  // with one token a sequence, the cache slot of position p: never a key read from the cache
  // here): the positions, the block table and the cache rows come off the critical path; after
  // the wait only q and the step's own keys are read.
  const int c_end = min(ce, c_last), kt0 = max(cb * CHUNK, lo / KT * KT);
  if (cb <= c_end)
    stage_tile<G, D, BS, kThreads, SPLIT, CacheT, 1>(ks, vs, kt0, lo, p, ctx, table, g, t - p, k, v,
                                                     k_cache, v_cache);
  grid_dependency_sync();
  if (cb <= c_end)
    stage_tile<G, D, BS, kThreads, SPLIT, CacheT, 2>(ks, vs, kt0, lo, p, ctx, table, g, t - p, k, v,
                                                     k_cache, v_cache);
  QFrags<D, SPLIT> qf;
#pragma unroll
  for (int kd = 0; kd < KD; ++kd)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float2 x = make_float2(0.0f, 0.0f);
        if (live[i])
          x = *reinterpret_cast<const float2*>(q + ((size_t)t * H + g * kGroup + row[i]) * D +
                                               kd * 16 + h * 8 + 2 * cq);
        f16_pair<SPLIT>(__fmul_rn(x.x, scale), __fmul_rn(x.y, scale), qf.hi[kd][2 * h + i],
                        qf.lo[SPLIT ? kd : 0][2 * h + i]);
      }

  ChunkState<NDT> ch;
  TotalState<NDT> tot;
  ch.reset();
  tot.reset();
  for (int c = cb; c <= c_end; ++c) {
    const int kb = max(c * CHUNK, lo / KT * KT), kend = min((c + 1) * CHUNK, p + 1);
    for (int kt = kb; kt < kend; kt += KT) {
      if (kt != kt0) {   // the first tile is staged above
        __syncthreads(); // the previous tile fully read
        stage_tile<G, D, BS, kThreads, SPLIT>(ks, vs, kt, lo, p, ctx, table, g, t - p, k, v,
                                              k_cache, v_cache);
      }
      __syncthreads();
      tile_step<D, NDT, SPLIT>(qf, ks, vs, kt, lo_r, hi_r, ch, warp * NDT);
    }
    if (splits == 1)
      fold_chunk(tot, ch);
  }

  if (splits == 1) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (!live[i])
        continue;
      const int head = g * kGroup + row[i];
      const float sink = bf16_to_float(sinks[head]);
      float* dst = out + ((size_t)t * H + head) * D + 2 * cq;
#pragma unroll
      for (int j = 0; j < NDT; ++j)
        *reinterpret_cast<float2*>(dst + (warp * NDT + j) * 8) =
            make_float2(finish_log2(tot.m[i], tot.l[i], tot.o[j][2 * i], sink),
                        finish_log2(tot.m[i], tot.l[i], tot.o[j][2 * i + 1], sink));
    }
    return;
  }
  // One chunk's partial state (empty past the token's last chunk): the row sums over 4 lanes.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float l = ch.l[i];
    l = __fadd_rn(l, __shfl_xor_sync(0xffffffffu, l, 1));
    l = __fadd_rn(l, __shfl_xor_sync(0xffffffffu, l, 2));
    if (!live[i])
      continue;
    const size_t th = (size_t)t * H + g * kGroup + row[i];
    if (warp == 0 && cq == 0) {
      part_ml[(th * splits + z) * 2] = ch.m[i];
      part_ml[(th * splits + z) * 2 + 1] = l;
    }
    float* dst = part_o + (th * splits + z) * D + 2 * cq;
#pragma unroll
    for (int j = 0; j < NDT; ++j)
      *reinterpret_cast<float2*>(dst + (warp * NDT + j) * 8) =
          make_float2(ch.o[j][2 * i], ch.o[j][2 * i + 1]);
  }
}

/// Folds attention_decode_mma's chunk states in chunk order and finishes: one block per
/// (token, head) = (blockIdx.y, blockIdx.x), D threads, one output element each. The loads of
/// up to 8 chunks go out at once; the folds then run one after another (attn_mma::Fold), exactly
/// as the prompt kernel folds the same chunks in registers.
template <int H, int D>
__device__ __forceinline__ void
attention_combine_chunks(const float* __restrict__ part_ml, const float* __restrict__ part_o,
                         const __nv_bfloat16* __restrict__ sinks, int splits,
                         float* __restrict__ out) {
  using namespace attn_mma;
  const int head = blockIdx.x, t = blockIdx.y, e = threadIdx.x;
  if (e >= D)
    return;
  const size_t th = (size_t)t * H + head;
  const float sink = bf16_to_float(sinks[head]);
  float tm = neg_inf(), tl = 0.0f, to = 0.0f;
  constexpr int W = 8;
  for (int base = 0; base < splits; base += W) {
    float m[W], l[W], o[W];
#pragma unroll
    for (int i = 0; i < W; ++i) {
      const bool in = base + i < splits;
      m[i] = in ? part_ml[(th * splits + base + i) * 2] : neg_inf();
      l[i] = in ? part_ml[(th * splits + base + i) * 2 + 1] : 0.0f;
      o[i] = in ? part_o[(th * splits + base + i) * D + e] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < W; ++i) {
      if (m[i] == neg_inf())
        continue;
      if (tm == neg_inf()) {
        tm = m[i], tl = l[i], to = o[i];
        continue;
      }
      const Fold f(tm, m[i]);
      tl = f(tl, l[i]);
      to = f(to, o[i]);
    }
  }
  out[th * D + e] = finish_log2(tm, tl, to, sink);
}

} // namespace xserv_kernels
