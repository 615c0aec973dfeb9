// MXFP4 expert weights decoded in registers (MODEL.md "MXFP4"). A device tensor of logical
// shape [E, rows, K] holds the checkpoint's blocks [E, rows, K / 32, 16] unchanged, then its
// scales [E, rows, K / 32] unchanged: byte j of a row's block b holds values 32 b + 2 j (low
// nibble) and 32 b + 2 j + 1 (high nibble); value = e2m1(code) * 2^(scale - 127).
//
// The decoded fp32 values are exactly the BF16 dequantisation's (runtime/weights_upload.cpp):
// every e2m1 value times a power of two is a bf16 number (at most 2 significant bits), so the
// products below round nowhere, subnormal results included (no flush to zero in these kernels).
#pragma once

#include "xserv_kernels/common.cuh"

namespace xserv_kernels {

/// The scales of an MXFP4 device tensor of ROWS x K values (all experts): after the blocks.
template <int ROWS_TOTAL, int K>
__device__ __forceinline__ const unsigned char* mxfp4_scales(const unsigned char* w) {
  return w + (size_t)ROWS_TOTAL * (K / 2);
}

/// The raw MXFP4 pair (nibble k, nibble k + 4) of word q (k = 0..3) as a bf16x2 worth
/// value * 2^-126 each (nibble k in the low half; +-0.5 lands on the bf16 subnormal 2^-127).
__device__ __forceinline__ unsigned mx4_pair_raw(unsigned q, int k) {
  // Nibbles k and k + 4 alone (from q >> 8 for k = 2, 3), then one multiply adds two copies:
  // shifted so that the signs top the halves, and so that the magnitudes sit in bits 6..8 and
  // 22..24. The copies' bits are disjoint (no carries); a mask keeps the 8 bits that matter.
  const unsigned src = k < 2 ? q : q >> 8, kk = k % 2;
  const unsigned x = src & (0x000f000fu << (4 * kk));
  return (x * ((1u << (12 - 4 * kk)) + (1u << (6 - 4 * kk)))) & 0x81c081c0u;
}

/// The 8 values of one 4-byte word of a block (value k in nibble k) as fp32 times 2^-126,
/// unscaled: each pair (k, k + 4) as mx4_pair_raw's bf16 pair, widened to two floats (value 0.5
/// lands on the subnormal 2^-127, exact).
__device__ __forceinline__ void mxfp4_word_raw(unsigned q, float (&f)[8]) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const unsigned p = mx4_pair_raw(q, k);
    f[k] = __uint_as_float(p << 16);
    f[k + 4] = __uint_as_float(p & 0xffff0000u);
  }
}

/// The 8 values of one 4-byte word of a block (value k in nibble k, low nibble first) with the
/// block's scale byte s, as fp32. Each pair (k, k + 4) is moved so that its nibbles top the two
/// 16-bit halves; sign and e2m1 bits then form a bf16 pair worth value * 2^-126 (e2m1's
/// exponent field lands in bf16's, its subnormal 0.5 lands on bf16's subnormal 2^-127), and a
/// multiply by 2^126 * 2^(s - 127) gives the value.
__device__ __forceinline__ void mxfp4_word_to_f32(unsigned q, unsigned s, float (&out)[8]) {
  float f[8];
  mxfp4_word_raw(q, f);
  if (s <= 128u) { // 2^(s - 1) is a normal float
    const float m = __uint_as_float((s + 126u) << 23);
#pragma unroll
    for (int k = 0; k < 8; ++k)
      out[k] = f[k] * m;
  } else { // 2^126, 2^(s - 128), 2: each exact (255, E8M0's NaN, decodes as exponent 128,
           // as the reference's ldexp does)
    const float m0 = __uint_as_float(253u << 23), m1 = __uint_as_float((s - 1u) << 23);
#pragma unroll
    for (int k = 0; k < 8; ++k)
      out[k] = ((f[k] * m0) * m1) * 2.0f;
  }
}

