// GPU checks of the small per-token kernels (embedding, rms_norm, select_rows, argmax, rope_yarn,
// kv_write, qkv_decode, the router and its fused norm + top-k) against ir::ref on random inputs.
#include "tests/codegen/kernel_test_util.h"

#include "ir/reference.h"

#include <tuple>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
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

} // namespace

// ---- small per-row kernels: embedding, rms_norm, select_rows, rope_yarn, kv_write, top-k -------

TEST_CASE("argmax kernel picks the largest logit, ties to the lower id, marks non-finite rows") {
  XSERV_REQUIRE_GPU();
  Rng rng{800};
  // 201088: the 20b vocabulary (float4 loads, 25 chunks); 20000: chunks that end mid-row;
  // 1001: not a multiple of 4 (scalar loads).
  for (const int vocab : {201088, 20000, 1001}) {
    const int rows = 7, chunks = argmax_chunks(vocab);
    Tensor x = random_f32(rng, {rows, vocab}, 4.0f);
    auto at = [&](int r, int i) -> float& { return x.f[size_t(r) * vocab + i]; };
    at(0, vocab - 1) = 9.0f; // the last id
    at(1, 3) = 9.0f;         // a tie across chunks: the lower id wins
    at(1, vocab - 2) = 9.0f;
    at(2, 0) = std::numeric_limits<float>::quiet_NaN(); // a NaN marks the row
    at(2, vocab / 2) = std::numeric_limits<float>::quiet_NaN();
    at(2, vocab / 3) = 5.0f;
    at(6, vocab - 3) = -std::numeric_limits<float>::infinity(); // so does an infinity
    for (int i = 0; i < vocab; ++i) // all negative, the maximum is -0 at two places
      at(3, i) = -1.0f - float(i % 7);
    at(3, vocab / 4) = -0.0f;
    at(3, vocab / 4 + 1) = 0.0f;
    for (int i = 0; i < vocab; ++i) // one value everywhere: id 0
      at(4, i) = -2.5f;
    std::vector<int32_t> want(rows);
    for (int r = 0; r < rows; ++r) {
      int best = -1;
      bool finite = true;
      for (int i = 0; i < vocab; ++i) {
        finite = finite && std::isfinite(at(r, i));
        if (best < 0 || at(r, i) > at(r, best))
          best = i;
      }
      want[size_t(r)] = finite ? best : kArgmaxNonFinite;
    }
    CHECK(want[2] == kArgmaxNonFinite);
    CHECK(want[6] == kArgmaxNonFinite);
    const Loaded& k = load(emit_argmax(vocab, {}));
    auto dx = upload(x);
    DevBuf keys(size_t(rows) * chunks * sizeof(uint64_t));
    cuda_ok(cudaMemset(keys.p, 0xfe, keys.bytes), "poison"); // every key must be written
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

TEST_CASE("masked argmax kernel picks the best allowed id of the masked rows and leaves the rest") {
  XSERV_REQUIRE_GPU();
  Rng rng{801};
  for (const int vocab : {201088, 20000, 1001}) {
    CAPTURE(vocab);
    const int rows = 6, chunks = argmax_chunks(vocab), words = mask_words(vocab);
    Tensor x = random_f32(rng, {rows, vocab}, 4.0f);
    auto at = [&](int r, int i) -> float& { return x.f[size_t(r) * vocab + i]; };
    // Masked rows 4, 0, 2, 5 (in that order): a sparse random mask (~1 id in 64); only the
    // last id; nothing allowed; a sparse mask over a row with a NaN at a forbidden id.
    const std::vector<int32_t> masked_rows = {4, 0, 2, 5};
    std::vector<uint32_t> masks(masked_rows.size() * size_t(words), 0u);
    auto allow = [&](size_t m, int id) { masks[m * words + size_t(id / 32)] |= 1u << (id % 32); };
    for (size_t m : {size_t(0), size_t(3)})
      for (int i = 0; i < vocab; ++i)
        if (rng.next(1.0f) > 0.97f)
          allow(m, i);
    allow(0, 7);
    allow(3, 7);
    allow(1, vocab - 1);
    at(0, 3) = 50.0f; // the row's best is forbidden: the pick must not take it
    at(5, 11) = std::numeric_limits<float>::quiet_NaN();
    std::vector<int32_t> want(rows);
    for (int r = 0; r < rows; ++r) { // the unmasked rows' plain argmax (rows 1 and 3)
      const auto row = x.f.begin() + std::ptrdiff_t(r) * vocab;
      want[size_t(r)] = int32_t(std::max_element(row, row + vocab) - row);
    }
    for (size_t m = 0; m < masked_rows.size(); ++m) {
      const int r = masked_rows[m];
      const std::span<const float> row(x.f.data() + size_t(r) * vocab, size_t(vocab));
      const std::span<const uint32_t> mask(masks.data() + m * words, size_t(words));
      int32_t best = -1;
      for (int i = 0; i < vocab; ++i)
        if ((mask[size_t(i / 32)] >> (i % 32) & 1u) &&
            (best < 0 || row[size_t(i)] > row[size_t(best)]))
          best = i;
      want[size_t(r)] = r == 5 ? kArgmaxNonFinite : best < 0 ? 0 : best;
    }
    CHECK(want[0] != 3);
    CHECK(want[2] == 0); // nothing allowed: no candidate, the host finds id 0's bit clear
    const Loaded& plain = load(emit_argmax(vocab, {}));
    const Loaded& masked = load(emit_argmax_masked(vocab, {}));
    auto dx = upload(x);
    auto dmasks = upload(masks);
    auto drows = upload(masked_rows);
    DevBuf keys(size_t(rows) * chunks * sizeof(uint64_t));
    cuda_ok(cudaMemset(keys.p, 0xfe, keys.bytes), "poison");
    launch(plain, rows, 1, dx->p, keys.p);
    launch(masked, int(masked_rows.size()), 1, dx->p, dmasks->p, drows->p, keys.p);
    device_sync();
    std::vector<uint64_t> got(size_t(rows) * chunks);
    cuda_ok(cudaMemcpy(got.data(), keys.p, keys.bytes, cudaMemcpyDeviceToHost), "download");
    for (int r = 0; r < rows; ++r) {
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
  // A decode step of 4 sequences (one token each) whose positions (one near the start of a
  // block, one at its end, one far into the cache) lie in random blocks of a paged cache.
  const Tensor pos = Tensor::from_ints({4}, {7, 15, 21, 4000});
  const Tensor seq = Tensor::from_ints({4}, {0, 1, 2, 3});
  const int table = 256;
  for (auto [hq, hk, head_dim, block, f32] :
       {std::tuple{4, 2, 16, 16, false}, std::tuple{4, 2, 16, 16, true},
        std::tuple{64, 8, 64, 16, true}, std::tuple{64, 8, 64, 32, false}}) {
    const int tokens = 4;
    const PagedTables pt = random_tables(uint64_t(block) * 31 + hq, block, table, {7, 15, 21, 4000},
                                         {8, 16, 22, 4001});
    const Tensor crow = pt.tensor();
    const Tensor q = random_f32(rng, {tokens, hq, head_dim}, 2.0f);
    const Tensor k = random_f32(rng, {tokens, hk, head_dim}, 2.0f);
    const Tensor v = random_f32(rng, {tokens, hk, head_dim}, 2.0f);
    const std::vector<double> inv = ir::ref::yarn_inv_freq(yarn, head_dim);
    const size_t cache_n = size_t(pt.blocks) * block * hk * head_dim;
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
    const Loaded& kvw = load(emit_kv_write({hk, head_dim, block, table, 0, f32}, {}));
    launch(kvw, tokens, 1, rkc->p, rk->p, dpos->p, dseq->p, drow->p);
    launch(kvw, tokens, 1, rvc->p, rv->p, dpos->p, dseq->p, drow->p);
    // The fused kernel.
    auto fq = upload(q), fk = upload(k), fv = upload(v);
    auto fkc = upload(init), fvc = upload(init);
    const Loaded& fused = load(emit_rope_yarn_qk_kv(hq, hk, head_dim, att, block, table, f32, {}));
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

TEST_CASE("qkv_rope_decode: qkv_decode then rope_yarn_qk_kv, in one launch, bit for bit") {
  XSERV_REQUIRE_GPU();
  Rng rng{719};
  const ir::ref::Yarn yarn;
  const double att = ir::ref::yarn_attention_factor(yarn);
  // Decode steps of up to 4 sequences (one token each) whose positions lie in random blocks of
  // a paged cache, one far into it.
  const Tensor pos = Tensor::from_ints({4}, {7, 8, 130, 4000});
  const Tensor seq = Tensor::from_ints({4}, {0, 1, 2, 3});
  const int table = 256;
  // (K, q rows, k/v rows, head_dim, block, fp32 cache, most tokens, bf16 activations)
  for (auto [k, nq, nkv, head_dim, block, f32, max_t, round] :
       {std::tuple{64, 64, 32, 16, 16, false, 8, true},
        std::tuple{64, 64, 32, 16, 16, true, 1, false},
        std::tuple{2880, 4096, 512, 64, 16, true, 1, true},
        std::tuple{2880, 4096, 512, 64, 32, false, 8, true}})
    for (int tokens : {1, 3}) {
      if (tokens > max_t)
        continue;
      CAPTURE(k);
      CAPTURE(block);
      CAPTURE(tokens);
      const PagedTables pt =
          random_tables(uint64_t(k) + block, block, table, {7, 8, 130, 4000}, {8, 9, 131, 4001});
      const Tensor crow = pt.tensor();
      QkvDims d;
      d.k = k;
      d.nq = nq;
      d.nk = d.nv = nkv;
      d.max_tokens = max_t;
      d.round_act = round;
      const Tensor x = random_f32(rng, {tokens, k}, 2.0f);
      const Bf16Weight ln = random_bf16(rng, {k}, 1.0f);
      std::vector<std::unique_ptr<DevBuf>> dw, db;
      for (int n : {nq, nkv, nkv}) {
        dw.push_back(upload(random_bf16(rng, {n, k}, 1.0f / std::sqrt(float(k))).bits));
        db.push_back(upload(random_bf16(rng, {n}, 0.5f).bits));
      }
      const std::vector<double> inv = ir::ref::yarn_inv_freq(yarn, head_dim);
      const int hq = nq / head_dim, hk = nkv / head_dim;
      const size_t cache_n = size_t(pt.blocks) * block * hk * head_dim, elem = f32 ? 4 : 2;
      std::vector<uint8_t> init(cache_n * elem);
      for (auto& b : init)
        b = static_cast<uint8_t>(rng.next(1.0f) * 100.0f);
      auto dx = upload(x), dln = upload(ln.bits), dpos = upload(pos), dseq = upload(seq);
      auto drow = upload(crow), dinv = upload(inv);
      auto run = [&](DevBuf& q, DevBuf& kk, DevBuf& vv, DevBuf& kc, DevBuf& vc, bool fused) {
        if (fused) {
          QkvDims r = d;
          r.head_dim = head_dim;
          r.block = block;
          r.table = table;
          r.attention_factor = att;
          r.f32_cache = f32;
          REQUIRE(qkv_decode_fits(r));
          launch(load(emit_qkv_decode(r, {})), tokens, 1, dx->p, dln->p, dw[0]->p, db[0]->p,
                 dw[1]->p, db[1]->p, dw[2]->p, db[2]->p, q.p, kk.p, vv.p, tokens, dpos->p, dseq->p,
                 drow->p, dinv->p, kc.p, vc.p);
          return;
        }
        launch(load(emit_qkv_decode(d, {})), tokens, 1, dx->p, dln->p, dw[0]->p, db[0]->p, dw[1]->p,
               db[1]->p, dw[2]->p, db[2]->p, q.p, kk.p, vv.p, tokens);
        launch(load(emit_rope_yarn_qk_kv(hq, hk, head_dim, att, block, table, f32, {})), tokens, 1,
               q.p, kk.p, vv.p, dpos->p, dseq->p, drow->p, dinv->p, kc.p, vc.p);
      };
      std::vector<std::unique_ptr<DevBuf>> want, got;
      for (auto* set : {&want, &got}) {
        set->push_back(poisoned(size_t(tokens) * nq));
        set->push_back(poisoned(size_t(tokens) * nkv));
        set->push_back(poisoned(size_t(tokens) * nkv));
        set->push_back(upload(init));
        set->push_back(upload(init));
        run(*(*set)[0], *(*set)[1], *(*set)[2], *(*set)[3], *(*set)[4], set == &got);
      }
      device_sync();
      auto bytes = [](const DevBuf& b) {
        std::vector<uint8_t> h(b.bytes);
        cuda_ok(cudaMemcpy(h.data(), b.p, b.bytes, cudaMemcpyDeviceToHost), "download");
        return h;
      };
      for (size_t i = 0; i < 5; ++i) {
        CAPTURE(i); // q, k, v, k cache, v cache
        CHECK(bytes(*got[i]) == bytes(*want[i]));
      }
      CHECK(bytes(*got[3]) != init); // the cache writes happened
      CHECK(bytes(*got[4]) != init);
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
/// cache of blocks of 4, against ir::ref's sequential writes, bit for bit. `ring` 0: random paged
/// tables holding (with a window) only the blocks of each sequence's last `window` positions,
/// the others the null block 0, which stores may reach but nothing reads (left out of the
/// comparison); `ring` > 0: each sequence's table a ring of `ring` blocks of its own (entry i
/// holds block b * ring + i % ring), where a window's earlier tokens must be skipped, not raced.
void check_kv_write(const std::vector<int32_t>& positions, const std::vector<int32_t>& seqs,
                    int window, uint64_t seed, int ring = 0) {
  Rng rng{seed};
  const int block = 4, table = 8, g = 2, d = 16, tokens = int(positions.size());
  std::vector<int32_t> ctx_lens;
  std::vector<int> lo, hi; // each sequence's blocks: the positions the kernel writes
  for (size_t t = 0; t < positions.size(); ++t)
    if (t == 0 || seqs[t] != seqs[t - 1]) {
      ctx_lens.push_back(positions[t]);
      lo.push_back(positions[t]);
      hi.push_back(positions[t] + 1);
    } else {
      hi.back() = positions[t] + 1;
    }
  for (size_t b = 0; b < lo.size(); ++b) // a window keeps the last `window` tokens
    if (window > 0)
      lo[b] = std::max(lo[b], hi[b] - window);
  const int nseq = int(ctx_lens.size());
  const Tensor pos = Tensor::from_ints({tokens}, positions);
  const Tensor seq = Tensor::from_ints({tokens}, seqs);
  const Tensor ctx = Tensor::from_ints({nseq}, ctx_lens);
  PagedTables pt = random_tables(seed, block, table, lo, hi);
  if (ring > 0) {
    pt.blocks = nseq * ring + 1;
    for (int b = 0; b < nseq; ++b)
      for (int i = 0; i < table; ++i)
        pt.rows[size_t(b * table + i)] = 1 + b * ring + i % ring;
  }
  const Tensor crow = pt.tensor();
  const int rows = pt.blocks, slots = block;
  const Tensor x = random_f32(rng, {tokens, g, d}, 2.0f);
  Bf16Weight cache = random_bf16(rng, {rows, slots, g, d}, 1.0f);
  Tensor want = cache.t;
  ir::ref::kv_write(want, x, {pos, seq, ctx, crow}, window);
  const Loaded& l = load(emit_kv_write({g, d, block, table, window, false}, {}));
  auto dc = upload(cache.bits), dx = upload(x), dpos = upload(pos), dseq = upload(seq);
  auto drow = upload(crow);
  launch(l, tokens, 1, dc->p, dx->p, dpos->p, dseq->p, drow->p);
  device_sync();
  std::vector<uint16_t> got(cache.bits.size());
  cuda_ok(cudaMemcpy(got.data(), dc->p, got.size() * 2, cudaMemcpyDeviceToHost), "download");
  size_t bad = 0, changed = 0;
  const size_t null_block = size_t(slots) * g * d; // block 0's values
  for (size_t i = null_block; i < got.size(); ++i) {
    bad += got[i] != models::float_to_bf16(want.f[i]);
    changed += got[i] != cache.bits[i];
  }
  MESSAGE(l.src.name << " " << tokens << " tokens: " << bad << " of " << got.size() - null_block
                     << " cache values differ");
  CHECK(bad == 0);
  CHECK(changed > 0);
}

} // namespace

TEST_CASE("kv_write kernel stores bf16 rows where ir::ref puts them, through block tables") {
  XSERV_REQUIRE_GPU();
  // Two sequences: 3 tokens at positions 6..8 (across a block edge), one at 20.
  check_kv_write({6, 7, 8, 20}, {0, 0, 0, 1}, 0, 720);
  // A prefill longer than a window: 20 tokens of one sequence with a window of 8 (the blocks of
  // its first 12 positions are the null block in its table), then 3 of another.
  std::vector<int32_t> pos, seq;
  for (int p = 0; p < 20; ++p) {
    pos.push_back(p);
    seq.push_back(0);
  }
  for (int p = 5; p < 8; ++p) {
    pos.push_back(p);
    seq.push_back(1);
  }
  check_kv_write(pos, seq, 8, 721);
  check_kv_write(pos, seq, 0, 722); // no window: every position written
  // Rings of 3 blocks (a window of 8 in blocks of 4, and one block more): position p and p + 12
  // share a slot, so the first 8 of sequence 0's 20 tokens are skipped.
  check_kv_write(pos, seq, 8, 723, 3);
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
