// The Engine: requests in, one step at a time through the scheduler and the model, tokens and
// finishes out.
//
// A step, in order:
//   1. Take in what other threads queued: new requests go to the back of the scheduler's
//      waiting queue, aborts end their request (running ones free their KV blocks for this very
//      step).
//   2. The scheduler picks the step's sequences and tokens (engine/scheduler.h: decodes first,
//      then prompt chunks under the token budget, newcomers while blocks last, preempting the
//      newest when the pools run dry).
//   3. One model step over all of them; the scheduler commits what it wrote (full blocks enter
//      the prefix cache). Sequences whose step reaches their last token get a token: the
//      model's greedy pick, or the request's own sampler over its logits row (only rows that
//      need logits bring them back). A request with n > 1 forks into its choices there.
//   4. Finishes: a stop id, max_tokens, or a sequence that filled max_seq; a logits row with a
//      NaN or an infinity ends its sequence alone with an error (no token); its blocks are free
//      for the next step.
#include "engine/engine.h"
#include "engine/worker_pool.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

namespace xserv::engine {

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

bool all_finite(const std::vector<float>& row) {
  return std::all_of(row.begin(), row.end(), [](float x) { return std::isfinite(x); });
}

/// The log-probability of `token` and the `n` most likely tokens (ties to the lower id) under
/// softmax(logits), into `logprob` and `top`.
void fill_logprobs(const std::vector<float>& logits, int32_t token, int n, float& logprob,
                   std::vector<TokenLogprob>& top_logprobs) {
  const float top = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float x : logits)
    sum += std::exp(double(x) - double(top));
  const double log_z = double(top) + std::log(sum);
  logprob = static_cast<float>(double(logits[size_t(token)]) - log_z);
  if (n <= 0)
    return;
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  const size_t k = std::min(ids.size(), size_t(n));
  std::partial_sort(ids.begin(), ids.begin() + std::ptrdiff_t(k), ids.end(),
                    [&](int32_t a, int32_t b) {
                      return logits[size_t(a)] > logits[size_t(b)] ||
                             (logits[size_t(a)] == logits[size_t(b)] && a < b);
                    });
  for (size_t i = 0; i < k; ++i)
    top_logprobs.push_back({ids[i], static_cast<float>(double(logits[size_t(ids[i])]) - log_z)});
}

} // namespace

std::string_view finish_name(FinishReason r) {
  switch (r) {
  case FinishReason::None:
    return "";
  case FinishReason::Stop:
    return "stop";
  case FinishReason::Length:
    return "length";
  case FinishReason::Abort:
    return "abort";
  case FinishReason::Error:
    return "error";
  }
  return "";
}

namespace {

/// `o` checked, with max_running within the model's batch and the budget raised to it.
EngineOptions resolved(EngineOptions o, int64_t rows) {
  XSERV_CHECK(rows >= 1, "a model with no batch");
  if (o.max_running <= 0 || o.max_running > rows)
    o.max_running = rows;
  if (o.prefill_budget < 0)
    throw Error(fmt::format("prefill_budget {} is negative", o.prefill_budget));
  if (!(o.itl_target_ms >= 0) || !std::isfinite(o.itl_target_ms))
    throw Error(fmt::format("itl_target_ms {} is not a non-negative number", o.itl_target_ms));
  if (!(o.itl_factor == 0 || o.itl_factor >= 1) || !std::isfinite(o.itl_factor))
    throw Error(fmt::format("itl_factor {} is neither 0 (off) nor at least 1", o.itl_factor));
  if (!(o.itl_tail >= 0 && o.itl_tail < 1))
    throw Error(fmt::format("itl_tail {} is not a fraction in [0, 1)", o.itl_tail));
  if (o.max_queue < 0)
    throw Error(fmt::format("max_queue {} is negative", o.max_queue));
  if (o.max_tokens_per_step < 1)
    throw Error(fmt::format("max_tokens_per_step {} is below 1", o.max_tokens_per_step));
  o.max_tokens_per_step = std::max(o.max_tokens_per_step, o.max_running);
  if (o.admit_batch < 1 || o.max_admit_wait < 0)
    throw Error(fmt::format("admit_batch {} must be >= 1 and max_admit_wait {} >= 0", o.admit_batch,
                            o.max_admit_wait));
  return o;
}

} // namespace

