// The Engine's scheduler: which sequences a step runs and which tokens each brings, over the
// paged KV cache (engine/kv/kv_cache.h). It owns the waiting queue, the running sequences and
// their blocks; schedule() returns a plain record of one step that the engine hands to the
// model, commit() enters what the step wrote, and release() takes back a finished sequence's
// blocks (the shape of vLLM's v1 scheduler: schedule(), then the engine's update from the
// model's output).
//
// Admission and preemption go by blocks: a waiting request joins while the pools give the blocks
// of its first chunk (after its longest cached prefix); when a running sequence's next tokens
// find the pools dry, the most recently admitted sequence is preempted (its blocks go back, with
// their prefix-cache entries, and it waits at the front of the queue to be recomputed), so the
// oldest always goes on and no request fails for memory.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "engine/constraint.h"
#include "engine/kv/kv_cache.h"
#include "engine/request.h"
#include "engine/step_time.h"
#include "models/step.h"
#include "runtime/sampler.h"

namespace xserv::engine {

/// One choice of a request inside the engine: its own sampler, its tokens and KV blocks, and
/// how far its cache has come.
struct Sequence {
  RequestId id = 0;
  int choice = 0; ///< of the request's n
  Request req;
  runtime::Sampler sampler;
  std::vector<int32_t> tokens; ///< the prompt, then the generated ids
  size_t prompt_len = 0;
  size_t cached = 0;  ///< positions whose KV the blocks hold (tokens[0, cached))
  int64_t waited = 0; ///< steps spent waiting
  /// When Engine::add took its request, and the seconds until a step first admitted it (-1
  /// before).
  std::chrono::steady_clock::time_point added = std::chrono::steady_clock::now();
  double queue_s = -1;
  int64_t preemptions = 0;
  /// A request with n > 1 forks into its choices when its prompt is done; until then this one
  /// sequence holds their places.
  bool forked = false;
  kv::SeqBlocks blocks;
  /// Where its output stands in the request's constraint (structured output), if it has one.
  std::optional<ConstraintState> constraint;
  /// Request::prompt_logprobs: the prompt tokens' log-probabilities so far (token p + 1's from
  /// position p's row).
  std::vector<PromptLogprob> prompt_scores;

  Sequence(RequestId i, Request r, int c = 0);
  size_t generated() const { return tokens.size() - prompt_len; }
  /// Tokens still to compute: the prompt's, or a preempted sequence's whole history, or the
  /// last generated token in a decode.
  size_t pending() const { return tokens.size() - cached; }
  /// Sequences of the engine's running limit this one stands for (its choices, before a fork).
  int64_t slots() const { return forked ? 1 : std::max<int64_t>(req.n, 1); }
  /// Whether it still reads prompt positions' rows for prompt_logprobs: positions are then
  /// computed one a step (or in chunks, on a model that returns every token's row) until every
  /// prompt token but the first has its log-probability (or a token was generated: its choices
  /// inherit the scores). Positions scored before a preemption are recomputed as a chunk.
  bool scoring() const {
    return req.prompt_logprobs >= 0 && generated() == 0 && prompt_scores.size() + 1 < prompt_len;
  }
  /// Whether the row of position p, computed alone, gives the next prompt log-probability.
  bool scores_at(size_t p) const { return scoring() && p == prompt_scores.size(); }
  /// Its tokens come from its logits row (sampling, log-probabilities or logits asked for, logit
  /// adjustments, or a constraint that binds the next token: the pick is made over the ids it
  /// allows), not from the model's greedy pick alone.
  bool needs_logits() const {
    return req.sampling.temperature > 0 || req.top_logprobs >= 0 || req.return_logits ||
           req.adjust.any() || (constraint && constraint->bound());
  }
};

/// One step as the scheduler chose it.
struct ScheduledStep {
  models::StepInput input;     ///< the model's input: one entry per sequence
  std::vector<Sequence*> seqs; ///< the step's sequences, in the input's order
  /// Per sequence: the step reaches its last token (a token comes of it) and the token needs
  /// the logits row.
  std::vector<bool> need_logits;
  int64_t prompt_tokens = 0; ///< tokens of the step that are not decodes (prompts, recomputes)
  int64_t admitted = 0;      ///< requests that joined from the queue in this step, first time
  int64_t preempted = 0;     ///< sequences preempted to find blocks for this step
  /// The batch the step heads for (Scheduler::itl_budget's `heading`) under an ITL factor,
  /// else its decodes.
  int64_t itl_batch = 0;
  /// The ITL bound (ms) the step's prompts were held to, -1 for none (for the tail's count);
  /// unset in a step not made by Scheduler::schedule.
  std::optional<double> itl_bound;
  /// A sequence scores its prompt from this step's chunk: the step wants every token's row
  /// (Model::step_all).
  bool all_rows = false;
  bool empty() const { return seqs.empty(); }
  /// Whether sequence b's step ends at its last token (the model's row for it is a new token).
  bool yields(size_t b) const {
    return seqs[b]->cached + input.tokens[b].size() == seqs[b]->tokens.size();
  }
};

class Scheduler {
public:
  /// `options` as the Engine resolved them; `kv` is the model's paging. With `score_chunks` (a
  /// model whose steps can return every token's row: Model::all_rows) a prompt being scored
  /// goes in chunks like any other, else one position a step.
  Scheduler(const EngineOptions& options, const models::KvGeometry& kv, bool score_chunks = false);

