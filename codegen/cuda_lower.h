// Lowering a fused gpt-oss graph to a launch table (runtime/plan.h) of generated CUDA kernels.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "codegen/emit.h"
#include "compiler/memory_plan.h"
#include "ir/graph.h"
#include "runtime/plan.h"

namespace xserv::codegen {

/// Tokens one step (the activation arena) holds: the prefill chunk, at least max_batch and 8.
int step_token_capacity(int64_t max_batch, int prefill_chunk);

/// The generated kernels of a lowering, each once by name. Kernel `i` is entry `i` of the launch
/// table's kernels; compiling them is the runtime's (NVRTC, runtime/kernel_cache.h).
class KernelSet {
public:
  /// Adds `src` unless a kernel of that name is already there; returns its index.
  int add(codegen::KernelSource src);
  size_t size() const { return sources_.size(); }
  /// How many lowered nodes asked for kernel `i`.
  int uses(int i) const { return uses_.at(static_cast<size_t>(i)); }
  const codegen::KernelSource& source(int i) const { return sources_.at(static_cast<size_t>(i)); }
  /// The launch table's entry for every kernel: name and launch rule.
  std::vector<runtime::PlanKernel> plan_kernels() const;
  /// Text put into every kernel's source from now on, after its header comments
  /// (StageOptions::timeline's define).
  void set_prelude(std::string text) { prelude_ = std::move(text); }

private:
  std::string prelude_;
  std::vector<codegen::KernelSource> sources_;
  std::map<std::string, int> by_name_;
  std::vector<int> uses_;
};

/// MoE decode steps of at least this many tokens (up to 8, the decode kernels' most) take the
/// kernels with the tokens as the MMA's columns (LoweringContext::moe_cols): kernels_bench on an
/// H100 had them 1-4% slower at 2, 3, 5 and 6 tokens, even at 4, 4% faster at 7 and 7% at 8.
inline constexpr int kMoeColsFrom = 7;

/// What the lowering needs from the engine: capacities and where activations live.
struct LoweringContext {
  int max_tokens = 8;  ///< T capacity of the activation arena and scratch buffers
  int max_seqs = 1;    ///< B capacity
  int64_t max_seq = 1; ///< the S dim: the longest sequence (its block table's length)
  /// Gemm activations as a bf16 hi + lo pair (about fp32 precision, twice the MMAs) rather than
  /// one bf16 value.
  bool gemm_split = true;
  /// How the expert matrices lie on the device: the MoE kernels read BF16 or decode MXFP4.
  runtime::ExpertFormat expert_format = runtime::ExpertFormat::Bf16;
  /// The gemms of steps above 8 tokens on sm_90's warpgroup MMA (codegen/kernels/gemm_wg.cuh:
  /// weights on the MMA's M side, MXFP4 decoded in registers); false: mma.sync (gemm.cuh), which
  /// every architecture runs.
  bool wgmma = true;
  /// With wgmma: the dense projections (qkv, o_proj: outputs wider than one 64-row tile) of steps
  /// above 64 tokens call cuBLAS (runtime::PlanLibraryCall) instead of gemm_wg, their bias and
  /// residual added by the split-K reduce kernel (compile --dense-gemm cublas).
  bool dense_cublas = false;
  /// The gemms' canonical order in the decode kernels too (compile --gemm-order canonical):
  /// the MoE rows, lm_head, o_proj, and q, k, v and the router (fused with the rope and the
  /// norm and top-k in decode steps, else on the gemms) in gemm_wg's K order and splits, so that
  /// a token's sums do not depend on the step's size (docs/DESIGN.md, "The gemms' canonical
  /// order").
  bool canonical = false;
  /// With canonical: the dense linears' order is the natural K order, one chain over K (cuBLAS's
  /// without split K): prompt steps above 64 rows call cuBLAS (its pinned algorithm: Blas's fixed
  /// order), smaller gemm steps gemm_wg in the natural order without split K, and the decode
  /// kernels chain that way (docs/DESIGN.md, "The gemms' canonical order"). The experts keep
  /// gemm_wg's order.
  bool natural = false;
  /// Every MXFP4 scale byte is at most 128, so 2^(s - 1) is a bf16 factor: the grouped MoE
  /// gemms scale a decoded pair with one multiply instead of two (the same bits; gemm_wg's
  /// SMALL). Compile sets it from the checkpoint's scales; the upload refuses weights past it.
  bool mxfp4_small_scales = false;
  /// MoE decode steps of kMoeColsFrom to 8 tokens on the kernels with the step's tokens as the
  /// MMA's columns (codegen/kernels/moe_cols.cuh: an expert a block, each routed expert's rows
  /// read once a step; the per-pair kernels' bits), outside the canonical order. H100: B8 +5%
  /// (1,485 -> 1,562 tok/s at depth 512); at 2 and 4 tokens 1-1.5% slower than the per-pair
  /// kernels (kernels_bench "MXFP4 MoE decode at 2-8 tokens").
  bool moe_cols = true;
  /// With dense_cublas: lm_head of steps above 64 rows as a cuBLAS call writing the logits
  /// directly, not gemm_wg's 128-row tiles (kernels_bench, H200: 331 and 426 us at 128 and 256
  /// rows against gemm_wg's 365 and 709; H100 B256 at depth 512 +2.4%, B128 within noise).
  bool lm_head_library = true;
  /// Warps a block of the canonical decode attention in steps of more than 64 tokens (0:
  /// attention_decode_mma_warps, 4 at head_dim 64; AttentionDims::decode_warps). Fewer give the
  /// same bits with fewer instructions a block, each warp computing the block's scores; 0 stays:
  /// kernels_bench ("attention_decode_mma at batched-decode sizes by warps a block", H100) found
  /// 4 warps best or equal from 1 to 256 sequences (docs/PERF.md, "Attention").
  int many_token_decode_warps = 0;
  /// The activation arena's layout (plan_memory of the graph for max_tokens and max_seqs):
  /// activation arguments are offsets into it.
  const compiler::MemoryPlan* memory = nullptr;
};

/// Lowers every node of `g` (the default passes' output) to launch table entries of kernels
/// it adds to `kernels` (the table's kernels are theirs, in the same order); reshape and extract
/// are aliases and sources launch nothing. Arguments are symbolic: arena offsets, weights by
/// name, caches by index (the graph's cache nodes in order), step inputs by param name and
/// scratch buffers the table lists. Throws xserv::Error naming the node for an op the CUDA
/// engine does not lower yet. When the first output is per-sequence logits, a last launch picks
/// each row's greedy token (the table's argmax_scratch).
runtime::LaunchTable lower_graph(const ir::Graph& g, KernelSet& kernels,
                                 const LoweringContext& ctx);

/// What the CUDA model binds and allocates for `g` lowered with `ctx` (whose memory plan it
/// reads): the arena, the first output's and every recv's place in it, the caches' concrete
/// shapes in graph order, and the weights by name and shape.
runtime::StageLayout stage_layout(const ir::Graph& g, const LoweringContext& ctx);

} // namespace xserv::codegen
