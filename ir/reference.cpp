// The fp32 reference math of every op. Written for clarity, not speed: loops mirror MODEL.md,
// reductions accumulate in double so the reference sits well inside any fp32 tolerance.
#include "ir/reference.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "base/error.h"

namespace xserv::ir {

Tensor Tensor::zeros(DType dt, std::vector<int64_t> shape) {
  Tensor t;
  t.dtype = dt;
  t.shape = std::move(shape);
  if (is_float(dt))
    t.f.assign(static_cast<size_t>(t.numel()), 0.0f);
  else
    t.i.assign(static_cast<size_t>(t.numel()), 0);
  return t;
}

Tensor Tensor::from_floats(std::vector<int64_t> shape, std::vector<float> data) {
  Tensor t;
  t.shape = std::move(shape);
  t.f = std::move(data);
  XSERV_CHECK(static_cast<int64_t>(t.f.size()) == t.numel(), "tensor data size mismatch");
  return t;
}

Tensor Tensor::from_ints(std::vector<int64_t> shape, std::vector<int32_t> data) {
  Tensor t;
  t.dtype = DType::I32;
  t.shape = std::move(shape);
  t.i = std::move(data);
  XSERV_CHECK(static_cast<int64_t>(t.i.size()) == t.numel(), "tensor data size mismatch");
  return t;
}

int64_t Tensor::numel() const {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

namespace ref {
namespace {

size_t idx(int64_t v) {
  return static_cast<size_t>(v);
}

int64_t rows_of(const Tensor& x) {
  return x.numel() / x.shape.back();
}

} // namespace

std::vector<double> yarn_inv_freq(const Yarn& y, int64_t head_dim) {
  const double d = static_cast<double>(head_dim);
  const double pi = 3.14159265358979323846;
  auto correction = [&](double beta) {
    return d * std::log(y.original_max / (beta * 2 * pi)) / (2 * std::log(y.theta));
  };
  double low = correction(y.beta_fast), high = correction(y.beta_slow);
  if (y.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, d - 1);
  if (low == high)
    high += 0.001; // avoids a zero-width ramp, as the reference implementation does
  std::vector<double> inv(idx(head_dim / 2));
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    double f = std::pow(y.theta, -2.0 * static_cast<double>(i) / d);
    double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    inv[idx(i)] = f / y.factor * ramp + f * (1 - ramp);
  }
  return inv;
}

double yarn_attention_factor(const Yarn& y) {
  return y.factor <= 1 ? 1.0 : 0.1 * std::log(y.factor) + 1.0;
}

Tensor embedding(const Tensor& table, const Tensor& ids) {
  const int64_t v = table.dim(0), d = table.dim(1), t = ids.numel();
  Tensor out = Tensor::zeros(DType::F32, {t, d});
  for (int64_t i = 0; i < t; ++i) {
    int64_t id = ids.i[idx(i)];
    if (id < 0 || id >= v)
      throw Error(
          fmt::format("token id {} at index {} is outside the vocabulary [0, {})", id, i, v));
    std::copy_n(table.f.begin() + id * d, d, out.f.begin() + i * d);
  }
  return out;
}

Tensor rms_norm(const Tensor& x, const Tensor& w, double eps) {
  const int64_t d = x.shape.back(), n = rows_of(x);
  Tensor out = Tensor::zeros(DType::F32, x.shape);
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = &x.f[idx(r * d)];
    double ss = 0;
    for (int64_t j = 0; j < d; ++j)
      ss += static_cast<double>(xr[j]) * xr[j];
    double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
    for (int64_t j = 0; j < d; ++j)
      out.f[idx(r * d + j)] = static_cast<float>(xr[j] * inv * w.f[idx(j)]);
  }
  return out;
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor* b) {
  const int64_t k = x.shape.back(), n = w.dim(0), rows = rows_of(x);
  std::vector<int64_t> shape = x.shape;
  shape.back() = n;
  Tensor out = Tensor::zeros(DType::F32, shape);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = &x.f[idx(r * k)];
    for (int64_t o = 0; o < n; ++o) {
      const float* wr = &w.f[idx(o * k)];
      double acc = b ? b->f[idx(o)] : 0.0;
      for (int64_t j = 0; j < k; ++j)
        acc += static_cast<double>(xr[j]) * wr[j];
      out.f[idx(r * n + o)] = static_cast<float>(acc);
    }
  }
  return out;
}

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = Tensor::zeros(DType::F32, a.shape);
  for (size_t i = 0; i < a.f.size(); ++i)
    out.f[i] = a.f[i] + b.f[i];
  return out;
}

