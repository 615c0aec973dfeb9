// The tensor-core decode GEMVs against the FMA kernels they replace, on the 20b's shapes (the
// MXFP4 MoE rows at one token, o_proj at 1 and 8 tokens, lm_head at 1, 2 and 8; the dense ones
// also in the canonical order and as one chain over natural K): us per launch
// back to back, weights cycled beyond the 50 MB L2. Part of kernels_bench (never run by ctest;
// docs/PERF.md keeps the figures):
//   build/tests/kernels_bench -tc="MXFP4 MoE decode*,o_proj decode GEMV*,lm_head decode GEMV*"
// (and the MoE rows at 2-8 tokens, a block a pair against the tokens as columns; the natural
// order's dense linears and the canonical order's MoE on gemm_wg at 1 and 8 tokens).
#include "codegen/emit_wg.h"
#include "tests/codegen/kernel_test_util.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

using namespace xserv;
using namespace xserv::codegen;
using namespace xserv::kernel_test;

namespace {

/// MXFP4 expert matrices [experts, rows, cols] of random codes and realistic scale bytes
/// (118..125), uploaded: blocks, then scales.
std::unique_ptr<DevBuf> mxfp4_experts(Rng& rng, int experts, int rows, int cols) {
  const size_t n = size_t(experts) * rows * cols;
  std::vector<uint8_t> bytes(n / 2 + n / 32);
  for (size_t i = 0; i < n / 2; ++i)
    bytes[i] = uint8_t(int((rng.next(1.0f) + 1.0f) * 128.0f) & 0xff);
  for (size_t b = 0; b < n / 32; ++b)
    bytes[n / 2 + b] = uint8_t(118 + b % 8);
  return upload(bytes);
}

/// A tiling of the MoE decode kernels (moe_one_token_bench).
struct MoeVariant {
  int mma; // 0 FMA, 1 tensor cores (words into registers), 2.. (a shared ring of that depth)
  int groups, splits, chunk, min_blocks; // MMA tiling (0: default), or FMA rows, unroll
  bool chain = false; // the canonical order (Mx4ChainRows: the canonical K ranges, or
                      // `splits` ranges when set)
};

/// The 20b's MoE gate_up and down kernels at one token under `gu_variants` / `dn_variants`:
/// us a launch, back to back, the experts beyond L2; with narrow_runs also the default tilings
/// on fewer blocks.
void moe_one_token_bench(const std::vector<MoeVariant>& gu_variants,
                         const std::vector<MoeVariant>& dn_variants, bool narrow_runs) {
  using Variant = MoeVariant;
  MoeDims d{2880, 2880, 32, 4, false};
  d.mxfp4 = true;
  d.round_act = true;
  Rng rng{905};
  // MXFP4 experts (gate_up 283 MB, down 142 MB: beyond L2), the 8 disjoint sets of 4 cycled.
  auto mx = [&](int rows, int cols) { return mxfp4_experts(rng, d.experts, rows, cols); };
  auto gate_up = mx(2 * d.inter, d.hidden), down = mx(d.hidden, d.inter);
  auto gub = upload(random_bf16(rng, {d.experts, 2 * d.inter}, 0.5f).bits);
  auto dnb = upload(random_bf16(rng, {d.experts, d.hidden}, 0.5f).bits);
  auto x = upload(random_f32(rng, {1, d.hidden}, 1.0f).f);
  auto act = upload(random_f32(rng, {d.k, d.inter}, 1.0f).f);
  auto act_out = poisoned(size_t(d.k) * d.inter), part = poisoned(size_t(d.k) * d.hidden);
  std::vector<std::unique_ptr<DevBuf>> id_sets, w_sets;
  for (int s = 0; s < 8; ++s) {
    id_sets.push_back(upload(std::vector<int32_t>{4 * s, 4 * s + 1, 4 * s + 2, 4 * s + 3}));
    w_sets.push_back(upload(std::vector<float>{0.4f, 0.3f, 0.2f, 0.1f}));
  }
  const double mb_gu = 2.0 * d.k * d.hidden * d.inter * (0.5 + 1.0 / 32) / 1e6;
  const double mb_dn = mb_gu / 2;
  auto dims = [&](const Variant& v) {
    MoeDims m = d;
    m.mma = v.mma > 0;
    m.mma_chain = v.chain;
    m.mma_stages = v.mma > 1 ? v.mma : 0;
    if (v.mma) {
      m.mma_groups = v.groups;
      m.mma_splits = v.splits;
      m.mma_chunk = v.chunk;
    } else {
      m.rows = v.groups;
      m.unroll = v.splits;
    }
    m.min_blocks = v.min_blocks;
    return m;
  };
  auto fits = [&](const Variant& v, bool gate_up) {
    return v.mma == 0 || moe_mma_kernel_fits(dims(v), gate_up);
  };
  std::vector<KernelSource> all;
  for (const Variant& v : gu_variants)
    if (fits(v, true))
      all.push_back(emit_moe_gate_up(dims(v), {}));
  for (const Variant& v : dn_variants)
    if (fits(v, false))
      all.push_back(emit_moe_down_part(dims(v), {}));
  preload(all);
  for (const Variant& v : gu_variants) {
    if (!fits(v, true))
      continue;
    const Loaded& k = load(emit_moe_gate_up(dims(v), {}));
    const double us = back_to_back_us(
        [&](int i) { launch(k, 1, 1, x->p, id_sets[i % 8]->p, gate_up->p, gub->p, act_out->p); });
    MESSAGE("mxfp4 gate_up " << k.src.name << ": " << us << " us, " << mb_gu / us * 1e3
                             << " GB/s of weights");
  }
  for (const Variant& v : dn_variants) {
    if (!fits(v, false))
      continue;
    const Loaded& k = load(emit_moe_down_part(dims(v), {}));
    const double us = back_to_back_us([&](int i) {
      launch(k, 1, 1, act->p, w_sets[i % 8]->p, id_sets[i % 8]->p, down->p, dnb->p, part->p);
    });
    MESSAGE("mxfp4 down_part " << k.src.name << ": " << us << " us, " << mb_dn / us * 1e3
                               << " GB/s of weights");
  }
  if (!narrow_runs)
    return;
  // The default tilings on fewer blocks (grid.x below its 90, the bytes in proportion): how
  // the time grows with the blocks an SM carries (docs/PERF.md, "Kernel figures").
  auto narrow = [](KernelSource k, int bx) {
    const std::string name = k.name + "_bx" + std::to_string(bx);
    k.source.replace(k.source.find(" " + k.name + "("), k.name.size() + 2, " " + name + "(");
    k.name = name;
    k.launch.blocks_x = bx;
    return k;
  };
  for (int bx : {90, 66, 45, 33, 22}) {
    const Loaded& g = load(narrow(emit_moe_gate_up(dims(gu_variants[1]), {}), bx));
    const double ug = back_to_back_us(
        [&](int i) { launch(g, 1, 1, x->p, id_sets[i % 8]->p, gate_up->p, gub->p, act_out->p); });
    const Loaded& dn = load(narrow(emit_moe_down_part(dims(dn_variants[1]), {}), bx));
    const double ud = back_to_back_us([&](int i) {
      launch(dn, 1, 1, act->p, w_sets[i % 8]->p, id_sets[i % 8]->p, down->p, dnb->p, part->p);
    });
    MESSAGE("default tilings on " << 4 * bx << " blocks: gate_up " << ug << " us ("
                                  << mb_gu * bx / 90 / ug * 1e3 << " GB/s), down " << ud << " us ("
                                  << mb_dn * bx / 90 / ud * 1e3 << " GB/s)");
  }
  device_sync();
}

} // namespace

