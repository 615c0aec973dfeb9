// Decode-path matrix-vector kernel: y = (h +) W rms_norm(x) + b for a few tokens (T <= MAX_T).
#pragma once

#include "xserv_kernels/common.cuh"

namespace xserv_kernels {

/// Threads per block of linear_decode: 8 warps.
constexpr int kLinearThreads = 256;

/// Stages x [tokens, K] in shared memory xs, as rms_norm(x, ln, eps) when NORM (sum of squares
/// in fp32 per token), each value through act_value<ROUND>, ending with a barrier. 256 threads.
template <int K, int MAX_T, bool NORM, bool ROUND = false>
__device__ __forceinline__ void linear_stage_x(const float* __restrict__ x,
                                               const __nv_bfloat16* __restrict__ ln, float eps,
                                               float* xs, int tokens) {
  constexpr int kWarps = kLinearThreads / kWarp;
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  __shared__ float partial[kWarps][MAX_T];
  __shared__ float inv_rms[MAX_T];
  for (int t = 0; t < tokens; ++t) {
    float ss = 0.0f;
    for (int i = tid; i < K / 4; i += kLinearThreads) {
      const float4 v = reinterpret_cast<const float4*>(x + (size_t)t * K)[i];
      reinterpret_cast<float4*>(xs + t * K)[i] =
          NORM ? v
               : make_float4(act_value<ROUND>(v.x), act_value<ROUND>(v.y), act_value<ROUND>(v.z),
                             act_value<ROUND>(v.w));
      ss += sum_sq4(v);
    }
    if (NORM) {
      ss = warp_sum(ss);
      if (lane == 0)
        partial[warp][t] = ss;
    }
  }
  if (NORM) {
    __syncthreads();
    if (tid < tokens) {
      float ss = 0.0f;
      for (int i = 0; i < kWarps; ++i)
        ss += partial[i][tid];
      inv_rms[tid] = rsqrtf(ss / K + eps);
    }
    __syncthreads();
    for (int t = 0; t < tokens; ++t)
      for (int i = tid; i < K; i += kLinearThreads)
        xs[t * K + i] = act_value<ROUND>(xs[t * K + i] * inv_rms[t] * bf16_to_float(ln[i]));
  }
  __syncthreads();
}

/// The biases of a warp's R rows row.. (zeros without BIAS or when !live), on every lane: loaded
/// before a kernel's dependency wait (a weight), so that the epilogue waits on no DRAM round trip.
template <int R, bool BIAS>
__device__ __forceinline__ void load_row_bias(const __nv_bfloat16* __restrict__ b, int row,
                                              bool live, float (&bias)[R]) {
#pragma unroll
  for (int r = 0; r < R; ++r)
    bias[r] = BIAS && live ? bf16_to_float(b[row + r]) : 0.0f;
}

/// Lane t's residuals h[t, row + r] of token t < tokens (zeros elsewhere or without RESIDUAL):
/// loaded right after the wait, while the weights stream.
template <int N, int R, bool RESIDUAL>
__device__ __forceinline__ void load_row_residual(const float* h, int row, int tokens, bool live,
                                                  float (&res)[R]) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int r = 0; r < R; ++r)
    res[r] = RESIDUAL && live && lane < tokens ? h[(size_t)lane * N + row + r] : 0.0f;
}

/// Epilogue of a decode GEMV: lane t of the warp writes token t's R rows row.. of y [tokens, N],
/// plus the bias and residual loaded earlier (load_row_bias, load_row_residual).
template <int N, int MAX_T, int R, bool BIAS, bool RESIDUAL>
__device__ __forceinline__ void linear_store(const float (&acc)[R][MAX_T], const float (&bias)[R],
                                             const float (&res)[R], float* y, int row, int tokens) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int t = 0; t < MAX_T; ++t) {
    if (t >= tokens || lane != t)
      continue;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float v = acc[r][t];
      if (BIAS)
        v += bias[r];
      if (RESIDUAL)
        v += res[r];
      y[(size_t)t * N + row + r] = v;
    }
  }
}

/// Split-K: the KS warps of a row group (warps group * KS .. + KS - 1) each hold a partial sum
/// of every lane's rows; the group's first warp gets their total, parts added in order. Every
/// warp of the block calls it (it has barriers). KS = 1: nothing to do.
template <int R, int MAX_T, int KS>
__device__ __forceinline__ void split_k_total(float (&acc)[R][MAX_T], int tokens) {
  if (KS == 1)
    return;
  constexpr int kWarps = kLinearThreads / kWarp;
  __shared__ float parts[kWarps][R][MAX_T];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < MAX_T; ++t)
        parts[warp][r][t] = acc[r][t];
  __syncthreads();
  if (warp % KS == 0 && lane < tokens)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < MAX_T; ++t) {
        float v = parts[warp][r][t];
#pragma unroll
        for (int p = 1; p < KS; ++p)
          v += parts[warp + p][r][t];
        acc[r][t] = v;
      }
}

