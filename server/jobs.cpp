// Jobs: the engine loop, submission, the request channels, the drain's aborts and the broken
// model.
#include "server/jobs.h"

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

namespace xserv::server {

using openai::ApiError;

void ServeLog::line(const std::string& text) {
  std::lock_guard<std::mutex> lock(mu_);
  std::fprintf(stderr, "%s\n", text.c_str());
  std::fflush(stderr);
}

std::string ServeLog::make_id(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(mu_);
  return fmt::format("{}{:016x}{:08x}", prefix, rng_(), uint32_t(rng_()));
}

void Channel::wake(std::unique_lock<std::mutex>& lock) {
  const bool call = wake_ && !woken_;
  woken_ = woken_ || call;
  lock.unlock();
  if (call)
    wake_(); // set once and never changed: safe to call outside the lock
}

void Channel::push(engine::Event ev, Clock::time_point at) {
  std::unique_lock<std::mutex> lock(mu_);
  events_.push_back({std::move(ev), at});
  wake(lock);
}

void Channel::fail(ApiError error) {
  std::unique_lock<std::mutex> lock(mu_);
  error_ = std::move(error);
  wake(lock);
}

void Channel::set_wake(std::function<void()> w) {
  std::unique_lock<std::mutex> lock(mu_);
  wake_ = std::move(w);
  if (!events_.empty() || error_)
    wake(lock);
}

std::optional<ApiError> Channel::take(std::vector<TimedEvent>& out) {
  out.clear();
  std::lock_guard<std::mutex> lock(mu_);
  woken_ = false;
  out.swap(events_); // both vectors keep their capacity: no allocation per token
  return error_;
}

Job::Job(Jobs& jobs, engine::RequestId id, std::shared_ptr<Channel> ch, int64_t prompt_tokens,
         int choices, Clock::time_point arrival)
    : jobs_(jobs), id_(id), ch_(std::move(ch)), prompt_tokens_(prompt_tokens),
      generated_(size_t(std::max(choices, 1)), 0), ended_(generated_.size(), 0),
      aborted_(generated_.size(), 0), arrival_(arrival), last_token_(arrival) {}

Job::~Job() {
  if (!finished_) { // the client went away before the end
    jobs_.abort(id_);
    jobs_.metrics().count_disconnect();
  }
  if (!completed_)
    complete("request " + std::to_string(id_), "abort");
}

void Job::abort(int choice) {
  for (size_t c = 0; c < aborted_.size(); ++c)
    if (choice < 0 || size_t(choice) == c)
      aborted_[c] = 1;
  jobs_.abort(id_, choice);
}

int64_t Job::generated() const {
  int64_t n = 0;
  for (int64_t g : generated_)
    n += g;
  return n;
}

std::optional<ApiError> Job::take(std::vector<TimedEvent>& out) {
  std::optional<ApiError> error = ch_->take(out);
  for (const TimedEvent& t : out) {
    const auto c = size_t(std::clamp(t.event.choice, 0, choices() - 1));
    if (t.event.token >= 0) {
      // Latencies follow the first choice (its tokens come one a step, as the others' do).
      if (c == 0) {
        const double dt = std::chrono::duration<double>(t.at - last_token_).count();
        if (record_.ttft_s < 0)
          record_.ttft_s = dt;
        else
          record_.itl_s.push_back(dt);
        if (t.event.queue_s >= 0)
          record_.queue_s = t.event.queue_s;
        last_token_ = t.at;
      }
      generated_[c] = t.event.generated_tokens;
    }
    if (t.event.finish != engine::FinishReason::None && !ended_[c]) {
      ended_[c] = 1;
      finished_ = ++ended_count_ == choices();
      if (t.event.finish == engine::FinishReason::Abort && !aborted_[c])
        cut_short_ = true;
    }
  }
  if (error)
    finished_ = true; // the loop thread ended it and dropped the channel
  return error;
}

void Job::complete(const std::string& log_id, const std::string& finish) {
  if (completed_)
    return;
  completed_ = true;
  record_.e2e_s = std::chrono::duration<double>(Clock::now() - arrival_).count();
  record_.prompt_tokens = prompt_tokens_;
  record_.generated_tokens = generated();
  record_.finish = finish;
  jobs_.metrics().record(record_);
  if (!jobs_.log().requests())
    return;
  const double gen_s =
      std::chrono::duration<double>(last_token_ - arrival_).count() - std::max(record_.ttft_s, 0.0);
  const int64_t first = generated_[0]; // the rate of one choice
  jobs_.log().line(fmt::format(
      "[serve] {} prompt {} output {}{} ttft {:.1f} ms {:.1f} tok/s finish {}", log_id,
      prompt_tokens_, generated(), choices() > 1 ? fmt::format(" ({} choices)", choices()) : "",
      std::max(record_.ttft_s, 0.0) * 1e3, first > 1 && gen_s > 0 ? double(first - 1) / gen_s : 0.0,
      finish));
}

Jobs::Jobs(ServeMetrics& metrics, Lifecycle& life, ServeLog& log)
    : metrics_(metrics), life_(life), log_(log) {}

Jobs::~Jobs() {
  stop();
}

void Jobs::start(engine::Model& model, const engine::EngineOptions& options) {
  model_ = &model;
  engine_ = std::make_unique<engine::Engine>(model, options);
  loop_ = std::thread([this] { loop(); });
}

std::unique_ptr<Job> Jobs::submit(engine::Request req, Clock::time_point arrival,
                                  const std::string& param) {
  switch (life_.phase()) {
  case Lifecycle::Phase::Ready:
    break;
  case Lifecycle::Phase::Broken:
    throw ApiError(503, "the model can serve no more: " + life_.broken(), "", "service_unavailable",
                   "model_broken");
  case Lifecycle::Phase::Loading:
    throw ApiError(503, "the model is loading", "", "service_unavailable");
  case Lifecycle::Phase::Draining:
    throw ApiError(503, "the server is shutting down", "", "service_unavailable");
  }
  const int64_t n = static_cast<int64_t>(req.prompt.size());
  const int64_t max_seq = model_->max_seq();
  if (n >= max_seq) {
    ApiError e(400,
               fmt::format("the prompt has {} tokens; the model's context (max-seq) is {} "
                           "tokens, so at most {} prompt tokens leave room for output",
                           n, max_seq, max_seq - 1),
               param, "invalid_request_error", "context_length_exceeded");
    e.details = {{"n_prompt_tokens", n}, {"n_ctx", max_seq}};
    throw e;
  }
  const int choices = std::max(req.n, 1);
  if (const int64_t most = std::min<int64_t>(engine::kMaxChoices, engine_->options().max_running);
      choices > most)
    throw ApiError(400,
                   fmt::format("n is {}; this server runs at most {} sequences at once "
                               "(--max-running), so n may be at most {}",
                               choices, engine_->options().max_running, most),
                   "n");
  auto ch = std::make_shared<Channel>();
  std::lock_guard<std::mutex> lock(mu_);
  engine::RequestId id = 0;
  try {
    id = engine_->add(std::move(req));
  } catch (const engine::QueueFull& e) {
    throw ApiError(429, std::string("the server is busy: ") + e.what(), "", "rate_limit_exceeded",
                   "queue_full");
  } catch (const Error& e) {
    throw ApiError(400, e.what(), param);
  }
  channels_[id] = Entry{ch, choices};
  return std::make_unique<Job>(*this, id, std::move(ch), n, choices, arrival);
}

void Jobs::abort(engine::RequestId id, int choice) {
  if (engine_)
    engine_->abort(id, choice);
}

size_t Jobs::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return channels_.size();
}

