// Choosing the next token from logits: greedy, or temperature with top-k / top-p, seeded.
#pragma once

#include <cstdint>
#include <random>
#include <span>

namespace xserv::runtime {

struct SamplerOptions {
  float temperature = 0.0f; ///< 0: greedy (argmax, lowest id on ties); at most 2
  int top_k = 0;            ///< 0: no top-k cut
  float top_p = 1.0f;       ///< in (0, 1]; 1: no nucleus cut
  /// In [0, 1]: drop candidates whose probability is below min_p times the most likely one's
  /// (after temperature); 0: no cut.
  float min_p = 0.0f;
  uint64_t seed = 0;
};

/// Throws xserv::Error naming the field and its range for options a Sampler must not take:
/// temperature outside [0, 2], top_k < 0, top_p outside (0, 1], min_p outside [0, 1], or any
/// NaN.
void validate(const SamplerOptions& opts);

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
