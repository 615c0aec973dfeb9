// Instantiates the kernel templates of codegen/kernels/*.cuh for one op's static dimensions.
#include "codegen/emit.h"
#include "codegen/emit_detail.h"

#include "base/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace xserv::codegen {

namespace detail {

std::string float_literal(double v) {
  const float f = static_cast<float>(v);
  if (!std::isfinite(f))
    throw Error(fmt::format("codegen: attribute value {} is not a finite float", v));
  std::string s = fmt::format("{}", f); // shortest text that reads back as f
  if (s.find_first_of(".e") == std::string::npos)
    s += ".0";
  return s + "f";
}

std::string attr_suffix(const char* tag, double v, double usual) {
  if (static_cast<float>(v) == static_cast<float>(usual))
    return "";
  // The value's fp32 bits in hex: kernel names must be C identifiers ("1e-06f" is not).
  return fmt::format("_{}{:08x}", tag, std::bit_cast<uint32_t>(static_cast<float>(v)));
}

KernelSource assemble(std::string name, const std::vector<std::string>& ir_lines,
                      const std::string& header, const std::string& call,
                      const std::vector<Param>& params, LaunchRule launch, DependencyWait wait) {
  std::string src = fmt::format("// kernel: {}\n", name);
  for (const std::string& line : ir_lines)
    src += fmt::format("// {}\n", line);
  std::string gy = launch.y_per_token ? fmt::format("tokens * {}", launch.y_per_token) : "1";
  if (launch.y_tile)
    gy = fmt::format("ceil({} / {}){}", launch.y_per_token > 1 ? gy : "tokens", launch.y_tile,
                     launch.y_extra ? fmt::format(" + {}", launch.y_extra) : "");
  src += fmt::format("// launch: block {}, grid ({}, {}, {}), dynamic smem ", launch.block,
                     launch.blocks_x, gy, launch.z_splits ? "splits" : "1");
  src += launch.smem_fixed ? fmt::format("{} bytes\n", launch.smem_fixed)
                           : fmt::format("{} bytes per token\n", launch.smem_per_token);
  src += fmt::format("#include \"xserv_kernels/{}\"\n\n", header);
  const std::string bounds = launch.min_blocks_per_sm > 0
                                 ? fmt::format("{}, {}", launch.block, launch.min_blocks_per_sm)
                                 : fmt::format("{}", launch.block);
  const std::string cluster =
      launch.cluster_x > 1 ? fmt::format(" XSERV_CLUSTER_X({})", launch.cluster_x) : "";
  src += fmt::format("extern \"C\" __global__ void __launch_bounds__({}){} {}(", bounds, cluster,
                     name);
  std::vector<std::string> decls, args;
  for (const Param& p : params) {
    if (!p.decl.empty()) // a literal or nullptr argument has no kernel parameter
      decls.push_back(p.decl);
    args.push_back(p.arg);
  }
  src += fmt::format(
      "\n    {}) {{\n  {}xserv_kernels::{}(\n      {});\n}}\n", fmt::join(decls, ",\n    "),
      wait == DependencyWait::Wrapper ? "xserv_kernels::grid_dependency_sync();\n  " : "", call,
      fmt::join(args, ", "));
  return {std::move(name), std::move(src), std::move(decls), launch};
}

void check_positive(const char* what, std::initializer_list<int> dims) {
  for (int d : dims)
    if (d <= 0)
      throw Error(fmt::format("codegen: {} needs positive dimensions", what));
}

void check_chunk(const AttentionDims& d) {
  if (d.chunk <= 0 || d.chunk % 64 != 0)
    throw Error(fmt::format("codegen: the canonical attention order needs key chunks of a "
                            "positive multiple of 64, not {}",
                            d.chunk));
}

std::vector<Param> qkv_params(const QkvDims& d) {
  std::vector<Param> params = {
      {"const float* x", "x"}, {fmt::format("{} ln", kBf16), "ln"}, {"", float_literal(d.eps)}};
  for (const char* n : {"q", "k", "v"}) {
    params.push_back({fmt::format("{} w{}", kBf16, n), fmt::format("w{}", n)});
    params.push_back({fmt::format("{} b{}", kBf16, n), fmt::format("b{}", n)});
  }
  for (const char* n : {"q", "k", "v"})
    params.push_back({fmt::format("float* y{}", n), fmt::format("y{}", n)});
  params.push_back({"int tokens", "tokens"});
  if (d.head_dim > 0) {
    const std::string cache_t = d.f32_cache ? "float" : "__nv_bfloat16";
    for (const char* n : {"positions", "token_seq", "block_table"})
      params.push_back({fmt::format("const int* {}", n), n});
    params.push_back({"const double* inv_freq", "inv_freq"});
    params.push_back({"", fmt::format("{:.17g}", d.attention_factor)});
    params.push_back({cache_t + "* k_cache", "k_cache"});
    params.push_back({cache_t + "* v_cache", "v_cache"});
  }
  return params;
}

std::vector<Param> router_params(double eps, bool bias) {
  std::vector<Param> params = {{"const float* x", "x"},
                               {fmt::format("{} ln", kBf16), "ln"},
                               {"", float_literal(eps)},
                               {fmt::format("{} w", kBf16), "w"}};
  params.push_back(bias ? Param{fmt::format("{} b", kBf16), "b"} : Param{"", "nullptr"});
  for (const char* p : {"float* xn", "float* weights", "int* ids"})
    params.push_back({p, std::string(p).substr(std::string(p).find(' ') + 1)});
  return params;
}

std::vector<Param> attention_params(const AttentionDims& d) {
  std::vector<Param> params;
  for (const char* n : {"q", "k", "v"})
    params.push_back({fmt::format("const float* {}", n), n});
  const char* cache_t = d.f32_cache ? "const float*" : kBf16;
  for (const char* n : {"k_cache", "v_cache"})
    params.push_back({fmt::format("{} {}", cache_t, n), n});
  params.push_back({fmt::format("{} sinks", kBf16), "sinks"});
  for (const char* n : {"positions", "token_seq", "ctx_lens", "block_table"})
    params.push_back({fmt::format("const int* {}", n), n});
  params.push_back({"", float_literal(d.scale)});
  return params;
}

std::string expert_param(bool mxfp4, const char* name) {
  return mxfp4 ? fmt::format("const unsigned char* {}", name) : fmt::format("{} {}", kBf16, name);
}

void round_act(bool round, std::string& name, std::string& call) {
  if (!round)
    return;
  name += "_a16";
  call.insert(call.rfind('>'), ", true");
}

} // namespace detail