/// y[t, n] = (RESIDUAL ? h[t, n] : 0) + sum_k W[n, k] xn[t, k] + (BIAS ? b[n] : 0), where
/// xn = NORM ? rms_norm(x, ln, eps) : x. x, h, y are fp32 [tokens, K] / [tokens, N]; W [N, K],
/// ln [K] and b [N] are bf16. Each block stages xn for all tokens in dynamic shared memory
/// (tokens * K floats) and its warps compute R consecutive rows each (KS warps per R rows, each
/// over 1/KS of K, with split-K); grid.x = ceil(N KS / (8 R)).
/// With PREFETCH each warp first asks L2 for its rows. Requires tokens <= MAX_T, blockDim.x ==
/// kLinearThreads. y may alias h.
template <int K, int N, int MAX_T, int R, bool NORM, bool BIAS, bool RESIDUAL, bool PREFETCH = true,
          int UNROLL = 4, int KS = 1, bool ROUND = false>
__device__ __forceinline__ void
linear_decode(const float* __restrict__ x, const __nv_bfloat16* __restrict__ ln, float eps,
              const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* __restrict__ b,
              const float* h, float* y, int tokens) {
  static_assert(N % R == 0, "rows per warp must divide N");
  static_assert(K % 8 == 0, "K must be a multiple of 8");
  constexpr int kWarps = kLinearThreads / kWarp;
  static_assert(kWarps % KS == 0, "K splits must divide the block's warps");
  constexpr int kGroups = kWarps / KS; // row groups per block, KS warps each
  extern __shared__ float4 smem_linear[];
  float* xs = reinterpret_cast<float*>(smem_linear);
  const int warp = threadIdx.x / kWarp;
  const int row = (blockIdx.x * kGroups + warp / KS) * R;
  if (PREFETCH && row < N)
    warp_prefetch_rows_l2<K, R>(w + (size_t)row * K);
  // Each warp owns R consecutive output rows (a 1/KS part of K); their first loads fly during
  // the prologue.
  WarpGemv<K, R, MAX_T, UNROLL, KS> gemv;
  if (row < N)
    gemv.start(w + (size_t)row * K, warp % KS);
  float bias[R], res[R];
  load_row_bias<R, BIAS>(b, row, row < N && warp % KS == 0, bias);
  if (NORM)
    block_prefetch_l2(ln, K * sizeof(__nv_bfloat16));
  grid_dependency_sync(); // the weights owe nothing to the previous kernel: loads fly first
  load_row_residual<N, R, RESIDUAL>(h, row, tokens, row < N && warp % KS == 0, res);

  linear_stage_x<K, MAX_T, NORM, ROUND>(x, ln, eps, xs, tokens);

  if (KS == 1 && row >= N)
    return;
  float acc[R][MAX_T] = {}; // zeros for a group past N, whose parts are summed and dropped
  if (row < N)
    gemv.finish(xs, tokens, acc);
  split_k_total<R, MAX_T, KS>(acc, tokens);
  if (row >= N || warp % KS != 0)
    return;
  linear_store<N, MAX_T, R, BIAS, RESIDUAL>(acc, bias, res, y, row, tokens);
}

/// linear_decode for one token without the norm, its weights resident before the dependency
/// wait: y[n] = (RESIDUAL ? h[n] : 0) + sum_k W[n, k] x[k] + (BIAS ? b[n] : 0), x through
/// act_value<ROUND>. Block x owns rows ROWS x .. + ROWS - 1, copied whole into dynamic shared
/// memory by the bulk-copy engine (8 pieces, one mbarrier each) as the block starts, so a grid
/// that the previous kernel's trigger schedules early (o_proj during attention_combine) streams
/// its whole share of W while that kernel runs; after the wait only the multiply is left. Warp w
/// takes the w-th eighth of every row's 16-byte words, lane l the words l, l + 32, ... of it,
/// their activations read once into registers; a row's partials are summed over lanes, then
/// over the warps in order. grid.x = N / ROWS (at most an SM each: linear_smem_rows
/// in the emitter), dynamic shared memory ROWS K bf16. Below sm_90 the threads copy the rows.
/// `wait` is where the block waits for its inputs (the previous kernel by default).
///
/// CHAIN (ROUND too): the canonical order of a dense linear with 8 K splits (gemm_wg's at
/// wg_splitk 8, linear_decode_mma's CHAIN): warp w takes the w-th eighth of K and multiplies
/// its rows, 16 at a time (the last group padded with zero rows), by the token on mma.sync in
/// gemm_wg's K slots, one chain from zero; the eighths are added in order, then the bias and
/// the residual. The token's activations are staged in the slots after the wait (K / 2 words
/// after the rows).
template <int K, int N, int ROWS, bool BIAS, bool RESIDUAL, bool ROUND = false, bool CHAIN = false,
          class Wait = GridDependencyWait>