bool Jobs::wait_idle(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_cv_.wait_until(lock, deadline, [&] { return channels_.empty(); });
}

size_t Jobs::abort_all() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, ch] : channels_)
    engine_->abort(id);
  return channels_.size();
}

void Jobs::stop() {
  stop_ = true;
  idle_cv_.notify_all();
  if (loop_.joinable())
    loop_.join();
}

engine::EngineStats Jobs::stats() const {
  return engine_ ? engine_->stats() : engine::EngineStats{};
}

void Jobs::fail_all(const ApiError& error) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, entry] : channels_) {
    engine_->abort(id);
    entry.channel->fail(error);
  }
  channels_.clear();
  idle_cv_.notify_all();
}

void Jobs::break_down(const std::string& why) {
  if (life_.set_broken(why))
    log_.line(fmt::format("[serve] the model can serve no more: {}; /health answers 503 and "
                          "every request gets 503",
                          why));
  fail_all(ApiError(503, "the model can serve no more: " + why, "", "service_unavailable",
                    "model_broken"));
  broken_ = true;
}

void Jobs::loop() {
  while (!stop_) {
    if (broken_) { // no step runs again; requests are refused at submit()
      std::unique_lock<std::mutex> lock(mu_);
      idle_cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return stop_.load(); });
      continue;
    }
    const bool work = engine_->wait_for_work(std::chrono::milliseconds(50));
    // A pipeline rank can stop between steps: checked while idle too, so /health tells.
    if (std::string why = model_->broken(); !why.empty()) {
      break_down(why);
      continue;
    }
    if (!work)
      continue;
    std::vector<engine::Event> events;
    try {
      events = engine_->step();
    } catch (const std::exception& e) {
      if (std::string why = model_->broken(); !why.empty()) {
        break_down(why);
        continue;
      }
      log_.line(fmt::format("[serve] engine step failed: {}", e.what()));
      fail_all(ApiError(500, std::string("the engine failed: ") + e.what(), "", "server_error"));
      continue;
    }
    deliver(events);
  }
}

void Jobs::deliver(std::vector<engine::Event>& events) {
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  for (engine::Event& ev : events) {
    auto it = channels_.find(ev.id);
    if (it == channels_.end())
      continue;
    bool last = ev.finish != engine::FinishReason::None && --it->second.remaining == 0;
    if (ev.finish == engine::FinishReason::Error) { // this request alone: a 500 for it
      log_.line(fmt::format("[serve] request {} failed: {}", ev.id, ev.error));
      it->second.channel->fail(ApiError(500, "the engine failed: " + ev.error, "", "server_error"));
      engine_->abort(ev.id); // its other choices, if any
      last = true;
    } else {
      it->second.channel->push(std::move(ev), now);
    }
    if (last)
      channels_.erase(it);
  }
  if (channels_.empty())
    idle_cv_.notify_all();
}

} // namespace xserv::server
