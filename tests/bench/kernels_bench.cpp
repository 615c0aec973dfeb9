// The 20b's kernels on the GPU under tuning variants: median of 20 timed launches after 3
// warm-ups, by CUDA events, weights cycled beyond the 50 MB L2. Never run by ctest (speed asserts
// nothing; docs/PERF.md keeps the figures): build/tests/kernels_bench (MESSAGE lines a variant).
#include "tests/codegen/kernel_test_util.h"

#include "codegen/emit_wg.h"

#if XSERV_HAVE_CUBLAS
#include <cublas_v2.h>
#endif
#include "models/bf16.h"
#include "models/mxfp4.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
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
  // (rows per warp, loads in flight per lane and row, most tokens per launch, K splits: 2, 4 or
  // 8 warps share a row group, each over that part of K); {0, 4, 8, 1}: before split-K.
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

namespace { // prefill and batched-decode gemms: mma.sync (gemm.cuh), warpgroup MMA (gemm_wg.cuh)

/// Dry runs collect the variants' kernels (compiled together by preload) instead of running.
bool g_dry = false;
std::vector<KernelSource> g_sources;

/// The loaded kernel of `src`, or nullptr in a dry run (which only collects it).
const Loaded* want(KernelSource src) {
  if (g_dry) {
    g_sources.push_back(std::move(src));
    return nullptr;
  }
  return &load(std::move(src));
}

/// Whether the GPU runs gemm_wg (sm_90); if not, says the case is skipped.
bool wg_arch() {
  if (runtime::probe_device().arch() == "sm_90")
    return true;
  MESSAGE("skipped: gemm_wg needs sm_90");
  return false;
}

/// Runs `variants` dry (collecting their kernels), compiles those together, then `setup` (the
/// inputs the real run needs), then runs them.
template <typename F, typename S> void with_preloaded(F&& variants, S&& setup) {
  g_dry = true;
  variants();
  g_dry = false;
  preload(std::move(g_sources));
  g_sources.clear();
  setup();
  variants();
}
template <typename F> void with_preloaded(F&& variants) {
  with_preloaded(variants, [] {});
}

/// One layer's MoE weights of the 20b in both formats (random codes, realistic scales) and a
/// step's routing of `tokens` tokens (uniform random distinct experts).
struct MoeBench {
  MoeDims d{2880, 2880, 32, 4, true};
  std::unique_ptr<DevBuf> gu16, dn16, gu4, dn4, gub, dnb;
  MoeBench() {
    Rng rng{950};
    auto mx = [&](int rows, int cols, std::unique_ptr<DevBuf>& b16, std::unique_ptr<DevBuf>& b4) {
      const size_t n = size_t(d.experts) * rows * cols;
      std::vector<uint8_t> dev(n / 2 + n / 32);
      for (size_t i = 0; i < n / 2; ++i)
        dev[i] = uint8_t(int((rng.next(1.0f) + 1.0f) * 128.0f) & 0xff);
      for (size_t i = n / 2; i < dev.size(); ++i)
        dev[i] = uint8_t(118 + int((rng.next(1.0f) + 1.0f) * 2.0f));
      std::vector<float> f(n);
      models::mxfp4_decode_row({dev.data(), n / 2}, {dev.data() + n / 2, n / 32}, f);
      std::vector<uint16_t> bits(n);
      for (size_t i = 0; i < n; ++i)
        bits[i] = models::float_to_bf16(f[i]);
      b16 = upload(bits);
      b4 = upload(dev);
    };
    mx(2 * d.inter, d.hidden, gu16, gu4);
    mx(d.hidden, d.inter, dn16, dn4);
    gub = upload(random_bf16(rng, {d.experts, 2 * d.inter}, 0.5f).bits);
    dnb = upload(random_bf16(rng, {d.experts, d.hidden}, 0.5f).bits);
  }
};

/// The MoE dimensions of the benchmark (also in a dry run, before the weights exist).
const MoeDims* mb_dims(const MoeBench* mb) {
  static const MoeDims d{2880, 2880, 32, 4, true};
  return mb ? &mb->d : &d;
}

struct Routing {
  std::unique_ptr<DevBuf> x, ids, w, xh, xl, act, ah, al, part;
};

Routing make_routing(const MoeDims& d, int tokens, uint64_t seed) {
  Rng rng{seed};
  std::vector<int32_t> ids(size_t(tokens) * d.k);
  std::vector<float> w(ids.size(), 1.0f / float(d.k));
  for (int t = 0; t < tokens; ++t)
    for (int j = 0; j < d.k; ++j) {
      int e;
      bool dup;
      do {
        e = int((rng.next(1.0f) + 1.0f) * 0.5f * float(d.experts)) % d.experts;
        dup = false;
        for (int i = 0; i < j; ++i)
          dup |= ids[size_t(t * d.k + i)] == e;
      } while (dup);
      ids[size_t(t * d.k + j)] = e;
    }
  Routing r;
  r.x = upload(random_f32(rng, {tokens, d.hidden}, 1.0f).f);
  r.ids = upload(ids);
  r.w = upload(w);
  const size_t pairs = size_t(tokens) * d.k;
  r.xh = poisoned(size_t(tokens) * d.hidden / 2);
  r.xl = poisoned(size_t(tokens) * d.hidden / 2);
  r.act = poisoned(pairs * d.inter);
  r.ah = poisoned(pairs * d.inter / 2);
  r.al = poisoned(pairs * d.inter / 2);
  r.part = poisoned(pairs * d.hidden);
  return r;
}

void report(const std::string& label, double ms, double flops, double bytes) {
  MESSAGE("gemm " << label << ": " << ms * 1e3 << " us, " << flops / (ms * 1e-3) / 1e12
                  << " TFLOP/s, " << bytes / (ms * 1e-3) / 1e9 << " GB/s of weights");
}

/// The MoE block's two gemms at T tokens through gemm_wg with one tile shape: gate_up + act +
/// down in us (-1 in a dry run or when the shape does not fit).
double moe_wg(const MoeBench* pmb, int tokens, int bn, int wm, int stages, bool mx4, bool split,
              int ksub = 1, bool pipe = false, bool small = false, int min_blocks = 0,
              bool steps = false) {
  const MoeDims& d = *mb_dims(pmb);
  const int pairs = tokens * d.k;
  GemmWgDims g;
  g.grouped = true;
  g.experts = d.experts;
  g.ksel = d.k;
  g.bn = bn;
  g.wm = wm;
  g.stages = stages;
  g.ksub = ksub;
  g.pipe = pipe;
  g.split = split;
  g.mxfp4 = mx4;
  g.small_scales = mx4 && small;
  g.min_blocks = min_blocks;
  g.steps = steps;
  g.k = d.hidden;
  g.n = 2 * d.inter;
  g.gather = true;
  g.epilogue = GemmEpilogue::Swiglu;
  if (!gemm_wg_fits(g))
    return -1;
  const Loaded* pgu = want(emit_gemm_wg(g, {}));
  g.k = d.inter;
  g.n = d.hidden;
  g.gather = false;
  g.epilogue = GemmEpilogue::Scatter;
  const Loaded* pdn = want(emit_gemm_wg(g, {}));
  const Loaded* pact = want(emit_gemm_act({d.inter, false, split, 1e-5, d.k}, {}));
  const Loaded* psort = want(emit_moe_sort({d.experts, d.k, bn, pairs}, {}));
  const Loaded* pxact = want(emit_gemm_act({d.hidden, false, split, 1e-5, 1}, {}));
  if (g_dry)
    return -1;
  const Loaded &gu = *pgu, &dn = *pdn, &act = *pact;
  Routing r = make_routing(d, tokens, 960 + uint64_t(tokens));
  auto pair = poisoned(size_t(pairs));
  auto tiles = poisoned(moe_tiles_ints(pairs, d.experts, bn));
  launch(*psort, tokens, 1, r.ids->p, pair->p, tiles->p, tokens);
  launch(*pxact, tokens, 1, r.x->p, nullptr, r.xh->p, split ? r.xl->p : nullptr);
  const MoeBench& mb = *pmb;
  const void* wgu = mx4 ? mb.gu4->p : mb.gu16->p;
  const void* wdn = mx4 ? mb.dn4->p : mb.dn16->p;
  const double ms_gu = median_ms([&](int) {
    launch(gu, tokens, 1, r.xh->p, split ? r.xl->p : nullptr, wgu, mb.gub->p, nullptr, r.act->p,
           pair->p, tiles->p, nullptr, tokens);
  });
  const double ms_act = median_ms(
      [&](int) { launch(act, tokens, 1, r.act->p, nullptr, r.ah->p, split ? r.al->p : nullptr); });
  const double ms_dn = median_ms([&](int) {
    launch(dn, tokens, 1, r.ah->p, split ? r.al->p : nullptr, wdn, mb.dnb->p, nullptr, r.part->p,
           pair->p, tiles->p, r.w->p, tokens);
  });
  device_sync();
  const double wbytes = mx4 ? 17.0 / 32.0 : 2.0; // bytes per weight
  const double per = double(d.hidden) * d.inter; // weights per matrix row block
  const std::string tag =
      fmt::format("T={} bn {} m{} stages {} ksub {}{}{} {}{} {}{}", tokens, bn, 64 * wm, stages,
                  ksub, pipe ? " pipe" : "", steps ? " steps" : "", mx4 ? "mxfp4" : "bf16",
                  g.small_scales ? " (small)" : "", split ? "split" : "bf16-act",
                  min_blocks > 0 ? fmt::format(" {} blocks an SM", min_blocks) : "");
  report("moe gate_up wg " + tag, ms_gu, 2.0 * pairs * 2 * per, d.experts * 2 * per * wbytes);
  report("moe down wg " + tag, ms_dn, 2.0 * pairs * per, d.experts * per * wbytes);
  MESSAGE("gemm moe wg " << tag << ": gate_up + act + down " << (ms_gu + ms_act + ms_dn) * 1e3
                         << " us (act " << ms_act * 1e3 << " us)");
  return (ms_gu + ms_act + ms_dn) * 1e3;
}

/// The same through the mma.sync gemm (the engine's path before gemm_wg).
void moe_mma(const MoeBench* pmb, int tokens, int bm, bool mx4, bool split) {
  const MoeDims& d = *mb_dims(pmb);
  const int pairs = tokens * d.k;
  GemmDims g;
  g.grouped = true;
  g.experts = d.experts;
  g.ksel = d.k;
  g.bm = bm;
  g.split = split;
  g.mxfp4 = mx4;
  g.k = d.hidden;
  g.n = 2 * d.inter;
  g.gather = true;
  g.epilogue = GemmEpilogue::Swiglu;
  const Loaded* pgu = want(emit_gemm(g, {}));
  g.k = d.inter;
  g.n = d.hidden;
  g.gather = false;
  g.epilogue = GemmEpilogue::Scatter;
  const Loaded* pdn = want(emit_gemm(g, {}));
  const Loaded* psort = want(emit_moe_sort({d.experts, d.k, bm, pairs}, {}));
  if (g_dry)
    return;
  const Loaded &gu = *pgu, &dn = *pdn;
  Routing r = make_routing(d, tokens, 960 + uint64_t(tokens));
  auto pair = poisoned(size_t(pairs));
  auto tiles = poisoned(moe_tiles_ints(pairs, d.experts, bm));
  launch(*psort, tokens, 1, r.ids->p, pair->p, tiles->p, tokens);
  const MoeBench& mb = *pmb;
  const void* wgu = mx4 ? mb.gu4->p : mb.gu16->p;
  const void* wdn = mx4 ? mb.dn4->p : mb.dn16->p;
  const double ms = median_ms([&](int) {
    launch(gu, tokens, 1, r.x->p, nullptr, nullptr, wgu, mb.gub->p, nullptr, r.act->p, pair->p,
           tiles->p, nullptr, tokens);
    launch(dn, tokens, 1, r.act->p, nullptr, nullptr, wdn, mb.dnb->p, nullptr, r.part->p, pair->p,
           tiles->p, r.w->p, tokens);
  });
  device_sync();
  MESSAGE("gemm moe mma.sync T=" << tokens << " bm " << bm << " "
                                 << std::string(mx4 ? "mxfp4" : "bf16") << " "
                                 << std::string(split ? "split" : "bf16-act") << ": gate_up + down "
                                 << ms * 1e3 << " us");
}

/// A dense linear (qkv 2880 -> 5120 or o_proj 4096 -> 2880) at T tokens: gemm_wg and mma.sync.
void dense_pair(int k, int n, int tokens, int bn, int wm, int stages, int splitk, bool split,
                int ksub = 1, bool pipe = false, bool natural = false) {
  GemmWgDims g;
  g.ksub = ksub;
  g.pipe = pipe;
  g.natural = natural;
  g.k = k;
  g.n = n;
  g.bn = bn;
  g.wm = wm;
  g.stages = stages;
  g.split = split;
  g.splitk = splitk;
  g.bias = splitk == 1;
  if (!gemm_wg_fits(g))
    return;
  GemmActDims ad{k, false, split, 1e-5, 1};
  ad.natural = natural;
  const Loaded* pact = want(emit_gemm_act(ad, {}));
  const Loaded* pl = want(emit_gemm_wg(g, {}));
  if (g_dry)
    return;
  const Loaded &act = *pact, &l = *pl;
  Rng rng{970};
  auto x = upload(random_f32(rng, {tokens, k}, 1.0f).f);
  auto w = upload(random_bf16(rng, {n, k}, 0.02f).bits);
  auto b = upload(random_bf16(rng, {n}, 0.5f).bits);
  auto y = poisoned(size_t(tokens) * n * std::max(1, splitk));
  auto xh = poisoned(size_t(tokens) * k / 2), xl = poisoned(size_t(tokens) * k / 2);
  const double ms_act = median_ms(
      [&](int) { launch(act, tokens, 1, x->p, nullptr, xh->p, split ? xl->p : nullptr); });
  const double ms = median_ms([&](int) {
    launch(l, tokens, 1, xh->p, split ? xl->p : nullptr, w->p, b->p, nullptr, y->p, nullptr,
           nullptr, nullptr, tokens);
  });
  device_sync();
  report(fmt::format("dense wg {}x{} T={} bn {} m{} stages {} ksub {}{} splitk {} {}{} (act "
                     "{:.1f} us)",
                     k, n, tokens, bn, 64 * wm, stages, ksub, pipe ? " pipe" : "", splitk,
                     split ? "split" : "bf16-act", natural ? " natural" : "", ms_act * 1e3),
         ms, 2.0 * tokens * k * n, double(k) * n * 2);
}

void dense_mma(int k, int n, int tokens, bool split) {
  GemmDims g;
  g.k = k;
  g.n = n;
  g.bm = 64;
  g.split = split;
  const Loaded* pl = want(emit_gemm(g, {}));
  if (g_dry)
    return;
  const Loaded& l = *pl;
  Rng rng{970};
  auto x = upload(random_f32(rng, {tokens, k}, 1.0f).f);
  auto w = upload(random_bf16(rng, {n, k}, 0.02f).bits);
  auto b = upload(random_bf16(rng, {n}, 0.5f).bits);
  auto y = poisoned(size_t(tokens) * n);
  const double ms = median_ms([&](int) {
    launch(l, tokens, 1, x->p, nullptr, nullptr, w->p, b->p, nullptr, y->p, nullptr, nullptr,
           nullptr, tokens);
  });
  device_sync();
  report(fmt::format("dense mma.sync {}x{} T={} {}", k, n, tokens, split ? "split" : "bf16-act"),
         ms, 2.0 * tokens * k * n, double(k) * n * 2);
}

} // namespace

