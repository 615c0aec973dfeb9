// Prefill-path (and batched-decode) matrix multiply on sm_90's warpgroup MMA: y = epilogue(W A^T)
// with the weights W on the MMA's M side (64 rows per m64 tile, A fragments built in registers
// from BF16 or MXFP4 rows) and the step's tokens on its N side (bf16 activations in shared
// memory, read through a descriptor), so a tile of few tokens (an expert's share of a decode
// batch) wastes nothing and each weight row is read once per token tile.
//
// K order: a 64-wide K tile is consumed in the "slot" order of wg_k_of_slot, not 0..63. Each
// thread's A fragments of a K tile then hold 16 consecutive K values of a row (one 8-byte MXFP4
// piece or 32 bf16 bytes), so an MXFP4 fragment is decoded straight from one load; the
// activations are written in the same order by gemm_act, so the products are the same and only
// the order of the tensor cores' sums changes (BF16 and MXFP4 weights share it: their results
// are bitwise equal for equal values).
#pragma once

#include "xserv_kernels/gemm.cuh"
#include "xserv_kernels/wgmma.cuh"

namespace xserv_kernels {

/// The MMA's bf16 activations of fp32 rows (row r = blockIdx.y, 256 threads): xh[r] = bf16(x'[r])
/// in the slot order of every 64-wide K tile (NATURAL: in K order, for cuBLAS, whose weights are
/// the checkpoint's rows), x' = x (NORM: x * rsqrt(mean(x^2) + eps) * ln); with SPLIT also
/// xl[r] = bf16(x' - xh) (hi + lo hold ~16 bits of each value).
template <int K, bool NORM, bool SPLIT, bool NATURAL = false>
__device__ __forceinline__ void
gemm_act(const float* __restrict__ x, const __nv_bfloat16* __restrict__ ln, float eps,
         __nv_bfloat16* __restrict__ xh, __nv_bfloat16* __restrict__ xl) {
  static_assert(K % 64 == 0, "K must be a multiple of the K tile");
  const float* xr = x + (size_t)blockIdx.y * K;
  float inv = NORM && SPLIT ? block_inv_rms<K, 256>(xr, eps) : 1.0f;
  if (NORM && !SPLIT) { // linear_stage_x's sum of squares, bit for bit: a decode GEMV of this
                        // row (qkv_decode, the final norm + lm_head) rounds the same values
    __shared__ float partial[256 / kWarp];
    __shared__ float inv_s;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < K / 4; i += 256)
      ss += sum_sq4(reinterpret_cast<const float4*>(xr)[i]);
    ss = warp_sum(ss);
    if (threadIdx.x % kWarp == 0)
      partial[threadIdx.x / kWarp] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
      float total = 0.0f;
      for (int i = 0; i < 256 / kWarp; ++i)
        total += partial[i];
      inv_s = rsqrtf(total / K + eps);
    }
    __syncthreads();
    inv = inv_s;
  }
  unsigned* oh = reinterpret_cast<unsigned*>(xh + (size_t)blockIdx.y * K);
  unsigned* ol = reinterpret_cast<unsigned*>(xl + (size_t)blockIdx.y * K);
  // Pair u of a K tile: slots 2u, 2u + 1 hold K values a and a + 4 (NATURAL: K 2u and 2u + 1,
  // the row as it is, for a library gemm).
  for (int p = threadIdx.x; p < K / 2; p += 256) {
    const int a = NATURAL ? 2 * p : (p / 32) * 64 + wg_k_of_slot(2 * (p % 32));
    const int b = NATURAL ? a + 1 : a + 4;
    float v0 = xr[a], v1 = xr[b];
    if (NORM) {
      // (x * inv) * ln, in the decode GEMVs' order (linear_stage_x), so that with plain bf16
      // activations a token rounds the same value in both paths
      v0 = v0 * inv * bf16_to_float(ln[a]);
      v1 = v1 * inv * bf16_to_float(ln[b]);
    }
    const unsigned hi = pack_bf16x2(v0, v1);
    oh[p] = hi;
    if (SPLIT) {
      const float h0 = __uint_as_float(hi << 16), h1 = __uint_as_float(hi & 0xffff0000u);
      ol[p] = pack_bf16x2(v0 - h0, v1 - h1);
    }
  }
}

