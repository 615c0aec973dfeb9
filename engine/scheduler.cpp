// The Scheduler: decodes first, then chunks under the token budget, admission and preemption by
// KV blocks, forks of n > 1 requests.
#include "engine/scheduler.h"

#include <algorithm>

#include <fmt/format.h>

#include "base/error.h"

namespace xserv::engine {

namespace {

/// The sampler of choice `c`: the request's options with seed + c (choice 0 keeps the seed), so
/// that n choices with a seed equal n requests with those seeds.
runtime::SamplerOptions choice_sampling(runtime::SamplerOptions o, int c) {
  o.seed += uint64_t(c);
  return o;
}

} // namespace

Sequence::Sequence(RequestId i, Request r, int c)
    : id(i), choice(c), req(std::move(r)), sampler(choice_sampling(req.sampling, c)) {
  tokens = req.prompt;
  prompt_len = req.prompt.size();
  forked = req.n <= 1;
  if (req.constraint)
    constraint.emplace(req.constraint);
}

Scheduler::Scheduler(const EngineOptions& options, const models::KvGeometry& kv, bool score_chunks)
    : options_(options), kv_(kv, options.prefix_caching), score_chunks_(score_chunks) {}

void Scheduler::enqueue(std::unique_ptr<Sequence> s) {
  waiting_.push_back(std::move(s));
}

std::vector<std::unique_ptr<Sequence>> Scheduler::remove(RequestId id, int choice) {
  std::vector<std::unique_ptr<Sequence>> out;
  // A request not forked yet is one sequence (choice 0) standing for all its choices.
  auto matches = [&](const Sequence& s) {
    return s.id == id && (choice < 0 || s.choice == choice || !s.forked);
  };
  for (auto it = running_.begin(); it != running_.end();)
    if (matches(**it)) {
      kv_.release((*it)->blocks);
      out.push_back(std::move(*it));
      it = running_.erase(it);
    } else {
      ++it;
    }
  for (auto it = waiting_.begin(); it != waiting_.end();)
    if (matches(**it)) {
      out.push_back(std::move(*it));
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a->choice < b->choice; });
  return out;
}

void Scheduler::release(const Sequence* s) {
  const auto it =
      std::find_if(running_.begin(), running_.end(), [&](auto& r) { return r.get() == s; });
  if (it != running_.end()) {
    kv_.release((*it)->blocks);
    running_.erase(it);
    return;
  }
  const auto w =
      std::find_if(waiting_.begin(), waiting_.end(), [&](auto& r) { return r.get() == s; });
  XSERV_CHECK(w != waiting_.end(), "release of a sequence the scheduler does not hold");
  waiting_.erase(w);
}

void Scheduler::clear_kv() {
  XSERV_CHECK(running_.empty(), "the KV cache cleared under running sequences");
  kv_.clear();
  copies_.clear();
}

int64_t Scheduler::slots_in_use() const {
  int64_t n = 0;
  for (const auto& s : running_)
    n += s->slots();
  return n;
}

int64_t Scheduler::replay_limit() const {
  return 2 * kv_.geometry().block_size;
}

bool Scheduler::one_token(const Sequence& s, int64_t cached) const {
  const auto size = int64_t(s.tokens.size()), prompt = int64_t(s.prompt_len);
  return size - cached == 1 || (cached >= prompt && size - cached <= replay_limit()) ||
         (s.scoring() && !score_chunks_ && cached == int64_t(s.prompt_scores.size()));
}

int64_t Scheduler::chunk(const Sequence& s, int64_t cached, int64_t budget) const {
  const auto size = int64_t(s.tokens.size()), prompt = int64_t(s.prompt_len);
  // Few generated tokens to recompute: the chunk stops at the prompt's end, and they are fed
  // back one a step after it.
  int64_t end = cached < prompt && size - prompt <= replay_limit() ? prompt : size;
  // Positions a scoring sequence scored before a preemption: a chunk up to the next it scores.
  if (s.scoring() && !score_chunks_)
    end = std::min(end, int64_t(s.prompt_scores.size()));
  return std::min(end - cached, budget);
}

Sequence* Scheduler::preempt_newest() {
  std::unique_ptr<Sequence> s = std::move(running_.back());
  running_.pop_back();
  kv_.release(s->blocks);
  s->cached = 0;
  s->waited = 0;
  ++s->preemptions;
  ++preemptions_;
  Sequence* p = s.get();
  waiting_.push_front(std::move(s));
  return p;
}

int64_t Scheduler::admission_reserve() const {
  return running_.empty() ? 0 : std::max<int64_t>(1, kv_.stats().blocks / 100);
}