TEST_CASE("gemm throughput: mma.sync against warpgroup MMA, 20b shapes (informational)") {
  XSERV_REQUIRE_GPU();
  if (!wg_arch())
    return;
  std::unique_ptr<MoeBench> mb;
  auto variants = [&] {
    const MoeBench* m = mb.get();
    // Batched decode (64 sequences: ~8 pairs per expert), a 512- and a 2048-token prompt, plain
    // bf16 activations: stages of 1 or 2 K tiles, MMAs drained or left in flight.
    for (bool mx4 : {false, true}) {
      for (auto [ks, pipe, st] :
           {std::tuple{1, false, 4}, std::tuple{1, true, 6}, std::tuple{2, false, 4},
            std::tuple{2, true, 6}, std::tuple{4, true, 4}})
        moe_wg(m, 64, 16, 2, st, mx4, false, ks, pipe);
      for (auto [bn, wm, ks, pipe, st] :
           {std::tuple{64, 2, 1, false, 4}, std::tuple{64, 2, 1, true, 4},
            std::tuple{64, 2, 2, false, 4}, std::tuple{64, 2, 2, true, 4},
            std::tuple{64, 1, 2, true, 4}, std::tuple{128, 2, 2, true, 3},
            std::tuple{128, 2, 1, true, 4}})
        moe_wg(m, 512, bn, wm, st, mx4, false, ks, pipe);
      for (auto [bn, ks, pipe, st] : {std::tuple{128, 1, false, 3}, std::tuple{128, 1, true, 4},
                                      std::tuple{128, 2, true, 3}, std::tuple{128, 2, false, 3}})
        moe_wg(m, 2048, bn, 2, st, mx4, false, ks, pipe);
      for (int t : {64, 512, 2048}) // the mma.sync gemm of the same steps
        moe_mma(m, t, t == 64 ? 32 : t == 512 ? 64 : 128, mx4, false);
    }
    for (int tokens : {512, 2048}) {
      dense_mma(2880, 5120, tokens, false);
      dense_mma(4096, 2880, tokens, false);
      for (auto [wm, ks, pipe, st] :
           {std::tuple{2, 1, false, 3}, std::tuple{2, 1, true, 4}, std::tuple{2, 2, true, 3},
            std::tuple{1, 2, true, 4}, std::tuple{1, 1, false, 4}}) {
        dense_pair(2880, 5120, tokens, 128, wm, st, 1, false, ks, pipe);
        dense_pair(4096, 2880, tokens, 128, wm, st, 1, false, ks, pipe);
      }
    }
    for (auto [ks, pipe, st] : {std::tuple{1, false, 4}, std::tuple{1, true, 6},
                                std::tuple{3, true, 4}}) { // 64 tokens (batched decode), split K
      dense_pair(2880, 5120, 64, 64, 1, st, 3, false, ks, pipe);
      dense_pair(4096, 2880, 64, 64, 1, st, 8, false, ks, pipe);
    }
  };
  with_preloaded(variants, [&] { mb = std::make_unique<MoeBench>(); });
}

