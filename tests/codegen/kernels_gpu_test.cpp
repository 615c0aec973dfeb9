// GPU checks of the decode linear, attention and MoE kernels against ir::ref on random inputs
// (small_kernels_gpu_test.cpp has the per-token kernels; tests/bench/kernels_bench.cpp times
// them).
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

// Relative L2 against ir::ref: every kernel measured at worst 3.2e-7 on these random inputs
// (H200, 2026-11-29, docs/PERF.md "Decode kernels"); the limit is 10x that.
constexpr double kTol = 3e-6;

// ---- linear ----------------------------------------------------------------------------------

/// Launches a linear kernel of `d` for `tokens` tokens: x, [ln], w, [b], [h], y, tokens (the
/// optional pointers as d says).
void launch_linear(const Loaded& l, const LinearDims& d, int tokens, void* x, void* ln, void* w,
                   void* b, void* h, void* y) {
  std::vector<void*> args = {x};
  if (d.norm)
    args.push_back(ln);
  args.push_back(w);
  if (d.bias)
    args.push_back(b);
  if (d.residual)
    args.push_back(h);
  args.push_back(y);
  std::vector<size_t> sizes(args.size(), sizeof(void*));
  std::vector<void*> ptrs;
  for (void*& a : args)
    ptrs.push_back(&a);
  int t = tokens;
  ptrs.push_back(&t);
  sizes.push_back(sizeof(int));
  const auto g = l.src.launch.grid(tokens);
  l.module.launch_raw(l.kernel, dim3(g[0], g[1], g[2]), dim3(l.src.launch.block),
                      l.src.launch.smem(tokens), nullptr, ptrs.data(), sizes.data(), ptrs.size());
}

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
  launch_linear(l, d, tokens, dx->p, dln->p, dw->p, db->p, dh->p, dy->p);
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

TEST_CASE("linear_decode_smem (one token, rows resident in shared memory) matches ir::ref and "
          "linear_decode") {
  XSERV_REQUIRE_GPU();
  uint64_t seed = 30;
  for (LinearDims d : {LinearDims{4096, 2880, false, true, true},   // 20b o_proj + residual
                       LinearDims{64, 64, false, true, true},       // tiny o_proj
                       LinearDims{2880, 1000, false, false, false}, // plain, no bias
                       LinearDims{200, 24, false, true, false}}) {  // K not a multiple of 64
    d.max_tokens = 1;
    LinearDims s = d;
    s.smem = true;
    REQUIRE(linear_smem_rows(s) > 0);
    check_linear(s, 1, ++seed); // fp32 activations against ir::ref
    // bf16 activations (round_act): against the FMA kernel on the same rounded inputs.
    d.round_act = s.round_act = true;
    Rng rng{++seed};
    const Tensor x = random_f32(rng, {1, d.k}, 2.0f);
    const Bf16Weight w = random_bf16(rng, {d.n, d.k}, 1.0f / std::sqrt(float(d.k)));
    const Bf16Weight b = random_bf16(rng, {d.n}, 0.5f);
    const Tensor h = random_f32(rng, {1, d.n}, 1.0f);
    auto dx = upload(x.f), dw = upload(w.bits), db = upload(b.bits), dh = upload(h.f);
    auto run = [&](const LinearDims& v) {
      const Loaded& l = load(emit_linear(v, {}));
      auto dy = poisoned(size_t(d.n));
      launch_linear(l, v, 1, dx->p, nullptr, dw->p, db->p, dh->p, dy->p);
      device_sync();
      return download(*dy, size_t(d.n));
    };
    const double err = rel_l2(run(s), run(d));
    MESSAGE("linear_decode_smem k " << d.k << " n " << d.n << ", bf16 activations: against "
                                    << "linear_decode " << err);
    CHECK(err <= kTol);
  }
  // Rows that cannot sit in 200 KiB on 132 SMs, and steps above one token, are refused.
  LinearDims wide{2880, 5120, false, true, false};
  wide.max_tokens = 1;
  wide.smem = true;
  CHECK(linear_smem_rows(wide) == 0);
  CHECK_THROWS_WITH(emit_linear(wide, {}), doctest::Contains("shared-memory linear"));
}

