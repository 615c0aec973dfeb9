// A reference chain for the dense linears' K orders (tests and kernels_bench): D[t, n] = sum_k
// X[t, k] W[n, k] on mma.sync m16n8k16, one fp32 chain from zero over K.
#pragma once

#include "tests/codegen/kernel_test_util.h"

#include <cstring>
#include <string>
#include <vector>

namespace xserv::kernel_test {

/// D[t, n] = sum_k X[t, k] W[n, k] (bf16 in, fp32 chain from zero), one warp per 16 n x 8 t,
/// K in 16-value instructions whose position p holds K value order(k0, p): 0 natural, 1 each
/// instruction's 16 reversed, 2 gemm_wg's slots (wg_k_of_slot within 64-wide tiles).
inline const char* const kOrderChainSource = R"cuda(
#include <cuda_bf16.h>
#include "xserv_kernels/mxfp4.cuh"
using namespace xserv_kernels;

__device__ int order(int mode, int k0, int p) {
  if (mode == 1)
    return k0 + 15 - p;
  if (mode == 2)
    return k0 / 64 * 64 + wg_k_of_slot(16 * ((k0 % 64) / 16) + p);
  return k0 + p;
}

__device__ unsigned pack_at(const __nv_bfloat16* row, int mode, int k0, int p) {
  const unsigned short lo = reinterpret_cast<const unsigned short*>(row)[order(mode, k0, p)];
  const unsigned short hi = reinterpret_cast<const unsigned short*>(row)[order(mode, k0, p + 1)];
  return unsigned(lo) | (unsigned(hi) << 16);
}

extern "C" __global__ void __launch_bounds__(128) order_chain(const __nv_bfloat16* X,
    const __nv_bfloat16* W, float* D, int T, int N, int K, int mode) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int n0 = (blockIdx.x * 4 + warp) * 16, c0 = blockIdx.y * 8;
  if (n0 >= N)
    return;
  const __nv_bfloat16* a0 = W + (size_t)(n0 + g) * K;
  const __nv_bfloat16* a1 = W + (size_t)(n0 + g + 8) * K;
  const int col = c0 + g < T ? c0 + g : T - 1;
  const __nv_bfloat16* b = X + (size_t)col * K;
  float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int k0 = 0; k0 < K; k0 += 16) {
    const unsigned a[4] = {pack_at(a0, mode, k0, 2 * t), pack_at(a1, mode, k0, 2 * t),
                           pack_at(a0, mode, k0, 2 * t + 8), pack_at(a1, mode, k0, 2 * t + 8)};
    mma_bf16(c, a, pack_at(b, mode, k0, 2 * t), pack_at(b, mode, k0, 2 * t + 8));
  }
  for (int e = 0; e < 4; ++e) {
    const int n = n0 + g + 8 * (e / 2), tt = c0 + 2 * t + e % 2;
    if (tt < T)
      D[(size_t)tt * N + n] = c[e];
  }
}
)cuda";

inline const Loaded& chain_kernel() {
  KernelSource s;
  s.name = "order_chain";
  s.source = std::string("// order_chain\n") + kOrderChainSource;
  s.launch.block = 128;
  return load(std::move(s));
}

inline std::vector<float> run_chain(const DevBuf& x, const DevBuf& w, int t, int n, int k, int mode) {
  const Loaded& l = chain_kernel();
  auto d = poisoned(size_t(t) * n);
  l.module.launch(l.kernel, dim3((n + 63) / 64, (t + 7) / 8), dim3(128), 0, nullptr, x.p, w.p, d->p,
                  t, n, k, mode);
  device_sync();
  return download(*d, size_t(t) * n);
}

/// How many of the first `count` values of a and b differ in their bits.
inline int differing(const std::vector<float>& a, const std::vector<float>& b, size_t count) {
  int diff = 0;
  for (size_t i = 0; i < count; ++i)
    diff += std::memcmp(&a[i], &b[i], 4) != 0;
  return diff;
}

} // namespace xserv::kernel_test
