// Emits the CUDA source of one decode-path kernel: a template of codegen/kernels/*.cuh
// instantiated with an op's static dimensions, headed by the IR it implements.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/plan.h"

namespace xserv::codegen {

/// How a kernel is launched, as a rule over the step's token count (and key splits).
struct LaunchRule {
  int block = 256;           ///< threads per block (blockDim.x)
  int blocks_x = 1;          ///< grid.x, fixed by the static dimensions
  int y_per_token = 0;       ///< grid.y = tokens * y_per_token; 1 when 0
  bool z_splits = false;     ///< grid.z = key splits (attention_decode only)
  size_t smem_per_token = 0; ///< dynamic shared memory bytes per token of the step
  size_t smem_fixed = 0;     ///< dynamic shared memory bytes independent of the step
  int max_tokens = 0;        ///< the most tokens one launch takes; 0 = any
  /// Tiled rows: when > 0, grid.y = ceil(tokens * max(1, y_per_token) / y_tile) + y_extra.
  int y_tile = 0;
  int y_extra = 0;
  int blocks_z = 1;          ///< grid.z when not z_splits
  int min_blocks_per_sm = 0; ///< __launch_bounds__'s second argument when > 0
  /// > 1: blocks_x consecutive blocks form one thread-block cluster (XSERV_CLUSTER_X in the
  /// source, compiled into the kernel: the runtime launches it like any other).
  int cluster_x = 0;

