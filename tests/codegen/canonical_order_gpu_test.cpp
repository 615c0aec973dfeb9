// The gemms' canonical order (docs/DESIGN.md): the decode kernels in it give a token the same
// output bits as gemm_wg in a larger step, whatever the step's size, the token tiles or the
// experts' weight format. The MoE (MoeDims::mma_chain, Mx4ChainRows: gemm_wg's K slots, exact
// bf16 dequantisation, one chain over K: moe_chain_splits; the grouped gemms in the lowering's
// pipelines, kWgMoeTilings), on the 20b's shapes and a small one, scale bytes below and above 128 (the one- and two-multiply
// dequantisations); the dense linears (linear_decode_mma and linear_decode_smem with CHAIN)
// against the gemm with K split over blocks and as chunks in registers.
#include "tests/codegen/gemm_wg_test_util.h"

#include <cstring>

using namespace xserv;
using namespace xserv::codegen;
using namespace xserv::kernel_test;
using namespace xserv::kernel_test::wg;

namespace {

/// The decode path of c's MoE block (gate_up + SwiGLU per (token, slot), the down rows per
/// (token, slot), moe_combine) in the canonical order; the output's bits. `cols`: the kernels of
/// 2-8 tokens with an expert a block and the tokens as the MMA's columns instead.
std::vector<uint32_t> run_decode_chain(const MoeCase& c, uint64_t seed, bool cols = false) {
  MoeDims d = c.d;
  d.mxfp4 = true;
  d.round_act = true;
  d.mma = true;
  d.mma_chain = true;
  d.mma_stages = kMoeMmaStages;
  d.mma_cols = cols;
  REQUIRE(moe_mma_fits(d));
  REQUIRE((!cols || moe_cols_fits(d)));
  const MoeInputs in = moe_inputs(c, seed);
  const int pairs = c.tokens * d.k;
  const Loaded& kgu = load(emit_moe_gate_up(d, {}));
  const Loaded& kdn = load(emit_moe_down_part(d, {}));
  const Loaded& comb = load(emit_moe_combine(d.hidden, d.k, true, {}));
  auto dx = upload(in.x), dh = upload(in.h), dw = upload(in.w), dids = upload(in.ids);
  auto dgu = upload(in.gu.device), ddn = upload(in.dn.device);
  auto dgub = upload(in.gub.bits), ddnb = upload(in.dnb.bits);
  auto act = poisoned(size_t(pairs) * d.inter), part = poisoned(size_t(pairs) * d.hidden);
  auto y = poisoned(size_t(c.tokens) * d.hidden);
  launch(kgu, c.tokens, 1, dx->p, dids->p, dgu->p, dgub->p, act->p);
  launch(kdn, c.tokens, 1, act->p, dw->p, dids->p, ddn->p, ddnb->p, part->p);
  launch(comb, c.tokens, 1, part->p, dh->p, y->p);
  device_sync();
  const std::vector<float> got = download(*y, size_t(c.tokens) * d.hidden);
  std::vector<uint32_t> bits(got.size());
  std::memcpy(bits.data(), got.data(), got.size() * 4);
  MESSAGE(kgu.src.name << " + " << kdn.src.name << " T=" << c.tokens);
  return bits;
}

int differing(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
  int n = 0;
  for (size_t i = 0; i < a.size(); ++i)
    n += a[i] != b[i];
  return n;
}

} // namespace

TEST_CASE("MoE decode kernels in the canonical order give the grouped gemms' bits") {
  XSERV_REQUIRE_GPU();
  if (!sm90()) {
    MESSAGE("skipped: the canonical MoE order is gemm_wg's (sm_90)");
    return;
  }
  uint64_t seed = 7300;
  struct Case {
    MoeDims d;
    int tokens, bn, wm;
    bool skew;
    int lo, hi;
  };
  const MoeDims small{256, 192, 8, 2, true};
  const MoeDims g20{2880, 2880, 32, 4, true};
  // Decode-sized steps against the gemms' tiles of 16 to 128 tokens (the lowering's), skewed
  // routing (several tiles of one expert), scale bytes past 128.
  const Case cases[] = {
      {small, 1, 16, 2, false, 117, 128}, {small, 5, 64, 1, false, 117, 128},
      {small, 9, 128, 2, true, 100, 140}, {small, 40, 32, 2, false, 120, 200},
      {g20, 1, 16, 2, false, 117, 128},   {g20, 8, 64, 2, false, 117, 128},
      {g20, 3, 16, 2, true, 110, 135},    {g20, 150, 128, 2, true, 117, 128},
  };
  for (const Case& k : cases) {
    MoeCase c{k.d, k.tokens, k.bn, k.wm, false, k.skew, true};
    for (const codegen::WgMoeTiling& t : codegen::kWgMoeTilings)
      if (t.bn == k.bn) { // the lowering's pipeline for this tile (MXFP4 experts)
        c.stages = t.stages;
        c.ksub = t.ksub;
        c.pipe = t.pipe;
      }
    c.scale_lo = k.lo;
    c.scale_hi = k.hi;
    c.check_accuracy = k.lo == 117 && k.hi == 128; // here the bits are the point
    c.canonical = true;
    ++seed;
    CAPTURE(k.d.hidden);
    CAPTURE(k.tokens);
    CAPTURE(k.bn);
    CAPTURE(k.lo);
    CAPTURE(k.hi);
    const auto gemm = run_moe(c, seed); // BF16 weights, then MXFP4 ones of the same values
    REQUIRE(gemm.size() == 2);
    CHECK(differing(gemm[0], gemm[1]) == 0);
    const auto decode = run_decode_chain(c, seed);
    const int diff = differing(decode, gemm[0]);
    MESSAGE("decode chain against gemm_wg (" << k.bn << "-token tiles): " << diff << " of "
                                             << decode.size() << " values differ");
    CHECK(diff == 0);
    if (k.tokens >= 2 && k.tokens <= 8) { // the tokens-as-columns kernels of such steps too
      const auto cols = run_decode_chain(c, seed, true);
      CHECK(differing(cols, gemm[0]) == 0);
    }
  }
}