/// Threads of a gemm_wg block: one warpgroup.
constexpr int kWgThreads = 128;

/// Bytes of one pipeline stage of gemm_wg<.., BN, WM, .., MX4, SPLIT, .., KSUB>: KSUB B tiles
/// (BN rows of 128 bytes, each 1024-aligned; with SPLIT the KSUB lo tiles after them), then KSUB
/// A tiles of 64 WM weight rows (bf16: 128 bytes a row; MXFP4: 32 block bytes a row, then a
/// 4-byte scale word a row), rounded to 1024.
__host__ __device__ constexpr int gemm_wg_stage_bytes(int bn, int wm, bool mx4, bool split,
                                                      int ksub = 1) {
  return (ksub * (bn * 128 * (split ? 2 : 1) + 64 * wm * (mx4 ? 36 : 128)) + 1023) / 1024 * 1024;
}
/// Dynamic shared memory of gemm_wg: its stages and 1024 bytes to align the first.
__host__ __device__ constexpr int gemm_wg_smem_bytes(int bn, int wm, int stages, bool mx4,
                                                     bool split, int ksub = 1) {
  return stages * gemm_wg_stage_bytes(bn, wm, mx4, split, ksub) + 1024;
}

/// Where weight row m (0 .. 64 WM - 1 of the block's rows) sits in the A tile: in order, or with
/// SWIGLU each 16-row group's gate rows (even) first and its up rows (odd) after them, so that the
/// thread holding fragment row g (a gate row) holds row g + 8 (its up row) too.
template <bool SWIGLU> __device__ __forceinline__ int wg_a_row(int m) {
  return SWIGLU ? (m & ~15) + ((m & 1) ? 8 : 0) + ((m & 15) >> 1) : m;
}

/// y = epilogue(W_e A^T): each block computes 64 WM weight rows (n0 = blockIdx.x * 64 WM) of one
/// token tile of up to BN rows (dense: rows blockIdx.y * BN.. of `tokens`; grouped: tile
/// blockIdx.y of moe_sort's list). A row r of the tile is xh[arow(r)] (and xl), with
/// arow(r) = GATHER ? pair[r] / KSEL : r: gemm_act's bf16 activations. W_e = w + expert * N * K
/// ([N, K] bf16) or, with MX4, expert e of an MXFP4 device tensor of EXPERTS x N x K values.
/// Epilogues as gemm_bf16's (GemmEpilogue); with SPLITK > 1 (dense stores) block z sums the z-th
/// of SPLITK K ranges into y[z, r, n] for gemm_splitk_reduce.
///
/// Pipeline: a stage holds KSUB K tiles of 64 (one barrier per stage), STAGES stages in flight
/// through cp.async (B in the 128-byte swizzle the descriptor reads; A swizzled the same way by
/// row so the fragment loads hit distinct banks); per K tile each warp loads its rows' 16 K
/// values per thread, builds the four K steps' A fragments in registers (MXFP4: decoded with
/// the block's scale) and issues the MMAs asynchronously, the next step's fragments built while
/// the previous MMA runs. With PIPE a stage's MMAs are still running while the next stage's
/// fragments are built (one batch left in flight; loads run STAGES - 2 stages ahead, so the
/// stage they overwrite is two behind), else each stage's MMAs finish before the next barrier.
/// With STEPS each K step's MMAs are a batch of their own, waited for a step later, and the next
/// stage's loads go out after the first step's MMAs (GemmWgDims::steps; the two places that
/// issue them stay written out: a shared lambda cost the K loop 3 instructions).
///
/// NC: the MMAs' columns, BN or fewer (gemm_wg picks it from the tile's tokens): the tile keeps
/// BN rows of shared memory, but only its first NC rows are loaded and multiplied.
/// SMALL (MXFP4): every scale byte of the weights is at most 128, as compile found the
/// checkpoint's and the upload checks: a pair is scaled by one multiply by 2^(s - 1), the two
/// factors' bits (the second is 1).
/// NATURAL (BF16 weights): K in its natural order, as a library gemm sums it: K step s of a tile
/// multiplies K values 16 s .. 16 s + 15, the A fragments loaded by ldmatrix from the swizzled
/// rows, the activations from gemm_act<.., NATURAL> (the order a chain over K takes in cuBLAS).
template <int K, int N, int BN, int WM, int STAGES, bool MX4, bool SPLIT, bool GROUPED, bool GATHER,
          int KSEL, int EPI, bool BIAS, bool RESIDUAL, int SPLITK, int EXPERTS, int KSUB, bool PIPE,
          int CHUNKS, bool SMALL, bool NATURAL, bool STEPS, int NC>
