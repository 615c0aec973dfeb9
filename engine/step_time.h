// How long a step takes, learned from the steps an engine runs, so that a target inter-token
// latency becomes a prompt budget: a step of D decodes and P prompt tokens is taken to cost
// decode(D) + f + g * P, where decode(D) is the recent time of steps of D decodes alone (by
// powers of two of D) and f, g are fitted, with exponential forgetting, to what prompt tokens
// added to steps of decodes (f = 0 and g the mean cost a token while prompt sizes vary less
// than 10%). Deterministic: a function of the observations only.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace xserv::engine {

class StepTimeModel {
public:
  /// A step of `decodes` one-token sequences and `prompt_tokens` other tokens took `ms`.
  void observe(int64_t decodes, int64_t prompt_tokens, double ms);
  /// The expected time of a step of `decodes` decodes alone: the observed bucket of `decodes`
  /// (powers of two), else the nearest observed one; -1 before any decode-only step.
  double decode_ms(int64_t decodes) const;
  /// Whether a step of decodes alone of `decodes`' own bucket was seen (decode_ms is then not
  /// another bucket's time).
  bool decode_observed(int64_t decodes) const {
    return seen_at_[std::size_t(bucket(decodes))] >= 0;
  }
  /// Steps observed since the last step of decodes alone of `decodes`' bucket (INT64_MAX:
  /// never): past kRefreshSteps its time is measured again (contexts grow, the batch moves
  /// within its bucket).
  int64_t decode_age(int64_t decodes) const;
  /// Whether batches of `a` and `b` decodes share a bucket (decode_ms's powers of two).
  static bool same_bucket(int64_t a, int64_t b) { return bucket(a) == bucket(b); }
  /// The largest batch of the bucket below that of `decodes` (0 below the first).
  static int64_t bucket_below(int64_t decodes) {
    const int b = bucket(decodes);
    return b == 0 ? 0 : int64_t(1) << (b - 1);
  }
  /// The prompt tokens a step with `decodes` decodes may take so that it stays within
  /// `target_ms`, at least `floor` (a prompt always makes progress); -1 while fewer than
  /// kMinPromptSteps steps of decodes and prompt tokens (after a decode-only one) were seen.
  int64_t prompt_budget(int64_t decodes, double target_ms, int64_t floor) const;
  /// The fitted fixed cost f and per-token cost g of prompt tokens (ms); g is 0 until known.
  double prompt_fixed_ms() const;
  double prompt_token_ms() const;

  static constexpr int kMinPromptSteps = 3;
  static constexpr int64_t kRefreshSteps = 512;
  /// Weight of the newest observation in the averages and the fit.
  static constexpr double kAlpha = 0.2;

private:
  static constexpr int kBuckets = 20; ///< 1, 2, 3-4, 5-8, ... decodes
  static int bucket(int64_t decodes);
  /// Whether the weighted prompt sizes vary enough (10% of their mean) to fit a slope.
  bool spread() const;
  std::array<double, kBuckets> decode_{};       ///< by bucket
  std::array<int64_t, kBuckets> seen_at_ = [] { ///< step of the bucket's last one; -1: never
    std::array<int64_t, kBuckets> a{};
    a.fill(-1);
    return a;
  }();
  int64_t steps_ = 0;                                   ///< observations so far
  double s0_ = 0, sp_ = 0, spp_ = 0, se_ = 0, spe_ = 0; ///< the weighted fit's sums
  int64_t prompt_steps_ = 0;
};

} // namespace xserv::engine