TEST_CASE("MoE grouped gemm tiles at batched-decode and mixed-step sizes, 20b MXFP4 "
          "(informational)") {
  XSERV_REQUIRE_GPU();
  if (!wg_arch())
    return;
  // 64 to 768 tokens: 8 to 96 (token, slot) pairs an expert. The lowering picks one tile (bn
  // tokens, wm m64 weight tiles a block) by pairs per expert; each extra tile an expert needs
  // reads its weights again, and a tile that is mostly empty does MMAs for nothing.
  const std::vector<int> tokens = {64, 96, 128, 192, 256, 384, 512, 768};
  const std::vector<int> bns = {16, 24, 32, 48, 64, 96, 128};
  std::unique_ptr<MoeBench> mb;
  std::map<std::pair<int, int>, std::pair<double, int>> best; // (T, bn) -> (us, wm)
  auto variants = [&] {
    for (int t : tokens)
      for (int bn : bns)
        for (int wm : {1, 2}) {
          const double us = moe_wg(mb.get(), t, bn, wm, bn >= 96 ? 3 : 4, true, false);
          auto& b = best[{t, bn}];
          if (us > 0 && (b.first <= 0 || us < b.first))
            b = {us, wm};
        }
  };
  with_preloaded(variants, [&] {
    mb = std::make_unique<MoeBench>();
    best.clear();
  });
  std::string table = "\n| tokens |";
  for (int bn : bns)
    table += fmt::format(" bn {} |", bn);
  for (int t : tokens) {
    table += fmt::format("\n| {} |", t);
    for (int bn : bns) {
      const auto it = best.find({t, bn});
      table += it == best.end() || it->second.first <= 0
                   ? std::string(" - |")
                   : fmt::format(" {:.1f} (m{}) |", it->second.first, 64 * it->second.second);
    }
  }
  MESSAGE("MoE gate_up + act + down, us a layer, best wm per tile:" << table);
}