using namespace detail;

namespace {

/// Name suffix of a decode GEMV's non-default tuning: most tokens, rows per warp, loads in
/// flight, K splits.
std::string gemv_tuning_suffix(int max_tokens, int rows, int unroll, int ksplit) {
  std::string s;
  if (max_tokens != 8)
    s += fmt::format("_t{}", max_tokens);
  if (rows > 0)
    s += fmt::format("_r{}", rows);
  if (unroll != 4)
    s += fmt::format("_u{}", unroll);
  if (ksplit != 1)
    s += fmt::format("_s{}", ksplit);
  return s;
}

} // namespace

std::array<unsigned, 3> LaunchRule::grid(int tokens, int splits) const {
  int gy = y_per_token ? tokens * y_per_token : 1;
  if (y_tile > 0)
    gy = (tokens * std::max(1, y_per_token) + y_tile - 1) / y_tile + y_extra;
  return {static_cast<unsigned>(blocks_x), static_cast<unsigned>(gy),
          static_cast<unsigned>(z_splits ? splits : blocks_z)};
}

int attention_splits(int max_keys) {
  return std::clamp((max_keys + 63) / 64, 1, 32);
}

namespace {

/// The decode GEMVs' warps per row group (K splits): 1, 2, 4 or 8.
bool valid_ksplit(int ksplit) {
  return ksplit == 1 || ksplit == 2 || ksplit == 4 || ksplit == 8;
}

/// Rows one block of a decode GEMV (8 warps) computes: 8 / ksplit row groups of `rows`.
int gemv_block_rows(int rows, int ksplit) {
  return 8 / ksplit * rows;
}

/// qkv_decode's rows per warp (0: 2).
int qkv_rows(const QkvDims& d) {
  return d.rows > 0 ? d.rows : 2;
}

} // namespace

namespace {
/// linear_decode_mma's tiling, defaults filled in.
std::array<int, 3> linear_mma_tiling(const LinearDims& d) {
  return {d.mma_groups > 0 ? d.mma_groups : 2, d.mma_splits > 0 ? d.mma_splits : 8,
          d.mma_stages > 0 ? d.mma_stages : 4};
}
} // namespace

bool linear_mma_fits(const LinearDims& d) {
  const auto [groups, splits, stages] = linear_mma_tiling(d);
  const size_t ring = size_t(groups) * splits * stages * 2048;
  const size_t xs = size_t(d.max_tokens) * (size_t(d.k) / 2 + 4) * 4;
  return !d.norm && d.round_act && d.k > 0 && d.k % 64 == 0 && d.n > 0 &&
         d.n % (16 * groups) == 0 && d.max_tokens >= 1 && d.max_tokens <= 8 && stages >= 2 &&
         32 * groups * splits <= 1024 && ring + xs <= 200 * 1024 &&
         (!d.mma_chain || (d.k / 64) % splits == 0) && !(d.mma_chain && d.mma_natural);
}

bool linear_smem_chain_fits(const LinearDims& d) {
  return d.smem && d.round_act && d.mma_splits == 8 && d.k % (64 * 8) == 0 &&
         linear_smem_rows(d) > 0;
}

int linear_smem_rows(const LinearDims& d, int sms) {
  if (d.norm || d.max_tokens != 1 || d.k <= 0 || d.k % 8 != 0 || d.n <= 0)
    return 0;
  for (int rows = 8; rows <= 256 && size_t(rows) * size_t(d.k) * 2 <= 200 * 1024; rows += 8)
    if (d.n % rows == 0 && d.n / rows <= sms)
      return rows;
  return 0;
}

