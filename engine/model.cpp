// Model's default methods: greedy picks on the host, mixed steps, a host-clock stopwatch.
#include "engine/model.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include <fmt/format.h>

#include "base/error.h"
#include "engine/constraint.h"
#include "runtime/sampler.h"

namespace xserv::engine {

namespace {

class HostStopwatch : public Stopwatch {
public:
  explicit HostStopwatch(Model& m) : m_(m) {}
  void start() override {
    m_.synchronize();
    t0_ = std::chrono::steady_clock::now();
  }
  double stop() override {
    m_.synchronize();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_)
        .count();
  }

private:
  Model& m_;
  std::chrono::steady_clock::time_point t0_;
};

} // namespace

std::unique_ptr<Stopwatch> Model::stopwatch() {
  return std::make_unique<HostStopwatch>(*this);
}

int32_t greedy_pick(const std::vector<float>& row) {
  if (!std::all_of(row.begin(), row.end(), [](float x) { return std::isfinite(x); }))
    return kNonFinite;
  return runtime::argmax(row);
}

std::vector<std::vector<float>> Model::step_all(const models::StepInput&) {
  throw Error(fmt::format("the {} model returns no logits row for every token (compile with "
                          "--all-logits)",
                          backend()));
}

std::vector<int32_t> Model::step_greedy(const models::StepInput& in) {
  std::vector<int32_t> ids;
  for (const std::vector<float>& row : step(in))
    ids.push_back(greedy_pick(row));
  return ids;
}

StepOutput Model::step_mixed(const models::StepInput& in, const std::vector<bool>& need_logits) {
  XSERV_CHECK(need_logits.size() == in.tokens.size(), "step_mixed: one flag per sequence");
  StepOutput out;
  if (std::none_of(need_logits.begin(), need_logits.end(), [](bool b) { return b; })) {
    out.greedy = step_greedy(in);
    out.logits.resize(in.tokens.size());
    return out;
  }
  out.logits = step(in);
  for (size_t b = 0; b < out.logits.size(); ++b) {
    out.greedy.push_back(greedy_pick(out.logits[b]));
    if (!need_logits[b])
      out.logits[b].clear();
  }
  return out;
}

StepOutput Model::step_masked(const models::StepInput& in, const std::vector<bool>& need_logits,
                              const std::vector<bool>& masked, const MaskSource& masks) {
  XSERV_CHECK(masked.size() == in.tokens.size(), "step_masked: one flag per sequence");
  std::vector<bool> need = need_logits;
  for (size_t b = 0; b < need.size(); ++b)
    need[b] = need[b] || masked[b];
  StepOutput out = step_mixed(in, need);
  const std::vector<std::vector<uint32_t>>& m = masks();
  XSERV_CHECK(m.size() == in.tokens.size(), "step_masked: one mask per sequence");
  for (size_t b = 0; b < masked.size(); ++b) {
    if (!masked[b])
      continue;
    if (out.greedy[b] != kNonFinite) {
      const int32_t pick = masked_argmax(out.logits[b], m[b]);
      out.greedy[b] = pick < 0 ? kNoneAllowed : pick;
    }
    if (!need_logits[b])
      out.logits[b].clear();
  }
  return out;
}

void check_prompt(const std::vector<int32_t>& ids, int64_t max_seq, int64_t vocab) {
  if (ids.empty())
    throw Error("the prompt is empty");
  if (static_cast<int64_t>(ids.size()) > max_seq)
    throw Error(fmt::format("the prompt has {} tokens, more than the maximum sequence length "
                            "of {} (compile with a larger --max-seq)",
                            ids.size(), max_seq));
  for (int32_t id : ids)
    if (id < 0 || id >= vocab)
      throw Error(fmt::format("prompt token {} is outside the vocabulary [0, {})", id, vocab));
}

} // namespace xserv::engine
