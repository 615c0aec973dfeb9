// The Engine's scheduler: which sequences a step runs and which tokens each brings. It owns the
// waiting queue, the running sequences and their KV-cache rows; schedule() returns a plain
// record of one step that the engine hands to the model, and release() takes back a finished
// sequence's row (the shape of vLLM's scheduler: schedule(), then the engine's update from the
// model's output).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "engine/request.h"
#include "models/step.h"
#include "runtime/sampler.h"

namespace xserv::engine {

/// A request inside the engine: its own sampler, its KV-cache row while running, and how far
/// it has come.
struct Sequence {
  RequestId id = 0;
  Request req;
  runtime::Sampler sampler;
  int32_t row = -1;   ///< KV-cache row while running
  size_t cached = 0;  ///< tokens in the row: prompt tokens, then generated ones fed back
  int64_t waited = 0; ///< steps spent waiting for a row
  std::vector<int32_t> generated;

  Sequence(RequestId i, Request r) : id(i), req(std::move(r)), sampler(req.sampling) {}
  bool in_prompt() const { return cached < req.prompt.size(); }
  /// Its tokens come from its logits row (sampling, log-probabilities or logits asked for),
  /// not from the model's greedy pick alone.
  bool needs_logits() const {
    return req.sampling.temperature > 0 || req.top_logprobs >= 0 || req.return_logits;
  }
};

/// One step as the scheduler chose it.
struct ScheduledStep {
  models::StepInput input;     ///< the model's input: one entry per sequence
  std::vector<Sequence*> seqs; ///< the step's sequences, in the input's order
  /// Per sequence: the step ends its prompt or decodes (a token comes of it) and the token
  /// needs the logits row.
  std::vector<bool> need_logits;
  int64_t prompt_tokens = 0; ///< prompt tokens in the step
  int64_t admitted = 0;      ///< waiting requests that joined in this step
  bool empty() const { return seqs.empty(); }
};

class Scheduler {
public:
  /// `options` as the Engine resolved them (max_running within the model's rows, the budget
  /// raised to max_running).
  explicit Scheduler(const EngineOptions& options);

  /// Queues a new sequence behind the waiting ones.
  void enqueue(std::unique_ptr<Sequence> s);
  /// Takes sequence `id` out, running (its row is free for this very step) or waiting; null
  /// when it is neither.
  std::unique_ptr<Sequence> remove(RequestId id);
  /// The next step, in order: a decode token of every running sequence whose prompt is cached
  /// (the budget never holds one back); prompt chunks of running sequences still in their
  /// prompt, in admission order; then waiting requests in arrival order, each taking the lowest
  /// free row, while fewer than max_running run and the step holds fewer than
  /// max_tokens_per_step tokens. Waiting requests join only in groups of admit_batch, unless
  /// nothing runs or the oldest has waited max_admit_wait steps.
  ScheduledStep schedule();
  /// A running sequence that finished leaves; its row is free for the next step.
  void release(RequestId id);

  size_t running() const { return running_.size(); }
  size_t waiting() const { return waiting_.size(); }
  int64_t rows() const { return options_.max_running; }

private:
  EngineOptions options_;
  std::deque<std::unique_ptr<Sequence>> waiting_;  ///< in arrival order, no row yet
  std::vector<std::unique_ptr<Sequence>> running_; ///< holding a row, in admission order
  std::vector<int32_t> free_rows_;                 ///< lowest on top
};

} // namespace xserv::engine
