// Shared device helpers of the generated kernels: bf16 unpacking, warp reductions, GEMV rows.
#pragma once

#include <cuda_bf16.h>

// XSERV_TIMELINE (a diagnostic plan: compile --timeline puts the define into every kernel): the
// launch stamps that grid_dependency_sync() leaves in the kernel's module. xserv_timeline[0] is
// the %gridid of the module's latest launch, [1] how many launches it has stamped, then 1024
// (launch, ns) slots taken in turn: each launch's %gridid and the %globaltimer of the first of
// its blocks past the dependency wait. The runtime reads them back (runtime/timeline.h).
#if defined(XSERV_TIMELINE)
extern "C" {
__device__ unsigned long long xserv_timeline[2 + 2 * 1024];
}
#endif

namespace xserv_kernels {

constexpr int kWarp = 32;

/// Stamps this launch into xserv_timeline once: its first block to get here claims the next
/// slot (a module's launches run one after another: each waits for the kernels before it).
__device__ __forceinline__ void timeline_stamp() {
#if defined(XSERV_TIMELINE) && defined(__CUDA_ARCH__)
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    unsigned long long ns, id;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    asm volatile("mov.u64 %0, %%gridid;" : "=l"(id));
    if (atomicExch(&xserv_timeline[0], id) != id) {
      const unsigned long long n = atomicAdd(&xserv_timeline[1], 1ull);
      unsigned long long* slot = xserv_timeline + 2 + 2 * (n % 1024);
      slot[0] = id;
      slot[1] = ns;
    }
  }
#endif
}

/// First statement of every generated kernel. Under programmatic dependent launch (sm_90+) a
/// grid may be scheduled while the stream's previous kernel is still running: wait until that
/// kernel has completed and its writes are visible, then allow the next kernel's blocks to be
/// scheduled as this grid's last blocks run. Without the launch attribute both are no-ops.
__device__ __forceinline__ void grid_dependency_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  timeline_stamp();
}

/// grid_dependency_sync as a callable: the wait of a kernel body that takes one
/// (linear_decode_smem), so that a kernel composing it with other work can wait for something else
/// at the same point.
struct GridDependencyWait {
  __device__ __forceinline__ void operator()() const { grid_dependency_sync(); }
};

/// Thread-block clusters (sm_90+): XSERV_CLUSTER_X(n) on a kernel groups n consecutive blocks
/// of grid.x into one cluster, whose blocks read each other's shared memory; it expands to
/// nothing below sm_90, where kernels written for clusters take their one-block path.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define XSERV_HAS_CLUSTERS 1
#define XSERV_CLUSTER_X(n) __cluster_dims__(n, 1, 1)
#else
#define XSERV_HAS_CLUSTERS 0
#define XSERV_CLUSTER_X(n)
#endif

/// A __shared__ pointer as the 32-bit shared-window address PTX takes.
__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

/// cp.async of 16 bytes from global to shared memory (sm_80+), zero-filled when !valid; groups
/// committed and waited for as PTX's cp.async.commit_group / wait_group N.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
/// cp.async of 4 bytes (cached in L1 on the way), zero-filled when !valid.
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 4 : 0));
}

/// The K value (0..63) that slot `kappa` of a 64-wide K tile holds: slot 16 s + 8 h + 2 c + e
/// (K step s of the MMA, fragment half h, thread c of its quad, element e of a bf16 pair) holds
/// 16 c + 8 (s / 2) + 2 (s % 2) + h + 4 e: thread c's 16 values are K 16 c .. 16 c + 15, and
/// each bf16 pair is (v, v + 4) as mx4_pair_raw decodes it from a 32-bit word.
__host__ __device__ constexpr int wg_k_of_slot(int kappa) {
  return 16 * ((kappa / 2) % 4) + 8 * (kappa / 32) + 2 * ((kappa / 16) % 2) + (kappa / 8) % 2 +
         4 * (kappa % 2);
}

/// The A-fragment pair i (= 2 s + h: K step s, fragment half h) of a row whose 16 bf16 values
/// of a K tile (K 16 c .. 16 c + 15, wg_k_of_slot's) are the 8 words r: values (v, v + 4),
/// v = 8 (i / 4) + i % 4.
__device__ __forceinline__ unsigned wg_bf16_pair(const unsigned (&r)[8], int i) {
  const int k = i % 4;
  return __byte_perm(r[4 * (i / 4) + k / 2], r[4 * (i / 4) + k / 2 + 2], (k % 2) ? 0x7632 : 0x5410);
}

