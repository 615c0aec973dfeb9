// Instantiates attention_prefill (codegen/kernels/attention_prefill.cuh) for one attention op's
// static dimensions, in the style of emit.cpp's emit_attention_decode.
#include "codegen/emit_prefill.h"

#include "codegen/emit_detail.h"

#include "base/error.h"

#include <fmt/format.h>

#include <cmath>

namespace xserv::codegen {

using namespace detail;

namespace {

/// Mirrors attention_prefill.cuh (and attention_mma.cuh's kMmaAttn*): threads per block, query
/// rows per block, keys per tile.
constexpr int kPrefillThreads = 256, kPrefillRows = 128, kPrefillKeys = 64;

} // namespace

size_t attention_prefill_smem_bytes(int head_dim) {
  return 4 * ((static_cast<size_t>(kPrefillRows) * (head_dim + 4) + 256) +
              (static_cast<size_t>(kPrefillRows) * (kPrefillKeys + 4) + 256) +
              static_cast<size_t>(kPrefillKeys) * (head_dim + 4) +
              static_cast<size_t>(kPrefillKeys) * head_dim);
}

namespace {

/// Both prefill attention kernels: the same checks, parameters and grid (128 query rows a
/// block); `mma` picks attention_mma.cuh's tensor-core template.
KernelSource emit_prefill(const AttentionDims& d, const std::vector<std::string>& ir_lines,
                          bool mma) {
  check_positive("attention", {d.heads, d.kv_heads, d.head_dim, d.block, d.table});
  if (d.heads % d.kv_heads != 0 || kPrefillRows % (d.heads / d.kv_heads) != 0 ||
      d.head_dim % 16 != 0)
    throw Error(fmt::format("codegen: prefill attention needs heads ({}) divisible by kv_heads "
                            "({}) with a quotient dividing {}, and head_dim ({}) divisible by 16",
                            d.heads, d.kv_heads, kPrefillRows, d.head_dim));
  if (mma && (d.chunk <= 0 || d.chunk % 64 != 0))
    throw Error(fmt::format("codegen: the canonical attention order needs key chunks of a "
                            "positive multiple of 64, not {}",
                            d.chunk));
  const char* fn = mma ? "attention_prefill_mma" : "attention_prefill";
  std::string name = fmt::format("{}_h{}_g{}_d{}_b{}_m{}{}", fn, d.heads, d.kv_heads, d.head_dim,
                                 d.block, d.table, d.window ? fmt::format("_w{}", d.window) : "");
  std::vector<Param> params = attention_params(d);
  params.push_back({"float* out", "out"});
  params.push_back({"int tokens", "tokens"});
  LaunchRule launch;
  launch.block = kPrefillThreads;
  launch.blocks_x = d.kv_heads;
  launch.y_tile = kPrefillRows / (d.heads / d.kv_heads); // query tokens per block
  // SIMT: 105 KB of dynamic shared memory and at most 128 registers, two blocks an SM. MMA: 18 KB
  // static; two blocks' registers (<= 128 a thread) fit an SM.
  launch.smem_fixed = mma ? 0 : attention_prefill_smem_bytes(d.head_dim);
  launch.min_blocks_per_sm = 2;
  std::string call =
      fmt::format("{}<{}, {}, {}, {}, {}, {}{}{}>", fn, d.heads, d.kv_heads, d.head_dim, d.block,
                  d.table, d.window, mma ? fmt::format(", {}", d.chunk) : "",
                  d.f32_cache ? ", float" : "");
  if (mma)
    name += fmt::format("_c{}", d.chunk);
  if (d.f32_cache)
    name += "_kvf32";
  name += attr_suffix("scale", d.scale, 1.0 / std::sqrt(d.head_dim));
  return assemble(std::move(name), ir_lines, mma ? "attention_mma.cuh" : "attention_prefill.cuh",
                  call, params, launch);
}

} // namespace

KernelSource emit_attention_prefill(const AttentionDims& d,
                                    const std::vector<std::string>& ir_lines) {
  return emit_prefill(d, ir_lines, false);
}

KernelSource emit_attention_prefill_mma(const AttentionDims& d,
                                        const std::vector<std::string>& ir_lines) {
  return emit_prefill(d, ir_lines, true);
}

} // namespace xserv::codegen