Tensor rope_yarn(const Tensor& x, const Tensor& positions, const Yarn& y) {
  const int64_t t = x.dim(0), h = x.dim(1), d = x.dim(2), half = d / 2;
  const std::vector<double> inv = yarn_inv_freq(y, d);
  const double att = yarn_attention_factor(y);
  Tensor out = Tensor::zeros(DType::F32, x.shape);
  for (int64_t i = 0; i < t; ++i) {
    const double p = positions.i[idx(i)];
    for (int64_t j = 0; j < half; ++j) {
      const double c = std::cos(p * inv[idx(j)]) * att, s = std::sin(p * inv[idx(j)]) * att;
      for (int64_t hh = 0; hh < h; ++hh) {
        const size_t base = idx((i * h + hh) * d);
        const double x1 = x.f[base + idx(j)], x2 = x.f[base + idx(j + half)];
        out.f[base + idx(j)] = static_cast<float>(x1 * c - x2 * s);
        out.f[base + idx(j + half)] = static_cast<float>(x2 * c + x1 * s);
      }
    }
  }
  return out;
}

namespace {

/// How many of sequence b's positions precede the step, checked.
struct SeqInfo {
  int64_t seq;
  int64_t ctx;
};

SeqInfo seq_info(const Batch& batch, int64_t t) {
  const int64_t b = batch.token_seq.i[idx(t)], nseq = batch.ctx_lens.numel();
  if (b < 0 || b >= nseq)
    throw Error(
        fmt::format("token {} names sequence {}, but the step has {} sequences", t, b, nseq));
  if (batch.table.dim(0) != nseq)
    throw Error(
        fmt::format("the block table has {} rows for {} sequences", batch.table.dim(0), nseq));
  return {b, batch.ctx_lens.i[idx(b)]};
}

/// Element offset of position j of sequence `seq` in a paged cache [blocks, BS, G, D].
int64_t slot_offset(const Batch& batch, const Tensor& cache, int64_t seq, int64_t j) {
  const int64_t bs = cache.dim(1), width = batch.table.dim(1), blocks = cache.dim(0);
  if (j / bs >= width)
    throw Error(fmt::format("position {} of sequence {} is past its block table's {} blocks of {}",
                            j, seq, width, bs));
  const int64_t block = batch.table.i[idx(seq * width + j / bs)];
  if (block < 0 || block >= blocks)
    throw Error(fmt::format("sequence {}: position {} is in block {}, but the cache has {} blocks",
                            seq, j, block, blocks));
  return (block * bs + j % bs) * cache.dim(2) * cache.dim(3);
}

} // namespace

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_cache,
                 const Tensor& v_cache, const Tensor& sinks, const Batch& batch, int64_t window,
                 double scale) {
  const int64_t t_count = q.dim(0), h_count = q.dim(1), d = q.dim(2), g_count = k.dim(1);
  const int64_t group = h_count / g_count;
  Tensor out = Tensor::zeros(DType::F32, q.shape);
  std::vector<double> scores;
  for (int64_t t = 0; t < t_count; ++t) {
    const SeqInfo s = seq_info(batch, t);
    const int64_t p = batch.positions.i[idx(t)];
    if (p < s.ctx)
      throw Error(fmt::format("token {} is at position {} but its sequence already has {} "
                              "cached positions",
                              t, p, s.ctx));
    const int64_t lo = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
    // Key/value row j: cached positions come from the cache, the step's own from k/v. The
    // step's tokens of one sequence are contiguous with consecutive positions.
    auto key_row = [&](const Tensor& step, const Tensor& cache, int64_t j, int64_t g) {
      if (j < s.ctx)
        return &cache.f[idx(slot_offset(batch, cache, s.seq, j) + g * d)];
      const int64_t tj = t - (p - j);
      if (tj < 0 || batch.token_seq.i[idx(tj)] != batch.token_seq.i[idx(t)] ||
          batch.positions.i[idx(tj)] != j)
        throw Error(fmt::format("token {}: position {} of its sequence is neither cached nor "
                                "in this step (tokens of a sequence must be contiguous, with "
                                "consecutive positions)",
                                t, j));
      return &step.f[idx((tj * g_count + g) * d)];
    };
    for (int64_t h = 0; h < h_count; ++h) {
      const int64_t g = h / group;
      const float* qv = &q.f[idx((t * h_count + h) * d)];
      const double sink = sinks.f[idx(h)];
      double m = sink;
      scores.assign(idx(p - lo + 1), 0.0);
      for (int64_t j = lo; j <= p; ++j) {
        const float* kv = key_row(k, k_cache, j, g);
        double dot = 0;
        for (int64_t e = 0; e < d; ++e)
          dot += static_cast<double>(qv[e]) * kv[e];
        scores[idx(j - lo)] = dot * scale;
        m = std::max(m, dot * scale);
      }
      double denom = std::exp(sink - m);
      for (double& sc : scores) {
        sc = std::exp(sc - m);
        denom += sc;
      }
      float* o = &out.f[idx((t * h_count + h) * d)];
      for (int64_t e = 0; e < d; ++e) {
        double acc = 0;
        for (int64_t j = lo; j <= p; ++j)
          acc += scores[idx(j - lo)] * key_row(v, v_cache, j, g)[e];
        o[e] = static_cast<float>(acc / denom);
      }
    }
  }
  return out;
}

