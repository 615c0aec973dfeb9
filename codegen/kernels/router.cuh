// Router top-k with the softmax over the k selected logits (MoE routing of one token).
#pragma once

#include "xserv_kernels/common.cuh"

namespace xserv_kernels {

/// router_topk(logits) {k = KSEL} for token t = blockIdx.y, computed by thread 0 (E is small):
/// the KSEL largest of logits[t, 0..E) in descending order, ties to the lower index, into
/// ids[t, :], and weights[t, j] = exp(l_j - l_0) / sum_i exp(l_i - l_0) over the selected.
/// logits fp32 [T, E]; weights fp32 [T, KSEL]; ids int [T, KSEL].
template <int E, int KSEL>
__device__ __forceinline__ void router_topk(const float* __restrict__ logits,
                                            float* __restrict__ weights, int* __restrict__ ids) {
  static_assert(KSEL <= E, "cannot select more experts than exist");
  if (threadIdx.x != 0)
    return;
  const int t = blockIdx.y;
  const float* r = logits + (size_t)t * E;
  int pick[KSEL];
  float val[KSEL];
  for (int j = 0; j < KSEL; ++j) {
    int best = -1;
    float bv = 0.0f;
    for (int e = 0; e < E; ++e) {
      bool taken = false;
      for (int i = 0; i < j; ++i)
        taken = taken || pick[i] == e;
      if (!taken && (best < 0 || r[e] > bv)) { // strict: an equal later value loses
        best = e;
        bv = r[e];
      }
    }
    pick[j] = best;
    val[j] = bv;
  }
  float sum = 0.0f;
  for (int j = 0; j < KSEL; ++j)
    sum += expf(val[j] - val[0]);
  for (int j = 0; j < KSEL; ++j) {
    ids[t * KSEL + j] = pick[j];
    weights[t * KSEL + j] = expf(val[j] - val[0]) / sum;
  }
}

} // namespace xserv_kernels
