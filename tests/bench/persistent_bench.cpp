// The premise of a persistent decode kernel (issue: decode near the bandwidth limit), measured
// before one is built: two dependent GEMVs of the 20b's widths (q, k, v's 2880 -> 5120, then
// o_proj's 4096 -> 2880 on the first 4,096 outputs), weights cycled beyond the 50 MB L2, as
//   1. two kernels back to back (a boundary between them);
//   2. two kernels with programmatic dependent launch, the second's blocks copying their rows of
//      W into shared memory before they wait for the first (the plans' o_proj today);
//   3. one persistent kernel, a block an SM: each block starts copying its rows of the second
//      matrix into shared memory, computes its share of the first, meets the others at a counter
//      in global memory (release / acquire), then computes its rows of the second.
// The three give the same bits (one row_dot), checked, and a double reference checks the first.
// Part of kernels_bench (never run by ctest):
//   build/tests/kernels_bench -tc="persistent decode*"
#include "tests/codegen/kernel_test_util.h"
#include "tests/codegen/order_chain.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

using namespace xserv;
using namespace xserv::codegen;
using namespace xserv::kernel_test;

namespace {

const char* const kPersistentSource = R"cuda(
#include <cuda_bf16.h>
#include "xserv_kernels/common.cuh"
using namespace xserv_kernels;

constexpr int kWarps = 8;

// W[r, :] . x for one row (bf16 weights as 8-value pieces, k8 <= 512 of them): load_row puts a
// lane's pieces in registers (up to 16 loads in flight), dot_row sums them in order against x in
// shared memory, then the warp's sum. Every variant calls them: the same bits.
__device__ __forceinline__ void load_row(uint4 (&p)[16], const uint4* w, int k8, int lane) {
#pragma unroll
  for (int j = 0; j < 16; ++j)
    if (lane + 32 * j < k8)
      p[j] = w[lane + 32 * j];
}
__device__ __forceinline__ float dot_row(const uint4 (&p)[16], const float* xs, int k8, int lane) {
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int c = lane + 32 * j;
    if (c >= k8)
      break;
    const float4 a = reinterpret_cast<const float4*>(xs)[2 * c];
    const float4 b = reinterpret_cast<const float4*>(xs)[2 * c + 1];
    acc = fmaf(__uint_as_float(p[j].x << 16), a.x, acc);
    acc = fmaf(__uint_as_float(p[j].x & 0xffff0000u), a.y, acc);
    acc = fmaf(__uint_as_float(p[j].y << 16), a.z, acc);
    acc = fmaf(__uint_as_float(p[j].y & 0xffff0000u), a.w, acc);
    acc = fmaf(__uint_as_float(p[j].z << 16), b.x, acc);
    acc = fmaf(__uint_as_float(p[j].z & 0xffff0000u), b.y, acc);
    acc = fmaf(__uint_as_float(p[j].w << 16), b.z, acc);
    acc = fmaf(__uint_as_float(p[j].w & 0xffff0000u), b.w, acc);
  }
  return warp_sum(acc);
}