KernelSource emit_linear(const LinearDims& d, const std::vector<std::string>& ir_lines) {
  check_positive("linear", {d.k, d.n, d.max_tokens});
  if (d.k % 8 != 0)
    throw Error(fmt::format("codegen: linear needs K divisible by 8, got {}", d.k));
  if (d.max_tokens > 8)
    throw Error(
        fmt::format("codegen: decode linear takes at most 8 tokens, asked {}", d.max_tokens));
  const int rows = d.rows > 0 ? d.rows : d.n % 2 == 0 ? 2 : 1; // rows per warp
  if (d.n % rows != 0 || d.unroll < 1 || !valid_ksplit(d.ksplit))
    throw Error(fmt::format("codegen: linear tuning rows {} unroll {} K splits {} do not fit N {}",
                            rows, d.unroll, d.ksplit, d.n));
  std::string name = fmt::format(
      "{}linear{}_k{}_n{}{}{}{}{}", d.norm ? "rmsnorm_" : "", d.residual ? "_residual" : "", d.k,
      d.n, d.bias ? "" : "_nobias", d.norm ? attr_suffix("eps", d.eps, 1e-5) : "",
      d.prefetch ? "_pf" : "", gemv_tuning_suffix(d.max_tokens, d.rows, d.unroll, d.ksplit));
  std::vector<Param> params = {{"const float* x", "x"}};
  params.push_back(d.norm ? Param{fmt::format("{} ln", kBf16), "ln"} : Param{"", "nullptr"});
  params.push_back({"", float_literal(d.eps)});
  params.push_back({fmt::format("{} w", kBf16), "w"});
  params.push_back(d.bias ? Param{fmt::format("{} b", kBf16), "b"} : Param{"", "nullptr"});
  params.push_back(d.residual ? Param{"const float* h", "h"} : Param{"", "nullptr"});
  params.push_back({"float* y", "y"});
  params.push_back({"int tokens", "tokens"});
  LaunchRule launch;
  const int block_rows = gemv_block_rows(rows, d.ksplit);
  launch.blocks_x = (d.n + block_rows - 1) / block_rows;
  launch.smem_per_token = static_cast<size_t>(d.k) * sizeof(float);
  launch.max_tokens = d.max_tokens;
  std::string call =
      fmt::format("linear_decode<{}, {}, {}, {}, {}, {}, {}, {}, {}, {}>", d.k, d.n, d.max_tokens,
                  rows, d.norm, d.bias, d.residual, d.prefetch, d.unroll, d.ksplit);
  if (d.mma_natural && !d.mma)
    throw Error("codegen: the natural K order is the tensor-core linear's (mma)");
  if (d.mma) {
    if (!linear_mma_fits(d))
      throw Error(fmt::format("codegen: the tensor-core linear takes bf16 activations, no norm, K "
                              "a multiple of 64 and N of its row groups (K {}, N {}; the "
                              "canonical order: K splits dividing K / 64; one K order)",
                              d.k, d.n));
    const auto [groups, splits, stages] = linear_mma_tiling(d);
    name =
        fmt::format("linear{}_k{}_n{}{}_t{}_mma_g{}_s{}_r{}_a16{}{}", d.residual ? "_residual" : "",
                    d.k, d.n, d.bias ? "" : "_nobias", d.max_tokens, groups, splits, stages,
                    d.mma_chain ? "_chain" : "", d.mma_natural ? "_natural" : "");
    launch.block = 32 * groups * splits;
    launch.blocks_x = d.n / (16 * groups);
    launch.smem_fixed = size_t(groups) * splits * stages * 2048;
    launch.smem_per_token = (size_t(d.k) / 2 + 4) * 4;
    call = fmt::format("linear_decode_mma<{}, {}, {}, {}, {}, {}, {}, {}, {}{}>", d.k, d.n,
                       d.max_tokens, groups, splits, stages, d.bias, d.residual, d.mma_chain,
                       d.mma_natural ? ", true" : "");
    return assemble(std::move(name), ir_lines, "linear.cuh", call, params, launch,
                    DependencyWait::InCall);
  }
  if (d.smem) {
    const int block_rows = linear_smem_rows(d);
    if (block_rows == 0)
      throw Error(fmt::format("codegen: the shared-memory linear takes one token, no norm and a "
                              "block's rows in 200 KiB on at most 132 SMs (K {}, N {})",
                              d.k, d.n));
    name = fmt::format("linear{}_k{}_n{}{}_t1_smem_r{}", d.residual ? "_residual" : "", d.k, d.n,
                       d.bias ? "" : "_nobias", block_rows);
    launch.blocks_x = d.n / block_rows;
    launch.smem_fixed = size_t(block_rows) * size_t(d.k) * 2;
    launch.smem_per_token = 0;
    call = fmt::format("linear_decode_smem<{}, {}, {}, {}, {}>", d.k, d.n, block_rows, d.bias,
                       d.residual);
    if (d.mma_chain) { // the canonical order: 8 K splits, the token staged after the rows
      if (!linear_smem_chain_fits(d))
        throw Error(fmt::format("codegen: the shared-memory linear in the canonical order takes "
                                "bf16 activations and 8 K splits of whole 64-value tiles (K {}, "
                                "splits {})",
                                d.k, d.mma_splits));
      launch.smem_fixed += size_t(d.k) * 2;
      call = fmt::format("linear_decode_smem<{}, {}, {}, {}, {}, true, true>", d.k, d.n, block_rows,
                         d.bias, d.residual);
      name += "_a16_chain";
      return assemble(std::move(name), ir_lines, "linear.cuh", call, params, launch,
                      DependencyWait::InCall);
    }
  }
  round_act(d.round_act, name, call);
  return assemble(std::move(name), ir_lines, "linear.cuh", call, params, launch,
                  DependencyWait::InCall);
}

