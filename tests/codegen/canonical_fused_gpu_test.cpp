// Canonical plans' fused decode kernels (codegen/kernels/linear_chain.cuh) against the gemm path
// that serves the same matrices in larger steps: qkv_rope_decode_chain against gemm_act (with
// the norm) + gemm_wg in the projections' K splits + gemm_splitk_reduce + rope_yarn_qk_kv, and
// norm_router_topk_chain against rms_norm + the router gemm + router_topk. Bit for bit: q, k,
// v, both caches, the experts' xn, the routing weights and ids. Both in the gemms' slot order
// with their K splits and in the natural K order, one chain (against gemm_wg's natural form).
#include "tests/codegen/gemm_wg_test_util.h"

#include <cstring>

using namespace xserv;
using namespace xserv::codegen;
using namespace xserv::kernel_test;
using namespace xserv::kernel_test::wg;

namespace {

std::vector<uint8_t> bytes_of(const DevBuf& b) {
  std::vector<uint8_t> h(b.bytes);
  cuda_ok(cudaMemcpy(h.data(), b.p, b.bytes, cudaMemcpyDeviceToHost), "download");
  return h;
}

} // namespace

TEST_CASE("qkv_rope_decode_chain gives the gemm path's q, k, v and cache bits") {
  XSERV_REQUIRE_GPU();
  if (!sm90()) {
    MESSAGE("skipped: the canonical order is gemm_wg's (sm_90)");
    return;
  }
  Rng rng{7500};
  const ir::ref::Yarn yarn;
  const double att = ir::ref::yarn_attention_factor(yarn);
  const int table = 320, seqs = 80; // one token a sequence, positions to 5,000
  // (K, q rows, k/v rows, head_dim, block, fp32 cache): the 20b's (pairs of one head a block),
  // the tiny model's (whole heads), a wide-head one.
  for (auto [k, nq, nkv, head_dim, block, f32] :
       {std::tuple{2880, 4096, 512, 64, 16, true}, std::tuple{2880, 4096, 512, 64, 32, false},
        std::tuple{64, 64, 32, 16, 16, false}, std::tuple{512, 512, 256, 128, 16, true}}) {
    CAPTURE(k);
    CAPTURE(block);
    std::vector<int> lo, hi, positions(static_cast<size_t>(seqs)), order(static_cast<size_t>(seqs));
    for (int s = 0; s < seqs; ++s) {
      positions[size_t(s)] = s < 4 ? std::vector<int>{0, 7, 130, 4999}[size_t(s)]
                                   : int(rng.next(1.0f) * 2500.0f) + 2500;
      lo.push_back(positions[size_t(s)]);
      hi.push_back(positions[size_t(s)] + 1);
      order[size_t(s)] = s;
    }
    const PagedTables pt = random_tables(uint64_t(k) + block, block, table, lo, hi);
    const Tensor x = random_f32(rng, {seqs, k}, 2.0f);
    const Bf16Weight ln = random_bf16(rng, {k}, 1.0f);
    std::vector<Bf16Weight> w, b;
    for (int n : {nq, nkv, nkv}) {
      w.push_back(random_bf16(rng, {n, k}, 1.0f / std::sqrt(float(k))));
      b.push_back(random_bf16(rng, {n}, 0.5f));
    }
    std::vector<std::unique_ptr<DevBuf>> dw, db;
    for (int r = 0; r < 3; ++r) {
      dw.push_back(upload(w[size_t(r)].bits));
      db.push_back(upload(b[size_t(r)].bits));
    }
    const std::vector<double> inv = ir::ref::yarn_inv_freq(yarn, head_dim);
    const int hq = nq / head_dim, hk = nkv / head_dim;
    const size_t cache_n = size_t(pt.blocks) * block * hk * head_dim, elem = f32 ? 4 : 2;
    std::vector<uint8_t> init(cache_n * elem);
    for (auto& v : init)
      v = static_cast<uint8_t>(rng.next(1.0f) * 100.0f);
    auto dx = upload(x), dln = upload(ln.bits), dpos = upload(Tensor::from_ints({seqs}, positions));
    auto dseq = upload(Tensor::from_ints({seqs}, order)), drow = upload(pt.tensor());
    auto dinv = upload(inv);
    for (bool natural : {false, true}) {
      CAPTURE(natural);
      QkvDims d;
      d.k = k;
      d.nq = nq;
      d.nk = d.nv = nkv;
      d.round_act = true;
      d.head_dim = head_dim;
      d.block = block;
      d.table = table;
      d.attention_factor = att;
      d.f32_cache = f32;
      d.chain_q = natural ? 1 : wg_splitk(k, nq);
      d.chain_kv = natural ? 1 : wg_splitk(k, nkv);
      d.chain_natural = natural;
      CAPTURE(d.chain_q);
      CAPTURE(d.chain_kv);
      // The gemm path over all the sequences at once: 64-token tiles with K split over blocks
      // (up to 64 rows) or 128-token tiles with the K ranges as chunks (above), then the rope
      // and the cache writes; natural: one chain over natural K in 64- and 128-token tiles.
      struct Out {
        std::unique_ptr<DevBuf> q, k, v, kc, vc;
      };
      auto gemm_path = [&](bool large) {
        Out o;
        std::unique_ptr<DevBuf>* dst[3] = {&o.q, &o.k, &o.v};
        for (int r = 0; r < 3; ++r) {
          LinearDims ld{k, r == 0 ? nq : nkv, true, true, false};
          const int splitk = natural ? 1 : wg_splitk(k, ld.n);
          *dst[r] = large ? dense_gemm_out(ld, 1, 128, seqs, dx->p, dln->p, dw[size_t(r)]->p,
                                           db[size_t(r)]->p, nullptr, splitk, natural)
                          : dense_gemm_out(ld, splitk, 64, seqs, dx->p, dln->p, dw[size_t(r)]->p,
                                           db[size_t(r)]->p, nullptr, 1, natural);
        }
        o.kc = upload(init);
        o.vc = upload(init);
        launch(load(emit_rope_yarn_qk_kv(hq, hk, head_dim, att, block, table, f32, {})), seqs, 1,
               o.q->p, o.k->p, o.v->p, dpos->p, dseq->p, drow->p, dinv->p, o.kc->p, o.vc->p);
        device_sync();
        return o;
      };
      const Out want = gemm_path(false), want_large = gemm_path(true);
      for (size_t i = 0; i < 5; ++i) {
        const DevBuf* a[5] = {want.q.get(), want.k.get(), want.v.get(), want.kc.get(),
                              want.vc.get()};
        const DevBuf* c[5] = {want_large.q.get(), want_large.k.get(), want_large.v.get(),
                              want_large.kc.get(), want_large.vc.get()};
        CHECK(bytes_of(*a[i]) == bytes_of(*c[i])); // the two gemm tilings agree
      }
      const std::vector<uint8_t> want_kc = bytes_of(*want.kc), want_vc = bytes_of(*want.vc);
      CHECK(want_kc != init);
      // The fused kernel: steps of the first 1, 3 and 8 sequences (the one- and 8-token kernels).
      for (auto [tokens, max_t] :
           {std::pair{1, 1}, std::pair{1, 8}, std::pair{3, 8}, std::pair{8, 8}}) {
        CAPTURE(tokens);
        CAPTURE(max_t);
        QkvDims dt = d;
        dt.max_tokens = max_t;
        REQUIRE(qkv_chain_fits(dt));
        const Loaded& l = load(emit_qkv_rope_chain(dt, {}));
        auto q = poisoned(size_t(tokens) * nq), kk = poisoned(size_t(tokens) * nkv);
        auto vv = poisoned(size_t(tokens) * nkv);
        auto kc = upload(init), vc = upload(init);
        auto run = [&] {
          launch(l, tokens, 1, dx->p, dln->p, dw[0]->p, db[0]->p, dw[1]->p, db[1]->p, dw[2]->p,
                 db[2]->p, q->p, kk->p, vv->p, tokens, dpos->p, dseq->p, drow->p, dinv->p, kc->p,
                 vc->p);
        };
        run();
        device_sync();
        auto head = [](const DevBuf& full, size_t n) {
          const std::vector<uint8_t> all = bytes_of(full);
          return std::vector<uint8_t>(all.begin(), all.begin() + std::ptrdiff_t(n * 4));
        };
        CHECK(bytes_of(*q) == head(*want.q, size_t(tokens) * nq));
        CHECK(bytes_of(*kk) == head(*want.k, size_t(tokens) * nkv));
        CHECK(bytes_of(*vv) == head(*want.v, size_t(tokens) * nkv));
        // The caches: the slots of these tokens as the gemm path wrote them, the rest untouched.
        const size_t slot_bytes = size_t(hk) * head_dim * elem;
        std::vector<uint8_t> kc_want = init, vc_want = init;
        for (int t = 0; t < tokens; ++t) {
          const int p = positions[size_t(t)];
          const size_t slot =
              size_t(pt.rows[size_t(t) * table + size_t(p / block)]) * block + size_t(p % block);
          std::memcpy(kc_want.data() + slot * slot_bytes, want_kc.data() + slot * slot_bytes,
                      slot_bytes);
          std::memcpy(vc_want.data() + slot * slot_bytes, want_vc.data() + slot * slot_bytes,
                      slot_bytes);
        }
        CHECK(bytes_of(*kc) == kc_want);
        CHECK(bytes_of(*vc) == vc_want);
        if (k == 2880 && tokens == max_t && f32) // informational, weights cycled through L2
          MESSAGE(l.src.name << ": " << median_ms([&](int) { run(); }) * 1e3 << " us");
      }
    }
  }
}

