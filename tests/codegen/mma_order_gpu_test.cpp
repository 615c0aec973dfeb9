// The property batch-invariant linears rest on (docs/DESIGN.md, "Attention in one canonical
// order", and issue 37's plan for the gemms): a chain of tensor-core products over the same K
// order gives the same fp32 bits whether it is issued as mma.sync m16n8k16 (the decode
// kernels) or as wgmma m64nNk16 (the prompt gemms, sm_90), for any N and wherever a row sits in
// the tile. A hardware or compiler that broke it would break the decode / prompt agreement, so
// it is checked on random bf16 operands with exponents spread over 2^-8..2^8 (sums that round
// differently under any other order), K = 2,880 (the 20b's hidden size).
#include "tests/codegen/kernel_test_util.h"

#include <cstring>
#include <string>
#include <vector>

using namespace xserv;
using namespace xserv::codegen;
using namespace xserv::kernel_test;

namespace {

constexpr int kK = 2880, kRows = 64, kMaxN = 256;

/// D[64 x N] = A[64 x K] B[K x N] with A row-major and BT = B^T row-major (bf16), three ways:
/// wg<N> (one warpgroup, B through shared memory in the 128-byte swizzle), mma (four warps,
/// mma.sync over 8-column tiles), both chaining K in natural order from zero.
const char* kSource = R"cuda(
#include <cuda_bf16.h>
#include "xserv_kernels/wgmma.cuh"
using namespace xserv_kernels;

__device__ unsigned pack2(const __nv_bfloat16* p) {
  return *reinterpret_cast<const unsigned*>(p);
}

template <int N>
__device__ void wg(const __nv_bfloat16* A, const __nv_bfloat16* BT, float* D, int K) {
  extern __shared__ __align__(1024) unsigned char smem[];
  unsigned char* tile =
      reinterpret_cast<unsigned char*>((reinterpret_cast<size_t>(smem) + 1023) & ~size_t(1023));
  const int tid = threadIdx.x, w = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  float d[N / 2];
  for (int i = 0; i < N / 2; ++i)
    d[i] = 0.0f;
  for (int k0 = 0; k0 < K; k0 += 64) {
    __syncthreads();
    for (int c = tid; c < N * 8; c += 128) { // row n, 16-byte chunk j at j ^ (n % 8)
      const int n = c / 8, j = c % 8;
      *reinterpret_cast<uint4*>(tile + n * 128 + (j ^ (n % 8)) * 16) =
          *reinterpret_cast<const uint4*>(BT + (size_t)n * K + k0 + 8 * j);
    }
    fence_proxy_async();
    __syncthreads();
    const unsigned base = static_cast<unsigned>(__cvta_generic_to_shared(tile));
    for (int ks = 0; ks < 4; ++ks) {
      const int kk = k0 + 16 * ks, r0 = 16 * w + g, r1 = r0 + 8;
      const unsigned a[4] = {pack2(A + (size_t)r0 * K + kk + 2 * t), pack2(A + (size_t)r1 * K + kk + 2 * t),
                             pack2(A + (size_t)r0 * K + kk + 2 * t + 8),
                             pack2(A + (size_t)r1 * K + kk + 2 * t + 8)};
      wg_fence();
      WgMma<N>::mma(d, a, wg_desc_sw128(base + 32 * ks));
      wg_commit();
      wg_wait<0>();
      for (int i = 0; i < N / 2; ++i)
        wg_pin(d[i]);
    }
  }
  for (int j = 0; j < N / 8; ++j)
    for (int e = 0; e < 4; ++e)
      D[(16 * w + g + 8 * (e / 2)) * N + 8 * j + 2 * t + e % 2] = d[4 * j + e];
}

extern "C" __global__ void __launch_bounds__(128) mma_order_wg8(const __nv_bfloat16* A,
    const __nv_bfloat16* BT, float* D, int K) { wg<8>(A, BT, D, K); }
extern "C" __global__ void __launch_bounds__(128) mma_order_wg64(const __nv_bfloat16* A,
    const __nv_bfloat16* BT, float* D, int K) { wg<64>(A, BT, D, K); }
extern "C" __global__ void __launch_bounds__(128) mma_order_wg256(const __nv_bfloat16* A,
    const __nv_bfloat16* BT, float* D, int K) { wg<256>(A, BT, D, K); }

extern "C" __global__ void __launch_bounds__(128) mma_order_sync(const __nv_bfloat16* A,
    const __nv_bfloat16* BT, float* D, int K, int N) {
  const int tid = threadIdx.x, w = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  for (int j = 0; j < N / 8; ++j) {
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int n = 8 * j + g, r0 = 16 * w + g, r1 = r0 + 8;
    for (int kk = 0; kk < K; kk += 16) {
      const unsigned a0 = pack2(A + (size_t)r0 * K + kk + 2 * t), a1 = pack2(A + (size_t)r1 * K + kk + 2 * t);
      const unsigned a2 = pack2(A + (size_t)r0 * K + kk + 2 * t + 8),
                     a3 = pack2(A + (size_t)r1 * K + kk + 2 * t + 8);
      const unsigned b0 = pack2(BT + (size_t)n * K + kk + 2 * t),
                     b1 = pack2(BT + (size_t)n * K + kk + 2 * t + 8);
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                   "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                   : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
    for (int e = 0; e < 4; ++e)
      D[(16 * w + g + 8 * (e / 2)) * N + 8 * j + 2 * t + e % 2] = c[e];
  }
}
)cuda";

const Loaded& kernel(const std::string& name) {
  KernelSource s;
  s.name = name;
  s.source = std::string("// ") + name + "\n" + kSource;
  s.launch.block = 128;
  return load(std::move(s));
}

/// Random bf16 values with exponents spread over 2^-8 .. 2^8.
std::vector<uint16_t> spread_bf16(Rng& rng, size_t n) {
  std::vector<uint16_t> out(n);
  for (uint16_t& v : out) {
    const float mant = rng.next(1.0f), e = rng.next(8.0f);
    v = models::float_to_bf16(std::ldexp(mant, int(std::floor(e))));
  }
  return out;
}

} // namespace

