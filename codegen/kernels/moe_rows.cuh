// The tensor-core rows of the MoE decode kernels (moe.cuh: moe_gate_up_mx4_mma,
// moe_down_part_mx4_mma): one warp's dot products of 16 MXFP4 rows with one token's staged
// activations on mma.sync, with the words straight into registers (Mx4MmaRows), through a ring
// of chunks in shared memory (Mx4MmaTileRows), or in the gemms' canonical order (Mx4ChainRows).
#pragma once

#include "xserv_kernels/common.cuh"
#include "xserv_kernels/mxfp4.cuh"

namespace xserv_kernels {
/// d = a b (fresh accumulators) on mma.sync m16n8k16, bf16 operands, fp32 sums; then d += a2 b2.
__device__ __forceinline__ void mx4_mma_pair(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                             unsigned b1, const unsigned (&a2)[4], unsigned b2,
                                             unsigned b3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const float z = 0.0f;
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"
               : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(z));
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a2[0]), "r"(a2[1]), "r"(a2[2]), "r"(a2[3]), "r"(b2), "r"(b3));
#endif
}

/// Stages one token's K activations as the B operand of Mx4MmaRows (the whole block's threads;
/// a barrier must follow): entry 4 b + c holds values 32 b + 8 c + (0, 4), (1, 5), (2, 6),
/// (3, 7) as bf16 pairs, rounded to bf16 and times 2^64 (kMx4XScale, as mxfp4_stage_x), the
/// k-slot order of the A registers thread c builds from word c of block b.
template <int K, int THREADS>
__device__ __forceinline__ void mx4_mma_stage_x(const float* __restrict__ x,
                                                uint4* __restrict__ xs) {
  for (int i = threadIdx.x; i < K / 8; i += THREADS) {
    const float4 lo = reinterpret_cast<const float4*>(x)[2 * i];
    const float4 hi = reinterpret_cast<const float4*>(x)[2 * i + 1];
    const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    float r[8];
#pragma unroll
    for (int j = 0; j < 8; ++j)
      r[j] = act_value<true>(v[j]) * kMx4XScale;
    xs[i] = make_uint4(pack_exact_bf16x2(r[0], r[4]), pack_exact_bf16x2(r[1], r[5]),
                       pack_exact_bf16x2(r[2], r[6]), pack_exact_bf16x2(r[3], r[7]));
  }
}

/// The tensor rows behind MMA rows 0..15 of a warp whose rows start at row0: 16 consecutive
/// rows, or (pairs: gate_up's (gate, up) interleave) 8 pairs with row m the gate row of pair
/// m % 8 for m < 8 and its up row for m >= 8, so that a thread holds both halves of its pair.
__device__ __forceinline__ size_t mx4_mma_row(size_t row0, bool pairs, int m) {
  return pairs ? row0 + 2 * (m % 8) + m / 8 : row0 + m;
}

/// finish(xs, b0, b1, acc_a, acc_b) of a warp's rows: column 0's sums of its two rows (A and B,
/// or g and g + 8) through the derived type's finish_cols<2>.
template <class Rows> struct Mx4FinishOne {
  __device__ __forceinline__ void finish(const uint4* __restrict__ xs, int b0, int b1, float& acc_a,
                                         float& acc_b) {
    float acc[2];
    static_cast<Rows*>(this)->finish_cols(xs, b0, b1, acc);
    acc_a = acc[0];
    acc_b = acc[1];
  }
};

