// The lowering's internals, shared by codegen/cuda_lower.cpp (the walk over the graph, scratch
// buffers, table entries, sampling) and codegen/cuda_lower_ops.cpp (the kernels and entries of each
// fused op): not an interface, include only from those two.
#pragma once

#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "base/error.h"
#include "codegen/cuda_lower.h"
#include "codegen/emit_wg.h"

namespace xserv::codegen::lowering {

using codegen::kWgMoeTilings;
using codegen::WgMoeTiling;
using ir::Node;
using ir::Op;
using ir::ValueId;
using runtime::LaunchArg;
using Kind = runtime::LaunchArg::Kind;

inline int as_int(int64_t v) {
  return static_cast<int>(v);
}

/// Static size of dim `i` of value `v`'s result `r` (throws for a dynamic one).
inline int static_dim(const ir::Graph& g, ValueId v, size_t i, int r = 0) {
  const ir::Dim& d = g.node(v).types.at(static_cast<size_t>(r)).shape.at(i);
  XSERV_CHECK(d.name.empty(), fmt::format("expected a static dim: {}", ir::print_node(g, v)));
  return as_int(d.size);
}

/// Which grid rows a value's leading dims stand for: the step's tokens (T) or sequences (B).
enum class Rows { Tokens, Seqs };

inline Rows rows_kind(const ir::Graph& g, ValueId v) {
  const ir::Dim& d = g.type(v).shape.at(0);
  if (d.name == "B")
    return Rows::Seqs;
  XSERV_CHECK(d.name == "T",
              fmt::format("expected a T or B leading dim: {}", ir::print_node(g, v)));
  return Rows::Tokens;
}

/// The IR line a kernel's source is headed by: the node with its value numbers blanked, so
/// that every node a kernel serves gives the same source (and one cache entry).
std::vector<std::string> ir_lines(const ir::Graph& g, ValueId v);

/// Int arguments: the launch's rows, its key splits.
inline LaunchArg rows_arg() {
  LaunchArg a;
  a.kind = Kind::Rows;
  return a;
}
inline LaunchArg splits_arg() {
  LaunchArg a;
  a.kind = Kind::Splits;
  return a;
}

/// `a` advanced by `bytes` per row of a chunk's start (null stays null).
inline LaunchArg strided(LaunchArg a, uint64_t bytes) {
  if (a.kind != Kind::Null)
    a.row_stride = bytes;
  return a;
}

/// The most tokens the decode kernels take in one launch (linear_decode's MAX_T).
inline constexpr int kDecodeTokens = 8;
/// Attention splits over keys only in steps of at most this many tokens.
inline constexpr int kSplitTokens = 64;
/// Dense gemms of at most this many rows split K over blocks (few row tiles would leave most
/// SMs idle).
inline constexpr int kSmallGemmRows = 64;
/// Row tiles of the grouped MoE gemms, chosen by the rows each expert gets.
inline constexpr std::array<int, 3> kMoeTileRows = {32, 64, 128};

/// Lowers one graph into a launch table; holds the per-graph scratch buffers.
class Lowerer {
public:
  Lowerer(const ir::Graph& g, KernelSet& k, const LoweringContext& c) : g_(g), k_(k), c_(c) {
    XSERV_CHECK(c_.memory, "lower_graph needs the activation memory plan");
    for (ValueId v = 0; v < static_cast<ValueId>(g_.size()); ++v)
      if (g_.node(v).op == Op::Cache)
        cache_index_.emplace(v, int(cache_index_.size()));
  }

  runtime::LaunchTable run();

private:
  /// The argument for result `r` of value `v`: step inputs by name, weights by name, caches by
  /// index, everything else at its offset in the activation arena.
  LaunchArg addr(ValueId v, int r = 0) const;

  /// A scratch buffer of `bytes` that lives as long as the engine, holding `f64` if given.
  LaunchArg allocate(size_t bytes, std::vector<double> f64 = {}) {
    t_.scratch.push_back({bytes, std::move(f64)});
    LaunchArg a;
    a.kind = Kind::Scratch;
    a.index = int(t_.scratch.size() - 1);
    return a;
  }

