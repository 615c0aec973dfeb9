// attention with sinks, GQA and sliding windows against a naive full-matrix loop, and the KV
// cache semantics (kv_write, ring slots, several sequences) against a single-step run.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "base/error.h"
#include "ir/reference.h"

using namespace xserv::ir;

namespace {

Tensor randn(std::vector<int64_t> shape, std::mt19937& rng) {
  Tensor t = Tensor::zeros(DType::F32, std::move(shape));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : t.f)
    v = nd(rng);
  return t;
}

Tensor ints(std::vector<int32_t> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return Tensor::from_ints({n}, std::move(v));
}

/// The textbook formulation: a [T, T+1] logit matrix per head with masked entries at -inf and
/// the sink as an extra column, softmax along rows, the sink column dropped.
Tensor naive(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& sinks, int window,
             double scale) {
  const int T = static_cast<int>(q.dim(0)), H = static_cast<int>(q.dim(1));
  const int D = static_cast<int>(q.dim(2)), G = static_cast<int>(k.dim(1));
  Tensor out = Tensor::zeros(DType::F32, q.shape);
  for (int h = 0; h < H; ++h) {
    const int g = h / (H / G);
    for (int i = 0; i < T; ++i) {
      std::vector<double> logits(static_cast<size_t>(T + 1), -INFINITY);
      for (int j = 0; j < T; ++j) {
        const bool visible = j <= i && (window == 0 || i - j < window);
        if (!visible)
          continue;
        double s = 0;
        for (int d = 0; d < D; ++d)
          s += q.f[static_cast<size_t>((i * H + h) * D + d)] *
               static_cast<double>(k.f[static_cast<size_t>((j * G + g) * D + d)]);
        logits[static_cast<size_t>(j)] = s * scale;
      }
      logits[static_cast<size_t>(T)] = sinks.f[static_cast<size_t>(h)];
      double m = -INFINITY, z = 0;
      for (double l : logits)
        m = std::max(m, l);
      for (double l : logits)
        z += std::exp(l - m);
      for (int d = 0; d < D; ++d) {
        double acc = 0;
        for (int j = 0; j < T; ++j)
          acc += std::exp(logits[static_cast<size_t>(j)] - m) / z *
                 v.f[static_cast<size_t>((j * G + g) * D + d)];
        out.f[static_cast<size_t>((i * H + h) * D + d)] = static_cast<float>(acc);
      }
    }
  }
  return out;
}

struct Case {
  int T, H, G, D, window;
};

} // namespace

TEST_CASE("attention matches the naive loop (one sequence, one step)") {
  for (Case c :
       {Case{9, 4, 2, 16, 0}, Case{9, 4, 2, 16, 4}, Case{20, 8, 1, 8, 3}, Case{5, 2, 2, 32, 128}}) {
    CAPTURE(c.T);
    CAPTURE(c.window);
    std::mt19937 rng(static_cast<unsigned>(c.T * 31 + c.window));
    Tensor q = randn({c.T, c.H, c.D}, rng), k = randn({c.T, c.G, c.D}, rng);
    Tensor v = randn({c.T, c.G, c.D}, rng), sinks = randn({c.H}, rng);
    const int slots = c.window ? c.window : 64;
    Tensor kc = Tensor::zeros(DType::F32, {1, slots, c.G, c.D}), vc = kc;
    std::vector<int32_t> pos(static_cast<size_t>(c.T));
    for (int i = 0; i < c.T; ++i)
      pos[static_cast<size_t>(i)] = i;
    Tensor positions = ints(pos), seq = ints(std::vector<int32_t>(static_cast<size_t>(c.T), 0));
    Tensor ctx = ints({0}), rows = Tensor::from_ints({1, 1}, {0});
    ref::Batch b{positions, seq, ctx, rows};
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
    Tensor got = ref::attention(q, k, v, kc, vc, sinks, b, c.window, scale);
    Tensor want = naive(q, k, v, sinks, c.window, scale);
    double max_err = 0;
    for (size_t i = 0; i < got.f.size(); ++i)
      max_err = std::max(max_err, std::abs(static_cast<double>(got.f[i]) - want.f[i]));
    CHECK(max_err < 1e-5);
  }
}