TEST_CASE("MoE gemm pipelines at batched-decode sizes, 20b MXFP4 (informational)") {
  XSERV_REQUIRE_GPU();
  if (!wg_arch())
    return;
  // The tiles of 128 and 256 sequences (32 and 64 tokens, two m64 tiles): each expert's weights
  // come from DRAM once a step, so the bytes in flight a block may bound them.
  std::unique_ptr<MoeBench> mb;
  std::function<void()> variants;
  SUBCASE("stages and K tiles") {
    variants = [&] {
      for (auto [t, bn] : {std::pair{256, 64}, std::pair{128, 32}})
        for (auto [st, ks, pipe] :
             {std::tuple{4, 1, false}, std::tuple{3, 1, false}, std::tuple{6, 1, false},
              std::tuple{8, 1, false}, std::tuple{4, 1, true}, std::tuple{6, 1, true},
              std::tuple{8, 1, true}, std::tuple{3, 2, false}, std::tuple{4, 2, false},
              std::tuple{4, 2, true}})
          moe_wg(mb.get(), t, bn, 2, st, true, false, ks, pipe, true);
    };
  }
  SUBCASE("registers capped") {
    // Registers capped so that one more block fits an SM, each beside its uncapped form: the
    // 64- and 32-token tiles 3 -> 4 an SM, the prompts' 128-token tile 2 -> 3.
    variants = [&] {
      for (auto [t, bn, st, ks, mbk] :
           {std::tuple{256, 64, 4, 1, 0}, std::tuple{256, 64, 4, 1, 4},
            std::tuple{128, 32, 3, 2, 0}, std::tuple{128, 32, 3, 2, 4},
            std::tuple{512, 128, 3, 1, 0}, std::tuple{512, 128, 3, 1, 3},
            std::tuple{2048, 128, 3, 1, 0}, std::tuple{2048, 128, 3, 1, 3}})
        moe_wg(mb.get(), t, bn, 2, st, true, false, ks, false, true, mbk);
    };
  }
  SUBCASE("steps") {
    // The lowering's tilings (codegen::kWgMoeTilings) at the token counts that pick them, their
    // K steps' MMAs batched together (the compiler's schedule) and as batches of their own
    // (GemmWgDims::steps), interleaved.
    variants = [&] {
      const std::array<std::vector<int>, kWgMoeTilings.size()> tokens = {
          {{64}, {128}, {256}, {512, 2048}}};
      for (size_t i = 0; i < kWgMoeTilings.size(); ++i)
        for (int t : tokens[i])
          for (bool steps : {false, true}) {
            const WgMoeTiling& w = kWgMoeTilings[i];
            moe_wg(mb.get(), t, w.bn, w.wm, w.stages, true, false, w.ksub, w.pipe, true, 0, steps);
          }
    };
  }
  SUBCASE("steps: stages") {
    // The tilings with steps (kWgMoeTilings) at the stages the batched schedule chose and one
    // more: the loads go out a K step later with steps, so a deeper ring may pay where two
    // blocks an SM still fit (the 128-token tile's 4 stages of 21.5 KB).
    variants = [&] {
      for (auto [t, bn] :
           {std::pair{64, 16}, std::pair{256, 64}, std::pair{512, 128}, std::pair{2048, 128}})
        for (int st : {3, 4, 5})
          moe_wg(mb.get(), t, bn, 2, st, true, false, 1, false, true, 0, true);
      // One m64 tile a block at 128 tokens: 150 registers, so three blocks an SM where two of
      // the two-tile block run (the warps a scheduler that Nsight found too few), at twice the
      // token tile's reads from L2 a weight row.
      for (int t : {512, 2048})
        for (int st : {3, 4})
          moe_wg(mb.get(), t, 128, 1, st, true, false, 1, false, true, 0, true);
    };
  }
  with_preloaded(variants, [&] { mb = std::make_unique<MoeBench>(); });
}