/// The bf16x2 factors (x, then y) by which a raw MXFP4 pair (value * 2^-126) becomes exactly
/// value * 2^(s - 127), the BF16 dequantisation, for E8M0 byte s. Both are powers of two, so
/// each product is exact, subnormal bf16 included (mul.bf16x2 keeps subnormals): 2^(s - 1) and 1
/// for s <= 128 (2^(s - 1) is a bf16 number up to there), else 2^127 and 2^(s - 128) (s = 255,
/// refused at load, overflows as ldexp does). Computed once per row and K tile, they leave a
/// pair two multiplies and no branch.
__device__ __forceinline__ uint2 mxfp4_scale_factors(unsigned s) {
  const bool small = s <= 128u;
  return make_uint2(((small ? s + 126u : 254u) << 7) * 0x10001u,
                    ((small ? 127u : s - 1u) << 7) * 0x10001u);
}
/// mxfp4_scale_factors(s).x for s <= 128, where .y is 1: 2^(s - 1) in both halves.
__device__ __forceinline__ unsigned mxfp4_small_scale_factor(unsigned s) {
  return ((s + 126u) << 7) * 0x10001u;
}
/// a * b on two bf16 pairs (mul.rn.bf16x2 on sm_90; elsewhere through fp32, the same bits when
/// b is a power of two).
__device__ __forceinline__ unsigned bf16x2_mul(unsigned a, unsigned b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned r;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
#else
  const __nv_bfloat162 v = __floats2bfloat162_rn(
      __uint_as_float(a << 16) * __uint_as_float(b << 16),
      __uint_as_float(a & 0xffff0000u) * __uint_as_float(b & 0xffff0000u));
  return *reinterpret_cast<const unsigned*>(&v);
#endif
}
__device__ __forceinline__ unsigned mxfp4_pair_scaled(unsigned raw, uint2 f) {
  return bf16x2_mul(bf16x2_mul(raw, f.x), f.y);
}

/// Two fp32 values that are bf16 numbers, as their packed bf16 bits (`lo` in the low half).
__device__ __forceinline__ unsigned pack_exact_bf16x2(float lo, float hi) {
  return __byte_perm(__float_as_uint(lo), __float_as_uint(hi), 0x7632);
}

/// Floats per 32-value block of the staged activations: padded so that the 8 lanes of a
/// quarter warp, each reading its own block's floats, hit distinct banks.
constexpr int kMx4XStride = 36;

/// What the GEMV's activations are multiplied by when staged (mxfp4_stage_x): raw decoded
/// values are value * 2^-126, so products raw * x * 2^64 = value * x * 2^-62 stay normal floats
/// for any |value * x| above 2^-64, and |x| up to 2^64 stays finite.
constexpr float kMx4XScale = 18446744073709551616.0f; // 2^64

/// 2^(s - 127) * 2^126 / 2^64 = 2^(s - 65), the factor a block's sum of raw * staged-x products
/// takes to become the sum of value * x; applied as `sum * m0 * m1` (m0 = 1 when 2^(s - 65) is
/// a normal float, else 2^63 and m1 = 2^(s - 128), so that even E8M0's 255 stays exact).
__device__ __forceinline__ float mxfp4_block_sum_scale(float sum, unsigned s) {
  if (s <= 192u)
    return sum * __uint_as_float((s + 62u) << 23);
  return (sum * 9223372036854775808.0f) * __uint_as_float((s - 1u) << 23);
}

/// 2^(s - 65) for a scale byte s <= 192 (mxfp4_block_sum_scale's first factor) as one
/// multiply-add on the byte: (s + 62) << 23, written as PTX mad so that it stays one
/// instruction rather than a shift and an add.
__device__ __forceinline__ float mx4_scale_factor(unsigned s) {
  unsigned f;
  asm("mad.lo.u32 %0, %1, 8388608, 520093696;" : "=r"(f) : "r"(s));
  return __uint_as_float(f);
}

/// Stages K activations for WarpGemvMx4 (the whole block's threads; a barrier must follow):
/// xs[b * kMx4XStride + j] = act_value<ROUND>(x[32 b + j]) * kMx4XScale (exact: a power of two).
template <int K, int THREADS, bool ROUND = false>
__device__ __forceinline__ void mxfp4_stage_x(const float* __restrict__ x, float* __restrict__ xs) {
  for (int i = threadIdx.x; i < K; i += THREADS)
    xs[(i / 32) * kMx4XStride + i % 32] = act_value<ROUND>(x[i]) * kMx4XScale;
}