  /// grid (x, y, z) for `tokens` tokens and `splits` key splits.
  std::array<unsigned, 3> grid(int tokens, int splits = 1) const;
  /// Dynamic shared memory bytes for `tokens` tokens.
  size_t smem(int tokens) const {
    return smem_fixed + smem_per_token * static_cast<size_t>(tokens);
  }
};

/// A generated kernel: its extern "C" name, the full CUDA source (which includes headers from
/// kernel_headers()), its parameter list in order, and its launch rule.
struct KernelSource {
  std::string name;
  std::string source;
  std::vector<std::string> params; ///< "const float* x", ... as declared
  LaunchRule launch;
};

/// linear / rms_norm_linear / linear_residual on few tokens (decode): y = (h +) W xn + b with
/// xn = norm ? rms_norm(x, ln, eps) : x. Kernel parameters: x, [ln], w, [b], [h], y, tokens.
struct LinearDims {
  int k = 0, n = 0;
  bool norm = false, bias = true, residual = false;
  double eps = 1e-5;
  int max_tokens = 8; ///< launches take at most this many tokens
  /// Each warp asks L2 for its weight rows before the prologue: off by default, it cost 10% of
  /// bandwidth on the H200 (docs/PERF.md).
  bool prefetch = false;
  /// Decode tuning: rows per warp (0: 2 when N is even, else 1), 16-byte loads in flight per
  /// lane and row (WarpGemv's UNROLL) and warps per row group, each over 1/ksplit of K (1, 2, 4
  /// or 8).
  int rows = 0, unroll = 4, ksplit = 1;
  /// Round the staged activations to bf16 (act_value in common.cuh): a plan with plain bf16
  /// gemm activations (compile --gemm-precision bf16) rounds them in its decode kernels too, so
  /// a token sees the same inputs alone and batched. Name suffix "_a16".
  bool round_act = false;
  /// linear_decode_mma (tensor cores; no norm, round_act, K % 64 == 0, linear_mma_fits): row
  /// groups of 16 a block (0: 2), K splits (0: 8) and the ring's chunks (0: 4; the 20b's o_proj:
  /// 9.3 us at 1 token, 11.6 at 8, against the FMA kernels' 9.5 and 32.9, docs/PERF.md).
  bool mma = false;
  int mma_groups = 0, mma_splits = 0, mma_stages = 0;
  /// With mma: the canonical order (linear_decode_mma's CHAIN): gemm_wg's K slots, one chain
  /// per K split, the splits added in order; mma_splits must divide K / 64 (the lowering gives
  /// the gemm's split, so that a token's outputs are the gemm's bits). Name suffix "_chain".
  bool mma_chain = false;
  /// With mma: K in its natural order (linear_decode_mma's NATURAL), each K split one chain from
  /// zero, the splits added in order; with mma_splits 1 a row's sum is a library gemm's chain
  /// over K (cuBLAS without split K). Not with mma_chain. Name suffix "_natural".
  bool mma_natural = false;
  /// linear_decode_smem (one token, no norm, sm_90): each block's rows copied whole into shared
  /// memory before the dependency wait, so the weights stream while the previous kernel runs
  /// (o_proj under attention_combine). Rows a block: linear_smem_rows.
  bool smem = false;
};
bool linear_mma_fits(const LinearDims& d);
/// Whether linear_decode_smem takes d in the canonical order (smem and mma_chain: bf16
/// activations, mma_splits 8 = its warps, K in whole 64-value tiles a warp).
bool linear_smem_chain_fits(const LinearDims& d);
/// linear_decode_smem's rows a block for d: the fewest, a multiple of 8 dividing N, that put
/// the grid on at most `sms` SMs with the rows in 200 KiB of shared memory; 0 when none does
/// or d is not a one-token linear without a norm.
int linear_smem_rows(const LinearDims& d, int sms = 132);

/// q, k and v projections of a decode step in one launch (qkv_decode): rms_norm(x) staged once,
/// each block's rows in one projection. Parameters: x, ln, wq, bq, wk, bk, wv, bv, yq, yk, yv,
/// tokens. Needs nq, nk, nv multiples of a block's rows, 8 rows / ksplit (16 by default;
/// qkv_decode_fits).
struct QkvDims {
  int k = 0, nq = 0, nk = 0, nv = 0;
  double eps = 1e-5;
  int max_tokens = 8;
  /// Decode tuning as LinearDims': rows per warp (0: 2; nq, nk, nv multiples of a block's
  /// 8 rows / ksplit), loads in flight per lane and row, K splits.
  int rows = 0, unroll = 4, ksplit = 1;
  bool round_act = false; ///< as LinearDims'
  /// head_dim > 0: a decode step's qkv with one token per sequence, RoPE and the KV cache
  /// writes in its epilogue (rope_yarn_qk_kv's work; kernels/linear.cuh qkv_rope_decode): extra
  /// parameters positions, token_seq, block_table, inv_freq, then k_cache and v_cache (paged in
  /// blocks of `block` positions, tables of `table` entries; fp32 or bf16). Two rows per warp
  /// and no K split only.
  int head_dim = 0, block = 0, table = 0;
  double attention_factor = 1.0;
  bool f32_cache = false;
  /// The canonical order (emit_qkv_rope_chain): q's K ranges and k's and v's (the lowering's
  /// wg_splitk of each matrix); 0 elsewhere. chain_natural: the natural K order, one chain
  /// over K (both 1): cuBLAS's sums without split K.
  int chain_q = 0, chain_kv = 0;
  bool chain_natural = false;
};
bool qkv_decode_fits(const QkvDims& d);
KernelSource emit_qkv_decode(const QkvDims& d, const std::vector<std::string>& ir_lines);

/// qkv_rope_decode in the canonical order (kernels/linear_chain.cuh qkv_rope_decode_chain):
/// the parameters of emit_qkv_decode with head_dim > 0. Needs chain_q and chain_kv dividing
/// K / 64, bf16 activations, nk == nv, projections of whole heads in whole blocks (16 rows a
/// group: whole heads, or pairs of one head for head_dim > 16).
bool qkv_chain_fits(const QkvDims& d);
KernelSource emit_qkv_rope_chain(const QkvDims& d, const std::vector<std::string>& ir_lines);

/// rope_yarn of q [T, hq, D] and k [T, hk, D] in place in one launch. Parameters: q, k,
/// positions, inv_freq; grid.y = tokens.
KernelSource emit_rope_yarn_qk(int hq, int hk, int head_dim, double attention_factor,
                               const std::vector<std::string>& ir_lines);
/// rope_yarn_qk that also writes the step's k (rotated) and v into the layer's paged KV caches
/// (blocks of `block` positions, tables of `table` entries), for steps with one token per
/// sequence (codegen/kernels/rope.cuh rope_yarn_qk_kv). Parameters: q, k, v, positions,
/// token_seq, block_table, inv_freq, k_cache, v_cache; grid.y = tokens.
KernelSource emit_rope_yarn_qk_kv(int hq, int hk, int head_dim, double attention_factor, int block,
                                  int table, bool f32_cache,
                                  const std::vector<std::string>& ir_lines);

/// attention with sinks, decode: split over keys, then attention_combine when splits > 1.
/// Kernel parameters: q, k, v, k_cache, v_cache, sinks, positions, token_seq, ctx_lens,
/// block_table, out, part_ml, part_o.
struct AttentionDims {
  int heads = 0, kv_heads = 0, head_dim = 0;
  int block = 0;  ///< positions per KV-cache block
  int table = 0;  ///< entries of a sequence's block table
  int window = 0; ///< 0: full causal attention
  double scale = 0;
  bool f32_cache = false; ///< fp32 KV cache instead of bf16
  /// Keys per chunk of the canonical attention order (attention_mma.cuh: the tensor-core
  /// kernels of every plan), a multiple of 64; name suffix "_c<chunk>".
  int chunk = 0;
  /// The canonical kernels take every operand as an fp16 pair hi + lo (the split, fp32-grade
  /// plans). Name suffix "_x3" (three products a pair of operands).
  bool split = false;
  /// Warps of a block of attention_decode_mma (0: attention_decode_mma_warps(head_dim), the
  /// lowering's); they split the output dims, each computing the block's scores. Name suffix
  /// "_wp<n>" when set.
  int decode_warps = 0;
};

/// moe_experts(_residual) on bf16 experts, as moe_gate_up then moe_down.
/// moe_gate_up parameters: x, ids, gate_up, gate_up_b, act ([T, k, inter] fp32 scratch).
/// moe_down parameters: act, weights, ids, down, down_b, [h], y.
/// The MoE decode kernels' default loads in flight per lane and row (MoeDims::unroll).
inline constexpr int kMoeUnroll = 2;
/// The lowering's ring depth for the tensor-core MoE decode kernels (MoeDims::mma_stages): two
/// chunks (one in flight while one is computed) measured 577 tok/s on tg128 against 558 with
/// four (docs/PERF.md, "Kernel figures").
inline constexpr int kMoeMmaStages = 2;

struct MoeDims {
  int hidden = 0, inter = 0, experts = 0, k = 0;
  bool residual = false;
  double limit = 7.0, alpha = 1.702;
  /// Decode tuning: rows per warp of moe_gate_up ((gate, up) pairs, 0: 2) and moe_down_part
  /// (0: 2), 16-byte loads in flight per lane and row (WarpGemv's UNROLL: two half batches),
  /// and gate_up's L2 prefetch (off: the engine's decode path took 69.0 us without, 76.8 us
  /// with it on the H200). UNROLL 2: 68.7 us against 71.4 us with 4 in the bandwidth case
  /// once WarpGemv double-buffered (docs/PERF.md, round 3).
  int rows = 0, unroll = kMoeUnroll;
  bool prefetch = false;
  /// > 0: __launch_bounds__' blocks per SM for moe_gate_up and moe_down_part (registers capped
  /// so that more blocks fit: gate_up's 720 blocks took 1.36 waves at 62 registers).
  int min_blocks = 0;
  /// The expert matrices are MXFP4 device tensors (codegen/kernels/mxfp4.cuh: blocks, then
  /// scales; parameter type const unsigned char*) decoded in registers: moe_gate_up_mx4 and
  /// moe_down_part_mx4, `unroll` 16-byte blocks (32 values) per row and lane in flight.
  /// hidden and inter must be multiples of 32.
  bool mxfp4 = false;
  bool round_act = false; ///< as LinearDims' (gate_up's x and down_part's SwiGLU output)
  /// moe_gate_up and moe_down_part on tensor cores (moe_gate_up_mx4_mma, moe_down_part_mx4_mma:
  /// MXFP4 and round_act only, moe_mma_fits) rather than the FMA kernels: mma.sync m16n8k16 per
  /// 16 rows and 32-value block. The tiling: 16-row groups per block (0: 4 for gate_up, 2 for
  /// down; chained over all of K 8 and 4), K splits per group (0: 2 for gate_up, 4 for down;
  /// chained moe_chain_splits) and blocks per chunk of loads in
  /// flight (0: 8, even); mma_stages > 1: the weights stream through a ring of that many
  /// chunks of 8 blocks in shared memory (cp.async, ldmatrix) rather than straight into
  /// registers a word at a time (0).
  bool mma = false;
  int mma_groups = 0, mma_splits = 0, mma_chunk = 0, mma_stages = 0;
  /// With mma: the canonical order (Mx4ChainRows), gemm_wg's K slots, exact bf16 dequantisation
  /// and one chain a K range (moe_chain_splits of each matrix's K: one; mma_splits, a
  /// benchmark's, sets others), the ranges added in order, so that a token's expert rows are the
  /// grouped gemms' bits; a shared ring (mma_stages >= 2).
  bool mma_chain = false;
  /// With mma (chained or not): the kernels of steps of 2 to 8 tokens with an expert a block and
  /// the step's tokens as the MMA's columns (moe_gate_up_mx4_cols, moe_down_part_mx4_cols:
  /// each expert's rows read once a step), the same bits as the per-pair kernels; moe_cols_fits.
  bool mma_cols = false;
};

/// Whether `d`'s decode kernels can run on tensor cores (MoeDims::mma): MXFP4 experts, bf16
/// activations, and hidden and intermediate sizes that the tiling's row groups divide.
bool moe_mma_fits(const MoeDims& d);
/// The same for one of the two kernels (gate_up or down).
bool moe_mma_kernel_fits(const MoeDims& d, bool gate_up);
/// Whether `d`'s tensor-core kernels (mma, chained or not) also come as MoeDims::mma_cols for steps
/// of up to 8 tokens: 8 tokens' (token, slot) pairs fit a warp (k <= 4), and the rings with 8
/// staged rows fit a block's shared memory.
bool moe_cols_fits(const MoeDims& d);

/// embedding: out[t] = table[ids[t]] widened to fp32. Parameters: table, ids, out; grid.y = tokens.
struct EmbeddingDims {
  int vocab = 0, dim = 0;
};

/// rope_yarn on [T, heads, head_dim] fp32, angles in float64. Parameters: x, positions, inv_freq
/// (float64 [head_dim / 2], ir::ref::yarn_inv_freq), y (may alias x); grid.y = tokens.
struct RopeDims {
  int heads = 0, head_dim = 0;
  double attention_factor = 1.0; ///< ir::ref::yarn_attention_factor
};

/// kv_write of [T, kv_heads, head_dim] fp32 into a paged bf16 (or fp32) cache [blocks, block,
/// kv_heads, head_dim] through block tables of `table` entries; with a window, a token no later
/// query sees is left out. Parameters: cache, x, positions, token_seq, block_table; grid.y =
/// tokens.
struct KvWriteDims {
  int kv_heads = 0, head_dim = 0, block = 0, table = 0, window = 0;
  bool f32_cache = false;
};

/// router_topk over [T, experts] fp32 logits. Parameters: logits, weights, ids; grid.y = tokens.
struct RouterTopKDims {
  int experts = 0, k = 0;
  bool round_act = false; ///< norm_router_topk: as LinearDims' (the router GEMV's input)
  /// > 0: norm_router_topk in the canonical order with this many K ranges (the router's
  /// wg_splitk; emit_norm_router_topk_chain); chain_natural: in the natural K order, one chain
  /// (chain 1).
  int chain = 0;
  bool chain_natural = false;
};

/// rms_norm of fp32 rows of `dim` values. Parameters: x, w, y (may alias x); grid.y = rows.
struct RmsNormDims {
  int dim = 0;
  double eps = 1e-5;
};

/// select_rows of fp32 rows of `width` values. Parameters: x, rows, out; grid.y = selected rows.
struct SelectRowsDims {
  int width = 0;
};

/// What a gemm's epilogue does (codegen/kernels/gemm.cuh GemmEpilogue).
enum class GemmEpilogue { Store = 0, Swiglu = 1, Scatter = 2 };

/// The tensor-core matrix multiply of the prefill path (many tokens): y = epilogue(A W^T), BM
/// rows x 128 columns per block, A's fp32 rows rounded to bf16 (or a hi + lo bf16 pair with
/// `split`) while staged. Dense: rows are the step's tokens, grid.y = ceil(tokens / bm).
/// Grouped (MoE): rows are moe_sort's expert-sorted (token, slot) pairs, W and b per expert,
/// grid.y = ceil(tokens * ksel / bm) + experts tiles (those past moe_sort's count exit).
/// Parameters: x, inv_rms, ln, w, b, h, y, pair, tiles, route_w, tokens (unused ones nullptr).
struct GemmDims {
  int k = 0, n = 0;
  int bm = 64; ///< rows per block: 32, 64 or 128
  bool norm = false, bias = true, residual = false;
  GemmEpilogue epilogue = GemmEpilogue::Store;
  bool grouped = false; ///< rows are expert-sorted pairs; W is [experts, n, k]
  bool gather = false;  ///< A row of sorted pair p is x[p / ksel] (else x[sorted row])
  int experts = 1, ksel = 1;
  bool split = true; ///< activations as bf16 hi + lo (two MMAs) instead of one bf16
  /// Dense stores: grid.z blocks each sum 1/splitk of K into a [splitk, tokens, n] scratch
  /// (parameter y), which gemm_splitk_reduce finishes.
  int splitk = 1;
  double limit = 7.0, alpha = 1.702;
  /// W is an MXFP4 device tensor of experts x n x k values (blocks, then scales; parameter type
  /// const unsigned char*), decoded into bf16 in shared memory tile by tile. k % 64 == 0.
  bool mxfp4 = false;
};

/// gemm_splitk_reduce: y = sum of the split-K partials (+ bias) (+ h). Parameters: part, b, h, y,
/// tokens (unused ones nullptr); grid.y = tokens.
KernelSource emit_gemm_splitk_reduce(int n, int splitk, bool bias, bool residual,
                                     const std::vector<std::string>& ir_lines);

/// The split-K factor for a dense gemm of few rows: the smallest divisor of K's 64-wide tiles
/// that gives about two blocks per SM of `sms`, keeping at least 4 K tiles per block; 1 when the
/// N tiles alone fill the GPU.
int gemm_splitk(int k, int n, int sms = 132);

/// moe_sort: the (token, slot) pairs of a step grouped by expert, and the tile list of a grouped
/// gemm with `bm` rows per tile. Parameters: ids, pair, tiles, tokens; one block.
struct MoeSortDims {
  int experts = 0, k = 0, bm = 64;
  int max_pairs = 0; ///< the most pairs (tokens * k) one launch takes
};

/// Ints of moe_sort's tile list for `pairs` pairs: the count and (expert, begin, end) per tile.
size_t moe_tiles_ints(int pairs, int experts, int bm);

/// Whether a gemm of reduction width k can be emitted (k a multiple of the 64-wide K tile).
inline bool gemm_fits(int k) {
  return k > 0 && k % 64 == 0;
}

KernelSource emit_gemm(const GemmDims& d, const std::vector<std::string>& ir_lines);
KernelSource emit_moe_sort(const MoeSortDims& d, const std::vector<std::string>& ir_lines);
/// moe_combine: y[t] = (h[t] +) the sum of the token's k scattered expert rows. Parameters:
/// part, [h], y; grid.y = tokens.
KernelSource emit_moe_combine(int hidden, int k, bool residual,
                              const std::vector<std::string>& ir_lines);
/// row_inv_rms: inv[r] = rsqrt(mean(x[r]^2) + eps) of fp32 rows of `dim`. Parameters: x, inv.
KernelSource emit_row_inv_rms(int dim, double eps, const std::vector<std::string>& ir_lines);

KernelSource emit_linear(const LinearDims& d, const std::vector<std::string>& ir_lines);
KernelSource emit_attention_decode(const AttentionDims& d,
                                   const std::vector<std::string>& ir_lines);
KernelSource emit_attention_combine(const AttentionDims& d,
                                    const std::vector<std::string>& ir_lines);
/// attention with sinks for steps of few tokens and decode steps, in the canonical order of the
/// tensor-core prompt kernel (attention_mma.cuh: attention_decode_mma): grid (kv_heads, tokens,
/// key splits = chunks or 1), 32 to 128 threads (attention_decode_mma_warps). Parameters as
/// emit_attention_decode's. Needs d.chunk, heads / kv_heads <= 16 and head_dim divisible by 16.
KernelSource emit_attention_decode_mma(const AttentionDims& d,
                                       const std::vector<std::string>& ir_lines);
/// Folds attention_decode_mma's chunk states in key order (attention_combine_chunks): grid
/// (heads, tokens), head_dim threads. Parameters: part_ml, part_o, sinks, splits, out.
KernelSource emit_attention_combine_chunks(const AttentionDims& d,
                                           const std::vector<std::string>& ir_lines);
KernelSource emit_moe_gate_up(const MoeDims& d, const std::vector<std::string>& ir_lines);
KernelSource emit_moe_down(const MoeDims& d, const std::vector<std::string>& ir_lines);
/// moe_down_part: each (token, slot) pair's weighted expert row into part [T * k, hidden], for
/// moe_combine. Parameters: act, weights, ids, down, down_b, part; grid.y = tokens * k.
KernelSource emit_moe_down_part(const MoeDims& d, const std::vector<std::string>& ir_lines);

KernelSource emit_embedding(const EmbeddingDims& d, const std::vector<std::string>& ir_lines);
KernelSource emit_rope_yarn(const RopeDims& d, const std::vector<std::string>& ir_lines);
KernelSource emit_kv_write(const KvWriteDims& d, const std::vector<std::string>& ir_lines);
KernelSource emit_router_topk(const RouterTopKDims& d, const std::vector<std::string>& ir_lines);
/// Blocks per token of norm_router_topk: up to 8 (the portable cluster size), each taking
/// whole pairs of the E experts.
int router_cluster_blocks(int experts);
/// Warps per pair of router rows in norm_router_topk (K splits): as many as the block's 8 warps
/// allow for its pairs, 1, 2, 4 or 8.
int router_ksplit(int experts);
/// Whether emit_norm_router_topk takes these sizes: an even expert count up to 256 (the
/// clustered kernel gathers one logit per thread), k <= experts, a dimension divisible by 8.
bool norm_router_topk_fits(int dim, const RouterTopKDims& d);
/// rms_norm + the router's linear + router_topk of a decode step in one launch (router.cuh
/// norm_router_topk), for an even expert count up to 256 and a dimension divisible by 8. On
/// sm_90 the results are bitwise those of rms_norm, linear_decode with ksplit =
/// router_ksplit(E) and router_topk. Parameters: x, ln, w, [b], xn, weights, ids; grid
/// (C, tokens): a cluster of C = router_cluster_blocks(E) blocks per token shares the rows.
KernelSource emit_norm_router_topk(int dim, const RouterTopKDims& d, double eps, bool bias,
                                   const std::vector<std::string>& ir_lines);
/// norm_router_topk in the canonical order (kernels/linear_chain.cuh norm_router_topk_chain:
/// rms_norm's xn, the logits as the gemm path sums them with d.chain K ranges, router_topk's
/// picks): experts a multiple of 8 up to 256, d.chain dividing dim / 64, bf16 activations.
/// Parameters as emit_norm_router_topk's; grid (C, tokens), C = the clusters' blocks.
bool norm_router_topk_chain_fits(int dim, const RouterTopKDims& d);
KernelSource emit_norm_router_topk_chain(int dim, const RouterTopKDims& d, double eps, bool bias,
                                         const std::vector<std::string>& ir_lines);
KernelSource emit_rms_norm(const RmsNormDims& d, const std::vector<std::string>& ir_lines);
KernelSource emit_select_rows(const SelectRowsDims& d, const std::vector<std::string>& ir_lines);

/// The sampling epilogue's greedy pick: argmax of each fp32 logits row of `vocab` values, ties
/// to the lowest id; a row holding a NaN or an infinity is marked (codegen/kernels/sample.cuh).
/// Parameters: logits, keys (argmax_chunks(vocab) uint64 per row: decode with argmax_of_keys);
/// grid.y = rows.
KernelSource emit_argmax(int vocab, const std::vector<std::string>& ir_lines);
/// Structured output's masked greedy pick (argmax_masked_rows): rewrites the argmax keys of the
/// rows a grammar constrains with the best id each one's mask allows. Parameters: logits, masks
/// (mask_words(vocab) uint32 per masked row), rows (int32: each masked row's logits row), keys;
/// grid.y = masked rows.
KernelSource emit_argmax_masked(int vocab, const std::vector<std::string>& ir_lines);
/// uint32 words of one token mask over `vocab` ids (bit t % 32 of word t / 32 allows id t).
inline constexpr int mask_words(int vocab) {
  return (vocab + 31) / 32;
}
/// Logits one argmax block reads, and the blocks (keys) per row.
inline constexpr int kArgmaxChunk = 8192;
inline constexpr int argmax_chunks(int vocab) {
  return (vocab + kArgmaxChunk - 1) / kArgmaxChunk;
}
/// The id a row's keys (argmax_chunks of them, from argmax_rows) pick: the runtime decodes
/// them (runtime/plan.h), the kernel's contract with it.
using runtime::argmax_of_keys;
using runtime::kArgmaxNonFinite;

/// Key splits for attention_decode when a token sees at most `max_keys` keys: about 64 keys per
/// split, at most 32 splits, and 1 (no combine kernel) for short contexts.
int attention_splits(int max_keys);

/// The kernel templates as in-memory headers, by include name ("xserv_kernels/linear.cuh").
const std::map<std::string, std::string>& kernel_headers();

} // namespace xserv::codegen
