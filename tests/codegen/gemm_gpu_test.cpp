// GPU checks of the prefill-path kernels (tensor-core gemm, MoE sort / grouped gemm / combine)
// against ir::ref on random inputs.
//
// Tolerances: with `split` each activation enters the MMA as bf16 hi + lo, which represents it
// to 2^-18 relative (hi is within 2^-9, lo within 2^-9 of the remainder); products are exact
// and sums fp32, so the outputs agree with ir::ref (fp32 inputs, double sums) to ~1e-6 relative
// L2 if the sums were exactly rounded. The tensor cores' fp32 accumulation is not (it aligns
// products with truncation): measured 1.5e-5 for the 20b MoE block (two chained K = 2880
// gemms), hence the limit 5e-5, still 60x below plain bf16's. With plain bf16 activations
// each is rounded once (at most 2^-9 = 1.95e-3 relative, RMS ~1.1e-3 on random data): limit 3e-3
// for one matrix, 6e-3 for the MoE block, where two roundings (x before gate_up, the SwiGLU
// output before down) compound.
#include "tests/codegen/kernel_test_util.h"

#include "ir/reference.h"

#include <numeric>

using namespace xserv;
using namespace xserv::codegen;
using namespace xserv::kernel_test;

namespace {

constexpr double kTolSplit = 5e-5;
constexpr double kTolBf16 = 3e-3;

double tolerance(bool split) {
  return split ? kTolSplit : kTolBf16;
}

/// Launches a gemm with its full parameter list (x, inv_rms, ln, w, b, h, y, pair, tiles,
/// route_w, tokens).
void launch_gemm(const Loaded& l, int tokens, const void* x, const void* inv, const void* ln,
                 const void* w, const void* b, const void* h, void* y, const void* pair,
                 const void* tiles, const void* route_w) {
  launch(l, tokens, 1, x, inv, ln, w, b, h, y, pair, tiles, route_w, tokens);
}

void check_dense(GemmDims d, int tokens, uint64_t seed) {
  Rng rng{seed};
  const double eps = 1e-5;
  const Tensor x = random_f32(rng, {tokens, d.k}, 2.0f);
  const Bf16Weight ln = random_bf16(rng, {d.k}, 1.0f);
  const Bf16Weight w = random_bf16(rng, {d.n, d.k}, 1.0f / std::sqrt(float(d.k)));
  const Bf16Weight b = random_bf16(rng, {d.n}, 0.5f);
  const Tensor h = random_f32(rng, {tokens, d.n}, 1.0f);
  Tensor want = d.norm ? ir::ref::rms_norm_linear(x, ln.t, eps, w.t, d.bias ? &b.t : nullptr)
                       : ir::ref::linear(x, w.t, d.bias ? &b.t : nullptr);
  if (d.residual)
    want = ir::ref::add(h, want);
  const Loaded& l = load(emit_gemm(d, {}));
  const Loaded& inv_k = load(emit_row_inv_rms(d.k, eps, {}));
  auto dx = upload(x.f), dln = upload(ln.bits), dw = upload(w.bits), db = upload(b.bits);
  auto dh = upload(h.f);
  auto inv = poisoned(size_t(tokens));
  auto dy = poisoned(want.f.size());
  if (d.norm)
    launch(inv_k, tokens, 1, dx->p, inv->p);
  // The residual case writes y over h in place, as the engine does.
  void* y = d.residual ? dh->p : dy->p;
  if (d.splitk == 1) {
    launch_gemm(l, tokens, dx->p, d.norm ? inv->p : nullptr, dln->p, dw->p, db->p,
                d.residual ? dh->p : nullptr, y, nullptr, nullptr, nullptr);
  } else { // raw partial sums per K range, then the ordered reduce adds bias and residual
    GemmDims raw = d;
    raw.bias = raw.residual = false;
    const Loaded& lr = load(emit_gemm(raw, {}));
    const Loaded& red = load(emit_gemm_splitk_reduce(d.n, d.splitk, d.bias, d.residual, {}));
    auto part = poisoned(size_t(d.splitk) * tokens * d.n);
    launch_gemm(lr, tokens, dx->p, d.norm ? inv->p : nullptr, dln->p, dw->p, nullptr, nullptr,
                part->p, nullptr, nullptr, nullptr);
    launch(red, tokens, 1, part->p, d.bias ? db->p : nullptr, d.residual ? dh->p : nullptr, y,
           tokens);
  }
  device_sync();
  const double err = rel_l2(download(d.residual ? *dh : *dy, want.f.size()), want.f);
  MESSAGE(l.src.name << (d.splitk > 1 ? " split K" : "") << " T=" << tokens << ": rel L2 " << err);
  CHECK(err <= tolerance(d.split));
}

GemmDims dense(int k, int n, bool norm, bool bias, bool residual, int bm, bool split) {
  GemmDims d;
  d.k = k;
  d.n = n;
  d.norm = norm;
  d.bias = bias;
  d.residual = residual;
  d.bm = bm;
  d.split = split;
  return d;
}

} // namespace