Engine::Engine(Model& model, EngineOptions options)
    : model_(model), options_(resolved(options, model.max_batch())),
      scheduler_(options_, model.kv_geometry(), model.all_rows()) {
  stats_.kv_rows = options_.max_running;
  model_.reset();
  refresh_stats();
}

Engine::~Engine() = default;

RequestId Engine::add(Request request) {
  const models::ModelConfig& cfg = model_.config();
  check_prompt(request.prompt, model_.max_seq(), cfg.vocab_size);
  if (request.max_tokens == 0 && request.prompt_logprobs >= 0) {
    if (request.prompt.size() < 2)
      throw Error("max_tokens 0 scores the prompt alone, which needs at least 2 tokens");
  } else if (request.max_tokens < 1) {
    throw Error(
        fmt::format("max_tokens {} is below 1 (0 only with prompt_logprobs)", request.max_tokens));
  }
  if (request.top_logprobs < -1 || request.top_logprobs > 20)
    throw Error(fmt::format("top_logprobs {} is outside [0, 20]", request.top_logprobs));
  if (request.prompt_logprobs < -1 || request.prompt_logprobs > 20)
    throw Error(fmt::format("prompt_logprobs {} is outside [0, 20]", request.prompt_logprobs));
  runtime::validate(request.sampling);
  check_adjustments(request.adjust, cfg.vocab_size);
  for (int32_t id : request.stop_ids)
    if (id < 0 || id >= cfg.vocab_size)
      throw Error(fmt::format("stop id {} is outside the vocabulary [0, {})", id, cfg.vocab_size));
  const int64_t most = std::min<int64_t>(kMaxChoices, options_.max_running);
  if (request.n < 1 || request.n > most)
    throw Error(fmt::format("n {} is outside [1, {}] (at most {} choices, and no more than the "
                            "engine runs at once, {})",
                            request.n, most, kMaxChoices, options_.max_running));
  std::lock_guard lock(mu_);
  if (stats_.waiting >= options_.max_queue)
    throw QueueFull(fmt::format("the queue is full ({} requests waiting)", stats_.waiting));
  const RequestId id = next_id_++;
  pending_.push_back({id, std::move(request), std::chrono::steady_clock::now()});
  ++stats_.waiting;
  work_.notify_all();
  return id;
}

void Engine::abort(RequestId id, int choice) {
  std::lock_guard lock(mu_);
  aborts_.emplace_back(id, choice);
  work_.notify_all();
}

bool Engine::idle() const {
  std::lock_guard lock(mu_);
  return pending_.empty() && aborts_.empty() && stats_.waiting == 0 && stats_.running == 0;
}

bool Engine::wait_for_work(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  return work_.wait_for(lock, timeout, [&] {
    return !pending_.empty() || !aborts_.empty() || stats_.waiting > 0 || stats_.running > 0;
  });
}

EngineStats Engine::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void Engine::refresh_stats() {
  const kv::KvStats kv = scheduler_.kv().stats();
  stats_.running = static_cast<int64_t>(scheduler_.running());
  stats_.kv_rows_in_use = stats_.running;
  stats_.waiting = static_cast<int64_t>(scheduler_.waiting() + pending_.size());
  stats_.kv_block_size = scheduler_.kv().geometry().block_size;
  stats_.kv_blocks = kv.blocks;
  stats_.kv_blocks_used = kv.blocks_used;
  stats_.kv_window_blocks = kv.window_blocks;
  stats_.kv_window_blocks_used = kv.window_blocks_used;
  stats_.kv_cached_free = kv.cached_free;
  stats_.prefix_queries = kv.prefix_queries;
  stats_.prefix_hits = kv.prefix_hits;
  stats_.prefix_evictions = kv.prefix_evictions;
  stats_.preemptions = scheduler_.preemptions();
}

