// Prefill-path (and batched-decode) matrix multiply on tensor cores: y = epilogue(A W^T) for many
// rows, A fp32 activations rounded to bf16 while staged (optionally as a hi + lo pair of bf16
// values, which keeps ~16 bits of each activation), W bf16 weights, fp32 accumulation
// (mma.sync m16n8k16). One template serves the dense linears and the grouped MoE experts.
#pragma once

#include "xserv_kernels/common.cuh"

namespace xserv_kernels {

/// Threads per block (8 warps as 2 x 4 over the BM x 128 output tile), the N and K tile sizes,
/// and the padded shared-memory row of a K tile (40 bf16 = 80 bytes: the 8 rows one ldmatrix
/// reads land in distinct banks).
constexpr int kGemmThreads = 256;
constexpr int kGemmBN = 128, kGemmBK = 32;
constexpr int kGemmStride = kGemmBK + 8;
constexpr int kGemmStagesB = 3; // weight tiles in flight (cp.async)

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

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;");
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                         unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Two fp32 values as a packed bf16 pair (round to nearest even), `lo` in the low half.
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&v);
}

/// Per-row 1 / rms of fp32 rows (row r = blockIdx.y): inv[r] = rsqrt(mean(x[r]^2) + eps), the
/// prologue of a normed gemm (256 threads).
template <int K>
__device__ __forceinline__ void row_inv_rms(const float* __restrict__ x, float eps,
                                            float* __restrict__ inv) {
  __shared__ float partial[8];
  const int r = blockIdx.y, tid = threadIdx.x;
  float ss = 0.0f;
  for (int i = tid; i < K; i += 256) {
    const float v = x[(size_t)r * K + i];
    ss = fmaf(v, v, ss);
  }
  ss = warp_sum(ss);
  if (tid % kWarp == 0)
    partial[tid / kWarp] = ss;
  __syncthreads();
  if (tid == 0) {
    float total = 0.0f;
    for (int i = 0; i < 8; ++i)
      total += partial[i];
    inv[r] = rsqrtf(total / K + eps);
  }
}

