// GPU checks of the prompt attention kernel (codegen/kernels/attention_mma.cuh:
// attention_prefill_mma, tensor cores) against ir::ref::attention on random inputs, plus its
// times next to the decode kernel's on a 20b-shaped prompt step (informational).
//
// Plain operands: the kernel rounds q * scale, k and v to fp16 (relative error <= 2^-12 each,
// ~1.4e-4 rms for uniform rounding), weighs with p as an fp16 pair (~22 bits) and sums in fp32.
// Two bounds:
// - against ref on the same inputs rounded to fp16 as the kernel rounds them (kMmaRoundedTol =
//   1e-5): what is left is fp32 summation (~1e-7 per operation, growing like the square root of
//   the terms: 64 products per score, <= 1300 keys per row, about 1e-6 at most) and the pair's
//   2^-22, while a wrong mask, key, slot or fragment (errors of 1e-2 and up) fails;
// - against ref on the exact inputs (kMmaExactTol = 2e-3): the inputs' rounding adds ~1.3e-4 to
//   the scores (64 products of |q| <= 2, |k| <= 1 at scale 1/8) and ~1.4e-4 to the values: ~3e-4
//   in all, bounded with a 6x margin. This is the kernel's stated accuracy on these inputs.
// Operand pairs (the split plans: hi + lo for every operand, ~22 significant bits, three
// products a pair) against ref on the exact inputs: kSplitTol = 1e-5, the fp32 summation bound
// above with the pairs' 2^-22, 20x below the plain kernel's distance.
#include "tests/codegen/kernel_test_util.h"

#include "codegen/emit_prefill.h"
#include "ir/reference.h"

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

constexpr double kMmaRoundedTol = 1e-5, kMmaExactTol = 2e-3, kSplitTol = 1e-5;

/// One step's inputs: sequences with `seq_tokens[b]` step tokens after `ctx[b]` cached positions,
/// the caches paged through random non-contiguous block tables (kernel_test::random_tables: a
/// shared first block, a window's unreachable blocks missing); caches random bf16 (or fp32 with
/// d.f32_cache), and with a bf16 cache the step's keys and values bf16 numbers too.
struct Step {
  int tokens = 0, nseq = 0;
  Tensor pos, tseq, lens, rows, q, k, v, sinks_t; // rows: the block tables
  Tensor kc_t, vc_t;                              // the caches as ref sees them
  std::vector<uint16_t> kc_bits, vc_bits, sink_bits;
};

Step make_step(const AttentionDims& d, const std::vector<int>& seq_tokens,
               const std::vector<int>& ctx, uint64_t seed) {
  Rng rng{seed};
  Step s;
  s.nseq = int(seq_tokens.size());
  std::vector<int32_t> positions, token_seq, ctx_lens(ctx.begin(), ctx.end());
  std::vector<int> lo, hi;
  for (int b = 0; b < s.nseq; ++b) {
    lo.push_back(d.window ? std::max(0, ctx[b] - d.window + 1) : 0);
    hi.push_back(ctx[b]);
    for (int i = 0; i < seq_tokens[b]; ++i) {
      positions.push_back(ctx[b] + i);
      token_seq.push_back(b);
    }
  }
  s.tokens = int(positions.size());
  s.pos = Tensor::from_ints({s.tokens}, positions);
  s.tseq = Tensor::from_ints({s.tokens}, token_seq);
  s.lens = Tensor::from_ints({s.nseq}, ctx_lens);
  const PagedTables pt = random_tables(seed, d.block, d.table, lo, hi, 1);
  s.rows = pt.tensor();
  s.q = random_f32(rng, {s.tokens, d.heads, d.head_dim}, 2.0f);
  s.k = random_f32(rng, {s.tokens, d.kv_heads, d.head_dim}, 1.0f);
  s.v = random_f32(rng, {s.tokens, d.kv_heads, d.head_dim}, 1.0f);
  if (!d.f32_cache) // the kernels read the step's own keys as a bf16 cache will hold them
    for (Tensor* t : {&s.k, &s.v})
      for (float& x : t->f)
        x = models::bf16_to_float(models::float_to_bf16(x));
  const std::vector<int64_t> cache_shape = {pt.blocks, d.block, d.kv_heads, d.head_dim};
  if (d.f32_cache) {
    s.kc_t = random_f32(rng, cache_shape, 1.0f);
    s.vc_t = random_f32(rng, cache_shape, 1.0f);
  } else {
    Bf16Weight kc = random_bf16(rng, cache_shape, 1.0f), vc = random_bf16(rng, cache_shape, 1.0f);
    s.kc_t = std::move(kc.t);
    s.vc_t = std::move(vc.t);
    s.kc_bits = std::move(kc.bits);
    s.vc_bits = std::move(vc.bits);
  }
  Bf16Weight sinks = random_bf16(rng, {d.heads}, 2.0f);
  s.sinks_t = std::move(sinks.t);
  s.sink_bits = std::move(sinks.bits);
  return s;
}