bool qkv_decode_fits(const QkvDims& d) {
  if (!valid_ksplit(d.ksplit))
    return false;
  const int block_rows = gemv_block_rows(qkv_rows(d), d.ksplit);
  const bool rope_fits = d.head_dim == 0 || (d.head_dim > 0 && qkv_rows(d) == 2 && d.ksplit == 1 &&
                                             d.head_dim % 16 == 0 && d.nq % d.head_dim == 0 &&
                                             d.nk % d.head_dim == 0 && d.nv % d.head_dim == 0 &&
                                             d.block > 0 && d.table > 0);
  return rope_fits && d.k > 0 && d.k % 8 == 0 && d.nq > 0 && d.nk > 0 && d.nv > 0 &&
         d.nq % block_rows == 0 && d.nk % block_rows == 0 && d.nv % block_rows == 0 &&
         d.max_tokens >= 1 && d.max_tokens <= 8 && d.unroll >= 1;
}

KernelSource emit_qkv_decode(const QkvDims& d, const std::vector<std::string>& ir_lines) {
  if (!qkv_decode_fits(d))
    throw Error(fmt::format("codegen: qkv_decode needs K % 8 == 0, q/k/v widths that are "
                            "multiples of a block's rows (8 x rows per warp / K splits), 1 to 8 "
                            "tokens and K splits of 1, 2, 4 or 8; got K {}, {}/{}/{}, rows {}, "
                            "K splits {}",
                            d.k, d.nq, d.nk, d.nv, qkv_rows(d), d.ksplit));
  const int rows = qkv_rows(d);
  const bool rope = d.head_dim > 0;
  std::string name = fmt::format("qkv{}_decode_k{}_q{}_k{}_v{}{}{}", rope ? "_rope" : "", d.k, d.nq,
                                 d.nk, d.nv, attr_suffix("eps", d.eps, 1e-5),
                                 gemv_tuning_suffix(d.max_tokens, d.rows, d.unroll, d.ksplit));
  const std::string cache_t = d.f32_cache ? "float" : "__nv_bfloat16";
  if (rope)
    name += fmt::format("_d{}_b{}_m{}_kv{}", d.head_dim, d.block, d.table,
                        d.f32_cache ? "f32" : "bf16") +
            attr_suffix("att", d.attention_factor, 1.3465735902799727);
  const std::vector<Param> params = qkv_params(d);
  LaunchRule launch;
  launch.blocks_x = (d.nq + d.nk + d.nv) / gemv_block_rows(rows, d.ksplit);
  launch.smem_per_token = static_cast<size_t>(d.k) * sizeof(float);
  launch.max_tokens = d.max_tokens;
  std::string call =
      rope ? fmt::format("qkv_rope_decode<{}, {}, {}, {}, {}, {}, {}, {}, {}, {}>", d.k, d.nq, d.nk,
                         d.nv, d.head_dim, d.block, d.table, cache_t, d.max_tokens, d.unroll)
           : fmt::format("qkv_decode<{}, {}, {}, {}, {}, {}, {}, {}>", d.k, d.nq, d.nk, d.nv,
                         d.max_tokens, rows, d.unroll, d.ksplit);
  round_act(d.round_act, name, call);
  return assemble(std::move(name), ir_lines, "linear.cuh", call, params, launch,
                  DependencyWait::InCall);
}

KernelSource emit_attention_decode(const AttentionDims& d,
                                   const std::vector<std::string>& ir_lines) {
  check_positive("attention", {d.heads, d.kv_heads, d.head_dim, d.block, d.table});
  if (d.heads % d.kv_heads != 0 || d.head_dim % 8 != 0)
    throw Error(fmt::format("codegen: attention needs heads ({}) divisible by kv_heads ({}) and "
                            "head_dim ({}) divisible by 8",
                            d.heads, d.kv_heads, d.head_dim));
  std::string name =
      fmt::format("attention_decode_h{}_g{}_d{}_b{}_m{}{}", d.heads, d.kv_heads, d.head_dim,
                  d.block, d.table, d.window ? fmt::format("_w{}", d.window) : "");
  std::vector<Param> params = attention_params(d);
  for (const char* n : {"out", "part_ml", "part_o"})
    params.push_back({fmt::format("float* {}", n), n});
  LaunchRule launch;
  launch.blocks_x = d.kv_heads;
  launch.y_per_token = 1;
  launch.z_splits = true;
  std::string call =
      fmt::format("attention_decode<{}, {}, {}, {}, {}, {}{}>", d.heads, d.kv_heads, d.head_dim,
                  d.block, d.table, d.window, d.f32_cache ? ", float" : "");
  if (d.f32_cache)
    name += "_kvf32";
  if (static_cast<float>(d.scale) != static_cast<float>(1.0 / std::sqrt(d.head_dim)))
    name += attr_suffix("scale", d.scale, 1.0 / std::sqrt(d.head_dim));
  return assemble(std::move(name), ir_lines, "attention.cuh", call, params, launch,
                  DependencyWait::InCall);
}