TEST_CASE("mma.sync and wgmma chains over one K order give the same bits, any N, any row") {
  XSERV_REQUIRE_GPU();
  if (runtime::probe_device().arch() != "sm_90") {
    MESSAGE("skipped: warpgroup MMA needs sm_90 (this device is "
            << runtime::probe_device().arch() << ")");
    return;
  }
  Rng rng{77};
  const std::vector<uint16_t> a = spread_bf16(rng, size_t(kRows) * kK),
                              bt = spread_bf16(rng, size_t(kMaxN) * kK);
  std::vector<uint16_t> a_rev(a.size()); // rows in reverse order
  for (int r = 0; r < kRows; ++r)
    std::copy_n(a.begin() + std::ptrdiff_t(r * kK), kK,
                a_rev.begin() + std::ptrdiff_t((kRows - 1 - r) * kK));
  auto da = upload(a), da_rev = upload(a_rev), dbt = upload(bt);
  auto dd = poisoned(size_t(kRows) * kMaxN);
  const int k = kK;
  auto run_wg = [&](const char* name, int n, void* ap) {
    const Loaded& l = kernel(name);
    l.module.launch(l.kernel, dim3(1), dim3(128), size_t(n) * 128 + 1024, nullptr, ap, dbt->p,
                    dd->p, k);
    device_sync();
    return download(*dd, size_t(kRows) * n);
  };
  auto run_sync = [&](void* ap) {
    const Loaded& l = kernel("mma_order_sync");
    const int n = kMaxN;
    l.module.launch(l.kernel, dim3(1), dim3(128), 0, nullptr, ap, dbt->p, dd->p, k, n);
    device_sync();
    return download(*dd, size_t(kRows) * kMaxN);
  };
  const std::vector<float> w256 = run_wg("mma_order_wg256", 256, da->p),
                           w64 = run_wg("mma_order_wg64", 64, da->p),
                           w8 = run_wg("mma_order_wg8", 8, da->p), m256 = run_sync(da->p),
                           w256_rev = run_wg("mma_order_wg256", 256, da_rev->p),
                           m256_rev = run_sync(da_rev->p);
  auto bits = [](float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
  };
  int diff_n8 = 0, diff_n64 = 0, diff_sync = 0, diff_rev = 0, diff_sync_rev = 0, nonzero = 0;
  for (int r = 0; r < kRows; ++r)
    for (int n = 0; n < kMaxN; ++n) {
      const uint32_t want = bits(w256[size_t(r * kMaxN + n)]);
      nonzero += w256[size_t(r * kMaxN + n)] != 0.0f;
      if (n < 8)
        diff_n8 += bits(w8[size_t(r * 8 + n)]) != want;
      if (n < 64)
        diff_n64 += bits(w64[size_t(r * 64 + n)]) != want;
      diff_sync += bits(m256[size_t(r * kMaxN + n)]) != want;
      diff_rev += bits(w256_rev[size_t((kRows - 1 - r) * kMaxN + n)]) != want;
      diff_sync_rev += bits(m256_rev[size_t((kRows - 1 - r) * kMaxN + n)]) != want;
    }
  MESSAGE("of " << kRows * kMaxN << " sums: wgmma n8 / n64 against n256 differ in " << diff_n8
                << " / " << diff_n64 << ", mma.sync against wgmma in " << diff_sync
                << ", rows reversed " << diff_rev << " (wgmma) and " << diff_sync_rev
                << " (mma.sync)");
  CHECK(nonzero > kRows * kMaxN / 2);
  CHECK(diff_n8 == 0);
  CHECK(diff_n64 == 0);
  CHECK(diff_sync == 0);
  CHECK(diff_rev == 0);
  CHECK(diff_sync_rev == 0);
}
