// Logit adjustments: counts of the generated ids, then the penalties and the bias.
#include "engine/logit_adjust.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "base/error.h"

namespace xserv::engine {

void check_adjustments(const LogitAdjustments& a, int64_t vocab) {
  for (const auto& [id, b] : a.bias) {
    if (id < 0 || id >= vocab)
      throw Error(fmt::format("logit_bias: id {} is outside the vocabulary [0, {})", id, vocab));
    if (!(b >= -100 && b <= 100))
      throw Error(fmt::format("logit_bias: {} for id {} is outside [-100, 100]", b, id));
  }
  if (!(a.presence_penalty >= -2 && a.presence_penalty <= 2))
    throw Error(fmt::format("presence_penalty {} is outside [-2, 2]", a.presence_penalty));
  if (!(a.frequency_penalty >= -2 && a.frequency_penalty <= 2))
    throw Error(fmt::format("frequency_penalty {} is outside [-2, 2]", a.frequency_penalty));
  if (!(a.repetition_penalty > 0 && a.repetition_penalty <= 10))
    throw Error(fmt::format("repetition_penalty {} is outside (0, 10]", a.repetition_penalty));
}

void adjust_logits(const LogitAdjustments& a, std::span<const int32_t> tokens, size_t prompt_len,
                   std::span<float> row) {
  const auto in_row = [&](int32_t id) { return id >= 0 && size_t(id) < row.size(); };
  if (a.repetition_penalty != 1) {
    std::vector<int32_t> seen(tokens.begin(), tokens.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int32_t id : seen)
      if (in_row(id)) {
        float& x = row[size_t(id)];
        x = x > 0 ? x / a.repetition_penalty : x * a.repetition_penalty;
      }
  }
  if (a.presence_penalty != 0 || a.frequency_penalty != 0) {
    std::vector<int32_t> out(tokens.begin() + std::ptrdiff_t(std::min(prompt_len, tokens.size())),
                             tokens.end());
    std::sort(out.begin(), out.end());
    for (size_t i = 0; i < out.size();) {
      size_t j = i;
      while (j < out.size() && out[j] == out[i])
        ++j;
      if (in_row(out[i]))
        row[size_t(out[i])] -= a.presence_penalty + a.frequency_penalty * float(j - i);
      i = j;
    }
  }
  for (const auto& [id, b] : a.bias)
    if (in_row(id))
      row[size_t(id)] += b;
}

} // namespace xserv::engine