/// One warp's dot products of 16 MXFP4 rows of K values with one token's staged activations
/// (mx4_mma_stage_x) on tensor cores, over the blocks [b0, b1) of K: rows A and B of thread
/// (g = lane / 4, c = lane % 4) are the MMA's rows g and g + 8 (any 16 rows the caller picks).
/// For every 32-value block thread c loads word c of both rows (values 8c .. 8c + 7) and the
/// rows' scale bytes; the word's nibble pairs (k, k + 4) are its A registers as raw bf16 pairs
/// (mx4_pair_raw, no widening), two mma.sync m16n8k16 sum the block's 32 products from zero,
/// and the sum takes the block's scale (mxfp4_block_sum_scale): moe_down_part_mx4's arithmetic
/// (exact products, one fp32 sum per block, then the blocks in order) with each block summed by
/// the tensor cores. The loads go out CH blocks at a time, the next chunk's while this one's
/// MMAs run. Every column of B holds the token, so every lane ends with its rows' sums.
template <int K, int CH> struct Mx4MmaRows : Mx4FinishOne<Mx4MmaRows<K, CH>> {
  static_assert(K % 32 == 0 && CH % 2 == 0, "whole blocks, chunks of block pairs");
  static constexpr int kBlocks = K / 32;
  /// Scale bytes two at a time (16-bit loads: rows of an even block count and even chunk
  /// starts keep them aligned), else one at a time.
  static constexpr bool kPaired = kBlocks % 2 == 0;
  static constexpr int kScaleRegs = kPaired ? CH / 2 : CH;
  static constexpr int kScaleSlots = 0; ///< no shared scale factors (Mx4MmaTileRows' have some)

  const unsigned* wa = nullptr; // word c of block 0 of row A (row B: wb)
  const unsigned* wb = nullptr;
  const unsigned char* sa = nullptr; // the rows' scale bytes
  const unsigned char* sb = nullptr;
  unsigned qa[CH], qb[CH], ca[kScaleRegs], cb[kScaleRegs];

  __device__ __forceinline__ void load(int b, int b1) {
#pragma unroll
    for (int i = 0; i < CH; ++i) {
      const bool live = b + i < b1;
      qa[i] = live ? __ldg(wa + 4 * (b + i)) : 0u;
      qb[i] = live ? __ldg(wb + 4 * (b + i)) : 0u;
    }
#pragma unroll
    for (int i = 0; i < kScaleRegs; ++i) {
      if constexpr (kPaired) {
        const bool live = b + 2 * i < b1;
        ca[i] = live ? __ldg(reinterpret_cast<const unsigned short*>(sa + b) + i) : 0u;
        cb[i] = live ? __ldg(reinterpret_cast<const unsigned short*>(sb + b) + i) : 0u;
      } else {
        const bool live = b + i < b1;
        ca[i] = live ? __ldg(sa + b + i) : 0u;
        cb[i] = live ? __ldg(sb + b + i) : 0u;
      }
    }
  }

  /// Points at the warp's 16 rows of an MXFP4 device tensor (its blocks and its scales,
  /// mxfp4_scales; MMA row m is mx4_mma_row(row0, pairs, m)) and issues the loads of the first
  /// chunk of [b0, b1). b0 is even.
  __device__ __forceinline__ void start(const unsigned char* __restrict__ w,
                                        const unsigned char* __restrict__ scales, size_t row0,
                                        bool pairs, int b0, int b1, uint4* = nullptr,
                                        float4* = nullptr) {
    const int c = threadIdx.x % 4, g = (threadIdx.x % kWarp) / 4;
    const size_t row_a = mx4_mma_row(row0, pairs, g), row_b = mx4_mma_row(row0, pairs, g + 8);
    wa = reinterpret_cast<const unsigned*>(w + row_a * (K / 2)) + c;
    wb = reinterpret_cast<const unsigned*>(w + row_b * (K / 2)) + c;
    sa = scales + row_a * kBlocks;
    sb = scales + row_b * kBlocks;
    load(b0, b1);
  }

  /// NACC 2: the sums of rows A and B over [b0, b1) with column 0 (finish; after start with
  /// the same range). NACC 4: every column its own token (xs: the staging of the token of this
  /// lane's column g = lane / 4): acc = rows A, B times columns 2c, 2c + 1 as (A 2c, A 2c + 1,
  /// B 2c, B 2c + 1), each column's sums the bits its token alone would get.
  template <int NACC>
  __device__ __forceinline__ void finish_cols(const uint4* __restrict__ xs, int b0, int b1,
                                              float (&acc)[NACC]) {
    static_assert(NACC == 2 || NACC == 4, "column 0, or every column");
    const int c = threadIdx.x % 4;
#pragma unroll
    for (int i = 0; i < NACC; ++i)
      acc[i] = 0.0f;
#pragma unroll 1
    for (int b = b0; b < b1; b += CH) {
      unsigned ua[CH], ub[CH], sca[kScaleRegs], scb[kScaleRegs];
#pragma unroll
      for (int i = 0; i < CH; ++i) {
        ua[i] = qa[i];
        ub[i] = qb[i];
      }
#pragma unroll
      for (int i = 0; i < kScaleRegs; ++i) {
        sca[i] = ca[i];
        scb[i] = cb[i];
      }
      if (b + CH < b1)
        load(b + CH, b1);
#pragma unroll
      for (int i = 0; i < CH; ++i) {
        if (b + i >= b1)
          break;
        const uint4 bx = xs[(b + i) * 4 + c];
        const unsigned a[4] = {mx4_pair_raw(ua[i], 0), mx4_pair_raw(ub[i], 0),
                               mx4_pair_raw(ua[i], 1), mx4_pair_raw(ub[i], 1)};
        const unsigned a2[4] = {mx4_pair_raw(ua[i], 2), mx4_pair_raw(ub[i], 2),
                                mx4_pair_raw(ua[i], 3), mx4_pair_raw(ub[i], 3)};
        float d[4];
        mx4_mma_pair(d, a, bx.x, bx.y, a2, bx.z, bx.w);
        unsigned s_a, s_b;
        if constexpr (kPaired) {
          s_a = i % 2 == 0 ? sca[i / 2] & 0xffu : sca[i / 2] >> 8;
          s_b = i % 2 == 0 ? scb[i / 2] & 0xffu : scb[i / 2] >> 8;
        } else {
          s_a = sca[i];
          s_b = scb[i];
        }
        if constexpr (NACC == 2) {
          acc[0] += mxfp4_block_sum_scale(d[0], s_a); // column 0: rows g and g + 8
          acc[1] += mxfp4_block_sum_scale(d[2], s_b);
        } else {
          acc[0] += mxfp4_block_sum_scale(d[0], s_a);
          acc[1] += mxfp4_block_sum_scale(d[1], s_a);
          acc[2] += mxfp4_block_sum_scale(d[2], s_b);
          acc[3] += mxfp4_block_sum_scale(d[3], s_b);
        }
      }
    }
  }
};