  /// Appends a table entry launching `kernel` when the step's rows lie in [lo, hi] (hi -1:
  /// unbounded) and within outer_. Entries no step within capacity reaches are left out.
  void emit(int kernel, Rows rows, int lo, int hi, std::vector<LaunchArg> args, int chunk = 0,
            int splits_window = -1, int min_splits = 1, int splits_heads = 0);
  /// Fills `l`'s label and row rules for rows [lo, hi] within outer_; false when no step within
  /// capacity reaches them.
  bool row_rules(Rows rows, int lo, int hi, runtime::PlanLaunch& l) const;
  /// A launch of library call `library` (an index into the table's library list) over the same
  /// row rules, args x, w, y.
  void emit_library(int library, Rows rows, int lo, int hi, std::vector<LaunchArg> args);

  /// The per-graph scratch buffers (attention partials, router logits, MoE activations and
  /// pairs, inv-rms) sized for the context's capacities.
  void allocate_scratch();

  /// Steps of more tokens than the decode kernels take use the tensor-core gemm kernels.
  bool gemm_path() const { return c_.max_tokens > kDecodeTokens; }
  /// A canonical plan whose steps above 8 tokens run gemm_wg: qkv and the router take those
  /// gemms wherever their chained fused kernels do not serve (LoweringContext::canonical).
  bool canonical_gemms() const { return c_.canonical && c_.wgmma && gemm_path(); }

  /// Row tile of a grouped gemm: about the rows one expert gets, tokens * k / experts.
  static int moe_tile_index(int tokens, int k, int experts) {
    const int per_expert = tokens * k / std::max(1, experts);
    return per_expert <= 24 ? 0 : per_expert <= 80 ? 1 : 2;
  }
  /// The warpgroup-MMA tiling (an index into kWgMoeTilings) of a step of `tokens`, by the (token,
  /// slot) pairs an expert gets on average, tokens * k / experts: 16-token tiles up to 12, 32 up
  /// to 24 (an expert's pairs past the 16-token tile cost a second read of its weights), then
  /// 64 and 128 as the moe_tile_index rule.
  static int wg_moe_tiling(int tokens, int k, int experts) {
    const int per_expert = tokens * k / std::max(1, experts);
    return per_expert <= 12 ? 0 : per_expert <= 24 ? 1 : per_expert <= 80 ? 2 : 3;
  }

  /// The gemm kernels that serve linear `d` on steps of more than 8 rows: for at most
  /// kSmallGemmRows rows split-K kernels (row tiles 32 and 64) and their reduce, else row tile
  /// 64 over all of K; for a normed linear the inv-rms prologue.
  /// With c_.wgmma the warpgroup-MMA gemms instead: `act` (gemm_act: the rows' bf16
  /// activations, the norm applied) before them, `small64` the split-K gemm of up to
  /// kSmallGemmRows rows (small32 unused), `large` the gemm above.
  struct DenseGemm {
    int small32 = -1, small64 = -1, large = -1, reduce = -1, inv = -1;
    int splitk = 1;
    /// The large (above kSmallGemmRows tokens) kernel splits K too (outputs of one 64-row
    /// weight tile: the router), through the same reduce.
    bool large_split = false;
    /// Above kSmallGemmRows rows: LaunchTable::library call `library` (cuBLAS) writes the raw
    /// sums into `lib_part` ([rows, n] fp32 scratch) and `lib_reduce` adds bias and residual
    /// (without either, lib_reduce is -1 and the sums go straight to the output); its
    /// activations come from `lib_act` (gemm_act in K order: cuBLAS reads the checkpoint's
    /// weight rows, not gemm_wg's K slots).
    int library = -1, lib_reduce = -1, lib_act = -1;
    /// The first row count the library call serves: kSmallGemmRows + 1, or in the natural order
    /// the first after the decode kernels' (its picks by step size beat gemm_wg's unsplit
    /// natural form there: docs/PERF.md, "Batch invariance").
    int lib_from = 0;
    LaunchArg lib_part;
    LaunchArg part; ///< [splitk, rows, n] fp32 partial sums
    bool wg = false;
    int act = -1;
  };

