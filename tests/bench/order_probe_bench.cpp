// What the dense linears' canonical order can rest on (issue: batch invariance by default):
// which orders of a dot product's tensor-core sums give the same fp32 bits. Part of kernels_bench
// (never run by ctest; the findings go to docs/DESIGN.md and the issue):
//   build/tests/kernels_bench -tc="dense K order*"
// 1. Inside one MMA: a chain of mma.sync m16n8k16 over K in natural order against the same
//    chain with each instruction's 16 products in other positions (reversed), and against
//    gemm_wg's slot grouping (other K values share an instruction).
// 2. cuBLAS (runtime::Blas, the plans' library call) at 1 to 2,048 rows: against the natural
//    chain, and against its own rows at 2,048 (is it invariant in the rows it is given?).
#include "runtime/blas.h"
#include "tests/codegen/kernel_test_util.h"

#include <cstring>
#include <string>
#include <vector>

using namespace xserv;
using namespace xserv::codegen;
using namespace xserv::kernel_test;

namespace {

/// D[t, n] = sum_k X[t, k] W[n, k] (bf16 in, fp32 chain from zero), one warp per 16 n x 8 t,
/// K in 16-value instructions whose position p holds K value order(k0, p): 0 natural, 1 each
/// instruction's 16 reversed, 2 gemm_wg's slots (wg_k_of_slot within 64-wide tiles).
const char* kSource = R"cuda(
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

const Loaded& chain_kernel() {
  KernelSource s;
  s.name = "order_chain";
  s.source = std::string("// order_chain\n") + kSource;
  s.launch.block = 128;
  return load(std::move(s));
}

std::vector<float> run_chain(const DevBuf& x, const DevBuf& w, int t, int n, int k, int mode) {
  const Loaded& l = chain_kernel();
  auto d = poisoned(size_t(t) * n);
  l.module.launch(l.kernel, dim3((n + 63) / 64, (t + 7) / 8), dim3(128), 0, nullptr, x.p, w.p, d->p,
                  t, n, k, mode);
  device_sync();
  return download(*d, size_t(t) * n);
}

int differing(const std::vector<float>& a, const std::vector<float>& b, size_t count) {
  int diff = 0;
  for (size_t i = 0; i < count; ++i)
    diff += std::memcmp(&a[i], &b[i], 4) != 0;
  return diff;
}

} // namespace

TEST_CASE("dense K order: positions inside an MMA, gemm_wg's grouping, cuBLAS (informational)") {
  XSERV_REQUIRE_GPU();
  struct Shape {
    const char* name;
    int k, n;
  };
  const Shape shapes[] = {{"20b qkv", 2880, 5120}, {"20b o_proj", 4096, 2880}};
  const int kMaxT = 2048;
  for (const Shape& s : shapes) {
    Rng rng{4242};
    // Weights and activations as the model has them: bf16, spread exponents (RMS ~1 / sqrt(K)
    // weights, activations ~1).
    auto x = upload(random_bf16(rng, {kMaxT, s.k}, 1.0f).bits);
    auto w = upload(random_bf16(rng, {s.n, s.k}, 1.0f / std::sqrt(float(s.k))).bits);
    const std::vector<float> natural = run_chain(*x, *w, kMaxT, s.n, s.k, 0);
    const std::vector<float> reversed = run_chain(*x, *w, kMaxT, s.n, s.k, 1);
    const std::vector<float> slots = run_chain(*x, *w, kMaxT, s.n, s.k, 2);
    const size_t all = natural.size();
    MESSAGE(s.name << ": of " << all << " sums, natural order against each instruction's "
                   << "products reversed: " << differing(natural, reversed, all)
                   << " differ; against gemm_wg's slot grouping: "
                   << differing(natural, slots, all));
    runtime::Blas blas;
    std::vector<float> full;
    for (int t : {2048, 1, 8, 64, 65, 128, 256, 512, 1000}) {
      auto y = poisoned(size_t(t) * s.n);
      blas.gemm_bf16(nullptr, s.n, s.k, t, false, x->p, w->p, y->p);
      device_sync();
      const std::vector<float> got = download(*y, size_t(t) * s.n);
      if (t == kMaxT)
        full = got;
      const size_t count = got.size();
      MESSAGE(s.name << " cuBLAS at " << t << " rows: against the natural chain "
                     << differing(got, natural, count) << ", against gemm_wg's slots "
                     << differing(got, slots, count) << ", against its own rows at 2048 "
                     << differing(got, full, count) << " of " << count << " differ");
    }
  }
}
