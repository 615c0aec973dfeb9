// The min-p cut at temperatures other than 1: it applies to the tempered distribution.
//
// sampler_test.cpp checks min-p at temperature 1, where the tempered and the raw distributions
// are the same; a cut taken on the raw logits (the mutant sampler_min_p of scripts/mutants.sh)
// passed it. Which ids can be drawn at all is exact, so these cases count draws of ids that
// must never (or must sometimes) come out.
#include <doctest/doctest.h>

#include <array>

#include "runtime/sampler.h"

namespace {

/// How often each of the three ids comes out in `n` draws.
std::array<int, 3> draws(const std::array<float, 3>& logits, float temperature, float min_p,
                         int n) {
  xserv::runtime::Sampler s({.temperature = temperature, .min_p = min_p, .seed = 5});
  std::array<int, 3> count{0, 0, 0};
  for (int i = 0; i < n; ++i)
    ++count.at(static_cast<size_t>(s.sample(logits)));
  return count;
}

} // namespace

TEST_CASE("sampler: min-p cuts the tempered distribution, not the raw logits") {
  // Temperature 0.5: id 1 has exp((-1 - 0) / 0.5) = 0.135 of the top's probability, below
  // min_p 0.3, so it is never drawn (on the raw logits, exp(-1) = 0.37, it would be kept and
  // drawn about 12% of the time).
  const auto cold = draws({0.0f, -1.0f, -4.0f}, 0.5f, 0.3f, 10000);
  CHECK(cold[0] == 10000);
  CHECK(cold[1] == 0);
  // Temperature 2: id 1 has exp(-2 / 2) = 0.37 of the top's, above min_p 0.3, so it stays and
  // comes out about 27% of the time (on the raw logits, exp(-2) = 0.135, it would be cut); id 2,
  // exp(-4 / 2) = 0.135, is cut either way.
  const auto hot = draws({0.0f, -2.0f, -4.0f}, 2.0f, 0.3f, 10000);
  CHECK(hot[1] > 2000);
  CHECK(hot[1] < 3400);
  CHECK(hot[2] == 0);
}
