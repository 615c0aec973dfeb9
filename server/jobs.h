// The server's requests in the engine: the engine and its loop thread, each request's channel
// from the loop to its connection, submission, the drain's waits and aborts, and the broken
// model (every request answered 503 once the model can run no more steps).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "server/api_error.h"
#include "server/lifecycle.h"
#include "server/metrics.h"

namespace xserv::server {

using Clock = std::chrono::steady_clock;

/// The server's stderr lines (one at a time) and its ids.
class ServeLog {
public:
  explicit ServeLog(bool requests) : requests_(requests) {}
  void line(const std::string& text);
  /// Whether each request gets its line.
  bool requests() const { return requests_; }
  /// "PREFIX" followed by 24 random hex digits.
  std::string make_id(const std::string& prefix);

private:
  bool requests_;
  std::mutex mu_;
  std::mt19937_64 rng_{std::random_device{}()};
};

/// An engine event and when the loop thread handed it out.
struct TimedEvent {
  engine::Event event;
  Clock::time_point at;
};

/// The events of one request, from the loop thread to whoever waits for them.
class Channel {
public:
  /// An event; wakes the reader (once until it takes).
  void push(engine::Event ev, Clock::time_point at);
  /// The request ended without a finish event: the engine failed, or the model broke.
  void fail(openai::ApiError error);
  /// Called (from the loop thread) when there is something to take; set once, before taking.
  void set_wake(std::function<void()> wake);
  /// Moves what came into `out` (cleared first); the failure, when the request failed.
  std::optional<openai::ApiError> take(std::vector<TimedEvent>& out);

private:
  void wake(std::unique_lock<std::mutex>& lock);
  std::mutex mu_;
  std::vector<TimedEvent> events_;
  std::optional<openai::ApiError> error_;
  std::function<void()> wake_; ///< never changed once set
  bool woken_ = false;
};

class Jobs;

/// One request in the engine, seen from its connection: its events, timing and end (every one of
/// its n choices finished). Aborts the request when destroyed before it finished (its client
/// went away).
class Job {
public:
  Job(Jobs& jobs, engine::RequestId id, std::shared_ptr<Channel> ch, int64_t prompt_tokens,
      int choices, Clock::time_point arrival);
  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;
  void set_wake(std::function<void()> wake) { ch_->set_wake(std::move(wake)); }
  /// The events since the last call (`out` is cleared first), timing recorded; the request's
  /// failure (500: the engine failed; 503: the model broke) once it failed.
  std::optional<openai::ApiError> take(std::vector<TimedEvent>& out);
  /// Ends the request (every choice), or with `choice` >= 0 that choice alone.
  void abort(int choice = -1);
  /// Every choice has had its last event (or the request failed).
  bool finished() const { return finished_; }
  /// A choice ended with an abort nobody here asked for (the drain's grace ran out).
  bool cut_short() const { return cut_short_; }
  /// Records metrics and the request's log line; `finish` is the reason the client sees.
  void complete(const std::string& log_id, const std::string& finish);
  int64_t prompt_tokens() const { return prompt_tokens_; }
  /// Tokens generated over all choices (OpenAI's usage.completion_tokens).
  int64_t generated() const;
  int choices() const { return static_cast<int>(generated_.size()); }

private:
  Jobs& jobs_;
  engine::RequestId id_;
  std::shared_ptr<Channel> ch_;
  int64_t prompt_tokens_;
  std::vector<int64_t> generated_;    ///< per choice
  std::vector<char> ended_, aborted_; ///< per choice: had its last event; aborted from here
  int ended_count_ = 0;
  Clock::time_point arrival_, last_token_;
  RequestRecord record_;
  bool finished_ = false, completed_ = false, cut_short_ = false;
};

/// The engine, its loop thread (the one caller of Engine::step) and the channel of every
/// request in it. The loop checks Model::broken() between steps: once set, the server's phase
/// is Broken, every request in the engine fails with 503 and no step runs again.
class Jobs {
public:
  Jobs(ServeMetrics& metrics, Lifecycle& life, ServeLog& log);
  ~Jobs();
  Jobs(const Jobs&) = delete;
  Jobs& operator=(const Jobs&) = delete;

  /// Starts the engine over `model` (which must outlive this) and its loop thread.
  void start(engine::Model& model, const engine::EngineOptions& options);
  /// Queues `req`; throws ApiError 400 naming `param` (a request the engine refuses), 429 (the
  /// queue is full) or 503 (draining, broken).
  std::unique_ptr<Job> submit(engine::Request req, Clock::time_point arrival,
                              const std::string& param);
  /// The request (or its `choice` >= 0 alone) leaves the engine at its next step (its last
  /// event has finish Abort).
  void abort(engine::RequestId id, int choice = -1);
  /// Requests in the engine (submitted, not yet finished).
  size_t running() const;
  /// Waits until no request is in the engine or `deadline` passes; returns whether none is.
  bool wait_idle(Clock::time_point deadline);
  /// Aborts every request in the engine; returns how many.
  size_t abort_all();
  /// Stops the loop thread (after the drain).
  void stop();
  engine::EngineStats stats() const;
  /// The model (nullptr before start()).
  engine::Model* model() const { return model_; }
  ServeMetrics& metrics() { return metrics_; }
  ServeLog& log() { return log_; }

private:
  void loop();
  void deliver(std::vector<engine::Event>& events);
  /// Ends every request in the engine with `error`.
  void fail_all(const openai::ApiError& error);
  void break_down(const std::string& why);

  ServeMetrics& metrics_;
  Lifecycle& life_;
  ServeLog& log_;
  engine::Model* model_ = nullptr;
  std::unique_ptr<engine::Engine> engine_;
  std::thread loop_;
  std::atomic<bool> stop_{false};
  bool broken_ = false;   ///< the loop's: no step runs again
  mutable std::mutex mu_; ///< guards channels_; held across Engine::add so no event is missed
  std::condition_variable idle_cv_;
  struct Entry {
    std::shared_ptr<Channel> channel;
    int remaining = 1; ///< choices without their last event
  };
  std::map<engine::RequestId, Entry> channels_;
};

} // namespace xserv::server