__device__ __forceinline__ void
linear_decode_smem(const float* __restrict__ x, const __nv_bfloat16* __restrict__, float,
                   const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* __restrict__ b,
                   const float* h, float* y, int tokens, Wait wait = {}) {
  constexpr int kWarps = kLinearThreads / kWarp, kPieces = 8;
  static_assert(K % 8 == 0 && N % ROWS == 0 && ROWS % kPieces == 0 && ROWS <= kLinearThreads,
                "whole 16-byte words, whole blocks of rows in 8 pieces, a thread a row");
  constexpr int kWords = K / 8;                                // 16-byte words a row
  constexpr int kWarpWords = (kWords + kWarps - 1) / kWarps;   // a warp's columns
  constexpr int kLaneWords = (kWarpWords + kWarp - 1) / kWarp; // a lane's
  constexpr int kPieceRows = ROWS / kPieces;
  extern __shared__ __align__(128) uint4 smem_linear_rows[]; // [ROWS][kWords]
  __shared__ __align__(8) unsigned long long landed[kPieces];
  __shared__ float red[kWarps][ROWS];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const size_t row0 = (size_t)blockIdx.x * ROWS;
  const uint4* src = reinterpret_cast<const uint4*>(w + row0 * K);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (threadIdx.x == 0) {
#pragma unroll
    for (int p = 0; p < kPieces; ++p)
      mbarrier_init(&landed[p], 1);
#pragma unroll
    for (int p = 0; p < kPieces; ++p)
      bulk_copy_g2s(smem_linear_rows + p * kPieceRows * kWords, src + p * kPieceRows * kWords,
                    kPieceRows * kWords * 16, &landed[p]);
  }
#else
  for (int i = threadIdx.x; i < ROWS * kWords; i += kLinearThreads)
    smem_linear_rows[i] = __ldg(src + i);
#endif
  const bool mine = threadIdx.x < ROWS; // thread r writes row row0 + r
  const float bias = BIAS && mine ? bf16_to_float(b[row0 + threadIdx.x]) : 0.0f;
  __syncthreads(); // the barriers are initialised before anyone waits on them
  wait();
  const float res = RESIDUAL && mine ? h[row0 + threadIdx.x] : 0.0f;
  if constexpr (CHAIN) { // the K eighths on tensor cores, into red
    static_assert(ROUND && K % (64 * kWarps) == 0, "bf16 activations, whole K tiles a warp");
    constexpr int kTiles = K / 64 / kWarps, kGroups = (ROWS + 15) / 16;
    unsigned* xs = reinterpret_cast<unsigned*>(smem_linear_rows + ROWS * kWords);
    for (int i = threadIdx.x; i < K / 2; i += kLinearThreads) { // gemm_act's slots and rounding
      const int a = (i / 32) * 64 + wg_k_of_slot(2 * (i % 32));
      xs[i] = pack_bf16x2(x[a], x[a + 4]);
    }
    __syncthreads();
#pragma unroll
    for (int p = 0; p < kPieces; ++p)
      mbarrier_wait(&landed[p], 0);
    const int g = lane / 4, c = lane % 4;
    const unsigned rows_base = smem_u32(smem_linear_rows);
#pragma unroll
    for (int q = 0; q < kGroups; ++q) {
      const int ra = 16 * q + g, rb = ra + 8; // this thread's rows of group q
      float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 2
      for (int t = 0; t < kTiles; ++t) {
        const int kt = warp * kTiles + t;
        // Values 16 c .. 16 c + 15 of the tile: 32 bytes at K 64 kt + 16 c of each row.
        unsigned wa[8], wb[8];
        const unsigned off = (kt * 64 + 16 * c) * 2;
        lds128(wa, rows_base + ra * K * 2 + off);
        lds128(wa + 4, rows_base + ra * K * 2 + off + 16);
        if (rb < ROWS) {
          lds128(wb, rows_base + rb * K * 2 + off);
          lds128(wb + 4, rows_base + rb * K * 2 + off + 16);
        } else {
#pragma unroll
          for (int i = 0; i < 8; ++i)
            wb[i] = 0u;
        }
        const unsigned* xt = xs + kt * 32;
#pragma unroll
        for (int st = 0; st < 4; ++st) {
          const unsigned a[4] = {wg_bf16_pair(wa, 2 * st), wg_bf16_pair(wb, 2 * st),
                                 wg_bf16_pair(wa, 2 * st + 1), wg_bf16_pair(wb, 2 * st + 1)};
          mma_bf16(d, a, xt[8 * st + c], xt[8 * st + 4 + c]);
        }
      }
      if (c == 0) { // column 0: rows ra and rb
        red[warp][ra] = d[0];
        if (rb < ROWS)
          red[warp][rb] = d[2];
      }
    }
  } else { // FMA: lanes over each row's words, then over the warps
    const int c0 = warp * kWarpWords;
    const int c1 = c0 + kWarpWords < kWords ? c0 + kWarpWords : kWords;
    float xr[kLaneWords][8];
#pragma unroll
    for (int j = 0; j < kLaneWords; ++j) {
      const int c = c0 + lane + j * kWarp;
      const float4 lo =
          c < c1 ? reinterpret_cast<const float4*>(x)[2 * c] : make_float4(0, 0, 0, 0);
      const float4 hi =
          c < c1 ? reinterpret_cast<const float4*>(x)[2 * c + 1] : make_float4(0, 0, 0, 0);
      const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
      for (int e = 0; e < 8; ++e)
        xr[j][e] = act_value<ROUND>(v[e]);
    }
    float acc[ROWS];
#pragma unroll
    for (int p = 0; p < kPieces; ++p) {
      mbarrier_wait(&landed[p], 0);
#pragma unroll
      for (int q = 0; q < kPieceRows; ++q) {
        const int r = p * kPieceRows + q;
        float a = 0.0f;
#pragma unroll
        for (int j = 0; j < kLaneWords; ++j) {
          const int c = c0 + lane + j * kWarp;
          if (kLaneWords * kWarp > kWarpWords && c >= c1)
            break;
          a = fma_bf16x8(smem_linear_rows[r * kWords + c], xr[j], a);
        }
        acc[r] = a;
      }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const float v = warp_sum(acc[r]);
      if (lane == 0)
        red[warp][r] = v;
    }
  }
  __syncthreads();
  if (!mine || tokens < 1)
    return;
  float v = red[0][threadIdx.x]; // the warps' parts (CHAIN: the K eighths) in order
#pragma unroll
  for (int i = 1; i < kWarps; ++i)
    v += red[i][threadIdx.x];
  if (BIAS)
    v += bias;
  if (RESIDUAL)
    v += res;
  y[row0 + threadIdx.x] = v;
}

