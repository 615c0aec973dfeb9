// Decode attention on the GPU by key splits and warps a block, the 20b's heads over a paged fp32
// cache: median of 20 timed launches after 3 warm-ups, by CUDA events. Part of kernels_bench,
// never run by ctest (docs/PERF.md keeps the figures).
#include "tests/codegen/kernel_test_util.h"

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <vector>

using namespace xserv;
using namespace xserv::codegen;
using namespace xserv::kernel_test;

namespace {

/// A decode step's attention inputs: `seqs` sequences of one token each at `ctx` cached
/// positions in a zeroed paged fp32 cache of `table` consecutive blocks of 16 each, the 20b's
/// heads (random q, k, v and sinks), and the out buffer.
struct DecodeInputs {
  DevBuf kc, vc;
  std::unique_ptr<DevBuf> q, k, v, sinks, pos, tseq, lens, rows, out;
  DecodeInputs(const AttentionDims& d, int seqs, int ctx, uint64_t seed)
      : kc(size_t(seqs) * d.table * 16 * d.kv_heads * d.head_dim * 4), vc(kc.bytes) {
    cuda_ok(cudaMemset(kc.p, 0, kc.bytes), "memset");
    cuda_ok(cudaMemset(vc.p, 0, vc.bytes), "memset");
    Rng rng{seed};
    q = upload(random_f32(rng, {seqs, d.heads, d.head_dim}, 1.0f).f);
    k = upload(random_f32(rng, {seqs, d.kv_heads, d.head_dim}, 1.0f).f);
    v = upload(random_f32(rng, {seqs, d.kv_heads, d.head_dim}, 1.0f).f);
    sinks = upload(random_bf16(rng, {d.heads}, 1.0f).bits);
    std::vector<int32_t> p(seqs, ctx), ts(seqs), ls(seqs, ctx), rs(size_t(seqs) * d.table);
    for (int b = 0; b < seqs; ++b) {
      ts[b] = b;
      for (int i = 0; i < d.table; ++i)
        rs[size_t(b) * d.table + i] = b * d.table + i;
    }
    pos = upload(p), tseq = upload(ts), lens = upload(ls), rows = upload(rs);
    out = poisoned(size_t(seqs) * d.heads * d.head_dim);
  }
};

/// attention_decode (+ attention_combine when split) for `seqs` one-token sequences at `ctx`
/// cached positions, the 20b's heads, a paged fp32 cache of `slots` positions a sequence in
/// consecutive blocks of 16 (window: the sliding layers'), under `splits` key splits.
void attention_time(int seqs, int ctx, int slots, int window, int splits) {
  const AttentionDims d{64, 8, 64, 16, (slots + 15) / 16, window, 0.125, true};
  const Loaded& dec = load(emit_attention_decode(d, {}));
  const Loaded& comb = load(emit_attention_combine(d, {}));
  DecodeInputs in(d, seqs, ctx, 950);
  const size_t th = size_t(seqs) * d.heads * splits;
  auto part_ml = poisoned(th * 2), part_o = poisoned(th * d.head_dim);
  const double ms = median_ms([&](int) {
    launch(dec, seqs, splits, in.q->p, in.k->p, in.v->p, in.kc.p, in.vc.p, in.sinks->p, in.pos->p,
           in.tseq->p, in.lens->p, in.rows->p, in.out->p, part_ml->p, part_o->p);
    if (splits > 1)
      launch(comb, seqs, 1, part_ml->p, part_o->p, in.sinks->p, splits, in.out->p);
  });
  device_sync();
  const int keys = window ? std::min(ctx, window) : ctx;
  const double bytes = double(seqs) * keys * d.kv_heads * d.head_dim * 2 * 4;
  MESSAGE(fmt::format("attention decode B={} ctx {} {}: {} splits ({} blocks) {:.1f} us, {:.0f} "
                      "GB/s of cache",
                      seqs, ctx, window ? "sliding 128" : "full", splits,
                      seqs * d.kv_heads * splits, ms * 1e3, bytes / (ms * 1e-3) / 1e9));
}

/// attention_decode_mma (the plans' kernel, canonical order) for `seqs` one-token sequences at
/// `ctx` cached positions, every chunk of a token in its block (the lowering's choice above 64
/// tokens), the 20b's heads, a paged fp32 cache; `warps` a block (0: the lowering's).
void attention_mma_time(int seqs, int ctx, int window, int warps) {
  AttentionDims d{64, 8, 64, 16, (ctx + 16) / 16, window, 0.125, true};
  d.chunk = 128;
  d.decode_warps = warps;
  const Loaded& dec = load(emit_attention_decode_mma(d, {}));
  DecodeInputs in(d, seqs, ctx, 951);
  auto part_ml = poisoned(2), part_o = poisoned(d.head_dim);
  const double ms = median_ms([&](int) {
    launch(dec, seqs, 1, in.q->p, in.k->p, in.v->p, in.kc.p, in.vc.p, in.sinks->p, in.pos->p,
           in.tseq->p, in.lens->p, in.rows->p, in.out->p, part_ml->p, part_o->p);
  });
  device_sync();
  const int keys = window ? std::min(ctx + 1, window) : ctx + 1;
  const double bytes = double(seqs) * keys * d.kv_heads * d.head_dim * 2 * 4;
  MESSAGE(fmt::format("attention_decode_mma B={} ctx {} {}: {} warps a block, {:.1f} us, {:.0f} "
                      "GB/s of cache",
                      seqs, ctx, window ? "sliding 128" : "full", warps ? warps : 4, ms * 1e3,
                      bytes / (ms * 1e-3) / 1e9));
}

} // namespace

TEST_CASE("attention_decode_mma at batched-decode sizes by warps a block, 20b heads, fp32 cache "
          "(informational)") {
  XSERV_REQUIRE_GPU();
  for (int seqs : {1, 64, 128, 256})
    for (int window : {0, 128})
      for (int warps : {0, 2, 1})
        attention_mma_time(seqs, 512, window, warps);
}

TEST_CASE("attention decode under key splits, 20b heads, fp32 cache (informational)") {
  XSERV_REQUIRE_GPU();
  for (int seqs : {1, 8, 16, 32, 64})
    for (int ctx : {640, 4096})
      for (int splits : {1, 2, 4, 8, 16, 32})
        attention_time(seqs, ctx, 8192, 0, splits);
  for (int seqs : {1, 16, 64})
    for (int splits : {1, 2})
      attention_time(seqs, 640, 128, 128, splits);
}
