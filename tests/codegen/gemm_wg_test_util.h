// What the gemm_wg GPU tests share (gemm_wg_gpu_test.cpp: the variants the lowering uses;
// gemm_wg_sweep_gpu_test.cpp: every tiling, label gpu-sweep): tolerances, launches of the dense
// and grouped MoE gemms against ir::ref, MXFP4 weights of known values.
//
// Tolerances (as tests/codegen/gemm_gpu_test.cpp, the same arithmetic in another order): with
// split activations (bf16 hi + lo, ~2^-18 relative) the error is the tensor cores' truncating
// fp32 accumulation: 5e-5 for a matrix or the MoE block; plain bf16 activations round each
// value once (2^-9, RMS ~1.1e-3 on random data): 3e-3 for one matrix, 1.5e-2 for the MoE block
// (two chained roundings: x before gate_up, the SwiGLU output before down; kTolMoeBf16). The
// MoE block is also held to the mma.sync gemm's error on the same inputs: both MMAs see the
// same values, only the order of their fp32 sums differs.
#pragma once

#include "tests/codegen/kernel_test_util.h"

#include "codegen/emit_wg.h"
#include "ir/reference.h"
#include "models/bf16.h"
#include "models/mxfp4.h"

#include <cstring>
#include <numeric>
#include <tuple>

