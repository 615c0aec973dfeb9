// llama-bench's measurements of a Model: a prefill of P tokens, or N decode steps of B
// sequences, at a context depth, each step timed on the model's own timeline (its Stopwatch:
// CUDA events on its stream for the GPU) with random token ids, greedy steps and nothing but the
// model inside the timed region.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "engine/model.h"

namespace xserv::engine {

class ModelBench {
public:
  ModelBench(Model& m, uint64_t seed);
  ~ModelBench();

  /// Prompt tokens per second of one prefill step of `p` tokens after `depth` cached ones.
  double prefill(int64_t p, int64_t depth);
  /// Tokens per second of `n` decode steps of `batch` sequences at context `depth`; appends each
  /// step's milliseconds to `step_ms`. At depth 0 the first token of each sequence is a 1-token
  /// prefill, timed into `ttft_ms`.
  double decode(int64_t n, int64_t depth, int64_t batch, std::vector<double>& step_ms,
                double& ttft_ms);
  /// Decode tokens per second of `n` mixed steps: `batch` sequences decoding at context
  /// `depth`, and in the same step a prompt chunk of `prompt` tokens of one more sequence (at
  /// its own depth `depth`, new random ids each step): a continuous-batching step whose decodes
  /// share it with a prefill. Appends each step's milliseconds to `step_ms`.
  double mixed(int64_t n, int64_t depth, int64_t batch, int64_t prompt,
               std::vector<double>& step_ms);

private:
  std::vector<int32_t> random_ids(int64_t n);
  /// Prefills `depth` tokens into each of `batch` sequences, untimed, with blocks for `positions`
  /// more. Returns the step input continuing them with one token each.
  models::StepInput fill(int64_t depth, int64_t batch, int64_t positions);

  Model& e_;
  std::mt19937_64 rng_;
  std::unique_ptr<Stopwatch> each_; ///< around each timed step
};

} // namespace xserv::engine