__device__ __forceinline__ void
gemm_wg_cols(const __nv_bfloat16* __restrict__ xh, const __nv_bfloat16* __restrict__ xl,
             const void* __restrict__ wv, const __nv_bfloat16* __restrict__ b, const float* h,
             float* y, const int* __restrict__ pair, const int* __restrict__ tiles,
             const float* __restrict__ route_w, float limit, float alpha, int tokens) {
  static_assert(K % 64 == 0, "K must be a multiple of the K tile");
  static_assert(BN % 8 == 0 && BN >= 8 && BN <= 256, "BN: 8..256 tokens, a multiple of 8");
  static_assert(NC % 8 == 0 && NC >= 8 && NC <= BN, "NC: 8..BN MMA columns");
  static_assert(WM == 1 || WM == 2, "WM: 1 or 2 m64 tiles per warpgroup");
  static_assert(!NATURAL || !MX4, "the natural K order is for BF16 weights");
  static_assert(EPI != kGemmSwiglu || N % 16 == 0, "swiglu pairs rows within 16-row groups");
  static_assert(SPLITK == 1 || (EPI == kGemmStore && !GROUPED), "split K: dense stores only");
  static_assert((K / 64) % SPLITK == 0, "split K must divide the K tiles");
  static_assert(KSUB >= 1 && KSUB <= 4, "KSUB: 1..4 K tiles a stage");
  static_assert(STAGES >= (PIPE ? 3 : 2), "PIPE keeps a stage of MMAs in flight: 3+ stages");
  static_assert(CHUNKS == 1 || (SPLITK == 1 && !PIPE && (K / 64) % (CHUNKS * KSUB) == 0),
                "K chunks: whole stages of one block's K, each stage's MMAs waited for");
  // (grouped too: an expert row's K ranges summed in order before its epilogue)
  constexpr int BM = 64 * WM;
  constexpr int kTiles = K / 64 / SPLITK;                // K tiles of 64 of this block's range
  constexpr int kKT = (kTiles + KSUB - 1) / KSUB;        // stages of them (the last may be short)
  constexpr int kAhead = PIPE ? STAGES - 2 : STAGES - 1; // stages loaded ahead of the MMAs
  constexpr int kStage = gemm_wg_stage_bytes(BN, WM, MX4, SPLIT, KSUB);
  constexpr int kBBytes = BN * 128;
  constexpr int kBOffLo = kBBytes * KSUB;                 // the lo tiles after the hi ones
  constexpr int kAOff = kBBytes * KSUB * (SPLIT ? 2 : 1); // then the A tiles
  constexpr int kABytes = 64 * WM * (MX4 ? 36 : 128);
  constexpr bool kSwiglu = EPI == kGemmSwiglu;

  extern __shared__ __align__(16) unsigned char smem_wg_raw[];
  __shared__ int rows_b[BN];
  unsigned char* smem = smem_wg_raw + ((1024u - (smem_u32(smem_wg_raw) & 1023u)) & 1023u);

  int expert, begin, end;
  if (!gemm_tile<BN, GROUPED>(tiles, tokens, expert, begin, end))
    return;
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int g = lane / 4, c = lane % 4;
  const int m0 = blockIdx.x * BM;
  const int rows = end - begin;
  const __nv_bfloat16* we = static_cast<const __nv_bfloat16*>(wv) + (size_t)expert * N * K;
  const unsigned char* mblocks =
      static_cast<const unsigned char*>(wv) + (size_t)expert * N * (K / 2);
  const unsigned char* mscales =
      mxfp4_scales<EXPERTS * N, K>(static_cast<const unsigned char*>(wv)) +
      (size_t)expert * N * (K / 32);

  for (int i = tid; i < BN; i += kWgThreads)
    rows_b[i] = i < rows ? (GATHER ? pair[begin + i] / KSEL : begin + i) : -1;
  __syncthreads();

  const int kt0 = SPLITK > 1 ? blockIdx.z * kTiles : 0; // first K tile of this block
  // This thread's cp.async pieces of every stage, fixed over the K loop: their source offsets
  // at K 0 (a K tile adds 64 elements, or 32 MXFP4 bytes), where they land in a stage, and
  // whether they read anything (masked pieces zero-fill). Computed once, the loads of a stage
  // are one add and one cp.async each.
  constexpr int kVB = (NC * 8 + kWgThreads - 1) / kWgThreads; // B pieces a thread
  constexpr int kVA = MX4 ? (BM * 2 + kWgThreads - 1) / kWgThreads : BM * 8 / kWgThreads;
  unsigned b_src[kVB], a_src[kVA];
  int b_dst[kVB], a_dst[kVA];
  bool b_ok[kVB], a_ok[kVA];
  // B: NC rows x 8 chunks of 16 bytes, chunk j of row n at j ^ (n % 8).
#pragma unroll
  for (int v = 0; v < kVB; ++v) {
    const int piece = tid + v * kWgThreads, n = piece / 8, j = piece % 8;
    const int ar = piece < NC * 8 ? rows_b[n] : -1;
    b_src[v] = unsigned(ar >= 0 ? ar : 0) * unsigned(K) + unsigned(j * 8);
    b_dst[v] = piece < NC * 8 ? n * 128 + ((j ^ (n & 7)) << 4) : -1;
    b_ok[v] = ar >= 0;
  }
#pragma unroll
  for (int v = 0; v < kVA; ++v) {
    const int piece = tid + v * kWgThreads;
    if constexpr (MX4) { // per row: 2 x 16 block bytes
      const int m = piece / 2, q = piece % 2, sr = wg_a_row<kSwiglu>(m);
      a_ok[v] = piece < BM * 2 && m0 + m < N;
      a_src[v] = unsigned(a_ok[v] ? m0 + m : 0) * unsigned(K / 2) + unsigned(q * 16);
      a_dst[v] = piece < BM * 2 ? sr * 32 + q * 16 : -1;
    } else { // per row: 8 chunks of 16 bytes, chunk j of A row r at j ^ (r % 8)
      const int m = piece / 8, j = piece % 8, sr = wg_a_row<kSwiglu>(m);
      a_ok[v] = m0 + m < N;
      a_src[v] = unsigned(a_ok[v] ? m0 + m : 0) * unsigned(K) + unsigned(j * 8);
      a_dst[v] = sr * 128 + ((j ^ (sr & 7)) << 4);
    }
  }
  // MXFP4: the scale word of row tid (BM <= 128 rows, one a thread): the aligned word holding a
  // K tile's two scale bytes.
  const bool s_row = MX4 && (BM >= kWgThreads || tid < BM); // (all threads at WM 2)
  const bool s_ok = s_row && m0 + tid < N;
  const size_t s_src = reinterpret_cast<size_t>(mscales) + size_t(s_ok ? m0 + tid : 0) * (K / 32);
  int s_dst = s_row ? BM * 32 + wg_a_row<kSwiglu>(tid) * 4 : 0;
  asm volatile("" : "+r"(s_dst)); // kept in a register, not recomputed from tid every K tile
  // Loads stage `kt`: its K tiles kt * KSUB .. (of this block's kTiles).
  auto issue = [&](int kt) {
    unsigned char* st = smem + (kt % STAGES) * kStage;
#pragma unroll
    for (int sub = 0; sub < KSUB; ++sub) {
      if (kt * KSUB + sub >= kTiles)
        break;
      const int k0 = (kt0 + kt * KSUB + sub) * 64;
      unsigned char* sb = st + sub * kBBytes;
#pragma unroll
      for (int v = 0; v < kVB; ++v)
        if ((NC * 8) % kWgThreads == 0 || b_dst[v] >= 0) {
          cp_async16(sb + b_dst[v], xh + b_src[v] + k0, b_ok[v]);
          if (SPLIT)
            cp_async16(sb + kBOffLo + b_dst[v], xl + b_src[v] + k0, b_ok[v]);
        }
      unsigned char* sa = st + kAOff + sub * kABytes;
      if constexpr (MX4) {
#pragma unroll
        for (int v = 0; v < kVA; ++v)
          if ((BM * 2) % kWgThreads == 0 || a_dst[v] >= 0)
            cp_async16(sa + a_dst[v], mblocks + a_src[v] + k0 / 2, a_ok[v]);
        if (s_row)
          cp_async4(sa + s_dst, reinterpret_cast<const void*>((s_src + k0 / 32) & ~size_t(3)),
                    s_ok);
      } else {
#pragma unroll
        for (int v = 0; v < kVA; ++v)
          cp_async16(sa + a_dst[v], we + a_src[v] + k0, a_ok[v]);
      }
    }
  };

  // MXFP4: where this thread's scale byte of each fragment row sits in an A tile, at even K
  // tiles: the row's staged word, the place of the tile's first byte in it, then the thread's
  // block of the two (c / 2). Rows of K / 32 scale bytes start at even offsets, so a tile's two
  // bytes never straddle a word and an odd tile finds them at the other half (offset ^ 2).
  int s_off[WM][2];
#pragma unroll
  for (int wm = 0; wm < WM; ++wm)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int sr = wm * 64 + warp * 16 + g + 8 * hh, f = sr & 15;
      const int m = kSwiglu ? (sr & ~15) + (f < 8 ? 2 * f : 2 * (f - 8) + 1) : sr;
      const size_t row = m0 + m < N ? m0 + m : 0;
      const int at0 = int(reinterpret_cast<size_t>(mscales + row * (K / 32)) & 3);
      s_off[wm][hh] = BM * 32 + sr * 4 + at0 + c / 2;
    }

  float acc[WM][NC / 2];