namespace {

/// A combine kernel `fn` of header `header` (attention_combine, attention_combine_chunks): one
/// block of head_dim threads per (head, token), parameters part_ml, part_o, sinks, splits, out.
KernelSource emit_combine(const AttentionDims& d, const std::vector<std::string>& ir_lines,
                          const char* fn, const char* header) {
  check_positive("attention", {d.heads, d.head_dim});
  std::string name = fmt::format("{}_h{}_d{}", fn, d.heads, d.head_dim);
  std::vector<Param> params = {{"const float* part_ml", "part_ml"},
                               {"const float* part_o", "part_o"},
                               {fmt::format("{} sinks", kBf16), "sinks"},
                               {"int splits", "splits"},
                               {"float* out", "out"}};
  LaunchRule launch;
  launch.block = d.head_dim;
  launch.blocks_x = d.heads;
  launch.y_per_token = 1;
  return assemble(std::move(name), ir_lines, header,
                  fmt::format("{}<{}, {}>", fn, d.heads, d.head_dim), params, launch);
}

} // namespace

KernelSource emit_attention_combine(const AttentionDims& d,
                                    const std::vector<std::string>& ir_lines) {
  return emit_combine(d, ir_lines, "attention_combine", "attention.cuh");
}

KernelSource emit_attention_combine_chunks(const AttentionDims& d,
                                           const std::vector<std::string>& ir_lines) {
  return emit_combine(d, ir_lines, "attention_combine_chunks", "attention_mma.cuh");
}

namespace {

/// Mirrors gemm.cuh's tile constants and gemm_smem_bytes().
constexpr int kGemmBN = 128, kGemmBK = 64, kGemmStride = kGemmBK + 8;

size_t gemm_smem_bytes(int bm, bool mxfp4) {
  const size_t stages = bm == 128 ? 2 : bm == 32 ? 4 : 3;
  const size_t a = size_t(bm) * kGemmStride * 4, w = size_t(kGemmBN) * kGemmStride * 2;
  const size_t raw = size_t(kGemmBN) * (kGemmBK / 2 + 8); // blocks and two scale words per row
  return mxfp4 ? stages * (a + raw) + w : stages * (a + w);
}

} // namespace

size_t moe_tiles_ints(int pairs, int experts, int bm) {
  return 1 + 3 * static_cast<size_t>((pairs + bm - 1) / bm + experts);
}

KernelSource emit_gemm(const GemmDims& d, const std::vector<std::string>& ir_lines) {
  check_positive("gemm", {d.k, d.n, d.experts, d.ksel});
  if (d.k % kGemmBK != 0)
    throw Error(fmt::format("codegen: gemm needs K divisible by {}, got {}", kGemmBK, d.k));
  if (d.n % 2 != 0)
    throw Error(fmt::format("codegen: gemm needs an even N, got {}", d.n));
  if (d.bm != 32 && d.bm != 64 && d.bm != 128)
    throw Error(fmt::format("codegen: gemm tile rows must be 32, 64 or 128, got {}", d.bm));
  if (d.gather && !d.grouped)
    throw Error("codegen: a gathering gemm must be grouped");
  if (d.epilogue == GemmEpilogue::Scatter && !d.grouped)
    throw Error("codegen: a scattering gemm must be grouped");
  if (d.grouped && (d.norm || d.residual))
    throw Error("codegen: a grouped gemm has no norm or residual");
  if (d.splitk < 1 || (d.splitk > 1 && (d.grouped || (d.k / kGemmBK) % d.splitk != 0)))
    throw Error(fmt::format("codegen: split K {} must divide the {} K tiles of a dense gemm",
                            d.splitk, d.k / kGemmBK));
  static const char* epi_name[] = {"store", "swiglu", "scatter"};
  const int epi = static_cast<int>(d.epilogue);
  std::string name =
      fmt::format("gemm_{}{}{}_k{}_n{}_m{}{}", epi_name[epi], d.norm ? "_norm" : "",
                  d.residual ? "_residual" : "", d.k, d.n, d.bm, d.bias ? "" : "_nobias");
  if (d.grouped)
    name += fmt::format("_e{}_k{}{}", d.experts, d.ksel, d.gather ? "_gather" : "");
  if (d.epilogue == GemmEpilogue::Swiglu)
    name += attr_suffix("limit", d.limit, 7.0) + attr_suffix("alpha", d.alpha, 1.702);
  name += d.split ? "_x2" : "_bf16";
  if (d.splitk > 1)
    name += fmt::format("_splitk{}", d.splitk);
  if (d.mxfp4)
    name += "_mx4";
  std::vector<Param> params = {{"const float* x", "x"},
                               {"const float* inv_rms", "inv_rms"},
                               {fmt::format("{} ln", kBf16), "ln"},
                               {expert_param(d.mxfp4, "w"), "w"},
                               {fmt::format("{} b", kBf16), "b"},
                               {"const float* h", "h"},
                               {"float* y", "y"},
                               {"const int* pair", "pair"},
                               {"const int* tiles", "tiles"},
                               {"const float* route_w", "route_w"},
                               {"", float_literal(d.limit)},
                               {"", float_literal(d.alpha)},
                               {"int tokens", "tokens"}};
  LaunchRule launch;
  launch.blocks_x = (d.n + kGemmBN - 1) / kGemmBN;
  launch.y_tile = d.bm;
  if (d.grouped) {
    launch.y_per_token = d.ksel;
    launch.y_extra = d.experts;
  }
  launch.smem_fixed = gemm_smem_bytes(d.bm, d.mxfp4);
  launch.blocks_z = d.splitk;
  std::string call = fmt::format(
      "gemm_bf16<{}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}>", d.k, d.n, d.bm, d.norm,
      d.bias, d.residual, epi, d.grouped, d.gather, d.ksel, d.split, d.splitk, d.mxfp4, d.experts);
  return assemble(std::move(name), ir_lines, "gemm.cuh", call, params, launch);
}