void Engine::take_in(std::vector<Event>& events, int64_t& aborted_waiting,
                     int64_t& aborted_running) {
  std::vector<std::pair<RequestId, int>> aborts;
  {
    std::lock_guard lock(mu_);
    for (Pending& p : pending_) {
      auto seq = std::make_unique<Sequence>(p.id, std::move(p.req));
      seq->added = p.added; // its time in the queue counts from add()
      scheduler_.enqueue(std::move(seq));
    }
    pending_.clear();
    aborts.swap(aborts_);
  }
  for (const auto& [id, choice] : aborts) {
    const size_t running_before = scheduler_.running();
    const std::vector<std::unique_ptr<Sequence>> seqs = scheduler_.remove(id, choice);
    const auto was_running = int64_t(running_before - scheduler_.running());
    const size_t events_before = events.size();
    for (const auto& s : seqs) { // none: unknown, or finished already
      // A request not yet forked holds the places of all its choices: each gets its end.
      const int last = s->forked ? s->choice : static_cast<int>(std::max<int64_t>(s->req.n, 1)) - 1;
      for (int c = s->choice; c <= last; ++c) {
        Event ev;
        ev.id = s->id;
        ev.choice = c;
        ev.finish = FinishReason::Abort;
        ev.prompt_tokens = static_cast<int64_t>(s->prompt_len);
        ev.generated_tokens = static_cast<int64_t>(s->generated());
        events.push_back(std::move(ev));
      }
    }
    // Counted by choice: an unforked request's others count as waiting ones.
    aborted_running += was_running;
    aborted_waiting += int64_t(events.size() - events_before) - was_running;
  }
}

bool Engine::take_token(Sequence& q, int32_t greedy, const std::vector<float>& row, bool need,
                        bool masked, const std::vector<uint32_t>& mask, int64_t step_index,
                        std::vector<Event>& events, int64_t& generated, int64_t finished[3]) {
  const auto max_seq = static_cast<size_t>(model_.max_seq());
  Event ev;
  ev.id = q.id;
  ev.choice = q.choice;
  ev.prompt_tokens = static_cast<int64_t>(q.prompt_len);
  // A NaN or an infinity in the row the token comes from (the model's greedy pick says
  // kNonFinite when it saw one) makes any token garbage: the sequence ends here, the others
  // go on.
  if (greedy == kNonFinite || (need && !all_finite(row))) {
    ev.finish = FinishReason::Error;
    ev.generated_tokens = static_cast<int64_t>(q.generated());
    ev.error = fmt::format("non-finite logits (NaN or infinity) at engine step {}, position "
                           "{} of the sequence (generated token {}): the model's numbers "
                           "broke down, no token is sampled from them",
                           step_index, q.tokens.size() - 1, q.generated() + 1);
    ++finished[2];
    events.push_back(std::move(ev));
    return true;
  }
  // Structured output: the pick is made over the ids the constraint allows (the mask came from
  // the host while the model ran; a choice forked just now makes its own here). A masked
  // greedy pick came from the model (Model::step_masked); otherwise greedy takes the best
  // allowed id straight from the mask's bits, sampling draws from the masked row.
  const bool sampled = need && q.req.sampling.temperature > 0;
  int32_t tok = greedy;
  // logit_bias and penalties: the pick is made from the adjusted row (the greedy one too).
  std::vector<float> adjusted;
  const bool constrained = q.constraint && q.constraint->bound();
  if (need && q.req.adjust.any()) {
    adjusted = row;
    adjust_logits(q.req.adjust, q.tokens, q.prompt_len, adjusted);
    if (!sampled && !constrained) // else the sampler or the mask picks from it below
      tok = runtime::argmax(adjusted);
  }
  const std::vector<float>& pick = adjusted.empty() ? row : adjusted;
  if (masked && !sampled) {
    tok = greedy == kNoneAllowed ? -1 : greedy;
  } else if (constrained) {
    std::vector<uint32_t> own;
    std::span<const uint32_t> m = mask;
    if (mask.empty()) {
      own.assign(ConstraintState::mask_words(int64_t(row.size())), ~0u);
      q.constraint->fill_mask(own);
      m = own;
    }
    if (sampled) {
      std::vector<float> allowed = pick;
      tok = apply_mask(allowed, m) == 0 ? -1 : q.sampler.sample(allowed);
      if (tok >= 0 && std::isinf(allowed[size_t(tok)])) // a forbidden id has no weight
        tok = masked_argmax(pick, m);
    } else {
      tok = masked_argmax(pick, m);
    }
  } else if (sampled) {
    tok = q.sampler.sample(pick);
  }
  if (tok < 0) { // only a constraint leaves no token
    ev.finish = FinishReason::Error;
    ev.generated_tokens = static_cast<int64_t>(q.generated());
    ev.error = fmt::format("the output's constraint allows no token at generated token {}",
                           q.generated() + 1);
    ++finished[2];
    events.push_back(std::move(ev));
    return true;
  }
  const bool accepted = !q.constraint || q.constraint->accept(tok);
  XSERV_CHECK(accepted, fmt::format("token {} was picked against its constraint's mask", tok));
  q.tokens.push_back(tok);
  ++generated;
  ev.token = tok;
  ev.generated_tokens = static_cast<int64_t>(q.generated());
  if (q.req.top_logprobs >= 0)
    fill_logprobs(row, tok, q.req.top_logprobs, ev.logprob, ev.top_logprobs);
  if (q.generated() == 1) { // its first token: the prompt's log-probabilities, where asked for
    ev.prompt_logprobs = std::move(q.prompt_scores);
    ev.queue_s = q.queue_s;
  }
  if (q.req.return_logits)
    ev.logits = row;
  if (std::find(q.req.stop_ids.begin(), q.req.stop_ids.end(), tok) != q.req.stop_ids.end())
    ev.finish = FinishReason::Stop;
  else if (ev.generated_tokens >= q.req.max_tokens)
    ev.finish = FinishReason::Length;
  else if (q.tokens.size() > max_seq) { // no position left for the new token
    ev.finish = FinishReason::Length;
    ev.hit_max_seq = true;
  }
  if (ev.finish != FinishReason::None)
    ++finished[ev.finish == FinishReason::Stop ? 0 : 1];
  const bool done = ev.finish != FinishReason::None;
  events.push_back(std::move(ev));
  return done;
}