TEST_CASE("MXFP4 MoE decode: FMA against tensor cores, 20b, one token (informational)") {
  XSERV_REQUIRE_GPU();
  using Variant = MoeVariant;
  const std::vector<Variant> gu_variants = {
      {0, 0, 2, 0, 0},       {2, 4, 2, 8, 0},       {2, 4, 2, 8, 3},       {2, 1, 4, 8, 0},
      {2, 2, 4, 8, 0},       {2, 2, 2, 8, 0},       {3, 4, 2, 8, 0},       {3, 1, 4, 8, 0},
      {4, 4, 2, 8, 0},       {2, 1, 8, 8, 0},       {3, 4, 1, 8, 0},       {4, 4, 1, 8, 0},
      {8, 4, 1, 8, 0}, // whole-K warps, deeper rings
      {2, 4, 3, 8, 0, true}, {2, 2, 3, 8, 0, true}, {3, 4, 3, 8, 0, true}, {2, 8, 3, 8, 0, true},
      {2, 1, 3, 8, 0, true}, // 3 K ranges (the canonical order's before one chain), and others
      {3, 4, 5, 8, 0, true}, {3, 2, 5, 8, 0, true}, {3, 2, 9, 8, 0, true}, {3, 1, 9, 8, 0, true},
      {2, 4, 5, 8, 0, true}, {2, 4, 1, 8, 0, true}, {3, 4, 1, 8, 0, true}, {2, 8, 1, 8, 0, true},
      {3, 8, 1, 8, 0, true}, {2, 2, 1, 8, 0, true}}; // (one chain over K with other row groups)
  const std::vector<Variant> dn_variants = {
      {0, 0, 2, 0, 0},       {2, 2, 4, 8, 0},       {2, 2, 4, 8, 3},       {2, 1, 4, 8, 0},
      {2, 2, 2, 8, 0},       {2, 1, 8, 8, 0},       {3, 2, 4, 8, 0},       {3, 1, 4, 8, 0},
      {4, 2, 4, 8, 0},       {2, 2, 3, 8, 0},       {3, 2, 1, 8, 0},       {4, 2, 1, 8, 0},
      {8, 2, 1, 8, 0},       {3, 2, 2, 8, 0},       {2, 2, 3, 8, 0, true}, {2, 1, 3, 8, 0, true},
      {3, 2, 3, 8, 0, true}, {2, 4, 3, 8, 0, true}, // 3 K ranges, and others
      {3, 2, 5, 8, 0, true}, {3, 4, 5, 8, 0, true}, {3, 2, 9, 8, 0, true}, {3, 1, 9, 8, 0, true},
      {2, 2, 5, 8, 0, true}, {4, 2, 5, 8, 0, true}, {2, 2, 1, 8, 0, true}, {3, 2, 1, 8, 0, true},
      {2, 4, 1, 8, 0, true}, {3, 4, 1, 8, 0, true}, {2, 1, 1, 8, 0, true}};
  moe_one_token_bench(gu_variants, dn_variants, true);
}