int gemm_splitk(int k, int n, int sms) {
  const int ktiles = k / kGemmBK, ntiles = (n + kGemmBN - 1) / kGemmBN;
  if (k % kGemmBK != 0 || ntiles >= 2 * sms)
    return 1;
  // A block's time ~ its K tiles; the launch's ~ waves (2 blocks per SM: every row tile's
  // pipeline takes 110.6 KB of shared memory) x K tiles per block. Split-K launches have one row
  // tile (32-row tiles up to 32 rows, 64-row tiles up to 64), so blocks = N tiles x split. The
  // fewest waves x tiles wins, ties to the smaller split (less partial-sum traffic): 4096 x 2880
  // takes 8 (184 blocks, one wave of 8 tiles) rather than 16 (368 blocks: two waves of 4).
  const int slots = 2 * sms;
  int best = 1, best_cost = ((ntiles + slots - 1) / slots) * ktiles;
  for (int s = 2; s <= 16 && ktiles / s >= 4; ++s) {
    if (ktiles % s != 0)
      continue;
    const int cost = ((ntiles * s + slots - 1) / slots) * (ktiles / s);
    if (cost < best_cost) {
      best = s;
      best_cost = cost;
    }
  }
  return best;
}

KernelSource emit_gemm_splitk_reduce(int n, int splitk, bool bias, bool residual,
                                     const std::vector<std::string>& ir_lines) {
  check_positive("gemm_splitk_reduce", {n, splitk});
  std::vector<Param> params = {{"const float* part", "part"},
                               {fmt::format("{} b", kBf16), "b"},
                               {"const float* h", "h"},
                               {"float* y", "y"},
                               {"int tokens", "tokens"}};
  return assemble(fmt::format("gemm_splitk_reduce_n{}_s{}{}{}", n, splitk, bias ? "" : "_nobias",
                              residual ? "_residual" : ""),
                  ir_lines, "gemm.cuh",
                  fmt::format("gemm_splitk_reduce<{}, {}, {}, {}>", n, splitk, bias, residual),
                  params, LaunchRule{.blocks_x = (n + 255) / 256, .y_per_token = 1});
}

KernelSource emit_moe_sort(const MoeSortDims& d, const std::vector<std::string>& ir_lines) {
  check_positive("moe_sort", {d.experts, d.k, d.bm, d.max_pairs});
  std::vector<Param> params = {{"const int* ids", "ids"},
                               {"int* pair", "pair"},
                               {"int* tiles", "tiles"},
                               {"int tokens", "tokens"}};
  LaunchRule launch;
  launch.max_tokens = d.max_pairs / d.k;
  return assemble(fmt::format("moe_sort_e{}_k{}_m{}_p{}", d.experts, d.k, d.bm, d.max_pairs),
                  ir_lines, "gemm.cuh",
                  fmt::format("moe_sort<{}, {}, {}, {}>", d.experts, d.k, d.bm, d.max_pairs),
                  params, launch);
}

namespace {

/// A launch rule of the small per-row kernels: `threads` per block, one block per row.
LaunchRule per_row(int threads) {
  LaunchRule launch;
  launch.block = threads;
  launch.y_per_token = 1;
  return launch;
}

} // namespace

KernelSource emit_embedding(const EmbeddingDims& d, const std::vector<std::string>& ir_lines) {
  check_positive("embedding", {d.vocab, d.dim});
  std::vector<Param> params = {
      {fmt::format("{} table", kBf16), "table"}, {"const int* ids", "ids"}, {"float* out", "out"}};
  return assemble(fmt::format("embedding_v{}_d{}", d.vocab, d.dim), ir_lines, "gather.cuh",
                  fmt::format("embedding_gather<{}, {}>", d.vocab, d.dim), params, per_row(256));
}

KernelSource emit_rope_yarn(const RopeDims& d, const std::vector<std::string>& ir_lines) {
  check_positive("rope_yarn", {d.heads, d.head_dim});
  if (d.head_dim % 2 != 0)
    throw Error(fmt::format("codegen: rope_yarn needs an even head_dim, got {}", d.head_dim));
  if (!std::isfinite(d.attention_factor))
    throw Error("codegen: rope_yarn's attention factor is not finite");
  const double usual = 0.1 * std::log(32.0) + 1.0; // gpt-oss: factor 32
  std::string name = fmt::format("rope_yarn_h{}_d{}", d.heads, d.head_dim);
  if (d.attention_factor != usual)
    name += fmt::format("_a{}", std::llround(d.attention_factor * 1e9));
  std::vector<Param> params = {{"const float* x", "x"},
                               {"const int* positions", "positions"},
                               {"const double* inv_freq", "inv_freq"},
                               {"", fmt::format("{:.17g}", d.attention_factor)},
                               {"float* y", "y"}};
  return assemble(std::move(name), ir_lines, "rope.cuh",
                  fmt::format("rope_yarn<{}, {}>", d.heads, d.head_dim), params, per_row(256));
}