TEST_CASE("decoding through the cache equals one step over the whole sequence") {
  // Two sequences in a paged cache of 8 blocks of 2 positions, each through a ring of 3 blocks
  // (a window of 4 needs at most 3) scattered over the pool; sequence 0 is longer than its ring,
  // which wraps several times.
  const int H = 4, G = 2, D = 8, window = 4, block = 2;
  const int lens[2] = {11, 6};
  std::mt19937 rng(11);
  std::vector<Tensor> q, k, v;
  for (int s = 0; s < 2; ++s) {
    q.push_back(randn({lens[s], H, D}, rng));
    k.push_back(randn({lens[s], G, D}, rng));
    v.push_back(randn({lens[s], G, D}, rng));
  }
  Tensor sinks = randn({H}, rng);
  const double scale = 0.3;
  Tensor kc = Tensor::zeros(DType::F32, {8, block, G, D}), vc = kc;
  const int32_t ring[2][3] = {{5, 2, 7}, {0, 6, 3}};
  std::vector<int32_t> table;
  for (int s = 0; s < 2; ++s)
    for (int i = 0; i < 6; ++i)
      table.push_back(ring[s][i % 3]);
  Tensor rows = Tensor::from_ints({2, 6}, table);
  auto slice = [&](const Tensor& t, int from, int n) {
    const int64_t w = t.numel() / t.dim(0);
    std::vector<int64_t> shape = t.shape;
    shape[0] = n;
    return Tensor::from_floats(
        shape, std::vector<float>(t.f.begin() + from * w, t.f.begin() + (from + n) * w));
  };
  std::vector<Tensor> got(2);
  for (int s = 0; s < 2; ++s)
    got[s] = Tensor::zeros(DType::F32, {lens[s], H, D});
  // Step 0: a 3-token prefill of both sequences, batched. Then one token per step.
  int done[2] = {0, 0};
  for (int step = 0; done[0] < lens[0] || done[1] < lens[1]; ++step) {
    std::vector<int32_t> pos, seq, ctx;
    std::vector<Tensor> qs, ks, vs;
    std::vector<int> take(2, 0);
    for (int s = 0; s < 2; ++s) {
      take[s] = std::min(step == 0 ? 3 : 1, lens[s] - done[s]);
      ctx.push_back(done[s]);
      for (int i = 0; i < take[s]; ++i) {
        pos.push_back(done[s] + i);
        seq.push_back(s);
      }
    }
    auto cat = [&](std::vector<Tensor>& src) {
      std::vector<float> data;
      int n = 0;
      for (int s = 0; s < 2; ++s) {
        Tensor part = slice(src[s], done[s], take[s]);
        data.insert(data.end(), part.f.begin(), part.f.end());
        n += take[s];
      }
      std::vector<int64_t> shape = src[0].shape;
      shape[0] = n;
      return Tensor::from_floats(shape, data);
    };
    Tensor qq = cat(q), kk = cat(k), vv = cat(v);
    Tensor positions = ints(pos), token_seq = ints(seq), ctx_lens = ints(ctx);
    ref::Batch b{positions, token_seq, ctx_lens, rows};
    Tensor o = ref::attention(qq, kk, vv, kc, vc, sinks, b, window, scale);
    ref::kv_write(kc, kk, b, window);
    ref::kv_write(vc, vv, b, window);
    int t = 0;
    for (int s = 0; s < 2; ++s)
      for (int i = 0; i < take[s]; ++i, ++t)
        std::copy_n(o.f.begin() + t * H * D, H * D, got[s].f.begin() + (done[s] + i) * H * D);
    done[0] += take[0];
    done[1] += take[1];
  }
  for (int s = 0; s < 2; ++s) {
    Tensor want = naive(q[s], k[s], v[s], sinks, window, scale);
    double max_err = 0;
    for (size_t i = 0; i < want.f.size(); ++i)
      max_err = std::max(max_err, std::abs(static_cast<double>(got[s].f[i]) - want.f[i]));
    CHECK(max_err < 1e-5);
  }
}

TEST_CASE("attention refuses inconsistent batch bookkeeping") {
  std::mt19937 rng(1);
  Tensor q = randn({2, 2, 4}, rng), k = randn({2, 1, 4}, rng), v = k, sinks = randn({2}, rng);
  Tensor kc = Tensor::zeros(DType::F32, {1, 8, 1, 4}), vc = kc;
  Tensor ctx = ints({0}), rows = Tensor::from_ints({1, 1}, {0});
  Tensor gap = ints({0, 2}), seq = ints({0, 0});
  ref::Batch b{gap, seq, ctx, rows}; // position 1 is neither cached nor in the step
  CHECK_THROWS_AS(ref::attention(q, k, v, kc, vc, sinks, b, 0, 0.5), xserv::Error);
  Tensor pos = ints({2, 3}), ctx2 = ints({2}), bad_block = Tensor::from_ints({1, 1}, {5});
  ref::Batch b2{pos, seq, ctx2, bad_block}; // positions 0, 1 cached in block 5 of 1
  CHECK_THROWS_WITH(ref::attention(q, k, v, kc, vc, sinks, b2, 0, 0.5),
                    "sequence 0: position 0 is in block 5, but the cache has 1 blocks");
  Tensor short_table = Tensor::from_ints({1, 1}, {0}), far = ints({9, 10}), ctx9 = ints({9});
  ref::Batch b3{far, seq, ctx9, short_table}; // position 8 needs the table's second entry
  CHECK_THROWS_WITH(ref::attention(q, k, v, kc, vc, sinks, b3, 0, 0.5),
                    "position 8 of sequence 0 is past its block table's 1 blocks of 8");
}