namespace xserv::kernel_test::wg {

using namespace xserv::codegen;

constexpr double kTolSplit = 5e-5;
constexpr double kTolBf16 = 3e-3;
/// The MoE block with plain bf16 activations on these MXFP4-valued weights (scales up to 2^1,
/// wider products than gemm_gpu_test's random bf16 weights): measured 5.5e-3..6.2e-3 at K 256,
/// 8.5e-3 at K 1024 and 1.1e-2 at the 20b's K 2880, the mma.sync gemm and gemm_wg alike (equal
/// to 4 digits), i.e. BF16's ~1e-2: held to 1.5e-2 and to the mma.sync gemm's figure.
constexpr double kTolMoeBf16 = 1.5e-2;

inline bool sm90() {
  return runtime::probe_device().arch() == "sm_90";
}

/// The activations of a gemm_wg launch: gemm_act into bf16 hi (+ lo) buffers.
struct Act {
  std::unique_ptr<DevBuf> hi, lo;
};
inline Act make_act(const GemmActDims& a, int tokens, const void* x, const void* ln) {
  const size_t n = size_t(tokens) * a.rows_per_token * a.k;
  Act out{upload(std::vector<uint16_t>(n, 0x7fc0)), upload(std::vector<uint16_t>(n, 0x7fc0))};
  const Loaded& l = load(emit_gemm_act(a, {}));
  launch(l, tokens, 1, x, a.norm ? ln : nullptr, out.hi->p, a.split ? out.lo->p : nullptr);
  return out;
}

/// gemm_wg's parameters: xh, xl, w, b, h, y, pair, tiles, route_w, tokens.
inline void launch_wg(const Loaded& l, int tokens, const Act& a, bool split, const void* w,
                      const void* b, const void* h, void* y, const void* pair, const void* tiles,
                      const void* route_w) {
  launch(l, tokens, 1, a.hi->p, split ? a.lo->p : nullptr, w, b, h, y, pair, tiles, route_w,
         tokens);
}

inline void check_dense(GemmWgDims d, bool norm, int tokens, uint64_t seed) {
  Rng rng{seed};
  const double eps = 1e-5;
  const Tensor x = random_f32(rng, {tokens, d.k}, 2.0f);
  const Bf16Weight ln = random_bf16(rng, {d.k}, 1.0f);
  const Bf16Weight w = random_bf16(rng, {d.n, d.k}, 1.0f / std::sqrt(float(d.k)));
  const Bf16Weight b = random_bf16(rng, {d.n}, 0.5f);
  const Tensor h = random_f32(rng, {tokens, d.n}, 1.0f);
  Tensor want = norm ? ir::ref::rms_norm_linear(x, ln.t, eps, w.t, d.bias ? &b.t : nullptr)
                     : ir::ref::linear(x, w.t, d.bias ? &b.t : nullptr);
  if (d.residual)
    want = ir::ref::add(h, want);
  auto dx = upload(x.f), dln = upload(ln.bits), dw = upload(w.bits), db = upload(b.bits);
  auto dh = upload(h.f);
  auto dy = poisoned(want.f.size());
  GemmActDims ad{d.k, norm, d.split, eps, 1};
  ad.natural = d.natural; // the activations in the gemm's K order
  const Act a = make_act(ad, tokens, dx->p, dln->p);
  void* y = d.residual ? dh->p : dy->p; // in place over h, as the engine runs it
  std::string name;
  if (d.splitk == 1) {
    const Loaded& l = load(emit_gemm_wg(d, {}));
    name = l.src.name;
    launch_wg(l, tokens, a, d.split, dw->p, db->p, d.residual ? dh->p : nullptr, y, nullptr,
              nullptr, nullptr);
  } else { // raw partial sums per K range, then the ordered reduce adds bias and residual
    GemmWgDims raw = d;
    raw.bias = raw.residual = false;
    const Loaded& l = load(emit_gemm_wg(raw, {}));
    name = l.src.name;
    const Loaded& red = load(emit_gemm_splitk_reduce(d.n, d.splitk, d.bias, d.residual, {}));
    auto part = poisoned(size_t(d.splitk) * tokens * d.n);
    launch_wg(l, tokens, a, d.split, dw->p, nullptr, nullptr, part->p, nullptr, nullptr, nullptr);
    launch(red, tokens, 1, part->p, d.bias ? db->p : nullptr, d.residual ? dh->p : nullptr, y,
           tokens);
  }
  device_sync();
  const double err = rel_l2(download(d.residual ? *dh : *dy, want.f.size()), want.f);
  MESSAGE(name << std::string(norm ? " (normed)" : "") << " T=" << tokens << ": rel L2 " << err);
  CHECK(err <= (d.split ? kTolSplit : kTolBf16));
}

inline GemmWgDims dense(int k, int n, bool bias, bool residual, int bn, int wm, bool split) {
  GemmWgDims d;
  d.k = k;
  d.n = n;
  d.bias = bias;
  d.residual = residual;
  d.bn = bn;
  d.wm = wm;
  d.split = split;
  return d;
}

// ---- grouped MoE: moe_sort, gate_up + SwiGLU, down + scatter, combine -------------------------

/// An MXFP4 tensor [experts, rows, cols]: the device bytes (blocks, then scales) and its
/// dequantisation as bf16 bits.
struct Mxfp4Weight {
  std::vector<uint8_t> device;
  std::vector<uint16_t> bf16;
};

inline Mxfp4Weight random_mxfp4(Rng& rng, int experts, int rows, int cols, int lo, int hi) {
  const size_t n = size_t(experts) * rows * cols, blocks = n / 32;
  Mxfp4Weight w;
  w.device.resize(n / 2 + blocks);
  for (size_t i = 0; i < n / 2; ++i)
    w.device[i] = uint8_t(int((rng.next(1.0f) + 1.0f) * 128.0f) & 0xff);
  for (size_t b = 0; b < blocks; ++b)
    w.device[n / 2 + b] =
        uint8_t(lo + int((rng.next(1.0f) + 1.0f) * 0.5f * float(hi - lo + 1)) % (hi - lo + 1));
  std::vector<float> f(n);
  models::mxfp4_decode_row({w.device.data(), n / 2}, {w.device.data() + n / 2, blocks}, f);
  w.bf16.resize(n);
  for (size_t i = 0; i < n; ++i)
    w.bf16[i] = models::float_to_bf16(f[i]);
  return w;
}

inline Tensor as_tensor(const std::vector<uint16_t>& bits, std::vector<int64_t> shape) {
  Tensor t = Tensor::zeros(ir::DType::F32, std::move(shape));
  for (size_t i = 0; i < t.f.size(); ++i)
    t.f[i] = models::bf16_to_float(bits[i]);
  return t;
}

/// Distinct random experts per token with normalised weights; `skew`: every token picks experts
/// 0..k-1 (several tiles of one expert).
inline void routing(Rng& rng, int tokens, int experts, int k, bool skew, Tensor& w, Tensor& ids) {
  w = Tensor::zeros(ir::DType::F32, {tokens, k});
  ids = Tensor::zeros(ir::DType::I32, {tokens, k});
  for (int t = 0; t < tokens; ++t) {
    std::vector<int32_t> all(static_cast<size_t>(experts));
    std::iota(all.begin(), all.end(), 0);
    float sum = 0;
    for (int j = 0; j < k; ++j) {
      const int pick =
          skew ? j : j + int((rng.next(1.0f) + 1.0f) * 0.5f * float(experts - j)) % (experts - j);
      std::swap(all[size_t(j)], all[size_t(pick)]);
      ids.i[size_t(t * k + j)] = all[size_t(j)];
      w.f[size_t(t * k + j)] = 1.5f + rng.next(1.0f);
      sum += w.f[size_t(t * k + j)];
    }
    for (int j = 0; j < k; ++j)
      w.f[size_t(t * k + j)] /= sum;
  }
}

struct MoeCase {
  MoeDims d;
  int tokens = 0, bn = 64, wm = 2;
  bool split = false, skew = false, mxfp4 = false;
  int ksub = 1;
  bool pipe = false;
  int stages = 4;
  int scale_lo = 117, scale_hi = 128; ///< the experts' E8M0 scale bytes (2^-10 .. 2^1)
  /// Hold the outputs to ir::ref within kTolMoeBf16 (calibrated on the default scales; wider
  /// ones put weights 2^40 apart, whose sums the bf16 activations leave further off).
  bool check_accuracy = true;
  /// The canonical order's chunks (moe_chain_splits of each matrix's K; one m64 tile a block
  /// where two would leave the totals no registers), as `compile --gemm-order canonical`.
  bool canonical = false;
  /// The MXFP4 run in gemm_wg's one-multiply form (GemmWgDims::small_scales): scale bytes
  /// must then stay at most 128.
  bool small_scales = false;
  bool steps = false; ///< GemmWgDims::steps
};

/// The inputs of run_moe's MoE block (random, from its seed), for a run of other kernels on
/// the same values.
struct MoeInputs {
  Mxfp4Weight gu, dn;
  Bf16Weight gub, dnb;
  Tensor x, h, w, ids;
};
inline MoeInputs moe_inputs(const MoeCase& c, uint64_t seed) {
  const MoeDims& d = c.d;
  Rng rng{seed};
  MoeInputs in;
  in.gu = random_mxfp4(rng, d.experts, 2 * d.inter, d.hidden, c.scale_lo, c.scale_hi);
  in.dn = random_mxfp4(rng, d.experts, d.hidden, d.inter, c.scale_lo, c.scale_hi);
  in.gub = random_bf16(rng, {d.experts, 2 * d.inter}, 0.5f);
  in.dnb = random_bf16(rng, {d.experts, d.hidden}, 0.5f);
  in.x = random_f32(rng, {c.tokens, d.hidden}, 3.0f);
  in.h = random_f32(rng, {c.tokens, d.hidden}, 1.0f);
  routing(rng, c.tokens, d.experts, d.k, c.skew, in.w, in.ids);
  return in;
}

/// Runs the grouped MoE block through gemm_wg (BF16 weights, and with c.mxfp4 also MXFP4 ones
/// of the same values) and returns the outputs' bits per weight format.
inline std::vector<std::vector<uint32_t>> run_moe(const MoeCase& c, uint64_t seed) {
  const MoeDims& d = c.d;
  const MoeInputs in = moe_inputs(c, seed);
  const Mxfp4Weight &gu = in.gu, &dn = in.dn;
  const Bf16Weight &gub = in.gub, &dnb = in.dnb;
  const Tensor &x = in.x, &h = in.h, &w = in.w, &ids = in.ids;
  const Tensor want = ir::ref::moe_experts_residual(
      x, w, ids, as_tensor(gu.bf16, {d.experts, 2 * d.inter, d.hidden}), gub.t,
      as_tensor(dn.bf16, {d.experts, d.hidden, d.inter}), dnb.t, h, d.limit, d.alpha);
  const int pairs = c.tokens * d.k;
  const Loaded& sort = load(emit_moe_sort({d.experts, d.k, c.bn, pairs}, {}));
  const Loaded& comb = load(emit_moe_combine(d.hidden, d.k, true, {}));
  auto dx = upload(x), dh = upload(h), dw = upload(w), dids = upload(ids);
  auto dgub = upload(gub.bits), ddnb = upload(dnb.bits);
  auto pair = upload(std::vector<int32_t>(size_t(pairs), -7));
  const size_t tile_ints = moe_tiles_ints(pairs, d.experts, c.bn);
  auto tiles = upload(std::vector<int32_t>(tile_ints, -7));
  launch(sort, c.tokens, 1, dids->p, pair->p, tiles->p, c.tokens);
  const Act xa = make_act({d.hidden, false, c.split, 1e-5, 1}, c.tokens, dx->p, nullptr);
  // The mma.sync grouped gemm (gemm.cuh) on the same inputs, for the accuracy comparison.
  double err_mma = 0;
  {
    GemmDims g;
    g.grouped = true;
    g.experts = d.experts;
    g.ksel = d.k;
    g.bm = 64;
    g.split = c.split;
    g.k = d.hidden;
    g.n = 2 * d.inter;
    g.gather = true;
    g.epilogue = GemmEpilogue::Swiglu;
    const Loaded& kgu = load(emit_gemm(g, {}));
    g.k = d.inter;
    g.n = d.hidden;
    g.gather = false;
    g.epilogue = GemmEpilogue::Scatter;
    const Loaded& kdn = load(emit_gemm(g, {}));
    auto pair64 = upload(std::vector<int32_t>(size_t(pairs), -7));
    auto tiles64 = upload(std::vector<int32_t>(moe_tiles_ints(pairs, d.experts, 64), -7));
    launch(load(emit_moe_sort({d.experts, d.k, 64, pairs}, {})), c.tokens, 1, dids->p, pair64->p,
           tiles64->p, c.tokens);
    auto wgu = upload(gu.bf16), wdn = upload(dn.bf16);
    auto act = poisoned(size_t(pairs) * d.inter), part = poisoned(size_t(pairs) * d.hidden);
    auto y = poisoned(want.f.size());
    launch(kgu, c.tokens, 1, dx->p, nullptr, nullptr, wgu->p, dgub->p, nullptr, act->p, pair64->p,
           tiles64->p, nullptr, c.tokens);
    launch(kdn, c.tokens, 1, act->p, nullptr, nullptr, wdn->p, ddnb->p, nullptr, part->p, pair64->p,
           tiles64->p, dw->p, c.tokens);
    launch(comb, c.tokens, 1, part->p, dh->p, y->p);
    device_sync();
    err_mma = rel_l2(download(*y, want.f.size()), want.f);
  }
  std::vector<std::vector<uint32_t>> out;
  for (int mx = 0; mx < (c.mxfp4 ? 2 : 1); ++mx) {
    GemmWgDims g;
    g.grouped = true;
    g.experts = d.experts;
    g.ksel = d.k;
    g.bn = c.bn;
    g.wm = c.wm;
    g.ksub = c.ksub;
    g.pipe = c.pipe;
    g.stages = c.stages;
    g.split = c.split;
    g.mxfp4 = mx == 1;
    g.small_scales = g.mxfp4 && c.small_scales;
    g.steps = c.steps;
    g.k = d.hidden;
    g.n = 2 * d.inter;
    g.gather = true;
    g.epilogue = GemmEpilogue::Swiglu;
    g.limit = d.limit;
    g.alpha = d.alpha;
    auto chunked = [&](int k) {
      g.chunks = c.canonical ? moe_chain_splits(k) : 1;
      g.wm = g.chunks > 1 && c.wm * c.bn > 128 ? 1 : c.wm;
      g.pipe = g.chunks > 1 ? false : c.pipe; // as the lowering falls back
      g.ksub = g.chunks > 1 && (k / 64) % (g.chunks * c.ksub) != 0 ? 1 : c.ksub;
    };
    chunked(g.k);
    const Loaded& kgu = load(emit_gemm_wg(g, {}));
    g.k = d.inter;
    g.n = d.hidden;
    g.gather = false;
    g.epilogue = GemmEpilogue::Scatter;
    chunked(g.k);
    const Loaded& kdn = load(emit_gemm_wg(g, {}));
    auto wgu = mx ? upload(gu.device) : upload(gu.bf16);
    auto wdn = mx ? upload(dn.device) : upload(dn.bf16);
    auto act = poisoned(size_t(pairs) * d.inter), part = poisoned(size_t(pairs) * d.hidden);
    auto y = poisoned(want.f.size());
    launch_wg(kgu, c.tokens, xa, c.split, wgu->p, dgub->p, nullptr, act->p, pair->p, tiles->p,
              nullptr);
    const Act aa = make_act({d.inter, false, c.split, 1e-5, d.k}, c.tokens, act->p, nullptr);
    launch_wg(kdn, c.tokens, aa, c.split, wdn->p, ddnb->p, nullptr, part->p, pair->p, tiles->p,
              dw->p);
    launch(comb, c.tokens, 1, part->p, dh->p, y->p);
    device_sync();
    const std::vector<float> got = download(*y, want.f.size());
    const double err = rel_l2(got, want.f);
    MESSAGE(kgu.src.name << " + " << kdn.src.name << " T=" << c.tokens
                         << std::string(c.skew ? " skewed" : "") << ": rel L2 " << err
                         << " (mma.sync gemm " << err_mma << ")");
    if (c.check_accuracy) {
      CHECK(err <= (c.split ? kTolSplit : kTolMoeBf16));
      // The MMAs see the same values as the mma.sync gemm's (x and the SwiGLU output rounded
      // alike): only the order of the fp32 sums differs.
      CHECK(std::abs(err - err_mma) <= (c.split ? 1e-5 : 2e-4));
    }
    std::vector<uint32_t> bits(got.size());
    std::memcpy(bits.data(), got.data(), got.size() * 4);
    out.push_back(std::move(bits));
  }
  return out;
}

/// y = x' W^T (+ b) (+ h) of `tokens` rows through gemm_wg as the lowering runs it above 8
/// tokens (canonical plans' gemm path): gemm_act's slot-ordered bf16 activations of x' (x, or
/// rms_norm(x, ln, 1e-5) when ln is given), `splitk` K ranges (raw partial sums, then
/// gemm_splitk_reduce: the ranges in order, bias, residual) or one (the epilogue adds them);
/// `bn` tokens a tile; `chunks`: one range a block, K in that many chunks summed in order in
/// registers (as the lowering runs steps above 64 tokens). With a residual y is h's copy.
/// natural: K in its natural order (GemmWgDims::natural, one range), the activations too.
inline std::unique_ptr<DevBuf> dense_gemm_out(const LinearDims& d, int splitk, int bn, int tokens,
                                              const void* x, const void* ln, const void* w,
                                              const void* b, const DevBuf* h, int chunks = 1,
                                              bool natural = false) {
  GemmWgDims g = dense(d.k, d.n, d.bias, d.residual, bn, 1, false);
  g.splitk = splitk;
  g.chunks = chunks;
  g.stages = 4;
  g.natural = natural;
  GemmActDims ad{d.k, ln != nullptr, false, 1e-5, 1};
  ad.natural = natural;
  const Act a = make_act(ad, tokens, x, ln);
  auto y = d.residual ? upload(download(*h, size_t(tokens) * d.n)) : poisoned(size_t(tokens) * d.n);
  if (splitk == 1) {
    const Loaded& l = load(emit_gemm_wg(g, {}));
    launch_wg(l, tokens, a, false, w, b, d.residual ? y->p : nullptr, y->p, nullptr, nullptr,
              nullptr);
  } else {
    g.bias = g.residual = false;
    const Loaded& l = load(emit_gemm_wg(g, {}));
    const Loaded& red = load(emit_gemm_splitk_reduce(d.n, splitk, d.bias, d.residual, {}));
    auto part = poisoned(size_t(splitk) * tokens * d.n);
    launch_wg(l, tokens, a, false, w, nullptr, nullptr, part->p, nullptr, nullptr, nullptr);
    launch(red, tokens, 1, part->p, d.bias ? b : nullptr, d.residual ? y->p : nullptr, y->p,
           tokens);
  }
  device_sync();
  return y;
}

/// dense_gemm_out's values as bits.
inline std::vector<uint32_t> dense_gemm_bits(const LinearDims& d, int splitk, int bn, int tokens,
                                             const DevBuf& x, const DevBuf& w, const DevBuf& b,
                                             const DevBuf& h, int chunks = 1) {
  const auto y = dense_gemm_out(d, splitk, bn, tokens, x.p, nullptr, w.p, b.p, &h, chunks);
  const std::vector<float> got = download(*y, size_t(tokens) * d.n);
  std::vector<uint32_t> bits(got.size());
  std::memcpy(bits.data(), got.data(), got.size() * 4);
  return bits;
}

} // namespace xserv::kernel_test::wg
