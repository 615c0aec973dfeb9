// The emitters of canonical plans' fused decode kernels (codegen/kernels/linear_chain.cuh): q, k
// and v with the rotary embedding and the cache writes, and the router with its norm and top-k,
// each summing in the gemms' canonical order.
#include "codegen/emit.h"
#include "codegen/emit_detail.h"

#include "base/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace xserv::codegen {

using namespace detail;

namespace {

/// qkv_rope_decode_chain's tiling: 16-row groups a block (whole heads, or an even count of
/// pair groups of one head), warps a group, ring stages.
struct QkvChainTiling {
  int groups = 0, warps = 0, stages = 0;
  int threads() const { return 32 * groups * warps; }
};

/// Shared memory of one qkv_rope_decode_chain block: the rings and the activations (dynamic),
/// the range sums and the norm's partials (static).
size_t qkv_chain_smem(const QkvDims& d, const QkvChainTiling& t) {
  const size_t ranges = size_t(std::max(d.chain_q, d.chain_kv));
  return size_t(t.groups) * t.warps * t.stages * 2048 +
         size_t(d.max_tokens) * (size_t(d.k) / 2 + 4) * 4 +
         (ranges * 16 * t.groups + 9) * size_t(d.max_tokens) * 4;
}

QkvChainTiling qkv_chain_tiling(const QkvDims& d) {
  QkvChainTiling t;
  const int dh = d.head_dim;
  if (dh <= 0 || dh % 2 != 0)
    return t;
  for (int g : {1, 2, 4}) {
    const bool whole = (16 * g) % dh == 0;
    const bool pairs = g % 2 == 0 && (dh / 2) % (8 * g) == 0;
    if (whole || pairs) {
      t.groups = g;
      break;
    }
  }
  if (t.groups == 0)
    return t;
  // Warp w of a group takes the ranges w, w + warps, ...: q's one each, k's and v's two.
  t.warps = std::min(std::max(d.chain_q, (d.chain_kv + 1) / 2), 1024 / (32 * t.groups));
  // The deepest ring (4 to 2 tiles a warp) that keeps two blocks on an SM. One chain over K
  // (natural): a warp a group, so the bytes in flight come from its ring alone: 12 to 2.
  const std::vector<int> depths =
      d.chain_natural ? std::vector<int>{12, 8, 6, 4, 3, 2} : std::vector<int>{4, 3, 2};
  for (int s : depths) {
    if (d.chain_natural && s > 2 && s > d.k / 64 + 1)
      continue; // no deeper than the chain's tiles need (small models)
    t.stages = s;
    if (qkv_chain_smem(d, t) <= 113 * 1024)
      break;
  }
  return t;
}

/// Blocks a token of norm_router_topk_chain: enough 8-warp blocks for one warp a task (row
/// group x K range), at most 8 (the portable cluster size).
int router_chain_blocks(int experts, int ranges) {
  return std::clamp(((experts + 15) / 16 * ranges + 7) / 8, 1, 8);
}

/// The warps of a norm_router_topk_chain block that take a task (each with its ring).
int router_chain_warps(const RouterTopKDims& d) {
  return std::min(8, (d.experts + 15) / 16 * d.chain);
}

/// norm_router_topk_chain's ring depth: 3 chunks a warp over the K ranges; in the natural order
/// (one chain a row group, the 20b's two warps stream all of the router) 16, or the chain's
/// tiles and one, or what 160 KB of rings allow the block's warps (the 120b's 8: 10).
int router_chain_stages(int dim, const RouterTopKDims& d) {
  if (!d.chain_natural)
    return 3;
  const int fit = 160 * 1024 / (std::max(1, router_chain_warps(d)) * 2048);
  return std::clamp(std::min(dim / 64 + 1, fit), 2, 16);
}

/// Its dynamic shared memory: the rings of a block's warps that take a task.
size_t router_chain_smem(int dim, const RouterTopKDims& d) {
  return size_t(router_chain_warps(d)) * router_chain_stages(dim, d) * 2048;
}

} // namespace

bool qkv_chain_fits(const QkvDims& d) {
  const QkvChainTiling t = qkv_chain_tiling(d);
  const int tiles = d.k / 64, rows = 16 * t.groups;
  return t.groups > 0 && d.k > 0 && d.k % 64 == 0 && d.chain_q > 0 && d.chain_kv > 0 &&
         tiles % d.chain_q == 0 && tiles % d.chain_kv == 0 && d.round_act && d.nk == d.nv &&
         (!d.chain_natural || (d.chain_q == 1 && d.chain_kv == 1)) && d.nq > 0 && d.nk > 0 &&
         d.nq % rows == 0 && d.nk % rows == 0 && d.nq % d.head_dim == 0 && d.nk % d.head_dim == 0 &&
         d.max_tokens >= 1 && d.max_tokens <= 8 && d.block > 0 && d.table > 0 &&
         qkv_chain_smem(d, t) <= 227 * 1024;
}

