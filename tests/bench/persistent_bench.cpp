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
//      KB (bulk copies, a full and an empty mbarrier a page): the block's q, k, v rows 4 a page,
//      then its 24 o_proj rows 3 a page. Warp w multiplies the pages of slot w; having read page
//      p it issues q, k, v page p + `ahead` (1-8 pages in flight) into that page's slot once the
//      slot is free, and after its slot's last q, k, v page the slot's o_proj page, so that
//      o_proj's pages land while the other warps finish q, k, v and the blocks meet at the
//      counter. The sums are qkv_decode's (a lane's words in order, then the warp) and
//      linear_decode_smem's. Each block stamps the global clock as it starts, as its first page
//      lands, as its q, k, v rows are done, past the meet and at its end.
//   5. the ring with q, k, v pages taken from a global counter instead of dealt (each warp
//      refills its own slot with the next page it takes, then with its o_proj page), so that
//      the blocks reach the meet within a page of each other;
// and the floors: the same bytes read by a plain streaming kernel, and through the ring alone.
// Every form gives the same bits (checked; a double reference checks q) and is timed launched
// back to back and as one CUDA graph of 40 launches (the plans replay graphs).
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

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}
// Stamp k of this block, when the kernel was given somewhere to leave them (5 a block).
__device__ __forceinline__ void stamp(unsigned long long* stamps, int k) {
  if (stamps != nullptr)
    stamps[blockIdx.x * 5 + k] = now_ns();
}

// The floor: the same bytes read and nothing else, 16 bytes a load, 8 loads a thread in flight,
// grid-stride over each weight in turn (any grid); out gets each warp's xor (never the same).
__device__ __forceinline__ unsigned stream_xor(const uint4* src, unsigned n, unsigned acc) {
  const unsigned stride = gridDim.x * blockDim.x;
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 7 * stride < n; i += 8 * stride) {
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u)
      v[u] = __ldcs(src + i + u * stride);