__device__ __forceinline__ unsigned ld_acquire_u32(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// x (k floats) into shared memory by the block.
__device__ __forceinline__ void stage_x(const float* x, float* xs, int k, bool from_l2) {
  for (int i = threadIdx.x; i < k; i += blockDim.x)
    xs[i] = from_l2 ? __ldcg(x + i) : x[i];
}

// y[r] = W[r, :] x for rows r = first, first + stride, ... below rows, two rows' loads in
// flight a warp (the next row's while the current one is summed).
__device__ __forceinline__ void rows_dot(const uint4* w, const float* xs, float* y, int rows,
                                         int k8, int first, int stride, int lane, uint4 (&p)[16]) {
  uint4 q[16];
  for (int r = first; r < rows; r += 2 * stride) {
    const int n = r + stride;
    if (n < rows)
      load_row(q, w + (size_t)n * k8, k8, lane);
    const float v = dot_row(p, xs, k8, lane);
    if (lane == 0)
      y[r] = v;
    if (n >= rows)
      break;
    if (n + stride < rows)
      load_row(p, w + (size_t)(n + stride) * k8, k8, lane);
    const float u = dot_row(q, xs, k8, lane);
    if (lane == 0)
      y[n] = u;
  }
}

// y = W x, rows strided over the grid's warps; each warp's first row loads before x is staged
// (and before the dependency wait: the weights owe nothing to the previous kernel).
extern "C" __global__ void __launch_bounds__(256) pb_gemv(const __nv_bfloat16* __restrict__ w,
    const float* __restrict__ x, float* __restrict__ y, int rows, int k) {
  extern __shared__ __align__(16) unsigned char smem[];
  float* xs = reinterpret_cast<float*>(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, k8 = k / 8;
  const int first = blockIdx.x * kWarps + warp, stride = gridDim.x * kWarps;
  const uint4* wv = reinterpret_cast<const uint4*>(w);
  uint4 p[16];
  if (first < rows)
    load_row(p, wv + (size_t)first * k8, k8, lane);
  grid_dependency_sync();
  stage_x(x, xs, k, false);
  __syncthreads();
  rows_dot(wv, xs, y, rows, k8, first, stride, lane, p);
}

// y = W x with a block's `per` rows copied into shared memory before the dependency wait (the
// previous kernel still running), x staged after it.
extern "C" __global__ void __launch_bounds__(256) pb_gemv_smem(const __nv_bfloat16* __restrict__ w,
    const float* __restrict__ x, float* __restrict__ y, int rows, int k, int per) {
  extern __shared__ __align__(16) unsigned char smem[];
  uint4* rows_s = reinterpret_cast<uint4*>(smem);
  float* xs = reinterpret_cast<float*>(smem + (size_t)per * k * 2);
  const int r0 = blockIdx.x * per, r1 = min(rows, r0 + per), k8 = k / 8;
  const uint4* src = reinterpret_cast<const uint4*>(w) + (size_t)r0 * k8;
  for (int i = threadIdx.x; i < (r1 - r0) * k8; i += blockDim.x)
    cp_async16(rows_s + i, src + i, true);
  cp_async_commit();
  grid_dependency_sync();
  stage_x(x, xs, k, false);
  cp_async_wait<0>();
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint4 p[16];
  if (r0 + warp < r1)
    load_row(p, rows_s + (size_t)warp * k8, k8, lane);
  rows_dot(rows_s, xs, y + r0, r1 - r0, k8, warp, kWarps, lane, p);
}

// Both: y1 = Wa x1 (rows strided over the grid's warps), then, after every block's y1 rows,
// y2 = Wb y1[0:kb] over each block's `per` rows of Wb, copied into shared memory from the start.
// `counter` only grows: launch `epoch` (1, 2, ...) waits for epoch x blocks arrivals.
extern "C" __global__ void __launch_bounds__(256) pb_persistent(
    const __nv_bfloat16* __restrict__ wa, const float* __restrict__ x1, float* y1, int rows_a,
    int ka, const __nv_bfloat16* __restrict__ wb, float* __restrict__ y2, int rows_b, int kb,
    int per, unsigned* counter, unsigned epoch) {
  extern __shared__ __align__(16) unsigned char smem[];
  uint4* rows_s = reinterpret_cast<uint4*>(smem);
  float* xs = reinterpret_cast<float*>(smem + (size_t)per * kb * 2);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, ka8 = ka / 8, kb8 = kb / 8;
  const int first = blockIdx.x * kWarps + warp, stride = gridDim.x * kWarps;
  const uint4* wav = reinterpret_cast<const uint4*>(wa);
  uint4 p[16];
  if (first < rows_a)
    load_row(p, wav + (size_t)first * ka8, ka8, lane);
  const int r0 = blockIdx.x * per, r1 = min(rows_b, r0 + per);
  const uint4* src = reinterpret_cast<const uint4*>(wb) + (size_t)r0 * kb8;
  for (int i = threadIdx.x; i < (r1 - r0) * kb8; i += blockDim.x)
    cp_async16(rows_s + i, src + i, true);
  cp_async_commit();
  stage_x(x1, xs, ka, false);
  __syncthreads();
  rows_dot(wav, xs, y1, rows_a, ka8, first, stride, lane, p);
  __syncthreads(); // the block's y1 rows are stored
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(counter, 1u);
    const unsigned target = epoch * gridDim.x;
    while (ld_acquire_u32(counter) < target)
      __nanosleep(20);
  }
  __syncthreads();
  stage_x(y1, xs, kb, true); // other blocks' stores: from L2, not a stale L1 line
  cp_async_wait<0>();
  __syncthreads();
  if (r0 + warp < r1)
    load_row(p, rows_s + (size_t)warp * kb8, kb8, lane);
  rows_dot(rows_s, xs, y2 + r0, r1 - r0, kb8, warp, kWarps, lane, p);
}
)cuda";

const Loaded& kernel(const char* name) {
  KernelSource s;
  s.name = name;
  s.source = std::string("// ") + name + "\n" + kPersistentSource;
  s.launch.block = 256;
  return load(std::move(s));
}

} // namespace

