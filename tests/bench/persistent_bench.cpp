// The premise of a persistent decode kernel (issue: decode near the bandwidth limit), measured
// before one is built, on the plans' own one-token kernels: the 20b's q, k, v projection with its
// norm (qkv_decode: 2880 -> 4096 + 512 + 512, 320 blocks of 8 warps x 2 rows), then o_proj on
// the q output (linear_decode_smem, the plans' linear_residual_smem_r24: 4096 -> 2880 plus the
// residual, 120 blocks each holding 24 rows in shared memory), weights cycled beyond the 50 MB
// L2, as
//   1. two kernels back to back (a boundary between them);
//   2. the same with programmatic dependent launch: o_proj's blocks bulk-copy their rows while
//      qkv_decode runs, then wait for it (the plans today);
//   3. one persistent kernel of o_proj's 120 blocks (an SM each): each block starts the bulk
//      copy of its o_proj rows, computes the q, k, v row groups blockIdx.x, + 120, ... (32 rows
//      a group, 8 loads a row and lane in flight) with qkv_decode's functions (norm, WarpGemv,
//      stores), meets the others at a counter in global memory
//      (release / acquire), then finishes o_proj (linear_decode_smem with that wait);
//   4. the same grid with one weight stream an SM through a ring of 8 shared-memory pages of 24
//      KB (bulk copies, an mbarrier a page): the block's q, k, v rows 4 a page, then its 24
//      o_proj rows 3 a page. Warp w owns page slot w: it multiplies each page of its slot and
//      refills the slot with the slot's next page at once, so that o_proj's pages land while
//      the other warps finish q, k, v and the blocks meet at the counter. The sums are
//      qkv_decode's (a lane's words in order, then the warp) and linear_decode_smem's.
// The four give the same bits, checked, and a double reference checks q.
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

constexpr int kKa = 2880, kNq = 4096, kNk = 512, kNv = 512, kKb = 4096, kNb = 2880, kRowsB = 24;
constexpr int kRingSlots = 8, kRingPage = 24576; // pb_persistent_ring's kSlots, kPageBytes

const char* const kPersistentSource = R"cuda(
#include "xserv_kernels/linear.cuh"
using namespace xserv_kernels;

constexpr int KA = 2880, NQ = 4096, NK = 512, NV = 512, KB = 4096, NB = 2880, ROWS = 24;
constexpr float kEps = 1e-5f;
// The persistent kernel's row groups (qkv_decode's blocks: 8 warps x 2 rows): 8 warps x 4 rows, 8 loads a row and lane in flight (the
// same sums: WarpGemv's order does not depend on R or UNROLL), so that its 120 blocks keep
// about as many bytes in flight as qkv_decode's 320.
constexpr int kPR = 4, kPGroups = (NQ + NK + NV) / (8 * kPR);

typedef __nv_bfloat16 bf16;

extern "C" __global__ void __launch_bounds__(256) pb_qkv(const float* x, const bf16* ln,
    const bf16* wq, const bf16* bq, const bf16* wk, const bf16* bk, const bf16* wv,
    const bf16* bv, float* yq, float* yk, float* yv) {
  qkv_decode<KA, NQ, NK, NV, 1, 2>(x, ln, kEps, wq, bq, wk, bk, wv, bv, yq, yk, yv, 1);
}

extern "C" __global__ void __launch_bounds__(256) pb_oproj(const float* x, const bf16* w,
    const float* h, float* y) {
  linear_decode_smem<KB, NB, ROWS, false, true>(x, nullptr, 0.0f, w, nullptr, h, y, 1);
}

__device__ __forceinline__ unsigned ld_acquire_u32(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The grid's blocks meet (every block's stores before it visible to all after it): `counter`
// only grows, so launch `epoch` (1, 2, ...) waits for epoch x blocks arrivals.
__device__ __forceinline__ void grid_meet(unsigned* counter, unsigned epoch) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(counter, 1u);
    const unsigned target = epoch * gridDim.x;
    while (ld_acquire_u32(counter) < target)
      __nanosleep(20);
  }
  __syncthreads();
}