int64_t Scheduler::heading(int64_t decodes) const {
  // The running sequences and those queued that the free blocks hold whole: where the pool, not
  // max_running, bounds the batch, a batch that cannot form would never be timed.
  int64_t n = decodes;
  for (const auto& s : running_)
    n += one_token(*s, int64_t(s->cached)) ? 0 : s->slots();
  const kv::KvStats pool = kv_.stats();
  int64_t free_blocks = pool.blocks - pool.blocks_used - admission_reserve();
  for (const auto& s : waiting_) {
    const int64_t need = kv_.geometry().blocks_for(int64_t(s->tokens.size())) + s->slots() - 1;
    if (need > free_blocks || n + s->slots() > options_.max_running) // as admission's room
      break;
    free_blocks -= need;
    n += s->slots();
  }
  return std::max(decodes, std::min(n, options_.max_running));
}

ScheduledStep Scheduler::schedule() {
  ScheduledStep out;
  out.input.copies = std::move(copies_);
  copies_.clear();
  struct Entry {
    Sequence* s;
    size_t n;
  };
  std::vector<Entry> decodes, chunks;
  int64_t ndecode = 0;
  for (const auto& s : running_)
    ndecode += one_token(*s, int64_t(s->cached)) ? 1 : 0;
  // The chunks' budget: what the decodes leave of the step's tokens, and with decodes in the
  // step at most prefill_budget, so that a decode step is not held up by a long prompt.
  int64_t budget = options_.max_tokens_per_step - ndecode;
  if (ndecode > 0 && options_.prefill_budget > 0) {
    int64_t allowed = options_.prefill_budget;
    if (options_.backlog_steps > 0) {
      int64_t backlog = 0;
      for (const auto& s : running_)
        if (!one_token(*s, int64_t(s->cached)))
          backlog += int64_t(s->pending());
      for (const auto& s : waiting_)
        backlog += int64_t(s->pending());
      allowed = std::max(allowed, backlog / options_.backlog_steps);
    }
    budget = std::min(budget, allowed);
  }
  // Under an ITL factor the bound is judged at the batch the decodes are heading for
  // (itl_budget); the bound used is recorded for the tail's count (observe_time).
  out.itl_batch =
      options_.itl_target_ms <= 0 && options_.itl_factor > 0 ? heading(ndecode) : ndecode;
  if (ndecode > 0) {
    const ItlReference ref = itl_reference(ndecode, out.itl_batch);
    wave_steps_ = ref.wave ? wave_steps_ + 1 : 0;
    out.itl_bound = ref.bound_ms;
    if (const int64_t itl = budget_under(ref, ndecode); itl >= 0)
      budget = std::min(budget, itl);
  }
  // 1-2. Running sequences in admission order; each finds its blocks, preempting the newest
  //      others when the pools are dry (the newest may be itself: it then waits).
  for (size_t i = 0; i < running_.size();) {
    Sequence& s = *running_[i];
    const bool decode = one_token(s, int64_t(s.cached));
    const int64_t want = decode ? 1 : chunk(s, int64_t(s.cached), budget);
    if (want <= 0) {
      ++i;
      continue;
    }
    int64_t n = kv_.fit(s.blocks, int64_t(s.cached), want);
    while (n == 0) {
      const Sequence* victim = preempt_newest();
      ++out.preempted;
      if (victim == &s)
        break;
      n = kv_.fit(s.blocks, int64_t(s.cached), want);
    }
    if (n == 0)
      break; // s itself went back to the queue, and it was the last running
    XSERV_CHECK(kv_.allocate(s.blocks, int64_t(s.cached), n), "blocks that fit() promised");
    (decode ? decodes : chunks).push_back({&s, size_t(n)});
    if (!decode)
      budget -= n;
    ++i;
  }
  // 3. Newcomers (and preempted sequences, first in line) join in groups of admit_batch (one
  //    prompt step then serves several), unless nothing runs or the oldest has waited
  //    max_admit_wait steps; never in a step that had to preempt.
  int64_t room = options_.max_running - slots_in_use();
  int64_t can_join = 0;
  for (size_t i = 0, r = size_t(std::max<int64_t>(room, 0)); i < waiting_.size(); ++i) {
    if (waiting_[i]->slots() > int64_t(r))
      break;
    r -= size_t(waiting_[i]->slots());
    ++can_join;
  }
  const bool join_now =
      out.preempted == 0 &&
      (can_join >= options_.admit_batch || running_.empty() ||
       (!waiting_.empty() && waiting_.front()->waited >= options_.max_admit_wait));
  for (auto& w : waiting_)
    ++w->waited;
  // A watermark of free blocks keeps newcomers from taking what running decodes need next.
  const int64_t reserve = admission_reserve();
  while (join_now && budget > 0 && !waiting_.empty() && waiting_.front()->slots() <= room) {
    Sequence& w = *waiting_.front();
    // A sequence scoring its prompt computes every position whose row it still reads: a hit
    // may cover only those scored already (before a preemption).
    const std::span<const int32_t> lookup =
        w.scoring() ? std::span<const int32_t>(w.tokens).first(w.prompt_scores.size() + 1)
                    : std::span<const int32_t>(w.tokens);
    const auto hit = kv_.match_prefix(w.blocks, lookup);
    const bool decode = one_token(w, hit);
    const int64_t want = decode ? 1 : chunk(w, hit, budget);
    const int64_t n = kv_.fit(w.blocks, hit, want, reserve);
    if (n <= 0) {
      kv_.release(w.blocks);
      break;
    }
    XSERV_CHECK(kv_.allocate(w.blocks, hit, n), "blocks that fit() promised");
    w.cached = size_t(hit);
    if (w.preemptions == 0 && w.generated() == 0)
      ++out.admitted;
    if (w.queue_s < 0)
      w.queue_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - w.added).count();
    room -= w.slots();
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    (decode ? decodes : chunks).push_back({running_.back().get(), size_t(n)});
    if (!decode || running_.back()->scoring()) // a scored position is a prompt token
      budget -= n;
  }
  // The step: decodes first (a sub-step of them alone can replay a decode graph), then chunks.
  for (const std::vector<Entry>* list : {&decodes, &chunks})
    for (const Entry& e : *list) {
      Sequence& s = *e.s;
      out.input.tokens.emplace_back(s.tokens.begin() + std::ptrdiff_t(s.cached),
                                    s.tokens.begin() + std::ptrdiff_t(s.cached + e.n));
      out.input.ctx_lens.push_back(static_cast<int32_t>(s.cached));
      out.input.block_tables.emplace_back();
      std::vector<int32_t> window;
      kv_.tables(s.blocks, int64_t(s.cached + e.n), out.input.block_tables.back(), window);
      if (kv_.geometry().window > 0)
        out.input.window_tables.push_back(std::move(window));
      out.seqs.push_back(&s);
      if (list == &chunks || (s.req.prompt_logprobs >= 0 && s.cached < s.prompt_len))
        out.prompt_tokens += int64_t(e.n);
      if (list == &chunks && s.scoring() && score_chunks_) // its chunk's rows score it
        out.all_rows = true;
    }
  // Logits rows only where a token comes of the step and the request samples or reports them,
  // or a scored prompt position's.
  out.need_logits.resize(out.seqs.size());
  for (size_t b = 0; b < out.seqs.size(); ++b)
    out.need_logits[b] = (out.yields(b) && out.seqs[b]->needs_logits()) ||
                         out.seqs[b]->scores_at(out.seqs[b]->cached);
  return out;
}

