// GPU checks of the decode linear, attention and MoE kernels against ir::ref on random inputs,
// plus bandwidth figures (small_kernels_gpu_test.cpp has the per-token kernels).
#include "tests/codegen/kernel_test_util.h"

#include "ir/reference.h"

#include <tuple>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

using namespace xserv;
using namespace xserv::codegen;
using namespace xserv::kernel_test;
using ir::DType;
using ir::Tensor;

namespace {

constexpr double kTol = 1e-3;

// ---- linear ----------------------------------------------------------------------------------

void check_linear(const LinearDims& d, int tokens, uint64_t seed) {
  Rng rng{seed};
  const Tensor x = random_f32(rng, {tokens, d.k}, 2.0f);
  const Bf16Weight ln = random_bf16(rng, {d.k}, 1.0f);
  const Bf16Weight w = random_bf16(rng, {d.n, d.k}, 1.0f / std::sqrt(float(d.k)));
  const Bf16Weight b = random_bf16(rng, {d.n}, 0.5f);
  const Tensor h = random_f32(rng, {tokens, d.n}, 1.0f);
  Tensor want = d.norm ? ir::ref::rms_norm_linear(x, ln.t, d.eps, w.t, d.bias ? &b.t : nullptr)
                       : ir::ref::linear(x, w.t, d.bias ? &b.t : nullptr);
  if (d.residual)
    want = ir::ref::add(h, want);
  const Loaded& l = load(emit_linear(d, {}));
  auto dx = upload(x.f), dln = upload(ln.bits), dw = upload(w.bits), db = upload(b.bits);
  auto dh = upload(h.f);
  auto dy = poisoned(want.f.size());
  const auto g = l.src.launch.grid(tokens);
  std::vector<void*> args = {dx->p};
  if (d.norm)
    args.push_back(dln->p);
  args.push_back(dw->p);
  if (d.bias)
    args.push_back(db->p);
  if (d.residual)
    args.push_back(dh->p);
  args.push_back(dy->p);
  std::vector<size_t> sizes(args.size(), sizeof(void*));
  std::vector<void*> ptrs;
  for (void*& a : args)
    ptrs.push_back(&a);
  int t = tokens;
  ptrs.push_back(&t);
  sizes.push_back(sizeof(int));
  l.module.launch_raw(l.kernel, dim3(g[0], g[1], g[2]), dim3(l.src.launch.block),
                      l.src.launch.smem(tokens), nullptr, ptrs.data(), sizes.data(), ptrs.size());
  device_sync();
  const double err = rel_l2(download(*dy, want.f.size()), want.f);
  MESSAGE(l.src.name << " T=" << tokens << ": rel L2 " << err);
  CHECK(err <= kTol);
}

} // namespace

TEST_CASE("linear kernels match ir::ref") {
  XSERV_REQUIRE_GPU();
  for (int tokens : {1, 4, 8}) {
    check_linear({64, 128, true, true, false, 1e-5}, tokens, 1);    // tiny qkv
    check_linear({64, 64, false, true, true}, tokens, 2);           // tiny o_proj + residual
    check_linear({2880, 5120, true, true, false, 1e-5}, tokens, 3); // 20b qkv
    check_linear({4096, 2880, false, true, true}, tokens, 4);       // 20b o_proj + residual
    check_linear({2880, 32, true, true, false, 1e-5}, tokens, 5);   // 20b router logits
    check_linear({2880, 1000, false, false, false}, tokens, 6);     // plain, no bias
  }
  // Tuning variants (most tokens, rows per warp, loads in flight, K splits), uneven N included.
  for (auto [max_t, rows, unroll, ks] :
       {std::tuple{8, 0, 4, 2}, std::tuple{8, 1, 8, 4}, std::tuple{1, 0, 2, 8},
        std::tuple{1, 4, 4, 2}, std::tuple{1, 0, 4, 4}}) {
    for (LinearDims d :
         {LinearDims{2880, 5120, true, true, false, 1e-5},
          LinearDims{4096, 2880, false, true, true}, LinearDims{2880, 1000, false, false, false}}) {
      d.max_tokens = max_t;
      d.rows = d.n % std::max(rows, 1) == 0 ? rows : 0;
      d.unroll = unroll;
      d.ksplit = ks;
      for (int tokens : {1, max_t})
        check_linear(d, tokens, 7);
    }
  }
}

// ---- attention -------------------------------------------------------------------------------