/// One 64-value K tile in gemm_wg's slots on mma.sync, into d: rows g and g + 8 (g = lane / 4)
/// of the WarpRowRing chunk at shared address `at`, whose values 16 c .. 16 c + 15 (c = lane %
/// 4) are slots 2 c and 2 c + 1 of each row, against xc, the tile's activation pairs of token g
/// (read at xc[8 s] and xc[8 s + 4] for the tile's 4 MMAs).
__device__ __forceinline__ void wg_tile_mma(unsigned at, const unsigned* xc, float (&d)[4]) {
  const int lane = threadIdx.x % kWarp, g = lane / 4, c = lane % 4;
  unsigned ra[8], rb[8];
  lds128(ra, at + (g * 8 + ((2 * c) ^ g)) * 16);
  lds128(ra + 4, at + (g * 8 + ((2 * c + 1) ^ g)) * 16);
  lds128(rb, at + ((g + 8) * 8 + ((2 * c) ^ g)) * 16);
  lds128(rb + 4, at + ((g + 8) * 8 + ((2 * c + 1) ^ g)) * 16);
#pragma unroll
  for (int st = 0; st < 4; ++st) {
    const unsigned a[4] = {wg_bf16_pair(ra, 2 * st), wg_bf16_pair(rb, 2 * st),
                           wg_bf16_pair(ra, 2 * st + 1), wg_bf16_pair(rb, 2 * st + 1)};
    mma_bf16(d, a, xc[8 * st], xc[8 * st + 4]);
  }
}