#if XSERV_HAVE_CUBLAS
namespace {

/// cuBLAS's bf16 gemm with fp32 output and accumulation (cublasGemmEx, default algorithm) for
/// y[T, N] = x[T, K] W[N, K]^T: the dense projections as cuBLAS would run them, for issue 17's
/// "cuBLAS where it measures faster". No bias or residual (our epilogue adds them for free).
void dense_cublas(cublasHandle_t h, int k, int n, int tokens) {
  Rng rng{971};
  auto x = upload(random_bf16(rng, {tokens, k}, 1.0f).bits);
  auto w = upload(random_bf16(rng, {n, k}, 0.02f).bits);
  auto y = poisoned(size_t(tokens) * n);
  const float one = 1.0f, zero = 0.0f;
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  const double ms = median_ms([&](int) {
    // Column-major: y^T [N, T] = W [K, N]^T x^T [K, T].
    st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, tokens, k, &one, w->p, CUDA_R_16BF, k, x->p,
                      CUDA_R_16BF, k, &zero, y->p, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT);
  });
  device_sync();
  REQUIRE(st == CUBLAS_STATUS_SUCCESS);
  report(fmt::format("dense cublas {}x{} T={} bf16 in, fp32 out", k, n, tokens), ms,
         2.0 * tokens * k * n, double(k) * n * 2);
}

} // namespace