TEST_CASE("MXFP4 MoE decode in the canonical order: ring depths and row groups, 20b, one token "
          "(informational)") {
  XSERV_REQUIRE_GPU();
  // One chain over K (the canonical experts): a warp's ring of 3 to 8 chunks (2 to 7 in
  // flight), 2 to 8 row groups a block.
  std::vector<MoeVariant> gu, dn;
  for (int stages : {3, 4, 6, 8}) {
    for (int groups : {4, 8})
      gu.push_back({stages, groups, 1, 8, 0, true});
    for (int groups : {2, 4, 8})
      dn.push_back({stages, groups, 1, 8, 0, true});
  }
  moe_one_token_bench(gu, dn, false);
}

TEST_CASE("MXFP4 MoE decode at 2-8 tokens: a block a pair against tokens as columns, 20b "
          "(informational)") {
  XSERV_REQUIRE_GPU();
  MoeDims d{2880, 2880, 32, 4, false};
  d.mxfp4 = true;
  d.round_act = true;
  d.mma = true;
  d.mma_stages = kMoeMmaStages;
  MoeDims c = d;
  c.mma_cols = true;
  if (!moe_mma_fits(d) || !moe_cols_fits(c)) {
    MESSAGE("skipped: the tensor-core MoE kernels do not fit");
    return;
  }
  Rng rng{907};
  auto mx = [&](int rows, int cols) { return mxfp4_experts(rng, d.experts, rows, cols); };
  auto gate_up = mx(2 * d.inter, d.hidden), down = mx(d.hidden, d.inter);
  auto gub = upload(random_bf16(rng, {d.experts, 2 * d.inter}, 0.5f).bits);
  auto dnb = upload(random_bf16(rng, {d.experts, d.hidden}, 0.5f).bits);
  const Loaded& pgu = load(emit_moe_gate_up(d, {}));
  const Loaded& pdn = load(emit_moe_down_part(d, {}));
  const Loaded& cgu = load(emit_moe_gate_up(c, {}));
  const Loaded& cdn = load(emit_moe_down_part(c, {}));
  for (int tokens = 2; tokens <= 8; ++tokens) {
    const int pairs = tokens * d.k;
    auto x = upload(random_f32(rng, {tokens, d.hidden}, 1.0f).f);
    auto act = upload(random_f32(rng, {pairs, d.inter}, 1.0f).f);
    auto act_out = poisoned(size_t(pairs) * d.inter), part = poisoned(size_t(pairs) * d.hidden);
    auto w = upload(std::vector<float>(size_t(pairs), 0.25f));
    // 8 random routings (4 distinct experts a token), cycled; their distinct experts counted.
    std::vector<std::unique_ptr<DevBuf>> ids;
    double distinct = 0;
    for (int s = 0; s < 8; ++s) {
      std::vector<int32_t> r;
      std::vector<bool> used(size_t(d.experts), false);
      for (int t = 0; t < tokens; ++t)
        for (int k = 0; k < d.k;) {
          const int e = int((rng.next(1.0f) + 1.0f) * 0.5f * float(d.experts)) % d.experts;
          if (std::find(r.end() - k, r.end(), e) != r.end())
            continue;
          r.push_back(e);
          used[size_t(e)] = true;
          ++k;
        }
      distinct += double(std::count(used.begin(), used.end(), true)) / 8;
      ids.push_back(upload(r));
    }
    auto time = [&](const Loaded& gu, const Loaded& dn) {
      return back_to_back_us([&](int i) {
        launch(gu, tokens, 1, x->p, ids[size_t(i % 8)]->p, gate_up->p, gub->p, act_out->p);
        launch(dn, tokens, 1, act->p, w->p, ids[size_t(i % 8)]->p, down->p, dnb->p, part->p);
      });
    };
    const double per_pair = time(pgu, pdn), columns = time(cgu, cdn);
    MESSAGE(tokens << " tokens (" << distinct << " distinct experts of " << pairs
                   << " pairs): gate_up + down a block a pair " << per_pair
                   << " us, tokens as columns " << columns << " us");
  }
  device_sync();
}