/// The four MMAs of a WarpRowRing chunk in `buf` (16 rows x 64 values) in the natural K order,
/// into d: MMA m multiplies K values 16 m .. 16 m + 15 of rows g and g + 8 (ldmatrix.x4 of slots
/// 2 m, 2 m + 1) with the activation words xc[8 m] and xc[8 m + 4] (word i holds the chunk's K
/// values 2 i, 2 i + 1, as gemm_act<.., NATURAL> packs them; xc already at this lane's c).
__device__ __forceinline__ void natural_tile_mma(const WarpRowRing& ring, int buf,
                                                 const unsigned* xc, float (&d)[4]) {
#pragma unroll
  for (int j = 0; j < 8; j += 2) {
    unsigned a[4]; // word c of rows g, g + 8 of slot j, then of slot j + 1
    ring.load_pair(buf, j, a);
    mma_bf16(d, a, xc[4 * j], xc[4 * j + 4]);
  }
}

/// linear_decode without the norm on tensor cores, for plain bf16 activations: y[t, n] =
/// (RESIDUAL ? h[t, n] : 0) + sum_k W[n, k] bf16(x[t, k]) + (BIAS ? b[n] : 0) for up to 8 tokens,
/// the tokens being the columns of mma.sync m16n8k16 (token t's result never depends on the
/// others). Block x: rows 16 RG x .. + 16 RG - 1 with RG x KS warps, warp (rg, ks) the 16 rows of
/// group rg over the ks-th part of K, the parts added in order through shared memory. Each warp
/// streams its rows through a ring of STAGES chunks (16 rows x 64 values, 16-byte cp.async, a row's
/// 8 slots at slot j ^ (row % 8)) and ldmatrix.x4 hands thread (g, c) the A words of two slots:
/// words of the weights as they lie, no conversion. Dynamic shared memory: the rings (RG KS
/// STAGES 2 KB), then the tokens' activations as bf16 pairs (K / 2 + 4 words a token).
/// grid.x = N / (16 RG), block 32 RG KS threads. y may alias h. Parameters as linear_decode's
/// (its norm's ln and eps unused).
///
/// CHAIN: the canonical order of a dense linear (docs/DESIGN.md, "Batch invariance"), gemm_wg's
/// with KS K splits (the lowering's wg_splitk of the matrix): each split's products go into
/// one accumulator from zero in gemm_wg's K slots (thread c holds values 16 c .. 16 c + 15 of
/// its rows in each chunk, two 16-byte shared loads a row; the activations are staged in the
/// same slots), the splits are added in order, then the bias, then the residual: the sums
/// gemm_splitk_reduce gives the gemm's partials, so a token's outputs are the gemm's bits.
///
/// NATURAL: K in its natural order, each split one accumulator from zero over its chunks (MMA j
/// of a chunk multiplies K values 16 j .. 16 j + 15, as a library gemm's chain does; the
/// activations rounded and paired as gemm_act<.., NATURAL> writes them); with KS 1 a row's sum is
/// the natural chain over all of K.
template <int K, int N, int MAX_T, int RG, int KS, int STAGES, bool BIAS, bool RESIDUAL,
          bool CHAIN = false, bool NATURAL = false>
