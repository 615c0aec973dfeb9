// Instantiates the tensor-core attention kernels of codegen/kernels/attention_mma.cuh
// (attention_prefill_mma, attention_decode_mma) for one attention op's static dimensions, in the
// style of emit.cpp's emit_attention_decode.
#include "codegen/emit_prefill.h"

#include "codegen/emit_detail.h"

#include "base/error.h"

#include <fmt/format.h>

#include <cmath>

namespace xserv::codegen {

using namespace detail;

namespace {

/// Mirrors attention_mma.cuh's kMmaAttnThreads and kMmaAttnRows: threads per block, query rows
/// per block.
constexpr int kPrefillThreads = 256, kPrefillRows = 128;

} // namespace

KernelSource emit_attention_prefill_mma(const AttentionDims& d,
                                        const std::vector<std::string>& ir_lines) {
  check_positive("attention", {d.heads, d.kv_heads, d.head_dim, d.block, d.table});
  if (d.heads % d.kv_heads != 0 || kPrefillRows % (d.heads / d.kv_heads) != 0 ||
      d.head_dim % 16 != 0)
    throw Error(fmt::format("codegen: prefill attention needs heads ({}) divisible by kv_heads "
                            "({}) with a quotient dividing {}, and head_dim ({}) divisible by 16",
                            d.heads, d.kv_heads, kPrefillRows, d.head_dim));
  check_chunk(d);
  std::string name = fmt::format("attention_prefill_mma_h{}_g{}_d{}_b{}_m{}{}_c{}", d.heads,
                                 d.kv_heads, d.head_dim, d.block, d.table,
                                 d.window ? fmt::format("_w{}", d.window) : "", d.chunk);
  std::vector<Param> params = attention_params(d);
  params.push_back({"float* out", "out"});
  params.push_back({"int tokens", "tokens"});
  LaunchRule launch;
  launch.block = kPrefillThreads;
  launch.blocks_x = d.kv_heads;
  launch.y_tile = kPrefillRows / (d.heads / d.kv_heads); // query tokens per block
  // 18 KB of static shared memory for the tiles and 32 KB (head_dim 64) of dynamic for the
  // rows' folded outputs (attention_prefill_mma_smem), two blocks' registers (<= 128 a thread)
  // an SM; with split operands twice the tiles and the q remainders: one block an SM.
  launch.smem_fixed = size_t(kPrefillThreads) * size_t(d.head_dim / 2) * 4;
  launch.min_blocks_per_sm = d.split ? 1 : 2;
  const std::string call = fmt::format(
      "attention_prefill_mma<{}, {}, {}, {}, {}, {}, {}, {}{}>", d.heads, d.kv_heads, d.head_dim,
      d.block, d.table, d.window, d.chunk, d.f32_cache ? "float" : "__nv_bfloat16",
      d.split ? ", true" : "");
  if (d.f32_cache)
    name += "_kvf32";
  if (d.split)
    name += "_x3";
  name += attr_suffix("scale", d.scale, 1.0 / std::sqrt(d.head_dim));
  return assemble(std::move(name), ir_lines, "attention_mma.cuh", call, params, launch);
}

KernelSource emit_attention_decode_mma(const AttentionDims& d,
                                       const std::vector<std::string>& ir_lines) {
  check_positive("attention", {d.heads, d.kv_heads, d.head_dim, d.block, d.table});
  check_chunk(d);
  if (d.heads % d.kv_heads != 0 || d.heads / d.kv_heads > 16 || d.head_dim % 16 != 0)
    throw Error(fmt::format("codegen: attention_decode_mma needs heads ({}) divisible by "
                            "kv_heads ({}) with at most 16 a kv head, and head_dim ({}) "
                            "divisible by 16",
                            d.heads, d.kv_heads, d.head_dim));
  std::string name =
      fmt::format("attention_decode_mma_h{}_g{}_d{}_b{}_m{}{}_c{}", d.heads, d.kv_heads, d.head_dim,
                  d.block, d.table, d.window ? fmt::format("_w{}", d.window) : "", d.chunk);
  std::vector<Param> params = attention_params(d);
  for (const char* n : {"out", "part_ml", "part_o"})
    params.push_back({fmt::format("float* {}", n), n});
  const int pairs = d.head_dim / 16; // attention_decode_mma_warps
  const int warps = d.decode_warps > 0 ? d.decode_warps
                    : pairs % 4 == 0   ? 4
                    : pairs % 2 == 0   ? 2
                                       : 1;
  if (pairs % warps != 0)
    throw Error(fmt::format("codegen: attention_decode_mma's {} warps must divide head_dim / 16 "
                            "({}): each takes whole pairs of output tiles",
                            warps, pairs));
  if (d.decode_warps > 0)
    name += fmt::format("_wp{}", warps);
  LaunchRule launch;
  launch.block = 32 * warps;
  launch.blocks_x = d.kv_heads;
  launch.y_per_token = 1;
  launch.z_splits = true;
  // SPLIT and WARPS only where set (the lowering's kernels keep their text)
  const std::string tail = d.decode_warps > 0 ? fmt::format(", {}, {}", d.split, warps)
                           : d.split          ? ", true"
                                              : "";
  std::string call = fmt::format("attention_decode_mma<{}, {}, {}, {}, {}, {}, {}, {}{}>", d.heads,
                                 d.kv_heads, d.head_dim, d.block, d.table, d.window, d.chunk,
                                 d.f32_cache ? "float" : "__nv_bfloat16", tail);
  if (d.f32_cache)
    name += "_kvf32";
  if (d.split)
    name += "_x3";
  if (static_cast<float>(d.scale) != static_cast<float>(1.0 / std::sqrt(d.head_dim)))
    name += attr_suffix("scale", d.scale, 1.0 / std::sqrt(d.head_dim));
  // The kernel waits for the previous one itself, after staging its first tile's cached keys.
  return assemble(std::move(name), ir_lines, "attention_mma.cuh", call, params, launch,
                  DependencyWait::InCall);
}

} // namespace xserv::codegen
