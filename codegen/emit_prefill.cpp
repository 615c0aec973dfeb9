// Instantiates attention_prefill (codegen/kernels/attention_prefill.cuh) for one attention op's
// static dimensions, in the style of emit.cpp's emit_attention_decode.
#include "codegen/emit_prefill.h"

#include "ir/error.h"

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <cstdint>

namespace xserv::codegen {

namespace {

/// Mirrors attention_prefill.cuh: threads per block, query rows per block, keys per tile.
constexpr int kPrefillThreads = 256, kPrefillRows = 128, kPrefillKeys = 64;

/// A kernel parameter: its declaration and the expression the template call passes for it
/// (as in emit.cpp).
struct Param {
  std::string decl;
  std::string arg;
};

/// A float literal that reads back as exactly `v` rounded to fp32 (as in emit.cpp).
std::string float_literal(double v) {
  const float f = static_cast<float>(v);
  if (!std::isfinite(f))
    throw Error(fmt::format("codegen: attribute value {} is not a finite float", v));
  std::string s = fmt::format("{}", f);
  if (s.find_first_of(".e") == std::string::npos)
    s += ".0";
  return s + "f";
}

/// The full kernel source, as emit.cpp's assemble() writes it for a y-tiled launch with fixed
/// dynamic shared memory; __launch_bounds__ also asks for two blocks per SM (at most 128
/// registers), which the shared memory allows.
KernelSource assemble(std::string name, const std::vector<std::string>& ir_lines,
                      const std::string& header, const std::string& call,
                      const std::vector<Param>& params, LaunchRule launch) {
  std::string src = fmt::format("// kernel: {}\n", name);
  for (const std::string& line : ir_lines)
    src += fmt::format("// {}\n", line);
  src +=
      fmt::format("// launch: block {}, grid ({}, ceil(tokens / {}), 1), dynamic smem {} bytes\n",
                  launch.block, launch.blocks_x, launch.y_tile, launch.smem_fixed);
  src += fmt::format("#include \"xserv_kernels/{}\"\n\n", header);
  src +=
      fmt::format("extern \"C\" __global__ void __launch_bounds__({}, 2) {}(", launch.block, name);
  std::vector<std::string> decls, args;
  for (const Param& p : params) {
    if (!p.decl.empty()) // a literal argument has no kernel parameter
      decls.push_back(p.decl);
    args.push_back(p.arg);
  }
  src += fmt::format("\n    {}) {{\n  xserv_kernels::{}(\n      {});\n}}\n",
                     fmt::join(decls, ",\n    "), call, fmt::join(args, ", "));
  return {std::move(name), std::move(src), std::move(decls), launch};
}

} // namespace

size_t attention_prefill_smem_bytes(int head_dim) {
  return 4 * ((static_cast<size_t>(kPrefillRows) * (head_dim + 4) + 256) +
              (static_cast<size_t>(kPrefillRows) * (kPrefillKeys + 4) + 256) +
              static_cast<size_t>(kPrefillKeys) * (head_dim + 4) +
              static_cast<size_t>(kPrefillKeys) * head_dim);
}

KernelSource emit_attention_prefill(const AttentionDims& d,
                                    const std::vector<std::string>& ir_lines) {
  if (d.heads <= 0 || d.kv_heads <= 0 || d.head_dim <= 0 || d.slots <= 0)
    throw Error("codegen: attention needs positive dimensions");
  if (d.heads % d.kv_heads != 0 || kPrefillRows % (d.heads / d.kv_heads) != 0 ||
      d.head_dim % 16 != 0)
    throw Error(fmt::format("codegen: prefill attention needs heads ({}) divisible by kv_heads "
                            "({}) with a quotient dividing {}, and head_dim ({}) divisible by 16",
                            d.heads, d.kv_heads, kPrefillRows, d.head_dim));
  std::string name =
      fmt::format("attention_prefill_h{}_g{}_d{}_s{}{}", d.heads, d.kv_heads, d.head_dim, d.slots,
                  d.window ? fmt::format("_w{}", d.window) : "");
  std::vector<Param> params;
  for (const char* n : {"q", "k", "v"})
    params.push_back({fmt::format("const float* {}", n), n});
  const char* kBf16 = "const __nv_bfloat16*";
  const char* cache_t = d.f32_cache ? "const float*" : kBf16;
  for (const char* n : {"k_cache", "v_cache"})
    params.push_back({fmt::format("{} {}", cache_t, n), n});
  params.push_back({fmt::format("{} sinks", kBf16), "sinks"});
  for (const char* n : {"positions", "token_seq", "ctx_lens", "cache_rows"})
    params.push_back({fmt::format("const int* {}", n), n});
  params.push_back({"", float_literal(d.scale)});
  params.push_back({"float* out", "out"});
  params.push_back({"int tokens", "tokens"});
  LaunchRule launch;
  launch.block = kPrefillThreads;
  launch.blocks_x = d.kv_heads;
  launch.y_tile = kPrefillRows / (d.heads / d.kv_heads); // query tokens per block
  launch.smem_fixed = attention_prefill_smem_bytes(d.head_dim);
  std::string call = fmt::format("attention_prefill<{}, {}, {}, {}, {}{}>", d.heads, d.kv_heads,
                                 d.head_dim, d.slots, d.window, d.f32_cache ? ", float" : "");
  if (d.f32_cache)
    name += "_kvf32";
  const double usual = 1.0 / std::sqrt(d.head_dim);
  // An unusual scale names the kernel by its fp32 bits: the name is a C identifier.
  if (static_cast<float>(d.scale) != static_cast<float>(usual))
    name += fmt::format("_scale{:08x}", std::bit_cast<uint32_t>(static_cast<float>(d.scale)));
  return assemble(std::move(name), ir_lines, "attention_prefill.cuh", call, params, launch);
}

} // namespace xserv::codegen