void Scheduler::commit(const ScheduledStep& s) {
  for (size_t b = 0; b < s.seqs.size(); ++b) {
    Sequence& q = *s.seqs[b];
    const auto n = int64_t(s.input.tokens[b].size());
    kv_.commit(q.blocks, q.tokens, int64_t(q.cached), n);
    q.cached += size_t(n);
  }
}

void Scheduler::step_failed(const ScheduledStep& s) {
  copies_.insert(copies_.begin(), s.input.copies.begin(), s.input.copies.end());
}

std::vector<Sequence*> Scheduler::fork(Sequence& parent) {
  XSERV_CHECK(!parent.forked, "a sequence forked twice");
  XSERV_CHECK(
      std::any_of(running_.begin(), running_.end(), [&](auto& r) { return r.get() == &parent; }),
      "fork of a sequence that is not running");
  parent.forked = true;
  std::vector<Sequence*> out;
  std::vector<std::unique_ptr<Sequence>> running, waiting;
  for (int c = 1; c < parent.req.n; ++c) {
    auto kid = std::make_unique<Sequence>(parent.id, parent.req, c);
    kid->forked = true;
    kid->tokens = parent.tokens;
    kid->prompt_len = parent.prompt_len;
    kid->prompt_scores = parent.prompt_scores;
    kid->added = parent.added;
    kid->queue_s = parent.queue_s;
    if (parent.constraint)
      kid->constraint = parent.constraint->fork();
    out.push_back(kid.get());
    if (kv_.fork(parent.blocks, int64_t(parent.cached), kid->blocks, copies_)) {
      kid->cached = parent.cached;
      running.push_back(std::move(kid));
    } else { // no blocks now: it recomputes from the prefix cache when its turn comes
      waiting.push_back(std::move(kid));
    }
  }
  // The choices are the newest running sequences: a dry pool preempts them before any older
  // request.
  for (auto& k : running)
    running_.push_back(std::move(k));
  waiting_.insert(waiting_.begin(), std::make_move_iterator(waiting.begin()),
                  std::make_move_iterator(waiting.end()));
  return out;
}

