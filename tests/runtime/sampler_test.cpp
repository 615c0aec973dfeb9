// The sampler against theory: draw frequencies vs the softmax at the temperature (within a
// stated binomial bound), the exact support of top-k / top-p / min-p, seed reproducibility,
// temperature 0 = argmax, and validate() refusing out-of-range or NaN options.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <set>
#include <vector>

#include "base/error.h"
#include "runtime/sampler.h"

using xserv::runtime::Sampler;
using xserv::runtime::SamplerOptions;

namespace {

// Distinct logits, none tied, spread so every cut below has a clear boundary.
const std::vector<float> kLogits = {1.0f, 2.5f, -0.5f, 2.0f, 0.0f, 1.6f, -3.0f, 0.4f};
constexpr int kDraws = 200000;

/// softmax(logits / t) restricted to `keep` (ids), renormalized; 0 elsewhere.
std::vector<double> softmax_over(const std::vector<int>& keep, double t) {
  std::vector<double> p(kLogits.size(), 0.0);
  double sum = 0;
  for (int i : keep)
    sum += p[size_t(i)] = std::exp(double(kLogits[size_t(i)]) / t);
  for (double& v : p)
    v /= sum;
  return p;
}

/// Ids by logit, highest first.
std::vector<int> by_logit() {
  std::vector<int> ids(kLogits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::sort(ids.begin(), ids.end(),
            [](int a, int b) { return kLogits[size_t(a)] > kLogits[size_t(b)]; });
  return ids;
}

/// Counts of kDraws draws of a sampler with `opts`.
std::vector<int> draw(const SamplerOptions& opts) {
  Sampler s(opts);
  std::vector<int> n(kLogits.size(), 0);
  int out_of_range = 0;
  for (int d = 0; d < kDraws; ++d) {
    const int32_t id = s.sample(kLogits);
    if (id < 0 || size_t(id) >= kLogits.size())
      ++out_of_range;
    else
      ++n[size_t(id)];
  }
  CHECK(out_of_range == 0);
  return n;
}

/// Every id's count within 5 binomial standard deviations of kDraws * p (a false alarm has
/// probability ~6e-7 per id; the seed is fixed, so the outcome is too), ids with p = 0 never
/// drawn, and the mean id within 5 standard errors of its expectation.
void check_frequencies(const std::vector<int>& n, const std::vector<double>& p) {
  double mean = 0, want_mean = 0, want_var = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    CAPTURE(i);
    CAPTURE(p[i]);
    if (p[i] == 0) {
      CHECK(n[i] == 0);
      continue;
    }
    const double expect = kDraws * p[i], sd = std::sqrt(kDraws * p[i] * (1 - p[i]));
    CHECK(std::abs(n[i] - expect) <= 5 * sd + 1e-9);
    mean += double(i) * n[i] / kDraws;
    want_mean += double(i) * p[i];
  }
  for (size_t i = 0; i < p.size(); ++i)
    want_var += p[i] * (double(i) - want_mean) * (double(i) - want_mean);
  CHECK(std::abs(mean - want_mean) <= 5 * std::sqrt(want_var / kDraws));
}

} // namespace

TEST_CASE("sampler: frequencies follow softmax(logits / temperature)") {
  const std::vector<int> all = by_logit();
  for (float t : {1.0f, 0.5f, 1.7f}) {
    CAPTURE(t);
    check_frequencies(draw({.temperature = t, .seed = 11}), softmax_over(all, t));
  }
  // The temperature matters: at 0.5 the top id is drawn far more often than at 1.7.
  const auto cold = draw({.temperature = 0.5f, .seed = 1}),
             hot = draw({.temperature = 1.7f, .seed = 1});
  CHECK(cold[1] > hot[1] + kDraws / 10);
}

TEST_CASE("sampler: top-k keeps exactly the k most likely, renormalized") {
  const std::vector<int> order = by_logit();
  for (int k : {1, 3, 5}) {
    CAPTURE(k);
    const std::vector<int> keep(order.begin(), order.begin() + k);
    check_frequencies(draw({.temperature = 1.0f, .top_k = k, .seed = 5}), softmax_over(keep, 1.0));
  }
  // k larger than the vocabulary is no cut.
  check_frequencies(draw({.temperature = 1.0f, .top_k = 100, .seed = 5}), softmax_over(order, 1.0));
}