  /// Queues a new sequence behind the waiting ones.
  void enqueue(std::unique_ptr<Sequence> s);
  /// Takes every choice of request `id` out (`choice` >= 0: that one only, or the request's one
  /// sequence before it forked), running (their blocks are free for this very step) or
  /// waiting; empty when it has none.
  std::vector<std::unique_ptr<Sequence>> remove(RequestId id, int choice = -1);
  /// The next step. Running sequences in admission order: a decode token of each whose history
  /// is cached (the budget never holds one back; one_token), then chunks of those still
  /// computing a prompt (or recomputing after a preemption) under the token budget (with decodes in
  /// the step, at most prefill_budget of them); then waiting requests in order, each from its
  /// longest cached prefix, while the running limit, the budget and the blocks last (a watermark of
  /// blocks kept free) and no sequence had to be preempted in this step. Waiting requests join only
  /// in groups of admit_batch, unless nothing runs or the oldest has waited max_admit_wait steps.
  ScheduledStep schedule();
  /// The step ran: every sequence of it has its new tokens' KV in its blocks (its cached length
  /// moves on, full blocks enter the prefix cache).
  void commit(const ScheduledStep& s);
  /// The step did not run (the model threw): its block copies are made by the next step.
  void step_failed(const ScheduledStep& s);
  /// The step took `ms` (for EngineOptions::itl_target_ms's prompt budget).
  void observe_time(const ScheduledStep& s, double ms);
  /// Prompt tokens a step beside `decodes` decodes may take under itl_target_ms, or
  /// itl_factor times the expected time alone of a reference batch: `heading` (the batch the
  /// step heads for: the running sequences and the queued ones the free blocks hold, up to
  /// max_running, at least `decodes`) or, where its power-of-two bucket has not run alone
  /// within StepTimeModel::kRefreshSteps steps, the largest batch down to the decodes' own
  /// that has. While prompts are being admitted, the decodes already running would otherwise
  /// hold them to a small batch's time and stretch the wave, though they decode at the full
  /// batch's pace a few steps later. 0 when the reference is the decodes' own bucket and it has
  /// not run alone within kRefreshSteps steps, so that this one does; -1 when off, during a
  /// cold start's wave (nothing from the heading batch down to the decodes ever timed alone:
  /// at most kWaveSteps steps in a row), while the prompt tokens' cost is not yet known, or
  /// while the decodes past their bound stay within EngineOptions::itl_tail (this step's
  /// included).
  int64_t itl_budget(int64_t decodes, int64_t heading = 0) const;
  /// The ITL bound of a step of `decodes` decodes (ms): itl_target_ms, or itl_factor times
  /// their expected time alone; -1 when off or while their bucket was never timed alone.
  double itl_bound_ms(int64_t decodes) const;
  /// Decodes of the steps observed, and of those that ran past their ITL bound, each step's
  /// weight kept kItlTailKeep a step after it (a memory of ~1,000 steps).
  double itl_samples() const { return itl_samples_; }
  double itl_over() const { return itl_over_; }
  static constexpr double kItlTailKeep = 1.0 - 1.0 / 1024;
  /// Steps in a row a cold start's wave may take its prompts without the bound (a wave of up
  /// to ~500k prompt tokens at 8,192 a step).
  static constexpr int64_t kWaveSteps = 64;
  const StepTimeModel& step_times() const { return step_times_; }
  /// The choices of `parent` (a request with n > 1 whose prompt the last step finished): n - 1
  /// new sequences sharing its blocks (a partly filled last block copied on write by the next
  /// step), running after it; a choice the pools have no blocks for waits at the front of the
  /// queue and recomputes. Returns them in choice order.
  std::vector<Sequence*> fork(Sequence& parent);
  /// A sequence that finished leaves (running, or a choice waiting for its first blocks); its
  /// blocks are free for the next step.
  void release(const Sequence* s);