void Scheduler::observe_time(const ScheduledStep& s, double ms) {
  int64_t decodes = 0, tokens = 0;
  for (const auto& t : s.input.tokens) {
    decodes += t.size() == 1 ? 1 : 0;
    tokens += int64_t(t.size());
  }
  if (decodes > 0) { // the decodes' share of steps past the bound (before this one teaches it)
    // The bound the step was scheduled under (a step not from schedule(): its decodes' own).
    const double bound = s.itl_bound ? *s.itl_bound : itl_bound_ms(decodes);
    itl_samples_ = kItlTailKeep * itl_samples_ + double(decodes);
    itl_over_ = kItlTailKeep * itl_over_ + (bound > 0 && ms > bound ? double(decodes) : 0.0);
  }
  step_times_.observe(decodes, tokens - decodes, ms);
}

double Scheduler::itl_bound_ms(int64_t decodes) const {
  if (options_.itl_target_ms > 0)
    return options_.itl_target_ms;
  // A factor's bound needs this batch's own bucket timed alone (another bucket's time would
  // misjudge the timing step itself).
  if (options_.itl_factor > 0 && step_times_.decode_observed(decodes))
    return options_.itl_factor * step_times_.decode_ms(decodes);
  return -1;
}

Scheduler::ItlReference Scheduler::itl_reference(int64_t decodes, int64_t heading) const {
  ItlReference r;
  if (options_.itl_target_ms <= 0 && options_.itl_factor <= 0)
    return r;
  heading = std::max(heading, decodes);
  auto fresh = [&](int64_t n) {
    return step_times_.decode_observed(n) &&
           step_times_.decode_age(n) <= StepTimeModel::kRefreshSteps;
  };
  // A factor's reference: the largest batch from the heading one down to the decodes' own
  // whose bucket ran alone within kRefreshSteps steps, so that a wave joining running decodes
  // keeps them to a time measured, not guessed (a target's is the decodes' own: the heading
  // cannot move it).
  int64_t judged = options_.itl_target_ms > 0 ? decodes : heading;
  while (!StepTimeModel::same_bucket(judged, decodes) && !fresh(judged))
    judged = std::max(decodes, StepTimeModel::bucket_below(judged));
  if (StepTimeModel::same_bucket(judged, decodes) && !fresh(decodes)) {
    // A cold start's wave: the heading batch forming and nothing from it down to the decodes
    // ever timed alone; its prompts go without the bound for up to kWaveSteps steps (a batch
    // that never forms, as beside requests of one token, is then bounded as below).
    if (!step_times_.decode_observed(decodes) && !StepTimeModel::same_bucket(heading, decodes) &&
        wave_steps_ < kWaveSteps) {
      r.wave = true;
      return r;
    }
    // The decodes' own bucket never ran alone, or not for kRefreshSteps steps: this step runs
    // them alone and so measures it (a step in 512 at most). Without it a server whose prompts
    // never run out (a deep backlog) would never learn the bound, or keep a time from
    // shallower contexts.
    r.time_decodes = decodes > 0;
    return r;
  }
  r.bound_ms = itl_bound_ms(judged);
  return r;
}

int64_t Scheduler::budget_under(const ItlReference& r, int64_t decodes) const {
  if (r.time_decodes)
    return 0;
  if (r.bound_ms <= 0)
    return -1;
  // The tail: while the decodes of steps past the bound, this one's included, stay within
  // itl_tail of the decodes seen (counts that forget, so an idle stretch banks no burst), its
  // prompts go without the bound.
  if (options_.itl_tail > 0 &&
      itl_over_ + double(decodes) <= options_.itl_tail * (itl_samples_ + double(decodes)))
    return -1;
  return step_times_.prompt_budget(decodes, r.bound_ms, kv_.geometry().block_size);
}

int64_t Scheduler::itl_budget(int64_t decodes, int64_t heading) const {
  return budget_under(itl_reference(decodes, heading), decodes);
}

} // namespace xserv::engine