// qkv_decode's rows of its block vb for this warp: the projection's weights, bias, output, row
// stride and first row.
struct QkvRows {
  const bf16* w;
  const bf16* b;
  float* y;
  int n, row;
};
__device__ __forceinline__ QkvRows qkv_rows(int vb, const bf16* wq, const bf16* bq,
    const bf16* wk, const bf16* bk, const bf16* wv, const bf16* bv, float* yq, float* yk,
    float* yv) {
  QkvRows r{wq, bq, yq, NQ, vb * 8 * kPR};
  if (r.row >= NQ + NK)
    r = QkvRows{wv, bv, yv, NV, r.row - NQ - NK};
  else if (r.row >= NQ)
    r = QkvRows{wk, bk, yk, NK, r.row - NQ};
  r.row += threadIdx.x / kWarp * kPR;
  return r;
}

extern "C" __global__ void __launch_bounds__(256) pb_persistent(const float* x, const bf16* ln,
    const bf16* wq, const bf16* bq, const bf16* wk, const bf16* bk, const bf16* wv,
    const bf16* bv, float* yq, float* yk, float* yv, const bf16* wo, const float* h, float* y2,
    unsigned* counter, unsigned epoch) {
  extern __shared__ __align__(128) uint4 smem_linear_rows[]; // linear_decode_smem's rows first
  float* xs = reinterpret_cast<float*>(smem_linear_rows + ROWS * (KB / 8));
  auto qkv_then_meet = [&] {
    int vb = blockIdx.x;
    QkvRows r = qkv_rows(vb, wq, bq, wk, bk, wv, bv, yq, yk, yv);
    WarpGemv<KA, kPR, 1, 8> gemv;
    gemv.start(r.w + (size_t)r.row * KA);
    linear_stage_x<KA, 1, true>(x, ln, kEps, xs, 1);
    for (;;) {
      float bias[kPR], res[kPR] = {}, acc[kPR][1];
      load_row_bias<kPR, true>(r.b, r.row, true, bias);
      gemv.finish(xs, 1, acc);
      if (r.n == NQ)
        linear_store<NQ, 1, kPR, true, false>(acc, bias, res, r.y, r.row, 1);
      else if (r.n == NK)
        linear_store<NK, 1, kPR, true, false>(acc, bias, res, r.y, r.row, 1);
      else
        linear_store<NV, 1, kPR, true, false>(acc, bias, res, r.y, r.row, 1);
      vb += gridDim.x;
      if (vb >= kPGroups)
        break;
      r = qkv_rows(vb, wq, bq, wk, bk, wv, bv, yq, yk, yv);
      gemv.start(r.w + (size_t)r.row * KA);
    }
    grid_meet(counter, epoch); // every block's q, k, v rows stored
  };
  linear_decode_smem<KB, NB, ROWS, false, true, false, false, decltype(qkv_then_meet)>(
      yq, nullptr, 0.0f, wo, nullptr, h, y2, 1, qkv_then_meet);
}

constexpr int kSlots = 8, kPageBytes = 24576, kQkvPageRows = 4, kOPageRows = 3;
constexpr int kUnits = (NQ + NK + NV) / kQkvPageRows; // q, k, v pages over the grid

__device__ __forceinline__ void page_copy(unsigned char* ring, unsigned long long* full, int slot,
                                          const void* src, unsigned bytes) {
  bulk_copy_g2s(ring + (size_t)slot * kPageBytes, src, bytes, &full[slot]);
}

// Page p of the block's stream: q, k, v unit u0 + p while p < nq, else o_proj's rows
// 3 (p - nq) .. + 2 of the block's 24.
__device__ __forceinline__ void issue_page(unsigned char* ring, unsigned long long* full, int p,
    int u0, int nq, const bf16* wq, const bf16* wk, const bf16* wv, const bf16* wo) {
  const int slot = p % kSlots;
  if (p < nq) {
    int row = (u0 + p) * kQkvPageRows;
    const bf16* w = wq;
    if (row >= NQ + NK)
      w = wv, row -= NQ + NK;
    else if (row >= NQ)
      w = wk, row -= NQ;
    page_copy(ring, full, slot, w + (size_t)row * KA, kQkvPageRows * KA * 2);
  } else {
    const int row = blockIdx.x * ROWS + (p - nq) * kOPageRows;
    page_copy(ring, full, slot, wo + (size_t)row * KB, kOPageRows * KB * 2);
  }
}

