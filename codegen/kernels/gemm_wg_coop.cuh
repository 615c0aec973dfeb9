// The grouped MXFP4 gemm of gemm_wg.cuh with its weight decoding shared by two warpgroups: each
// K tile's MXFP4 rows are decoded once, by all 256 threads, into a bf16 A tile in shared memory
// (the 128-byte swizzle a descriptor reads), and each warpgroup multiplies it (wgmma with A and
// B from shared memory) by its half of the block's tokens. A block of BN tokens thus decodes a
// weight once where gemm_wg decodes it once per BN / 2 tokens, and the decoding of the next K
// tile runs while the tensor cores work through this one.
//
// The A tile holds, in row sr and slot kappa, exactly the bf16 value gemm_wg's thread builds in
// its register fragment for that row and slot (the same K slot order, the same row order, the
// same scaling), so the products and their sums are gemm_wg's, bit for bit.
#pragma once

#include "xserv_kernels/gemm_wg.cuh"

namespace xserv_kernels {

/// Threads of a gemm_wg_coop block: two warpgroups.
constexpr int kWgCoopThreads = 256;

/// Bytes of one gemm_wg_coop pipeline stage: the BN token rows (128 bytes each) then the 64 WM
/// MXFP4 weight rows (32 block bytes a row, then a 4-byte scale word a row), rounded to 1024.
__host__ __device__ constexpr int gemm_wg_coop_stage_bytes(int bn, int wm) {
  return (bn * 128 + 64 * wm * 36 + 1023) / 1024 * 1024;
}
/// Dynamic shared memory of gemm_wg_coop: its stages, two decoded A tiles (8 KB an m64 tile)
/// and 1024 bytes to align the first.
__host__ __device__ constexpr int gemm_wg_coop_smem_bytes(int bn, int wm, int stages) {
  return stages * gemm_wg_coop_stage_bytes(bn, wm) + 2 * wm * 8192 + 1024;
}

/// D[64 x N] += A B with A (bf16, K-major, 128-byte swizzle) read through descriptor `da`.
template <int N> struct WgMmaSS;

template <> struct WgMmaSS<64> {
  __device__ __forceinline__ static void mma(float (&d)[32], unsigned long long da,
                                             unsigned long long db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                   "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                   "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                   "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db));
  }
};

template <> struct WgMmaSS<128> {
  __device__ __forceinline__ static void mma(float (&d)[64], unsigned long long da,
                                             unsigned long long db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                   "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                   "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                   "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
                   "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
                   "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
                   "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db));
  }
};

/// gemm_wg's grouped MXFP4 gemm (GROUPED, MX4, no split activations, one K tile a stage) on
/// tiles of BN tokens: 64 WM weight rows a block (n0 = blockIdx.x * 64 WM), moe_sort's tile
/// blockIdx.y; warpgroup v multiplies the tile's tokens v BN / 2 .. (v + 1) BN / 2. Epilogues
/// swiglu (GATHER: rows are pair / KSEL's activations) and scatter, as gemm_wg's.
///
/// Per K tile: the stage's cp.async loads land (barrier), the loads of the stage STAGES - 2
/// ahead go out (the stage they overwrite was multiplied two tiles ago, its MMAs waited for),
/// every thread decodes its share of the MXFP4 rows into this tile's A buffer (of two; the
/// other is under the previous tile's MMAs), a barrier, then each warpgroup issues its four K
/// steps' MMAs and waits for the previous tile's.
template <int K, int N, int BN, int WM, int STAGES, bool GATHER, int KSEL, int EPI, bool BIAS,
          int EXPERTS, bool SMALL>
__device__ __forceinline__ void
gemm_wg_coop(const __nv_bfloat16* __restrict__ xh, const __nv_bfloat16* /*xl*/,
             const void* __restrict__ wv, const __nv_bfloat16* __restrict__ b, const float* /*h*/,
             float* y, const int* __restrict__ pair, const int* __restrict__ tiles,
             const float* __restrict__ route_w, float limit, float alpha, int tokens) {
  static_assert(K % 64 == 0, "K must be a multiple of the K tile");
  static_assert(BN == 128 || BN == 256, "BN: 128 or 256 tokens (64 or 128 a warpgroup)");
  static_assert(WM == 1 || WM == 2, "WM: 1 or 2 m64 tiles a block");
  static_assert(STAGES >= 3, "loads run STAGES - 2 stages ahead");
  static_assert(EPI == kGemmSwiglu || EPI == kGemmScatter, "the MoE's epilogues");
  static_assert(EPI != kGemmSwiglu || N % 16 == 0, "swiglu pairs rows within 16-row groups");
  constexpr int BM = 64 * WM, NC = BN / 2;
  constexpr int kTiles = K / 64;
  constexpr int kAhead = STAGES - 2;
  constexpr int kStage = gemm_wg_coop_stage_bytes(BN, WM);
  constexpr int kAOff = BN * 128; // the MXFP4 rows after the token rows
  constexpr bool kSwiglu = EPI == kGemmSwiglu;

  extern __shared__ __align__(16) unsigned char smem_wg_raw[];
  __shared__ int rows_b[BN];
  unsigned char* smem = smem_wg_raw + ((1024u - (smem_u32(smem_wg_raw) & 1023u)) & 1023u);
  unsigned char* dec = smem + STAGES * kStage; // two A tiles of WM x 8 KB

  int expert, begin, end;
  if (!gemm_tile<BN, true>(tiles, tokens, expert, begin, end))
    return;
  const int tid = threadIdx.x, lane = tid % kWarp, wgi = tid / kWgThreads;
  const int warp = (tid % kWgThreads) / kWarp; // within its warpgroup
  const int g = lane / 4, c = lane % 4;
  const int m0 = blockIdx.x * BM;
  const int rows = end - begin;
  const int rows_w = min(max(rows - wgi * NC, 0), NC); // this warpgroup's tokens
  const unsigned char* mblocks =
      static_cast<const unsigned char*>(wv) + (size_t)expert * N * (K / 2);
  const unsigned char* mscales =
      mxfp4_scales<EXPERTS * N, K>(static_cast<const unsigned char*>(wv)) +
      (size_t)expert * N * (K / 32);

  for (int i = tid; i < BN; i += kWgCoopThreads)
    rows_b[i] = i < rows ? (GATHER ? pair[begin + i] / KSEL : begin + i) : -1;
  __syncthreads();

  // The cp.async pieces, as gemm_wg's: B rows of 8 16-byte chunks (chunk j of row n at
  // j ^ (n % 8)); A rows of two 16-byte halves of block bytes; a scale word a row.
  constexpr int kVB = BN * 8 / kWgCoopThreads;
  constexpr int kVA = (BM * 2 + kWgCoopThreads - 1) / kWgCoopThreads;
  unsigned b_src[kVB], a_src[kVA];
  int b_dst[kVB], a_dst[kVA];
  bool b_ok[kVB], a_ok[kVA];
#pragma unroll
  for (int v = 0; v < kVB; ++v) {
    const int piece = tid + v * kWgCoopThreads, n = piece / 8, j = piece % 8;
    const int ar = rows_b[n];
    b_src[v] = unsigned(ar >= 0 ? ar : 0) * unsigned(K) + unsigned(j * 8);
    b_dst[v] = n * 128 + ((j ^ (n & 7)) << 4);
    b_ok[v] = ar >= 0;
  }
#pragma unroll
  for (int v = 0; v < kVA; ++v) {
    const int piece = tid + v * kWgCoopThreads;
    const int m = piece / 2, q = piece % 2, sr = wg_a_row<kSwiglu>(m);
    a_ok[v] = piece < BM * 2 && m0 + m < N;
    a_src[v] = unsigned(a_ok[v] ? m0 + m : 0) * unsigned(K / 2) + unsigned(q * 16);
    a_dst[v] = piece < BM * 2 ? sr * 32 + q * 16 : -1;
  }
  const bool s_row = tid < BM;
  const bool s_ok = s_row && m0 + tid < N;
  const size_t s_src = reinterpret_cast<size_t>(mscales) + size_t(s_ok ? m0 + tid : 0) * (K / 32);
  int s_dst = s_row ? BM * 32 + wg_a_row<kSwiglu>(tid) * 4 : 0;
  asm volatile("" : "+r"(s_dst));
  auto issue = [&](int kt) {
    unsigned char* st = smem + (kt % STAGES) * kStage;
    const int k0 = kt * 64;
#pragma unroll
    for (int v = 0; v < kVB; ++v)
      cp_async16(st + b_dst[v], xh + b_src[v] + k0, b_ok[v]);
    unsigned char* sa = st + kAOff;
#pragma unroll
    for (int v = 0; v < kVA; ++v)
      if ((BM * 2) % kWgCoopThreads == 0 || a_dst[v] >= 0)
        cp_async16(sa + a_dst[v], mblocks + a_src[v] + k0 / 2, a_ok[v]);
    if (s_row)
      cp_async4(sa + s_dst, reinterpret_cast<const void*>((s_src + k0 / 32) & ~size_t(3)), s_ok);
  };

  // The decoding: thread (staged row dr, word w of each 8-byte piece) of the 2 BM such pairs.
  // Chunk j of an A row holds slots 8 j .. 8 j + 7, K step j / 2, fragment half j % 2, the
  // quad's threads c = 0..3: their pairs k = j % 4 of word j / 4 of pieces c (gemm_wg's
  // pair_of), so thread (dr, w) writes chunks 4 w .. 4 w + 3 from words w of its row's pieces.
  const bool dec_on = tid < 2 * BM;
  const int dr = (tid / 2) % BM, dw = tid % 2;
  int ds_off; // the row's scale byte of the K tile's first block (even tiles; odd: ^ 2)
  {
    const int f = dr & 15;
    const int m = kSwiglu ? (dr & ~15) + (f < 8 ? 2 * f : 2 * (f - 8) + 1) : dr;
    const size_t row = m0 + m < N ? m0 + m : 0;
    ds_off = BM * 32 + dr * 4 + int(reinterpret_cast<size_t>(mscales + row * (K / 32)) & 3);
  }
  const int dec_row = (dr / 64) * 8192 + (dr % 64) * 128; // the row in an A buffer
  auto decode = [&](const unsigned char* sa, unsigned char* dst, int ktile) {
    const uint4 lo = *reinterpret_cast<const uint4*>(sa + dr * 32);      // pieces 0, 1
    const uint4 hi = *reinterpret_cast<const uint4*>(sa + dr * 32 + 16); // pieces 2, 3
    const unsigned q[4] = {dw ? lo.y : lo.x, dw ? lo.w : lo.z, dw ? hi.y : hi.x, dw ? hi.w : hi.z};
    const int flip = (ktile & 1) << 1;
    const unsigned s0 = sa[ds_off ^ flip], s1 = sa[(ds_off + 1) ^ flip];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      unsigned p[4];
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) {
        const unsigned raw = mx4_pair_raw(q[cc], k), s = cc < 2 ? s0 : s1;
        p[cc] = SMALL ? bf16x2_mul(raw, mxfp4_small_scale_factor(s))
                      : mxfp4_pair_scaled(raw, mxfp4_scale_factors(s));
      }
      const int j = 4 * dw + k;
      *reinterpret_cast<uint4*>(dst + dec_row + ((j ^ (dr & 7)) << 4)) =
          make_uint4(p[0], p[1], p[2], p[3]);
    }
  };

  float acc[WM][NC / 2];
