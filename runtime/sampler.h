// Choosing the next token from logits: greedy, or temperature with top-k / top-p, seeded.
#pragma once

#include <cstdint>
#include <random>
#include <span>

namespace xserv::runtime {

struct SamplerOptions {
  float temperature = 0.0f; ///< 0: greedy (argmax, lowest id on ties)
  int top_k = 0;            ///< 0: no top-k cut
  float top_p = 1.0f;       ///< 1: no nucleus cut
  uint64_t seed = 0;
};

/// A per-sequence sampler; its random stream depends only on the seed and the draws so far.
class Sampler {
public:
  explicit Sampler(SamplerOptions opts);
  /// Picks a token id from `logits` (one row, vocabulary-sized).
  int32_t sample(std::span<const float> logits);
  const SamplerOptions& options() const { return opts_; }

private:
  SamplerOptions opts_;
  std::mt19937_64 rng_;
};

/// Argmax with ties broken towards the lower id.
int32_t argmax(std::span<const float> logits);

} // namespace xserv::runtime