KernelSource emit_rope_yarn_qk(int hq, int hk, int head_dim, double attention_factor,
                               const std::vector<std::string>& ir_lines) {
  check_positive("rope_yarn", {hq, hk, head_dim});
  if (head_dim % 2 != 0)
    throw Error(fmt::format("codegen: rope_yarn needs an even head_dim, got {}", head_dim));
  if (!std::isfinite(attention_factor))
    throw Error("codegen: rope_yarn's attention factor is not finite");
  const double usual = 0.1 * std::log(32.0) + 1.0;
  std::string name = fmt::format("rope_yarn_qk_q{}_k{}_d{}", hq, hk, head_dim);
  if (attention_factor != usual)
    name += fmt::format("_a{}", std::llround(attention_factor * 1e9));
  std::vector<Param> params = {{"float* q", "q"},
                               {"float* k", "k"},
                               {"const int* positions", "positions"},
                               {"const double* inv_freq", "inv_freq"},
                               {"", fmt::format("{:.17g}", attention_factor)}};
  LaunchRule launch = per_row(256); // a block per 256 rotations of the token's heads
  launch.blocks_x = ((hq + hk) * (head_dim / 2) + 255) / 256;
  return assemble(std::move(name), ir_lines, "rope.cuh",
                  fmt::format("rope_yarn_qk<{}, {}, {}>", hq, hk, head_dim), params, launch);
}

KernelSource emit_rope_yarn_qk_kv(int hq, int hk, int head_dim, double attention_factor, int block,
                                  int table, bool f32_cache,
                                  const std::vector<std::string>& ir_lines) {
  KernelSource base = emit_rope_yarn_qk(hq, hk, head_dim, attention_factor, ir_lines);
  check_positive("rope_yarn_qk_kv", {block, table});
  const std::string cache_t = f32_cache ? "float" : "__nv_bfloat16";
  std::string name = base.name;
  name.replace(0, std::string("rope_yarn_qk").size(), "rope_yarn_qk_kv");
  name += fmt::format("_b{}_m{}_kv{}", block, table, f32_cache ? "f32" : "bf16");
  std::vector<Param> params = {{"float* q", "q"},
                               {"float* k", "k"},
                               {"const float* v", "v"},
                               {"const int* positions", "positions"},
                               {"const int* token_seq", "token_seq"},
                               {"const int* block_table", "block_table"},
                               {"const double* inv_freq", "inv_freq"},
                               {"", fmt::format("{:.17g}", attention_factor)},
                               {cache_t + "* k_cache", "k_cache"},
                               {cache_t + "* v_cache", "v_cache"}};
  return assemble(std::move(name), ir_lines, "rope.cuh",
                  fmt::format("rope_yarn_qk_kv<{}, {}, {}, {}, {}, {}>", hq, hk, head_dim, block,
                              table, cache_t),
                  params, base.launch);
}

KernelSource emit_kv_write(const KvWriteDims& d, const std::vector<std::string>& ir_lines) {
  check_positive("kv_write", {d.kv_heads, d.head_dim, d.block, d.table});
  std::vector<Param> params = {{d.f32_cache ? "float* cache" : "__nv_bfloat16* cache", "cache"},
                               {"const float* x", "x"},
                               {"const int* positions", "positions"},
                               {"const int* token_seq", "token_seq"},
                               {"const int* block_table", "block_table"}};
  return assemble(fmt::format("kv_write_g{}_d{}_b{}_m{}{}{}", d.kv_heads, d.head_dim, d.block,
                              d.table, d.window ? fmt::format("_w{}", d.window) : "",
                              d.f32_cache ? "_kvf32" : ""),
                  ir_lines, "gather.cuh",
                  fmt::format("kv_write<{}, {}, {}, {}{}>", d.kv_heads * d.head_dim, d.block,
                              d.table, d.window, d.f32_cache ? ", float" : ""),
                  params, per_row(256));
}

KernelSource emit_router_topk(const RouterTopKDims& d, const std::vector<std::string>& ir_lines) {
  check_positive("router_topk", {d.experts, d.k});
  if (d.k > d.experts)
    throw Error(fmt::format("codegen: router_topk selects {} of only {} experts", d.k, d.experts));
  std::vector<Param> params = {
      {"const float* logits", "logits"}, {"float* weights", "weights"}, {"int* ids", "ids"}};
  return assemble(fmt::format("router_topk_e{}_k{}", d.experts, d.k), ir_lines, "router.cuh",
                  fmt::format("router_topk<{}, {}>", d.experts, d.k), params, per_row(32));
}

int router_cluster_blocks(int experts) {
  const int pairs = experts / 2;
  int c = 1;
  for (int d = 1; d <= 8; ++d)
    if (pairs % d == 0)
      c = d;
  return c;
}

int router_ksplit(int experts) {
  const int pairs = experts / 2 / router_cluster_blocks(experts);
  int ks = 1;
  while (ks < 8 && pairs * ks * 2 <= 8)
    ks *= 2;
  return ks;
}