TEST_CASE("tensor-core linear_decode agrees with linear_decode on bf16 activations, each token "
          "as if alone") {
  XSERV_REQUIRE_GPU();
  struct Tiling {
    int groups, splits, stages;
  };
  uint64_t seed = 40;
  for (LinearDims d :
       {LinearDims{128, 64, false, true, true}, LinearDims{4096, 2880, false, true, true},
        LinearDims{2880, 1024, false, false, false}}) {
    d.round_act = true;
    Rng rng{++seed};
    const int max_t = 8;
    const Tensor x = random_f32(rng, {max_t, d.k}, 2.0f);
    const Bf16Weight w = random_bf16(rng, {d.n, d.k}, 1.0f / std::sqrt(float(d.k)));
    const Bf16Weight b = random_bf16(rng, {d.n}, 0.5f);
    const Tensor h = random_f32(rng, {max_t, d.n}, 1.0f);
    auto dx = upload(x.f), dw = upload(w.bits), db = upload(b.bits), dh = upload(h.f);
    // Double sums on the bf16-rounded activations the kernels take.
    std::vector<float> want(size_t(max_t) * d.n);
    for (int t = 0; t < max_t; ++t)
      for (int n = 0; n < d.n; ++n) {
        double sum = 0.0;
        for (int k = 0; k < d.k; ++k)
          sum += double(w.t.f[size_t(n) * d.k + k]) *
                 double(models::bf16_to_float(models::float_to_bf16(x.f[size_t(t) * d.k + k])));
        if (d.bias)
          sum += b.t.f[size_t(n)];
        if (d.residual)
          sum += h.f[size_t(t) * d.n + n];
        want[size_t(t) * d.n + n] = float(sum);
      }
    auto run = [&](const LinearDims& v, int tokens) {
      const Loaded& l = load(emit_linear(v, {}));
      auto dy = poisoned(size_t(tokens) * d.n);
      launch_linear(l, v, tokens, dx->p, nullptr, dw->p, db->p, dh->p, dy->p);
      device_sync();
      return download(*dy, size_t(tokens) * d.n);
    };
    auto head = [&](const std::vector<float>& v, int tokens) {
      return std::vector<float>(v.begin(), v.begin() + size_t(tokens) * d.n);
    };
    LinearDims f = d;
    f.max_tokens = max_t;
    const std::vector<float> fma = run(f, max_t);
    const double fma_err = rel_l2(fma, want);
    for (const Tiling& t : {Tiling{0, 0, 0}, Tiling{2, 4, 3}, Tiling{1, 16, 2}, Tiling{4, 2, 6}}) {
      LinearDims v = f;
      v.mma = true;
      v.mma_groups = t.groups;
      v.mma_splits = t.splits;
      v.mma_stages = t.stages;
      if (!linear_mma_fits(v))
        continue;
      const std::vector<float> all = run(v, max_t);
      const double err = rel_l2(all, want), vs_fma = rel_l2(all, fma);
      MESSAGE("linear_decode_mma k " << d.k << " n " << d.n << " tiling " << t.groups << "/"
                                     << t.splits << "/" << t.stages << ": against the double "
                                     << "reference " << err << " (FMA kernel " << fma_err
                                     << "), against the FMA kernel " << vs_fma);
      INFO("k " << d.k << " n " << d.n << " tiling " << t.groups << "/" << t.splits << "/"
                << t.stages);
      CHECK(err <= std::max(2 * fma_err, 1e-6));
      CHECK(vs_fma <= 3e-6);
      // A token's outputs do not depend on the step's other tokens: bitwise.
      for (int tokens : {1, 3}) {
        const std::vector<float> few = run(v, tokens);
        CHECK(std::memcmp(few.data(), head(all, tokens).data(), few.size() * 4) == 0);
      }
    }
  }
}

// ---- attention -------------------------------------------------------------------------------

