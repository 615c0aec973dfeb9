// The canonical attention order of plain bf16 plans (codegen/kernels/attention_mma.cuh): a
// query's output is the same bits whichever kernel and step computes it. The prompt kernel
// (attention_prefill_mma) on a whole prompt is the reference; the same queries must come out
// bitwise equal from the prompt kernel on the prompt in pieces of 64 and 200 tokens, among
// other sequences' tokens in the same step, and from the decode kernel (attention_decode_mma)
// one token a step, several tokens a step, with every chunk in its own block (and
// attention_combine_chunks) or all in one. Full attention and windows of 8 (the tiny model: a
// window crosses chunk boundaries) and 128 (the 20b), bf16 and fp32 caches, paged through
// random non-contiguous block tables, positions past 4,096.
//
// Each kernel is also held to ir::ref::attention on the inputs rounded to fp16 as the kernels
// round them (1e-5 relative L2: fp32 summation and the weights' 2^-22 pair rounding are what is
// left; see attention_prefill_gpu_test.cpp for the bound's derivation).
#include "tests/codegen/kernel_test_util.h"

#include "codegen/emit_prefill.h"
#include "ir/reference.h"
#include "runtime/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

using namespace xserv;
using namespace xserv::codegen;
using namespace xserv::kernel_test;
using ir::DType;
using ir::Tensor;

