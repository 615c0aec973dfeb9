// The warpgroup-MMA gemms of the lowering (sm_90, LoweringContext::wgmma): dense linears of
// steps above 8 tokens and the grouped MoE gemms, each after gemm_act has written its bf16
// activations (codegen/kernels/gemm_wg.cuh). Tile shapes from kernels_bench on the H200
// (docs/PERF.md, "Kernel figures").
#include "codegen/cuda_lower_detail.h"
#include "codegen/emit_wg.h"

namespace xserv::codegen::lowering {

namespace {

/// SMs of the H200 the block counts are planned for.
constexpr int kSms = 132;

/// The widest output a library gemm serves with a bias or a residual (through lib_part): the
/// projections (20b and 120b qkv 5120, o_proj 2880). Wider ones (lm_head) write their sums
/// straight into their output.
constexpr int kLibraryMaxN = 16384;

/// gemm_wg addresses its activation rows with 32-bit element offsets (row x K): a step of
/// `tokens` rows of K values must stay below 2^32 of them.
void check_wg_rows(int64_t tokens, int64_t k) {
  if (tokens * k >= (int64_t{1} << 32))
    throw Error(fmt::format("codegen: a step of {} tokens x {} values is past the gemms' 2^32 "
                            "element offsets; compile with a smaller --prefill-chunk",
                            tokens, k));
}

} // namespace

Lowerer::DenseGemm Lowerer::dense_gemm_wg(const codegen::LinearDims& d, ValueId v, bool library) {
  DenseGemm k;
  k.wg = true;
  check_wg_rows(c_.max_tokens, d.k);
  // The natural order (LoweringContext::natural): the activations in K order and one chain over
  // K at every size, gemm_wg's natural form up to 64 rows and cuBLAS above.
  codegen::GemmActDims ad{d.k, d.norm, c_.gemm_split, d.eps, 1};
  ad.natural = c_.natural;
  k.act = k_.add(codegen::emit_gemm_act(ad, ir_lines(g_, v)));
  codegen::GemmWgDims g;
  g.k = d.k;
  g.n = d.n;
  g.bias = d.bias;
  g.residual = d.residual;
  g.split = c_.gemm_split;
  g.natural = c_.natural;
  k.splitk = c_.natural ? 1 : codegen::wg_splitk(d.k, d.n, kSms);
  // cuBLAS above kSmallGemmRows rows (plain bf16 activations only: the split pair would need
  // two calls): kernels_bench measured it 1.5-1.7x gemm_wg on the 20b's q and o_proj shapes from
  // 512 tokens on, slower at 64 (docs/PERF.md, "Kernel figures"); lm_head at batched decode's
  // 128 and 256 sequences 331 and 426 us against gemm_wg's 365 and 709 (H200), equal at 64.
  // Not the router (split K below), but in the natural order (no split K there). Its rows are
  // sequences where the step's logits are.
  const int64_t max_rows = rows_kind(g_, v) == Rows::Seqs ? c_.max_seqs : c_.max_tokens;
  // lm_head: no bias, no residual, so the library's sums are the output.
  const bool direct = d.n > kLibraryMaxN && !d.bias && !d.residual;
  // In the natural order from the first row the decode kernels leave (Blas's picks by step
  // size keep the pinned algorithm's sums and run 2-3x faster than gemm_wg's unsplit natural
  // form at 9-64 rows), else above the small tiles.
  const int64_t lib_floor = c_.natural ? d.max_tokens : kSmallGemmRows;
  const bool use_library = library && c_.dense_cublas && !c_.gemm_split &&
                           (d.n <= kLibraryMaxN || (direct && c_.lm_head_library)) &&
                           max_rows > lib_floor;
  if (use_library)
    k.lib_from = static_cast<int>(lib_floor) + 1;
  // Many tokens: 128-token tiles; two m64 tiles a block for wide outputs (20b qkv at 512
  // tokens: 86 -> 68 us), one for narrower ones (o_proj 2880: 62 against 73 us). Outputs of one
  // 64-row tile (the router's 32) would be a handful of blocks (4 at 512 tokens): 64-token tiles
  // with K split as for few tokens instead (kernels_bench "router gemm tiles": 20b
  // router at 512 tokens 26.3 -> 9.7 us, at 2048 28.3 -> 12.0 us, before the reduce's ~2-3).
  k.large_split = !use_library && d.n <= 64 && k.splitk > 1;
  g.bn = k.large_split ? kSmallGemmRows : 128;
  g.wm = d.n >= 4096 ? 2 : 1;
  g.splitk = k.large_split ? k.splitk : 1;
  // In the canonical order the small tiles' K splits as chunks summed in order in registers: the
  // same sums for a token whatever the step's size (docs/DESIGN.md, "The gemms' canonical
  // order"), one m64 tile a block so that the totals fit beside the accumulators.
  g.chunks = k.large_split || !c_.canonical ? 1 : k.splitk;
  if (g.chunks > 1)
    g.wm = 1;
  g.stages = g.wm == 2 ? 3 : 4;
  if (k.large_split)
    g.bias = g.residual = false;
  if (!use_library)
    k.large = k_.add(codegen::emit_gemm_wg(g, ir_lines(g_, v)));
  // Up to kSmallGemmRows tokens: 64-token tiles, K split over blocks.
  g.bn = kSmallGemmRows;
  g.wm = 1;
  g.stages = 4;
  g.splitk = k.splitk;
  g.chunks = 1;
  if (k.splitk > 1) // raw partial sums; bias and residual come in the reduce
    g.bias = g.residual = false;
  add_splitk_reduce(
      k, d, k.large_split ? std::max<int64_t>(kSmallGemmRows, c_.max_tokens) : kSmallGemmRows);
  k.small64 = k_.add(codegen::emit_gemm_wg(g, ir_lines(g_, v)));
  if (use_library) { // cuBLAS's raw sums into lib_part, then bias and residual (or into y)
    k.library = static_cast<int>(t_.library.size());
    // The natural order: one algorithm without split K at every row count, pinned at the
    // largest step (its sums the natural chain's; Blas's fixed order).
    t_.library.push_back({runtime::PlanLibraryCall::Op::GemmBf16, d.n, d.k, false,
                          c_.natural ? static_cast<int>(max_rows) : 0});
    if (!direct) {
      k.lib_reduce = k_.add(codegen::emit_gemm_splitk_reduce(
          d.n, 1, d.bias, d.residual, {"adds bias and residual to a library gemm's sums"}));
      k.lib_part = partials(size_t(c_.max_tokens) * size_t(d.n) * sizeof(float));
    }
    codegen::GemmActDims a{d.k, d.norm, false, d.eps, 1};
    a.natural = true;
    k.lib_act = k_.add(codegen::emit_gemm_act(a, ir_lines(g_, v)));
  }
  return k;
}

void Lowerer::moe_gemms_wg(ValueId v, const codegen::MoeDims& d, int i, int lo, int hi,
                           const std::vector<LaunchArg>& in) {
  const WgMoeTiling& tiling = kWgMoeTilings[size_t(i)];
  const int bn = tiling.bn;
  // Both copies: batched decode (tiles of up to 32 tokens: steps of up to ~190 tokens on the 20b)
  // reads the MXFP4 one, as the decode kernels do (20b at 64 sequences: 327 against 398 us a
  // layer), prompts the BF16 one (618 against 710 us at 512 tokens).
  const bool both = c_.expert_format == runtime::ExpertFormat::Both;
  const bool mx4 = d.mxfp4 && (!both || bn <= 32);
  auto weight = [&](LaunchArg a) {
    if (both && mx4)
      a.name = runtime::mxfp4_copy_name(a.name);
    return a;
  };
  const LaunchArg null, xl = c_.gemm_split ? wg_xl_ : LaunchArg{};
  check_wg_rows(c_.max_tokens, d.hidden);               // gate_up: rows are tokens
  check_wg_rows(int64_t(c_.max_tokens) * d.k, d.inter); // down: rows are (token, slot) pairs
  codegen::MoeSortDims sd{d.experts, d.k, bn, c_.max_tokens * d.k};
  const int sort = k_.add(
      codegen::emit_moe_sort(sd, {"groups moe_experts(...)'s (token, slot) pairs by expert"}));
  // x is the router's input too: when its gemm has converted it already, nothing to do.
  const bool x_ready = wg_act_valid_ && wg_act_of_ == in[0] && !wg_act_normed_;
  const int x_act = x_ready ? -1
                            : k_.add(codegen::emit_gemm_act(
                                  {d.hidden, false, c_.gemm_split, 1e-5, 1}, ir_lines(g_, v)));
  const int act_act =
      k_.add(codegen::emit_gemm_act({d.inter, false, c_.gemm_split, 1e-5, d.k}, ir_lines(g_, v)));
  codegen::GemmWgDims g;
  g.grouped = true;
  g.experts = d.experts;
  g.ksel = d.k;
  g.bn = bn;
  g.split = c_.gemm_split;
  g.mxfp4 = mx4;
  g.small_scales = mx4 && c_.mxfp4_small_scales;
  // The 20b's MoE at 8, 64 and 256 rows per expert (kernels_bench): MXFP4 decodes better with
  // two m64 tiles a block (but for 96-token tiles); BF16 tiles below 128 tokens are as fast with
  // one (more blocks).
  g.wm = mx4 || bn == 128 ? tiling.wm : 1;
  // K tiles a stage and pipe as measured for MXFP4; BF16 experts keep one K tile in 4 stages.
  const bool deep = mx4 || tiling.ksub == 1;
  g.stages = deep ? tiling.stages : 4;
  const int ksub = deep ? tiling.ksub : 1;
  const bool pipe = deep && tiling.pipe;
  g.steps = deep && tiling.steps && !pipe;
  g.k = d.hidden;
  g.n = 2 * d.inter;
  g.gather = true;
  g.epilogue = codegen::GemmEpilogue::Swiglu;
  g.limit = d.limit;
  g.alpha = d.alpha;
  // The canonical order: the decode kernels' K ranges as chunks (moe_chain_splits: one today,
  // so a canonical plan's grouped gemms are the default's; with more, one m64 tile a block
  // where two would leave the totals no registers).
  const int wm = g.wm;
  auto chunked = [&](int k) {
    g.chunks = c_.canonical ? codegen::moe_chain_splits(k) : 1;
    g.wm = g.chunks > 1 && wm * bn > 128 ? 1 : wm;
    g.pipe = g.chunks > 1 ? false : pipe;
    g.ksub = g.chunks > 1 && (k / 64) % (g.chunks * ksub) != 0 ? 1 : ksub;
  };
  chunked(g.k);
  const int gate_up = k_.add(codegen::emit_gemm_wg(g, ir_lines(g_, v)));
  g.k = d.inter;
  g.n = d.hidden;
  g.gather = false;
  chunked(g.k);
  g.epilogue = codegen::GemmEpilogue::Scatter;
  const int down = k_.add(codegen::emit_gemm_wg(g, ir_lines(g_, v)));
  emit(sort, Rows::Tokens, lo, hi, {in[2], moe_pair_, moe_tiles_, rows_arg()});
  if (!x_ready)
    emit(x_act, Rows::Tokens, lo, hi, {in[0], null, wg_xh_, xl});
  emit(gate_up, Rows::Tokens, lo, hi,
       {wg_xh_, xl, weight(in[3]), in[4], null, moe_act_, moe_pair_, moe_tiles_, null, rows_arg()});
  emit(act_act, Rows::Tokens, lo, hi, {moe_act_, null, wg_xh_, xl});
  emit(down, Rows::Tokens, lo, hi,
       {wg_xh_, xl, weight(in[5]), in[6], null, moe_part_, moe_pair_, moe_tiles_, in[1],
        rows_arg()});
}

} // namespace xserv::codegen::lowering