#pragma unroll
  for (int wm = 0; wm < WM; ++wm)
#pragma unroll
    for (int i = 0; i < NC / 2; ++i)
      acc[wm][i] = 0.0f;

#pragma unroll
  for (int st = 0; st < kAhead; ++st) {
    if (st < kTiles)
      issue(st);
    cp_async_commit();
  }
  for (int kt = 0; kt < kTiles; ++kt) {
    cp_async_wait<kAhead - 1>();
    fence_proxy_async(); // this thread's landed B chunks, for the MMAs' async proxy
    __syncthreads();     // stage kt landed; tile kt - 2's MMAs are done (each waited below)
    if (kt + kAhead < kTiles)
      issue(kt + kAhead);
    cp_async_commit();
    const unsigned char* st = smem + (kt % STAGES) * kStage;
    unsigned char* da = dec + (kt & 1) * (WM * 8192);
    if (dec_on)
      decode(st + kAOff, da, kt);
    fence_proxy_async(); // the decoded A tile, for the MMAs
    __syncthreads();
    if (rows_w > 0) { // (a warpgroup without tokens in this tile only loads and decodes)
      const unsigned long long db = wg_desc_sw128(smem_u32(st + wgi * NC * 128));
      wg_fence();
#pragma unroll
      for (int s = 0; s < 4; ++s)
#pragma unroll
        for (int wm = 0; wm < WM; ++wm)
          WgMmaSS<NC>::mma(acc[wm], wg_desc_sw128(smem_u32(da + wm * 8192)) + 2 * s, db + 2 * s);
    }
    wg_commit();
    wg_wait<1>();
  }
  wg_wait<0>();
#pragma unroll
  for (int wm = 0; wm < WM; ++wm)
#pragma unroll
    for (int i = 0; i < NC / 2; ++i)
      wg_pin(acc[wm][i]);
  cp_async_wait<0>();

  // Epilogue (gemm_wg's): acc[wm][4 j + e] is A row wm * 64 + warp * 16 + g + 8 (e / 2), tile
  // row wgi NC + 8 j + 2 c + e % 2.
  const __nv_bfloat16* be = b + (size_t)expert * N;
#pragma unroll
  for (int wm = 0; wm < WM; ++wm) {
    const int rbase = m0 + wm * 64 + warp * 16;
#pragma unroll
    for (int j = 0; j < NC / 8; ++j)
#pragma unroll
      for (int e2 = 0; e2 < 2; ++e2) {
        const int rl = wgi * NC + 8 * j + 2 * c + e2;
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
            if (BIAS)
              v += bf16_to_float(be[n]);
            const int p = pair[r];
            y[(size_t)p * N + n] = route_w[p] * v;
          }
        }
      }
  }
}

} // namespace xserv_kernels
