// Emits the sm_90 warpgroup-MMA gemm (codegen/kernels/gemm_wg.cuh) and its activation kernel:
// weights on the MMA's M side, the step's tokens on its N side, BF16 or MXFP4 weights.
#pragma once

#include "codegen/emit.h"

#include <array>
#include <string>
#include <vector>

namespace xserv::codegen {

/// gemm_act: the bf16 activations of a gemm_wg launch from fp32 rows, in its K slot order, with
/// the rms norm applied when `norm` and a lo part when `split`. Parameters: x, ln, xh, xl (ln and
/// xl nullptr when unused);
/// grid.y = tokens * rows_per_token.
struct GemmActDims {
  int k = 0;
  bool norm = false;
  bool split = false;
  double eps = 1e-5;
  int rows_per_token = 1; ///< rows of x per step token (the MoE's down input: k per token)
  bool natural = false;   ///< K in its own order (a library gemm's input), not gemm_wg's slots
};
KernelSource emit_gemm_act(const GemmActDims& d, const std::vector<std::string>& ir_lines);

/// y = epilogue(W A^T) on warpgroup MMA, sm_90 only. A block is one warpgroup computing 64 * wm
/// weight rows (grid.x = ceil(n / (64 wm))) of one tile of up to `bn` tokens: dense, grid.y =
/// ceil(tokens / bn); grouped (MoE), moe_sort's tiles of up to `bn` sorted pairs, grid.y =
/// ceil(tokens * ksel / bn) + experts (those past the count exit). Epilogues, gather, split K
/// and MXFP4 weights as GemmDims; the activations are gemm_act's (bf16 hi, and lo with
/// `split`: two MMAs). Parameters: xh, xl, w, b, h, y, pair, tiles, route_w, tokens (unused
/// ones nullptr).
struct GemmWgDims {
  int k = 0, n = 0;
  int bn = 128;   ///< tokens per tile: a multiple of 8 up to 256 with a WgMma shape
  int wm = 2;     ///< m64 weight-row tiles per block: 1 or 2
  int stages = 4; ///< pipeline stages in flight
  int ksub = 1;   ///< K tiles of 64 per stage (one barrier each)
  /// Keep a stage's MMAs running while the next stage's fragments are built (loads then run
  /// stages - 2 ahead); needs 3+ stages.
  bool pipe = false;
  bool bias = true, residual = false;
  GemmEpilogue epilogue = GemmEpilogue::Store;
  bool grouped = false, gather = false;
  int experts = 1, ksel = 1;
  bool split = false;
  int splitk = 1;
  /// K in this many equal ranges within a block, each summed from zero and the sums added in
  /// order in registers: the K splits' sums without the partials (the canonical order of a
  /// dense linear above 64 rows, where splitk is 1, and of the experts' rows: moe_chain_splits).
  /// No PIPE.
  int chunks = 1;
  double limit = 7.0, alpha = 1.702;
  bool mxfp4 = false;
  /// MXFP4 weights whose scale bytes are all at most 128 (LoweringContext::mxfp4_small_scales):
  /// one multiply a pair instead of two, the same bits.
  bool small_scales = false;
  /// K in its natural order (BF16 weights only): a K step multiplies 16 consecutive K values, as
  /// a library gemm's chain does; the activations from gemm_act with GemmActDims::natural.
  bool natural = false;
  /// Blocks an SM the compiler must fit (__launch_bounds__'s second argument; 0: none), which
  /// caps the registers a thread at 65,536 / (128 min_blocks).
  int min_blocks = 0;
  /// Each K step's MMAs a batch of their own, waited for one step later: the next step's
  /// fragments are built while they run (the compiler otherwise builds a K tile's fragments
  /// before most of its MMAs issue), and the next stage's loads go out after the first step's
  /// MMAs. The same products in the same order: the same bits.
  bool steps = false;
};
KernelSource emit_gemm_wg(const GemmWgDims& d, const std::vector<std::string>& ir_lines);

/// The K splits of a dense gemm_wg of up to 64 rows (64 weight rows a block) on a GPU of `sms`
/// SMs: the smallest divisor of the K tiles, keeping at least 4 tiles a split, that gives 1.5
/// blocks per SM, else the largest such divisor; 1 when the weight rows alone fill the GPU.
/// Per matrix, never per step: the decode kernels in the canonical order take the same split
/// (LinearDims::mma_chain). Measured for 64 tokens: 20b qkv 25.7 -> 16.0 us with 3, o_proj
/// 32.7 -> 15.1 us with 8.
int wg_splitk(int k, int n, int sms = 132);

/// The K ranges of an expert matrix in the canonical order (the decode kernels' K splits, the
/// grouped gemms' chunks): one, a chain over all of K, so that the grouped gemms of a canonical
/// plan are the default plan's. The decode kernels keep their warps with more row groups a
/// block instead (moe_mma_tiling); 3 ranges of 15 tiles on the 20b bought them 1.8% (gate_up)
/// and 8-10% (down) but cost the prompt gemms their chunked form (docs/PERF.md, "MoE
/// decode kernels").
int moe_chain_splits(int k);

/// Dynamic shared memory of a gemm_wg launch (mirrors gemm_wg_smem_bytes in gemm_wg.cuh).
size_t gemm_wg_smem_bytes(const GemmWgDims& d);

/// Whether gemm_wg takes these sizes: k a multiple of 64, an even n (a multiple of 16 for the
/// SwiGLU epilogue), bn one of the WgMma shapes, the stages within the 227 KB of an SM.
bool gemm_wg_fits(const GemmWgDims& d);

/// The K value a gemm_wg K tile's slot `kappa` (0..63) holds (wg_k_of_slot in common.cuh).
constexpr int wg_k_of_slot(int kappa) {
  return 16 * ((kappa / 2) % 4) + 8 * (kappa / 32) + 2 * ((kappa / 16) % 2) + (kappa / 8) % 2 +
         4 * (kappa % 2);
}

/// A tiling of the warpgroup-MMA MoE gemms: tokens a tile (the MMA's N side), m64 weight tiles a
/// block (MXFP4 weights; BF16 ones take one below 128 tokens), stages, K tiles a stage and
/// whether a stage's MMAs stay in flight (GemmWgDims::ksub, pipe; the canonical order's chunks
/// take one K tile a stage where theirs do not divide, and no pipe).
struct WgMoeTiling {
  int bn, wm, stages;
  int ksub = 1;
  bool pipe = false;
  bool steps = false; ///< GemmWgDims::steps
};
/// The tilings the lowering picks from, smallest first (wg_moe_tiling picks by the pairs an
/// expert gets). The 32-token tile serves 13 to 24 pairs an expert: the 20b at 128 sequences
/// (16 pairs an expert) 15.86 -> 15.36 ms a step, where 16-token tiles give many experts two
/// tiles and so two reads of their weights (H200, old binary against new). 48- and 96-token
/// tiles, faster in kernels_bench's "MoE grouped gemm tiles" on uniform routing, were slower in
/// the model: B256 17.34 -> 18.33 ms, pp512 -2.6%. The 32-token tile takes 3 stages of two K tiles
/// (one barrier a pair): gate_up + act + down at 128 tokens 280-282 -> 255-262 us (kernels_bench
/// "MoE gemm pipelines", H100, two runs); other depths and the 64-token tile gained nothing.
/// The 16-, 64- and 128-token tiles issue each K step's MMAs as a batch of their own (steps;
/// `kernels_bench -tc="MoE gemm pipelines*" -sc=steps`, H100, two calls, gate_up + act + down
/// at 64 / 256 / 512 / 2,048 tokens): 267-270 / 281-285 / 405-414 / 1,131-1,142 -> 262-266 /
/// 278-283 / 394-400 / 1,047-1,071 us; the 32-token tile lost (251-262 -> 279-285). With
/// steps the 128-token tile takes 4 stages (two blocks an SM still fit): 512 / 2,048 tokens
/// 401-403 / 1,079-1,081 -> 383-384 / 1,052-1,061 us (`-sc="steps: stages"`, H100, three runs).
inline constexpr std::array<WgMoeTiling, 4> kWgMoeTilings = {{{16, 2, 4, 1, false, true},
                                                              {32, 2, 3, 2, false, false},
                                                              {64, 2, 4, 1, false, true},
                                                              {128, 2, 4, 1, false, true}}};

} // namespace xserv::codegen