StepOutput Engine::all_rows_output(std::vector<std::vector<float>> rows,
                                   const models::StepInput& in, const std::vector<bool>& need) {
  StepOutput out;
  out.row_begin.resize(in.tokens.size());
  size_t r = 0;
  for (size_t b = 0; b < in.tokens.size(); ++b) {
    out.row_begin[b] = r;
    r += in.tokens[b].size();
  }
  XSERV_CHECK(rows.size() == r, "the model returned another number of rows than the step has "
                                "tokens");
  for (size_t b = 0; b < in.tokens.size(); ++b) {
    const std::vector<float>& last = rows[out.row_begin[b] + in.tokens[b].size() - 1];
    out.greedy.push_back(greedy_pick(last));
    out.logits.push_back(need[b] ? last : std::vector<float>{});
  }
  out.rows = std::move(rows);
  return out;
}

bool Engine::score_prompt(Sequence& q, const std::vector<float>& row, int64_t step_index,
                          std::vector<Event>& events, int64_t finished[3]) {
  const size_t p = q.prompt_scores.size(); // the position whose row this is
  // The request ends before its first token: an event for each of its choices (none forked).
  auto end_all = [&](FinishReason why, const std::string& error) {
    for (int c = 0; c < std::max(q.req.n, 1); ++c) {
      Event ev;
      ev.id = q.id;
      ev.choice = c;
      ev.prompt_tokens = static_cast<int64_t>(q.prompt_len);
      ev.finish = why;
      ev.error = error;
      if (why == FinishReason::Length)
        ev.prompt_logprobs = q.prompt_scores;
      ++finished[why == FinishReason::Error ? 2 : 1];
      events.push_back(std::move(ev));
    }
    return false;
  };
  if (!all_finite(row))
    return end_all(FinishReason::Error,
                   fmt::format("non-finite logits (NaN or infinity) at engine step {}, prompt "
                               "position {}: the model's numbers broke down, no log-probability "
                               "is taken from them",
                               step_index, p));
  PromptLogprob lp;
  lp.token = q.tokens[p + 1];
  fill_logprobs(row, lp.token, q.req.prompt_logprobs, lp.logprob, lp.top);
  q.prompt_scores.push_back(std::move(lp));
  if (q.req.max_tokens > 0 || q.scoring())
    return true;
  return end_all(FinishReason::Length, ""); // max_tokens 0: the scores are the answer
}

