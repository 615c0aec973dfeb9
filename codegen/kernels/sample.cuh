// Sampling epilogue of a step: the greedy token of each logits row, found on the device so a
// decode step copies back one 8-byte key per sequence instead of a vocabulary of floats.
#pragma once

#include "xserv_kernels/common.cuh"

namespace xserv_kernels {

/// Threads per block of argmax_rows.
constexpr int kArgmaxThreads = 256;

/// The 64-bit key argmax_rows maximises: the logit's bits mapped to an unsigned order (larger
/// float, larger key; -0 taken as +0) above the bitwise complement of its index, so equal logits
/// prefer the lower index. A NaN or an infinity gets the largest key of all, ~0 (no finite
/// logit maps to it): a row holding one has no greedy token, and the host says so. 0 means no
/// candidate.
__device__ __forceinline__ unsigned long long argmax_key(float x, int index) {
  if (!isfinite(x))
    return ~0ull;
  const unsigned int b = __float_as_uint(x == 0.0f ? 0.0f : x);
  const unsigned int ordered = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (static_cast<unsigned long long>(ordered) << 32) | static_cast<unsigned int>(~index);
}

/// The largest of the block's `best` keys (kArgmaxThreads threads), written to *out by thread 0.
__device__ __forceinline__ void block_best_key(unsigned long long best,
                                               unsigned long long* __restrict__ out) {
  __shared__ unsigned long long warp_best[kArgmaxThreads / kWarp];
#pragma unroll
  for (int off = kWarp / 2; off > 0; off /= 2)
    best = max(best, __shfl_xor_sync(0xffffffffu, best, off));
  if (threadIdx.x % kWarp == 0)
    warp_best[threadIdx.x / kWarp] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kArgmaxThreads / kWarp; ++w)
      best = max(best, warp_best[w]);
    *out = best;
  }
}

/// argmax over each row of logits fp32 [rows, V], by chunks of CHUNK logits so one sequence
/// still spreads over many SMs: block (c = blockIdx.x, r = blockIdx.y) writes the largest
/// argmax_key of chunk c of row r to keys[r * gridDim.x + c]. The host takes the largest key of
/// each row and reads the id as ~(key & 0xffffffff); no atomics, so the result is exact and
/// repeatable.
template <int V, int CHUNK>
__device__ __forceinline__ void argmax_rows(const float* __restrict__ logits,
                                            unsigned long long* __restrict__ keys) {
  static_assert(CHUNK % 4 == 0, "chunks start 16-byte aligned");
  const int r = blockIdx.y, begin = blockIdx.x * CHUNK;
  const int end = min(V, begin + CHUNK);
  const float* row = logits + (size_t)r * V;
  unsigned long long best = 0ull;
  if (V % 4 == 0) { // rows are 16-byte aligned: four logits per load
    for (int i = begin + 4 * threadIdx.x; i < end; i += 4 * kArgmaxThreads) {
      const float4 x = *reinterpret_cast<const float4*>(row + i);
      best = max(best, argmax_key(x.x, i));
      best = max(best, argmax_key(x.y, i + 1));
      best = max(best, argmax_key(x.z, i + 2));
      best = max(best, argmax_key(x.w, i + 3));
    }
  } else {
    for (int i = begin + threadIdx.x; i < end; i += kArgmaxThreads)
      best = max(best, argmax_key(row[i], i));
  }
  block_best_key(best, keys + (size_t)r * gridDim.x + blockIdx.x);
}

/// Structured output's masked greedy pick, launched after a step for the rows whose next token a
/// grammar constrains: block (c = blockIdx.x, i = blockIdx.y) rewrites chunk c's key of logits
/// row rows[i] (keys as argmax_rows writes them) with the largest argmax_key among the ids that
/// mask i (masks + i * ceil(V / 32) words: bit t % 32 of word t / 32 allows id t) allows. A
/// chunk with nothing allowed gets 0 (no candidate; the host finds the picked id's bit clear);
/// a NaN or an infinity anywhere in the chunk, allowed or not, still gets ~0, so a broken row
/// ends its request as the unmasked pick would.
template <int V, int CHUNK>
__device__ __forceinline__ void argmax_masked_rows(const float* __restrict__ logits,
                                                   const unsigned int* __restrict__ masks,
                                                   const int* __restrict__ rows,
                                                   unsigned long long* __restrict__ keys) {
  constexpr int kWords = (V + 31) / 32;
  const int r = rows[blockIdx.y], begin = blockIdx.x * CHUNK;
  const int end = min(V, begin + CHUNK);
  const float* row = logits + (size_t)r * V;
  const unsigned int* mask = masks + (size_t)blockIdx.y * kWords;
  unsigned long long best = 0ull;
  // Coalesced over the logits; a warp's 32 consecutive ids share one mask word (a broadcast).
  for (int i = begin + threadIdx.x; i < end; i += kArgmaxThreads) {
    const float x = row[i];
    const bool allowed = (mask[i >> 5] >> (i & 31)) & 1u;
    if (allowed || !isfinite(x))
      best = max(best, argmax_key(x, i));
  }
  block_best_key(best, keys + (size_t)r * gridDim.x + blockIdx.x);
}

} // namespace xserv_kernels