/// A warp's 16 MXFP4 rows streamed through its ring of chunks (8 blocks of the 16 rows, 16-byte
/// cp.async, a row's 8 blocks from 8 consecutive lanes, block j of MMA row m at slot j ^ (m % 8)):
/// what Mx4MmaTileRows and Mx4ChainRows share. MMA row m is mx4_mma_row(row0, PAIRS, m).
template <int K, bool PAIRS> struct Mx4RowStream {
  static constexpr int CH = 8;        // blocks per chunk
  const unsigned char* src = nullptr; // block 0 of this lane's first cp.async row (+ 16 jb)
  WarpRowRing ring;

  /// The tensor-row offset of MMA row m0 + 4 j from MMA row m0 (m0 < 4): 4 j, or with PAIRS
  /// 0, 8, 1, 9 (mx4_mma_row).
  static __device__ __forceinline__ constexpr int row_step(int j) {
    return PAIRS ? (j % 2) * 8 + j / 2 : 4 * j;
  }

  /// Points this lane's copies at the rows from row0 of w, the ring at `tile`.
  __device__ __forceinline__ void point(const unsigned char* __restrict__ w, size_t row0,
                                        uint4* tile) {
    const int lane = threadIdx.x % kWarp;
    src = w + mx4_mma_row(row0, PAIRS, lane / CH) * (K / 2) + (lane % CH) * 16;
    ring.init(tile);
  }

  /// Issues chunk b's cp.async (lane l: block l % 8 of MMA rows l / 8 + 4 j) into buffer
  /// `buf`. TAIL: blocks past b1 are zero-filled.
  template <bool TAIL> __device__ __forceinline__ void load_tile(int b, int b1, int buf) {
    const int jb = threadIdx.x % CH;
    const bool live = !TAIL || b + jb < b1;
    const unsigned char* p = src + (size_t)(live ? b : b - jb) * 16;
    const void* const rows[4] = {p, p + (size_t)row_step(1) * (K / 2),
                                 p + (size_t)row_step(2) * (K / 2),
                                 p + (size_t)row_step(3) * (K / 2)};
    ring.copy(buf, rows, live ? 16 : 0);
  }

  /// Issues chunk b into buffer `buf` (nothing at or past b1) and commits a group either way,
  /// so that there is one group a chunk.
  __device__ __forceinline__ void issue(int b, int b1, int buf) {
    if (b + CH <= b1)
      load_tile<false>(b, b1, buf);
    else if (b < b1)
      load_tile<true>(b, b1, buf);
    cp_async_commit();
  }
};

