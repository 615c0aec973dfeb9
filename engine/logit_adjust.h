// A request's logit adjustments, as OpenAI's and vLLM's APIs define them: logit_bias, presence
// and frequency penalties over the generated tokens, and the repetition penalty (HF's rule)
// over the prompt and the output. Applied on the host to the step's logits row before the
// pick, greedy, sampled or constrained.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace xserv::engine {

struct LogitAdjustments {
  /// Added to these ids' logits (OpenAI: -100..100; -100 bans, 100 forces in practice).
  std::vector<std::pair<int32_t, float>> bias;
  /// Subtracted from the logit of every id generated so far (-2..2).
  float presence_penalty = 0;
  /// Times how often each id was generated so far, subtracted (-2..2).
  float frequency_penalty = 0;
  /// An id of the prompt or the output: a positive logit divided by it, a negative one
  /// multiplied (> 1 discourages repeats; 1: off).
  float repetition_penalty = 1;

  bool any() const {
    return !bias.empty() || presence_penalty != 0 || frequency_penalty != 0 ||
           repetition_penalty != 1;
  }
};

/// Throws xserv::Error naming the field and its range: a bias id outside [0, vocab) or a bias
/// outside [-100, 100], penalties outside [-2, 2], a repetition penalty outside (0, 10], NaNs.
void check_adjustments(const LogitAdjustments& a, int64_t vocab);

/// Applies `a` to `row` for a sequence whose ids so far are `tokens`, the first `prompt_len` of
/// them its prompt.
void adjust_logits(const LogitAdjustments& a, std::span<const int32_t> tokens, size_t prompt_len,
                   std::span<float> row);

} // namespace xserv::engine