TEST_CASE("dense gemms: cuBLAS against gemm_wg as the lowering picks it, 20b (informational)") {
  XSERV_REQUIRE_GPU();
  if (!wg_arch())
    return;
  // gemm_wg as cuda_lower_wg.cpp lowers it: up to 64 tokens bn 64 with K split (qkv 3, o_proj 8,
  // lm_head none), else bn 128 with two m64 tiles for N >= 4096.
  struct Shape {
    int k, n, splitk64;
  };
  const Shape shapes[] = {{2880, 5120, 3}, {4096, 2880, 8}, {2880, 201088, 1}, {2880, 32, 9}};
  auto variants = [&] {
    for (const Shape& s : shapes)
      for (int tokens : {64, 128, 256, 512, 2048}) {
        // lm_head: one row a sequence (batched decode's 64..256); the others: prompt steps
        if ((s.n > 100000) != (tokens <= 256))
          continue;
        if (tokens <= 64)
          dense_pair(s.k, s.n, tokens, 64, 1, 4, s.splitk64, false);
        else
          dense_pair(s.k, s.n, tokens, 128, s.n >= 4096 ? 2 : 1, s.n >= 4096 ? 3 : 4, 1, false);
        // the natural K order (one chain, as cuBLAS sums it): the same tiles, no K split
        if (s.n < 100000 && s.n > 64)
          dense_pair(s.k, s.n, tokens, tokens <= 64 ? 64 : 128, tokens > 64 && s.n >= 4096 ? 2 : 1,
                     tokens > 64 && s.n >= 4096 ? 3 : 4, 1, false, 1, false, true);
        if (s.n > 100000 && tokens > 64) { // lm_head's other tiles at batched decode
          dense_pair(s.k, s.n, tokens, 64, 1, 4, 1, false);
          dense_pair(s.k, s.n, tokens, 64, 2, 3, 1, false);
          dense_pair(s.k, s.n, tokens, 128, 1, 4, 1, false);
          dense_pair(s.k, s.n, tokens, 256, 1, 3, 1, false);
        }
      }
  };
  with_preloaded(variants);
  cublasHandle_t h = nullptr;
  REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  for (const Shape& s : shapes)
    for (int tokens : {64, 128, 256, 512, 2048})
      if ((s.n > 100000) == (tokens <= 256))
        dense_cublas(h, s.k, s.n, tokens);
  cublasDestroy(h);
}
#endif // XSERV_HAVE_CUBLAS