__device__ __forceinline__ void
linear_decode_mma(const float* __restrict__ x, const __nv_bfloat16* __restrict__, float,
                  const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* __restrict__ b,
                  const float* h, float* y, int tokens) {
  static_assert(K % 64 == 0 && N % (16 * RG) == 0 && MAX_T >= 1 && MAX_T <= 8 && STAGES >= 2,
                "whole chunks of 64 values, whole row groups, at most 8 tokens, two stages");
  static_assert(!(CHAIN && NATURAL), "one K order");
  constexpr int kWarps = RG * KS, kThreads = kWarp * kWarps;
  constexpr int kChunks = K / 64, kPer = (kChunks + KS - 1) / KS; // a warp's chunks
  constexpr int kXStride = K / 2 + 4;    // words a token: the 8 tokens' rows hit distinct banks
  constexpr int kRing = STAGES * 16 * 8; // 16-byte slots a warp
  extern __shared__ __align__(16) uint4 smem_linear_mma[];
  unsigned* xs = reinterpret_cast<unsigned*>(smem_linear_mma + kWarps * kRing);
  __shared__ float red[KS][RG * 16][MAX_T];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane / 4, c = lane % 4;
  const int rg = warp / KS, ks = warp % KS, r0 = (blockIdx.x * RG + rg) * 16;
  const int c0 = ks * kPer, c1 = c0 + kPer < kChunks ? c0 + kPer : kChunks;
  // Lane l copies slot l % 8 (values 8 (l % 8) ..) of rows l / 8 + 4 j of each chunk.
  const __nv_bfloat16* src = w + (size_t)(r0 + lane / 8) * K + (lane % 8) * 8;
  WarpRowRing ring;
  ring.init(smem_linear_mma + warp * kRing);
  const unsigned ring_base = smem_u32(smem_linear_mma + warp * kRing);
  auto issue = [&](int ch, int buf) {
    if (ch < c1) {
      const __nv_bfloat16* p = src + (size_t)ch * 64;
      const void* const rows[4] = {p, p + (size_t)4 * K, p + (size_t)8 * K, p + (size_t)12 * K};
      ring.copy(buf, rows, 16);
    }
    cp_async_commit(); // one group a chunk, empty past the end
  };
#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) // the weights owe nothing to the previous kernel
    issue(c0 + st, st);
  // The epilogue's outputs of this thread (element i = threadIdx.x + u kThreads of the block's
  // rows x tokens): their biases now, their residuals right after the wait, so that neither is a
  // DRAM or L2 round trip at the kernel's end.
  constexpr int kEpi = (RG * 16 * MAX_T + kThreads - 1) / kThreads;
  float bias[kEpi], res[kEpi];
#pragma unroll
  for (int u = 0; u < kEpi; ++u) {
    const int i = threadIdx.x + u * kThreads;
    bias[u] = BIAS && i < RG * 16 * tokens
                  ? bf16_to_float(b[(size_t)blockIdx.x * RG * 16 + i / tokens])
                  : 0.0f;
  }
  grid_dependency_sync();
#pragma unroll
  for (int u = 0; u < kEpi; ++u) {
    const int i = threadIdx.x + u * kThreads;
    res[u] = RESIDUAL && i < RG * 16 * tokens
                 ? h[(size_t)(i % tokens) * N + (size_t)blockIdx.x * RG * 16 + i / tokens]
                 : 0.0f;
  }
  for (int i = threadIdx.x; i < tokens * (K / 2); i += kThreads) {
    const int t = i / (K / 2), k2 = i % (K / 2);
    if constexpr (CHAIN) { // pair k2 % 32 of chunk k2 / 32 in gemm_act's slot order
      const int a = (k2 / 32) * 64 + wg_k_of_slot(2 * (k2 % 32));
      const float* xr = x + (size_t)t * K;
      xs[t * kXStride + k2] = pack_bf16x2(xr[a], xr[a + 4]);
    } else if constexpr (NATURAL) { // K 2 k2 and 2 k2 + 1, as gemm_act<.., NATURAL> packs them
      const float2 v = reinterpret_cast<const float2*>(x + (size_t)t * K)[k2];
      xs[t * kXStride + k2] = pack_bf16x2(v.x, v.y);
    } else {
      const float2 v = reinterpret_cast<const float2*>(x + (size_t)t * K)[k2];
      xs[t * kXStride + k2] = __byte_perm(__float_as_uint(act_value<true>(v.x)),
                                          __float_as_uint(act_value<true>(v.y)), 0x7632);
    }
  }
  __syncthreads();
  // B column g is token g (spare columns repeat the last token; their sums are dropped).
  const unsigned* xb = xs + (g < tokens ? g : tokens - 1) * kXStride + c;
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  int buf = 0;
#pragma unroll 1
  for (int ch = c0; ch < c1; ++ch) {
    cp_async_wait<STAGES - 2>(); // chunk ch has landed (this lane's copies)
    __syncwarp();                // ... and every lane's; all are done with the previous buffer
    issue(ch + STAGES - 1, buf == 0 ? STAGES - 1 : buf - 1);
    const unsigned* xc = xb + ch * 32;
    if constexpr (CHAIN) {
      wg_tile_mma(ring_base + buf * WarpRowRing::kChunkBytes, xc, d);
      buf = buf == STAGES - 1 ? 0 : buf + 1;
      continue;
    }
    // A chunk's 4 MMAs from zero, then one fp32 add each: the tensor cores' accumulation
    // (which does not round like fp32 adds) stays 4 MMAs long whatever the K split. NATURAL:
    // straight into the split's chain.
    float p0[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float(&p)[4] = NATURAL ? d : p0;
    natural_tile_mma(ring, buf, xc, p);
    if constexpr (!NATURAL)
#pragma unroll
      for (int q = 0; q < 4; ++q)
        d[q] += p[q];
    buf = buf == STAGES - 1 ? 0 : buf + 1;
  }
  cp_async_wait<0>();
  // d: rows g and g + 8, tokens 2c and 2c + 1.
  const int rr = rg * 16 + g;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int t = 2 * c + q % 2, row = rr + 8 * (q / 2);
    if (t < tokens && t < MAX_T)
      red[ks][row][t] = d[q];
  }
  __syncthreads();
#pragma unroll
  for (int u = 0; u < kEpi; ++u) {
    const int i = threadIdx.x + u * kThreads;
    if (i >= RG * 16 * tokens)
      break;
    const int row = i / tokens, t = i % tokens;
    float v = red[0][row][t]; // the K splits in order
#pragma unroll
    for (int s = 1; s < KS; ++s)
      v += red[s][row][t];
    const size_t n = (size_t)blockIdx.x * RG * 16 + row;
    if (BIAS)
      v += bias[u];
    if (RESIDUAL)
      v += res[u];
    y[(size_t)t * N + n] = v;
  }
}