/// Dynamic shared memory of gemm_bf16<.., BM, .., SPLIT>: two A tiles (hi and lo parts with
/// SPLIT) and kGemmStagesB W tiles.
__host__ __device__ constexpr int gemm_smem_bytes(int bm, bool split) {
  return (2 * (split ? 2 : 1) * bm + kGemmStagesB * kGemmBN) * kGemmStride * 2;
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
/// With SPLIT each A value v enters as bf16(v) + bf16(v - bf16(v)) (two MMAs per product).
/// pair (grouped launches): the sorted (token * KSEL + slot) list of moe_sort.
template <int K, int N, int BM, bool NORM, bool BIAS, bool RESIDUAL, int EPI, bool GROUPED,
          bool GATHER, int KSEL, bool SPLIT>
__device__ __forceinline__ void
gemm_bf16(const float* __restrict__ x, const float* __restrict__ inv_rms,
          const __nv_bfloat16* __restrict__ ln, const __nv_bfloat16* __restrict__ w,
          const __nv_bfloat16* __restrict__ b, const float* h, float* y,
          const int* __restrict__ pair, const int* __restrict__ tiles,
          const float* __restrict__ route_w, float limit, float alpha, int tokens) {
  static_assert(K % kGemmBK == 0, "K must be a multiple of the K tile");
  static_assert(BM == 32 || BM == 64 || BM == 128, "BM is 32, 64 or 128");
  static_assert(EPI != kGemmSwiglu || N % 2 == 0, "swiglu needs (gate, up) column pairs");
  constexpr int kMI = BM / 32;                     // m16 tiles per warp (warp tile BM/2 x 32)
  constexpr int kAParts = SPLIT ? 2 : 1;           // hi (+ lo) copies of the A tile
  constexpr int kAPieces = BM * kGemmBK / 8; // 8-float pieces of one A tile
  constexpr int kAVec = (kAPieces + kGemmThreads - 1) / kGemmThreads; // per thread
  constexpr int kKT = K / kGemmBK;

  // Dynamic shared memory (gemm_smem_bytes): A tiles [2][kAParts][BM][stride], then W tiles
  // [kGemmStagesB][128][stride].
  extern __shared__ __align__(16) unsigned char smem_gemm[];
  typedef __nv_bfloat16 ATile[kAParts][BM][kGemmStride];
  typedef __nv_bfloat16 BTile[kGemmBN][kGemmStride];
  ATile* sa = reinterpret_cast<ATile*>(smem_gemm);
  BTile* sb = reinterpret_cast<BTile*>(smem_gemm + 2 * sizeof(ATile));
  __shared__ int rows_a[BM];

  int expert, begin, end;
  if (!gemm_tile<BM, GROUPED>(tiles, tokens, expert, begin, end))
    return;
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int wm = warp / 4, wn = warp % 4; // warp's (row half, 32-column quarter)
  const int n0 = blockIdx.x * kGemmBN;
  const int rows = end - begin;
  const __nv_bfloat16* we = w + (size_t)expert * N * K;

  for (int i = tid; i < BM; i += kGemmThreads)
    rows_a[i] = i < rows ? (GATHER ? pair[begin + i] / KSEL : begin + i) : -1;
  __syncthreads();

  // A staging: thread covers (row, 8 columns) pieces; loads to registers one tile ahead.
  float4 ra[kAVec][2];
  auto load_a = [&](int kt) {
#pragma unroll
    for (int v = 0; v < kAVec; ++v) {
      const int piece = tid + v * kGemmThreads, r = piece / (kGemmBK / 8);
      const int c = (piece % (kGemmBK / 8)) * 8, ar = piece < kAPieces ? rows_a[r] : -1;
      if (ar >= 0) {
        const float4* src = reinterpret_cast<const float4*>(x + (size_t)ar * K + kt * kGemmBK + c);
        ra[v][0] = src[0];
        ra[v][1] = src[1];
      } else {
        ra[v][0] = ra[v][1] = make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
  };
  auto store_a = [&](int kt, int buf) {
#pragma unroll
    for (int v = 0; v < kAVec; ++v) {
      const int piece = tid + v * kGemmThreads, r = piece / (kGemmBK / 8);
      const int c = (piece % (kGemmBK / 8)) * 8;
      if (piece >= kAPieces)
        break;
      float f[8] = {ra[v][0].x, ra[v][0].y, ra[v][0].z, ra[v][0].w,
                    ra[v][1].x, ra[v][1].y, ra[v][1].z, ra[v][1].w};
      if (NORM) {
        const int ar = rows_a[r];
        const float s = ar >= 0 ? inv_rms[ar] : 0.0f;
        float g[8];
        unpack_bf16x8(*reinterpret_cast<const uint4*>(ln + kt * kGemmBK + c), g);
#pragma unroll
        for (int i = 0; i < 8; ++i)
          f[i] = f[i] * s * g[i];
      }
      uint4 hi;
      hi.x = pack_bf16x2(f[0], f[1]);
      hi.y = pack_bf16x2(f[2], f[3]);
      hi.z = pack_bf16x2(f[4], f[5]);
      hi.w = pack_bf16x2(f[6], f[7]);
      *reinterpret_cast<uint4*>(&sa[buf][0][r][c]) = hi;
      if (SPLIT) {
        float hf[8];
        unpack_bf16x8(hi, hf);
        uint4 lo;
        lo.x = pack_bf16x2(f[0] - hf[0], f[1] - hf[1]);
        lo.y = pack_bf16x2(f[2] - hf[2], f[3] - hf[3]);
        lo.z = pack_bf16x2(f[4] - hf[4], f[5] - hf[5]);
        lo.w = pack_bf16x2(f[6] - hf[6], f[7] - hf[7]);
        *reinterpret_cast<uint4*>(&sa[buf][kAParts - 1][r][c]) = lo;
      }
    }
  };
  // W staging: 128 rows x 32 columns = 512 16-byte pieces, two per thread, rows past N zeroed.
  auto issue_b = [&](int kt) {
    const int stage = kt % kGemmStagesB;
#pragma unroll
    for (int v = 0; v < 2; ++v) {
      const int piece = tid + v * kGemmThreads, r = piece / 4, c = (piece % 4) * 8;
      const bool valid = n0 + r < N;
      const __nv_bfloat16* src = we + (size_t)(valid ? n0 + r : 0) * K + kt * kGemmBK + c;
      cp_async16(&sb[stage][r][c], src, valid);
    }
  };

  float acc[kMI][4][4];
#pragma unroll
  for (int i = 0; i < kMI; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        acc[i][j][c] = 0.0f;

  load_a(0);
  store_a(0, 0);
#pragma unroll
  for (int s = 0; s < kGemmStagesB - 1; ++s) {
    if (s < kKT)
      issue_b(s);
    cp_async_commit();
  }

  for (int kt = 0; kt < kKT; ++kt) {
    if (kt + 1 < kKT)
      load_a(kt + 1); // global loads in flight during this tile's math
    cp_async_wait<kGemmStagesB - 2>();
    __syncthreads(); // W tile kt landed, A tile kt stored; tile kt-1 fully consumed
    if (kt + kGemmStagesB - 1 < kKT)
      issue_b(kt + kGemmStagesB - 1);
    cp_async_commit();

    const int buf = kt % 2, stage = kt % kGemmStagesB;
#pragma unroll
    for (int ks = 0; ks < kGemmBK; ks += 16) {
      unsigned bf[4][2];
#pragma unroll
      for (int nj = 0; nj < 2; ++nj) {
        // Matrices: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15).
        const int nr = wn * 32 + nj * 16 + (lane % 8) + (lane / 16) * 8;
        const int kc = ks + ((lane / 8) % 2) * 8;
        unsigned r[4];
        ldmatrix_x4(r, &sb[stage][nr][kc]);
        bf[2 * nj][0] = r[0];
        bf[2 * nj][1] = r[1];
        bf[2 * nj + 1][0] = r[2];
        bf[2 * nj + 1][1] = r[3];
      }
#pragma unroll
      for (int part = 0; part < kAParts; ++part)
#pragma unroll
        for (int mi = 0; mi < kMI; ++mi) {
          unsigned af[4];
          const int mr = wm * (BM / 2) + mi * 16 + (lane % 16);
          ldmatrix_x4(af, &sa[buf][part][mr][ks + (lane / 16) * 8]);
#pragma unroll
          for (int ni = 0; ni < 4; ++ni)
            mma_bf16(acc[mi][ni], af, bf[ni][0], bf[ni][1]);
        }
    }
    if (kt + 1 < kKT)
      store_a(kt + 1, (kt + 1) % 2); // that buffer was last read in tile kt-1
  }
  cp_async_wait<0>();

  // Epilogue: acc[mi][ni][c] is row wm*BM/2 + mi*16 + lane/4 (+8 for c >= 2), column
  // n0 + wn*32 + ni*8 + (lane%4)*2 (+1 for odd c).
#pragma unroll
  for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int rl = wm * (BM / 2) + mi * 16 + lane / 4 + half * 8;
      if (rl >= rows)
        continue;
      const int r = begin + rl;
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        const int n = n0 + wn * 32 + ni * 8 + (lane % 4) * 2;
        if (n >= N)
          continue;
        float v0 = acc[mi][ni][2 * half], v1 = acc[mi][ni][2 * half + 1];
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
          const float s = route_w[p];
          y[(size_t)p * N + n] = s * v0;
          y[(size_t)p * N + n + 1] = s * v1;
        }
      }
    }
}

/// Groups a step's (token, slot) pairs by expert for the grouped gemm (one block of 256 threads):
/// pair[] gets every p = t * KSEL + j with ids[p] == e, experts in order and p ascending within
/// one, and tiles the list of (expert, begin, end) runs of at most BM sorted rows. ids int
/// [tokens, KSEL]; at most MAX_PAIRS pairs.
template <int E, int KSEL, int BM, int MAX_PAIRS>
__device__ __forceinline__ void moe_sort(const int* __restrict__ ids, int* __restrict__ pair,
                                         int* __restrict__ tiles, int tokens) {
  __shared__ int sid[MAX_PAIRS];
  __shared__ int count[E], offset[E];
  const int n = tokens * KSEL, tid = threadIdx.x;
  if (n > MAX_PAIRS)
    __trap(); // the lowering never launches more tokens than the kernel was sized for
  for (int i = tid; i < n; i += blockDim.x)
    sid[i] = ids[i];
  __syncthreads();
  for (int e = tid; e < E; e += blockDim.x) {
    int c = 0;
    for (int i = 0; i < n; ++i)
      c += sid[i] == e;
    count[e] = c;
  }
  __syncthreads();
  if (tid == 0) {
    int off = 0, nt = 0;
    for (int e = 0; e < E; ++e) {
      offset[e] = off;
      for (int s = 0; s < count[e]; s += BM) {
        GemmTile* t = reinterpret_cast<GemmTile*>(tiles + 1) + nt++;
        t->expert = e;
        t->begin = off + s;
        t->end = off + min(s + BM, count[e]);
      }
      off += count[e];
    }
    tiles[0] = nt;
  }
  __syncthreads();
  for (int e = tid; e < E; e += blockDim.x) {
    int at = offset[e];
    for (int i = 0; i < n; ++i)
      if (sid[i] == e)
        pair[at++] = i;
  }
}

/// y[t, d] = (RESIDUAL ? h[t, d] : 0) + sum over slots j in order of part[t * KSEL + j, d], for
/// token t = blockIdx.y (256 threads). y may alias h.
template <int D, int KSEL, bool RESIDUAL>
__device__ __forceinline__ void moe_combine(const float* __restrict__ part, const float* h,
                                            float* y) {
  const int t = blockIdx.y;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < KSEL; ++j)
      s += part[((size_t)t * KSEL + j) * D + d];
    y[(size_t)t * D + d] = (RESIDUAL ? h[(size_t)t * D + d] : 0.0f) + s;
  }
}

} // namespace xserv_kernels
