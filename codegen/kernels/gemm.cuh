// Prefill-path (and batched-decode) matrix multiply on tensor cores: y = epilogue(A W^T) for many
// rows, A fp32 activations rounded to bf16 as MMA fragments are built (optionally as a hi + lo
// pair of bf16 values, which keeps ~16 bits of each activation), W bf16 weights, fp32
// accumulation (mma.sync m16n8k16). One template serves the dense linears and the grouped MoE
// experts.
#pragma once

#include "xserv_kernels/common.cuh"
#include "xserv_kernels/mxfp4.cuh"

namespace xserv_kernels {

/// Threads per block (8 warps: BM / 16 along the rows, the rest along the 128 columns), the N
/// and K tile sizes (a K tile is one 128-byte line of each weight row), and the padded
/// shared-memory rows of a K tile: W 72 bf16 = 144 bytes (the 8 rows one ldmatrix reads land in
/// distinct banks), A 72 fp32 (a half-warp's float2 fragment reads, rows g = 0..3 at columns
/// 2c, hit 16 distinct bank pairs).
constexpr int kGemmThreads = 256;
constexpr int kGemmBN = 128, kGemmBK = 64;
constexpr int kGemmStride = kGemmBK + 8;
constexpr int kGemmStrideA = kGemmBK + 8;
/// K tiles in flight (cp.async): as many as keep two blocks on an SM (228 KB of shared memory):
/// 4 x 27.6 KB for BM 32 (tiles of few rows: batched-decode MoE experts and dense split-K gemms
/// of up to 32 rows, which stream weights), 3 x 36.9 KB for BM 64, 2 x 55.3 KB for BM 128.
__host__ __device__ constexpr int gemm_stages(int bm) {
  return bm == 128 ? 2 : bm == 32 ? 4 : 3;
}

/// What the epilogue does with an output element acc[r, n] of an (expert's) tile.
enum GemmEpilogue : int {
  /// y[r, n] = acc + (BIAS ? b[n] : 0) + (RESIDUAL ? h[r, n] : 0); y may alias h.
  kGemmStore = 0,
  /// Columns (2i, 2i+1) are (gate, up): y[r, i] = (clamp(up + b, -limit, limit) + 1) *
  /// gate' sigmoid(alpha gate'), gate' = min(gate + b, limit) (y is [rows, N / 2]).
  kGemmSwiglu = 1,
  /// y[pair[r], n] = route_w[pair[r]] * (acc + b[n]): each (token, slot) pair's weighted expert
  /// output, summed over the slots by moe_combine.
  kGemmScatter = 2,
};

/// Tile list of a grouped (MoE) launch, written by moe_sort: tiles[0] = count, then per tile
/// (expert, first sorted row, end sorted row).
struct GemmTile {
  int expert, begin, end;
};

/// Per-row 1 / rms of fp32 rows (row r = blockIdx.y): inv[r] = rsqrt(mean(x[r]^2) + eps), the
/// prologue of a normed gemm (256 threads).
template <int K>
__device__ __forceinline__ void row_inv_rms(const float* __restrict__ x, float eps,
                                            float* __restrict__ inv) {
  const float v = block_inv_rms<K, 256>(x + (size_t)blockIdx.y * K, eps);
  if (threadIdx.x == 0)
    inv[blockIdx.y] = v;
}

/// An MXFP4 W tile as it lands (gemm_bf16<.., MX4>): per row its 2 blocks (32 bytes) and the
/// two aligned 4-byte words that hold their scale bytes.
constexpr int kGemmRawBytes = kGemmBN * (kGemmBK / 2 + 2 * 4);

/// Dynamic shared memory of gemm_bf16<.., BM, .., MX4>: gemm_stages(BM) stages of an fp32 A tile
/// [BM][kGemmStrideA] and a bf16 W tile [128][kGemmStride]; with MX4 the stages hold raw MXFP4
/// W tiles and one bf16 W tile receives the decoded current stage.
__host__ __device__ constexpr int gemm_smem_bytes(int bm, bool mx4 = false) {
  return mx4 ? gemm_stages(bm) * (bm * kGemmStrideA * 4 + kGemmRawBytes) + kGemmBN * kGemmStride * 2
             : gemm_stages(bm) * (bm * kGemmStrideA * 4 + kGemmBN * kGemmStride * 2);
}

/// The tile one block computes: `n0` (grid.x) of W's rows and sorted/dense rows [begin, end).
/// Dense: rows blockIdx.y * BM.. of `tokens`; grouped: tile blockIdx.y of the list (false past
/// its count).
template <int BM, bool GROUPED>
__device__ __forceinline__ bool gemm_tile(const int* tiles, int tokens, int& expert, int& begin,
                                          int& end) {
  if (!GROUPED) {
    expert = 0;
    begin = blockIdx.y * BM;
    end = min(tokens, begin + BM);
    return begin < end;
  }
  if ((int)blockIdx.y >= tiles[0])
    return false;
  const GemmTile t = reinterpret_cast<const GemmTile*>(tiles + 1)[blockIdx.y];
  expert = t.expert;
  begin = t.begin;
  end = t.end;
  return true;
}

/// y = epilogue(A W_e^T) over one BM x 128 output tile per block (grid.x = ceil(N / 128)).
/// A row r (r in the tile's rows) is x[arow(r)] with arow(r) = GATHER ? pair[r] / KSEL : r,
/// times inv_rms[arow] * ln[k] when NORM; W_e = w + expert * N * K ([N, K] bf16); b bf16 [E, N].
/// pair (grouped launches): the sorted (token * KSEL + slot) list of moe_sort. With SPLITK > 1
/// (dense stores only) block z = blockIdx.z sums only the z-th of SPLITK equal K ranges and
/// writes the raw sums to y[z, r, n] (y: [SPLITK, tokens, N]); gemm_splitk_reduce adds the
/// ranges in order, the bias and the residual.
///
/// Both operands stream through a kGemmStages-deep cp.async pipeline: A as fp32 (so the norm
/// and the rounding happen when a fragment is built), W as bf16. Each warp computes a
/// 16-row x (128 / (8 / (BM / 16)))-column piece with m16n8k16 MMAs, so each A value is rounded
/// by one warp only; A fragments are read from shared memory as fp32 pairs and
/// rounded to bf16 in registers, with SPLIT as bf16(v) + bf16(v - bf16(v)) (two MMAs per
/// product, about fp32 precision), else as bf16(v).
///
/// MX4: W is an MXFP4 device tensor of EXPERTS x N x K values (mxfp4.cuh: blocks, then
/// scales). Each stage then holds the tile's raw blocks and scale words (cp.async), and after a
/// stage lands each thread decodes one (row, block) piece of it into a single bf16 W tile: the
/// MMAs see exactly the BF16 dequantisation's values.
template <int K, int N, int BM, bool NORM, bool BIAS, bool RESIDUAL, int EPI, bool GROUPED,
          bool GATHER, int KSEL, bool SPLIT, int SPLITK = 1, bool MX4 = false, int EXPERTS = 1>
__device__ __forceinline__ void
gemm_bf16(const float* __restrict__ x, const float* __restrict__ inv_rms,
          const __nv_bfloat16* __restrict__ ln, const void* __restrict__ wv,
          const __nv_bfloat16* __restrict__ b, const float* h, float* y,
          const int* __restrict__ pair, const int* __restrict__ tiles,
          const float* __restrict__ route_w, float limit, float alpha, int tokens) {
  static_assert(K % kGemmBK == 0, "K must be a multiple of the K tile");
  static_assert(BM == 32 || BM == 64 || BM == 128, "BM is 32, 64 or 128");
  static_assert(EPI != kGemmSwiglu || N % 2 == 0, "swiglu needs (gate, up) column pairs");
  constexpr int kWarpsM = BM / 16, kWarpsN = 8 / kWarpsM; // warp grid over the tile
  constexpr int kWN = kGemmBN / kWarpsN, kNI = kWN / 8;   // warp columns, n8 tiles
  constexpr int kAChunks = BM * kGemmBK / 4;              // 16-byte pieces of one fp32 A tile
  static_assert(SPLITK == 1 || (EPI == kGemmStore && !GROUPED), "split K: dense stores only");
  static_assert((K / kGemmBK) % SPLITK == 0, "split K must divide the K tiles");
  constexpr int kKT = K / kGemmBK / SPLITK; // K tiles of this block's range
  constexpr int kGemmStages = gemm_stages(BM);

  static_assert(!MX4 || kGemmBN * 2 == kGemmThreads, "MX4: one (row, block) piece per thread");
  extern __shared__ __align__(16) unsigned char smem_gemm[];
  typedef float ATile[BM][kGemmStrideA];
  typedef __nv_bfloat16 BTile[kGemmBN][kGemmStride];
  typedef unsigned char RawTile[kGemmRawBytes]; // [128][32] block bytes, then [128][2] words
  ATile* sa = reinterpret_cast<ATile*>(smem_gemm);
  BTile* sb = reinterpret_cast<BTile*>(smem_gemm + kGemmStages * sizeof(ATile));
  RawTile* sraw = reinterpret_cast<RawTile*>(smem_gemm + kGemmStages * sizeof(ATile));
  BTile* sdec =
      reinterpret_cast<BTile*>(smem_gemm + kGemmStages * (sizeof(ATile) + sizeof(RawTile)));
  __shared__ int rows_a[BM];

  int expert, begin, end;
  if (!gemm_tile<BM, GROUPED>(tiles, tokens, expert, begin, end))
    return;
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int wm = warp / kWarpsN, wn = warp % kWarpsN; // warp's 16 rows and kWN columns
  const int g = lane / 4, c = lane % 4;               // mma fragment coordinates
  const int n0 = blockIdx.x * kGemmBN;
  const int rows = end - begin;
  const __nv_bfloat16* we = static_cast<const __nv_bfloat16*>(wv) + (size_t)expert * N * K;
  // MX4: this block's expert's blocks and scales, and this thread's (row, block) piece.
  const unsigned char* mblocks =
      static_cast<const unsigned char*>(wv) + (size_t)expert * N * (K / 2);
  const unsigned char* mscales =
      mxfp4_scales<EXPERTS * N, K>(static_cast<const unsigned char*>(wv)) +
      (size_t)expert * N * (K / 32);
  const int mrow = tid / 2, mblk = tid % 2;

  for (int i = tid; i < BM; i += kGemmThreads)
    rows_a[i] = i < rows ? (GATHER ? pair[begin + i] / KSEL : begin + i) : -1;
  __syncthreads();

  // 1 / rms of the two rows this thread's A fragments hold.
  float inv[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int ar = rows_a[wm * 16 + g + 8 * hh];
    inv[hh] = NORM && ar >= 0 ? inv_rms[ar] : 1.0f;
  }

  const int kt0 = SPLITK > 1 ? blockIdx.z * kKT : 0;
  auto issue = [&](int kt) {
    const int stage = kt % kGemmStages, k0 = (kt0 + kt) * kGemmBK;
#pragma unroll
    for (int v = 0; v < (kAChunks + kGemmThreads - 1) / kGemmThreads; ++v) {
      const int piece = tid + v * kGemmThreads;
      if (piece < kAChunks) {
        const int r = piece / (kGemmBK / 4), col = (piece % (kGemmBK / 4)) * 4;
        const int ar = rows_a[r];
        cp_async16(&sa[stage][r][col], x + (size_t)(ar >= 0 ? ar : 0) * K + k0 + col, ar >= 0);
      }
    }
    if constexpr (MX4) { // this thread's block of row mrow: 16 bytes, and the word holding its
                         // scale
      const bool valid = n0 + mrow < N;
      const size_t row = valid ? n0 + mrow : 0;
      cp_async16(&sraw[stage][mrow * 32 + mblk * 16], mblocks + row * (K / 2) + k0 / 2 + mblk * 16,
                 valid);
      const unsigned char* sp = mscales + row * (K / 32) + k0 / 32 + mblk;
      cp_async4(&sraw[stage][kGemmBN * 32 + (mrow * 2 + mblk) * 4],
                reinterpret_cast<const void*>(reinterpret_cast<size_t>(sp) & ~size_t(3)), valid);
    } else {
#pragma unroll
      for (int v = 0; v < kGemmBN * kGemmBK / 8 / kGemmThreads; ++v) { // 16-byte pieces of W
        const int piece = tid + v * kGemmThreads, r = piece / (kGemmBK / 8);
        const int col = (piece % (kGemmBK / 8)) * 8;
        const bool valid = n0 + r < N;
        cp_async16(&sb[stage][r][col], we + (size_t)(valid ? n0 + r : 0) * K + k0 + col, valid);
      }
    }
  };
  // MX4: the landed stage's piece of this thread into the bf16 tile.
  auto decode = [&](int kt) {
    const int stage = kt % kGemmStages, k0 = (kt0 + kt) * kGemmBK;
    const uint4 q = *reinterpret_cast<const uint4*>(&sraw[stage][mrow * 32 + mblk * 16]);
    const unsigned word =
        *reinterpret_cast<const unsigned*>(&sraw[stage][kGemmBN * 32 + (mrow * 2 + mblk) * 4]);
    const size_t row = n0 + mrow < N ? n0 + mrow : 0;
    const size_t at = reinterpret_cast<size_t>(mscales + row * (K / 32) + k0 / 32 + mblk);
    const unsigned s = n0 + mrow < N ? (word >> (8 * (at & 3))) & 0xffu : 0u;
    const unsigned words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float v[8];
      mxfp4_word_to_f32(words[i], s, v);
      uint4 o;
      o.x = pack_exact_bf16x2(v[0], v[1]);
      o.y = pack_exact_bf16x2(v[2], v[3]);
      o.z = pack_exact_bf16x2(v[4], v[5]);
      o.w = pack_exact_bf16x2(v[6], v[7]);
      *reinterpret_cast<uint4*>(&(*sdec)[mrow][mblk * 32 + i * 8]) = o;
    }
  };