extern "C" __global__ void __launch_bounds__(256) pb_persistent_ring(const float* x,
    const bf16* ln, const bf16* wq, const bf16* bq, const bf16* wk, const bf16* bk,
    const bf16* wv, const bf16* bv, float* yq, float* yk, float* yv, const bf16* wo,
    const float* h, float* y2, unsigned* counter, unsigned epoch) {
  extern __shared__ __align__(128) unsigned char ring[];
  float* xs = reinterpret_cast<float*>(ring + kSlots * kPageBytes);
  __shared__ __align__(8) unsigned long long full[kSlots];
  __shared__ float red[kSlots][ROWS];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int u0 = blockIdx.x * kUnits / gridDim.x, nq = (blockIdx.x + 1) * kUnits / gridDim.x - u0;
  if (threadIdx.x == 0)
    for (int s = 0; s < kSlots; ++s)
      mbarrier_init(&full[s], 1);
  __syncthreads();
  if (lane == 0)
    issue_page(ring, full, warp, u0, nq, wq, wk, wv, wo);
  linear_stage_x<KA, 1, true>(x, ln, kEps, xs, 1);
  // 1. q, k, v: warp w the pages of slot w, a lane's words in order as WarpGemv sums them.
  constexpr int kWords = KA / 8;
  int uses = 0;
  for (int p = warp; p < nq; p += kSlots, ++uses) {
    mbarrier_wait(&full[warp], uses & 1);
    const uint4* page = reinterpret_cast<const uint4*>(ring + (size_t)warp * kPageBytes);
    float acc[kQkvPageRows];
#pragma unroll
    for (int r = 0; r < kQkvPageRows; ++r)
      acc[r] = 0.0f;
    for (int c = lane; c < kWords; c += kWarp) {
      const float4 xa = reinterpret_cast<const float4*>(xs)[2 * c];
      const float4 xb = reinterpret_cast<const float4*>(xs)[2 * c + 1];
#pragma unroll
      for (int r = 0; r < kQkvPageRows; ++r)
        acc[r] = fma_bf16x8(page[r * kWords + c], xa, xb, acc[r]);
    }
#pragma unroll
    for (int r = 0; r < kQkvPageRows; ++r)
      acc[r] = warp_sum(acc[r]);
    __syncwarp();
    if (lane == 0) {
      // The page's reads before the copy that overwrites it (generic, then async proxy).
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      issue_page(ring, full, p + kSlots < nq ? p + kSlots : nq + (warp - nq % kSlots + kSlots) % kSlots,
                 u0, nq, wq, wk, wv, wo);
      int row = (u0 + p) * kQkvPageRows;
      const bf16* b = bq;
      float* y = yq;
      if (row >= NQ + NK)
        b = bv, y = yv, row -= NQ + NK;
      else if (row >= NQ)
        b = bk, y = yk, row -= NQ;
#pragma unroll
      for (int r = 0; r < kQkvPageRows; ++r)
        y[row + r] = acc[r] + bf16_to_float(b[row + r]);
    }
  }
  // 2. The blocks meet: every q, k, v row stored.
  grid_meet(counter, epoch);
  // 3. o_proj as linear_decode_smem sums it: warp w the w-th eighth of each row's words.
  constexpr int kOWords = KB / 8, kWarpWords = kOWords / 8, kLaneWords = kWarpWords / kWarp;
  const int c0 = warp * kWarpWords;
  float xr[kLaneWords][8];
#pragma unroll
  for (int j = 0; j < kLaneWords; ++j) {
    const int c = c0 + lane + j * kWarp;
    const float4 lo = __ldcg(reinterpret_cast<const float4*>(yq) + 2 * c);
    const float4 hi = __ldcg(reinterpret_cast<const float4*>(yq) + 2 * c + 1);
    const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
    for (int e = 0; e < 8; ++e)
      xr[j][e] = v[e];
  }
  float acc[ROWS];
#pragma unroll
  for (int j = 0; j < kSlots; ++j) { // o_proj page j: rows 3 j .. 3 j + 2
    const int slot = (nq + j) % kSlots, uses_of_slot = (nq - slot + kSlots - 1) / kSlots;
    mbarrier_wait(&full[slot], uses_of_slot & 1);
    const uint4* page = reinterpret_cast<const uint4*>(ring + (size_t)slot * kPageBytes);
#pragma unroll
    for (int q = 0; q < kOPageRows; ++q) {
      float a = 0.0f;
#pragma unroll
      for (int jj = 0; jj < kLaneWords; ++jj)
        a = fma_bf16x8(page[q * kOWords + c0 + lane + jj * kWarp], xr[jj], a);
      acc[j * kOPageRows + q] = a;
    }
  }
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const float v = warp_sum(acc[r]);
    if (lane == 0)
      red[warp][r] = v;
  }
  __syncthreads();
  if (threadIdx.x < ROWS) {
    const int row = blockIdx.x * ROWS + threadIdx.x;
    float v = red[0][threadIdx.x];
#pragma unroll
    for (int i = 1; i < kSlots; ++i)
      v += red[i][threadIdx.x];
    y2[row] = v + h[row];
  }
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