/// Mx4MmaRows with the weights streamed through shared memory and the block scales applied
/// without a branch: chunks of 8 blocks of the 16 rows go in with 16-byte cp.async (a row's 8
/// blocks from 8 consecutive lanes) into the warp's ring of STAGES buffers (`tile`: STAGES x
/// 16 x 8 16-byte slots, block j of row m at slot j ^ (m % 8), so that the rows one ldmatrix
/// reads hit distinct banks), STAGES - 1 chunks in flight while one is computed; ldmatrix.x4
/// hands thread (g, c) word c of rows g and g + 8 of two blocks at once, the A registers
/// Mx4MmaRows loads one word at a time. A block's sum takes its scale as one multiply-add by
/// 2^(s - 65) (exact for scale bytes up to 192): the factors of the warp's whole K split (at
/// most PER blocks, even) are made once, from one pass of 2-byte loads issued with the first
/// chunk, into the warp's `factors` (kScaleSlots float4s: slot 8 p + g holds rows g, g + 8 of
/// block 2 p, then of block 2 p + 1), so a block pair costs one shared load rather than a
/// chunk's worth of scale loads and conversions. A warp with a byte above 192 (weights beyond
/// 2^65) computes its rows with Mx4MmaRows' exact two-step scaling instead. Full chunks run
/// without bounds checks. The same products, block sums and order as Mx4MmaRows. PAIRS: MMA
/// row m is mx4_mma_row(row0, true, m).
template <int K, int STAGES, bool PAIRS, int PER>
struct Mx4MmaTileRows : Mx4RowStream<K, PAIRS>,
                        Mx4FinishOne<Mx4MmaTileRows<K, STAGES, PAIRS, PER>> {
  using Mx4RowStream<K, PAIRS>::CH;
  using Mx4RowStream<K, PAIRS>::ring;
  using Mx4RowStream<K, PAIRS>::issue;
  static_assert(K % 64 == 0 && STAGES >= 2, "an even block count, two buffers or more");
  static_assert(PER % 2 == 0 && PER > 0, "a K split of whole block pairs");
  static constexpr int kBlocks = K / 32;
  static constexpr int kScaleSlots = PER / 2 * 8;  ///< float4 factor slots a warp
  static constexpr int kScaleItems = PER / 2 * 16; // (block pair, MMA row) 2-byte loads
  static constexpr int kScaleLoads = (kScaleItems + kWarp - 1) / kWarp; // ... a lane
  const unsigned char* w = nullptr;                                     // for the exact path
  const unsigned char* scales = nullptr;
  size_t row0 = 0;
  float4* factors = nullptr; // the warp's scale factors (kScaleSlots)
  unsigned raw[kScaleLoads]; // this lane's scale pairs (MMA row lane % 16, pairs lane / 16 + 2u)

  /// Points at the warp's 16 rows, issues the first STAGES - 1 chunks of [b0, b1) (b1 - b0 <=
  /// PER) and the scale bytes of the whole range. `factors_`: the warp's kScaleSlots float4s.
  __device__ __forceinline__ void start(const unsigned char* __restrict__ w_,
                                        const unsigned char* __restrict__ scales_, size_t row0_,
                                        bool, int b0, int b1, uint4* tile_, float4* factors_) {
    const int lane = threadIdx.x % kWarp;
    w = w_;
    scales = scales_;
    row0 = row0_;
    factors = factors_;
    this->point(w_, row0_, tile_);
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st)
      issue(b0 + st * CH, b1, st);
    // Lane l loads the pairs lane / 16 + 2 u of MMA row l % 16 (its row pointer is even: rows
    // of an even block count, an even b0).
    const unsigned short* srow = reinterpret_cast<const unsigned short*>(
        scales_ + mx4_mma_row(row0_, PAIRS, lane % 16) * kBlocks + b0);
#pragma unroll
    for (int u = 0; u < kScaleLoads; ++u) {
      const int p = lane / 16 + 2 * u;
      raw[u] = lane + u * kWarp < kScaleItems && b0 + 2 * p < b1 ? __ldg(srow + p) : 0u;
    }
  }

  /// Turns the loaded scale bytes into the warp's factors; true if any is above 192.
  __device__ __forceinline__ bool make_factors() {
    const int lane = threadIdx.x % kWarp, m = lane % 16;
    bool big = false;
    float* f = reinterpret_cast<float*>(factors) + (m % 8) * 4 + m / 8;
#pragma unroll
    for (int u = 0; u < kScaleLoads; ++u) {
      if (lane + u * kWarp >= kScaleItems)
        break;
      const int p = lane / 16 + 2 * u;
      const unsigned lo = raw[u] & 0xffu, hi = raw[u] >> 8;
      big = big || lo > 192u || hi > 192u;
      f[p * 32] = mx4_scale_factor(lo);
      f[p * 32 + 2] = mx4_scale_factor(hi);
    }
    __syncwarp();
    return __any_sync(0xffffffffu, big);
  }

  /// The chunk at block b (k = b - b0 blocks into the split) from buffer `buf`: TAIL checks
  /// each block against b1.
  template <bool TAIL, int NACC>
  __device__ __forceinline__ void chunk(const uint4* __restrict__ xs, const float4* __restrict__ fg,
                                        int b, int b1, int buf, float (&acc)[NACC]) {
    const int c = threadIdx.x % 4;
    const uint4* xb = xs + b * 4 + c;
#pragma unroll
    for (int i = 0; i < CH; i += 2) {
      if (TAIL && b + i >= b1)
        break;
      unsigned q[4]; // word c of rows g, g + 8 of block i, then of block i + 1
      ring.load_pair(buf, i, q);
      const float4 f = fg[i / 2 * 8]; // rows g, g + 8 of block i, then of block i + 1
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (TAIL && b + i + h >= b1)
          break;
        const unsigned qa = q[2 * h], qb = q[2 * h + 1];
        const uint4 bx = xb[(i + h) * 4];
        const unsigned a[4] = {mx4_pair_raw(qa, 0), mx4_pair_raw(qb, 0), mx4_pair_raw(qa, 1),
                               mx4_pair_raw(qb, 1)};
        const unsigned a2[4] = {mx4_pair_raw(qa, 2), mx4_pair_raw(qb, 2), mx4_pair_raw(qa, 3),
                                mx4_pair_raw(qb, 3)};
        float d[4];
        mx4_mma_pair(d, a, bx.x, bx.y, a2, bx.z, bx.w);
        // 2^(s - 65) (mxfp4_block_sum_scale's first case): the sum times it is exact.
        if constexpr (NACC == 2) {
          acc[0] = fmaf(d[0], h == 0 ? f.x : f.z, acc[0]);
          acc[1] = fmaf(d[2], h == 0 ? f.y : f.w, acc[1]);
        } else {
          acc[0] = fmaf(d[0], h == 0 ? f.x : f.z, acc[0]);
          acc[1] = fmaf(d[1], h == 0 ? f.x : f.z, acc[1]);
          acc[2] = fmaf(d[2], h == 0 ? f.y : f.w, acc[2]);
          acc[3] = fmaf(d[3], h == 0 ? f.y : f.w, acc[3]);
        }
      }
    }
  }

  /// finish for NACC 2 (column 0), or NACC 4: every column its own token, as
  /// Mx4MmaRows::finish_cols.
  template <int NACC>
  __device__ __forceinline__ void finish_cols(const uint4* __restrict__ xs, int b0, int b1,
                                              float (&acc)[NACC]) {
#pragma unroll
    for (int i = 0; i < NACC; ++i)
      acc[i] = 0.0f;
    if (make_factors()) {     // scale bytes above 192: the exact path
      cp_async_wait<0>();     // no copy outlives the warp's use of its buffers
      Mx4MmaRows<K, 2> exact; // rare: few registers rather than loads in flight
      exact.start(w, scales, row0, PAIRS, b0, b1);
      exact.finish_cols(xs, b0, b1, acc);
      return;
    }
    const float4* fg = factors + (threadIdx.x % kWarp) / 4; // slot 8 p + g
    int buf = 0;                                            // chunk n's buffer: n % STAGES
#pragma unroll 1
    for (int b = b0; b < b1; b += CH, fg += CH / 2 * 8) {
      cp_async_wait<STAGES - 2>(); // this chunk's group has landed (this lane's copies)
      __syncwarp(); // ... and every lane's; every lane is done with the previous chunk's buffer
      issue(b + (STAGES - 1) * CH, b1, buf == 0 ? STAGES - 1 : buf - 1);
      if (b + CH <= b1)
        chunk<false>(xs, fg, b, b1, buf, acc);
      else
        chunk<true>(xs, fg, b, b1, buf, acc);
      buf = buf == STAGES - 1 ? 0 : buf + 1;
    }
    cp_async_wait<0>(); // no copy outlives the warp's use of its buffers
  }
};