namespace {

/// A decode linear's tuning in the sweep: FMA (unroll a, rows and K splits by default) or tensor
/// cores (groups a, splits b, stages c), for steps of up to max_t tokens; order 1: gemm_wg's K
/// slots in chains (the canonical order's), 2: the natural K order in chains (mma_natural).
struct LinearVariant {
  bool mma;
  int max_t, a, b, c;
  int order = 0;
};

/// us per launch of each variant of `base` at each of `tokens`, weights cycled beyond the L2.
void bench_linear(const char* label, LinearDims base, const std::vector<LinearVariant>& variants,
                  const std::vector<int>& tokens_list) {
  base.round_act = true;
  Rng rng{906};
  const Bf16Weight w = random_bf16(rng, {base.n, base.k}, 0.02f);
  const size_t bytes = w.bits.size() * 2;
  const int copies = int((256u << 20) / bytes + 1); // cycled beyond the 50 MB L2
  std::vector<std::unique_ptr<DevBuf>> ws;
  for (int c = 0; c < copies; ++c)
    ws.push_back(upload(w.bits));
  auto x = upload(random_f32(rng, {8, base.k}, 1.0f).f);
  auto b = upload(random_bf16(rng, {base.n}, 1.0f).bits);
  auto h = upload(random_f32(rng, {8, base.n}, 1.0f).f);
  auto y = poisoned(size_t(8) * base.n);
  auto dims = [&](const LinearVariant& v) {
    LinearDims d = base;
    d.max_tokens = v.max_t;
    if (v.mma) {
      d.mma = true;
      d.mma_groups = v.a;
      d.mma_splits = v.b;
      d.mma_stages = v.c;
      d.mma_chain = v.order == 1;
      d.mma_natural = v.order == 2;
    } else {
      d.unroll = v.a;
    }
    return d;
  };
  std::vector<KernelSource> all;
  for (const LinearVariant& v : variants)
    if (!v.mma || linear_mma_fits(dims(v)))
      all.push_back(emit_linear(dims(v), {}));
  preload(all);
  for (const LinearVariant& v : variants) {
    if (v.mma && !linear_mma_fits(dims(v)))
      continue;
    const Loaded& l = load(emit_linear(dims(v), {}));
    for (int tokens : tokens_list) {
      if (tokens > v.max_t)
        continue;
      const double us = back_to_back_us([&](int i) {
        if (base.residual)
          launch(l, tokens, 1, x->p, ws[i % copies]->p, b->p, h->p, y->p, tokens);
        else if (base.bias)
          launch(l, tokens, 1, x->p, ws[i % copies]->p, b->p, y->p, tokens);
        else
          launch(l, tokens, 1, x->p, ws[i % copies]->p, y->p, tokens);
      });
      MESSAGE(label << " " << l.src.name << " T=" << tokens << ": " << us << " us, "
                    << bytes / us / 1e3 << " GB/s of weights");
    }
  }
  device_sync();
}

} // namespace