TEST_CASE("dense gemm kernels match ir::ref (norm, bias, residual, row tiles 32 and 64)") {
  XSERV_REQUIRE_GPU();
  uint64_t seed = 2000;
  for (int bm : {32, 64}) {
    // Token counts: a partial tile, whole tiles, many tiles with a ragged end.
    for (int tokens : {9, 64, 300}) {
      check_dense(dense(2880, 5120, true, true, false, bm, true), tokens, ++seed); // 20b qkv
      check_dense(dense(4096, 2880, false, true, true, bm, true), tokens, ++seed); // o_proj
    }
    check_dense(dense(64, 130, false, false, false, bm, true), 40, ++seed);  // N % 128 != 0
    check_dense(dense(2880, 32, false, true, false, bm, true), 100, ++seed); // router logits
  }
  // Split K for few rows (batched decode): qkv (K 2880 = 90 tiles), o_proj (4096 = 128 tiles).
  for (int tokens : {9, 40, 64}) {
    GemmDims q = dense(2880, 512, true, true, false, tokens <= 32 ? 32 : 64, true);
    q.splitk = gemm_splitk(q.k, q.n);
    CHECK(q.splitk > 1);
    check_dense(q, tokens, ++seed);
    GemmDims o = dense(4096, 2880, false, true, true, 64, true);
    o.splitk = gemm_splitk(o.k, o.n);
    CHECK(o.splitk > 1);
    check_dense(o, tokens, ++seed);
  }
  // Plain bf16 activations (XSERV_GEMM_PRECISION=bf16).
  check_dense(dense(2880, 5120, true, true, false, 64, false), 300, ++seed);
  check_dense(dense(4096, 2880, false, true, true, 32, false), 40, ++seed);
}

// ---- grouped MoE: moe_sort, gate_up + SwiGLU, down + scatter, combine ------------------------