#pragma unroll
    for (int u = 0; u < 8; ++u)
      acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = __ldcs(src + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  return acc;
}
extern "C" __global__ void __launch_bounds__(256) pb_stream(const uint4* a, unsigned na,
    const uint4* b, unsigned nb, const uint4* c, unsigned nc, const uint4* d, unsigned nd,
    unsigned* out) {
  unsigned acc = stream_xor(d, nd, stream_xor(c, nc, stream_xor(b, nb, stream_xor(a, na, 0))));
  for (int o = 16; o > 0; o /= 2)
    acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if (threadIdx.x % kWarp == 0)
    out[(blockIdx.x * blockDim.x + threadIdx.x) / kWarp] = acc;
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

__device__ __forceinline__ void mbarrier_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

__device__ __forceinline__ void page_copy(unsigned char* ring, unsigned long long* full, int slot,
                                          const void* src, unsigned bytes) {
  bulk_copy_g2s(ring + (size_t)slot * kPageBytes, src, bytes, &full[slot]);
}

// Every q, k, v row of the block stored: stamp 2, meet the other blocks, stamp 3.
__device__ __forceinline__ void meet_stamped(unsigned* counter, unsigned epoch,
                                             unsigned long long* stamps) {
  __syncthreads();
  if (threadIdx.x == 0)
    stamp(stamps, 2);
  grid_meet(counter, epoch);
  if (threadIdx.x == 0)
    stamp(stamps, 3);
}

// Where q, k, v unit u's 4 rows are: their projection's weights, bias and output, and the
// first row's index in it.
struct QkvUnit {
  const bf16* w;
  const bf16* b;
  float* y;
  int row;
};
__device__ __forceinline__ QkvUnit qkv_unit(int u, const bf16* wq, const bf16* bq,
    const bf16* wk, const bf16* bk, const bf16* wv, const bf16* bv, float* yq, float* yk,
    float* yv) {
  const int row = u * kQkvPageRows;
  if (row >= NQ + NK)
    return QkvUnit{wv, bv, yv, row - NQ - NK};
  if (row >= NQ)
    return QkvUnit{wk, bk, yk, row - NQ};
  return QkvUnit{wq, bq, yq, row};
}
__device__ __forceinline__ void copy_qkv_page(unsigned char* ring, unsigned long long* full,
                                              int slot, const QkvUnit& u) {
  page_copy(ring, full, slot, u.w + (size_t)u.row * KA, kQkvPageRows * KA * 2);
}
// o_proj page j of the block: its rows 3 j .. 3 j + 2 of the block's 24.
__device__ __forceinline__ void copy_oproj_page(unsigned char* ring, unsigned long long* full,
                                                int slot, int j, const bf16* wo) {
  page_copy(ring, full, slot, wo + ((size_t)blockIdx.x * ROWS + j * kOPageRows) * KB,
            kOPageRows * KB * 2);
}

// Page p of the block's stream: q, k, v unit u0 + p while p < nq, else o_proj page p - nq.
__device__ __forceinline__ void issue_page(unsigned char* ring, unsigned long long* full, int p,
    int u0, int nq, const bf16* wq, const bf16* wk, const bf16* wv, const bf16* wo) {
  if (p < nq)
    copy_qkv_page(ring, full, p % kSlots,
                  qkv_unit(u0 + p, wq, nullptr, wk, nullptr, wv, nullptr, nullptr, nullptr,
                           nullptr));
  else
    copy_oproj_page(ring, full, p % kSlots, p - nq, wo);
}

// A q, k, v page in a slot times the staged x (a lane's words in order, as WarpGemv sums
// them), summed over the warp: every lane gets the page's 4 dot products.
__device__ __forceinline__ void qkv_page_dot(const unsigned char* ring, int slot, const float* xs,
                                             float (&acc)[kQkvPageRows]) {
  constexpr int kWords = KA / 8;
  const int lane = threadIdx.x % kWarp;
  const uint4* page = reinterpret_cast<const uint4*>(ring + (size_t)slot * kPageBytes);
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
}
__device__ __forceinline__ void store_qkv_page(const QkvUnit& u,
                                               const float (&acc)[kQkvPageRows]) {
#pragma unroll
  for (int r = 0; r < kQkvPageRows; ++r)
    u.y[u.row + r] = acc[r] + bf16_to_float(u.b[u.row + r]);
}

// After the meet: o_proj as linear_decode_smem sums it, warp w the w-th eighth of each row's
// words, from the ring's 8 o_proj pages (page j in slot where(j).x, landed at the end of that
// slot's phase where(j).y), then y2 = o_proj(yq) + h for the block's 24 rows.
template <class Where>
__device__ __forceinline__ void oproj_from_ring(const unsigned char* ring,
    unsigned long long* full, Where where, const float* yq, const float* h, float* y2) {
  __shared__ float red[kSlots][ROWS];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
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
    const int2 at = where(j);
    mbarrier_wait(&full[at.x], unsigned(at.y) & 1);
    const uint4* page = reinterpret_cast<const uint4*>(ring + (size_t)at.x * kPageBytes);
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

// The ring's bytes alone: the block's pages as pb_persistent_ring lists them (q, k, v, then its
// 8 o_proj pages), page p in slot p % 8, warp w waiting on its slot and refilling it at once.
extern "C" __global__ void __launch_bounds__(256) pb_ring_stream(const bf16* wq, const bf16* wk,
    const bf16* wv, const bf16* wo) {
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ __align__(8) unsigned long long full[kSlots];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int u0 = blockIdx.x * kUnits / gridDim.x, nq = (blockIdx.x + 1) * kUnits / gridDim.x - u0;
  const int pages = nq + ROWS / kOPageRows;
  if (threadIdx.x == 0)
    for (int s = 0; s < kSlots; ++s)
      mbarrier_init(&full[s], 1);
  __syncthreads();
  if (lane == 0) {
    int uses = 0;
    for (int p = warp; p < pages; p += kSlots, ++uses) {
      if (uses > 0)
        mbarrier_wait(&full[warp], (uses - 1) & 1);
      issue_page(ring, full, p, u0, nq, wq, wk, wv, wo);
    }
    mbarrier_wait(&full[warp], (uses - 1) & 1);
  }
}

extern "C" __global__ void __launch_bounds__(256) pb_persistent_ring(const float* x,
    const bf16* ln, const bf16* wq, const bf16* bq, const bf16* wk, const bf16* bk,
    const bf16* wv, const bf16* bv, float* yq, float* yk, float* yv, const bf16* wo,
    const float* h, float* y2, unsigned* counter, unsigned epoch, int ahead,
    unsigned long long* stamps) {
  extern __shared__ __align__(128) unsigned char ring[];
  float* xs = reinterpret_cast<float*>(ring + kSlots * kPageBytes);
  __shared__ __align__(8) unsigned long long full[kSlots], empty[kSlots];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int u0 = blockIdx.x * kUnits / gridDim.x, nq = (blockIdx.x + 1) * kUnits / gridDim.x - u0;
  if (threadIdx.x == 0) {
    stamp(stamps, 0);
    for (int s = 0; s < kSlots; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], 1);
    }
  }
  __syncthreads();
  if (lane == 0 && warp < ahead)
    issue_page(ring, full, warp, u0, nq, wq, wk, wv, wo);
  linear_stage_x<KA, 1, true>(x, ln, kEps, xs, 1);
  // 1. q, k, v: warp w the pages of slot w.
  int uses = 0;
  for (int p = warp; p < nq; p += kSlots, ++uses) {
    mbarrier_wait(&full[warp], uses & 1);
    if (threadIdx.x == 0 && uses == 0)
      stamp(stamps, 1);
    float acc[kQkvPageRows];
    qkv_page_dot(ring, warp, xs, acc);
    __syncwarp();
    if (lane == 0) {
      // The page's reads before the copy that overwrites it (generic, then async proxy).
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      mbarrier_arrive(&empty[warp]); // page p read
      // q, k, v page p + ahead, into its slot once the slot's page before it has been read
      // (page p + ahead - 8 < p: its slot's phase cannot have moved on);
      const int a = p + ahead, before = a - kSlots;
      if (a < nq) {
        if (before >= 0)
          mbarrier_wait(&empty[before % kSlots], (before / kSlots) & 1);
        issue_page(ring, full, a, u0, nq, wq, wk, wv, wo);
      }
      // after the slot's last q, k, v page, its o_proj page at once.
      if (p + kSlots >= nq)
        issue_page(ring, full, p + kSlots, u0, nq, wq, wk, wv, wo);
      store_qkv_page(qkv_unit(u0 + p, wq, bq, wk, bk, wv, bv, yq, yk, yv), acc);
    }
  }
  // 2. The blocks meet: every q, k, v row stored.
  meet_stamped(counter, epoch, stamps);
  // 3. o_proj: page j is page nq + j of the stream, the slot's use after its q, k, v pages.
  oproj_from_ring(
      ring, full,
      [&](int j) {
        const int slot = (nq + j) % kSlots;
        return make_int2(slot, (nq - slot + kSlots - 1) / kSlots);
      },
      yq, h, y2);
  if (threadIdx.x == 0)
    stamp(stamps, 4);
}

