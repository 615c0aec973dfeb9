// The MoE in one canonical order (issue: batch invariance by default): the decode kernels in the
// canonical order (MoeDims::mma_chain, Mx4ChainRows: gemm_wg's K slots, exact bf16
// dequantisation, one chain a row) give a token the same output bits as the grouped gemm_wg
// gemms of a larger step, whatever the step's size, the token tiles or the experts' weight
// format. Bit for bit, on the 20b's shapes and a small one, scale bytes below and above 128 (the
// one- and two-multiply dequantisations).
#include "tests/codegen/gemm_wg_test_util.h"

#include <cstring>

using namespace xserv;
using namespace xserv::codegen;
using namespace xserv::kernel_test;
using namespace xserv::kernel_test::wg;

namespace {

/// The decode path of c's MoE block (gate_up + SwiGLU per (token, slot), the down rows per
/// (token, slot), moe_combine) in the canonical order; the output's bits.
std::vector<uint32_t> run_decode_chain(const MoeCase& c, uint64_t seed) {
  MoeDims d = c.d;
  d.mxfp4 = true;
  d.round_act = true;
  d.mma = true;
  d.mma_chain = true;
  d.mma_stages = kMoeMmaStages;
  REQUIRE(moe_mma_fits(d));
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
    c.stages = k.bn == 128 ? 3 : 4;
    c.scale_lo = k.lo;
    c.scale_hi = k.hi;
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
  }
}