#pragma unroll
  for (int wm = 0; wm < WM; ++wm)
#pragma unroll
    for (int i = 0; i < NC / 2; ++i)
      acc[wm][i] = 0.0f;
  // CHUNKS > 1: K in that many equal ranges, each summed from zero, the sums added in order in
  // `total` (the canonical order of a dense linear: gemm_splitk_reduce's sum of SPLITK = CHUNKS
  // partials, without the partials' round trip through memory; of an expert's rows when the
  // decode kernels split K: codegen::moe_chain_splits, one today).
  constexpr int kChunkStages = CHUNKS > 1 ? K / 64 / CHUNKS / KSUB : 1;
  float total[CHUNKS > 1 ? WM : 1][CHUNKS > 1 ? NC / 2 : 1];

#pragma unroll
  for (int st = 0; st < kAhead; ++st) {
    if (st < kKT)
      issue(st);
    cp_async_commit();
  }

  for (int kt = 0; kt < kKT; ++kt) {
    cp_async_wait<kAhead - 1>();
    fence_proxy_async(); // this thread's landed B chunks, for the MMAs' async proxy
    // Stage kt landed for every thread; the stage the next loads overwrite is consumed (its
    // MMAs waited for at the end of an earlier iteration).
    __syncthreads();
    if (!STEPS) { // (STEPS: after the stage's first MMAs, so that the tensor cores run meanwhile)
      if (kt + kAhead < kKT)
        issue(kt + kAhead);
      cp_async_commit();
    }

    const unsigned char* st = smem + (kt % STAGES) * kStage;
#pragma unroll
    for (int sub = 0; sub < KSUB; ++sub) {
      if (kt * KSUB + sub >= kTiles) // the last stage's missing tiles (uniform over the block)
        break;
      const int ktile = kt0 + kt * KSUB + sub;
      const unsigned char* sa = st + kAOff + sub * kABytes;
      const unsigned bh = smem_u32(st + sub * kBBytes), bl = smem_u32(st + kBOffLo + sub * kBBytes);
      // K step s's B descriptors: 32 bytes on is 2 on in the descriptor's address field (a B
      // tile is 1024-aligned: the field's low 6 bits are clear, so adding up to 6 never carries)
      const unsigned long long dh = wg_desc_sw128(bh), dl = wg_desc_sw128(bl);
      // This thread's two fragment rows per m64 tile: 16 K values each (bf16: 8 words; MXFP4: 2
      // words of nibbles and the blocks' scale byte), then per K step their A fragments.
      unsigned raw[WM][2][MX4 ? 2 : 8]; // (NATURAL: unused, ldmatrix below)
      uint2 sc[WM][2]; // MXFP4: the rows' scale factors
#pragma unroll
      for (int wm = 0; wm < WM; ++wm)
#pragma unroll
        for (int hh = 0; hh < 2 && !NATURAL; ++hh) {
          const int sr = wm * 64 + warp * 16 + g + 8 * hh;
          if constexpr (MX4) {
            const uint2 q = *reinterpret_cast<const uint2*>(sa + sr * 32 + 8 * c);
            raw[wm][hh][0] = q.x;
            raw[wm][hh][1] = q.y;
            const unsigned sb = sa[s_off[wm][hh] ^ ((ktile & 1) << 1)]; // s_off's
            sc[wm][hh] =
                SMALL ? make_uint2(mxfp4_small_scale_factor(sb), 0u) : mxfp4_scale_factors(sb);
          } else {
            const uint4 q0 =
                *reinterpret_cast<const uint4*>(sa + sr * 128 + (((2 * c) ^ (sr & 7)) << 4));
            const uint4 q1 =
                *reinterpret_cast<const uint4*>(sa + sr * 128 + (((2 * c + 1) ^ (sr & 7)) << 4));
            const unsigned w[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
#pragma unroll
            for (int i = 0; i < 8; ++i)
              raw[wm][hh][i] = w[i];
            sc[wm][hh] = make_uint2(0, 0);
          }
        }
      // Pair i (i = 2 s + h, the K step's fragment half) of a row: values (v, v + 4) with
      // v = 8 (i / 4) + i % 4 of the row's 16.
      auto pair_of = [&](int wm, int hh, int i) -> unsigned {
        const int k = i % 4;
        if constexpr (MX4 && SMALL) // 2^(s - 1) alone: the second factor is 1
          return bf16x2_mul(mx4_pair_raw(raw[wm][hh][i / 4], k), sc[wm][hh].x);
        else if constexpr (MX4)
          return mxfp4_pair_scaled(mx4_pair_raw(raw[wm][hh][i / 4], k), sc[wm][hh]);
        else
          return wg_bf16_pair(raw[wm][hh], i);
      };
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        unsigned a[WM][4];
#pragma unroll
        for (int wm = 0; wm < WM; ++wm) {
          if constexpr (NATURAL) {
            // ldmatrix.x4: lane l gives row l % 8 of matrix l / 8; matrices (rows 0-7, K 16 s ..
            // 16 s + 7), (rows 8-15, the same K), then both with K 16 s + 8 .. 16 s + 15: the
            // m16n8k16 A fragment's a0 .. a3. A K tile's 16-byte chunk j of row r is at j ^ (r % 8).
            const int mi = lane / 8, sr = wm * 64 + warp * 16 + (mi & 1) * 8 + lane % 8;
            ldmatrix_x4(a[wm], sa + sr * 128 + (((2 * s + (mi >> 1)) ^ (sr & 7)) << 4));
            continue;
          }
          a[wm][0] = pair_of(wm, 0, 2 * s);
          a[wm][1] = pair_of(wm, 1, 2 * s);
          a[wm][2] = pair_of(wm, 0, 2 * s + 1);
          a[wm][3] = pair_of(wm, 1, 2 * s + 1);
        }
        wg_fence();
#pragma unroll
        for (int wm = 0; wm < WM; ++wm) {
          WgMma<NC>::mma(acc[wm], a[wm], dh + 2 * s);
          if (SPLIT)
            WgMma<NC>::mma(acc[wm], a[wm], dl + 2 * s);
        }
        if constexpr (STEPS) {
          // Each K step's MMAs a batch of their own: the next step's fragments are built while
          // they run (into registers other than theirs), then the step before is waited for,
          // so that its fragments' registers may be reused. The compiler otherwise builds a
          // whole K tile's fragments first and leaves the tensor cores idle meanwhile.
          wg_commit();
          if (s == 0 && sub == 0) {
            if (kt + kAhead < kKT)
              issue(kt + kAhead);
            cp_async_commit();
          }
          wg_wait<1>();
        }
      }
    }
    if (!STEPS) // (STEPS committed each step's batch)
      wg_commit();
    if (PIPE)
      wg_wait<1>();
    else
      wg_wait<0>();
    if constexpr (CHUNKS > 1) {
      if ((kt + 1) % kChunkStages == 0) { // a K range done: into the total, in order
        const bool first = kt + 1 == kChunkStages;
#pragma unroll
        for (int wm = 0; wm < WM; ++wm)
#pragma unroll
          for (int i = 0; i < NC / 2; ++i) {
            wg_pin(acc[wm][i]);
            total[wm][i] = first ? acc[wm][i] : total[wm][i] + acc[wm][i];
            acc[wm][i] = 0.0f;
          }
      }
    }
  }
  wg_wait<0>();
  if constexpr (CHUNKS > 1) {
#pragma unroll
    for (int wm = 0; wm < WM; ++wm)
#pragma unroll
      for (int i = 0; i < NC / 2; ++i)
        acc[wm][i] = total[wm][i];
  }
