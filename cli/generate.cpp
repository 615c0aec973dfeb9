// generate(): prefill then decode over batches of sequences, with sampling and stop ids.
#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "cli/engine.h"
#include "ir/error.h"

namespace xserv::cli {

namespace {

class HostStopwatch : public Stopwatch {
public:
  explicit HostStopwatch(Engine& e) : e_(e) {}
  void start() override {
    e_.synchronize();
    t0_ = std::chrono::steady_clock::now();
  }
  double stop() override {
    e_.synchronize();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_)
        .count();
  }

private:
  Engine& e_;
  std::chrono::steady_clock::time_point t0_;
};

} // namespace

std::unique_ptr<Stopwatch> Engine::stopwatch() {
  return std::make_unique<HostStopwatch>(*this);
}

std::vector<int32_t> Engine::step_greedy(const models::StepInput& in) {
  std::vector<int32_t> ids;
  for (const std::vector<float>& row : step(in))
    ids.push_back(runtime::argmax(row));
  return ids;
}

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void run_batch(Engine& engine, const std::vector<GenRequest>& reqs, size_t first, size_t count,
               const TokenCallback& on_token, const LogitsCallback& on_logits,
               std::vector<GenResult>& results, GenStats& stats) {
  engine.reset();
  std::vector<runtime::Sampler> samplers;
  models::StepInput step;
  for (size_t i = 0; i < count; ++i) {
    const GenRequest& r = reqs[first + i];
    samplers.emplace_back(r.sampling);
    step.tokens.push_back(r.prompt);
    step.ctx_lens.push_back(0);
    step.cache_rows.push_back(static_cast<int32_t>(i));
    stats.prompt_tokens += static_cast<int64_t>(r.prompt.size());
  }
  std::vector<size_t> active(count); // request offsets still generating, in step order
  for (size_t i = 0; i < count; ++i)
    active[i] = i;
  std::vector<int32_t> ctx(count);
  for (size_t i = 0; i < count; ++i)
    ctx[i] = static_cast<int32_t>(reqs[first + i].prompt.size());

  // Greedy requests need no logits on the host (unless asked for): the engine may pick on the
  // device.
  const bool all_greedy =
      !on_logits && std::all_of(samplers.begin(), samplers.end(),
                                [](const auto& s) { return s.options().temperature <= 0.0f; });
  bool prefill = true;
  while (!active.empty()) {
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::vector<float>> logits;
    std::vector<int32_t> greedy;
    if (all_greedy)
      greedy = engine.step_greedy(step);
    else
      logits = engine.step(step);
    (prefill ? stats.prefill_ms : stats.decode_ms) += ms_since(t0);
    prefill = false;
    models::StepInput next;
    std::vector<size_t> still;
    for (size_t a = 0; a < active.size(); ++a) {
      const size_t i = active[a];
      const GenRequest& r = reqs[first + i];
      GenResult& out = results[first + i];
      if (on_logits)
        on_logits(first + i, logits[a]);
      const int32_t tok = all_greedy ? greedy[a] : samplers[i].sample(logits[a]);
      out.tokens.push_back(tok);
      ++stats.generated_tokens;
      bool go_on = !on_token || on_token(first + i, tok);
      if (std::find(r.stop_ids.begin(), r.stop_ids.end(), tok) != r.stop_ids.end()) {
        out.stopped = true;
        go_on = false;
      }
      if (static_cast<int64_t>(out.tokens.size()) >= r.max_tokens || ctx[i] + 1 > engine.max_seq())
        go_on = false;
      if (!go_on)
        continue;
      still.push_back(i);
      next.tokens.push_back({tok});
      next.ctx_lens.push_back(ctx[i]);
      next.cache_rows.push_back(static_cast<int32_t>(i));
      ctx[i] += 1;
    }
    active = std::move(still);
    step = std::move(next);
  }
}

} // namespace

void check_prompt(const std::vector<int32_t>& ids, int64_t max_seq, int64_t vocab) {
  if (static_cast<int64_t>(ids.size()) > max_seq)
    throw Error(fmt::format("the prompt has {} tokens, more than the maximum sequence length "
                            "of {} (compile with a larger --max-seq)",
                            ids.size(), max_seq));
  for (int32_t id : ids)
    if (id < 0 || id >= vocab)
      throw Error(fmt::format("prompt token {} is outside the vocabulary [0, {})", id, vocab));
}

std::vector<GenResult> generate(Engine& engine, const std::vector<GenRequest>& requests,
                                const TokenCallback& on_token, GenStats* stats,
                                const LogitsCallback& on_logits) {
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i].prompt.empty())
      throw Error(fmt::format("request {}: the prompt is empty", i));
    check_prompt(requests[i].prompt, engine.max_seq(), engine.config().vocab_size);
  }
  std::vector<GenResult> results(requests.size());
  GenStats local;
  const size_t batch = static_cast<size_t>(std::max<int64_t>(engine.max_batch(), 1));
  for (size_t first = 0; first < requests.size(); first += batch)
    run_batch(engine, requests, first, std::min(batch, requests.size() - first), on_token,
              on_logits, results, local);
  if (stats)
    *stats = local;
  return results;
}

} // namespace xserv::cli