TEST_CASE("persistent decode: two dependent GEMVs as two kernels, with PDL, and as one "
          "persistent kernel (informational)") {
  XSERV_REQUIRE_GPU();
  const runtime::DeviceInfo dev = runtime::probe_device();
  if (dev.sm_major < 9) {
    MESSAGE("skipped: programmatic dependent launch needs sm_90");
    return;
  }
  const int ka = 2880, rows_a = 5120, kb = 4096, rows_b = 2880, sms = dev.multiprocessors;
  const int per = (rows_b + sms - 1) / sms;
  const size_t smem_b = size_t(per) * kb * 2 + size_t(std::max(ka, kb)) * 4;
  Rng rng{915};
  const Bf16Weight wa = random_bf16(rng, {rows_a, ka}, 1.0f / std::sqrt(float(ka)));
  const Bf16Weight wb = random_bf16(rng, {rows_b, kb}, 1.0f / std::sqrt(float(kb)));
  const Tensor x1 = random_f32(rng, {ka}, 1.0f);
  constexpr int kSets = 4; // 4 x 53 MB: beyond the L2
  std::vector<std::unique_ptr<DevBuf>> was, wbs;
  for (int s = 0; s < kSets; ++s) {
    was.push_back(upload(wa.bits));
    wbs.push_back(upload(wb.bits));
  }
  auto dx1 = upload(x1.f);
  auto y1 = poisoned(size_t(rows_a)), y2 = poisoned(size_t(rows_b));
  auto counter = upload(std::vector<int32_t>{0});
  unsigned epoch = 0;
  const Loaded& gemv = kernel("pb_gemv");
  const Loaded& gemv_smem = kernel("pb_gemv_smem");
  const Loaded& persistent = kernel("pb_persistent");
  const int blocks_a = (rows_a + 7) / 8;
  auto plain = [&](int i) {
    const auto *pa = was[size_t(i % kSets)]->p, *pb = wbs[size_t(i % kSets)]->p;
    gemv.module.launch(gemv.kernel, dim3(blocks_a), dim3(256), size_t(ka) * 4, nullptr, pa, dx1->p,
                       y1->p, rows_a, ka);
    gemv.module.launch(gemv.kernel, dim3((rows_b + 7) / 8), dim3(256), size_t(kb) * 4, nullptr, pb,
                       y1->p, y2->p, rows_b, kb);
  };
  auto pdl = [&](int i) {
    const void* pa = was[size_t(i % kSets)]->p;
    const void* pb = wbs[size_t(i % kSets)]->p;
    void* x = dx1->p;
    void *ya = y1->p, *yb = y2->p;
    int ra = rows_a, ka_ = ka, rb = rows_b, kb_ = kb, per_ = per;
    void* a_args[] = {&pa, &x, &ya, &ra, &ka_};
    const size_t a_sizes[] = {8, 8, 8, 4, 4};
    gemv.module.launch_raw(gemv.kernel, dim3(blocks_a), dim3(256), size_t(ka) * 4, nullptr, a_args,
                           a_sizes, 5, false);
    void* b_args[] = {&pb, &ya, &yb, &rb, &kb_, &per_};
    const size_t b_sizes[] = {8, 8, 8, 4, 4, 4};
    gemv_smem.module.launch_raw(gemv_smem.kernel, dim3(sms), dim3(256), smem_b, nullptr, b_args,
                                b_sizes, 6, true);
  };
  auto fused = [&](int i) {
    ++epoch;
    persistent.module.launch(persistent.kernel, dim3(sms), dim3(256), smem_b, nullptr,
                             was[size_t(i % kSets)]->p, dx1->p, y1->p, rows_a, ka,
                             wbs[size_t(i % kSets)]->p, y2->p, rows_b, kb, per, counter->p, epoch);
  };
  // The bits: each variant once on set 0, y1 against a double reference, y2 across variants.
  std::vector<std::vector<float>> outs;
  const std::function<void(int)> variants[] = {plain, pdl, fused};
  for (const auto& v : variants) {
    v(0);
    device_sync();
    outs.push_back(download(*y2, size_t(rows_b)));
  }
  const std::vector<float> got_a = download(*y1, size_t(rows_a));
  double worst = 0;
  for (int r = 0; r < rows_a; ++r) {
    double ref = 0;
    for (int c = 0; c < ka; ++c)
      ref += double(models::bf16_to_float(wa.bits[size_t(r) * ka + c])) * double(x1.f[size_t(c)]);
    worst = std::max(worst, std::abs(double(got_a[size_t(r)]) - ref) / (std::abs(ref) + 1e-3));
  }
  CHECK(worst < 1e-4);
  CHECK(differing(outs[0], outs[1], size_t(rows_b)) == 0);
  CHECK(differing(outs[0], outs[2], size_t(rows_b)) == 0);
  const double us_plain = back_to_back_us(plain), us_pdl = back_to_back_us(pdl),
               us_fused = back_to_back_us(fused);
  const double mb = (double(rows_a) * ka + double(rows_b) * kb) * 2 / 1e6;
  MESSAGE("qkv-sized then o_proj-sized GEMV ("
          << mb << " MB of weights a pair, " << sms << " SMs): two kernels " << us_plain
          << " us, with PDL and o_proj's rows in shared "
             "memory "
          << us_pdl << " us, one persistent kernel " << us_fused << " us (" << mb / us_fused * 1e3
          << " GB/s)");
}
