// The decode-path MoE emitters (codegen/kernels/moe.cuh): gate_up + SwiGLU and the down rows
// per (token, slot), on FMA (bf16 or MXFP4 experts) or tensor cores (MXFP4, bf16 activations).
#include "codegen/emit.h"
#include "codegen/emit_detail.h"
#include "codegen/emit_wg.h"

#include "base/error.h"

#include <fmt/format.h>

#include <algorithm>

namespace xserv::codegen {

using namespace detail;

namespace {

void check_mxfp4_moe(const MoeDims& d) {
  if (d.mxfp4 && (d.hidden % 32 != 0 || d.inter % 32 != 0))
    throw Error(fmt::format("codegen: MXFP4 experts need hidden ({}) and intermediate ({}) "
                            "divisible by 32",
                            d.hidden, d.inter));
}

/// The tensor-core MoE kernels' tiling (MoeDims::mma_*), defaults filled in.
struct MoeMmaTiling {
  int groups, splits, chunk, stages;
  int per = 0;    ///< blocks of a K split (mx4_mma_split_blocks)
  int blocks = 0; ///< blocks of the whole K
  bool chain = false;
  /// Dynamic shared memory of the stages' rings (2 KB a chunk and warp) and the warps' scale
  /// factors (Mx4MmaTileRows::kScaleSlots: 64 bytes a block of the split) or, chained, the
  /// warp's copy of its 16 rows' scale bytes, all of K (Mx4ChainRows::kScaleSlots: a row from
  /// the aligned word holding its first byte, one word more).
  size_t ring_bytes() const {
    if (stages == 0)
      return 0;
    const size_t scales =
        chain ? size_t(16) * 4 * ((blocks + 3) / 4 + 1) : size_t(per) / 2 * 8 * 16;
    return size_t(groups) * splits * (stages * 16 * 8 * 16 + scales);
  }
};
MoeMmaTiling moe_mma_tiling(const MoeDims& d, bool gate_up) {
  // The defaults; chained, the K splits are the canonical ranges (moe_chain_splits: the
  // grouped gemms' chunks; the lowering never sets mma_splits then, benchmarks may).
  const int k = gate_up ? d.hidden : d.inter;
  const int splits = d.mma_chain ? moe_chain_splits(k) : gate_up ? 2 : 4;
  // A chain over all of K: twice the row groups a block (the 20b, one token, H100: gate_up 8
  // groups 19.9 us against 4 20.4 and 3 K ranges' 19.6; down 4 groups 14.5-14.7 against 2 16.0
  // and 3 ranges' 13.4). They divide the rows wherever the chain fits (sizes multiples of 64).
  const int s = d.mma_splits > 0 ? d.mma_splits : splits;
  const int groups = d.mma_chain && s == 1 ? (gate_up ? 8 : 4) : gate_up ? 4 : 2;
  MoeMmaTiling t{d.mma_groups > 0 ? d.mma_groups : groups, s, d.mma_chunk > 0 ? d.mma_chunk : 8,
                 d.mma_stages};
  t.chain = d.mma_chain;
  t.blocks = k / 32;
  if (t.splits > 0) {
    const int blocks = (gate_up ? d.hidden : d.inter) / 32;
    t.per = ((blocks + t.splits - 1) / t.splits + 1) / 2 * 2; // mx4_mma_split_blocks
    if (t.stages > 2) // no deeper than a split's chunks need (small models)
      t.stages = std::max(2, std::min(t.stages, (t.per + 7) / 8 + 1));
  }
  return t;
}

/// Name suffix of a tensor-core MoE kernel.
std::string moe_mma_suffix(const MoeMmaTiling& t, int min_blocks, bool cols) {
  return fmt::format("_mma_g{}_s{}_c{}{}{}{}{}", t.groups, t.splits, t.chunk,
                     t.stages > 0 ? fmt::format("_t{}", t.stages) : "",
                     min_blocks > 0 ? fmt::format("_m{}", min_blocks) : "", cols ? "_cols" : "",
                     t.chain ? "_chain" : "");
}

/// The template arguments after <D, I, E, KSEL> of a tensor-core MoE kernel.
std::string moe_mma_args(const MoeMmaTiling& t) {
  return fmt::format("{}, {}, {}, {}, {}", t.groups, t.splits, t.chunk, t.stages, t.chain);
}

} // namespace

/// Whether one tensor-core MoE kernel fits `d`: gate_up's row groups (8 pairs) divide the
/// intermediate size, down's (16 rows) the hidden size.
bool moe_mma_kernel_fits(const MoeDims& d, bool gate_up) {
  const MoeMmaTiling t = moe_mma_tiling(d, gate_up);
  // The shared ring: chunks of 8 blocks, an even block count, within what one block may have
  // (227 KB on sm_90).
  const int k = gate_up ? d.hidden : d.inter;
  const bool ring_ok = t.chunk == 8 && k % 64 == 0 && t.ring_bytes() <= 200 * 1024;
  return d.mxfp4 && d.round_act && t.groups > 0 && t.splits > 0 && t.chunk > 0 &&
         t.chunk % 2 == 0 && 32 * t.groups * t.splits <= 1024 && d.hidden % 32 == 0 &&
         d.inter % 32 == 0 &&
         (gate_up ? d.inter % (8 * t.groups) == 0 : d.hidden % (16 * t.groups) == 0) &&
         (t.stages == 0 || (t.stages >= 2 && ring_ok)) &&
         (!t.chain ||
          (t.stages >= 2 && d.hidden % 64 == 0 && d.inter % 64 == 0 && (k / 64) % t.splits == 0));
}

namespace {

void check_moe_mma(const MoeDims& d, bool gate_up) {
  if (!moe_mma_kernel_fits(d, gate_up))
    throw Error(fmt::format("codegen: the tensor-core MoE {} kernel takes MXFP4 experts, bf16 "
                            "activations, an even chunk of blocks (a shared ring: chunks of 8, K a "
                            "multiple of 64, at most 200 KB) and hidden ({}) and intermediate ({}) "
                            "sizes its row groups divide (the canonical order: a ring, sizes "
                            "multiples of 64)",
                            gate_up ? "gate_up" : "down", d.hidden, d.inter));
}

/// The launch of a tensor-core MoE kernel (gate_up or down; checked that it fits): its block,
/// grid.x (8 pairs or 16 rows a row group) and ring bytes. Returns the tiling.
MoeMmaTiling moe_mma_launch(const MoeDims& d, bool gate_up, LaunchRule& launch) {
  check_moe_mma(d, gate_up);
  const MoeMmaTiling t = moe_mma_tiling(d, gate_up);
  launch.block = 32 * t.groups * t.splits;
  launch.blocks_x = gate_up ? d.inter / (8 * t.groups) : d.hidden / (16 * t.groups);
  launch.smem_fixed = t.ring_bytes();
  return t;
}

/// Name suffix of non-default MoE decode tuning (rows per warp, unroll, prefetch).
std::string moe_tuning_suffix(const MoeDims& d) {
  std::string s;
  if (d.rows > 0)
    s += fmt::format("_r{}", d.rows);
  if (d.min_blocks > 0)
    s += fmt::format("_m{}", d.min_blocks);
  if (d.unroll != kMoeUnroll)
    s += fmt::format("_u{}", d.unroll);
  if (d.prefetch)
    s += "_pf";
  return s;
}

/// The down emitters' shared checks: positive sizes, the intermediate size in whole 16-byte
/// words of bf16.
void check_moe_down_dims(const MoeDims& d) {
  check_positive("moe_experts", {d.hidden, d.inter, d.experts, d.k});
  if (d.inter % 8 != 0)
    throw Error(
        fmt::format("codegen: moe_experts needs intermediate ({}) divisible by 8", d.inter));
}

} // namespace

bool moe_mma_fits(const MoeDims& d) {
  return moe_mma_kernel_fits(d, true) && moe_mma_kernel_fits(d, false);
}

bool moe_cols_fits(const MoeDims& d) {
  MoeDims plain = d;
  plain.mma_cols = false;
  if (!d.mma || d.k < 1 || 8 * d.k > 32 || !moe_mma_fits(plain))
    return false;
  for (bool gate_up : {true, false}) {
    const MoeMmaTiling t = moe_mma_tiling(d, gate_up);
    if (t.ring_bytes() + size_t(8) * (gate_up ? d.hidden : d.inter) / 32 * 64 > 200 * 1024)
      return false;
  }
  return true;
}

namespace {

void check_moe_cols(const MoeDims& d) {
  if (!moe_cols_fits(d))
    throw Error(fmt::format("codegen: the MoE decode kernels with tokens as columns take the "
                            "tensor-core kernels, at most 4 experts a token (k = {}) and rows of "
                            "8 tokens beside the rings in shared memory (hidden {}, intermediate "
                            "{})",
                            d.k, d.hidden, d.inter));
}

} // namespace

KernelSource emit_moe_gate_up(const MoeDims& d, const std::vector<std::string>& ir_lines) {
  check_positive("moe_experts", {d.hidden, d.inter, d.experts, d.k});
  if (d.hidden % 8 != 0 || d.inter % 8 != 0)
    throw Error(fmt::format("codegen: moe_experts needs hidden ({}) and intermediate ({}) "
                            "divisible by 8",
                            d.hidden, d.inter));
  const int pairs = d.rows > 0 ? d.rows : d.inter % 2 == 0 ? 2 : 1; // (gate, up) pairs per warp
  if (d.inter % pairs != 0 || d.unroll < 1)
    throw Error(fmt::format("codegen: moe tuning rows {} unroll {} do not fit intermediate {}",
                            pairs, d.unroll, d.inter));
  check_mxfp4_moe(d);
  std::string name = fmt::format("moe_gate_up_e{}_k{}_d{}_i{}{}{}{}", d.experts, d.k, d.hidden,
                                 d.inter, attr_suffix("limit", d.limit, 7.0),
                                 attr_suffix("alpha", d.alpha, 1.702), d.mxfp4 ? "_mx4" : "");
  std::vector<Param> params = {{"const float* x", "x"},
                               {"const int* ids", "ids"},
                               {expert_param(d.mxfp4, "gate_up"), "gate_up"},
                               {fmt::format("{} gate_up_b", kBf16), "gate_up_b"},
                               {"", float_literal(d.limit)},
                               {"", float_literal(d.alpha)},
                               {"float* act", "act"}};
  LaunchRule launch;
  launch.blocks_x = (d.inter + 8 * pairs - 1) / (8 * pairs);
  launch.y_per_token = d.k;
  launch.min_blocks_per_sm = d.min_blocks;
  std::string call = fmt::format("moe_gate_up{}<{}, {}, {}, {}, {}, {}, {}>", d.mxfp4 ? "_mx4" : "",
                                 d.hidden, d.inter, d.experts, d.k, pairs, d.unroll, d.prefetch);
  if (d.mma) {
    const MoeMmaTiling t = moe_mma_launch(d, true, launch);
    name = fmt::format("moe_gate_up_e{}_k{}_d{}_i{}{}{}_mx4_a16", d.experts, d.k, d.hidden, d.inter,
                       attr_suffix("limit", d.limit, 7.0), attr_suffix("alpha", d.alpha, 1.702)) +
           moe_mma_suffix(t, d.min_blocks, d.mma_cols);
    if (d.mma_cols) { // an expert a block, the tokens as columns: a staged row a token
      check_moe_cols(d);
      launch.smem_per_token = size_t(d.hidden) / 32 * 64;
      call = fmt::format("moe_gate_up_mx4_cols<{}, {}, {}, {}, {}>", d.hidden, d.inter, d.experts,
                         d.k, moe_mma_args(t));
      return assemble(std::move(name), ir_lines, "moe_cols.cuh", call, params, launch);
    }
    call = fmt::format("moe_gate_up_mx4_mma<{}, {}, {}, {}, {}>", d.hidden, d.inter, d.experts, d.k,
                       moe_mma_args(t));
    return assemble(std::move(name), ir_lines, "moe.cuh", call, params, launch);
  }
  name += moe_tuning_suffix(d);
  round_act(d.round_act, name, call);
  return assemble(std::move(name), ir_lines, "moe.cuh", call, params, launch);
}

KernelSource emit_moe_down(const MoeDims& d, const std::vector<std::string>& ir_lines) {
  check_moe_down_dims(d);
  const int rows = d.hidden % 2 == 0 ? 2 : 1;
  std::string name = fmt::format("moe_down{}_e{}_k{}_d{}_i{}", d.residual ? "_residual" : "",
                                 d.experts, d.k, d.hidden, d.inter);
  std::vector<Param> params = {{"const float* act", "act"},
                               {"const float* weights", "weights"},
                               {"const int* ids", "ids"},
                               {fmt::format("{} down", kBf16), "down"},
                               {fmt::format("{} down_b", kBf16), "down_b"}};
  params.push_back(d.residual ? Param{"const float* h", "h"} : Param{"", "nullptr"});
  params.push_back({"float* y", "y"});
  LaunchRule launch;
  launch.blocks_x = (d.hidden + 8 * rows - 1) / (8 * rows);
  launch.y_per_token = 1;
  std::string call = fmt::format("moe_down<{}, {}, {}, {}, {}, {}>", d.hidden, d.inter, d.experts,
                                 d.k, rows, d.residual);
  return assemble(std::move(name), ir_lines, "moe.cuh", call, params, launch);
}

KernelSource emit_moe_down_part(const MoeDims& d, const std::vector<std::string>& ir_lines) {
  check_moe_down_dims(d);
  const int rows = d.rows > 0 ? d.rows : d.hidden % 2 == 0 ? 2 : 1;
  if (d.hidden % rows != 0 || d.unroll < 1)
    throw Error(fmt::format("codegen: moe tuning rows {} unroll {} do not fit hidden {}", rows,
                            d.unroll, d.hidden));
  check_mxfp4_moe(d);
  std::string name = fmt::format("moe_down_part_e{}_k{}_d{}_i{}{}", d.experts, d.k, d.hidden,
                                 d.inter, d.mxfp4 ? "_mx4" : "") +
                     moe_tuning_suffix(d);
  std::vector<Param> params = {{"const float* act", "act"},
                               {"const float* weights", "weights"},
                               {"const int* ids", "ids"},
                               {expert_param(d.mxfp4, "down"), "down"},
                               {fmt::format("{} down_b", kBf16), "down_b"},
                               {"float* part", "part"}};
  LaunchRule launch;
  launch.blocks_x = (d.hidden + 8 * rows - 1) / (8 * rows);
  launch.y_per_token = d.k;
  launch.min_blocks_per_sm = d.min_blocks;
  std::string call = fmt::format("moe_down_part{}<{}, {}, {}, {}, {}, {}>", d.mxfp4 ? "_mx4" : "",
                                 d.hidden, d.inter, d.experts, d.k, rows, d.unroll);
  if (d.mma) {
    const MoeMmaTiling t = moe_mma_launch(d, false, launch);
    name = fmt::format("moe_down_part_e{}_k{}_d{}_i{}_mx4_a16", d.experts, d.k, d.hidden, d.inter) +
           moe_mma_suffix(t, d.min_blocks, d.mma_cols);
    if (d.mma_cols) {
      check_moe_cols(d);
      launch.smem_per_token = size_t(d.inter) / 32 * 64;
      call = fmt::format("moe_down_part_mx4_cols<{}, {}, {}, {}, {}>", d.hidden, d.inter, d.experts,
                         d.k, moe_mma_args(t));
      return assemble(std::move(name), ir_lines, "moe_cols.cuh", call, params, launch,
                      DependencyWait::InCall);
    }
    call = fmt::format("moe_down_part_mx4_mma<{}, {}, {}, {}, {}>", d.hidden, d.inter, d.experts,
                       d.k, moe_mma_args(t));
    return assemble(std::move(name), ir_lines, "moe.cuh", call, params, launch,
                    DependencyWait::InCall);
  }
  round_act(d.round_act, name, call);
  return assemble(std::move(name), ir_lines, "moe.cuh", call, params, launch,
                  DependencyWait::InCall);
}

} // namespace xserv::codegen