void kv_write(Tensor& cache, const Tensor& x, const Batch& batch, int64_t window) {
  const int64_t t_count = x.dim(0), g = x.dim(1), d = x.dim(2);
  for (int64_t t = 0; t < t_count; ++t) {
    const SeqInfo s = seq_info(batch, t);
    const int64_t p = batch.positions.i[idx(t)];
    if (p < 0)
      throw Error(fmt::format("token {} has negative position {}", t, p));
    // A sliding layer's token is left out when a later token of its sequence lands in the same
    // slot (a table that reuses a ring of blocks): tokens of a sequence are contiguous with
    // consecutive positions, so that token sits ring * bs further, and no query after this
    // step reaches back to p.
    if (window > 0) {
      const int64_t bs = cache.dim(1), ring = (window + bs - 1) / bs + 1, t2 = t + ring * bs;
      const int64_t width = batch.table.dim(1), row = s.seq * width;
      if (t2 < t_count && batch.token_seq.i[idx(t2)] == s.seq &&
          batch.table.i[idx(row + p / bs)] == batch.table.i[idx(row + p / bs + ring)])
        continue;
    }
    std::copy_n(x.f.begin() + t * g * d, g * d,
                cache.f.begin() + slot_offset(batch, cache, s.seq, p));
  }
}

void router_topk(const Tensor& logits, int64_t k, Tensor& weights, Tensor& ids) {
  const int64_t t_count = logits.dim(0), e = logits.dim(1);
  weights = Tensor::zeros(DType::F32, {t_count, k});
  ids = Tensor::zeros(DType::I32, {t_count, k});
  std::vector<int32_t> order(idx(e));
  for (int64_t t = 0; t < t_count; ++t) {
    const float* r = &logits.f[idx(t * e)];
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return r[a] > r[b]; });
    const double m = r[order[0]];
    double sum = 0;
    for (int64_t j = 0; j < k; ++j)
      sum += std::exp(r[order[idx(j)]] - m);
    for (int64_t j = 0; j < k; ++j) {
      ids.i[idx(t * k + j)] = order[idx(j)];
      weights.f[idx(t * k + j)] = static_cast<float>(std::exp(r[order[idx(j)]] - m) / sum);
    }
  }
}