TEST_CASE("router gemm tiles at prompt steps, 20b (informational)") {
  // The router's logits (2880 -> 32) take one 128-token tile column today: 4 blocks at 512
  // tokens. Smaller token tiles and split K give more blocks (split K's reduce is not timed).
  XSERV_REQUIRE_GPU();
  if (!wg_arch())
    return;
  auto variants = [] {
    for (int tokens : {512, 2048})
      for (auto [bn, splitk] :
           {std::pair{128, 1}, std::pair{64, 1}, std::pair{32, 1}, std::pair{16, 1},
            std::pair{64, 5}, std::pair{64, 9}, std::pair{16, 5}, std::pair{32, 9}})
        dense_pair(2880, 32, tokens, bn, 1, 4, splitk, false);
  };
  with_preloaded(variants);
}

TEST_CASE("k and v projection tiles at prompt steps, 20b (informational)") {
  // The prompt step's k and v projections (2880 -> 512 each) run as 8 weight tiles x 128-token
  // tiles: 32 blocks at 512 tokens, a quarter of the GPU. Smaller token tiles and split K give
  // more (split K's reduce is not timed); cuBLAS beside them for --dense-gemm cublas.
  XSERV_REQUIRE_GPU();
  if (!wg_arch())
    return;
  auto variants = [] {
    for (int tokens : {512, 2048})
      for (auto [bn, splitk] : {std::pair{128, 1}, std::pair{64, 1}, std::pair{64, 3},
                                std::pair{64, 5}, std::pair{128, 3}, std::pair{32, 1}})
        dense_pair(2880, 512, tokens, bn, 1, 4, splitk, false);
  };
  with_preloaded(variants);
#if XSERV_HAVE_CUBLAS
  cublasHandle_t h = nullptr;
  REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  for (int tokens : {512, 2048})
    dense_cublas(h, 2880, 512, tokens);
  cublasDestroy(h);
#endif
}