// Form 5: the ring with q, k, v pages taken from a global counter (counter[1], from
// page_base: it grows by kUnits + 8 x blocks a launch, every warp's last take coming back past
// the end) rather than dealt, so that the blocks finish within a page of each other. Warp w
// refills its own slot with the next page it takes, or, once they are all taken, with o_proj
// page w (its 3 rows of the block's 24), which phase 3 reads after the meet.
extern "C" __global__ void __launch_bounds__(256) pb_persistent_dyn(const float* x,
    const bf16* ln, const bf16* wq, const bf16* bq, const bf16* wk, const bf16* bk,
    const bf16* wv, const bf16* bv, float* yq, float* yk, float* yv, const bf16* wo,
    const float* h, float* y2, unsigned* counter, unsigned epoch, unsigned page_base,
    unsigned long long* stamps) {
  extern __shared__ __align__(128) unsigned char ring[];
  float* xs = reinterpret_cast<float*>(ring + kSlots * kPageBytes);
  __shared__ __align__(8) unsigned long long full[kSlots];
  __shared__ int page_of[kSlots];    // the q, k, v unit in each slot
  __shared__ unsigned o_use[kSlots]; // the use of each slot that holds its o_proj page
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  // lane 0: takes the next unit and issues its page into slot `warp`, or, past the last, the
  // slot's o_proj page; true while q, k, v pages last.
  auto refill = [&]() {
    const unsigned u = atomicAdd(counter + 1, 1u) - page_base;
    if (u < unsigned(kUnits)) {
      page_of[warp] = int(u);
      copy_qkv_page(ring, full, warp,
                    qkv_unit(int(u), wq, bq, wk, bk, wv, bv, yq, yk, yv));
      return true;
    }
    copy_oproj_page(ring, full, warp, warp, wo);
    return false;
  };
  if (threadIdx.x == 0) {
    stamp(stamps, 0);
    for (int s = 0; s < kSlots; ++s)
      mbarrier_init(&full[s], 1);
  }
  __syncthreads();
  bool more = false;
  if (lane == 0)
    more = refill();
  more = __shfl_sync(0xffffffffu, more, 0);
  linear_stage_x<KA, 1, true>(x, ln, kEps, xs, 1);
  unsigned uses = 0;
  while (more) {
    mbarrier_wait(&full[warp], uses & 1);
    if (threadIdx.x == 0 && uses == 0)
      stamp(stamps, 1);
    const int u = *reinterpret_cast<volatile int*>(&page_of[warp]);
    float acc[kQkvPageRows];
    qkv_page_dot(ring, warp, xs, acc);
    __syncwarp();
    ++uses;
    if (lane == 0) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      more = refill();
      store_qkv_page(qkv_unit(u, wq, bq, wk, bk, wv, bv, yq, yk, yv), acc);
    }
    more = __shfl_sync(0xffffffffu, more, 0);
  }
  if (lane == 0)
    o_use[warp] = uses;
  meet_stamped(counter, epoch, stamps);
  oproj_from_ring(
      ring, full, [&](int j) { return make_int2(j, int(o_use[j])); }, yq, h, y2);
  if (threadIdx.x == 0)
    stamp(stamps, 4);
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
  auto counter = upload(std::vector<int32_t>{0, 0}); // the meets', pb_persistent_dyn's pages
  unsigned epoch = 0;
  cudaStream_t st = nullptr; // the launches' stream: a capturing one inside graph_us
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
      qkv.module.launch_raw(qkv.kernel, dim3(groups_a), dim3(256), smem_a, st, a_args, a_sizes, 11,
                            false);
    if (!(parts & 2))
      return;
    void* b_args[] = {&yq_, &wo_, &h_, &y2_};
    const size_t b_sizes[] = {8, 8, 8, 8};
    oproj.module.launch_raw(oproj.kernel, dim3(blocks_b), dim3(256), smem_b, st, b_args, b_sizes, 4,
                            pdl);
  };
  auto plain = [&](int i) { two(i, false); };
  auto pdl = [&](int i) { two(i, true); };
  auto fused = [&](int i) {
    const size_t s = size_t(i % kSets);
    ++epoch;
    persistent.module.launch(persistent.kernel, dim3(blocks_b), dim3(256), smem_b + smem_a, st,
                             dx->p, dln->p, wqs[s]->p, dbq->p, wks[s]->p, dbk->p, wvs[s]->p, dbv->p,
                             yq->p, yk->p, yv->p, wos[s]->p, dh->p, y2->p, counter->p, epoch);
  };
  // The bits: each variant once on set 0; q against a double reference; q, k, v and o_proj's
  // output across the variants.
  std::vector<std::vector<float>> outs;
  unsigned long long* stamps = nullptr;
  int ahead = 8;
  auto ringed = [&](int i) {
    const size_t s = size_t(i % kSets);
    ++epoch;
    ring.module.launch(ring.kernel, dim3(blocks_b), dim3(256), smem_ring, st, dx->p, dln->p,
                       wqs[s]->p, dbq->p, wks[s]->p, dbk->p, wvs[s]->p, dbv->p, yq->p, yk->p, yv->p,
                       wos[s]->p, dh->p, y2->p, counter->p, epoch, ahead, stamps);
  };
  const Loaded& dyn = kernel("pb_persistent_dyn");
  unsigned dyn_launches = 0; // pb_persistent_dyn's since counter[1] was zeroed
  auto dynamic = [&](int i) {
    const size_t s = size_t(i % kSets);
    ++epoch;
    const unsigned page_base = dyn_launches++ * unsigned((kNq + kNk + kNv) / 4 + 8 * blocks_b);
    dyn.module.launch(dyn.kernel, dim3(blocks_b), dim3(256), smem_ring, st, dx->p, dln->p,
                      wqs[s]->p, dbq->p, wks[s]->p, dbk->p, wvs[s]->p, dbv->p, yq->p, yk->p, yv->p,
                      wos[s]->p, dh->p, y2->p, counter->p, epoch, page_base, stamps);
  };
  constexpr int kAheads[] = {2, 3, 4, 8}; // the ring's pages in flight
  std::vector<std::function<void(int)>> variants = {plain, pdl, fused, dynamic};
  for (int k : kAheads)
    variants.push_back([&, k](int i) {
      ahead = k;
      ringed(i);
    });
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
  for (size_t v = 1; v < outs.size(); ++v)
    CHECK_MESSAGE(differing(outs[0], outs[v], n) == 0, "variant " << v);
  const double mb_a = double(kNq + kNk + kNv) * kKa * 2 / 1e6, mb_b = double(kNb) * kKb * 2 / 1e6,
               mb = mb_a + mb_b;
  auto gbs = [](double mbytes, double us) { return mbytes / us * 1e3; };
  // Launches of f(0..39) as one CUDA graph (as the plans replay a step), the counter zeroed
  // first and the epochs 1..40 inside: us a launch, the median of 5 replays.
  auto graph_us = [&](const std::function<void(int)>& f) {
    cudaStream_t cs;
    cuda_ok(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking), "stream");
    cuda_ok(cudaStreamBeginCapture(cs, cudaStreamCaptureModeRelaxed), "capture");
    st = cs;
    cuda_ok(cudaMemsetAsync(counter->p, 0, 8, cs), "counter");
    epoch = 0;
    dyn_launches = 0;
    for (int i = 0; i < 40; ++i)
      f(i);
    st = nullptr;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    cuda_ok(cudaStreamEndCapture(cs, &g), "capture");
    cuda_ok(cudaGraphInstantiate(&ge, g, 0), "instantiate");
    cudaEvent_t a, b;
    cuda_ok(cudaEventCreate(&a), "event");
    cuda_ok(cudaEventCreate(&b), "event");
    std::vector<float> per;
    for (int rep = 0; rep < 6; ++rep) {
      cudaEventRecord(a, cs);
      cuda_ok(cudaGraphLaunch(ge, cs), "graph");
      cudaEventRecord(b, cs);
      cuda_ok(cudaEventSynchronize(b), "timing");
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      if (rep > 0)
        per.push_back(ms * 1e3f / 40);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaStreamDestroy(cs);
    // launches outside the graph start again from zeroed counters
    cuda_ok(cudaMemset(counter->p, 0, 8), "counter");
    epoch = 0;
    dyn_launches = 0;
    std::sort(per.begin(), per.end());
    return double(per[per.size() / 2]);
  };
  auto timed = [&](const char* what, double mbytes, const std::function<void(int)>& f) {
    const double us = back_to_back_us(f), in_graph = graph_us(f);
    return std::string(what) + " " + std::to_string(us).substr(0, 5) + " us (" +
           std::to_string(int(gbs(mbytes, us))) + " GB/s; in a graph " +
           std::to_string(in_graph).substr(0, 5) + ")";
  };
  std::string report = timed("qkv_decode alone", mb_a, [&](int i) { two(i, false, 1); }) + ", " +
                       timed("o_proj alone", mb_b, [&](int i) { two(i, false, 2); }) + "; " +
                       timed("two kernels", mb, plain) + ", " + timed("with PDL", mb, pdl) + ", " +
                       timed("one persistent kernel", mb, fused);
  // The floors: the same 53 MB read (4 blocks an SM), and streamed through the ring alone.
  const Loaded& stream = kernel("pb_stream");
  const Loaded& ring_stream = kernel("pb_ring_stream");
  auto sink = std::make_unique<DevBuf>(size_t(dev.multiprocessors) * 4 * 8 * 4);
  report += "; the bytes alone: " +
            timed("read", mb,
                  [&](int i) {
                    const size_t s = size_t(i % kSets);
                    stream.module.launch(stream.kernel, dim3(dev.multiprocessors * 4), dim3(256), 0,
                                         st, wqs[s]->p, unsigned(wqs[s]->bytes / 16), wks[s]->p,
                                         unsigned(wks[s]->bytes / 16), wvs[s]->p,
                                         unsigned(wvs[s]->bytes / 16), wos[s]->p,
                                         unsigned(wos[s]->bytes / 16), sink->p);
                  }) +
            ", " + timed("through the ring", mb, [&](int i) {
              const size_t s = size_t(i % kSets);
              ring_stream.module.launch(ring_stream.kernel, dim3(blocks_b), dim3(256),
                                        size_t(kRingSlots) * kRingPage, st, wqs[s]->p, wks[s]->p,
                                        wvs[s]->p, wos[s]->p);
            });
  // The loader ring at each depth, and where its time goes: each block's stamps (start, its first
  // page landed, its q, k, v rows done, past the meet, end) in the 10th launch of a run, from the
  // earliest start: first / median / last block.
  auto stamp_buf = std::make_unique<DevBuf>(size_t(blocks_b) * 5 * 8);
  for (int k : {0, 2, 3, 4, 8}) { // 0: pb_persistent_dyn
    ahead = k;
    const std::function<void(int)> f = k ? std::function<void(int)>(ringed) : dynamic;
    report += (k ? "\nloader ring, " + std::to_string(k) + " pages in flight: "
                 : std::string("\nloader ring, pages taken from a counter: ")) +
              timed("", mb, f) + "; blocks (us, first / median / last):";
    stamps = static_cast<unsigned long long*>(stamp_buf->p);
    for (int i = 0; i < 10; ++i)
      f(i);
    device_sync();
    stamps = nullptr;
    std::vector<unsigned long long> st(size_t(blocks_b) * 5);
    cuda_ok(cudaMemcpy(st.data(), stamp_buf->p, st.size() * 8, cudaMemcpyDeviceToHost), "stamps");
    unsigned long long t0 = st[0];
    for (int b = 0; b < blocks_b; ++b)
      t0 = std::min(t0, st[size_t(b) * 5]);
    const char* const stage[] = {"start", "first page", "q, k, v done", "past the meet", "end"};
    for (int j = 0; j < 5; ++j) {
      std::vector<double> us;
      for (int b = 0; b < blocks_b; ++b)
        us.push_back(double(st[size_t(b) * 5 + size_t(j)] - t0) / 1e3);
      std::sort(us.begin(), us.end());
      report += std::string(j ? ";" : "") + " " + stage[j] + " " +
                std::to_string(us.front()).substr(0, 4) + " / " +
                std::to_string(us[us.size() / 2]).substr(0, 4) + " / " +
                std::to_string(us.back()).substr(0, 4);
    }
  }
  MESSAGE("qkv_decode (" << mb_a << " MB) then o_proj (linear_decode_smem, " << mb_b << " MB), "
                         << dev.multiprocessors << " SMs: " << report);
}