/// Stages one token's K activations as the B operand of Mx4ChainRows (the whole block's
/// threads; a barrier must follow): bf16(x) in gemm_act's slot order (wg_k_of_slot), the words
/// of each 64-wide K tile arranged so that thread c of a quad finds its eight (MMA step s,
/// fragment half h) words at 32 kt + 8 c + 2 s + h: word 8 c + q of tile kt holds the tile's
/// slot pair 8 (q / 2) + 4 (q % 2) + c, K values (v, v + 4) of the row. The rounding is
/// gemm_act's (pack_bf16x2), so a token's B values are the prompt gemm's.
template <int K, int THREADS>
__device__ __forceinline__ void mx4_chain_stage_x(const float* __restrict__ x,
                                                  unsigned* __restrict__ xs) {
  static_assert(K % 64 == 0, "whole K tiles");
  for (int i = threadIdx.x; i < K / 2; i += THREADS) {
    const int kt = i / 32, c = (i % 32) / 8, q = i % 8;
    const int a = kt * 64 + wg_k_of_slot(2 * (8 * (q / 2) + 4 * (q % 2) + c));
    xs[i] = pack_bf16x2(x[a], x[a + 4]);
  }
}

/// One warp's dot products of 16 MXFP4 rows of K values with one token, in gemm_wg's order: the
/// canonical order of the MoE's products (docs/DESIGN.md, "Batch invariance"). Per 64-wide K
/// tile thread (g, c) holds values 16 c .. 16 c + 15 of MMA rows g and g + 8 (8 bytes each),
/// dequantised exactly to bf16 (mxfp4_pair_scaled: the BF16 copy's values), and the four
/// mma.sync m16n8k16 of the tile add into one accumulator that runs from zero over the whole of
/// K: the A fragments, B slots and chain of gemm_wg's m64 tile, so a row's sum is the bits the
/// grouped gemm gives it (mma.sync and wgmma chains over one K order agree:
/// tests/codegen/mma_order_gpu_test.cpp). The weights stream through the warp's ring as
/// Mx4MmaTileRows' do (chunks of 8 blocks, 4 K tiles); the 16 rows' scale bytes go into the
/// warp's `factors` region with the first chunk (a 4-aligned copy of each row's bytes, so
/// cp.async can take them). Scale bytes up to 128 need one multiply a pair (the second factor
/// is 1); a warp with a larger byte takes both. Every column of B holds the token, so every lane
/// ends with its rows' sums. Over a K range [b0, b1) of whole tiles (the kernels' K splits,
/// added in order: the grouped gemms' chunks).
template <int K, int STAGES, bool PAIRS>
struct Mx4ChainRows : Mx4RowStream<K, PAIRS>, Mx4FinishOne<Mx4ChainRows<K, STAGES, PAIRS>> {
  using Mx4RowStream<K, PAIRS>::CH; // blocks a chunk: 4 K tiles
  using Mx4RowStream<K, PAIRS>::issue;
  static_assert(K % 64 == 0 && STAGES >= 2, "whole K tiles, two buffers or more");
  static constexpr int kBlocks = K / 32;
  static constexpr int kScaleWords = (kBlocks + 3) / 4 + 1; // a row's bytes from an aligned word
  static constexpr int kScaleRow = 4 * kScaleWords;
  static constexpr int kScaleSlots = (16 * kScaleRow + 15) / 16; ///< float4 slots a warp
  unsigned ring_base = 0;                                        // the warp's ring (shared address)
  const unsigned char* sc = nullptr; // the rows' scale copies: row m at m kScaleRow
  // Fixed over K, so that a tile adds only its chunk's place: this lane's words of row g in
  // tile u of a buffer at w_off + 32 (u ^ w_sw) (row g + 8's 1,024 bytes on), its scale bytes
  // of rows g and g + 8 at block 0 (then + b + 2 u), and its activation words at K tile 0.
  unsigned w_off = 0, w_sw = 0;
  const unsigned char* sc_a = nullptr;
  const unsigned char* sc_b = nullptr;
  int x_off = 0;

