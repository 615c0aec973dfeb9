// What the engine takes and gives back: a generation request, the events a step reports for it,
// and how the engine schedules requests.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/logit_adjust.h"
#include "runtime/sampler.h"

namespace xserv::engine {

using RequestId = uint64_t;

class Constraint; // engine/constraint.h

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
  /// At most this many generated tokens (>= 1; 0 with prompt_logprobs: the prompt's scores
  /// alone, the request ending once they are in).
  int64_t max_tokens = 128;
  SamplerOptions sampling;
  /// Generation ends after emitting one of these (the id is reported as the last token).
  std::vector<int32_t> stop_ids;
  /// -1: no log-probabilities; 0..20: each token's log-probability (of the sampled
  /// distribution's logits at temperature 1, as OpenAI reports them) and the `top_logprobs`
  /// most likely alternatives.
  int top_logprobs = -1;
  /// -1: none; 0..20: the log-probability of every prompt token after the first given the
  /// tokens before it (and that many most likely alternatives at each position), as an echoed
  /// completion reports them for lm-evaluation-harness's loglikelihood tasks. The prompt is
  /// then computed one token a step, each position's logits row coming back (about the speed
  /// of decoding), or in chunks on a model that returns every token's row (a plan compiled
  /// with --all-logits: Model::all_rows), and from a cached prefix only as far as it has
  /// scored (after a preemption).
  int prompt_logprobs = -1;
  /// Every generated token's event carries the full logits row it was picked from.
  bool return_logits = false;
  /// Choices generated from the prompt (1..kMaxChoices): the prompt is computed once and its
  /// KV blocks shared; choice c samples with seed + c. Each choice's events carry its index.
  int n = 1;
  /// Structured output (ConstraintCompiler::compile): each token is drawn from the tokens the
  /// constraint allows next, greedy and sampled alike. Null: free.
  std::shared_ptr<const Constraint> constraint;
  /// logit_bias and the penalties, applied to the logits row before the pick (which then comes
  /// back to the host every step); log-probabilities stay those of the model's own logits.
  LogitAdjustments adjust;
};

/// The most choices one request may ask for.
inline constexpr int kMaxChoices = 128;

/// A candidate token and its log-probability.
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
};

/// A prompt token's log-probability given the tokens before it, and the most likely tokens at
/// its position (Request::prompt_logprobs).
struct PromptLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::vector<TokenLogprob> top;
};

/// What a step reports for one request: a new token, its end, or both.
struct Event {
  RequestId id = 0;
  int choice = 0;     ///< of the request's n
  int32_t token = -1; ///< the new token, or -1 when the request ended without one (abort)
  FinishReason finish = FinishReason::None; ///< set on the request's last event
  /// Length finishes: the sequence filled the model's max_seq (not max_tokens).
  bool hit_max_seq = false;
  int64_t prompt_tokens = 0;    ///< of the request
  int64_t generated_tokens = 0; ///< so far, this token included
  float logprob = 0;            ///< of `token` (top_logprobs >= 0)
  std::vector<TokenLogprob> top_logprobs;
  std::vector<float> logits; ///< return_logits: the row `token` was picked from
  /// Request::prompt_logprobs >= 0, on each choice's first token: prompt tokens 1.. in order.
  std::vector<PromptLogprob> prompt_logprobs;
  std::string error;         ///< finish Error: what went wrong, naming the step and position
  /// On a choice's first token: seconds from Engine::add to the step that first admitted the
  /// request (its time in the queue); -1 on other events.
  double queue_s = -1;
};

/// How an Engine schedules.
struct EngineOptions {
  /// Sequences running at once (a request with n choices counts n); 0: the model's max_batch
  /// (and never more). How many fit is the KV pools' business: admission and preemption go by
  /// blocks.
  int64_t max_running = 0;
  /// Requests waiting; add() beyond this throws QueueFull.
  int64_t max_queue = 4096;
  /// Tokens per step: one decode token of each running sequence first, then prompt chunks in
  /// arrival order up to this budget (vLLM's max_num_batched_tokens). At least 1; raised to
  /// max_running, so that no running sequence ever waits for a step.
  int64_t max_tokens_per_step = 8192;
  /// With decode tokens in a step, its prompt tokens stop at this many (0: no limit but
  /// max_tokens_per_step), so that a running sequence's next token is not held up behind a long
  /// prompt chunk. Off by default: at 64 concurrent requests of 512 + 256 tokens a budget of 512
  /// (raised with the backlog) cost 9.7% of the output tok/s and raised both TTFT p99 and ITL
  /// p99 against none (H100, same call; docs/PERF.md "At scale").
  int64_t prefill_budget = 0;
  /// A deep backlog raises the budget: with decodes in the step, prompt tokens may go up to the
  /// backlog (prompt tokens of the waiting and still-prefilling sequences) over this many steps,
  /// so that a burst of requests is taken in within about that many steps rather than one
  /// budget a step, while a steady trickle of arrivals stays under prefill_budget. 0: a fixed
  /// budget.
  int64_t backlog_steps = 8;
  /// > 0: with decodes in a step, its prompt tokens stop where the step's expected time (learned
  /// from the steps run so far: engine/step_time.h) reaches this many milliseconds, at least a
  /// block's worth a step, so that the running sequences' inter-token latency stays near it;
  /// also within prefill_budget when that is set. 0: off.
  double itl_target_ms = 0;
  /// > 0 (and no itl_target_ms): the same with the target this many times the expected time
  /// alone of the batch the step heads for (its running sequences and the queued ones the
  /// pool holds: Scheduler::itl_budget), so that it follows the model, the GPU and the batch.
  /// 0: off.
  double itl_factor = 0;
  /// With an ITL bound (itl_target_ms or itl_factor): the share of decode tokens whose step may
  /// run past it. While the decodes of recent steps over their bound (Scheduler::itl_over, the
  /// last ~1,000 steps), with this step's, stay within that share of all recent decodes, the
  /// step's prompts go without the bound (prefill_budget and the token budget still hold): a
  /// burst of arrivals is taken in at full prompt speed while few sequences decode, and the
  /// inter-token latency up to about its 1 - itl_tail percentile keeps to the bound. 0: every
  /// step bounded.
  double itl_tail = 0;
  /// Waiting requests join only when this many can join at once (free places), so that one
  /// prompt step serves several of them, unless nothing is running or the oldest has waited
  /// max_admit_wait steps. 1: each joins as soon as it can (the lowest time to first token);
  /// larger trades time to first token for throughput.
  int64_t admit_batch = 1;
  int64_t max_admit_wait = 16;
  /// Full KV blocks are kept by content hash after their sequence leaves, and a new request
  /// starts from its longest cached prefix.
  bool prefix_caching = true;
  /// Threads computing the constrained sequences' token masks while a step runs (a mask takes
  /// from ~5 us to a few ms of xgrammar's parser); 0: one fewer than the machine's hardware
  /// threads. Started with the first constrained request.
  int mask_threads = 0;
};

} // namespace xserv::engine