TEST_CASE("o_proj decode GEMV: FMA against tensor cores, 20b, 1 and 8 tokens (informational)") {
  XSERV_REQUIRE_GPU();
  LinearDims base{4096, 2880, false, true, true, 1e-5};
  bench_linear("o_proj", base,
               {{false, 1, 8, 0, 0},
                {false, 8, 4, 0, 0},
                {true, 8, 1, 8, 4},
                {true, 8, 1, 8, 6},
                {true, 8, 1, 8, 8},
                {true, 8, 2, 4, 4},
                {true, 8, 2, 4, 6},
                {true, 8, 1, 16, 3},
                {true, 8, 1, 16, 4},
                {true, 8, 2, 8, 4},
                {true, 8, 1, 4, 8},
                {true, 8, 4, 2, 8},
                // the canonical order as plans have it (8 K ranges in gemm_wg's slots), then one
                // chain over natural K (cuBLAS's without split K) with more rows and deeper rings
                {true, 8, 2, 8, 4, 1},
                {true, 8, 2, 8, 4, 2},
                {true, 8, 4, 1, 8, 2},
                {true, 8, 4, 1, 16, 2},
                {true, 8, 8, 1, 8, 2},
                {true, 8, 2, 1, 24, 2},
                {true, 8, 1, 1, 32, 2}},
               {1, 8});
}

TEST_CASE("lm_head decode GEMV: FMA against tensor cores, 20b, 1, 2 and 8 tokens "
          "(informational)") {
  XSERV_REQUIRE_GPU();
  // 2880 -> 201088, no bias, no residual (1.16 GB: one copy is past the L2).
  LinearDims base{2880, 201088, false, false, false, 1e-5};
  bench_linear("lm_head", base,
               {{false, 8, 4, 0, 0},
                {true, 8, 2, 8, 4},
                {true, 8, 2, 4, 4},
                {true, 8, 2, 4, 2},
                {true, 8, 4, 4, 2},
                {true, 8, 1, 8, 4},
                {true, 8, 4, 2, 4},
                {true, 8, 2, 1, 4, 1}, // the canonical order's (one range: wg_splitk 1)
                {true, 8, 2, 1, 4, 2}, // natural K
                {true, 8, 4, 1, 8, 2},
                {true, 8, 2, 1, 16, 2}},
               {1, 2, 8});
}