/// The step's buffers on the device; out poisoned with NaN.
struct DevStep {
  std::unique_ptr<DevBuf> q, k, v, kc, vc, sinks, pos, tseq, lens, rows, out;
  DevStep(const AttentionDims& d, const Step& s) {
    q = upload(s.q), k = upload(s.k), v = upload(s.v);
    kc = d.f32_cache ? upload(s.kc_t.f) : upload(s.kc_bits);
    vc = d.f32_cache ? upload(s.vc_t.f) : upload(s.vc_bits);
    sinks = upload(s.sink_bits), pos = upload(s.pos), tseq = upload(s.tseq);
    lens = upload(s.lens), rows = upload(s.rows);
    out = poisoned(size_t(s.tokens) * d.heads * d.head_dim);
  }
};

void launch_prefill(const Loaded& l, const DevStep& b, int tokens) {
  launch(l, tokens, 1, b.q->p, b.k->p, b.v->p, b.kc->p, b.vc->p, b.sinks->p, b.pos->p, b.tseq->p,
         b.lens->p, b.rows->p, b.out->p, tokens);
}

std::string layout(const std::vector<int>& seq_tokens, const std::vector<int>& ctx) {
  std::string s;
  for (size_t b = 0; b < seq_tokens.size(); ++b)
    s += (b ? " + " : "") + std::to_string(seq_tokens[b]) + "@" + std::to_string(ctx[b]);
  return s;
}

/// The tensor-core kernel against ref on fp16-rounded and on exact inputs (the bounds above).
void check_prefill_mma(const AttentionDims& d, const std::vector<int>& seq_tokens,
                       const std::vector<int>& ctx, uint64_t seed) {
  const Step s = make_step(d, seq_tokens, ctx, seed);
  const ir::ref::Batch seqs{s.pos, s.tseq, s.lens, s.rows};
  const Tensor exact =
      ir::ref::attention(s.q, s.k, s.v, s.kc_t, s.vc_t, s.sinks_t, seqs, d.window, d.scale);
  // q is rounded after the scale (a power of two here, so dividing it back is exact).
  const float sc = float(d.scale);
  REQUIRE(std::exp2(std::round(std::log2(sc))) == sc);
  const Tensor rounded = ir::ref::attention(
      rounded_f16(s.q, sc), rounded_f16(s.k), rounded_f16(s.v), rounded_f16(s.kc_t),
      rounded_f16(s.vc_t), s.sinks_t, seqs, d.window, d.scale);
  const Loaded& l = load(emit_attention_prefill_mma(d, {}));
  DevStep b(d, s);
  launch_prefill(l, b, s.tokens);
  device_sync();
  const std::vector<float> got = download(*b.out, exact.f.size());
  const double err_r = rel_l2(got, rounded.f), err_x = rel_l2(got, exact.f);
  MESSAGE(l.src.name << " tokens@ctx " << layout(seq_tokens, ctx) << ": rel L2 " << err_r
                     << " to fp16-rounded inputs, " << err_x << " to exact");
  CHECK(err_r <= kMmaRoundedTol);
  CHECK(err_x <= kMmaExactTol);
}

/// The kernel with operand pairs against ref on the exact inputs.
void check_prefill_split(AttentionDims d, const std::vector<int>& seq_tokens,
                         const std::vector<int>& ctx, uint64_t seed) {
  d.split = true;
  const Step s = make_step(d, seq_tokens, ctx, seed);
  const Tensor want = ir::ref::attention(s.q, s.k, s.v, s.kc_t, s.vc_t, s.sinks_t,
                                         {s.pos, s.tseq, s.lens, s.rows}, d.window, d.scale);
  const Loaded& l = load(emit_attention_prefill_mma(d, {}));
  DevStep b(d, s);
  launch_prefill(l, b, s.tokens);
  device_sync();
  const double err = rel_l2(download(*b.out, want.f.size()), want.f);
  MESSAGE(l.src.name << " tokens@ctx " << layout(seq_tokens, ctx) << ": rel L2 " << err);
  CHECK(err <= kSplitTol);
}