/// Four words from a 16-byte aligned shared-window address.
__device__ __forceinline__ void lds128(unsigned* r, unsigned addr) {
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// d += a b on mma.sync m16n8k16: bf16 operands (a row-major, b column-major), fp32 sums.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                         unsigned b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

/// Two fp32 values as a packed bf16 pair (round to nearest even), `lo` in the low half.
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&v);
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;");
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

/// mbarrier in shared memory (sm_90): initialised by one thread for `count` arrivals; the other
/// threads may wait on it only after a barrier that follows the init.
__device__ __forceinline__ void mbarrier_init(unsigned long long* bar, unsigned count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count)
               : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

/// One arrival on bar expecting `bytes`, then the bulk copy (the TMA engine, sm_90) of `bytes`
/// (a multiple of 16, both ends 16-byte aligned) from global src to shared dst, whose landing
/// completes them.
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, unsigned bytes,
                                              unsigned long long* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
               "[%3];" ::"r"(smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
#endif
}

/// Waits until bar's phase `parity` has completed (its copies have landed).
__device__ __forceinline__ void mbarrier_wait(unsigned long long* bar, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned done = 0;
  do {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n "
                 "selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done)
                 : "r"(smem_u32(bar)), "r"(parity)
                 : "memory");
  } while (!done);
#endif
}

/// Four 8x8 16-bit matrices from shared memory, lane l giving row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

/// The same, each matrix transposed.
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

/// A warp's ring of STAGES chunks in shared memory, each 16 rows x 8 slots of 16 bytes (2 KB),
/// filled by cp.async and read by ldmatrix.x4: the tensor-core decode GEMVs stream their weight
/// rows through it. Lane l copies slot l % 8 of rows l / 8 + 4 j (j < 4) of a chunk; slot s of
/// row m lies at position s ^ (m % 8), so that the 8 rows one ldmatrix matrix reads hit distinct
/// banks. load_pair hands thread (g = lane / 4, c = lane % 4) word c of rows g and g + 8 of two
/// slots, the A registers of mma.sync m16n8k16 when the 16 rows are its rows.
struct WarpRowRing {
  static constexpr int kChunkBytes = 16 * 8 * 16;
  unsigned dst0 = 0, dst1 = 0; // this lane's copy slots in chunk 0 (rows l / 8 and l / 8 + 4)
  unsigned row_addr = 0;       // this lane's ldmatrix row in chunk 0
  int x0 = 0;                  // ... and its slot swizzle

  /// `ring`: the warp's STAGES * kChunkBytes bytes (16-byte aligned).
  __device__ __forceinline__ void init(void* ring) {
    const int lane = threadIdx.x % kWarp, m0 = lane / 8, jb = lane % 8;
    const unsigned base = smem_u32(ring);
    dst0 = base + (m0 * 8 + (jb ^ m0)) * 16; // rows m0 + 8, m0 + 12 share these swizzles
    dst1 = base + ((m0 + 4) * 8 + (jb ^ (m0 + 4))) * 16;
    // ldmatrix: lanes 0-7 give rows 0-7 of slot i, 8-15 rows 8-15, 16-31 the same of slot
    // i + 1; with i even the position of (m, i + lane / 16) is i ^ x0.
    const int m = (lane % 8) + 8 * ((lane / 8) % 2);
    row_addr = base + m * 8 * 16;
    x0 = (lane / 16) ^ (lane % 8);
  }

  /// This lane's slot of row l / 8 + 4 j of chunk `buf` from src[j] (16 bytes, or zeros when
  /// bytes is 0; src must still be a valid address).
  __device__ __forceinline__ void copy(int buf, const void* const (&src)[4], unsigned bytes) const {
    const unsigned each[4] = {bytes, bytes, bytes, bytes};
    copy(buf, src, each);
  }
  /// ... with each row's own byte count (16 or 0).
  __device__ __forceinline__ void copy(int buf, const void* const (&src)[4],
                                       const unsigned (&bytes)[4]) const {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const unsigned dst = (j % 2 ? dst1 : dst0) + buf * kChunkBytes + (j / 2) * 8 * 8 * 16;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src[j]),
                   "r"(bytes[j]));
    }
  }

  /// Word c of rows g, g + 8 of slot i (even) of chunk `buf`, then of slot i + 1.
  __device__ __forceinline__ void load_pair(int buf, int i, unsigned (&q)[4]) const {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(q[0]), "=r"(q[1]), "=r"(q[2]), "=r"(q[3])
                 : "r"(row_addr + buf * kChunkBytes + ((i ^ x0) * 16)));
  }
};

