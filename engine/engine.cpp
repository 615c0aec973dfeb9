// The Engine's scheduler: requests in, one mixed step at a time, tokens and finishes out.
//
// A step, in order:
//   1. Take in what other threads queued: new requests go to the back of the waiting queue,
//      aborts end their request (running ones free their KV row for this very step).
//   2. Decode: every running sequence whose prompt is cached brings its last token (one each;
//      the budget never holds one back, so it is raised to max_running).
//   3. Prefill: sequences still in their prompt, in admission order, then waiting requests in
//      arrival order (each taking the lowest free row while fewer than max_running run), get
//      prompt chunks until the step holds max_tokens_per_step tokens. Waiting requests join
//      only in groups of admit_batch (or when nothing runs, or after max_admit_wait steps).
//   4. One model step over all of them. Sequences whose step ends at their prompt's end or that
//      decode get a token: the model's greedy pick, or the request's own sampler over its
//      logits row (only rows that need logits bring them back).
//   5. Finishes: a stop id, max_tokens, or a sequence that filled max_seq; a logits row with a
//      NaN or an infinity ends its request alone with an error (no token); the row is free for
//      the next step.
#include "engine/engine.h"

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
/// softmax(logits).
void fill_logprobs(const std::vector<float>& logits, int32_t token, int n, Event& ev) {
  const float top = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float x : logits)
    sum += std::exp(double(x) - double(top));
  const double log_z = double(top) + std::log(sum);
  ev.logprob = static_cast<float>(double(logits[size_t(token)]) - log_z);
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
    ev.top_logprobs.push_back({ids[i], static_cast<float>(double(logits[size_t(ids[i])]) - log_z)});
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

struct Engine::Sequence {
  RequestId id = 0;
  Request req;
  runtime::Sampler sampler;
  int32_t row = -1;   ///< KV-cache row while running
  size_t cached = 0;  ///< tokens in the row: prompt tokens, then generated ones fed back
  int64_t waited = 0; ///< steps spent waiting for a row
  std::vector<int32_t> generated;

  Sequence(RequestId i, Request r) : id(i), req(std::move(r)), sampler(req.sampling) {}
  bool in_prompt() const { return cached < req.prompt.size(); }
  bool needs_logits() const {
    return req.sampling.temperature > 0 || req.top_logprobs >= 0 || req.return_logits;
  }
};

Engine::Engine(Model& model, EngineOptions options) : model_(model), options_(options) {
  const int64_t rows = model_.max_batch();
  if (options_.max_running <= 0 || options_.max_running > rows)
    options_.max_running = rows;
  if (options_.max_queue < 0)
    throw Error(fmt::format("max_queue {} is negative", options_.max_queue));
  if (options_.max_tokens_per_step < 1)
    throw Error(fmt::format("max_tokens_per_step {} is below 1", options_.max_tokens_per_step));
  options_.max_tokens_per_step = std::max(options_.max_tokens_per_step, options_.max_running);
  if (options_.admit_batch < 1 || options_.max_admit_wait < 0)
    throw Error(fmt::format("admit_batch {} must be >= 1 and max_admit_wait {} >= 0",
                            options_.admit_batch, options_.max_admit_wait));
  // Rows are handed out lowest first; the stack keeps the lowest on top.
  for (int32_t r = static_cast<int32_t>(options_.max_running) - 1; r >= 0; --r)
    free_rows_.push_back(r);
  stats_.kv_rows = options_.max_running;
  model_.reset();
}

Engine::~Engine() = default;

RequestId Engine::add(Request request) {
  const models::ModelConfig& cfg = model_.config();
  check_prompt(request.prompt, model_.max_seq(), cfg.vocab_size);
  if (request.max_tokens < 1)
    throw Error(fmt::format("max_tokens {} is below 1", request.max_tokens));
  if (request.top_logprobs < -1 || request.top_logprobs > 20)
    throw Error(fmt::format("top_logprobs {} is outside [0, 20]", request.top_logprobs));
  runtime::validate(request.sampling);
  for (int32_t id : request.stop_ids)
    if (id < 0 || id >= cfg.vocab_size)
      throw Error(fmt::format("stop id {} is outside the vocabulary [0, {})", id, cfg.vocab_size));
  std::lock_guard lock(mu_);
  if (stats_.waiting >= options_.max_queue)
    throw QueueFull(fmt::format("the queue is full ({} requests waiting)", stats_.waiting));
  const RequestId id = next_id_++;
  pending_.emplace_back(id, std::move(request));
  ++stats_.waiting;
  work_.notify_all();
  return id;
}