#pragma unroll
  for (int wm = 0; wm < WM; ++wm)
#pragma unroll
    for (int i = 0; i < NC / 2; ++i)
      wg_pin(acc[wm][i]);
  cp_async_wait<0>();

  // Epilogue: acc[wm][4 j + e] is A row wm * 64 + warp * 16 + g + 8 (e / 2) (a weight row, see
  // wg_a_row), tile row 8 j + 2 c + e % 2 (a token).
  const __nv_bfloat16* be = b + (size_t)expert * N;
#pragma unroll
  for (int wm = 0; wm < WM; ++wm) {
    const int rbase = m0 + wm * 64 + warp * 16; // first weight row of this warp's 16
#pragma unroll
    for (int j = 0; j < NC / 8; ++j)
#pragma unroll
      for (int e2 = 0; e2 < 2; ++e2) {
        const int rl = 8 * j + 2 * c + e2;
        if (rl >= rows)
          continue;
        const int r = begin + rl;
        if constexpr (kSwiglu) {
          const int gate_row = rbase + 2 * g;
          if (gate_row >= N)
            continue;
          float gate = acc[wm][4 * j + e2], up = acc[wm][4 * j + 2 + e2];
          if (BIAS) {
            gate += bf16_to_float(be[gate_row]);
            up += bf16_to_float(be[gate_row + 1]);
          }
          gate = fminf(gate, limit);
          up = fminf(fmaxf(up, -limit), limit);
          const float glu = gate / (1.0f + expf(-alpha * gate));
          y[(size_t)r * (N / 2) + gate_row / 2] = (up + 1.0f) * glu;
        } else {
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int n = rbase + g + 8 * hh;
            if (n >= N)
              continue;
            float v = acc[wm][4 * j + 2 * hh + e2];
            if (SPLITK > 1) {
              y[((size_t)blockIdx.z * tokens + r) * N + n] = v;
              continue;
            }
            if (BIAS)
              v += bf16_to_float(be[n]);
            if (EPI == kGemmStore) {
              if (RESIDUAL)
                v += h[(size_t)r * N + n];
              y[(size_t)r * N + n] = v;
            } else {
              const int p = pair[r];
              y[(size_t)p * N + n] = route_w[p] * v;
            }
          }
        }
      }
  }
}