namespace {

/// Random distinct experts and normalised weights per token; with `skew` every token picks the
/// experts 0..k-1 (all rows on k experts: several tiles of one expert).
void routing(Rng& rng, int tokens, int experts, int k, bool skew, Tensor& w, Tensor& ids) {
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

/// moe_sort's output against the definition: pairs grouped by expert in order, ascending within
/// an expert; tiles of at most bm rows covering each expert's run exactly.
void check_sort(const Tensor& ids, int experts, int bm, const std::vector<int32_t>& pair,
                const std::vector<int32_t>& tiles) {
  std::vector<int32_t> want;
  for (int e = 0; e < experts; ++e)
    for (size_t p = 0; p < ids.i.size(); ++p)
      if (ids.i[p] == e)
        want.push_back(int32_t(p));
  CHECK(pair == want);
  int covered = 0;
  for (int t = 0; t < tiles[0]; ++t) {
    const int e = tiles[size_t(1 + 3 * t)], begin = tiles[size_t(2 + 3 * t)];
    const int end = tiles[size_t(3 + 3 * t)];
    CHECK(begin == covered);
    CHECK(end > begin);
    CHECK(end - begin <= bm);
    for (int r = begin; r < end; ++r)
      CHECK(ids.i[size_t(want[size_t(r)])] == e);
    covered = end;
  }
  CHECK(covered == int(ids.i.size()));
}

void check_grouped(const MoeDims& d, int tokens, int bm, bool split, bool skew, uint64_t seed) {
  Rng rng{seed};
  const Bf16Weight gate_up =
      random_bf16(rng, {d.experts, 2 * d.inter, d.hidden}, 4.0f / std::sqrt(float(d.hidden)));
  const Bf16Weight gate_up_b = random_bf16(rng, {d.experts, 2 * d.inter}, 0.5f);
  const Bf16Weight down =
      random_bf16(rng, {d.experts, d.hidden, d.inter}, 1.0f / std::sqrt(float(d.inter)));
  const Bf16Weight down_b = random_bf16(rng, {d.experts, d.hidden}, 0.5f);
  const Tensor x = random_f32(rng, {tokens, d.hidden}, 3.0f);
  const Tensor h = random_f32(rng, {tokens, d.hidden}, 1.0f);
  Tensor w, ids;
  routing(rng, tokens, d.experts, d.k, skew, w, ids);
  const Tensor want = d.residual
                          ? ir::ref::moe_experts_residual(x, w, ids, gate_up.t, gate_up_b.t, down.t,
                                                          down_b.t, h, d.limit, d.alpha)
                          : ir::ref::moe_experts(x, w, ids, gate_up.t, gate_up_b.t, down.t,
                                                 down_b.t, d.limit, d.alpha);
  const int pairs = tokens * d.k;
  const Loaded& sort = load(emit_moe_sort({d.experts, d.k, bm, pairs}, {}));
  GemmDims gd;
  gd.grouped = true;
  gd.experts = d.experts;
  gd.ksel = d.k;
  gd.bm = bm;
  gd.split = split;
  gd.k = d.hidden;
  gd.n = 2 * d.inter;
  gd.gather = true;
  gd.epilogue = GemmEpilogue::Swiglu;
  const Loaded& gu = load(emit_gemm(gd, {}));
  gd.k = d.inter;
  gd.n = d.hidden;
  gd.gather = false;
  gd.epilogue = GemmEpilogue::Scatter;
  const Loaded& dn = load(emit_gemm(gd, {}));
  const Loaded& comb = load(emit_moe_combine(d.hidden, d.k, d.residual, {}));

  auto dx = upload(x), dh = upload(h), dw = upload(w), dids = upload(ids);
  auto dgu = upload(gate_up.bits), dgub = upload(gate_up_b.bits);
  auto ddn = upload(down.bits), ddnb = upload(down_b.bits);
  auto pair = upload(std::vector<int32_t>(size_t(pairs), -7));
  const size_t tile_ints = moe_tiles_ints(pairs, d.experts, bm);
  auto tiles = upload(std::vector<int32_t>(tile_ints, -7));
  auto act = poisoned(size_t(pairs) * d.inter), part = poisoned(size_t(pairs) * d.hidden);
  auto y = poisoned(want.f.size());
  launch(sort, tokens, 1, dids->p, pair->p, tiles->p, tokens);
  launch_gemm(gu, tokens, dx->p, nullptr, nullptr, dgu->p, dgub->p, nullptr, act->p, pair->p,
              tiles->p, nullptr);
  launch_gemm(dn, tokens, act->p, nullptr, nullptr, ddn->p, ddnb->p, nullptr, part->p, pair->p,
              tiles->p, dw->p);
  if (d.residual)
    launch(comb, tokens, 1, part->p, dh->p, y->p);
  else
    launch(comb, tokens, 1, part->p, y->p);
  device_sync();
  check_sort(ids, d.experts, bm, download_ints(*pair, size_t(pairs)),
             download_ints(*tiles, tile_ints));
  const double err = rel_l2(download(*y, want.f.size()), want.f);
  MESSAGE(gu.src.name << " + " << dn.src.name << " T=" << tokens
                      << std::string(skew ? " skewed" : "") << ": rel L2 " << err);
  CHECK(err <= (split ? kTolSplit : 2 * kTolBf16));
}

} // namespace

TEST_CASE("moe_sort groups a step's pairs by expert, in order, at the lowering's sizes") {
  XSERV_REQUIRE_GPU();
  struct Case {
    int experts, k, tokens, bm;
    bool skew;
  };
  // One token, a chunk's worth and many chunks of 256 pairs, ragged ends; the 20b's and the
  // 120b's experts; skewed routing (a few experts get every token: long runs, many tiles).
  const Case cases[] = {{32, 4, 1, 16, false},     {32, 4, 64, 16, false},
                        {32, 4, 257, 64, false},   {32, 4, 2048, 128, false},
                        {128, 4, 1000, 32, false}, {128, 4, 300, 16, true},
                        {8, 2, 3001, 128, true},   {32, 4, 777, 64, true}};
  uint64_t seed = 3500;
  for (const Case& c : cases) {
    CAPTURE(c.experts);
    CAPTURE(c.tokens);
    CAPTURE(c.bm);
    Rng rng{++seed};
    Tensor w, ids;
    routing(rng, c.tokens, c.experts, c.k, c.skew, w, ids);
    const int pairs = c.tokens * c.k;
    const Loaded& sort = load(emit_moe_sort({c.experts, c.k, c.bm, pairs}, {}));
    auto dids = upload(ids);
    auto pair = upload(std::vector<int32_t>(size_t(pairs), -7));
    const size_t tile_ints = moe_tiles_ints(pairs, c.experts, c.bm);
    auto tiles = upload(std::vector<int32_t>(tile_ints, -7));
    launch(sort, c.tokens, 1, dids->p, pair->p, tiles->p, c.tokens);
    device_sync();
    check_sort(ids, c.experts, c.bm, download_ints(*pair, size_t(pairs)),
               download_ints(*tiles, tile_ints));
  }
}

TEST_CASE("grouped MoE gemm kernels match ir::ref (every row tile, skewed routing)") {
  XSERV_REQUIRE_GPU();
  uint64_t seed = 3000;
  const MoeDims small{256, 192, 8, 2, true};
  for (int bm : {32, 64, 128}) {
    check_grouped(small, 9, bm, true, false, ++seed);
    check_grouped(small, 150, bm, true, false, ++seed);
    check_grouped(small, 150, bm, true, true, ++seed);
  }
  check_grouped(small, 150, 64, false, false, ++seed); // plain bf16 activations
  check_grouped(small, 150, 128, false, true, ++seed);
  // The 20b shape (the reference's double loops make large token counts slow on the host).
  MoeDims g20{2880, 2880, 32, 4, true};
  check_grouped(g20, 100, 32, true, false, ++seed); // ~12 rows per expert
  g20.residual = false;
  check_grouped(g20, 40, 32, false, false, ++seed);
  // Many rows per expert in 128-row tiles: 8 experts of 20b's top-4.
  check_grouped({1024, 1024, 8, 4, true}, 300, 128, true, false, ++seed); // ~150 per expert
  check_grouped({1024, 1024, 8, 4, true}, 300, 64, true, true, ++seed);
}