namespace {

/// Attention for sequences with `seq_tokens[b]` step tokens after `ctx[b]` cached positions;
/// sequence b owns cache row B-1-b. splits = 0 picks attention_splits().
void check_attention(const AttentionDims& d, const std::vector<int>& seq_tokens,
                     const std::vector<int>& ctx, int splits, uint64_t seed) {
  Rng rng{seed};
  const int nseq = int(seq_tokens.size());
  std::vector<int32_t> positions, token_seq, ctx_lens(ctx.begin(), ctx.end()), cache_rows;
  int max_keys = 1;
  for (int b = 0; b < nseq; ++b) {
    cache_rows.push_back(nseq - 1 - b);
    for (int i = 0; i < seq_tokens[b]; ++i) {
      const int p = ctx[b] + i;
      positions.push_back(p);
      token_seq.push_back(b);
      max_keys = std::max(max_keys, d.window ? std::min(p + 1, d.window) : p + 1);
    }
  }
  const int tokens = int(positions.size());
  const Tensor pos = Tensor::from_ints({tokens}, positions);
  const Tensor tseq = Tensor::from_ints({tokens}, token_seq);
  const Tensor lens = Tensor::from_ints({nseq}, ctx_lens);
  const Tensor rows = Tensor::from_ints({nseq}, cache_rows);
  const Tensor q = random_f32(rng, {tokens, d.heads, d.head_dim}, 2.0f);
  const Tensor k = random_f32(rng, {tokens, d.kv_heads, d.head_dim}, 1.0f);
  const Tensor v = random_f32(rng, {tokens, d.kv_heads, d.head_dim}, 1.0f);
  const Bf16Weight kc = random_bf16(rng, {nseq, d.slots, d.kv_heads, d.head_dim}, 1.0f);
  const Bf16Weight vc = random_bf16(rng, {nseq, d.slots, d.kv_heads, d.head_dim}, 1.0f);
  const Bf16Weight sinks = random_bf16(rng, {d.heads}, 2.0f);
  const Tensor want =
      ir::ref::attention(q, k, v, kc.t, vc.t, sinks.t, {pos, tseq, lens, rows}, d.window, d.scale);
  if (splits == 0)
    splits = attention_splits(max_keys);
  const Loaded& dec = load(emit_attention_decode(d, {}));
  const Loaded& comb = load(emit_attention_combine(d, {}));
  auto dq = upload(q), dk = upload(k), dv = upload(v), dkc = upload(kc.bits);
  auto dvc = upload(vc.bits), ds = upload(sinks.bits), dpos = upload(pos), dts = upload(tseq);
  auto dlen = upload(lens), drow = upload(rows);
  auto out = poisoned(want.f.size());
  const size_t th = size_t(tokens) * d.heads * splits;
  auto part_ml = poisoned(th * 2), part_o = poisoned(th * d.head_dim);
  launch(dec, tokens, splits, dq->p, dk->p, dv->p, dkc->p, dvc->p, ds->p, dpos->p, dts->p, dlen->p,
         drow->p, out->p, part_ml->p, part_o->p);
  if (splits > 1)
    launch(comb, tokens, 1, part_ml->p, part_o->p, ds->p, splits, out->p);
  device_sync();
  const double err = rel_l2(download(*out, want.f.size()), want.f);
  const std::string layout = nseq > 1 ? "3+1" : std::to_string(seq_tokens[0]);
  MESSAGE(dec.src.name << " tokens " << layout << " ctx " << ctx[0] << " splits " << splits
                       << ": rel L2 " << err);
  CHECK(err <= kTol);
}

} // namespace

TEST_CASE("attention kernels match ir::ref") {
  XSERV_REQUIRE_GPU();
  const AttentionDims shapes[] = {
      {4, 2, 16, 1280, 0, 0.25},    // tiny, full
      {4, 2, 16, 8, 8, 0.25},       // tiny, sliding ring of 8
      {64, 8, 64, 1280, 0, 0.125},  // 20b, full
      {64, 8, 64, 128, 128, 0.125}, // 20b, sliding ring of 128
  };
  uint64_t seed = 100;
  for (const AttentionDims& d : shapes)
    for (int ctx : {1, 100, 1000}) {
      check_attention(d, {1}, {ctx}, 0, ++seed);             // decode: one token
      check_attention(d, {3, 1}, {ctx, ctx / 2}, 0, ++seed); // T=4 over two sequences
      check_attention(d, {1}, {ctx}, 7, ++seed);             // forced splits, some empty
    }
}

// ---- moe -------------------------------------------------------------------------------------