  /// Points at the warp's 16 rows (MMA row m is mx4_mma_row(row0, PAIRS, m)), copies their
  /// scale bytes and issues the first STAGES - 1 chunks. `factors_`: the warp's kScaleSlots.
  __device__ __forceinline__ void start(const unsigned char* __restrict__ w,
                                        const unsigned char* __restrict__ scales, size_t row0, bool,
                                        int b0, int b1, uint4* tile, float4* factors_) {
    const int lane = threadIdx.x % kWarp, g = lane / 4;
    this->point(w, row0, tile);
    ring_base = smem_u32(tile);
    unsigned char* copy = reinterpret_cast<unsigned char*>(factors_);
    sc = copy;
    // Row m's bytes from the aligned word holding its first; a word holding none is zeros.
    for (int i = lane; i < 16 * kScaleWords; i += kWarp) {
      const int m = i / kScaleWords, j = i % kScaleWords;
      const size_t first = reinterpret_cast<size_t>(scales + mx4_mma_row(row0, PAIRS, m) * kBlocks);
      const size_t word = (first & ~size_t(3)) + 4 * size_t(j);
      const bool live = word < first + kBlocks; // else zeros
      cp_async4(copy + m * kScaleRow + 4 * j,
                reinterpret_cast<const void*>(live ? word : first & ~size_t(3)), live);
    }
    const int at_a =
        int(reinterpret_cast<size_t>(scales + mx4_mma_row(row0, PAIRS, g) * kBlocks) & 3);
    const int at_b =
        int(reinterpret_cast<size_t>(scales + mx4_mma_row(row0, PAIRS, g + 8) * kBlocks) & 3);
    const int c = lane % 4;
    // Tile u's words of row g: 16-byte slot j ^ g of the row's 8 (j = 2 u + c / 2), then half
    // c % 2 of it; (2 u + c / 2) ^ g = 2 (u ^ (g / 2)) + (c / 2 ^ g % 2).
    w_off = (g * 8 + ((c / 2) ^ (g % 2))) * 16 + (c % 2) * 8;
    w_sw = g / 2;
    sc_a = sc + g * kScaleRow + at_a + c / 2;
    sc_b = sc + (g + 8) * kScaleRow + at_b + c / 2;
    x_off = 8 * c;
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) // the scale copies join the first chunk's group
      issue(b0 + st * CH, b1, st);
  }

  /// Tile u (0..3) of the chunk in buffer `buf`, at block b of K: its four MMAs into d. BIG:
  /// some scale byte of the warp's rows is past 128 (both factors), else one multiply a pair.
  template <bool BIG>
  __device__ __forceinline__ void tile(const unsigned* __restrict__ xw, int b, int u, int buf,
                                       float (&d)[4]) const {
    const unsigned at = ring_base + buf * WarpRowRing::kChunkBytes + w_off + 32 * (u ^ w_sw);
    unsigned wa0, wa1, wb0, wb1; // values 16 c .. 16 c + 15 of rows g, g + 8
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(wa0), "=r"(wa1) : "r"(at));
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(wb0), "=r"(wb1) : "r"(at + 1024));
    const unsigned sa = sc_a[b + 2 * u], sb = sc_b[b + 2 * u];
    const uint2 fa = BIG ? mxfp4_scale_factors(sa) : make_uint2(mxfp4_small_scale_factor(sa), 0u);
    const uint2 fb = BIG ? mxfp4_scale_factors(sb) : make_uint2(mxfp4_small_scale_factor(sb), 0u);
    const uint4* xt = reinterpret_cast<const uint4*>(xw + 32 * (b / 2 + u) + x_off);
    const uint4 x0 = xt[0], x1 = xt[1];
    const unsigned xb[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    // Pair i (= 2 s + h) of a row: values (v, v + 4), v = 8 (i / 4) + i % 4 (gemm_wg's pair_of).
    auto pair = [&](unsigned w0, unsigned w1, uint2 f, int i) -> unsigned {
      const unsigned raw = mx4_pair_raw(i < 4 ? w0 : w1, i % 4);
      return BIG ? mxfp4_pair_scaled(raw, f) : bf16x2_mul(raw, f.x);
    };
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const unsigned a[4] = {pair(wa0, wa1, fa, 2 * s), pair(wb0, wb1, fb, 2 * s),
                             pair(wa0, wa1, fa, 2 * s + 1), pair(wb0, wb1, fb, 2 * s + 1)};
      mma_bf16(d, a, xb[2 * s], xb[2 * s + 1]);
    }
  }

  template <bool BIG>
  __device__ __forceinline__ void run(const unsigned* __restrict__ xw, int b0, int b1,
                                      float (&d)[4]) {
    int buf = 0; // chunk n's buffer: n % STAGES
#pragma unroll 1
    for (int b = b0; b < b1; b += CH) {
      if (b > b0) {
        cp_async_wait<STAGES - 2>();
        __syncwarp();
      }
      issue(b + (STAGES - 1) * CH, b1, buf == 0 ? STAGES - 1 : buf - 1);
      if (b + CH <= b1) {
#pragma unroll
        for (int u = 0; u < CH / 2; ++u)
          tile<BIG>(xw, b, u, buf, d);
      } else {
        for (int u = 0; 2 * u < b1 - b; ++u)
          tile<BIG>(xw, b, u, buf, d);
      }
      buf = buf == STAGES - 1 ? 0 : buf + 1;
    }
  }

  /// NACC 2: column 0's sums of MMA rows g and g + 8 over blocks [b0, b1) (finish; after start
  /// with the same range; xs from mx4_chain_stage_x). NACC 4: every column its own token
  /// (xs: the staging of the token of this lane's column g = lane / 4), acc = (g 2c, g 2c + 1,
  /// g + 8 2c, g + 8 2c + 1), as Mx4MmaRows::finish_cols: a column's chain is the one its token
  /// alone would get (MMA columns are independent).
  template <int NACC>
  __device__ __forceinline__ void finish_cols(const uint4* __restrict__ xs, int b0, int b1,
                                              float (&acc)[NACC]) {
    static_assert(NACC == 2 || NACC == 4, "column 0, or every column");
    cp_async_wait<STAGES - 2>(); // the scales and the first chunk (this lane's copies) ...
    __syncwarp();                // ... and every lane's
    const int lane = threadIdx.x % kWarp;
    bool big = false;
    for (int i = lane; i < 16 * kScaleRow / 4; i += kWarp) {
      const unsigned v = reinterpret_cast<const unsigned*>(sc)[i];
      // a neighbour's bytes in a row's first or last word only cost the exact path
      big = big || (v & 0xffu) > 128u || ((v >> 8) & 0xffu) > 128u || ((v >> 16) & 0xffu) > 128u ||
            (v >> 24) > 128u;
    }
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const unsigned* xw = reinterpret_cast<const unsigned*>(xs);
    if (__any_sync(0xffffffffu, big))
      run<true>(xw, b0, b1, d);
    else
      run<false>(xw, b0, b1, d);
    cp_async_wait<0>(); // no copy outlives the warp's use of its buffers
    if constexpr (NACC == 2) {
      acc[0] = d[0]; // column 0: rows g and g + 8
      acc[1] = d[2];
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        acc[i] = d[i];
    }
  }
};

