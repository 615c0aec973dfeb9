// What the engine takes and gives back: a generation request, the events a step reports for it,
// and how the engine schedules requests.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/sampler.h"

namespace xserv::engine {

using RequestId = uint64_t;

/// How a request's tokens are drawn (temperature, top-p, top-k, min-p, seed): the runtime's
/// sampler options, part of the engine's API.
using SamplerOptions = runtime::SamplerOptions;

/// Why a request ended.
enum class FinishReason {
  None,   ///< still running
  Stop,   ///< it emitted one of its stop ids (the id is its last token)
  Length, ///< max_tokens generated, or its sequence reached the model's max_seq
  Abort,  ///< abort() was called, or its event callback asked to stop
  /// The model failed for this request alone: the logits row its next token would come from
  /// held a NaN or an infinity (Event::error says at which step and position). No token.
  Error,
};

/// "stop", "length", "abort", "error" ("" for None): the names OpenAI-style APIs use.
std::string_view finish_name(FinishReason r);

/// One generation request.
struct Request {
  std::vector<int32_t> prompt; ///< token ids: at least one, at most the model's max_seq
  int64_t max_tokens = 128;    ///< at most this many generated tokens (>= 1)
  SamplerOptions sampling;
  /// Generation ends after emitting one of these (the id is reported as the last token).
  std::vector<int32_t> stop_ids;
  /// -1: no log-probabilities; 0..20: each token's log-probability (of the sampled
  /// distribution's logits at temperature 1, as OpenAI reports them) and the `top_logprobs`
  /// most likely alternatives.
  int top_logprobs = -1;
  /// Every generated token's event carries the full logits row it was picked from.
  bool return_logits = false;
};

/// A candidate token and its log-probability.
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
};

/// What a step reports for one request: a new token, its end, or both.
struct Event {
  RequestId id = 0;
  int32_t token = -1; ///< the new token, or -1 when the request ended without one (abort)
  FinishReason finish = FinishReason::None; ///< set on the request's last event
  /// Length finishes: the sequence filled the model's max_seq (not max_tokens).
  bool hit_max_seq = false;
  int64_t prompt_tokens = 0;    ///< of the request
  int64_t generated_tokens = 0; ///< so far, this token included
  float logprob = 0;            ///< of `token` (top_logprobs >= 0)
  std::vector<TokenLogprob> top_logprobs;
  std::vector<float> logits; ///< return_logits: the row `token` was picked from
  std::string error;         ///< finish Error: what went wrong, naming the step and position
};

/// How an Engine schedules.
struct EngineOptions {
  /// Sequences running at once, each owning a KV-cache row; 0: the model's max_batch (and
  /// never more).
  int64_t max_running = 0;
  /// Requests waiting for a row; add() beyond this throws QueueFull.
  int64_t max_queue = 4096;
  /// Tokens per step: one decode token of each running sequence first, then prompt chunks in
  /// arrival order up to this budget (vLLM's max_num_batched_tokens). At least 1; raised to
  /// max_running, so that no running sequence ever waits for a step.
  int64_t max_tokens_per_step = 8192;
  /// Waiting requests join only when this many can join at once (free rows), so that one
  /// prompt step serves several of them, unless nothing is running or the oldest has waited
  /// max_admit_wait steps. 1: each joins as soon as a row is free (the lowest time to first
  /// token); larger trades time to first token for throughput.
  int64_t admit_batch = 1;
  int64_t max_admit_wait = 16;
};

} // namespace xserv::engine
