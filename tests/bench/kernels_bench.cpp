// Bandwidth of the 20b's decode kernels on the GPU (qkv, o_proj, lm_head GEMVs under tuning
// variants; the MoE decode path): median of 20 timed launches after 3 warm-ups, by CUDA events,
// weights cycled through more than the 50 MB L2. A benchmark, built with the tests and never
// run by ctest (speed asserts nothing; docs/PERF.md keeps the figures):
//   build/tests/kernels_bench            (needs a GPU; prints MESSAGE lines per variant)
#include "tests/codegen/kernel_test_util.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

using namespace xserv;
using namespace xserv::codegen;
using namespace xserv::kernel_test;

namespace {

void gemv_bandwidth(const LinearDims& d, const std::string& label) {
  Rng rng{900};
  const Bf16Weight w = random_bf16(rng, {d.n, d.k}, 0.02f);
  const size_t bytes = w.bits.size() * 2;
  // Enough copies that one pass over them all does not fit the 50 MB L2.
  const int copies = int(std::max<size_t>(2, (256u << 20) / bytes + 1));
  std::vector<std::unique_ptr<DevBuf>> ws;
  for (int c = 0; c < copies; ++c)
    ws.push_back(upload(w.bits));
  auto x = upload(random_f32(rng, {1, d.k}, 1.0f).f);
  auto ln = upload(random_bf16(rng, {d.k}, 1.0f).bits);
  auto b = upload(random_bf16(rng, {d.n}, 1.0f).bits);
  auto y = poisoned(d.n);
  const Loaded& l = load(emit_linear(d, {}));
  auto h = upload(random_f32(rng, {1, d.n}, 1.0f).f);
  REQUIRE((d.norm || (d.bias && d.residual))); // the shapes measured here
  const double ms = median_ms([&](int i) {
    if (!d.norm)
      launch(l, 1, 1, x->p, ws[i % copies]->p, b->p, h->p, y->p, 1);
    else if (d.bias)
      launch(l, 1, 1, x->p, ln->p, ws[i % copies]->p, b->p, y->p, 1);
    else
      launch(l, 1, 1, x->p, ln->p, ws[i % copies]->p, y->p, 1);
  });
  device_sync();
  MESSAGE("bandwidth " << label << " " << l.src.name << " T=1: " << ms * 1e3 << " us, "
                       << bytes / (ms * 1e-3) / 1e9 << " GB/s of weights");
}

/// The 20b's qkv_decode (2880 -> 4096 + 512 + 512) at T=1 under a tuning variant.
void qkv_bandwidth(QkvDims d) {
  Rng rng{902};
  const size_t n = size_t(d.nq + d.nk + d.nv), bytes = n * d.k * 2;
  const int copies = int((256u << 20) / bytes + 1);
  std::vector<std::unique_ptr<DevBuf>> ws;
  const Bf16Weight w = random_bf16(rng, {int(n), d.k}, 0.02f);
  for (int c = 0; c < copies; ++c)
    ws.push_back(upload(w.bits));
  auto x = upload(random_f32(rng, {1, d.k}, 1.0f).f);
  auto ln = upload(random_bf16(rng, {d.k}, 1.0f).bits);
  auto b = upload(random_bf16(rng, {int(n)}, 1.0f).bits);
  auto y = poisoned(n);
  const Loaded& l = load(emit_qkv_decode(d, {}));
  const auto* bb = static_cast<const uint16_t*>(b->p);
  float* yq = static_cast<float*>(y->p);
  const double ms = median_ms([&](int i) {
    const auto* wq = static_cast<const uint16_t*>(ws[i % copies]->p);
    launch(l, 1, 1, x->p, ln->p, wq, bb, wq + size_t(d.nq) * d.k, bb + d.nq,
           wq + size_t(d.nq + d.nk) * d.k, bb + d.nq + d.nk, yq, yq + d.nq, yq + d.nq + d.nk, 1);
  });
  device_sync();
  MESSAGE("bandwidth qkv_decode " << l.src.name << " T=1: " << ms * 1e3 << " us, "
                                  << bytes / (ms * 1e-3) / 1e9 << " GB/s of weights");
}

} // namespace

TEST_CASE("bandwidth of the 20b's decode GEMVs under tuning variants (informational)") {
  XSERV_REQUIRE_GPU();
  // (rows per warp, loads in flight per lane and row, most tokens per launch, K splits);
  // {0, 4, 8, 1} is the default the lowering used before split-K.
  // K splits: 2, 4 or 8 warps share a row group, each over that part of K.
  const std::vector<std::tuple<int, int, int, int>> variants = {
      {0, 4, 8, 1}, {0, 4, 1, 1}, {0, 4, 1, 2}, {0, 4, 1, 4}, {0, 2, 1, 4}, {0, 2, 1, 8},
      {1, 4, 1, 4}, {1, 2, 1, 8}, {4, 2, 1, 4}, {0, 4, 8, 4}, {0, 2, 8, 8}};
  for (auto [rows, unroll, max_t, ks] : variants) {
    QkvDims q{2880, 4096, 512, 512, 1e-5, max_t};
    q.rows = rows;
    q.unroll = unroll;
    q.ksplit = ks;
    if (qkv_decode_fits(q))
      qkv_bandwidth(q);
  }
  for (auto [rows, unroll, max_t, ks] : variants) { // o_proj: 4096 -> 2880, bias and residual
    LinearDims o{4096, 2880, false, true, true, 1e-5, max_t};
    o.rows = rows;
    o.unroll = unroll;
    o.ksplit = ks;
    gemv_bandwidth(o, "o_proj");
  }
}