template <int STAGES, int K, int CH, bool PAIRS, int PER> struct Mx4MmaPicker {
  using type = Mx4MmaTileRows<K, STAGES, PAIRS, PER>;
};
template <int K, int CH, bool PAIRS, int PER> struct Mx4MmaPicker<0, K, CH, PAIRS, PER> {
  using type = Mx4MmaRows<K, CH>;
};
/// The tensor-core rows of a warp: words loaded straight into registers CH blocks at a time
/// (STAGES 0), or streamed through a shared-memory ring of STAGES chunks of 8 blocks, over K
/// splits of at most PER blocks.
template <bool CHAIN, class Chain, class Other> struct Mx4ChainIf { using type = Other; };
template <class Chain, class Other> struct Mx4ChainIf<true, Chain, Other> { using type = Chain; };
/// CHAIN: Mx4ChainRows (gemm_wg's order, the whole of K).
template <int STAGES, int K, int CH, bool PAIRS, int PER, bool CHAIN = false>
using Mx4MmaPick =
    typename Mx4ChainIf<CHAIN, Mx4ChainRows<K, STAGES, PAIRS>,
                        typename Mx4MmaPicker<STAGES, K, CH, PAIRS, PER>::type>::type;

/// Stages a token's activations the way the picked rows read them: Mx4ChainRows' slot order
/// (CHAIN), else mx4_mma_stage_x's.
template <int K, int THREADS, bool CHAIN>
__device__ __forceinline__ void mx4_stage_for(const float* __restrict__ x, uint4* __restrict__ xs) {
  if constexpr (CHAIN)
    mx4_chain_stage_x<K, THREADS>(x, reinterpret_cast<unsigned*>(xs));
  else
    mx4_mma_stage_x<K, THREADS>(x, xs);
}

} // namespace xserv_kernels