  size_t running() const { return running_.size(); }
  size_t waiting() const { return waiting_.size(); }
  int64_t max_running() const { return options_.max_running; }
  const kv::KvCache& kv() const { return kv_; }
  int64_t preemptions() const { return preemptions_; }
  /// Forgets every block (the model's pools were cleared); nothing may be running.
  void clear_kv();

private:
  /// Preempts the most recently admitted running sequence (its blocks go back, it waits first
  /// in line to be recomputed); returns it.
  Sequence* preempt_newest();
  /// Places taken against max_running: running sequences and the choices of unforked ones.
  int64_t slots_in_use() const;
  /// Whether `s`, `cached` positions in, computes one token next, in a sub-step of one-token
  /// sequences: its decode, a prompt position it scores (Sequence::scoring), or a generated
  /// token it recomputes after a preemption. Up to
  /// replay_limit() such tokens (those past its cached blocks) are fed back one a step, through
  /// the same kernels as when they were first decoded, so that its next tokens come out as they
  /// would have without the preemption; more are recomputed as a prompt chunk.
  bool one_token(const Sequence& s, int64_t cached) const;
  int64_t replay_limit() const;
  /// The batch a step of `decodes` decodes heads for (itl_budget's `heading`): the running
  /// sequences (with their choices) and the queued ones the free blocks hold whole, less
  /// admission's watermark, up to max_running.
  int64_t heading(int64_t decodes) const;
  /// Free full blocks newcomers leave for the running decodes' next blocks (1%, at least one,
  /// while anything runs).
  int64_t admission_reserve() const;
  /// What itl_budget holds a step to: a bound in ms (-1: none), or a decode-only step to time
  /// the decodes' bucket, or a cold start's wave.
  struct ItlReference {
    double bound_ms = -1;
    bool time_decodes = false, wave = false;
  };
  ItlReference itl_reference(int64_t decodes, int64_t heading) const;
  int64_t budget_under(const ItlReference& r, int64_t decodes) const;
  /// The tokens of a chunk of `s` from `cached` within `budget`: to its end, or to its prompt's
  /// end when its generated tokens will be fed back one a step.
  int64_t chunk(const Sequence& s, int64_t cached, int64_t budget) const;

  EngineOptions options_;
  kv::KvCache kv_;
  std::deque<std::unique_ptr<Sequence>> waiting_;    ///< in order, no blocks
  std::vector<std::unique_ptr<Sequence>> running_;   ///< holding blocks, in admission order
  std::vector<models::StepInput::BlockCopy> copies_; ///< for the next step
  int64_t preemptions_ = 0;
  StepTimeModel step_times_;
  double itl_samples_ = 0, itl_over_ = 0; ///< see itl_samples(), itl_over()
  int64_t wave_steps_ = 0;                ///< steps in a row scheduled as a cold start's wave
  bool score_chunks_ = false;
};

} // namespace xserv::engine