namespace {

/// Attention for sequences with `seq_tokens[b]` step tokens after `ctx[b]` cached positions, the
/// cache paged through random non-contiguous block tables (every sequence's first two blocks
/// shared with sequence 0's, a common prefix; a window's blocks below its reach missing).
/// splits = 0 picks attention_splits().
void check_attention(const AttentionDims& d, const std::vector<int>& seq_tokens,
                     const std::vector<int>& ctx, int splits, uint64_t seed) {
  Rng rng{seed};
  const int nseq = int(seq_tokens.size());
  std::vector<int32_t> positions, token_seq, ctx_lens(ctx.begin(), ctx.end());
  std::vector<int> lo, hi;
  int max_keys = 1;
  for (int b = 0; b < nseq; ++b) {
    lo.push_back(d.window ? std::max(0, ctx[b] - d.window + 1) : 0);
    hi.push_back(ctx[b]);
    for (int i = 0; i < seq_tokens[b]; ++i) {
      const int p = ctx[b] + i;
      positions.push_back(p);
      token_seq.push_back(b);
      max_keys = std::max(max_keys, d.window ? std::min(p + 1, d.window) : p + 1);
    }
  }
  const PagedTables pt = random_tables(seed, d.block, d.table, lo, hi, 2);
  const int tokens = int(positions.size());
  const Tensor pos = Tensor::from_ints({tokens}, positions);
  const Tensor tseq = Tensor::from_ints({tokens}, token_seq);
  const Tensor lens = Tensor::from_ints({nseq}, ctx_lens);
  const Tensor tables = pt.tensor();
  const Tensor q = random_f32(rng, {tokens, d.heads, d.head_dim}, 2.0f);
  const Tensor k = random_f32(rng, {tokens, d.kv_heads, d.head_dim}, 1.0f);
  const Tensor v = random_f32(rng, {tokens, d.kv_heads, d.head_dim}, 1.0f);
  const Bf16Weight kc = random_bf16(rng, {pt.blocks, d.block, d.kv_heads, d.head_dim}, 1.0f);
  const Bf16Weight vc = random_bf16(rng, {pt.blocks, d.block, d.kv_heads, d.head_dim}, 1.0f);
  const Bf16Weight sinks = random_bf16(rng, {d.heads}, 2.0f);
  const Tensor want = ir::ref::attention(q, k, v, kc.t, vc.t, sinks.t, {pos, tseq, lens, tables},
                                         d.window, d.scale);
  if (splits == 0)
    splits = attention_splits(max_keys);
  const Loaded& dec = load(emit_attention_decode(d, {}));
  const Loaded& comb = load(emit_attention_combine(d, {}));
  auto dq = upload(q), dk = upload(k), dv = upload(v), dkc = upload(kc.bits);
  auto dvc = upload(vc.bits), ds = upload(sinks.bits), dpos = upload(pos), dts = upload(tseq);
  auto dlen = upload(lens), dtab = upload(tables);
  auto out = poisoned(want.f.size());
  const size_t th = size_t(tokens) * d.heads * splits;
  auto part_ml = poisoned(th * 2), part_o = poisoned(th * d.head_dim);
  launch(dec, tokens, splits, dq->p, dk->p, dv->p, dkc->p, dvc->p, ds->p, dpos->p, dts->p, dlen->p,
         dtab->p, out->p, part_ml->p, part_o->p);
  if (splits > 1)
    launch(comb, tokens, 1, part_ml->p, part_o->p, ds->p, splits, out->p);
  device_sync();
  const double err = rel_l2(download(*out, want.f.size()), want.f);
  const std::string layout = nseq > 1 ? std::to_string(tokens) + " of " + std::to_string(nseq) +
                                             " sequences"
                                       : std::to_string(seq_tokens[0]);
  MESSAGE(dec.src.name << " tokens " << layout << " ctx " << ctx[0] << " splits " << splits
                       << ": rel L2 " << err);
  CHECK(err <= kTol);
}

} // namespace

TEST_CASE("attention kernels match ir::ref on paged caches (random, shared, windowed blocks)") {
  XSERV_REQUIRE_GPU();
  // {heads, kv heads, head dim, block, table, window, scale}: tables of 320 entries reach past
  // position 5000.
  const AttentionDims shapes[] = {
      {4, 2, 16, 16, 320, 0, 0.25},     // tiny, full
      {4, 2, 16, 16, 320, 8, 0.25},     // tiny, a window shorter than a block
      {64, 8, 64, 16, 320, 0, 0.125},   // 20b, full
      {64, 8, 64, 16, 320, 128, 0.125}, // 20b, a window of 8 blocks
      {64, 8, 64, 32, 160, 128, 0.125}, // 20b, blocks of 32
  };
  uint64_t seed = 100;
  for (const AttentionDims& d : shapes)
    for (int ctx : {1, 100, 1000, 4500}) {
      check_attention(d, {1}, {ctx}, 0, ++seed);             // decode: one token
      check_attention(d, {3, 1}, {ctx, ctx / 2}, 0, ++seed); // T=4 over two sequences
      check_attention(d, {1}, {ctx}, 7, ++seed);             // forced splits, some empty
    }
  // Decode steps of more than 64 sequences, one token each, as the lowering runs them: the
  // decode kernel in one key split writing the output itself (no combine), contexts 1 to 4,500.
  for (const AttentionDims& d : shapes) {
    std::vector<int> ctx;
    for (int b = 0; b < 100; ++b)
      ctx.push_back(1 + (b * 977) % 4500);
    check_attention(d, std::vector<int>(100, 1), ctx, 1, ++seed);
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
