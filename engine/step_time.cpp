// StepTimeModel: decode-only times by bucket, and a weighted least-squares line through what
// prompt tokens added.
#include "engine/step_time.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace xserv::engine {

int StepTimeModel::bucket(int64_t decodes) {
  if (decodes <= 1)
    return 0;
  return std::min(int(std::bit_width(uint64_t(decodes - 1))), kBuckets - 1);
}

void StepTimeModel::observe(int64_t decodes, int64_t prompt_tokens, double ms) {
  if (!(ms >= 0) || !std::isfinite(ms) || decodes < 0 || prompt_tokens < 0 ||
      decodes + prompt_tokens == 0)
    return;
  ++steps_;
  if (prompt_tokens == 0) {
    const size_t b = size_t(bucket(decodes));
    decode_[b] = seen_at_[b] < 0 ? ms : (1 - kAlpha) * decode_[b] + kAlpha * ms;
    seen_at_[b] = steps_;
    return;
  }
  // What the prompt tokens added to a step of decodes: its time less theirs. A step of prompts
  // alone says nothing of that (its time holds the weight reads every step pays, which a
  // decode step's time already counts), and neither does one whose decodes' bucket was never
  // seen alone (another bucket's time would put the difference on the prompt).
  if (decodes == 0 || !decode_observed(decodes))
    return;
  const double base = decode_ms(decodes);
  const double p = double(prompt_tokens), e = std::max(0.0, ms - base);
  const double keep = 1 - kAlpha;
  s0_ = keep * s0_ + kAlpha;
  sp_ = keep * sp_ + kAlpha * p;
  spp_ = keep * spp_ + kAlpha * p * p;
  se_ = keep * se_ + kAlpha * e;
  spe_ = keep * spe_ + kAlpha * p * e;
  ++prompt_steps_;
}

double StepTimeModel::decode_ms(int64_t decodes) const {
  const int b = bucket(decodes);
  auto seen = [&](int i) { return i >= 0 && i < kBuckets && seen_at_[size_t(i)] >= 0; };
  if (seen(b))
    return decode_[size_t(b)];
  for (int d = 1; d < kBuckets; ++d) { // the nearest observed bucket, larger first
    if (seen(b + d))
      return decode_[size_t(b + d)];
    if (seen(b - d))
      return decode_[size_t(b - d)];
  }
  return -1;
}

int64_t StepTimeModel::decode_age(int64_t decodes) const {
  const int64_t at = seen_at_[size_t(bucket(decodes))];
  return at < 0 ? INT64_MAX : steps_ - at;
}

double StepTimeModel::prompt_token_ms() const {
  if (prompt_steps_ == 0 || sp_ <= 0)
    return 0;
  // Prompt sizes that barely vary (under 10% of their mean, as the budget's own chunks soon
  // do) say nothing of the slope: the mean cost a token then, all of it per token.
  if (!spread())
    return se_ / sp_;
  const double g = (s0_ * spe_ - sp_ * se_) / (s0_ * spp_ - sp_ * sp_);
  return g > 0 ? g : se_ / sp_;
}

bool StepTimeModel::spread() const {
  if (s0_ <= 0 || sp_ <= 0)
    return false;
  const double mean = sp_ / s0_, var = spp_ / s0_ - mean * mean;
  return var > 0 && std::sqrt(var) >= 0.1 * mean;
}

double StepTimeModel::prompt_fixed_ms() const {
  if (prompt_steps_ == 0 || s0_ <= 0 || !spread())
    return 0;
  return std::max(0.0, (se_ - prompt_token_ms() * sp_) / s0_);
}

int64_t StepTimeModel::prompt_budget(int64_t decodes, double target_ms, int64_t floor) const {
  const double base = decode_ms(decodes), g = prompt_token_ms();
  if (prompt_steps_ < kMinPromptSteps || base < 0 || g <= 0)
    return -1;
  const double room = target_ms - base - prompt_fixed_ms();
  if (room <= 0)
    return floor;
  // Rounded down, but not below a whole number the fit's rounding put a hair under.
  return std::max(floor, int64_t(std::floor(std::min(room / g * (1 + 1e-9), 1e9))));
}

} // namespace xserv::engine