/// WarpGemv (common.cuh) for MXFP4 rows and one token: a warp's dot products of R consecutive
/// rows of K values with the staged activations xs (mxfp4_stage_x, in shared memory). Lane L
/// takes the rows' blocks L, L + 32, ... (one 16-byte load and one scale byte per row and block,
/// UNROLL blocks per row in flight as two half batches), sums each block's 32 raw products in
/// order, scales the sum by the block's scale and adds it: one multiply-add per weight, one
/// scale per 32. Not bitwise WarpGemv on the dequantised weights (the sums are grouped by
/// block), within a rounding per block of it.
template <int K, int R, int UNROLL = 2> struct WarpGemvMx4 {
  static_assert(K % 32 == 0, "MXFP4 rows are whole blocks of 32 values");
  static constexpr int kBlocks = K / 32; // blocks (16 bytes, one scale byte) per row
  static constexpr int kHalf = UNROLL > 1 ? UNROLL / 2 : 1;
  static constexpr int kBatch = kWarp * kHalf;
  static constexpr int kBatches = (kBlocks + kBatch - 1) / kBatch;

  const uint4* w = nullptr;
  const unsigned char* sc = nullptr;
  uint4 raw[kHalf][R];
  unsigned rs[kHalf][R];

  __device__ __forceinline__ void load(int base) {
    const int lane = threadIdx.x % kWarp;
#pragma unroll
    for (int u = 0; u < kHalf; ++u) {
      const int b = base + u * kWarp + lane;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        raw[u][r] = b < kBlocks ? __ldg(&w[r * kBlocks + b]) : make_uint4(0, 0, 0, 0);
        rs[u][r] = b < kBlocks ? __ldg(&sc[r * kBlocks + b]) : 0u;
      }
    }
  }

  /// Issues the first batch of loads of the R rows whose blocks start at `blocks` and whose
  /// scales start at `scales`.
  __device__ __forceinline__ void start(const unsigned char* __restrict__ blocks,
                                        const unsigned char* __restrict__ scales) {
    w = reinterpret_cast<const uint4*>(blocks);
    sc = scales;
    load(0);
  }

  /// The dot products with the staged xs, on every lane (after start()).
  __device__ __forceinline__ void finish(const float* __restrict__ xs, float (&acc)[R][1]) {
    const int lane = threadIdx.x % kWarp;
#pragma unroll
    for (int r = 0; r < R; ++r)
      acc[r][0] = 0.0f;
#pragma unroll 1
    for (int bt = 0; bt < kBatches; ++bt) {
      uint4 cur[kHalf][R];
      unsigned cs[kHalf][R];
#pragma unroll
      for (int u = 0; u < kHalf; ++u)
#pragma unroll
        for (int r = 0; r < R; ++r) {
          cur[u][r] = raw[u][r];
          cs[u][r] = rs[u][r];
        }
      if (bt + 1 < kBatches)
        load((bt + 1) * kBatch);
#pragma unroll
      for (int u = 0; u < kHalf; ++u) {
        const int b = bt * kBatch + u * kWarp + lane;
        if (b >= kBlocks)
          break;
        const float4* xb = reinterpret_cast<const float4*>(xs + b * kMx4XStride);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const unsigned words[4] = {cur[u][r].x, cur[u][r].y, cur[u][r].z, cur[u][r].w};
          float sum = 0.0f;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            float f[8];
            mxfp4_word_raw(words[i], f);
            const float4 xa = xb[2 * i], xc = xb[2 * i + 1];
            sum = fmaf(f[0], xa.x, sum);
            sum = fmaf(f[1], xa.y, sum);
            sum = fmaf(f[2], xa.z, sum);
            sum = fmaf(f[3], xa.w, sum);
            sum = fmaf(f[4], xc.x, sum);
            sum = fmaf(f[5], xc.y, sum);
            sum = fmaf(f[6], xc.z, sum);
            sum = fmaf(f[7], xc.w, sum);
          }
          acc[r][0] += mxfp4_block_sum_scale(sum, cs[u][r]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
      acc[r][0] = warp_sum(acc[r][0]);
  }
};

/// Decodes every value of an MXFP4 tensor of `n` values (n / 32 blocks) into bf16, one word per
/// thread (grid-stride): the GPU test's proof that the in-register decode equals the BF16
/// dequantisation bit for bit.
__device__ __forceinline__ void mxfp4_decode_all(const unsigned char* __restrict__ blocks,
                                                 const unsigned char* __restrict__ scales,
                                                 __nv_bfloat16* __restrict__ out, long long n) {
  const long long words = n / 8;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < words;
       i += (long long)gridDim.x * blockDim.x) {
    float v[8];
    mxfp4_word_to_f32(reinterpret_cast<const unsigned*>(blocks)[i], scales[i / 4], v);
    uint4 o;
    o.x = pack_exact_bf16x2(v[0], v[1]);
    o.y = pack_exact_bf16x2(v[2], v[3]);
    o.z = pack_exact_bf16x2(v[4], v[5]);
    o.w = pack_exact_bf16x2(v[6], v[7]);
    reinterpret_cast<uint4*>(out)[i] = o;
  }
}

} // namespace xserv_kernels