#if XSERV_HAS_CLUSTERS
/// Every thread of every block of the cluster arrives; shared-memory writes before it are
/// visible to the cluster's blocks after it.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\t"
               "barrier.cluster.wait.acquire.aligned;" ::
                   : "memory");
}

/// The first half of a cluster barrier, ordering nothing: with cluster_wait later (every thread
/// of every block), it proves that the cluster's blocks have all started, so their shared
/// memory may be written (cluster_store), at no cost once the blocks have run a while.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}

/// Stores v at `local` (a __shared__ address of this block) in the shared memory of the
/// cluster's block `rank` instead; visible to that block after a cluster_sync.
__device__ __forceinline__ void cluster_store(float* local, unsigned rank, float v) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(local));
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
  asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(remote), "f"(v) : "memory");
}
#endif

/// -infinity as a float (NVRTC has no <math.h> INFINITY).
/// The slot of position j in a paged KV cache ([blocks, BS, G, D], a slot = G * D values): slot
/// j % BS of block `table`[j / BS], `table` the sequence's row of its block table.
template <int BS> __device__ __forceinline__ int kv_slot(const int* __restrict__ table, int j) {
  static_assert(BS > 0 && (BS & (BS - 1)) == 0, "the block size is a power of two");
  return table[j / BS] * BS + j % BS;
}

/// The rotary factors of position p at inverse frequency f: c = cos(p f) att, s = sin(p f) att,
/// in float64 with every operation rounded as written (no contraction), as the host reference
/// computes them. Every kernel that rotates calls it, so that a pair rotated in a decode GEMV's
/// epilogue and in a rope kernel gets the same bits.
__device__ __forceinline__ void rope_cos_sin(int p, double f, double att, double& c, double& s) {
  double s0, c0;
  sincos(__dmul_rn(double(p), f), &s0, &c0);
  c = __dmul_rn(c0, att);
  s = __dmul_rn(s0, att);
}

/// The rotate-half pair (x1, x2) -> (x1 c - x2 s, x2 c + x1 s), in float64, uncontracted.
__device__ __forceinline__ void rope_rotate(float x1, float x2, double c, double s, float& y1,
                                            float& y2) {
  const double d1 = x1, d2 = x2;
  y1 = float(__dsub_rn(__dmul_rn(d1, c), __dmul_rn(d2, s)));
  y2 = float(__dadd_rn(__dmul_rn(d2, c), __dmul_rn(d1, s)));
}

__device__ __forceinline__ float neg_inf() {
  return -__int_as_float(0x7f800000);
}

/// An activation as a matmul reads it: with ROUND (a plan whose gemms take plain bf16
/// activations, compile --gemm-precision bf16) rounded to bf16 like gemm_act's, so that a token
/// gets the same inputs in a decode GEMV as in a prompt's gemm; else the fp32 value.
template <bool ROUND> __device__ __forceinline__ float act_value(float v) {
  return ROUND ? __bfloat162float(__float2bfloat16_rn(v)) : v;
}

/// The sum of squares of a float4, as linear_stage_x and gemm_act both accumulate it: one
/// expression in one place, so that the two compute a row's rms norm bit for bit alike.
__device__ __forceinline__ float sum_sq4(float4 v) {
  return v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
}

/// Sum of `v` over the 32 lanes of a warp; every lane gets the result.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = kWarp / 2; off > 0; off /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