void Engine::update_from_output(const ScheduledStep& s, const std::vector<bool>& yields,
                                const std::vector<bool>& need, const std::vector<bool>& masked,
                                const StepOutput& out,
                                const std::vector<std::vector<uint32_t>>& masks, int64_t step_index,
                                std::vector<Event>& events, int64_t& generated,
                                int64_t finished[3]) {
  std::vector<const Sequence*> done;
  for (size_t b = 0; b < s.seqs.size(); ++b) {
    Sequence& q = *s.seqs[b];
    // Scored prompt positions: every row of the step's chunk, or the one row of a position
    // computed alone.
    bool alive = true;
    if (!out.rows.empty()) {
      const size_t n = s.input.tokens[b].size(), first = q.cached - n;
      for (size_t i = 0; i < n && alive; ++i)
        if (q.scores_at(first + i))
          alive = score_prompt(q, out.rows[out.row_begin[b] + i], step_index, events, finished);
    } else if (!yields[b] && need[b] && q.scores_at(q.cached - 1)) {
      alive = score_prompt(q, out.logits[b], step_index, events, finished);
    }
    if (!alive) {
      done.push_back(&q);
      continue;
    }
    if (!yields[b])
      continue; // a chunk short of the sequence's end, or a scored position: no token yet
    const std::vector<float>& row = out.logits[b];
    // A request's choices part here, at its first token, each drawing from the same row.
    std::vector<Sequence*> choices = {&q};
    if (!q.forked)
      for (Sequence* c : scheduler_.fork(q))
        choices.push_back(c);
    for (Sequence* c : choices)
      if (take_token(*c, out.greedy[b], row, need[b], masked[b], masks[b], step_index, events,
                     generated, finished))
        done.push_back(c);
  }
  for (const Sequence* q : done)
    scheduler_.release(q);
}

std::vector<Event> Engine::step() {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Event> events = std::move(undelivered_);
  undelivered_.clear();
  // 1. Newcomers and aborts.
  int64_t aborted_waiting = 0, aborted_running = 0;
  take_in(events, aborted_waiting, aborted_running);
  // 2. The step's sequences.
  const ScheduledStep sched = scheduler_.schedule();
  // 3-4. The model step, then tokens and finishes.
  double model_ms = 0;
  int64_t generated = 0;
  int64_t finished[3] = {0, 0, 0}; // stop, length, error
  int64_t step_index = 0;
  {
    std::lock_guard lock(mu_);
    step_index = stats_.steps;
  }
  if (!sched.empty()) {
    const auto tm = std::chrono::steady_clock::now();
    std::vector<bool> yields(sched.seqs.size());
    for (size_t b = 0; b < sched.seqs.size(); ++b)
      yields[b] = sched.yields(b);
    // The masks of the constrained sequences' next tokens, on the host while the model runs.
    std::vector<std::vector<uint32_t>> masks(sched.seqs.size());
    // Each sequence's state is its own: the pool's threads take them one at a time (a mask
    // costs from microseconds to milliseconds), and the model waits for them only to pick.
    std::vector<size_t> bound;
    for (size_t b = 0; b < sched.seqs.size(); ++b)
      if (yields[b] && sched.seqs[b]->constraint && sched.seqs[b]->constraint->bound())
        bound.push_back(b);
    bool masking = false;
    if (!bound.empty()) {
      if (!mask_pool_)
        mask_pool_ = std::make_unique<WorkerPool>(options_.mask_threads);
      const auto words = ConstraintState::mask_words(model_.config().vocab_size);
      mask_pool_->start(bound.size(), [&, words](size_t i) {
        masks[bound[i]].assign(words, ~0u);
        sched.seqs[bound[i]]->constraint->fill_mask(masks[bound[i]]);
      });
      masking = true;
    }
    const auto masks_done = [&] {
      if (masking) {
        masking = false;
        mask_pool_->wait();
      }
    };
    // A greedy constrained pick wants no logits row: the model picks over the mask (on the
    // device where it can, the mask going up instead of the row coming back).
    std::vector<bool> need = sched.need_logits, masked(sched.seqs.size());
    for (size_t b : bound) {
      const Request& r = sched.seqs[b]->req;
      if (r.sampling.temperature <= 0 && r.top_logprobs < 0 && !r.return_logits &&
          !r.adjust.any()) {
        masked[b] = true;
        need[b] = false;
      }
    }
    const MaskSource mask_source = [&]() -> const std::vector<std::vector<uint32_t>>& {
      masks_done();
      return masks;
    };
    StepOutput out;
    try {
      if (sched.all_rows) {
        // A prompt scored from its chunk: every token's row comes back, the picks are made on
        // the host from each sequence's last (a constrained one's over its mask, take_token).
        std::fill(masked.begin(), masked.end(), false);
        for (size_t b : bound)
          need[b] = true;
        out = all_rows_output(model_.step_all(sched.input), sched.input, need);
      } else {
        out = std::find(masked.begin(), masked.end(), true) != masked.end()
                  ? model_.step_masked(sched.input, need, masked, mask_source)
                  : model_.step_mixed(sched.input, need);
      }
    } catch (...) {
      try { // the masks' threads still read this step's sequences
        masks_done();
      } catch (...) {
      }
      // The step did not happen: every sequence keeps its state (the next step runs the same
      // tokens again, and makes its block copies); what this step took in and ended is
      // counted, and the error goes up.
      scheduler_.step_failed(sched);
      std::lock_guard lock(mu_);
      refresh_stats();
      stats_.finished_abort += aborted_running + aborted_waiting;
      undelivered_ = std::move(events); // the aborts' last events come with the next step
      throw;
    }
    model_ms = ms_since(tm);
    scheduler_.observe_time(sched, model_ms);
    XSERV_CHECK(out.greedy.size() == sched.seqs.size() && out.logits.size() == sched.seqs.size(),
                "the model returned another number of rows than the step has sequences");
    for (size_t b = 0; b < sched.seqs.size(); ++b)
      XSERV_CHECK(!need[b] || int64_t(out.logits[b].size()) == model_.config().vocab_size,
                  "the model returned a logits row of another size than the vocabulary");
    masks_done();
    scheduler_.commit(sched);
    update_from_output(sched, yields, need, masked, out, masks, step_index, events, generated,
                       finished);
  }

  std::lock_guard lock(mu_);
  refresh_stats();
  if (!sched.empty())
    ++stats_.steps;
  stats_.prompt_tokens += sched.prompt_tokens;
  stats_.generated_tokens += generated;
  stats_.finished_stop += finished[0];
  stats_.finished_length += finished[1];
  stats_.finished_abort += aborted_running + aborted_waiting;
  stats_.finished_error += finished[2];
  stats_.model_ms += model_ms;
  stats_.schedule_ms += ms_since(t0) - model_ms;
  last_prompt_tokens_ = sched.prompt_tokens;
  return events;
}