/// gemm_wg_cols with MMAs as wide as the tile's tokens (tiles of 64 tokens and more): the fewest
/// quarters of BN with a WgMma shape (wg_mma_quarters) that cover its rows. A grouped tile of an
/// expert's last few tokens (or a 256-sequence step's ~BN / 2) then multiplies no empty columns;
/// a column's sums are the same whichever width computes them (its MMAs see the same K order).
template <int K, int N, int BN, int WM, int STAGES, bool MX4, bool SPLIT, bool GROUPED, bool GATHER,
          int KSEL, int EPI, bool BIAS, bool RESIDUAL, int SPLITK = 1, int EXPERTS = 1,
          int KSUB = 1, bool PIPE = false, int CHUNKS = 1, bool SMALL = false, bool NATURAL = false,
          bool STEPS = false>
__device__ __forceinline__ void
gemm_wg(const __nv_bfloat16* __restrict__ xh, const __nv_bfloat16* __restrict__ xl,
        const void* __restrict__ wv, const __nv_bfloat16* __restrict__ b, const float* h, float* y,
        const int* __restrict__ pair, const int* __restrict__ tiles,
        const float* __restrict__ route_w, float limit, float alpha, int tokens) {
  int expert, begin, end;
  if (!gemm_tile<BN, GROUPED>(tiles, tokens, expert, begin, end))
    return;
  // Tiles of 64 tokens and more only: batched decode's 16- and 32-token tiles (up to ~190
  // sequences) measured no faster narrowed, B64 -2.3% at 8 columns, B128 -0.6% at 16 and 24
  // (H100, docs/PERF.md), so they stay whole.
  const int q = BN >= 64 ? wg_mma_quarters<BN>(end - begin) : 4;
#define XSERV_GEMM_WG_COLS(NC)                                                                     \
  gemm_wg_cols<K, N, BN, WM, STAGES, MX4, SPLIT, GROUPED, GATHER, KSEL, EPI, BIAS, RESIDUAL,       \
               SPLITK, EXPERTS, KSUB, PIPE, CHUNKS, SMALL, NATURAL, STEPS, NC>(                    \
      xh, xl, wv, b, h, y, pair, tiles, route_w, limit, alpha, tokens)
  if constexpr (BN >= 64 && BN % 4 == 0 && wg_mma_has(BN / 4)) {
    if (q == 1) {
      XSERV_GEMM_WG_COLS(BN / 4);
      return;
    }
  }
  if constexpr (BN >= 64 && wg_mma_has(BN / 2)) {
    if (q <= 2) {
      XSERV_GEMM_WG_COLS(BN / 2);
      return;
    }
  }
  if constexpr (BN >= 64 && BN % 4 == 0 && wg_mma_has(3 * BN / 4)) {
    if (q <= 3) {
      XSERV_GEMM_WG_COLS(3 * BN / 4);
      return;
    }
  }
  XSERV_GEMM_WG_COLS(BN);
#undef XSERV_GEMM_WG_COLS
}

} // namespace xserv_kernels