/// 1 / rms of the D fp32 values at xr with eps, computed by the whole block of THREADS threads
/// (sum of squares in fp32) and returned to every thread. Ends with a barrier. ONCE (a kernel
/// that calls it once): every thread adds the warps' partial sums itself, in the same order,
/// rather than thread 0 for all behind a second barrier; the result is the same bit for bit.
template <int D, int THREADS, bool ONCE = false>
__device__ __forceinline__ float block_inv_rms(const float* xr, float eps) {
  __shared__ float partial[THREADS / kWarp];
  __shared__ float inv;
  const int tid = threadIdx.x;
  float ss = 0.0f;
  for (int i = tid; i < D; i += THREADS)
    ss = fmaf(xr[i], xr[i], ss);
  ss = warp_sum(ss);
  if (tid % kWarp == 0)
    partial[tid / kWarp] = ss;
  __syncthreads();
  if (ONCE || tid == 0) {
    float total = 0.0f;
    for (int i = 0; i < THREADS / kWarp; ++i)
      total += partial[i];
    if (ONCE)
      return rsqrtf(total / D + eps);
    inv = rsqrtf(total / D + eps);
  }
  __syncthreads();
  return inv;
}

/// The 8 bf16 values packed in a 16-byte word, widened to fp32.
__device__ __forceinline__ void unpack_bf16x8(const uint4& u, float (&out)[8]) {
  const unsigned int words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(words[i] << 16);
    out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

/// a plus the products of a 16-byte word's 8 bf16 values with x[0..7], one fmaf after another
/// in order: the decode GEMVs' multiply of a weight word.
__device__ __forceinline__ float fma_bf16x8(const uint4& w, const float (&x)[8], float a) {
  float wf[8];
  unpack_bf16x8(w, wf);
#pragma unroll
  for (int e = 0; e < 8; ++e)
    a = fmaf(wf[e], x[e], a);
  return a;
}
/// The same with x as two float4s: x[0..3] in xa, x[4..7] in xb.
__device__ __forceinline__ float fma_bf16x8(const uint4& w, const float4& xa, const float4& xb,
                                            float a) {
  const float x[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
  return fma_bf16x8(w, x, a);
}

/// Eight consecutive KV-cache values as fp32, from a bf16 or an fp32 cache (16-byte aligned).
__device__ __forceinline__ void load_cache8(const __nv_bfloat16* p, float (&out)[8]) {
  unpack_bf16x8(*reinterpret_cast<const uint4*>(p), out);
}
__device__ __forceinline__ void load_cache8(const float* p, float (&out)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
  out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
  out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
}

/// Stores one fp32 value into a bf16 (rounded to nearest even) or an fp32 KV cache.
__device__ __forceinline__ void store_cache(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16_rn(v);
}
__device__ __forceinline__ void store_cache(float* p, float v) {
  *p = v;
}

/// A bf16 value as fp32.
__device__ __forceinline__ float bf16_to_float(const __nv_bfloat16& v) {
  return __bfloat162float(v);
}

/// Asks L2 for the whole 128-byte lines that hold a byte of [p, p + bytes), line i by the
/// thread with i % stride == index, without waiting; never a line past the last byte.
__device__ __forceinline__ void prefetch_lines_l2(const void* p, size_t bytes, int index,
                                                  int stride) {
  const size_t first = reinterpret_cast<size_t>(p) & ~size_t(127);
  const size_t last = (reinterpret_cast<size_t>(p) + bytes - 1) & ~size_t(127);
  const int lines = int((last - first) / 128) + 1;
  for (int i = index; i < lines; i += stride)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(first + size_t(i) * 128));
}

/// prefetch_lines_l2 spread over a warp's lanes.
__device__ __forceinline__ void warp_prefetch_l2(const void* p, size_t bytes) {
  prefetch_lines_l2(p, bytes, threadIdx.x % kWarp, kWarp);
}

/// prefetch_lines_l2 over the block, a line a thread: a kernel's small weight vectors (a norm's
/// gains) before its dependency wait, so that the prologue after it finds them in L2 rather
/// than DRAM.
__device__ __forceinline__ void block_prefetch_l2(const void* p, size_t bytes) {
  prefetch_lines_l2(p, bytes, threadIdx.x, blockDim.x);
}

/// Asks L2 for a warp's R consecutive weight rows (bf16 [R, K]) without waiting: issued before
/// a kernel's prologue so the weight stream starts while the prologue runs.
template <int K, int R>
__device__ __forceinline__ void warp_prefetch_rows_l2(const __nv_bfloat16* w) {
  warp_prefetch_l2(w, size_t(R) * K * 2);
}

/// One warp's dot products of R consecutive weight rows (bf16 [R, K], row stride K) with `tokens`
/// fp32 vectors of length K in shared memory (token stride K): acc[r][t] gets the full sum on
/// every lane. Weights stream through 16-byte loads, UNROLL per row and lane in flight as two
/// half batches: the next half is loaded while the current one is multiplied. start()
/// issues the first batch, so a kernel calls it before its prologue (staging x, a norm) and the
/// weight stream overlaps it; finish() does the rest. Every lane sums in the same order as a
/// plain loop over the chunks, so the result does not depend on the pipelining.
/// With KS > 1 the warp takes part `part` of KS equal ranges of K only (split-K: KS warps share
/// the rows and their partial sums are added by the caller); KS = 1 is the whole row.
/// Row r of the warp is row0 + r * APART (1: R consecutive rows).
template <int K, int R, int MAX_T, int UNROLL = 4, int KS = 1, int APART = 1> struct WarpGemv {
  static_assert(K % 8 == 0, "rows must be whole 16-byte words");
  static constexpr int kChunks = K / 8;                     // 16-byte words per row
  static constexpr int kPart = (kChunks + KS - 1) / KS;     // 16-byte words per part
  static constexpr int kHalf = UNROLL > 1 ? UNROLL / 2 : 1; // loads per row and lane per batch
  static constexpr int kBatch = kWarp * kHalf;
  static constexpr int kBatches = (kPart + kBatch - 1) / kBatch;

  const uint4* w4 = nullptr;
  int c0 = 0, n = kChunks; // this part's first word and word count
  uint4 raw[kHalf][R];

  __device__ __forceinline__ void load(int base) {
    const int lane = threadIdx.x % kWarp;
#pragma unroll
    for (int u = 0; u < kHalf; ++u) {
      const int c = base + u * kWarp + lane;
#pragma unroll
      for (int r = 0; r < R; ++r)
        raw[u][r] = c < n ? __ldg(&w4[r * APART * kChunks + c0 + c]) : make_uint4(0, 0, 0, 0);
    }
  }

  /// Issues the loads of the first batch of the rows at w (of K part `part`).
  __device__ __forceinline__ void start(const __nv_bfloat16* __restrict__ w, int part = 0) {
    w4 = reinterpret_cast<const uint4*>(w);
    if (KS > 1) {
      c0 = part * kPart;
      n = c0 < kChunks ? (kChunks - c0 < kPart ? kChunks - c0 : kPart) : 0;
    }
    load(0);
  }

  /// The dot products (after start()).
  __device__ __forceinline__ void finish(const float* __restrict__ xs, int tokens,
                                         float (&acc)[R][MAX_T]) {
    const int lane = threadIdx.x % kWarp;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < MAX_T; ++t)
        acc[r][t] = 0.0f;
#pragma unroll 1
    for (int b = 0; b < kBatches; ++b) {
      uint4 cur[kHalf][R];
#pragma unroll
      for (int u = 0; u < kHalf; ++u)
#pragma unroll
        for (int r = 0; r < R; ++r)
          cur[u][r] = raw[u][r];
      if (b + 1 < kBatches)
        load((b + 1) * kBatch); // in flight while this batch is multiplied
#pragma unroll
      for (int u = 0; u < kHalf; ++u) {
        const int c = b * kBatch + u * kWarp + lane;
        if (c >= n)
          break;
#pragma unroll
        for (int t = 0; t < MAX_T; ++t) {
          if (t >= tokens)
            break;
          const float4 xa = reinterpret_cast<const float4*>(xs + t * K)[2 * (c0 + c)];
          const float4 xb = reinterpret_cast<const float4*>(xs + t * K)[2 * (c0 + c) + 1];
#pragma unroll
          for (int r = 0; r < R; ++r)
            acc[r][t] = fma_bf16x8(cur[u][r], xa, xb, acc[r][t]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < MAX_T; ++t)
        acc[r][t] = warp_sum(acc[r][t]);
  }
};

/// WarpGemv's start() and finish() back to back (no prologue to overlap).
template <int K, int R, int MAX_T, int UNROLL = 4>
__device__ __forceinline__ void warp_gemv_rows(const __nv_bfloat16* __restrict__ w,
                                               const float* __restrict__ xs, int tokens,
                                               float (&acc)[R][MAX_T]) {
  WarpGemv<K, R, MAX_T, UNROLL> g;
  g.start(w);
  g.finish(xs, tokens, acc);
}

} // namespace xserv_kernels