  /// dense_gemm's warpgroup-MMA kernels (c_.wgmma).
  DenseGemm dense_gemm_wg(const codegen::LinearDims& d, ValueId v, bool library);

  /// With k.splitk > 1: the split-K reduce kernel of a linear (bias and residual added there)
  /// into k.reduce, and the shared partial-sums buffer, grown to this linear's need for `rows`
  /// tokens, into k.part.
  void add_splitk_reduce(DenseGemm& k, const codegen::LinearDims& d, int64_t rows);
  /// The fp32 partial-sums scratch the split-K gemms and the library gemms share (one linear
  /// at a time uses it), grown to at least `bytes`.
  LaunchArg partials(size_t bytes);

  /// The warpgroup-MMA MoE gemms (c_.wgmma) of lower_moe for tiling kWgMoeTilings[i] over
  /// rows [lo, hi]: moe_sort, gemm_act of x, gate_up + SwiGLU,
  /// gemm_act of the SwiGLU output, down + scatter.
  void moe_gemms_wg(ValueId v, const codegen::MoeDims& d, int i, int lo, int hi,
                    const std::vector<LaunchArg>& in);

  /// The bf16 activations gemm_act writes for the warpgroup-MMA gemms: hi, and lo with
  /// gemm_split, sized for the largest gemm input of a step.
  LaunchArg wg_xh_, wg_xl_;
  /// What wg_xh_ holds for steps above 8 tokens after the last gemm_act: that of `wg_act_of_`
  /// (with the norm when wg_act_normed_). Valid (wg_act_valid_) only from a router's gemm to the
  /// MoE right after it, which reads the same x and so converts nothing again: other launches
  /// between them could have reused x's buffer.
  LaunchArg wg_act_of_;
  bool wg_act_normed_ = false, wg_act_valid_ = false;

  /// `library`: the projection may go to cuBLAS (LoweringContext::dense_cublas); not the router.
  DenseGemm dense_gemm(const codegen::LinearDims& d, ValueId v, bool library = true);

  /// Launches a linear over `rows` of x: one decode GEMV launch per 8 rows (chunks) for at
  /// most 8 rows or when no gemm fits, else the tensor-core gemm (after the rows' inv-rms,
  /// unless `inv_ready`: an earlier launch of this step computed it for the same x).
  void linear(int kernel, const DenseGemm& gemm, const codegen::LinearDims& d, Rows rows,
              LaunchArg x, LaunchArg ln, LaunchArg w, LaunchArg b, LaunchArg h, LaunchArg y,
              bool inv_ready = false, int kernel1 = -1);

  /// linear / rms_norm_linear / linear_residual: decode GEMVs (a 1-token kernel for o_proj)
  /// and the gemms.
  void lower_linear(ValueId v);

  /// The YaRN table (float64 inv_freq, a constant scratch buffer) and attention factor of a
  /// rope node.
  std::pair<LaunchArg, double> yarn_table(ValueId v, int head_dim);

  /// rope_yarn of [T, heads, head_dim] from `x` into `y` (may alias), the node's YaRN attributes.
  void rope(ValueId v, int heads, int head_dim, LaunchArg x, LaunchArg y);

  /// qkv_rope: for at most 8 tokens one qkv_decode launch (the norm staged once, q, k and v
  /// rows in one grid), else three gemms after one inv-rms; then q and k rotate in place in one
  /// launch.
  void lower_qkv_rope(ValueId v);