/// q, k and v of a decode step in one launch: rows [0, NQ) of the concatenated output are
/// y_q = Wq xn + bq, the next NK y_k, the last NV y_v, xn = rms_norm(x, ln, eps) staged once per
/// block. Each block's 8 / KS row groups x R rows lie in one projection (NQ and NK multiples of
/// 8 R / KS);
/// grid.x = (NQ + NK + NV) KS / (8 R). Shapes as linear_decode.
template <int K, int NQ, int NK, int NV, int MAX_T, int R, int UNROLL = 4, int KS = 1,
          bool ROUND = false>
__device__ __forceinline__ void
qkv_decode(const float* __restrict__ x, const __nv_bfloat16* __restrict__ ln, float eps,
           const __nv_bfloat16* __restrict__ wq, const __nv_bfloat16* __restrict__ bq,
           const __nv_bfloat16* __restrict__ wk, const __nv_bfloat16* __restrict__ bk,
           const __nv_bfloat16* __restrict__ wv, const __nv_bfloat16* __restrict__ bv,
           float* __restrict__ yq, float* __restrict__ yk, float* __restrict__ yv, int tokens) {
  constexpr int kWarps = kLinearThreads / kWarp, kRows = kWarps / KS * R;
  static_assert(kWarps % KS == 0, "K splits must divide the block's warps");
  static_assert(NQ % kRows == 0 && NK % kRows == 0 && NV % kRows == 0,
                "a block's rows must lie in one projection");
  extern __shared__ float4 smem_linear[];
  float* xs = reinterpret_cast<float*>(smem_linear);
  const int warp = threadIdx.x / kWarp;
  int row = blockIdx.x * kRows; // in the concatenated rows, then within the projection
  const __nv_bfloat16 *w = wq, *b = bq;
  float* y = yq;
  int n = NQ;
  if (row >= NQ + NK) {
    row -= NQ + NK, w = wv, b = bv, y = yv, n = NV;
  } else if (row >= NQ) {
    row -= NQ, w = wk, b = bk, y = yk, n = NK;
  }
  row += warp / KS * R;
  WarpGemv<K, R, MAX_T, UNROLL, KS> gemv; // the first weight loads fly during the norm prologue
  gemv.start(w + (size_t)row * K, warp % KS);
  float bias[R], res[R] = {};
  load_row_bias<R, true>(b, row, warp % KS == 0, bias);
  block_prefetch_l2(ln, K * sizeof(__nv_bfloat16));
  grid_dependency_sync(); // and while the previous kernel finishes
  linear_stage_x<K, MAX_T, true, ROUND>(x, ln, eps, xs, tokens);
  float acc[R][MAX_T];
  gemv.finish(xs, tokens, acc);
  split_k_total<R, MAX_T, KS>(acc, tokens);
  if (warp % KS != 0)
    return;
  // n is NQ, NK or NV: the store's row stride.
  if (n == NQ)
    linear_store<NQ, MAX_T, R, true, false>(acc, bias, res, y, row, tokens);
  else if (n == NK)
    linear_store<NK, MAX_T, R, true, false>(acc, bias, res, y, row, tokens);
  else
    linear_store<NV, MAX_T, R, true, false>(acc, bias, res, y, row, tokens);
}