bool norm_router_topk_fits(int dim, const RouterTopKDims& d) {
  return dim > 0 && d.experts > 0 && d.k > 0 && d.k <= d.experts && d.experts % 2 == 0 &&
         d.experts <= 256 && dim % 8 == 0;
}

KernelSource emit_norm_router_topk(int dim, const RouterTopKDims& d, double eps, bool bias,
                                   const std::vector<std::string>& ir_lines) {
  check_positive("norm_router_topk", {dim, d.experts, d.k});
  if (d.experts > 256)
    throw Error(
        fmt::format("codegen: norm_router_topk takes at most 256 experts, got {}", d.experts));
  if (!norm_router_topk_fits(dim, d))
    throw Error(fmt::format("codegen: norm_router_topk needs an even expert count, k <= experts "
                            "and a dimension divisible by 8 (got {} experts, k {}, dim {})",
                            d.experts, d.k, dim));
  const std::vector<Param> params = router_params(eps, bias);
  LaunchRule launch = per_row(256);
  launch.blocks_x = router_cluster_blocks(d.experts);
  launch.cluster_x = launch.blocks_x;
  std::string name = fmt::format("rmsnorm_router_topk_d{}_e{}_k{}{}{}", dim, d.experts, d.k,
                                 bias ? "" : "_nobias", attr_suffix("eps", eps, 1e-5));
  std::string call =
      fmt::format("norm_router_topk<{}, {}, {}, {}, {}, {}>", dim, d.experts, d.k,
                  bias ? "true" : "false", launch.blocks_x, router_ksplit(d.experts));
  round_act(d.round_act, name, call);
  return assemble(std::move(name), ir_lines, "router.cuh", call, params, launch,
                  DependencyWait::InCall);
}

KernelSource emit_rms_norm(const RmsNormDims& d, const std::vector<std::string>& ir_lines) {
  check_positive("rms_norm", {d.dim});
  std::vector<Param> params = {{"const float* x", "x"},
                               {fmt::format("{} w", kBf16), "w"},
                               {"", float_literal(d.eps)},
                               {"float* y", "y"}};
  return assemble(fmt::format("rms_norm_d{}{}", d.dim, attr_suffix("eps", d.eps, 1e-5)), ir_lines,
                  "norm.cuh", fmt::format("rms_norm<{}>", d.dim), params, per_row(256));
}

KernelSource emit_moe_combine(int hidden, int k, bool residual,
                              const std::vector<std::string>& ir_lines) {
  check_positive("moe_combine", {hidden, k});
  std::vector<Param> params = {{"const float* part", "part"}};
  params.push_back(residual ? Param{"const float* h", "h"} : Param{"", "nullptr"});
  params.push_back({"float* y", "y"});
  LaunchRule launch = per_row(256);
  launch.blocks_x = (hidden + 255) / 256; // one value of the token per thread
  return assemble(fmt::format("moe_combine{}_d{}_k{}", residual ? "_residual" : "", hidden, k),
                  ir_lines, "gemm.cuh", fmt::format("moe_combine<{}, {}, {}>", hidden, k, residual),
                  params, launch);
}

KernelSource emit_row_inv_rms(int dim, double eps, const std::vector<std::string>& ir_lines) {
  check_positive("row_inv_rms", {dim});
  std::vector<Param> params = {
      {"const float* x", "x"}, {"", float_literal(eps)}, {"float* inv", "inv"}};
  return assemble(fmt::format("row_inv_rms_d{}{}", dim, attr_suffix("eps", eps, 1e-5)), ir_lines,
                  "gemm.cuh", fmt::format("row_inv_rms<{}>", dim), params, per_row(256));
}

KernelSource emit_select_rows(const SelectRowsDims& d, const std::vector<std::string>& ir_lines) {
  check_positive("select_rows", {d.width});
  std::vector<Param> params = {
      {"const float* x", "x"}, {"const int* rows", "rows"}, {"float* out", "out"}};
  return assemble(fmt::format("select_rows_w{}", d.width), ir_lines, "gather.cuh",
                  fmt::format("select_rows<{}>", d.width), params, per_row(256));
}

KernelSource emit_argmax(int vocab, const std::vector<std::string>& ir_lines) {
  check_positive("argmax", {vocab});
  std::vector<Param> params = {{"const float* logits", "logits"},
                               {"unsigned long long* keys", "keys"}};
  LaunchRule launch = per_row(256);
  launch.blocks_x = argmax_chunks(vocab);
  return assemble(fmt::format("argmax_rows_v{}", vocab), ir_lines, "sample.cuh",
                  fmt::format("argmax_rows<{}, {}>", vocab, kArgmaxChunk), params, launch);
}

KernelSource emit_argmax_masked(int vocab, const std::vector<std::string>& ir_lines) {
  check_positive("argmax_masked", {vocab});
  std::vector<Param> params = {{"const float* logits", "logits"},
                               {"const unsigned int* masks", "masks"},
                               {"const int* rows", "rows"},
                               {"unsigned long long* keys", "keys"}};
  LaunchRule launch = per_row(256);
  launch.blocks_x = argmax_chunks(vocab);
  return assemble(fmt::format("argmax_masked_rows_v{}", vocab), ir_lines, "sample.cuh",
                  fmt::format("argmax_masked_rows<{}, {}>", vocab, kArgmaxChunk), params, launch);
}

} // namespace xserv::codegen
