// Instantiates gemm_wg.cuh's kernels (the sm_90 warpgroup-MMA gemm and its activations).
#include "codegen/emit_wg.h"
#include "codegen/emit_detail.h"

#include "base/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>

namespace xserv::codegen {

using namespace detail;

namespace {

constexpr std::array<int, 10> kWgShapes = {8, 16, 24, 32, 48, 64, 96, 128, 192, 256};
constexpr size_t kSmemPerSm = 227 * 1024;

size_t stage_bytes(const GemmWgDims& d) {
  const size_t b = size_t(d.bn) * 128 * (d.split ? 2 : 1);
  const size_t a = size_t(64) * d.wm * (d.mxfp4 ? 36 : 128);
  return (size_t(d.ksub) * (b + a) + 1023) / 1024 * 1024;
}

} // namespace

int moe_chain_splits(int /*k*/) {
  return 1;
}

int wg_splitk(int k, int n, int sms) {
  const int ktiles = k / 64, blocks = (n + 63) / 64;
  if (blocks >= sms)
    return 1;
  int best = 1;
  for (int s = 2; ktiles / s >= 4; ++s) {
    if (ktiles % s != 0)
      continue;
    best = s;
    if (blocks * s >= sms * 3 / 2)
      break;
  }
  return best;
}

size_t gemm_wg_smem_bytes(const GemmWgDims& d) {
  return size_t(d.stages) * stage_bytes(d) + 1024;
}

bool gemm_wg_fits(const GemmWgDims& d) {
  return d.k > 0 && d.k % 64 == 0 && d.n > 0 && d.n % 2 == 0 &&
         (d.epilogue != GemmEpilogue::Swiglu || d.n % 16 == 0) &&
         std::find(kWgShapes.begin(), kWgShapes.end(), d.bn) != kWgShapes.end() &&
         (d.wm == 1 || d.wm == 2) && d.stages >= (d.pipe ? 3 : 2) && d.ksub >= 1 && d.ksub <= 4 &&
         gemm_wg_smem_bytes(d) <= kSmemPerSm && d.splitk >= 1 && (d.k / 64) % d.splitk == 0 &&
         d.chunks >= 1 && !(d.natural && d.mxfp4) && d.min_blocks >= 0 && d.min_blocks <= 16 &&
         (d.chunks == 1 || (d.splitk == 1 && !d.pipe && (d.k / 64) % (d.chunks * d.ksub) == 0));
}

KernelSource emit_gemm_act(const GemmActDims& d, const std::vector<std::string>& ir_lines) {
  check_positive("gemm_act", {d.k, d.rows_per_token});
  if (d.k % 64 != 0)
    throw Error(fmt::format("codegen: gemm_act needs K divisible by 64, got {}", d.k));
  // Every launch passes all four (ln and xl nullptr when unused), as the gemms pass theirs.
  std::vector<Param> params = {{"const float* x", "x"},
                               {fmt::format("{} ln", kBf16), "ln"},
                               {"", float_literal(d.eps)},
                               {"__nv_bfloat16* xh", "xh"},
                               {"__nv_bfloat16* xl", "xl"}};
  std::string name =
      fmt::format("gemm_act_k{}{}{}", d.k, d.norm ? "_norm" : "", d.split ? "_x2" : "_bf16");
  if (d.rows_per_token != 1) // the launch rule differs: kernels are told apart by name
    name += fmt::format("_r{}", d.rows_per_token);
  if (d.natural)
    name += "_natural";
  if (d.norm)
    name += attr_suffix("eps", d.eps, 1e-5);
  LaunchRule launch;
  launch.y_per_token = d.rows_per_token;
  return assemble(std::move(name), ir_lines, "gemm_wg.cuh",
                  d.natural ? fmt::format("gemm_act<{}, {}, {}, true>", d.k, d.norm, d.split)
                            : fmt::format("gemm_act<{}, {}, {}>", d.k, d.norm, d.split),
                  params, launch);
}

KernelSource emit_gemm_wg(const GemmWgDims& d, const std::vector<std::string>& ir_lines) {
  check_positive("gemm_wg", {d.k, d.n, d.experts, d.ksel});
  if (!gemm_wg_fits(d))
    throw Error(fmt::format("codegen: gemm_wg cannot take K {} N {} with {} tokens, {} m64 tiles "
                            "and {} stages per block",
                            d.k, d.n, d.bn, d.wm, d.stages));
  if (d.gather && !d.grouped)
    throw Error("codegen: a gathering gemm must be grouped");
  if (d.epilogue == GemmEpilogue::Scatter && !d.grouped)
    throw Error("codegen: a scattering gemm must be grouped");
  if (d.grouped && d.residual)
    throw Error("codegen: a grouped gemm has no residual");
  if (d.splitk > 1 && (d.grouped || d.epilogue != GemmEpilogue::Store))
    throw Error("codegen: split K is for dense stores only");
  static const char* epi_name[] = {"store", "swiglu", "scatter"};
  const int epi = static_cast<int>(d.epilogue);
  std::string name =
      fmt::format("gemmwg_{}{}_k{}_n{}_t{}_m{}_s{}{}", epi_name[epi], d.residual ? "_residual" : "",
                  d.k, d.n, d.bn, 64 * d.wm, d.stages, d.bias ? "" : "_nobias");
  if (d.grouped)
    name += fmt::format("_e{}_k{}{}", d.experts, d.ksel, d.gather ? "_gather" : "");
  if (d.epilogue == GemmEpilogue::Swiglu)
    name += attr_suffix("limit", d.limit, 7.0) + attr_suffix("alpha", d.alpha, 1.702);
  name += d.split ? "_x2" : "_bf16";
  if (d.splitk > 1)
    name += fmt::format("_splitk{}", d.splitk);
  if (d.chunks > 1)
    name += fmt::format("_chunks{}", d.chunks);
  if (d.mxfp4)
    name += d.small_scales ? "_mx4s" : "_mx4";
  if (d.ksub > 1)
    name += fmt::format("_ks{}", d.ksub);
  if (d.pipe)
    name += "_pipe";
  if (d.natural)
    name += "_natural";
  if (d.min_blocks > 0)
    name += fmt::format("_mb{}", d.min_blocks);
  if (d.steps)
    name += "_steps";
  std::vector<Param> params = {{"const __nv_bfloat16* xh", "xh"},
                               {"const __nv_bfloat16* xl", "xl"},
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
  launch.block = 128;
  launch.min_blocks_per_sm = d.min_blocks;
  launch.blocks_x = (d.n + 64 * d.wm - 1) / (64 * d.wm);
  launch.y_tile = d.bn;
  if (d.grouped) {
    launch.y_per_token = d.ksel;
    launch.y_extra = d.experts;
  }
  launch.smem_fixed = gemm_wg_smem_bytes(d);
  launch.blocks_z = d.splitk;
  std::string call =
      fmt::format("gemm_wg<{}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}>",
                  d.k, d.n, d.bn, d.wm, d.stages, d.mxfp4, d.split, d.grouped, d.gather, d.ksel,
                  epi, d.bias, d.residual, d.splitk, d.experts, d.ksub, d.pipe, d.chunks);
  // The template's last arguments (SMALL, NATURAL, STEPS), up to the last one set.
  const bool last[] = {d.mxfp4 && d.small_scales, d.natural, d.steps};
  int given = 3;
  while (given > 0 && !last[given - 1])
    --given;
  for (int i = 0; i < given; ++i)
    call.insert(call.size() - 1, last[i] ? ", true" : ", false");
  return assemble(std::move(name), ir_lines, "gemm_wg.cuh", call, params, launch);
}

} // namespace xserv::codegen