TEST_CASE("decode linears in the canonical order give the dense gemms' bits") {
  XSERV_REQUIRE_GPU();
  if (!sm90()) {
    MESSAGE("skipped: the canonical dense order is gemm_wg's (sm_90)");
    return;
  }
  struct Shape {
    const char* name;
    int k, n;
    bool bias, residual;
  };
  // The lowering's splits (wg_splitk): the 20b's o_proj 8, a wide output (lm_head's kind) 1,
  // qkv's 3.
  const Shape shapes[] = {{"o_proj", 4096, 2880, true, true},
                          {"lm_head-like", 2880, 8192, false, false},
                          {"qkv-like", 2880, 5120, true, false}};
  uint64_t seed = 7400;
  for (const Shape& s : shapes) {
    const int splitk = wg_splitk(s.k, s.n);
    CAPTURE(s.name);
    CAPTURE(splitk);
    Rng rng{++seed};
    const int tokens = 160;
    const Tensor x = random_f32(rng, {tokens, s.k}, 2.0f);
    const Bf16Weight w = random_bf16(rng, {s.n, s.k}, 1.0f / std::sqrt(float(s.k)));
    const Bf16Weight b = random_bf16(rng, {s.n}, 0.5f);
    const Tensor h = random_f32(rng, {tokens, s.n}, 1.0f);
    auto dx = upload(x), dw = upload(w.bits), db = upload(b.bits), dh = upload(h);
    LinearDims d{s.k, s.n, false, s.bias, s.residual};
    d.round_act = true;
    d.mma = true;
    d.mma_chain = true;
    d.mma_splits = splitk;
    d.max_tokens = 8;
    REQUIRE(linear_mma_fits(d));
    const Loaded& l = load(emit_linear(d, {}));
    // The gemm at 64 tokens (K split over blocks, as the lowering's up to 64 rows) and at 160
    // (128-token tiles, the same K ranges as chunks in registers, as above 64 rows).
    const std::vector<uint32_t> g64 = dense_gemm_bits(d, splitk, 64, 64, *dx, *dw, *db, *dh);
    const std::vector<uint32_t> g160 =
        dense_gemm_bits(d, 1, 128, tokens, *dx, *dw, *db, *dh, splitk);
    // ... which agree on the rows both have
    CHECK(differing(g64, std::vector<uint32_t>(g160.begin(), g160.begin() + std::ptrdiff_t(
                                                                                g64.size()))) == 0);
    for (int t : {1, 3, 8}) {
      auto hc = upload(download(*dh, size_t(t) * s.n));
      auto y = poisoned(size_t(t) * s.n);
      void* out = s.residual ? hc->p : y->p;
      if (s.residual)
        launch(l, t, 1, dx->p, dw->p, db->p, hc->p, out, t);
      else if (s.bias)
        launch(l, t, 1, dx->p, dw->p, db->p, out, t);
      else
        launch(l, t, 1, dx->p, dw->p, out, t);
      device_sync();
      const std::vector<float> got = download(s.residual ? *hc : *y, size_t(t) * s.n);
      std::vector<uint32_t> bits(got.size());
      std::memcpy(bits.data(), got.data(), got.size() * 4);
      const std::vector<uint32_t> want64(g64.begin(), g64.begin() + std::ptrdiff_t(bits.size()));
      const std::vector<uint32_t> want160(g160.begin(),
                                          g160.begin() + std::ptrdiff_t(bits.size()));
      const int diff = differing(bits, want64), diff160 = differing(bits, want160);
      MESSAGE(l.src.name << " T=" << t << ": against gemm_wg at 64 tokens " << diff
                         << ", at 160 " << diff160 << " of " << bits.size() << " differ");
      CHECK(diff == 0);
      CHECK(diff160 == 0);
    }
    // One token with its rows resident in shared memory (the lowering's o_proj of one-token
    // steps), where 8 K splits are its warps.
    LinearDims ds = d;
    ds.mma = false;
    ds.max_tokens = 1;
    ds.smem = true;
    if (!linear_smem_chain_fits(ds))
      continue;
    const Loaded& l1 = load(emit_linear(ds, {}));
    auto hc = upload(download(*dh, size_t(s.n)));
    auto y = poisoned(size_t(s.n));
    void* out = s.residual ? hc->p : y->p;
    if (s.residual)
      launch(l1, 1, 1, dx->p, dw->p, db->p, hc->p, out, 1);
    else
      launch(l1, 1, 1, dx->p, dw->p, db->p, out, 1);
    device_sync();
    const std::vector<float> got = download(s.residual ? *hc : *y, size_t(s.n));
    std::vector<uint32_t> bits(got.size());
    std::memcpy(bits.data(), got.data(), got.size() * 4);
    const int diff = differing(bits, std::vector<uint32_t>(g64.begin(), g64.begin() + s.n));
    MESSAGE(l1.src.name << " T=1: against gemm_wg at 64 tokens " << diff << " of " << s.n
                        << " differ");
    CHECK(diff == 0);
  }
}