  /// The kv_write nodes that store qkv_rope `v`'s k and v (results 1 and 2, through extract)
  /// at its positions into two caches of one shape and dtype; {-1, -1} when there is not
  /// exactly that pair.
  std::pair<ValueId, ValueId> kv_writes_of(ValueId v) const;
  /// kv_write nodes by the value their rows come from (the source of their Extract input),
  /// in node order: built once, so kv_writes_of costs its candidates, not the graph.
  mutable std::map<ValueId, std::vector<ValueId>> kv_writes_by_source_;
  mutable bool kv_writes_indexed_ = false;

  /// The KV cache node a cache operand (a cache or an earlier kv_write of it) stands for.
  ValueId cache_node(ValueId v) const;

  /// Positions per block of a paged cache (its static second dimension).
  int cache_block(ValueId cache) const;
  /// Entries of the block table that pages `cache`: the plan's max sequence in blocks.
  int table_blocks(ValueId cache) const;

  /// attention: in the canonical order (canonical_attention) the decode kernel for steps of up
  /// to kSplitTokens tokens and decode steps of any size, its chunk combine, the query-tiled
  /// prompt kernel above; else the fp32 split-key decode kernel and its combine for every step.
  void lower_attention(ValueId v);
  /// Attention `d` runs in the canonical order of attention_mma.cuh (every plan whose head
  /// groups fit its 16-row tiles; split plans with fp16 operand pairs): every step, decode or
  /// prompt, on the tensor-core kernels with key tiles and chunks at fixed positions.
  static bool canonical_attention(const codegen::AttentionDims& d) {
    const int group = d.heads / d.kv_heads;
    return d.heads % d.kv_heads == 0 && group <= 16 && 128 % group == 0 && d.head_dim % 16 == 0;
  }

  /// kv_write, unless the rope launch already stores it in decode steps (kv_in_rope_).
  void lower_kv_write(ValueId v);

  /// router_topk of `logits` ([T, experts]) into v's weights and ids.
  void topk(ValueId v, int experts, int k, LaunchArg logits);

  /// router: norm_router_topk for decode steps when router_of_norm allows it, else the router
  /// linear then topk.
  void lower_router(ValueId v);

  /// The router node that fuses rms_norm node `norm` into its decode launch (norm_router_topk),
  /// or -1: a router whose input is this norm, of sizes codegen::norm_router_topk_fits takes
  /// (canonical plans: norm_router_topk_chain_fits).
  ValueId router_of_norm(ValueId norm) const;
  /// The fused router's sizes: in the canonical order (chain: the router gemm's K split) in
  /// canonical plans.
  codegen::RouterTopKDims router_dims(int dim, int experts, int k) const;

  /// moe_experts(_residual): gate_up / down per (token, slot) and the ordered combine for
  /// decode steps, moe_sort and the grouped gemms above.
  void lower_moe(ValueId v);

  /// The sampling epilogue: every step ends with the greedy pick of each sequence's logits row,
  /// so a greedy decode step copies back a few keys per sequence, not the vocabulary's logits.
  void lower_sampling();

  /// The kernels and table entries of node v (nothing for sources and aliases).
  void lower(ValueId v);

  const ir::Graph& g_;
  KernelSet& k_;
  const LoweringContext& c_;
  runtime::LaunchTable t_;
  std::map<ValueId, int> cache_index_; ///< cache nodes in graph order
  std::string label_;                  ///< op of the node being lowered
  int outer_per_seq_ = 0;              ///< PlanLaunch::one_per_seq of every emitted entry
  int part_ = 0;                       ///< PlanLaunch::part of every emitted entry
  int split_chunk_ = 0;                ///< PlanLaunch::split_chunk of every split entry
  std::set<ValueId> kv_in_rope_;       ///< kv_writes rope_yarn_qk_kv does in decode steps
  int outer_lo_ = 0, outer_hi_ = -1;   ///< row range every emitted entry is limited to
  LaunchArg part_ml_, part_o_, router_logits_, moe_act_;
  LaunchArg inv_rms_, moe_pair_, moe_tiles_, moe_part_;
  LaunchArg splitk_part_;
  size_t splitk_bytes_ = 0;
};

} // namespace xserv::codegen::lowering