  float acc[kNI][4];
#pragma unroll
  for (int j = 0; j < kNI; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      acc[j][e] = 0.0f;

#pragma unroll
  for (int st = 0; st < kGemmStages - 1; ++st) {
    if (st < kKT)
      issue(st);
    cp_async_commit();
  }

  for (int kt = 0; kt < kKT; ++kt) {
    cp_async_wait<kGemmStages - 2>();
    __syncthreads(); // stage kt landed for every thread; stage kt-1 fully consumed
    if (kt + kGemmStages - 1 < kKT)
      issue(kt + kGemmStages - 1);
    cp_async_commit();
    if (MX4) {
      decode(kt); // the previous tile's MMAs are done (barrier above)
      __syncthreads();
    }

    const int stage = kt % kGemmStages;
    const BTile& wt = MX4 ? *sdec : sb[stage];
#pragma unroll
    for (int ks = 0; ks < kGemmBK; ks += 16) {
      unsigned bf[kNI][2];
#pragma unroll
      for (int nj = 0; nj < kNI / 2; ++nj) {
        // Matrices: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15).
        const int nr = wn * kWN + nj * 16 + (lane % 8) + (lane / 16) * 8;
        const int kc = ks + ((lane / 8) % 2) * 8;
        unsigned r[4];
        ldmatrix_x4(r, &wt[nr][kc]);
        bf[2 * nj][0] = r[0];
        bf[2 * nj][1] = r[1];
        bf[2 * nj + 1][0] = r[2];
        bf[2 * nj + 1][1] = r[3];
      }
      // The norm weights of this thread's fragment columns ks + 2c (+1) and ks + 2c + 8 (+1).
      float lnw[2][2] = {{1.0f, 1.0f}, {1.0f, 1.0f}};
      if (NORM) {
#pragma unroll
        for (int kh = 0; kh < 2; ++kh) {
          const __nv_bfloat162 l2 = *reinterpret_cast<const __nv_bfloat162*>(
              ln + (kt0 + kt) * kGemmBK + ks + 2 * c + 8 * kh);
          lnw[kh][0] = __low2float(l2);
          lnw[kh][1] = __high2float(l2);
        }
      }
      // a0: (row g, k 2c..2c+1), a1: (row g+8, same k), a2/a3: the same rows at k + 8.
      unsigned hi[4], lo[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int hh = q % 2, kh = q / 2;
        const float2 v =
            *reinterpret_cast<const float2*>(&sa[stage][wm * 16 + g + 8 * hh][ks + 2 * c + 8 * kh]);
        float v0 = v.x, v1 = v.y;
        if (NORM) {
          v0 *= inv[hh] * lnw[kh][0];
          v1 *= inv[hh] * lnw[kh][1];
        }
        hi[q] = pack_bf16x2(v0, v1);
        if (SPLIT) {
          const float h0 = __uint_as_float(hi[q] << 16);
          const float h1 = __uint_as_float(hi[q] & 0xffff0000u);
          lo[q] = pack_bf16x2(v0 - h0, v1 - h1);
        }
      }
#pragma unroll
      for (int ni = 0; ni < kNI; ++ni) {
        mma_bf16(acc[ni], hi, bf[ni][0], bf[ni][1]);
        if (SPLIT)
          mma_bf16(acc[ni], lo, bf[ni][0], bf[ni][1]);
      }
    }
  }
  cp_async_wait<0>();

  // Epilogue: acc[ni][e] is row wm*16 + g (+8 for e >= 2), column n0 + wn*kWN + ni*8 + 2c
  // (+1 for odd e).
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int rl = wm * 16 + g + half * 8;
    if (rl >= rows)
      continue;
    const int r = begin + rl;
#pragma unroll
    for (int ni = 0; ni < kNI; ++ni) {
      const int n = n0 + wn * kWN + ni * 8 + 2 * c;
      if (n >= N)
        continue;
      float v0 = acc[ni][2 * half], v1 = acc[ni][2 * half + 1];
      if (SPLITK > 1) {
        float* out = y + ((size_t)blockIdx.z * tokens + r) * N + n;
        out[0] = v0;
        out[1] = v1;
        continue;
      }
      const __nv_bfloat16* be = b + (size_t)expert * N;
      if (BIAS) {
        v0 += bf16_to_float(be[n]);
        v1 += bf16_to_float(be[n + 1]);
      }
      if (EPI == kGemmStore) {
        float* out = y + (size_t)r * N + n;
        if (RESIDUAL) {
          v0 += h[(size_t)r * N + n];
          v1 += h[(size_t)r * N + n + 1];
        }
        out[0] = v0;
        out[1] = v1;
      } else if (EPI == kGemmSwiglu) {
        const float gate = fminf(v0, limit);
        const float up = fminf(fmaxf(v1, -limit), limit);
        const float glu = gate / (1.0f + expf(-alpha * gate));
        y[(size_t)r * (N / 2) + n / 2] = (up + 1.0f) * glu;
      } else {
        const int p = pair[r];
        const float sc = route_w[p];
        y[(size_t)p * N + n] = sc * v0;
        y[(size_t)p * N + n + 1] = sc * v1;
      }
    }
  }
}