void Engine::abort(RequestId id) {
  std::lock_guard lock(mu_);
  aborts_.push_back(id);
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

std::vector<Event> Engine::step() {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Event> events = std::move(undelivered_);
  undelivered_.clear();
  std::vector<RequestId> aborts;
  {
    std::lock_guard lock(mu_);
    for (auto& [id, req] : pending_)
      waiting_.push_back(std::make_unique<Sequence>(id, std::move(req)));
    pending_.clear();
    aborts.swap(aborts_);
  }
  // 1. Aborts: running requests free their row now; waiting ones leave the queue.
  int64_t aborted_waiting = 0, aborted_running = 0;
  for (RequestId id : aborts) {
    auto end_one = [&](const std::unique_ptr<Sequence>& s) {
      Event ev;
      ev.id = s->id;
      ev.finish = FinishReason::Abort;
      ev.prompt_tokens = static_cast<int64_t>(s->req.prompt.size());
      ev.generated_tokens = static_cast<int64_t>(s->generated.size());
      events.push_back(std::move(ev));
    };
    auto r = std::find_if(running_.begin(), running_.end(), [&](auto& s) { return s->id == id; });
    if (r != running_.end()) {
      end_one(*r);
      free_rows_.push_back((*r)->row);
      running_.erase(r);
      ++aborted_running;
      continue;
    }
    auto w = std::find_if(waiting_.begin(), waiting_.end(), [&](auto& s) { return s->id == id; });
    if (w != waiting_.end()) {
      end_one(*w);
      waiting_.erase(w);
      ++aborted_waiting;
    }
  }
  std::sort(free_rows_.begin(), free_rows_.end(), std::greater<>()); // lowest on top

  // 2-3. The step's sequences: decodes, then prompt chunks under the budget.
  models::StepInput in;
  std::vector<Sequence*> seqs; // the step's sequences, in the step's order
  int64_t budget = options_.max_tokens_per_step, prompt_tokens = 0;
  for (auto& s : running_)
    if (!s->in_prompt()) {
      in.tokens.push_back({s->generated.back()});
      in.ctx_lens.push_back(static_cast<int32_t>(s->cached));
      in.cache_rows.push_back(s->row);
      seqs.push_back(s.get());
      --budget;
    }
  auto add_chunk = [&](Sequence& s) {
    const size_t n = std::min<size_t>(s.req.prompt.size() - s.cached, size_t(budget));
    in.tokens.emplace_back(s.req.prompt.begin() + std::ptrdiff_t(s.cached),
                           s.req.prompt.begin() + std::ptrdiff_t(s.cached + n));
    in.ctx_lens.push_back(static_cast<int32_t>(s.cached));
    in.cache_rows.push_back(s.row);
    seqs.push_back(&s);
    budget -= int64_t(n);
    prompt_tokens += int64_t(n);
  };
  for (auto& s : running_)
    if (s->in_prompt() && budget > 0)
      add_chunk(*s);
  int64_t admitted = 0;
  // Newcomers join in groups of admit_batch (one prompt step then serves several), unless
  // nothing runs or the oldest has waited max_admit_wait steps.
  const int64_t can_join = std::min<int64_t>({int64_t(waiting_.size()), int64_t(free_rows_.size()),
                                              options_.max_running - int64_t(running_.size())});
  const bool join_now = can_join >= options_.admit_batch || running_.empty() ||
                        (!waiting_.empty() && waiting_.front()->waited >= options_.max_admit_wait);
  for (auto& w : waiting_)
    ++w->waited;
  while (join_now && budget > 0 && !waiting_.empty() && !free_rows_.empty() &&
         int64_t(running_.size()) < options_.max_running) {
    std::unique_ptr<Sequence> s = std::move(waiting_.front());
    waiting_.pop_front();
    s->row = free_rows_.back();
    free_rows_.pop_back();
    running_.push_back(std::move(s));
    ++admitted;
    add_chunk(*running_.back());
  }

  // 4. The model step: logits rows only where a request samples or reports them.
  double model_ms = 0;
  int64_t generated = 0;
  int64_t finished[4] = {0, 0, 0, 0}; // stop, length, abort, error
  int64_t step_index = 0;
  {
    std::lock_guard lock(mu_);
    step_index = stats_.steps;
  }
  if (!seqs.empty()) {
    std::vector<bool> need(seqs.size());
    for (size_t b = 0; b < seqs.size(); ++b) {
      const Sequence& s = *seqs[b];
      const bool samples = s.cached + in.tokens[b].size() >= s.req.prompt.size();
      need[b] = samples && s.needs_logits();
    }
    const auto tm = std::chrono::steady_clock::now();
    StepOutput out;
    try {
      out = model_.step_mixed(in, need);
    } catch (...) {
      // The step did not happen: every sequence keeps its state (the next step runs the same
      // tokens again); what this step took in and ended is counted, and the error goes up.
      std::lock_guard lock(mu_);
      stats_.waiting -= admitted + aborted_waiting;
      stats_.running = static_cast<int64_t>(running_.size());
      stats_.kv_rows_in_use = stats_.running;
      stats_.finished_abort += aborted_running + aborted_waiting;
      undelivered_ = std::move(events); // the aborts' last events come with the next step
      throw;
    }
    model_ms = ms_since(tm);
    XSERV_CHECK(out.greedy.size() == seqs.size() && out.logits.size() == seqs.size(),
                "the model returned another number of rows than the step has sequences");
    for (size_t b = 0; b < seqs.size(); ++b)
      XSERV_CHECK(!need[b] || int64_t(out.logits[b].size()) == model_.config().vocab_size,
                  "the model returned a logits row of another size than the vocabulary");

    // 5. Tokens and finishes.
    const auto max_seq = static_cast<size_t>(model_.max_seq());
    std::vector<RequestId> done;
    for (size_t b = 0; b < seqs.size(); ++b) {
      Sequence& s = *seqs[b];
      s.cached += in.tokens[b].size();
      if (s.in_prompt())
        continue; // a prompt chunk that does not end the prompt: no token yet
      const std::vector<float>& row = out.logits[b];
      Event ev;
      ev.id = s.id;
      ev.prompt_tokens = static_cast<int64_t>(s.req.prompt.size());
      // A NaN or an infinity in the row the token comes from (the model's greedy pick says
      // kNonFinite when it saw one) makes any token garbage: the request ends here, the others
      // go on.
      if (out.greedy[b] == kNonFinite || (need[b] && !all_finite(row))) {
        ev.finish = FinishReason::Error;
        ev.generated_tokens = static_cast<int64_t>(s.generated.size());
        ev.error = fmt::format("non-finite logits (NaN or infinity) at engine step {}, position "
                               "{} of the sequence (generated token {}): the model's numbers "
                               "broke down, no token is sampled from them",
                               step_index, s.cached - 1, s.generated.size() + 1);
        ++finished[3];
        done.push_back(s.id);
        events.push_back(std::move(ev));
        continue;
      }
      const int32_t tok =
          need[b] && s.req.sampling.temperature > 0 ? s.sampler.sample(row) : out.greedy[b];
      s.generated.push_back(tok);
      ++generated;
      ev.token = tok;
      ev.generated_tokens = static_cast<int64_t>(s.generated.size());
      if (s.req.top_logprobs >= 0)
        fill_logprobs(row, tok, s.req.top_logprobs, ev);
      if (s.req.return_logits)
        ev.logits = row;
      if (std::find(s.req.stop_ids.begin(), s.req.stop_ids.end(), tok) != s.req.stop_ids.end())
        ev.finish = FinishReason::Stop;
      else if (ev.generated_tokens >= s.req.max_tokens)
        ev.finish = FinishReason::Length;
      else if (s.cached + 1 > max_seq) { // no position left for the next token
        ev.finish = FinishReason::Length;
        ev.hit_max_seq = true;
      }
      if (ev.finish != FinishReason::None) {
        ++finished[ev.finish == FinishReason::Stop ? 0 : 1];
        done.push_back(s.id);
      }
      events.push_back(std::move(ev));
    }
    for (RequestId id : done) {
      auto r = std::find_if(running_.begin(), running_.end(), [&](auto& s) { return s->id == id; });
      free_rows_.push_back((*r)->row);
      running_.erase(r);
    }
  }
  finished[2] = aborted_running + aborted_waiting;

  std::lock_guard lock(mu_);
  stats_.waiting -= admitted + aborted_waiting;
  stats_.running = static_cast<int64_t>(running_.size());
  stats_.kv_rows_in_use = stats_.running;
  if (!seqs.empty())
    ++stats_.steps;
  stats_.prompt_tokens += prompt_tokens;
  stats_.generated_tokens += generated;
  stats_.finished_stop += finished[0];
  stats_.finished_length += finished[1];
  stats_.finished_abort += finished[2];
  stats_.finished_error += finished[3];
  stats_.model_ms += model_ms;
  stats_.schedule_ms += ms_since(t0) - model_ms;
  last_prompt_tokens_ = prompt_tokens;
  return events;
}

std::vector<Generation> generate(Model& model, const std::vector<Request>& requests,
                                 const EventCallback& on_event, EngineOptions options,
                                 GenerateStats* stats) {
  options.max_queue = std::max<int64_t>(options.max_queue, int64_t(requests.size()));
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