KernelSource emit_qkv_rope_chain(const QkvDims& d, const std::vector<std::string>& ir_lines) {
  if (!qkv_chain_fits(d))
    throw Error(fmt::format("codegen: qkv_rope_decode_chain needs K a multiple of 64 with q's "
                            "({}) and k's and v's ({}) K ranges dividing K / 64 (one each in the "
                            "natural order), bf16 activations, k and v alike and whole heads in "
                            "16-row groups; got K {}, {}/{}/{}, head_dim {}",
                            d.chain_q, d.chain_kv, d.k, d.nq, d.nk, d.nv, d.head_dim));
  const QkvChainTiling t = qkv_chain_tiling(d);
  const std::string cache_t = d.f32_cache ? "float" : "__nv_bfloat16";
  std::string name =
      fmt::format(
          "qkv_rope_decode_chain_k{}_q{}_k{}_v{}{}_t{}_c{}x{}_g{}_w{}_r{}_d{}_b{}_m{}_kv{}{}", d.k,
          d.nq, d.nk, d.nv, attr_suffix("eps", d.eps, 1e-5), d.max_tokens, d.chain_q, d.chain_kv,
          t.groups, t.warps, t.stages, d.head_dim, d.block, d.table, d.f32_cache ? "f32" : "bf16",
          d.chain_natural ? "_natural" : "") +
      attr_suffix("att", d.attention_factor, 1.3465735902799727);
  const std::vector<Param> params = qkv_params(d);
  LaunchRule launch;
  launch.block = t.threads();
  launch.blocks_x = (d.nq + d.nk + d.nv) / (16 * t.groups);
  launch.smem_fixed = size_t(t.groups) * t.warps * t.stages * 2048;
  launch.smem_per_token = (size_t(d.k) / 2 + 4) * 4;
  launch.max_tokens = d.max_tokens;
  const std::string call = fmt::format(
      "qkv_rope_decode_chain<{}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}{}>", d.k, d.nq,
      d.nk, d.nv, d.head_dim, d.block, d.table, cache_t, d.max_tokens, d.chain_q, d.chain_kv,
      t.groups, t.warps, t.stages, d.chain_natural ? ", true" : "");
  return assemble(std::move(name), ir_lines, "linear_chain.cuh", call, params, launch,
                  DependencyWait::InCall);
}

bool norm_router_topk_chain_fits(int dim, const RouterTopKDims& d) {
  const int groups = (d.experts + 15) / 16;
  if (d.experts <= 0 || d.experts % 8 != 0 || d.experts > 256 || d.k <= 0 || d.k > d.experts ||
      d.chain <= 0 || dim <= 0 || dim % 64 != 0 || (dim / 64) % d.chain != 0 || !d.round_act ||
      (d.chain_natural && d.chain != 1))
    return false;
  // Every task a warp: one each, or a group's ranges in turn (with clusters and without).
  const int tasks = groups * d.chain;
  const int all = 8 * router_chain_blocks(d.experts, d.chain);
  return (tasks <= all || all % groups == 0) && (tasks <= 8 || 8 % groups == 0) &&
         size_t(dim) * 4 + (size_t(dim) / 2 + 4) * 4 + size_t(d.chain) * d.experts * 4 <=
             48 * 1024 &&
         router_chain_smem(dim, d) <= 180 * 1024; // the rings beside the static 48 KB
}

KernelSource emit_norm_router_topk_chain(int dim, const RouterTopKDims& d, double eps, bool bias,
                                         const std::vector<std::string>& ir_lines) {
  if (!norm_router_topk_chain_fits(dim, d))
    throw Error(fmt::format("codegen: norm_router_topk_chain needs experts a multiple of 8 up "
                            "to 256, k <= experts, bf16 activations and K ranges dividing "
                            "dim / 64, one in the natural order (got {} experts, k {}, dim {}, {} "
                            "ranges)",
                            d.experts, d.k, dim, d.chain));
  const std::vector<Param> params = router_params(eps, bias);
  LaunchRule launch;
  launch.block = 256;
  launch.y_per_token = 1;
  launch.blocks_x = router_chain_blocks(d.experts, d.chain);
  launch.cluster_x = launch.blocks_x;
  launch.smem_fixed = router_chain_smem(dim, d);
  std::string name = fmt::format("rmsnorm_router_topk_chain_d{}_e{}_k{}{}{}_c{}{}", dim, d.experts,
                                 d.k, bias ? "" : "_nobias", attr_suffix("eps", eps, 1e-5), d.chain,
                                 d.chain_natural ? "_natural" : "");
  const std::string call =
      fmt::format("norm_router_topk_chain<{}, {}, {}, {}, {}, {}, {}{}>", dim, d.experts, d.k,
                  bias ? "true" : "false", launch.blocks_x, d.chain, router_chain_stages(dim, d),
                  d.chain_natural ? ", true" : "");
  return assemble(std::move(name), ir_lines, "linear_chain.cuh", call, params, launch,
                  DependencyWait::InCall);
}

} // namespace xserv::codegen
