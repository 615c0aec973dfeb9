// The Scheduler: decodes first, then prompt chunks under the token budget, admission by rows.
#include "engine/scheduler.h"

#include <algorithm>
#include <functional>

namespace xserv::engine {

Scheduler::Scheduler(const EngineOptions& options) : options_(options) {
  // Rows are handed out lowest first; the stack keeps the lowest on top.
  for (int32_t r = static_cast<int32_t>(options_.max_running) - 1; r >= 0; --r)
    free_rows_.push_back(r);
}

void Scheduler::enqueue(std::unique_ptr<Sequence> s) {
  waiting_.push_back(std::move(s));
}

std::unique_ptr<Sequence> Scheduler::remove(RequestId id) {
  auto r = std::find_if(running_.begin(), running_.end(), [&](auto& s) { return s->id == id; });
  if (r != running_.end()) {
    std::unique_ptr<Sequence> s = std::move(*r);
    running_.erase(r);
    free_rows_.push_back(s->row);
    std::sort(free_rows_.begin(), free_rows_.end(), std::greater<>()); // lowest on top
    return s;
  }
  auto w = std::find_if(waiting_.begin(), waiting_.end(), [&](auto& s) { return s->id == id; });
  if (w == waiting_.end())
    return nullptr;
  std::unique_ptr<Sequence> s = std::move(*w);
  waiting_.erase(w);
  return s;
}

void Scheduler::release(RequestId id) {
  (void)remove(id);
}

ScheduledStep Scheduler::schedule() {
  ScheduledStep out;
  int64_t budget = options_.max_tokens_per_step;
  // 1. Decodes: one token of every running sequence whose prompt is cached.
  for (auto& s : running_)
    if (!s->in_prompt()) {
      out.input.tokens.push_back({s->generated.back()});
      out.input.ctx_lens.push_back(static_cast<int32_t>(s->cached));
      out.input.cache_rows.push_back(s->row);
      out.seqs.push_back(s.get());
      --budget;
    }
  auto add_chunk = [&](Sequence& s) {
    const size_t n = std::min<size_t>(s.req.prompt.size() - s.cached, size_t(budget));
    out.input.tokens.emplace_back(s.req.prompt.begin() + std::ptrdiff_t(s.cached),
                                  s.req.prompt.begin() + std::ptrdiff_t(s.cached + n));
    out.input.ctx_lens.push_back(static_cast<int32_t>(s.cached));
    out.input.cache_rows.push_back(s.row);
    out.seqs.push_back(&s);
    budget -= int64_t(n);
    out.prompt_tokens += int64_t(n);
  };
  // 2. Prompt chunks of running sequences, in admission order.
  for (auto& s : running_)
    if (s->in_prompt() && budget > 0)
      add_chunk(*s);
  // 3. Newcomers join in groups of admit_batch (one prompt step then serves several), unless
  //    nothing runs or the oldest has waited max_admit_wait steps.
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
    ++out.admitted;
    add_chunk(*running_.back());
  }
  // Logits rows only where a token comes of the step and the request samples or reports them.
  out.need_logits.resize(out.seqs.size());
  for (size_t b = 0; b < out.seqs.size(); ++b) {
    const Sequence& s = *out.seqs[b];
    const bool yields_token = s.cached + out.input.tokens[b].size() >= s.req.prompt.size();
    out.need_logits[b] = yields_token && s.needs_logits();
  }
  return out;
}

} // namespace xserv::engine