std::vector<Generation> generate(Model& model, const std::vector<Request>& requests,
                                 const EventCallback& on_event, EngineOptions options,
                                 GenerateStats* stats) {
  options.max_queue = std::max<int64_t>(options.max_queue, int64_t(requests.size()));
  for (size_t i = 0; i < requests.size(); ++i)
    if (requests[i].n != 1)
      throw Error(fmt::format("request {}: generate() runs one choice a request, n is {}", i,
                              requests[i].n));
  Engine engine(model, options);
  std::vector<RequestId> ids;
  for (size_t i = 0; i < requests.size(); ++i) {
    try {
      ids.push_back(engine.add(requests[i]));
    } catch (const Error& e) {
      if (requests.size() == 1)
        throw;
      throw Error(fmt::format("request {}: {}", i, e.what()));
    }
  }
  // Ids are handed out in order, so a request's index is its id's distance from the first.
  const RequestId first = ids.empty() ? 0 : ids.front();
  std::vector<Generation> out(requests.size());
  GenerateStats local;
  while (!engine.idle()) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<Event> events = engine.step();
    (engine.last_step_prompt_tokens() > 0 ? local.prompt_ms : local.decode_ms) += ms_since(t0);
    for (const Event& ev : events) {
      const size_t i = static_cast<size_t>(ev.id - first);
      Generation& g = out[i];
      if (ev.token >= 0)
        g.tokens.push_back(ev.token);
      if (ev.finish != FinishReason::None) {
        g.finish = ev.finish;
        g.hit_max_seq = ev.hit_max_seq;
        g.error = ev.error;
      }
      if (on_event && !on_event(i, ev) && ev.finish == FinishReason::None)
        engine.abort(ev.id);
    }
  }
  const EngineStats st = engine.stats();
  local.prompt_tokens = st.prompt_tokens;
  local.generated_tokens = st.generated_tokens;
  if (stats)
    *stats = local;
  return out;
}

void throw_if_failed(const std::vector<Generation>& gens) {
  for (size_t i = 0; i < gens.size(); ++i)
    if (gens[i].finish == FinishReason::Error)
      throw Error(gens.size() == 1 ? gens[i].error
                                   : fmt::format("request {}: {}", i, gens[i].error));
}

} // namespace xserv::engine