/// y[r, n] = sum over z in order of part[z, r, n] (+ b[n]) (+ h[r, n]) for row r = blockIdx.y,
/// n spread over the grid.x blocks (one per thread with grid.x = ceil(N / 256)): the end of a
/// split-K gemm. y may alias h.
template <int N, int SPLITK, bool BIAS, bool RESIDUAL>
__device__ __forceinline__ void gemm_splitk_reduce(const float* __restrict__ part,
                                                   const __nv_bfloat16* __restrict__ b,
                                                   const float* h, float* y, int tokens) {
  const int r = blockIdx.y;
  for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < N; n += gridDim.x * blockDim.x) {
    float v = part[(size_t)r * N + n]; // the K ranges in order
#pragma unroll
    for (int z = 1; z < SPLITK; ++z)
      v += part[((size_t)z * tokens + r) * N + n];
    if (BIAS)
      v += bf16_to_float(b[n]);
    if (RESIDUAL)
      v += h[(size_t)r * N + n];
    y[(size_t)r * N + n] = v;
  }
}

/// Groups a step's (token, slot) pairs by expert for the grouped gemm (one block of 256 threads):
/// pair[] gets every p = t * KSEL + j with ids[p] == e, experts in order and p ascending within
/// one, and tiles the list of (expert, begin, end) runs of at most BM sorted rows. ids int
/// [tokens, KSEL]; at most MAX_PAIRS pairs (ids outside 0..E-1 are left out).
///
/// A stable counting sort over chunks of 256 pairs, one a thread: the lanes of a warp holding one
/// expert find each other (match.any), their rank among them is the lanes below; the warps'
/// counts of each expert, in shared memory, give a warp's place after the warps before it, and a
/// chunk's after the chunks before it. Two passes: the counts (hence offsets and tiles), then the
/// places.
template <int E, int KSEL, int BM, int MAX_PAIRS>
__device__ __forceinline__ void moe_sort(const int* __restrict__ ids, int* __restrict__ pair,
                                         int* __restrict__ tiles, int tokens) {
  constexpr int kThreads = 256, kWarps = kThreads / kWarp;
  __shared__ int count[E], offset[E], running[E];
  __shared__ int wcount[kWarps][E]; // a chunk's pairs of expert e in warp w
  const int n = tokens * KSEL, tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  if (n > MAX_PAIRS || blockDim.x != kThreads)
    __trap(); // the lowering never launches more tokens than the kernel was sized for
  const unsigned below = (1u << lane) - 1u;
  for (int e = tid; e < E; e += kThreads) {
    count[e] = 0;
    running[e] = 0;
  }
  __syncthreads();
  // Pass 1: how many pairs each expert gets (a group's first lane adds the group's size).
  for (int base = 0; base < n; base += kThreads) {
    const int i = base + tid;
    const int e = i < n ? ids[i] : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    if (e >= 0 && e < E && (peers & below) == 0)
      atomicAdd(&count[e], __popc(peers));
  }
  __syncthreads();
  // Offsets and tiles: warp 0 scans the experts' pair counts and tile counts, 32 at a time.
  if (warp == 0) {
    int pairs_before = 0, tiles_before = 0;
    for (int e0 = 0; e0 < E; e0 += kWarp) {
      const int e = e0 + lane;
      const int c = e < E ? count[e] : 0, t = (c + BM - 1) / BM;
      int pc = c, tc = t; // inclusive scans over the lanes
#pragma unroll
      for (int d = 1; d < kWarp; d *= 2) {
        const int pu = __shfl_up_sync(0xffffffffu, pc, d), tu = __shfl_up_sync(0xffffffffu, tc, d);
        if (lane >= d) {
          pc += pu;
          tc += tu;
        }
      }
      if (e < E) {
        const int off = pairs_before + pc - c;
        offset[e] = off;
        GemmTile* tl = reinterpret_cast<GemmTile*>(tiles + 1) + tiles_before + tc - t;
        for (int s = 0; s < c; s += BM, ++tl) {
          tl->expert = e;
          tl->begin = off + s;
          tl->end = off + min(s + BM, c);
        }
      }
      pairs_before += __shfl_sync(0xffffffffu, pc, kWarp - 1);
      tiles_before += __shfl_sync(0xffffffffu, tc, kWarp - 1);
    }
    if (lane == 0)
      tiles[0] = tiles_before;
  }
  // Pass 2: each pair's place, chunk by chunk in order.
  for (int base = 0; base < n; base += kThreads) {
    for (int j = tid; j < kWarps * E; j += kThreads)
      (&wcount[0][0])[j] = 0;
    __syncthreads(); // also: offset[] and the previous chunk's running[] are in
    const int i = base + tid;
    const int e = i < n ? ids[i] : -1;
    const bool live = e >= 0 && e < E;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    if (live && (peers & below) == 0)
      wcount[warp][e] = __popc(peers);
    __syncthreads();
    if (live) {
      int at = offset[e] + running[e] + __popc(peers & below);
      for (int w = 0; w < warp; ++w)
        at += wcount[w][e];
      pair[at] = i;
    }
    __syncthreads();
    for (int x = tid; x < E; x += kThreads) {
      int c = 0;
#pragma unroll
      for (int w = 0; w < kWarps; ++w)
        c += wcount[w][x];
      running[x] += c;
    }
    __syncthreads(); // the next chunk clears wcount
  }
}

/// y[t, d] = (RESIDUAL ? h[t, d] : 0) + sum over slots j in order of part[t * KSEL + j, d], for
/// token t = blockIdx.y, d spread over the grid.x blocks (one per thread with
/// grid.x = ceil(D / 256)). y may alias h.
template <int D, int KSEL, bool RESIDUAL>
__device__ __forceinline__ void moe_combine(const float* __restrict__ part, const float* h,
                                            float* y) {
  const int t = blockIdx.y;
  for (int d = blockIdx.x * blockDim.x + threadIdx.x; d < D; d += gridDim.x * blockDim.x) {
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < KSEL; ++j)
      s += part[((size_t)t * KSEL + j) * D + d];
    y[(size_t)t * D + d] = (RESIDUAL ? h[(size_t)t * D + d] : 0.0f) + s;
  }
}

} // namespace xserv_kernels