TEST_CASE("sampler: top-p keeps the smallest prefix reaching p, renormalized") {
  const std::vector<int> order = by_logit();
  const std::vector<double> full = softmax_over(order, 0.8);
  for (float top_p : {0.3f, 0.6f, 0.9f}) {
    CAPTURE(top_p);
    // The nucleus: most likely first, until the kept mass reaches top_p.
    std::vector<int> keep;
    double mass = 0;
    for (int i : order) {
      if (mass >= top_p)
        break;
      keep.push_back(i);
      mass += full[size_t(i)];
    }
    REQUIRE(keep.size() < order.size());
    check_frequencies(draw({.temperature = 0.8f, .top_p = top_p, .seed = 9}),
                      softmax_over(keep, 0.8));
  }
}

TEST_CASE("sampler: min-p drops candidates below min_p x the top probability") {
  const std::vector<int> order = by_logit();
  const std::vector<double> full = softmax_over(order, 1.0);
  const double top = full[size_t(order[0])];
  for (float min_p : {0.1f, 0.5f}) {
    CAPTURE(min_p);
    std::vector<int> keep;
    for (int i : order)
      if (full[size_t(i)] >= min_p * top)
        keep.push_back(i);
    REQUIRE(keep.size() < order.size());
    check_frequencies(draw({.temperature = 1.0f, .min_p = min_p, .seed = 21}),
                      softmax_over(keep, 1.0));
  }
  // min_p 1 leaves only the most likely id.
  const auto n = draw({.temperature = 1.0f, .min_p = 1.0f, .seed = 21});
  CHECK(n[size_t(order[0])] == kDraws);
}

TEST_CASE("sampler: the same seed draws the same sequence, another seed another") {
  auto sequence = [](uint64_t seed) {
    Sampler s({.temperature = 1.0f, .top_p = 0.95f, .seed = seed});
    std::vector<int32_t> ids;
    for (int i = 0; i < 1000; ++i)
      ids.push_back(s.sample(kLogits));
    return ids;
  };
  CHECK(sequence(42) == sequence(42));
  CHECK(sequence(42) != sequence(43));
}

TEST_CASE("sampler: temperature 0 is argmax, ties to the lowest id") {
  Sampler s({.temperature = 0.0f, .top_k = 3, .top_p = 0.5f, .seed = 7});
  for (int i = 0; i < 100; ++i)
    CHECK(s.sample(kLogits) == 1);
  const std::vector<float> tied = {0.5f, 3.0f, -1.0f, 3.0f};
  CHECK(s.sample(tied) == 1);
  CHECK(xserv::runtime::argmax(tied) == 1);
  CHECK(xserv::runtime::argmax(kLogits) == 1);
  // top_k 1 at any temperature is argmax too.
  Sampler k1({.temperature = 1.5f, .top_k = 1, .seed = 3});
  for (int i = 0; i < 100; ++i)
    CHECK(k1.sample(kLogits) == 1);
}

TEST_CASE("sampler: validate refuses out-of-range and NaN options, naming the field") {
  using xserv::runtime::validate;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK_NOTHROW(validate({}));
  CHECK_NOTHROW(validate({.temperature = 2.0f, .top_k = 40, .top_p = 1.0f, .min_p = 1.0f}));
  CHECK_NOTHROW(validate({.temperature = 0.7f, .top_p = 0.01f, .min_p = 0.0f}));
  CHECK_THROWS_WITH_AS(validate({.temperature = -0.1f}), doctest::Contains("temperature"),
                       xserv::Error);
  CHECK_THROWS_WITH_AS(validate({.temperature = 2.5f}), doctest::Contains("temperature"),
                       xserv::Error);
  CHECK_THROWS_WITH_AS(validate({.temperature = nan}), doctest::Contains("temperature"),
                       xserv::Error);
  CHECK_THROWS_WITH_AS(validate({.top_k = -1}), doctest::Contains("top_k"), xserv::Error);
  CHECK_THROWS_WITH_AS(validate({.top_p = 0.0f}), doctest::Contains("top_p"), xserv::Error);
  CHECK_THROWS_WITH_AS(validate({.top_p = 1.5f}), doctest::Contains("top_p"), xserv::Error);
  CHECK_THROWS_WITH_AS(validate({.top_p = nan}), doctest::Contains("top_p"), xserv::Error);
  CHECK_THROWS_WITH_AS(validate({.min_p = -0.1f}), doctest::Contains("min_p"), xserv::Error);
  CHECK_THROWS_WITH_AS(validate({.min_p = 1.1f}), doctest::Contains("min_p"), xserv::Error);
  CHECK_THROWS_WITH_AS(validate({.min_p = nan}), doctest::Contains("min_p"), xserv::Error);
}
