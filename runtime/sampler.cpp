// Sampling: softmax at a temperature over the top-k / top-p candidates, drawn with a seeded RNG.
#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "base/error.h"

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
  // Candidates in one pass over the vocabulary (the min-p cut is a logit threshold: weight
  // exp((l - top) / T) >= min_p), then top-k by a partial sort of the survivors; only top-p needs
  // them in order, and sorts growing prefixes until the nucleus is complete. Without cuts
  // nothing is sorted: a draw costs O(V), not a sort of 201k ids.
  const size_t n = logits.size();
  const float top = *std::max_element(logits.begin(), logits.end());
  const double t = opts_.temperature, inv_t = 1.0 / t;
  const double floor = opts_.min_p > 0.0f ? double(top) + t * std::log(double(opts_.min_p))
                                          : -std::numeric_limits<double>::infinity();
  std::vector<int32_t> ids;
  ids.reserve(n);
  for (size_t i = 0; i < n; ++i)
    if (double(logits[i]) >= floor) // NaN never passes
      ids.push_back(static_cast<int32_t>(i));
  if (ids.empty())
    return argmax(logits);
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)] ||
           (logits[static_cast<size_t>(a)] == logits[static_cast<size_t>(b)] && a < b);
  };
  size_t sorted = 0; // ids[0, sorted) hold the most likely candidates in order
  if (opts_.top_k > 0 && static_cast<size_t>(opts_.top_k) < ids.size()) {
    const auto k = static_cast<std::ptrdiff_t>(opts_.top_k);
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), by_logit);
    ids.resize(static_cast<size_t>(k));
    sorted = ids.size();
  }
  auto weight = [&](int32_t id) {
    return std::exp((double(logits[static_cast<size_t>(id)]) - double(top)) * inv_t);
  };
  double sum = 0;
  for (int32_t id : ids)
    sum += weight(id);
  size_t keep = ids.size();
  if (opts_.top_p < 1.0f) {
    // The smallest prefix (by logit) whose weight reaches top_p of the whole.
    const double want = double(opts_.top_p) * sum;
    double cum = 0;
    size_t i = 0;
    for (size_t chunk = 256;; chunk *= 4) {
      const size_t end = std::min(ids.size(), std::max(sorted, i + chunk));
      if (end > sorted) {
        std::partial_sort(ids.begin() + static_cast<std::ptrdiff_t>(sorted),
                          ids.begin() + static_cast<std::ptrdiff_t>(end), ids.end(), by_logit);
        sorted = end;
      }
      while (i < end && cum < want)
        cum += weight(ids[i++]);
      if (cum >= want || end == ids.size())
        break;
    }
    keep = std::max<size_t>(i, 1);
    sum = 0;
    for (size_t j = 0; j < keep; ++j)
      sum += weight(ids[j]);
  }
  std::uniform_real_distribution<double> u(0.0, sum);
  double r = u(rng_);
  for (size_t i = 0; i < keep; ++i) {
    r -= weight(ids[i]);
    if (r <= 0)
      return ids[i];
  }
  return ids[keep - 1];
}

} // namespace xserv::runtime