TEST_CASE("dense linears in the natural K order at 1 and 8 tokens: gemm_wg's wgmma chain, 20b "
          "(informational)") {
  XSERV_REQUIRE_GPU();
  // The natural order's decode kernels chain mma.sync over all of K, one warp a 16-row group
  // (o_proj 12.9 us in a timeline plan against the default's 4.5): each MMA waits for the last
  // one's sums. gemm_wg's natural form gives the same bits (mma_order_gpu_test) with wgmma,
  // whose dependent steps issue back to back: gemm_act + gemm_wg, no K split, small token
  // tiles, weights cycled beyond the L2, against the o_proj / lm_head cases above.
  if (runtime::probe_device().arch() != "sm_90") {
    MESSAGE("skipped: gemm_wg needs sm_90");
    return;
  }
  struct Shape {
    const char* name;
    int k, n;
  };
  const Shape shapes[] = {{"o_proj", 4096, 2880}, {"qkv", 2880, 5120}, {"router", 2880, 32}};
  auto tiles = [](const Shape& s) { // no K split, 8- to 64-token tiles, rings of 4 and 8
    std::vector<GemmWgDims> out;
    for (int bn : {8, 16, 64})
      for (int stages : {4, 8}) {
        GemmWgDims g;
        g.natural = true;
        g.k = s.k;
        g.n = s.n;
        g.bn = bn;
        g.wm = 1;
        g.stages = stages;
        g.bias = true;
        if (gemm_wg_fits(g))
          out.push_back(g);
      }
    return out;
  };
  std::vector<KernelSource> all;
  for (const Shape& s : shapes)
    for (const GemmWgDims& g : tiles(s))
      all.push_back(emit_gemm_wg(g, {}));
  preload(all);
  for (const Shape& s : shapes) {
    Rng rng{908};
    const Bf16Weight w = random_bf16(rng, {s.n, s.k}, 0.02f);
    const int copies = int((256u << 20) / (w.bits.size() * 2) + 1);
    std::vector<std::unique_ptr<DevBuf>> ws;
    for (int c = 0; c < copies; ++c)
      ws.push_back(upload(w.bits));
    auto x = upload(random_f32(rng, {8, s.k}, 1.0f).f);
    auto b = upload(random_bf16(rng, {s.n}, 0.5f).bits);
    auto xh = poisoned(size_t(8) * s.k / 2), y = poisoned(size_t(8) * s.n);
    GemmActDims ad{s.k, false, false, 1e-5, 1};
    ad.natural = true;
    const Loaded& act = load(emit_gemm_act(ad, {}));
    for (const GemmWgDims& g : tiles(s)) {
      const Loaded& l = load(emit_gemm_wg(g, {}));
      for (int tokens : {1, 8}) {
        if (tokens > g.bn)
          continue;
        const double us = back_to_back_us([&](int i) {
          launch(act, tokens, 1, x->p, nullptr, xh->p, nullptr);
          launch(l, tokens, 1, xh->p, nullptr, ws[i % copies]->p, b->p, nullptr, y->p, nullptr,
                 nullptr, nullptr, tokens);
        });
        MESSAGE(s.name << " " << l.src.name << " T=" << tokens << ": gemm_act + gemm_wg " << us
                       << " us");
      }
    }
  }
  device_sync();
}