/// The tiny and 20b shapes, full and sliding, bf16 and fp32 caches, paged in blocks of 16
/// (tables of 320 entries: positions past 5000).
std::vector<AttentionDims> shapes() {
  std::vector<AttentionDims> out;
  for (bool f32 : {false, true}) {
    out.push_back({4, 2, 16, 16, 320, 0, 0.25, f32});     // tiny, full
    out.push_back({4, 2, 16, 16, 320, 8, 0.25, f32});     // tiny, window of 8
    out.push_back({64, 8, 64, 16, 320, 0, 0.125, f32});   // 20b, full
    out.push_back({64, 8, 64, 16, 320, 128, 0.125, f32}); // 20b, window of 128
  }
  for (AttentionDims& d : out)
    d.chunk = 128; // the tensor-core kernel's key chunks (the SIMT one has none)
  return out;
}

} // namespace

TEST_CASE("prompt attention with operand pairs matches ir::ref to fp32 grade") {
  XSERV_REQUIRE_GPU();
  uint64_t seed = 500;
  for (const AttentionDims& d : shapes()) {
    for (int t : {1, 37, 300})
      check_prefill_split(d, {t}, {0}, ++seed);
    // ctx 200 and 1000: the rings of 8 and 128 have wrapped; the chunk is longer than the ring.
    for (int ctx : {200, 1000})
      check_prefill_split(d, {300}, {ctx}, ++seed);
    // Boundaries at tokens 5, 45, 48: inside 16-token (20b) and 64-token (tiny) query tiles.
    check_prefill_split(d, {5, 40, 3, 100}, {0, 130, 7, 1000}, ++seed);
    check_prefill_split(d, {1, 1, 17, 1, 33}, {5, 0, 250, 9, 127}, ++seed); // decode-like
  }
}

TEST_CASE("tensor-core prefill attention matches ir::ref within fp16 rounding") {
  XSERV_REQUIRE_GPU();
  uint64_t seed = 900;
  for (const AttentionDims& d : shapes()) {
    for (int t : {1, 37, 300})
      check_prefill_mma(d, {t}, {0}, ++seed);
    for (int ctx : {200, 1000})
      check_prefill_mma(d, {300}, {ctx}, ++seed);
    check_prefill_mma(d, {5, 40, 3, 100}, {0, 130, 7, 1000}, ++seed);
    check_prefill_mma(d, {5, 40, 3, 100}, {300, 0, 1, 64}, ++seed);
    check_prefill_mma(d, {1, 1, 17, 1, 33}, {5, 0, 250, 9, 127}, ++seed);
  }
}

// ---- time (informational; no assertions on speed) ----------------------------------------------

TEST_CASE("prompt attention time on a 20b-shaped step (informational)") {
  XSERV_REQUIRE_GPU();
  for (AttentionDims d : {AttentionDims{64, 8, 64, 16, 256, 0, 0.125, true},
                          AttentionDims{64, 8, 64, 16, 256, 128, 0.125, true}}) {
    d.chunk = 128;
    for (int tokens : {1024, 2048}) {
      const Step s = make_step(d, {tokens}, {0}, 800);
      DevStep b(d, s);
      const size_t n = size_t(tokens) * d.heads * d.head_dim;
      const Loaded& mma = load(emit_attention_prefill_mma(d, {}));
      const double t_mma = median_ms([&](int) { launch_prefill(mma, b, tokens); });
      const std::vector<float> got = download(*b.out, n);
      AttentionDims ds = d;
      ds.split = true;
      const Loaded& pairs = load(emit_attention_prefill_mma(ds, {}));
      const double t_pairs = median_ms([&](int) { launch_prefill(pairs, b, tokens); });
      const double err_pairs = rel_l2(download(*b.out, n), got);
      // The decode kernel on the same step (one block a token and kv head, every chunk): the
      // canonical order makes it the same bits as the prompt kernel.
      const Loaded& dec = load(emit_attention_decode_mma(d, {}));
      const double t_dec = median_ms([&](int) {
        launch(dec, tokens, 1, b.q->p, b.k->p, b.v->p, b.kc->p, b.vc->p, b.sinks->p, b.pos->p,
               b.tseq->p, b.lens->p, b.rows->p, b.out->p, nullptr, nullptr);
      });
      const std::vector<float> got_dec = download(*b.out, n);
      MESSAGE("time " << mma.src.name << " T=" << tokens << ": " << t_mma * 1e3
                      << " us; operand pairs " << t_pairs * 1e3 << " us (rel L2 " << err_pairs
                      << " apart); the decode kernel on the step " << t_dec * 1e3 << " us");
      CHECK(err_pairs <= kMmaExactTol);
      CHECK(std::memcmp(got.data(), got_dec.data(), n * sizeof(float)) == 0);
    }
  }
}