TEST_CASE("persistent decode: qkv then o_proj as two kernels, with PDL, and as one persistent "
          "kernel with and without a loader ring (informational)") {
  XSERV_REQUIRE_GPU();
  const runtime::DeviceInfo dev = runtime::probe_device();
  const int blocks_b = kNb / kRowsB, groups_a = (kNq + kNk + kNv) / 16;
  if (dev.sm_major < 9 || dev.multiprocessors < blocks_b) {
    MESSAGE("skipped: needs sm_90 (programmatic dependent launch, bulk copies) and an SM for "
            "each of o_proj's "
            << blocks_b << " blocks");
    return;
  }
  const size_t smem_a = size_t(kKa) * 4, smem_b = size_t(kRowsB) * kKb * 2;
  Rng rng{915};
  const float sa = 1.0f / std::sqrt(float(kKa)), sb = 1.0f / std::sqrt(float(kKb));
  const Bf16Weight wq = random_bf16(rng, {kNq, kKa}, sa), wk = random_bf16(rng, {kNk, kKa}, sa),
                   wv = random_bf16(rng, {kNv, kKa}, sa), wo = random_bf16(rng, {kNb, kKb}, sb);
  const Bf16Weight bq = random_bf16(rng, {kNq}, 0.5f), bk = random_bf16(rng, {kNk}, 0.5f),
                   bv = random_bf16(rng, {kNv}, 0.5f), ln = random_bf16(rng, {kKa}, 1.0f);
  const Tensor x = random_f32(rng, {kKa}, 1.0f), h = random_f32(rng, {kNb}, 1.0f);
  constexpr int kSets = 4; // 4 x 53 MB of weights: beyond the L2
  std::vector<std::unique_ptr<DevBuf>> wqs, wks, wvs, wos;
  for (int s = 0; s < kSets; ++s) {
    wqs.push_back(upload(wq.bits));
    wks.push_back(upload(wk.bits));
    wvs.push_back(upload(wv.bits));
    wos.push_back(upload(wo.bits));
  }
  auto dbq = upload(bq.bits), dbk = upload(bk.bits), dbv = upload(bv.bits), dln = upload(ln.bits);
  auto dx = upload(x.f), dh = upload(h.f);
  auto yq = poisoned(size_t(kNq)), yk = poisoned(size_t(kNk)), yv = poisoned(size_t(kNv)),
       y2 = poisoned(size_t(kNb));
  auto counter = upload(std::vector<int32_t>{0});
  unsigned epoch = 0;
  const Loaded& qkv = kernel("pb_qkv");
  const Loaded& oproj = kernel("pb_oproj");
  const Loaded& persistent = kernel("pb_persistent");
  const Loaded& ring = kernel("pb_persistent_ring");
  const size_t smem_ring = size_t(kRingSlots) * kRingPage + smem_a;
  // parts: 1 qkv_decode, 2 o_proj, 3 both.
  auto two = [&](int i, bool pdl, int parts = 3) {
    const size_t s = size_t(i % kSets);
    const void *x_ = dx->p, *ln_ = dln->p, *wq_ = wqs[s]->p, *bq_ = dbq->p, *wk_ = wks[s]->p,
               *bk_ = dbk->p, *wv_ = wvs[s]->p, *bv_ = dbv->p, *wo_ = wos[s]->p, *h_ = dh->p;
    void *yq_ = yq->p, *yk_ = yk->p, *yv_ = yv->p, *y2_ = y2->p;
    void* a_args[] = {&x_, &ln_, &wq_, &bq_, &wk_, &bk_, &wv_, &bv_, &yq_, &yk_, &yv_};
    const size_t a_sizes[] = {8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8};
    if (parts & 1)
      qkv.module.launch_raw(qkv.kernel, dim3(groups_a), dim3(256), smem_a, nullptr, a_args, a_sizes,
                            11, false);
    if (!(parts & 2))
      return;
    void* b_args[] = {&yq_, &wo_, &h_, &y2_};
    const size_t b_sizes[] = {8, 8, 8, 8};
    oproj.module.launch_raw(oproj.kernel, dim3(blocks_b), dim3(256), smem_b, nullptr, b_args,
                            b_sizes, 4, pdl);
  };
  auto plain = [&](int i) { two(i, false); };
  auto pdl = [&](int i) { two(i, true); };
  auto fused = [&](int i) {
    const size_t s = size_t(i % kSets);
    ++epoch;
    persistent.module.launch(persistent.kernel, dim3(blocks_b), dim3(256), smem_b + smem_a, nullptr,
                             dx->p, dln->p, wqs[s]->p, dbq->p, wks[s]->p, dbk->p, wvs[s]->p, dbv->p,
                             yq->p, yk->p, yv->p, wos[s]->p, dh->p, y2->p, counter->p, epoch);
  };
  // The bits: each variant once on set 0; q against a double reference; q, k, v and o_proj's
  // output across the variants.
  std::vector<std::vector<float>> outs;
  auto ringed = [&](int i) {
    const size_t s = size_t(i % kSets);
    ++epoch;
    ring.module.launch(ring.kernel, dim3(blocks_b), dim3(256), smem_ring, nullptr, dx->p, dln->p,
                       wqs[s]->p, dbq->p, wks[s]->p, dbk->p, wvs[s]->p, dbv->p, yq->p, yk->p, yv->p,
                       wos[s]->p, dh->p, y2->p, counter->p, epoch);
  };
  const std::function<void(int)> variants[] = {plain, pdl, fused, ringed};
  for (const auto& v : variants) {
    for (DevBuf* b : {yq.get(), yk.get(), yv.get(), y2.get()})
      cuda_ok(cudaMemset(b->p, 0xff, b->bytes), "poison");
    v(0);
    device_sync();
    std::vector<float> all = download(*yq, size_t(kNq));
    for (const DevBuf* b : {yk.get(), yv.get()}) {
      const std::vector<float> part = download(*b, b->bytes / 4);
      all.insert(all.end(), part.begin(), part.end());
    }
    const std::vector<float> o = download(*y2, size_t(kNb));
    all.insert(all.end(), o.begin(), o.end());
    outs.push_back(std::move(all));
  }
  double ss = 0;
  for (float v : x.f)
    ss += double(v) * v;
  const double inv = 1.0 / std::sqrt(ss / kKa + 1e-5);
  double worst = 0;
  for (int r = 0; r < kNq; ++r) {
    double ref = double(bq.t.f[size_t(r)]);
    for (int c = 0; c < kKa; ++c)
      ref += double(wq.t.f[size_t(r) * kKa + c]) *
             (double(x.f[size_t(c)]) * inv * double(ln.t.f[size_t(c)]));
    worst = std::max(worst, std::abs(double(outs[0][size_t(r)]) - ref) / (std::abs(ref) + 1e-3));
  }
  CHECK(worst < 1e-4);
  const size_t n = outs[0].size();
  CHECK(differing(outs[0], outs[1], n) == 0);
  CHECK(differing(outs[0], outs[2], n) == 0);
  CHECK(differing(outs[0], outs[3], n) == 0);
  const double us_plain = back_to_back_us(plain), us_pdl = back_to_back_us(pdl),
               us_fused = back_to_back_us(fused), us_ring = back_to_back_us(ringed);
  const double us_qkv = back_to_back_us([&](int i) { two(i, false, 1); });
  const double us_oproj = back_to_back_us([&](int i) { two(i, false, 2); });
  const double mb_a = double(kNq + kNk + kNv) * kKa * 2 / 1e6, mb_b = double(kNb) * kKb * 2 / 1e6,
               mb = mb_a + mb_b;
  auto gbs = [](double mbytes, double us) { return mbytes / us * 1e3; };
  MESSAGE("qkv_decode (" << mb_a << " MB) then o_proj (linear_decode_smem, " << mb_b << " MB), "
                         << dev.multiprocessors << " SMs: alone " << us_qkv << " us ("
                         << gbs(mb_a, us_qkv) << " GB/s) and " << us_oproj << " us ("
                         << gbs(mb_b, us_oproj) << " GB/s); two kernels " << us_plain << " us ("
                         << gbs(mb, us_plain) << " GB/s), with PDL " << us_pdl << " us ("
                         << gbs(mb, us_pdl) << " GB/s), one persistent kernel " << us_fused
                         << " us (" << gbs(mb, us_fused) << " GB/s), with a loader ring " << us_ring
                         << " us (" << gbs(mb, us_ring) << " GB/s)");
}