TEST_CASE("MXFP4 MoE at 1 and 8 tokens on gemm_wg's grouped tiles (the canonical order's wgmma "
          "chain), 20b (informational)") {
  XSERV_REQUIRE_GPU();
  // The canonical order's decode MoE rows chain mma.sync over all of K, a warp a row group
  // (gate_up 19.5 us, down 13.3 in a timeline plan against the default's 17.6 / 9.0). gemm_wg's
  // grouped MXFP4 tiles are those rows' reference order (canonical_order_gpu_test) on wgmma:
  // 8- and 16-token tiles at 1 and 8 tokens, each kernel timed alone as the decode kernels are,
  // 8 routings cycled (the experts beyond the L2); moe_sort and the activations' conversions
  // are the extra launches this form needs.
  if (runtime::probe_device().arch() != "sm_90") {
    MESSAGE("skipped: gemm_wg needs sm_90");
    return;
  }
  const int hidden = 2880, inter = 2880, experts = 32, ksel = 4;
  Rng rng{909};
  auto gate_up = mxfp4_experts(rng, experts, 2 * inter, hidden);
  auto down = mxfp4_experts(rng, experts, hidden, inter);
  auto gub = upload(random_bf16(rng, {experts, 2 * inter}, 0.5f).bits);
  auto dnb = upload(random_bf16(rng, {experts, hidden}, 0.5f).bits);
  struct Tile {
    int bn, wm, stages;
  };
  std::vector<Tile> tiles;
  for (int bn : {8, 16})
    for (int wm : {1, 2})
      for (int stages : {4, 8})
        tiles.push_back({bn, wm, stages});
  auto dims = [&](const Tile& t, bool gu) {
    GemmWgDims g;
    g.grouped = true;
    g.experts = experts;
    g.ksel = ksel;
    g.bn = t.bn;
    g.wm = t.wm;
    g.stages = t.stages;
    g.mxfp4 = g.small_scales = true;
    g.k = gu ? hidden : inter;
    g.n = gu ? 2 * inter : hidden;
    g.gather = gu;
    g.epilogue = gu ? GemmEpilogue::Swiglu : GemmEpilogue::Scatter;
    return g;
  };
  std::vector<KernelSource> all;
  for (const Tile& t : tiles)
    if (gemm_wg_fits(dims(t, true)) && gemm_wg_fits(dims(t, false))) {
      all.push_back(emit_gemm_wg(dims(t, true), {}));
      all.push_back(emit_gemm_wg(dims(t, false), {}));
    }
  preload(all);
  const Loaded& xact = load(emit_gemm_act({hidden, false, false, 1e-5, 1}, {}));
  const Loaded& aact = load(emit_gemm_act({inter, false, false, 1e-5, ksel}, {}));
  for (int tokens : {1, 8}) {
    const int pairs = tokens * ksel;
    auto x = upload(random_f32(rng, {tokens, hidden}, 1.0f).f);
    auto xh = poisoned(size_t(tokens) * hidden / 2);
    auto act = poisoned(size_t(pairs) * inter), ah = poisoned(size_t(pairs) * inter / 2);
    auto part = poisoned(size_t(pairs) * hidden);
    auto w = upload(std::vector<float>(size_t(pairs), 0.25f));
    launch(xact, tokens, 1, x->p, nullptr, xh->p, nullptr);
    for (const Tile& t : tiles) {
      if (t.bn < tokens || !gemm_wg_fits(dims(t, true)) || !gemm_wg_fits(dims(t, false)))
        continue;
      const Loaded& sort = load(emit_moe_sort({experts, ksel, t.bn, pairs}, {}));
      // 8 routings (1 token: disjoint sets of 4; 8 tokens: random, 4 distinct a token), sorted.
      std::vector<std::unique_ptr<DevBuf>> pair, tl;
      for (int s = 0; s < 8; ++s) {
        std::vector<int32_t> r;
        for (int tk = 0; tk < tokens; ++tk)
          for (int k = 0; k < ksel;) {
            const int e = tokens == 1
                              ? 4 * s + k
                              : int((rng.next(1.0f) + 1.0f) * 0.5f * float(experts)) % experts;
            if (std::find(r.end() - k, r.end(), e) != r.end())
              continue;
            r.push_back(e);
            ++k;
          }
        auto ids = upload(r);
        pair.push_back(poisoned(size_t(pairs)));
        tl.push_back(poisoned(moe_tiles_ints(pairs, experts, t.bn)));
        launch(sort, tokens, 1, ids->p, pair.back()->p, tl.back()->p, tokens);
      }
      const Loaded& gu = load(emit_gemm_wg(dims(t, true), {}));
      const Loaded& dn = load(emit_gemm_wg(dims(t, false), {}));
      const double us_gu = back_to_back_us([&](int i) {
        launch(gu, tokens, 1, xh->p, nullptr, gate_up->p, gub->p, nullptr, act->p,
               pair[size_t(i % 8)]->p, tl[size_t(i % 8)]->p, nullptr, tokens);
      });
      launch(aact, tokens, 1, act->p, nullptr, ah->p, nullptr);
      const double us_dn = back_to_back_us([&](int i) {
        launch(dn, tokens, 1, ah->p, nullptr, down->p, dnb->p, nullptr, part->p,
               pair[size_t(i % 8)]->p, tl[size_t(i % 8)]->p, w->p, tokens);
      });
      MESSAGE("T=" << tokens << " bn " << t.bn << " m" << 64 * t.wm << " stages " << t.stages
                   << ": gate_up " << us_gu << " us, down " << us_dn << " us");
    }
    const double us_x =
        back_to_back_us([&](int) { launch(xact, tokens, 1, x->p, nullptr, xh->p, nullptr); });
    const double us_a =
        back_to_back_us([&](int) { launch(aact, tokens, 1, act->p, nullptr, ah->p, nullptr); });
    MESSAGE("T=" << tokens << ": gemm_act of x " << us_x << " us, of the pairs' activations "
                 << us_a << " us");
  }
  device_sync();
}
