// Sampling: softmax at a temperature over the top-k / top-p candidates, drawn with a seeded RNG.
#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "ir/error.h"

namespace xserv::runtime {

void validate(const SamplerOptions& o) {
  // Written so that NaN fails every check (every comparison with NaN is false).
  if (!(o.temperature >= 0.0f && o.temperature <= 2.0f))
    throw Error(fmt::format("temperature {} is outside [0, 2]", o.temperature));
  if (o.top_k < 0)
    throw Error(fmt::format("top_k {} is negative (0 turns the cut off)", o.top_k));
  if (!(o.top_p > 0.0f && o.top_p <= 1.0f))
    throw Error(fmt::format("top_p {} is outside (0, 1]", o.top_p));
  if (!(o.min_p >= 0.0f && o.min_p <= 1.0f))
    throw Error(fmt::format("min_p {} is outside [0, 1]", o.min_p));
}

Sampler::Sampler(SamplerOptions opts) : opts_(opts), rng_(opts.seed) {}

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (opts_.temperature <= 0.0f)
    return argmax(logits);
  // Candidates sorted by logit; top-k first (cheap partial sort), then the nucleus.
  const size_t n = logits.size();
  size_t k = opts_.top_k > 0 ? std::min<size_t>(static_cast<size_t>(opts_.top_k), n) : n;
  std::vector<int32_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)] ||
           (logits[static_cast<size_t>(a)] == logits[static_cast<size_t>(b)] && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), by_logit);
  ids.resize(k);
  const double inv_t = 1.0 / opts_.temperature, top = logits[static_cast<size_t>(ids[0])];
  std::vector<double> p(k);
  double sum = 0;
  for (size_t i = 0; i < k; ++i) {
    p[i] = std::exp((logits[static_cast<size_t>(ids[i])] - top) * inv_t);
    sum += p[i];
  }
  if (opts_.min_p > 0.0f) { // p[0] is the most likely candidate's weight
    size_t keep = 1;
    while (keep < k && p[keep] >= opts_.min_p * p[0])
      ++keep;
    k = keep;
    p.resize(k);
    sum = std::accumulate(p.begin(), p.end(), 0.0);
  }
  if (opts_.top_p < 1.0f) {
    double cum = 0;
    size_t keep = 0;
    while (keep < k && cum < opts_.top_p * sum)
      cum += p[keep++];
    k = std::max<size_t>(keep, 1);
    p.resize(k);
    sum = std::accumulate(p.begin(), p.end(), 0.0);
  }
  std::uniform_real_distribution<double> u(0.0, sum);
  double r = u(rng_);
  for (size_t i = 0; i < k; ++i) {
    r -= p[i];
    if (r <= 0)
      return ids[i];
  }
  return ids[k - 1];
}

} // namespace xserv::runtime
