// The MoE decode kernels with the step's tokens as the MMA's columns (codegen/kernels/
// moe_cols.cuh, MoeDims::mma_cols) against the per-pair tensor-core kernels they stand in for
// in steps of 2 to 8 tokens: every (token, slot) pair's SwiGLU row and weighted down row the
// same bits, whichever tokens share an expert, with the weights in registers or through the
// ring, and on the exact path (scale bytes past 192).
#include "tests/codegen/gemm_wg_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

using namespace xserv;
using namespace xserv::codegen;
using namespace xserv::kernel_test;
using namespace xserv::kernel_test::wg;
using ir::DType;
using ir::Tensor;

namespace {

/// Routing of `tokens` tokens, k distinct experts each, drawn from the first `pool` experts (a
/// small pool: many tokens share an expert; the whole set: few do).
Tensor routing(Rng& rng, int tokens, int k, int pool) {
  Tensor ids = Tensor::zeros(DType::I32, {tokens * k});
  for (int t = 0; t < tokens; ++t)
    for (int s = 0; s < k; ++s) {
      int e = 0;
      bool fresh = false;
      while (!fresh) {
        e = int((rng.next(1.0f) + 1.0f) * 0.5f * float(pool)) % pool;
        fresh = true;
        for (int q = 0; q < s; ++q)
          fresh = fresh && ids.i[size_t(t * k + q)] != e;
      }
      ids.i[size_t(t * k + s)] = e;
    }
  return ids;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

} // namespace

TEST_CASE("MoE decode kernels with tokens as columns give the per-pair kernels' bits") {
  XSERV_REQUIRE_GPU();
  if (!sm90()) {
    MESSAGE("skipped: the tensor-core MoE decode kernels are sm_90 plans' kernels");
    return;
  }
  uint64_t seed = 9400;
  // The 20b's experts, the 120b's expert count (smaller matrices: four words of experts a
  // step), and a small model's sizes; the weights made once a scale range, then both tilings.
  std::vector<MoeDims> dims;
  for (MoeDims d : {MoeDims{2880, 2880, 32, 4, false}, MoeDims{256, 256, 128, 4, false},
                    MoeDims{128, 64, 8, 2, false}}) {
    d.mxfp4 = true;
    d.round_act = true;
    d.mma = true;
    dims.push_back(d);
  }
  // Every kernel compiled at once (24 NVRTC compiles one after the other take minutes).
  std::vector<KernelSource> all;
  for (MoeDims d : dims)
    for (int stages : {kMoeMmaStages, 0}) {
      d.mma_stages = stages;
      MoeDims c = d;
      c.mma_cols = true;
      if (!moe_mma_fits(d) || !moe_cols_fits(c))
        continue;
      for (const MoeDims& v : {d, c}) {
        all.push_back(emit_moe_gate_up(v, {}));
        all.push_back(emit_moe_down_part(v, {}));
      }
    }
  preload(std::move(all));
  for (MoeDims d : dims)
    for (auto [lo, hi] : {std::pair{117, 130}, std::pair{185, 200}}) {
      Rng rng{++seed};
      const Mxfp4Weight gu = random_mxfp4(rng, d.experts, 2 * d.inter, d.hidden, lo, hi);
      const Mxfp4Weight dn = random_mxfp4(rng, d.experts, d.hidden, d.inter, lo, hi);
      const Bf16Weight gub = random_bf16(rng, {d.experts, 2 * d.inter}, 0.5f);
      const Bf16Weight dnb = random_bf16(rng, {d.experts, d.hidden}, 0.5f);
      auto dgu = upload(gu.device), dgub = upload(gub.bits), ddn = upload(dn.device),
           ddnb = upload(dnb.bits);
      for (int stages : {kMoeMmaStages, 0}) { // the ring (the lowering's), words into registers
        d.mma_stages = stages;
        MoeDims c = d;
        c.mma_cols = true;
        if (!moe_mma_fits(d) || !moe_cols_fits(c))
          continue;
        const Loaded& pair_gu = load(emit_moe_gate_up(d, {}));
        const Loaded& pair_dn = load(emit_moe_down_part(d, {}));
        const Loaded& cols_gu = load(emit_moe_gate_up(c, {}));
        const Loaded& cols_dn = load(emit_moe_down_part(c, {}));
        for (int tokens : {2, 3, 5, 8})
          for (int pool : {d.k + 1, d.experts}) {
            CAPTURE(d.hidden);
            CAPTURE(d.experts);
            CAPTURE(stages);
            CAPTURE(lo);
            CAPTURE(tokens);
            CAPTURE(pool);
            const int pairs = tokens * d.k;
            const Tensor x = random_f32(rng, {tokens, d.hidden}, 2.0f);
            const Tensor act = random_f32(rng, {pairs, d.inter}, 2.0f);
            const Tensor w = random_f32(rng, {pairs}, 1.0f);
            const Tensor ids = routing(rng, tokens, d.k, pool);
            auto dx = upload(x), dact = upload(act), dw = upload(w), dids = upload(ids);
            // gate_up + SwiGLU, then down from one activation input (the same for both), so a
            // difference in either kernel shows in its own output.
            auto run = [&](const Loaded& kgu, const Loaded& kdn, std::vector<float>& a,
                           std::vector<float>& p) {
              auto dacto = poisoned(size_t(pairs) * d.inter);
              auto dpart = poisoned(size_t(pairs) * d.hidden);
              launch(kgu, tokens, 1, dx->p, dids->p, dgu->p, dgub->p, dacto->p);
              launch(kdn, tokens, 1, dact->p, dw->p, dids->p, ddn->p, ddnb->p, dpart->p);
              device_sync();
              a = download(*dacto, size_t(pairs) * d.inter);
              p = download(*dpart, size_t(pairs) * d.hidden);
            };
            std::vector<float> pa, pp, ca, cp;
            run(pair_gu, pair_dn, pa, pp);
            run(cols_gu, cols_dn, ca, cp);
            // Every pair written (the outputs start as NaN), and the same bits.
            CHECK(std::none_of(ca.begin(), ca.end(), [](float v) { return std::isnan(v); }));
            CHECK(std::none_of(cp.begin(), cp.end(), [](float v) { return std::isnan(v); }));
            CHECK(same_bits(ca, pa));
            CHECK(same_bits(cp, pp));
          }
      }
    }
}