TEST_CASE("bandwidth of the 20b-shaped decode GEMV and MoE (informational)") {
  XSERV_REQUIRE_GPU();
  gemv_bandwidth({2880, 5120, true, true, false, 1e-5}, "qkv");
  LinearDims pf{2880, 5120, true, true, false, 1e-5};
  pf.prefetch = true;
  gemv_bandwidth(pf, "qkv, with L2 prefetch");
  gemv_bandwidth({2880, 201088, true, false, false, 1e-5}, "lm_head");
  pf = {2880, 201088, true, false, false, 1e-5};
  pf.prefetch = true;
  gemv_bandwidth(pf, "lm_head, with L2 prefetch");

  const MoeDims d{2880, 2880, 32, 4, true};
  Rng rng{901};
  const MoeWeights mw(rng, d);
  auto x = upload(random_f32(rng, {1, d.hidden}, 1.0f).f);
  auto h = upload(random_f32(rng, {1, d.hidden}, 1.0f).f);
  auto y = poisoned(d.hidden), act = poisoned(size_t(d.k) * d.inter);
  std::vector<std::unique_ptr<DevBuf>> id_sets, w_sets;
  for (int s = 0; s < 8; ++s) { // 8 disjoint expert sets: 1.6 GB cycled, beyond L2
    id_sets.push_back(upload(std::vector<int32_t>{4 * s, 4 * s + 1, 4 * s + 2, 4 * s + 3}));
    w_sets.push_back(upload(std::vector<float>{0.4f, 0.3f, 0.2f, 0.1f}));
  }
  MoeDims with_pf = d; // the first kernels, as measured in docs/PERF.md
  with_pf.prefetch = true;
  const Loaded& gu = load(emit_moe_gate_up(with_pf, {}));
  const Loaded& dn = load(emit_moe_down(d, {}));
  const double ms = median_ms([&](int i) {
    launch(gu, 1, 1, x->p, id_sets[i % 8]->p, mw.d_gate_up->p, mw.d_gate_up_b->p, act->p);
    launch(dn, 1, 1, act->p, w_sets[i % 8]->p, id_sets[i % 8]->p, mw.d_down->p, mw.d_down_b->p,
           h->p, y->p);
  });
  device_sync();
  const double bytes = double(d.k) * (3.0 * d.inter * d.hidden) * 2;
  MESSAGE("bandwidth moe_decode (gate_up + down, 4 experts) T=1: "
          << ms * 1e3 << " us, " << bytes / (ms * 1e-3) / 1e9 << " GB/s of weights");

  // The engine's decode path (gate_up, down per (token, slot), combine) under tuning variants:
  // rows per warp, loads in flight per lane and row, gate_up's L2 prefetch.
  auto part = poisoned(size_t(d.k) * d.hidden);
  // (rows per warp, loads in flight, L2 prefetch, blocks per SM for the register cap)
  for (auto [rows, unroll, prefetch, min_blocks] :
       {std::tuple{0, 2, false, 0}, std::tuple{0, 4, false, 0}, std::tuple{0, 2, false, 5},
        std::tuple{0, 2, false, 6}, std::tuple{3, 2, false, 0}, std::tuple{3, 2, false, 5},
        std::tuple{1, 2, false, 8}}) {
    MoeDims v = d;
    v.rows = rows;
    v.unroll = unroll;
    v.prefetch = prefetch;
    v.min_blocks = min_blocks;
    const Loaded& vgu = load(emit_moe_gate_up(v, {}));
    const Loaded& vdp = load(emit_moe_down_part(v, {}));
    const Loaded& comb = load(emit_moe_combine(d.hidden, d.k, true, {}));
    const double vms = median_ms([&](int i) {
      launch(vgu, 1, 1, x->p, id_sets[i % 8]->p, mw.d_gate_up->p, mw.d_gate_up_b->p, act->p);
      launch(vdp, 1, 1, act->p, w_sets[i % 8]->p, id_sets[i % 8]->p, mw.d_down->p, mw.d_down_b->p,
             part->p);
      launch(comb, 1, 1, part->p, h->p, y->p);
    });
    device_sync();
    MESSAGE("bandwidth moe_decode engine path rows "
            << rows << " unroll " << unroll << " prefetch " << prefetch << " min blocks "
            << min_blocks << ": " << vms * 1e3 << " us, " << bytes / (vms * 1e-3) / 1e9 << " GB/s");
  }
}