/// qkv_decode of a step with one token per sequence, with rope_yarn_qk_kv's work in its
/// epilogue (the launch then has no rope kernel): each warp of the q and k blocks computes the
/// rows j and j + D/2 of one head (a block: 8 such pairs of one head), lane t rotates token t's
/// pair as rope_yarn does (angle p inv_freq[j], its cosine and sine times att, the products, all
/// in float64: bitwise rope_yarn_qk_kv's results) and stores it; v rows go in the same pairs.
/// The rotated k and the v rows also go to k_cache / v_cache (CacheT [blocks, BS, NK / D, D]) at
/// slot kv_slot<BS>(block_table + token_seq[t] * MB, positions[t]): with one token per sequence
/// attention never reads that slot before this step (rope_yarn_qk_kv). Two rows per warp, no K
/// split; grid.x = (NQ + NK + NV) / 16.
template <int K, int NQ, int NK, int NV, int D, int BS, int MB, typename CacheT, int MAX_T,
          int UNROLL = 4, bool ROUND = false>
__device__ __forceinline__ void
qkv_rope_decode(const float* __restrict__ x, const __nv_bfloat16* __restrict__ ln, float eps,
                const __nv_bfloat16* __restrict__ wq, const __nv_bfloat16* __restrict__ bq,
                const __nv_bfloat16* __restrict__ wk, const __nv_bfloat16* __restrict__ bk,
                const __nv_bfloat16* __restrict__ wv, const __nv_bfloat16* __restrict__ bv,
                float* __restrict__ yq, float* __restrict__ yk, float* __restrict__ yv, int tokens,
                const int* __restrict__ positions, const int* __restrict__ token_seq,
                const int* __restrict__ block_table, const double* __restrict__ inv_freq,
                double att, CacheT* __restrict__ k_cache, CacheT* __restrict__ v_cache) {
  constexpr int kWarps = kLinearThreads / kWarp, kHalf = D / 2, kRows = 2 * kWarps;
  static_assert(kHalf % kWarps == 0, "a block's row pairs must lie in one head");
  static_assert(NQ % D == 0 && NK % D == 0 && NV % D == 0, "projections of whole heads");
  extern __shared__ float4 smem_linear[];
  float* xs = reinterpret_cast<float*>(smem_linear);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  int first = blockIdx.x * kRows; // in the concatenated rows, then within the projection
  const __nv_bfloat16 *w = wq, *b = bq;
  float* y = yq;
  int part = 0;
  if (first >= NQ + NK) {
    first -= NQ + NK, w = wv, b = bv, y = yv, part = 2;
  } else if (first >= NQ) {
    first -= NQ, w = wk, b = bk, y = yk, part = 1;
  }
  const int pair = first / 2 + warp, head = pair / kHalf, j = pair % kHalf;
  const int row = head * D + j; // and row + kHalf
  WarpGemv<K, 2, MAX_T, UNROLL, 1, kHalf> gemv;
  gemv.start(w + (size_t)row * K);
  // Before the wait, as the weights: the biases, the norm's gains (to L2) and lane t's angle
  // and cache slot for token t (the step's inputs were uploaded before the step's first kernel).
  const float b1 = bf16_to_float(b[row]), b2 = bf16_to_float(b[row + kHalf]);
  block_prefetch_l2(ln, K * sizeof(__nv_bfloat16));
  double c = 1.0, sn = 0.0;
  size_t slot = 0;
  if (lane < tokens && lane < MAX_T) {
    const int p = positions[lane];
    slot = (size_t)kv_slot<BS>(block_table + (size_t)token_seq[lane] * MB, p) * (NK / D) * D +
           (size_t)head * D;
    if (part < 2)
      rope_cos_sin(p, inv_freq[j], att, c, sn);
  }
  grid_dependency_sync(); // the first weight loads fly while the previous kernel finishes
  linear_stage_x<K, MAX_T, true, ROUND>(x, ln, eps, xs, tokens);
  float acc[2][MAX_T];
  gemv.finish(xs, tokens, acc);
  constexpr int kN[3] = {NQ, NK, NV};
  const int n = kN[part];
#pragma unroll
  for (int t = 0; t < MAX_T; ++t) {
    if (t >= tokens || lane != t)
      continue;
    const float x1 = acc[0][t] + b1, x2 = acc[1][t] + b2;
    float y1 = x1, y2 = x2;
    if (part < 2)
      rope_rotate(x1, x2, c, sn, y1, y2);
    y[(size_t)t * n + row] = y1;
    y[(size_t)t * n + row + kHalf] = y2;
    if (part > 0) {
      CacheT* dst = (part == 1 ? k_cache : v_cache) + slot;
      store_cache(dst + j, y1);
      store_cache(dst + j + kHalf, y2);
    }
  }
}

} // namespace xserv_kernels
