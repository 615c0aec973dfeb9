// The MXFP4 -> BF16 dequantisation kernel that DeviceWeights::upload compiles with NVRTC.
#include "runtime/weights.h"

namespace xserv::runtime {

const std::string& mxfp4_dequant_source() {
  static const std::string source = R"cuda(// kernel: xserv_mxfp4_to_bf16
// MXFP4 (MODEL.md "MXFP4") to BF16, bit for bit as the CPU reference
// models::float_to_bf16(models::mxfp4_decode_block(...)): for block byte j, value[2j] comes from
// the low nibble and value[2j+1] from the high one, each LUT[code] * 2^(scale - 127) computed
// exactly in float by ldexpf (subnormal results kept, overflow to infinity), then rounded to
// BF16 to nearest even (a no-op here: every such value is a BF16 value or an infinity).

// float -> bf16 bits, round to nearest even, NaN kept quiet: models::float_to_bf16.
__device__ __forceinline__ unsigned int xserv_float_to_bf16(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u)
    return ((u >> 16) | 0x0040u) & 0xFFFFu;
  return ((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16) & 0xFFFFu;
}

// FP4 (E2M1) code times 2^e as bf16 bits. |LUT| * 2 = {0, 1, 2, 3, 4, 6, 8, 12}, packed one
// nibble each, so no local-memory table is needed; the sign is bit 3 of the code (8 is -0.0).
__device__ __forceinline__ unsigned int xserv_fp4_to_bf16(unsigned int code, int e) {
  float twice = (float)((0xC8643210u >> (4u * (code & 7u))) & 0xFu);
  return xserv_float_to_bf16(ldexpf(twice, e - 1)) | ((code & 8u) << 12);
}

// Eight codes (one 32-bit word of a block, low byte first) -> four words of two bf16 each.
__device__ __forceinline__ uint4 xserv_decode_word(unsigned int w, int e) {
  unsigned int r[4];
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    unsigned int byte = (w >> (8 * b)) & 0xFFu;
    r[b] = xserv_fp4_to_bf16(byte & 0xFu, e) | (xserv_fp4_to_bf16(byte >> 4, e) << 16);
  }
  return make_uint4(r[0], r[1], r[2], r[3]);
}

// blocks: nblocks x 16 bytes; scales: nblocks bytes; out: nblocks x 32 bf16 (64 bytes). One
// thread per block: one 16-byte load, four 16-byte stores.
extern "C" __global__ void __launch_bounds__(256)
    xserv_mxfp4_to_bf16(const uint4* __restrict__ blocks, const unsigned char* __restrict__ scales,
                        uint4* __restrict__ out, unsigned long long nblocks) {
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
       i < nblocks; i += stride) {
    const uint4 q = blocks[i];
    const int e = (int)scales[i] - 127;
    uint4* o = out + 4 * i;
    o[0] = xserv_decode_word(q.x, e);
    o[1] = xserv_decode_word(q.y, e);
    o[2] = xserv_decode_word(q.z, e);
    o[3] = xserv_decode_word(q.w, e);
  }
}

// kernel: xserv_first_nonfinite
// The smallest index i < n at which `data` (elements of `bytes` = 2 (bf16), 4 (f32)) holds an
// infinity or a NaN, folded into *first by atomicMin (which starts at ~0ull: none).
extern "C" __global__ void __launch_bounds__(256)
    xserv_first_nonfinite(const void* __restrict__ data, unsigned long long n, int bytes,
                          unsigned long long* __restrict__ first) {
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const bool bad =
        bytes == 2
            ? (((const unsigned short*)data)[i] & 0x7F80u) == 0x7F80u
            : (((const unsigned int*)data)[i] & 0x7F800000u) == 0x7F800000u;
    if (bad) {
      atomicMin(first, i);
      return; // later indices of this thread are larger
    }
  }
}
)cuda";
  return source;
}

} // namespace xserv::runtime