Tensor moe_experts(const Tensor& x, const Tensor& weights, const Tensor& ids, const Tensor& gate_up,
                   const Tensor& gate_up_bias, const Tensor& down, const Tensor& down_bias,
                   double limit, double alpha) {
  const int64_t t_count = x.dim(0), dm = x.dim(1), k = ids.dim(1), experts = gate_up.dim(0);
  const int64_t inter = down.dim(2);
  Tensor out = Tensor::zeros(DType::F32, x.shape);
  std::vector<double> act(idx(inter));
  for (int64_t t = 0; t < t_count; ++t) {
    const float* xr = &x.f[idx(t * dm)];
    std::vector<double> acc(idx(dm), 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t ex = ids.i[idx(t * k + j)];
      if (ex < 0 || ex >= experts)
        throw Error(fmt::format("expert id {} outside [0, {})", ex, experts));
      const double w = weights.f[idx(t * k + j)];
      for (int64_t i = 0; i < inter; ++i) {
        double gu[2];
        for (int64_t half = 0; half < 2; ++half) { // row 2i is gate, row 2i+1 is up
          const int64_t row = 2 * i + half;
          const float* wr = &gate_up.f[idx((ex * 2 * inter + row) * dm)];
          double dot = gate_up_bias.f[idx(ex * 2 * inter + row)];
          for (int64_t c = 0; c < dm; ++c)
            dot += static_cast<double>(xr[c]) * wr[c];
          gu[half] = dot;
        }
        const double gate = std::min(gu[0], limit);
        const double up = std::clamp(gu[1], -limit, limit);
        const double glu = gate / (1.0 + std::exp(-alpha * gate));
        act[idx(i)] = (up + 1.0) * glu;
      }
      for (int64_t o = 0; o < dm; ++o) {
        const float* wr = &down.f[idx((ex * dm + o) * inter)];
        double dot = down_bias.f[idx(ex * dm + o)];
        for (int64_t i = 0; i < inter; ++i)
          dot += act[idx(i)] * wr[i];
        acc[idx(o)] += w * dot;
      }
    }
    for (int64_t o = 0; o < dm; ++o)
      out.f[idx(t * dm + o)] = static_cast<float>(acc[idx(o)]);
  }
  return out;
}

Tensor select_rows(const Tensor& x, const Tensor& rows) {
  const int64_t n = x.dim(0), width = x.numel() / std::max<int64_t>(n, 1), b = rows.numel();
  std::vector<int64_t> shape = x.shape;
  shape[0] = b;
  Tensor out = Tensor::zeros(x.dtype, shape);
  for (int64_t r = 0; r < b; ++r) {
    const int64_t src = rows.i[idx(r)];
    if (src < 0 || src >= n)
      throw Error(fmt::format("select_rows: row {} outside [0, {})", src, n));
    if (x.is_int())
      std::copy_n(x.i.begin() + src * width, width, out.i.begin() + r * width);
    else
      std::copy_n(x.f.begin() + src * width, width, out.f.begin() + r * width);
  }
  return out;
}

Tensor argmax(const Tensor& x) {
  const int64_t v = x.shape.back(), n = rows_of(x);
  std::vector<int64_t> shape(x.shape.begin(), x.shape.end() - 1);
  Tensor out = Tensor::zeros(DType::I32, shape);
  for (int64_t r = 0; r < n; ++r) {
    const float* row = &x.f[idx(r * v)];
    out.i[idx(r)] = static_cast<int32_t>(std::max_element(row, row + v) - row);
  }
  return out;
}

} // namespace ref
} // namespace xserv::ir
