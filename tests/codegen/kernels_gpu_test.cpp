// GPU checks of the decode kernels against ir::ref on random inputs, plus bandwidth figures.
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

/// Median kernel time in ms of `run(i)` over 20 runs after 3 warm-ups, by CUDA events.
template <typename F> double median_ms(F&& run) {
  cudaEvent_t a, b;
  cuda_ok(cudaEventCreate(&a), "event");
  cuda_ok(cudaEventCreate(&b), "event");
  for (int i = 0; i < 3; ++i)
    run(i);
  std::vector<float> ms;
  for (int i = 0; i < 20; ++i) {
    cudaEventRecord(a);
    run(i);
    cudaEventRecord(b);
    cuda_ok(cudaEventSynchronize(b), "timing");
    float m = 0;
    cudaEventElapsedTime(&m, a, b);
    ms.push_back(m);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

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

// ---- small per-row kernels: embedding, rms_norm, select_rows, rope_yarn, kv_write, top-k -------

namespace {

std::vector<int32_t> download_ints(const DevBuf& b, size_t n) {
  std::vector<int32_t> v(n);
  cuda_ok(cudaMemcpy(v.data(), b.p, n * sizeof(int32_t), cudaMemcpyDeviceToHost), "download");
  return v;
}

} // namespace

TEST_CASE("argmax kernel picks the largest logit, ties to the lower id, never a NaN") {
  XSERV_REQUIRE_GPU();
  Rng rng{800};
  // 201088: the 20b vocabulary (float4 loads, 25 chunks); 20000: chunks that end mid-row;
  // 1001: not a multiple of 4 (scalar loads).
  for (const int vocab : {201088, 20000, 1001}) {
    const int rows = 6, chunks = argmax_chunks(vocab);
    Tensor x = random_f32(rng, {rows, vocab}, 4.0f);
    auto at = [&](int r, int i) -> float& { return x.f[size_t(r) * vocab + i]; };
    at(0, vocab - 1) = 9.0f; // the last id
    at(1, 3) = 9.0f;         // a tie across chunks: the lower id wins
    at(1, vocab - 2) = 9.0f;
    at(2, 0) = std::numeric_limits<float>::quiet_NaN(); // NaNs never win
    at(2, vocab / 2) = std::numeric_limits<float>::quiet_NaN();
    at(2, vocab / 3) = 5.0f;
    for (int i = 0; i < vocab; ++i) // all negative, the maximum is -0 at two places
      at(3, i) = -1.0f - float(i % 7);
    at(3, vocab / 4) = -0.0f;
    at(3, vocab / 4 + 1) = 0.0f;
    for (int i = 0; i < vocab; ++i) // one value everywhere: id 0
      at(4, i) = -2.5f;
    std::vector<int32_t> want(rows);
    for (int r = 0; r < rows; ++r) {
      int best = -1;
      for (int i = 0; i < vocab; ++i)
        if (!std::isnan(at(r, i)) && (best < 0 || at(r, i) > at(r, best)))
          best = i;
      want[size_t(r)] = best;
    }
    const Loaded& k = load(emit_argmax(vocab, {}));
    auto dx = upload(x);
    DevBuf keys(size_t(rows) * chunks * sizeof(uint64_t));
    cuda_ok(cudaMemset(keys.p, 0xff, keys.bytes), "poison"); // every key must be written
    launch(k, rows, 1, dx->p, keys.p);
    device_sync();
    std::vector<uint64_t> got(size_t(rows) * chunks);
    cuda_ok(cudaMemcpy(got.data(), keys.p, keys.bytes, cudaMemcpyDeviceToHost), "download");
    for (int r = 0; r < rows; ++r) {
      CAPTURE(vocab);
      CAPTURE(r);
      CHECK(argmax_of_keys(got.data() + size_t(r) * chunks, chunks) == want[size_t(r)]);
    }
  }
}

TEST_CASE("embedding, rms_norm and select_rows kernels match ir::ref") {
  XSERV_REQUIRE_GPU();
  Rng rng{700};
  const int vocab = 1000, dim = 2880, tokens = 7;
  const Bf16Weight table = random_bf16(rng, {vocab, dim}, 1.0f);
  const Tensor ids = Tensor::from_ints({tokens}, {0, 999, 5, 5, 123, 998, 1});
  const Tensor want_e = ir::ref::embedding(table.t, ids);
  const Loaded& emb = load(emit_embedding({vocab, dim}, {}));
  auto dt = upload(table.bits), dids = upload(ids);
  auto out = poisoned(want_e.f.size());
  launch(emb, tokens, 1, dt->p, dids->p, out->p);
  device_sync();
  const std::vector<float> got_e = download(*out, want_e.f.size());
  CHECK(got_e == want_e.f); // a widening copy: exact

  const Tensor x = random_f32(rng, {tokens, dim}, 3.0f);
  const Bf16Weight w = random_bf16(rng, {dim}, 1.0f);
  const Tensor want_n = ir::ref::rms_norm(x, w.t, 1e-5);
  const Loaded& norm = load(emit_rms_norm({dim, 1e-5}, {}));
  auto dx = upload(x), dw = upload(w.bits);
  auto y = poisoned(want_n.f.size());
  launch(norm, tokens, 1, dx->p, dw->p, y->p);
  device_sync();
  const double err_n = rel_l2(download(*y, want_n.f.size()), want_n.f);
  MESSAGE(norm.src.name << " rows " << tokens << ": rel L2 " << err_n);
  CHECK(err_n <= 1e-6);

  const Tensor rows = Tensor::from_ints({3}, {6, 0, 3});
  const Tensor want_s = ir::ref::select_rows(x, rows);
  const Loaded& sel = load(emit_select_rows({dim}, {}));
  auto drows = upload(rows);
  auto s = poisoned(want_s.f.size());
  launch(sel, 3, 1, dx->p, drows->p, s->p);
  device_sync();
  CHECK(download(*s, want_s.f.size()) == want_s.f);
}

TEST_CASE("rope_yarn kernel matches ir::ref at small and large positions") {
  XSERV_REQUIRE_GPU();
  Rng rng{710};
  const ir::ref::Yarn yarn; // gpt-oss: theta 150000, factor 32, beta 32 / 1
  for (auto [heads, head_dim] : {std::pair{4, 16}, std::pair{64, 64}, std::pair{8, 64}}) {
    const Tensor pos = Tensor::from_ints({6}, {0, 1, 17, 4095, 100000, 131071});
    const Tensor x = random_f32(rng, {6, heads, head_dim}, 2.0f);
    const Tensor want = ir::ref::rope_yarn(x, pos, yarn);
    const std::vector<double> inv = ir::ref::yarn_inv_freq(yarn, head_dim);
    const Loaded& l =
        load(emit_rope_yarn({heads, head_dim, ir::ref::yarn_attention_factor(yarn)}, {}));
    auto dx = upload(x), dpos = upload(pos), dinv = upload(inv);
    auto y = poisoned(want.f.size());
    launch(l, 6, 1, dx->p, dpos->p, dinv->p, y->p);
    launch(l, 6, 1, dx->p, dpos->p, dinv->p, dx->p); // in place
    device_sync();
    const double err = rel_l2(download(*y, want.f.size()), want.f);
    const double err_in_place = rel_l2(download(*dx, want.f.size()), want.f);
    MESSAGE(l.src.name << ": rel L2 " << err << ", in place " << err_in_place);
    CHECK(err <= 1e-6);
    CHECK(err_in_place <= 1e-6);
  }
}

TEST_CASE("rope_yarn_qk_kv: rope_yarn_qk then the two kv_writes, in one launch, bit for bit") {
  XSERV_REQUIRE_GPU();
  Rng rng{716};
  const ir::ref::Yarn yarn;
  const double att = ir::ref::yarn_attention_factor(yarn);
  // A decode step of 4 sequences (one token each) in rows 3, 0, 2, 1 of a 4-row cache; the
  // positions wrap an 8-slot ring, and reach far into a full cache of 4096 slots.
  const Tensor pos = Tensor::from_ints({4}, {7, 8, 21, 4000});
  const Tensor seq = Tensor::from_ints({4}, {0, 1, 2, 3});
  const Tensor crow = Tensor::from_ints({4}, {3, 0, 2, 1});
  for (auto [hq, hk, head_dim, slots, f32] :
       {std::tuple{4, 2, 16, 8, false}, std::tuple{4, 2, 16, 8, true},
        std::tuple{64, 8, 64, 4096, true}, std::tuple{64, 8, 64, 128, false}}) {
    const int tokens = 4, rows = 4;
    const Tensor q = random_f32(rng, {tokens, hq, head_dim}, 2.0f);
    const Tensor k = random_f32(rng, {tokens, hk, head_dim}, 2.0f);
    const Tensor v = random_f32(rng, {tokens, hk, head_dim}, 2.0f);
    const std::vector<double> inv = ir::ref::yarn_inv_freq(yarn, head_dim);
    const size_t cache_n = size_t(rows) * slots * hk * head_dim;
    const size_t elem = f32 ? 4 : 2;
    // Both caches start from the same random bytes for the reference and the fused kernel.
    std::vector<uint8_t> init(cache_n * elem);
    for (auto& b : init)
      b = static_cast<uint8_t>(rng.next(1.0f) * 100.0f);
    auto dpos = upload(pos), dseq = upload(seq), drow = upload(crow), dinv = upload(inv);
    // Reference: rope_yarn_qk, then kv_write of k and of v.
    auto rq = upload(q), rk = upload(k), rv = upload(v);
    auto rkc = upload(init), rvc = upload(init);
    launch(load(emit_rope_yarn_qk(hq, hk, head_dim, att, {})), tokens, 1, rq->p, rk->p, dpos->p,
           dinv->p);
    const Loaded& kvw = load(emit_kv_write({hk, head_dim, slots, f32}, {}));
    launch(kvw, tokens, 1, rkc->p, rk->p, dpos->p, dseq->p, drow->p);
    launch(kvw, tokens, 1, rvc->p, rv->p, dpos->p, dseq->p, drow->p);
    // The fused kernel.
    auto fq = upload(q), fk = upload(k), fv = upload(v);
    auto fkc = upload(init), fvc = upload(init);
    const Loaded& fused = load(emit_rope_yarn_qk_kv(hq, hk, head_dim, att, slots, f32, {}));
    launch(fused, tokens, 1, fq->p, fk->p, fv->p, dpos->p, dseq->p, drow->p, dinv->p, fkc->p,
           fvc->p);
    device_sync();
    auto bytes = [](const DevBuf& b) {
      std::vector<uint8_t> h(b.bytes);
      cuda_ok(cudaMemcpy(h.data(), b.p, b.bytes, cudaMemcpyDeviceToHost), "download");
      return h;
    };
    CAPTURE(fused.src.name);
    CHECK(bytes(*fq) == bytes(*rq));
    CHECK(bytes(*fk) == bytes(*rk));
    CHECK(bytes(*fkc) == bytes(*rkc));
    CHECK(bytes(*fvc) == bytes(*rvc));
    CHECK(bytes(*fkc) != init); // the writes happened
  }
}

TEST_CASE("rope_yarn_qk rotates q and k in place like two rope_yarn") {
  XSERV_REQUIRE_GPU();
  Rng rng{715};
  const ir::ref::Yarn yarn;
  for (auto [hq, hk, head_dim] : {std::tuple{4, 2, 16}, std::tuple{64, 8, 64}}) {
    const Tensor pos = Tensor::from_ints({5}, {0, 3, 129, 4095, 131071});
    const Tensor q = random_f32(rng, {5, hq, head_dim}, 2.0f);
    const Tensor k = random_f32(rng, {5, hk, head_dim}, 2.0f);
    const Tensor want_q = ir::ref::rope_yarn(q, pos, yarn),
                 want_k = ir::ref::rope_yarn(k, pos, yarn);
    const std::vector<double> inv = ir::ref::yarn_inv_freq(yarn, head_dim);
    const Loaded& l =
        load(emit_rope_yarn_qk(hq, hk, head_dim, ir::ref::yarn_attention_factor(yarn), {}));
    auto dq = upload(q), dk = upload(k), dpos = upload(pos), dinv = upload(inv);
    launch(l, 5, 1, dq->p, dk->p, dpos->p, dinv->p);
    device_sync();
    const double eq = rel_l2(download(*dq, want_q.f.size()), want_q.f);
    const double ek = rel_l2(download(*dk, want_k.f.size()), want_k.f);
    MESSAGE(l.src.name << ": rel L2 q " << eq << ", k " << ek);
    CHECK(eq <= 1e-6);
    CHECK(ek <= 1e-6);
  }
}

TEST_CASE("qkv_decode matches three normed linears") {
  XSERV_REQUIRE_GPU();
  Rng rng{716};
  // (K, q rows, k/v rows, most tokens, rows per warp, loads in flight, K splits)
  for (auto [k, nq, nkv, max_t, rows, unroll, ks] :
       {std::tuple{64, 64, 32, 8, 0, 4, 1}, std::tuple{2880, 4096, 512, 8, 0, 4, 1},
        std::tuple{2880, 4096, 512, 8, 1, 8, 4}, std::tuple{2880, 4096, 512, 1, 0, 2, 8},
        std::tuple{2880, 4096, 512, 1, 0, 4, 2}})
    for (int tokens : {1, 3, 8}) {
      if (tokens > max_t)
        continue;
      QkvDims d;
      d.k = k;
      d.nq = nq;
      d.nk = d.nv = nkv;
      d.max_tokens = max_t;
      d.rows = rows;
      d.unroll = unroll;
      d.ksplit = ks;
      const Tensor x = random_f32(rng, {tokens, k}, 2.0f);
      const Bf16Weight ln = random_bf16(rng, {k}, 1.0f);
      std::vector<Bf16Weight> w, b;
      std::vector<std::unique_ptr<DevBuf>> dw, db, dy;
      std::vector<Tensor> want;
      for (int n : {nq, nkv, nkv}) {
        w.push_back(random_bf16(rng, {n, k}, 1.0f / std::sqrt(float(k))));
        b.push_back(random_bf16(rng, {n}, 0.5f));
        want.push_back(ir::ref::rms_norm_linear(x, ln.t, d.eps, w.back().t, &b.back().t));
        dw.push_back(upload(w.back().bits));
        db.push_back(upload(b.back().bits));
        dy.push_back(poisoned(want.back().f.size()));
      }
      const Loaded& l = load(emit_qkv_decode(d, {}));
      auto dx = upload(x), dln = upload(ln.bits);
      launch(l, tokens, 1, dx->p, dln->p, dw[0]->p, db[0]->p, dw[1]->p, db[1]->p, dw[2]->p,
             db[2]->p, dy[0]->p, dy[1]->p, dy[2]->p, tokens);
      device_sync();
      for (size_t i = 0; i < 3; ++i) {
        const double err = rel_l2(download(*dy[i], want[i].f.size()), want[i].f);
        MESSAGE(l.src.name << " T=" << tokens << " projection " << i << ": rel L2 " << err);
        CHECK(err <= kTol);
      }
    }
}

namespace {

/// kv_write of tokens at `positions` of sequences `seqs` (contiguous per sequence) into a bf16
/// ring of 8 slots, against ir::ref's sequential writes, bit for bit.
void check_kv_write(const std::vector<int32_t>& positions, const std::vector<int32_t>& seqs,
                    uint64_t seed) {
  Rng rng{seed};
  const int rows = 3, slots = 8, g = 2, d = 16, tokens = int(positions.size());
  std::vector<int32_t> ctx_lens;
  for (size_t t = 0; t < positions.size(); ++t)
    if (t == 0 || seqs[t] != seqs[t - 1])
      ctx_lens.push_back(positions[t]);
  const int nseq = int(ctx_lens.size());
  const Tensor pos = Tensor::from_ints({tokens}, positions);
  const Tensor seq = Tensor::from_ints({tokens}, seqs);
  const Tensor ctx = Tensor::from_ints({nseq}, ctx_lens);
  std::vector<int32_t> row_ids;
  for (int b = 0; b < nseq; ++b)
    row_ids.push_back(rows - 1 - b);
  const Tensor crow = Tensor::from_ints({nseq}, row_ids);
  const Tensor x = random_f32(rng, {tokens, g, d}, 2.0f);
  Bf16Weight cache = random_bf16(rng, {rows, slots, g, d}, 1.0f);
  Tensor want = cache.t;
  ir::ref::kv_write(want, x, {pos, seq, ctx, crow});
  const Loaded& l = load(emit_kv_write({g, d, slots}, {}));
  auto dc = upload(cache.bits), dx = upload(x), dpos = upload(pos), dseq = upload(seq);
  auto drow = upload(crow);
  launch(l, tokens, 1, dc->p, dx->p, dpos->p, dseq->p, drow->p);
  device_sync();
  std::vector<uint16_t> got(cache.bits.size());
  cuda_ok(cudaMemcpy(got.data(), dc->p, got.size() * 2, cudaMemcpyDeviceToHost), "download");
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    bad += got[i] != models::float_to_bf16(want.f[i]);
  MESSAGE(l.src.name << " " << tokens << " tokens: " << bad << " of " << got.size()
                     << " cache values differ");
  CHECK(bad == 0);
}

} // namespace

TEST_CASE("kv_write kernel stores bf16 rows where ir::ref puts them") {
  XSERV_REQUIRE_GPU();
  // Two sequences: 3 tokens at positions 6..8 (8 wraps to slot 0), one at 20.
  check_kv_write({6, 7, 8, 20}, {0, 0, 0, 1}, 720);
  // A prefill longer than the ring: 20 tokens of one sequence over 8 slots (the last 8 must
  // stay), then 3 of another.
  std::vector<int32_t> pos, seq;
  for (int p = 0; p < 20; ++p) {
    pos.push_back(p);
    seq.push_back(0);
  }
  for (int p = 5; p < 8; ++p) {
    pos.push_back(p);
    seq.push_back(1);
  }
  check_kv_write(pos, seq, 721);
}

TEST_CASE(
    "norm_router_topk: rms_norm, the router GEMV and router_topk in one launch, bit for bit") {
  XSERV_REQUIRE_GPU();
  Rng rng{731};
  // 20b's routing (2880 wide, 32 experts, top 4), a small one, and one without bias.
  for (auto [dim, experts, k, bias] : {std::tuple{2880, 32, 4, true}, std::tuple{64, 8, 2, true},
                                       std::tuple{2880, 128, 4, false}}) {
    for (int tokens : {1, 3, 8}) {
      CAPTURE(dim);
      CAPTURE(experts);
      CAPTURE(tokens);
      const Tensor x = random_f32(rng, {tokens, dim}, 3.0f);
      const Bf16Weight ln = random_bf16(rng, {dim}, 1.0f);
      const Bf16Weight w = random_bf16(rng, {experts, dim}, 0.05f);
      const Bf16Weight b = random_bf16(rng, {experts}, 0.5f);
      auto dx = upload(x), dln = upload(ln.bits), dw = upload(w.bits), db = upload(b.bits);
      // Reference: the three kernels the lowering used before.
      auto xn = poisoned(size_t(tokens) * dim), logits = poisoned(size_t(tokens) * experts);
      auto rw = poisoned(size_t(tokens) * k), rid = poisoned(size_t(tokens) * k);
      launch(load(emit_rms_norm({dim, 1e-5}, {})), tokens, 1, dx->p, dln->p, xn->p);
      LinearDims ld;
      ld.k = dim;
      ld.n = experts;
      ld.bias = bias;
      ld.ksplit = router_ksplit(experts); // the same partial sums as the fused kernel's
      const Loaded& gemv = load(emit_linear(ld, {}));
      if (bias)
        launch(gemv, tokens, 1, xn->p, dw->p, db->p, logits->p, tokens);
      else
        launch(gemv, tokens, 1, xn->p, dw->p, logits->p, tokens);
      launch(load(emit_router_topk({experts, k}, {})), tokens, 1, logits->p, rw->p, rid->p);
      // The fused kernel.
      auto fxn = poisoned(size_t(tokens) * dim);
      auto fw = poisoned(size_t(tokens) * k), fid = poisoned(size_t(tokens) * k);
      const Loaded& fused = load(emit_norm_router_topk(dim, {experts, k}, 1e-5, bias, {}));
      if (bias)
        launch(fused, tokens, 1, dx->p, dln->p, dw->p, db->p, fxn->p, fw->p, fid->p);
      else
        launch(fused, tokens, 1, dx->p, dln->p, dw->p, fxn->p, fw->p, fid->p);
      device_sync();
      const std::vector<float> want_xn = download(*xn, size_t(tokens) * dim);
      CHECK(download(*fxn, want_xn.size()) == want_xn);
      CHECK(download(*fw, size_t(tokens) * k) == download(*rw, size_t(tokens) * k));
      CHECK(download_ints(*fid, size_t(tokens) * k) == download_ints(*rid, size_t(tokens) * k));
      if (dim == 2880 && tokens == 1) { // informational: one launch against three
        const double one = median_ms([&](int) {
          if (bias)
            launch(fused, tokens, 1, dx->p, dln->p, dw->p, db->p, fxn->p, fw->p, fid->p);
          else
            launch(fused, tokens, 1, dx->p, dln->p, dw->p, fxn->p, fw->p, fid->p);
        });
        MESSAGE(fused.src.name << " (" << fused.src.launch.blocks_x
                               << " blocks per token): " << one * 1e3 << " us");
      }
    }
  }
}

TEST_CASE("router_topk kernel matches ir::ref, ties to the lower index") {
  XSERV_REQUIRE_GPU();
  Rng rng{730};
  for (auto [experts, k] : {std::pair{8, 2}, std::pair{32, 4}, std::pair{128, 4}}) {
    const int tokens = 9;
    Tensor logits = random_f32(rng, {tokens, experts}, 3.0f);
    logits.f[3] = logits.f[5] = 10.0f; // token 0: a tie at the top
    logits.f[size_t(experts) + 1] = logits.f[size_t(experts) + 2] = -10.0f; // token 1: low tie
    Tensor want_w, want_i;
    ir::ref::router_topk(logits, k, want_w, want_i);
    const Loaded& l = load(emit_router_topk({experts, k}, {}));
    auto dl = upload(logits);
    auto w = poisoned(size_t(tokens) * k), ids = poisoned(size_t(tokens) * k);
    launch(l, tokens, 1, dl->p, w->p, ids->p);
    device_sync();
    CHECK(download_ints(*ids, want_i.i.size()) == want_i.i);
    const double err = rel_l2(download(*w, want_w.f.size()), want_w.f);
    MESSAGE(l.src.name << ": weights rel L2 " << err);
    CHECK(err <= 1e-6);
  }
}