namespace {

constexpr double kRoundedTol = 1e-5;

/// One sequence's queries, keys and values at positions 0 .. n-1 (keys and values as the cache
/// holds them: bf16 values for a bf16 cache, so that the step's own keys, which the kernels
/// round through bf16, and cached ones are the same numbers).
struct Seq {
  int n = 0;
  Tensor q, k, v; // [n, H, D], [n, G, D], [n, G, D]
};

/// The sequences' keys in one paged pool (every position of every sequence; a window's blocks
/// below its reach are still written, which the kernels never read).
struct Pool {
  PagedTables pt;
  std::unique_ptr<DevBuf> kc, vc, sinks;
  Tensor sinks_t;
};

Seq make_seq(const AttentionDims& d, int n, Rng& rng) {
  Seq s;
  s.n = n;
  s.q = random_f32(rng, {n, d.heads, d.head_dim}, 2.0f);
  s.k = random_f32(rng, {n, d.kv_heads, d.head_dim}, 1.0f);
  s.v = random_f32(rng, {n, d.kv_heads, d.head_dim}, 1.0f);
  if (!d.f32_cache)
    for (Tensor* t : {&s.k, &s.v})
      for (float& x : t->f)
        x = models::bf16_to_float(models::float_to_bf16(x));
  return s;
}

Pool make_pool(const AttentionDims& d, const std::vector<Seq>& seqs, uint64_t seed) {
  Pool p;
  std::vector<int> lo, hi;
  for (const Seq& s : seqs) {
    lo.push_back(0);
    hi.push_back(s.n);
  }
  p.pt = random_tables(seed, d.block, d.table, lo, hi);
  const size_t slot = size_t(d.kv_heads) * d.head_dim;
  std::vector<float> kf(size_t(p.pt.blocks) * d.block * slot, 0.0f), vf = kf;
  for (size_t b = 0; b < seqs.size(); ++b)
    for (int j = 0; j < seqs[b].n; ++j) {
      const size_t at =
          (size_t(p.pt.rows[b * size_t(d.table) + size_t(j / d.block)]) * d.block + j % d.block) *
          slot;
      std::copy_n(seqs[b].k.f.begin() + std::ptrdiff_t(j * slot), slot, kf.begin() + std::ptrdiff_t(at));
      std::copy_n(seqs[b].v.f.begin() + std::ptrdiff_t(j * slot), slot, vf.begin() + std::ptrdiff_t(at));
    }
  if (d.f32_cache) {
    p.kc = upload(kf);
    p.vc = upload(vf);
  } else {
    std::vector<uint16_t> kb(kf.size()), vb(vf.size());
    for (size_t i = 0; i < kf.size(); ++i) {
      kb[i] = models::float_to_bf16(kf[i]);
      vb[i] = models::float_to_bf16(vf[i]);
    }
    p.kc = upload(kb);
    p.vc = upload(vb);
  }
  Rng rng{seed ^ 0x5151};
  Bf16Weight sinks = random_bf16(rng, {d.heads}, 2.0f);
  p.sinks_t = std::move(sinks.t);
  p.sinks = upload(sinks.bits);
  return p;
}

/// A step: sequence `seq` contributes its positions ctx .. ctx + tokens - 1.
struct Part {
  int seq, ctx, tokens;
};

/// A step's inputs on the device, and what ir::ref needs for it.
struct StepBufs {
  int tokens = 0, max_pos = 0;
  Tensor q, k, v, pos, tseq, lens;
  std::unique_ptr<DevBuf> dq, dk, dv, dpos, dtseq, dlens, drows, out;
};

StepBufs make_step(const AttentionDims& d, const Pool& pool, const std::vector<Seq>& seqs,
                   const std::vector<Part>& parts) {
  StepBufs s;
  std::vector<float> q, k, v;
  std::vector<int32_t> pos, tseq, lens(seqs.size(), 0);
  const size_t hq = size_t(d.heads) * d.head_dim, hk = size_t(d.kv_heads) * d.head_dim;
  for (const Part& p : parts) {
    const Seq& sq = seqs[size_t(p.seq)];
    REQUIRE(p.ctx + p.tokens <= sq.n);
    lens[size_t(p.seq)] = p.ctx;
    for (int i = 0; i < p.tokens; ++i) {
      const size_t j = size_t(p.ctx + i);
      q.insert(q.end(), sq.q.f.begin() + std::ptrdiff_t(j * hq), sq.q.f.begin() + std::ptrdiff_t((j + 1) * hq));
      k.insert(k.end(), sq.k.f.begin() + std::ptrdiff_t(j * hk), sq.k.f.begin() + std::ptrdiff_t((j + 1) * hk));
      v.insert(v.end(), sq.v.f.begin() + std::ptrdiff_t(j * hk), sq.v.f.begin() + std::ptrdiff_t((j + 1) * hk));
      pos.push_back(int32_t(j));
      tseq.push_back(p.seq);
      s.max_pos = std::max(s.max_pos, int(j));
    }
  }
  s.tokens = int(pos.size());
  const int64_t t = s.tokens;
  s.q = Tensor::zeros(DType::F32, {t, d.heads, d.head_dim});
  s.q.f = q;
  s.k = Tensor::zeros(DType::F32, {t, d.kv_heads, d.head_dim});
  s.k.f = k;
  s.v = Tensor::zeros(DType::F32, {t, d.kv_heads, d.head_dim});
  s.v.f = v;
  s.pos = Tensor::from_ints({t}, pos);
  s.tseq = Tensor::from_ints({t}, tseq);
  s.lens = Tensor::from_ints({int64_t(seqs.size())}, lens);
  s.dq = upload(q), s.dk = upload(k), s.dv = upload(v);
  s.dpos = upload(pos), s.dtseq = upload(tseq), s.dlens = upload(lens);
  s.drows = upload(pool.pt.rows);
  s.out = poisoned(size_t(t) * hq);
  return s;
}

/// attention_prefill_mma over the step.
std::vector<float> run_prefill(const AttentionDims& d, const Pool& pool, StepBufs& s) {
  const Loaded& l = load(emit_attention_prefill_mma(d, {}));
  launch(l, s.tokens, 1, s.dq->p, s.dk->p, s.dv->p, pool.kc->p, pool.vc->p, pool.sinks->p,
         s.dpos->p, s.dtseq->p, s.dlens->p, s.drows->p, s.out->p, s.tokens);
  device_sync();
  return download(*s.out, size_t(s.tokens) * d.heads * d.head_dim);
}

/// attention_decode_mma over the step in `splits` key splits (1: every chunk in the token's
/// block; else one chunk a block, folded by attention_combine_chunks).
std::vector<float> run_decode(const AttentionDims& d, const Pool& pool, StepBufs& s, int splits) {
  const Loaded& dec = load(emit_attention_decode_mma(d, {}));
  const size_t states = size_t(s.tokens) * d.heads * size_t(splits);
  auto ml = poisoned(states * 2), po = poisoned(states * size_t(d.head_dim));
  launch(dec, s.tokens, splits, s.dq->p, s.dk->p, s.dv->p, pool.kc->p, pool.vc->p,
         pool.sinks->p, s.dpos->p, s.dtseq->p, s.dlens->p, s.drows->p, s.out->p, ml->p, po->p);
  if (splits > 1) {
    const Loaded& comb = load(emit_attention_combine_chunks(d, {}));
    launch(comb, s.tokens, 1, ml->p, po->p, pool.sinks->p, splits, s.out->p);
  }
  device_sync();
  return download(*s.out, size_t(s.tokens) * d.heads * d.head_dim);
}

/// The splits a token at position max_pos may need: every chunk its keys can span.
int all_chunks(const AttentionDims& d, int max_pos) {
  return runtime::attention_chunk_splits(max_pos + 1, d.window, 1, 1, d.chunk);
}

/// ir::ref on the step's inputs rounded to fp16 as the kernels round them.
Tensor reference(const AttentionDims& d, const Pool& pool, const std::vector<Seq>& seqs,
                 const StepBufs& s) {
  const size_t slot = size_t(d.kv_heads) * d.head_dim;
  Tensor kc = Tensor::zeros(DType::F32, {pool.pt.blocks, d.block, d.kv_heads, d.head_dim});
  Tensor vc = kc;
  for (size_t b = 0; b < seqs.size(); ++b)
    for (int j = 0; j < seqs[b].n; ++j) {
      const size_t at =
          (size_t(pool.pt.rows[b * size_t(d.table) + size_t(j / d.block)]) * d.block + j % d.block) *
          slot;
      std::copy_n(seqs[b].k.f.begin() + std::ptrdiff_t(j * slot), slot, kc.f.begin() + std::ptrdiff_t(at));
      std::copy_n(seqs[b].v.f.begin() + std::ptrdiff_t(j * slot), slot, vc.f.begin() + std::ptrdiff_t(at));
    }
  const float sc = float(d.scale);
  REQUIRE(std::exp2(std::round(std::log2(sc))) == sc); // dividing the scale back is exact
  return ir::ref::attention(rounded_f16(s.q, sc), rounded_f16(s.k), rounded_f16(s.v),
                            rounded_f16(kc), rounded_f16(vc), pool.sinks_t,
                            {s.pos, s.tseq, s.lens, pool.pt.tensor()}, d.window, d.scale);
}

/// Rows of `got` (a step's output) for sequence `seq`'s positions, by position.
struct Rows {
  std::vector<std::vector<float>> by_pos;
  explicit Rows(int n) : by_pos(size_t(n)) {}
};

void collect(const AttentionDims& d, const StepBufs& s, const std::vector<float>& got, int seq,
             Rows& rows) {
  const size_t hq = size_t(d.heads) * d.head_dim;
  for (int t = 0; t < s.tokens; ++t)
    if (s.tseq.i[size_t(t)] == seq)
      rows.by_pos[size_t(s.pos.i[size_t(t)])].assign(got.begin() + std::ptrdiff_t(t * hq),
                                                     got.begin() + std::ptrdiff_t((t + 1) * hq));
}

/// How many of `want`'s rows (positions lo..) differ from `got`'s in any bit, and the first.
int differing(const Rows& want, const Rows& got, int lo, int& first) {
  int n = 0;
  first = -1;
  for (size_t p = size_t(lo); p < want.by_pos.size(); ++p) {
    if (got.by_pos[p].empty())
      continue;
    REQUIRE(want.by_pos[p].size() == got.by_pos[p].size());
    if (std::memcmp(want.by_pos[p].data(), got.by_pos[p].data(), want.by_pos[p].size() * 4)) {
      if (first < 0)
        first = int(p);
      ++n;
    }
  }
  return n;
}

std::vector<AttentionDims> shapes(int chunk) {
  std::vector<AttentionDims> out;
  for (bool f32 : {false, true})
    for (int window : {0, 8, 128}) {
      const bool tiny = window == 8;
      AttentionDims d = tiny ? AttentionDims{4, 2, 16, 16, 320, 8, 0.25, f32}
                             : AttentionDims{64, 8, 64, 16, 320, window, 0.125, f32};
      d.chunk = chunk;
      out.push_back(d);
    }
  return out;
}

std::string name(const AttentionDims& d) {
  return fmt::format("h{} g{} d{} window {} chunk {} {} cache", d.heads, d.kv_heads, d.head_dim,
                     d.window, d.chunk, d.f32_cache ? "fp32" : "bf16");
}

/// The invariance check for one shape: a prompt of n positions (and two other sequences).
void check_order(const AttentionDims& d, int n, uint64_t seed) {
  Rng rng{seed};
  std::vector<Seq> seqs = {make_seq(d, n, rng), make_seq(d, 300, rng), make_seq(d, 90, rng)};
  const Pool pool = make_pool(d, seqs, seed);
  INFO(name(d) << ", " << n << " positions");

  // The reference: the whole prompt in one step of the prompt kernel, itself against ir::ref.
  Rows whole(n);
  {
    StepBufs s = make_step(d, pool, seqs, {{0, 0, n}});
    const std::vector<float> got = run_prefill(d, pool, s);
    if (n <= 1000) { // ir::ref sums in double on one core: minutes past a few thousand keys
      const double err = rel_l2(got, reference(d, pool, seqs, s).f);
      MESSAGE(name(d) << ": prompt kernel, " << n << " tokens: rel L2 " << err
                      << " to ir::ref on fp16-rounded inputs");
      CHECK(err <= kRoundedTol);
    }
    collect(d, s, got, 0, whole);
  }
  int first = -1;
  // The prompt in pieces, alone and among other sequences' tokens.
  for (int piece : {64, 200}) {
    Rows rows(n), mixed(n);
    for (int at = 0; at < n; at += piece) {
      const int len = std::min(piece, n - at);
      StepBufs s = make_step(d, pool, seqs, {{0, at, len}});
      collect(d, s, run_prefill(d, pool, s), 0, rows);
      StepBufs m = make_step(d, pool, seqs, {{1, 17, 40}, {0, at, len}, {2, 89, 1}});
      collect(d, m, run_prefill(d, pool, m), 0, mixed);
    }
    CHECK_MESSAGE(differing(whole, rows, 0, first) == 0,
                  "prompt in pieces of " << piece << ": first differing position " << first);
    CHECK_MESSAGE(differing(whole, mixed, 0, first) == 0, "prompt in pieces of "
                                                              << piece << " among others: first "
                                                              << first);
  }
  // Decode steps: the last 24 positions and a few early ones, one token a step, alone and
  // beside another sequence's decode token; every chunk in one block and one a block.
  std::vector<int> positions;
  for (int p : {0, 1, 63, 64, 127, 128, 129, 255, 256})
    if (p < n)
      positions.push_back(p);
  for (int p = std::max(0, n - 24); p < n; ++p)
    positions.push_back(p);
  for (int splits_mode : {0, 1}) {
    Rows alone(n), beside(n);
    for (int p : positions) {
      const int z = splits_mode ? all_chunks(d, p) : 1;
      StepBufs s = make_step(d, pool, seqs, {{0, p, 1}});
      collect(d, s, run_decode(d, pool, s, z), 0, alone);
      StepBufs b = make_step(d, pool, seqs, {{1, 250, 1}, {0, p, 1}});
      const int zb = splits_mode ? all_chunks(d, std::max(p, 250)) : 1;
      collect(d, b, run_decode(d, pool, b, zb), 0, beside);
    }
    CHECK_MESSAGE(differing(whole, alone, 0, first) == 0,
                  "decode, " << (splits_mode ? "a block a chunk" : "one block")
                             << ": first differing position " << first);
    CHECK_MESSAGE(differing(whole, beside, 0, first) == 0,
                  "decode beside another sequence, "
                      << (splits_mode ? "a block a chunk" : "one block") << ": first " << first);
  }
  // The decode kernel with fewer warps a block (each computes the block's scores and takes a
  // share of the output dims): the same bits, one block a token and one a chunk. On the sliding
  // fp32-cache shapes only (the warps do not touch the cache or window paths; each variant is
  // another compile in this binary's longest shard).
  for (int warps : {1, 2}) {
    if ((d.head_dim / 16) % warps != 0 || !d.f32_cache || d.window != 128)
      continue;
    AttentionDims dw = d;
    dw.decode_warps = warps;
    Rows rows(n), split(n);
    for (int p : positions) {
      StepBufs b = make_step(dw, pool, seqs, {{1, 250, 1}, {0, p, 1}});
      collect(dw, b, run_decode(dw, pool, b, 1), 0, rows);
      StepBufs c = make_step(dw, pool, seqs, {{0, p, 1}});
      collect(dw, c, run_decode(dw, pool, c, all_chunks(dw, p)), 0, split);
    }
    CHECK_MESSAGE(differing(whole, rows, 0, first) == 0,
                  "decode in " << warps << " warps a block: first differing position " << first);
    CHECK_MESSAGE(differing(whole, split, 0, first) == 0,
                  "decode in " << warps << " warps, a block a chunk: first " << first);
  }
  // The decode kernel on steps of several tokens of the prompt (steps of up to 64 tokens run
  // it), against ir::ref too.
  {
    Rows rows(n);
    for (int at = 0; at < n; at += 48) {
      const int len = std::min(48, n - at);
      StepBufs s = make_step(d, pool, seqs, {{2, 30, 5}, {0, at, len}});
      const std::vector<float> got = run_decode(d, pool, s, all_chunks(d, s.max_pos));
      if (n <= 1000 && (at == 0 || at + 48 >= n)) {
        const double err = rel_l2(got, reference(d, pool, seqs, s).f);
        CHECK_MESSAGE(err <= kRoundedTol, "decode kernel on a 48-token step at " << at
                                                                                 << ": rel L2 "
                                                                                 << err);
      }
      collect(d, s, got, 0, rows);
    }
    CHECK_MESSAGE(differing(whole, rows, 0, first) == 0,
                  "decode kernel in 48-token steps: first differing position " << first);
  }
}

} // namespace

TEST_CASE("canonical attention: a query's output is the same bits in every kernel and step") {
  XSERV_REQUIRE_GPU();
  uint64_t seed = 4000;
  for (const AttentionDims& d : shapes(128))
    check_order(d, 700, ++seed);
}

TEST_CASE("canonical attention: chunks of 64 keys, and positions past 4,096") {
  XSERV_REQUIRE_GPU();
  uint64_t seed = 4100;
  for (const AttentionDims& d : shapes(64))
    check_order(d, 300, ++seed);
  AttentionDims d{64, 8, 64, 16, 320, 0, 0.125, false};
  d.chunk = 128;
  check_order(d, 4300, ++seed);
  d.window = 128;
  d.f32_cache = true;
  check_order(d, 4300, ++seed);
}