namespace {

/// Random distinct experts and softmax-like weights for each token.
void random_routing(Rng& rng, int tokens, int experts, int k, Tensor& w, Tensor& ids) {
  w = Tensor::zeros(DType::F32, {tokens, k});
  ids = Tensor::zeros(DType::I32, {tokens, k});
  for (int t = 0; t < tokens; ++t) {
    std::vector<int32_t> all(experts);
    for (int e = 0; e < experts; ++e)
      all[e] = e;
    float sum = 0;
    for (int j = 0; j < k; ++j) {
      const int pick = j + int((rng.next(1.0f) + 1.0f) * 0.5f * float(experts - j)) % (experts - j);
      std::swap(all[j], all[pick]);
      ids.i[t * k + j] = all[j];
      w.f[t * k + j] = 1.5f + rng.next(1.0f);
      sum += w.f[t * k + j];
    }
    for (int j = 0; j < k; ++j)
      w.f[t * k + j] /= sum;
  }
}

/// The random weights of an MoE block, uploaded.
struct MoeWeights {
  Bf16Weight gate_up, gate_up_b, down, down_b;
  std::unique_ptr<DevBuf> d_gate_up, d_gate_up_b, d_down, d_down_b;
  MoeWeights(Rng& rng, const MoeDims& d)
      : gate_up(random_bf16(rng, {d.experts, 2 * d.inter, d.hidden},
                            4.0f / std::sqrt(float(d.hidden)))),
        gate_up_b(random_bf16(rng, {d.experts, 2 * d.inter}, 0.5f)),
        down(random_bf16(rng, {d.experts, d.hidden, d.inter}, 1.0f / std::sqrt(float(d.inter)))),
        down_b(random_bf16(rng, {d.experts, d.hidden}, 0.5f)), d_gate_up(upload(gate_up.bits)),
        d_gate_up_b(upload(gate_up_b.bits)), d_down(upload(down.bits)),
        d_down_b(upload(down_b.bits)) {}
};

void check_moe(const MoeDims& d, const MoeWeights& mw, int tokens, uint64_t seed) {
  Rng rng{seed};
  const Tensor x = random_f32(rng, {tokens, d.hidden}, 3.0f);
  const Tensor h = random_f32(rng, {tokens, d.hidden}, 1.0f);
  Tensor w, ids;
  random_routing(rng, tokens, d.experts, d.k, w, ids);
  const Tensor want =
      d.residual ? ir::ref::moe_experts_residual(x, w, ids, mw.gate_up.t, mw.gate_up_b.t, mw.down.t,
                                                 mw.down_b.t, h, d.limit, d.alpha)
                 : ir::ref::moe_experts(x, w, ids, mw.gate_up.t, mw.gate_up_b.t, mw.down.t,
                                        mw.down_b.t, d.limit, d.alpha);
  const Loaded& gu = load(emit_moe_gate_up(d, {}));
  const Loaded& dn = load(emit_moe_down(d, {}));
  auto dx = upload(x), dh = upload(h), dw = upload(w), dids = upload(ids);
  auto act = poisoned(size_t(tokens) * d.k * d.inter), y = poisoned(want.f.size());
  launch(gu, tokens, 1, dx->p, dids->p, mw.d_gate_up->p, mw.d_gate_up_b->p, act->p);
  if (d.residual)
    launch(dn, tokens, 1, act->p, dw->p, dids->p, mw.d_down->p, mw.d_down_b->p, dh->p, y->p);
  else
    launch(dn, tokens, 1, act->p, dw->p, dids->p, mw.d_down->p, mw.d_down_b->p, y->p);
  // The engine's decode path: per-(token, slot) rows, then the ordered combine.
  const Loaded& dp = load(emit_moe_down_part(d, {}));
  const Loaded& comb = load(emit_moe_combine(d.hidden, d.k, d.residual, {}));
  auto part = poisoned(size_t(tokens) * d.k * d.hidden), y2 = poisoned(want.f.size());
  launch(dp, tokens, 1, act->p, dw->p, dids->p, mw.d_down->p, mw.d_down_b->p, part->p);
  if (d.residual)
    launch(comb, tokens, 1, part->p, dh->p, y2->p);
  else
    launch(comb, tokens, 1, part->p, y2->p);
  device_sync();
  const std::vector<float> got = download(*y, want.f.size());
  const double err = rel_l2(got, want.f);
  MESSAGE(gu.src.name << " + " << dn.src.name << " T=" << tokens << ": rel L2 " << err);
  CHECK(err <= kTol);
  // Same products, sums in the same order (an fma may round differently): within 1e-6.
  const double err_part = rel_l2(download(*y2, want.f.size()), want.f);
  MESSAGE(dp.src.name << " + " << comb.src.name << " T=" << tokens << ": rel L2 " << err_part);
  CHECK(err_part <= kTol);
  CHECK(rel_l2(download(*y2, want.f.size()), got) <= 1e-6);
}

} // namespace

TEST_CASE("moe kernels match ir::ref") {
  XSERV_REQUIRE_GPU();
  uint64_t seed = 500;
  for (MoeDims d : {MoeDims{64, 64, 8, 2, true}, MoeDims{2880, 2880, 32, 4, true}}) {
    Rng rng{++seed};
    const MoeWeights mw(rng, d);
    for (int tokens : {1, 4}) {
      d.residual = true;
      check_moe(d, mw, tokens, ++seed);
      d.residual = false;
      check_moe(d, mw, tokens, ++seed);
    }
  }
}

// ---- bandwidth (informational; no assertions on speed) ---------------------------------------

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