TEST_CASE("norm_router_topk_chain gives the gemm path's xn, routing weights and ids") {
  XSERV_REQUIRE_GPU();
  if (!sm90()) {
    MESSAGE("skipped: the canonical order is gemm_wg's (sm_90)");
    return;
  }
  Rng rng{7600};
  // The 20b's routing (32 experts, 9 K ranges: a cluster of 3), the 120b's (128: 8 blocks, the
  // ranges in turn), the tiny model's (8 experts, half a row group, one range), no bias.
  for (auto [dim, experts, k, bias] :
       {std::tuple{2880, 32, 4, true}, std::tuple{2880, 128, 4, true}, std::tuple{64, 8, 2, true},
        std::tuple{2880, 32, 4, false}}) {
    CAPTURE(dim);
    CAPTURE(experts);
    const int rows = 80;
    const Tensor x = random_f32(rng, {rows, dim}, 3.0f);
    const Bf16Weight ln = random_bf16(rng, {dim}, 1.0f);
    const Bf16Weight w = random_bf16(rng, {experts, dim}, 0.05f);
    const Bf16Weight b = random_bf16(rng, {experts}, 0.5f);
    auto dx = upload(x), dln = upload(ln.bits), dw = upload(w.bits), db = upload(b.bits);
    // The gemm path: rms_norm's xn, the router gemm (its K split, 64-token tiles), top-k.
    auto xn = poisoned(size_t(rows) * dim);
    launch(load(emit_rms_norm({dim, 1e-5}, {})), rows, 1, dx->p, dln->p, xn->p);
    LinearDims ld{dim, experts, false, bias, false};
    // The gemm's K split and slots, or (natural) one chain over natural K.
    for (bool natural : {false, true}) {
      CAPTURE(natural);
      const int splitk = natural ? 1 : wg_splitk(dim, experts);
      const auto logits =
          dense_gemm_out(ld, splitk, 64, rows, xn->p, nullptr, dw->p, db->p, nullptr, 1, natural);
      auto rw = poisoned(size_t(rows) * k), rid = poisoned(size_t(rows) * k);
      launch(load(emit_router_topk({experts, k}, {})), rows, 1, logits->p, rw->p, rid->p);
      device_sync();
      RouterTopKDims rd{experts, k, true};
      rd.chain = splitk;
      rd.chain_natural = natural;
      REQUIRE(norm_router_topk_chain_fits(dim, rd));
      const Loaded& l = load(emit_norm_router_topk_chain(dim, rd, 1e-5, bias, {}));
      for (int tokens : {1, 3, 8}) {
        CAPTURE(tokens);
        auto fxn = poisoned(size_t(tokens) * dim);
        auto fw = poisoned(size_t(tokens) * k), fid = poisoned(size_t(tokens) * k);
        auto run = [&] {
          if (bias)
            launch(l, tokens, 1, dx->p, dln->p, dw->p, db->p, fxn->p, fw->p, fid->p);
          else
            launch(l, tokens, 1, dx->p, dln->p, dw->p, fxn->p, fw->p, fid->p);
        };
        run();
        device_sync();
        const std::vector<float> want_xn = download(*xn, size_t(tokens) * dim);
        CHECK(download(*fxn, want_xn.size()) == want_xn);
        CHECK(download(*fw, size_t(tokens) * k) == download(*rw, size_t(tokens) * k));
        CHECK(download_ints(*fid, size_t(tokens) * k) == download_ints(*rid, size_t(tokens) * k));
        if (dim == 2880 && experts == 32 && bias && tokens == 1) // informational
          MESSAGE(l.src.name << " (" << l.src.launch.blocks_x << " blocks a token): "
                             << median_ms([&](int) { run(); }) * 1e3 << " us");
      }
    }
  }
}
