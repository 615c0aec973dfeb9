// Internals shared by the server's files: the engine loop, request channels and jobs.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include <httplib.h>

#include "server/metrics.h"
#include "server/openai_request.h"
#include "server/server.h"

namespace xserv::server {

using Clock = std::chrono::steady_clock;

/// An engine event and when the loop thread handed it out.
struct TimedEvent {
  engine::Event event;
  Clock::time_point at;
};

/// The events of one request, from the loop thread to its handler thread.
struct Channel {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<TimedEvent> events;
  std::string error; ///< set when the engine failed: the request ends without a finish event
};

/// One request in the engine, seen from its handler: its events, timing and end. Aborts the
/// request when destroyed before it finished (a client that went away).
class Job {
public:
  Job(Server::State& st, engine::RequestId id, std::shared_ptr<Channel> ch, int64_t prompt_tokens,
      Clock::time_point arrival);
  ~Job();
  /// The next event, waiting up to `timeout`; nullopt on timeout. Throws openai::ApiError 500
  /// when the engine failed.
  std::optional<TimedEvent> next(std::chrono::milliseconds timeout);
  void abort();
  bool finished() const { return finished_; }
  /// Records metrics and the request's log line; `finish` is the reason the client sees.
  void complete(const std::string& log_id, const std::string& finish);
  int64_t prompt_tokens() const { return prompt_tokens_; }
  int64_t generated() const { return generated_; }

private:
  Server::State& st_;
  engine::RequestId id_;
  std::shared_ptr<Channel> ch_;
  int64_t prompt_tokens_, generated_ = 0;
  Clock::time_point arrival_, last_token_;
  RequestRecord record_;
  bool finished_ = false, completed_ = false;
};

struct Server::State {
  ServeOptions options;
  httplib::Server http;
  std::thread listen_thread;
  std::atomic<bool> ready{false}, draining{false};
  engine::Model* model = nullptr;
  std::optional<models::Tokenizer> tok;
  std::unique_ptr<engine::Engine> engine;
  std::thread loop_thread;
  std::atomic<bool> stop_loop{false};
  std::mutex registry_mu; ///< guards channels; held across Engine::add so no event is missed
  std::map<engine::RequestId, std::shared_ptr<Channel>> channels;
  ServeMetrics metrics;
  std::mutex misc_mu; ///< guards rng and log output
  std::mt19937_64 rng{std::random_device{}()};
  bool drained = false;
  std::atomic<int64_t> live_jobs{0}; ///< Jobs not yet destroyed (streams: until fully sent)
  int port = 0;                      ///< where listen() bound
  int64_t created = 0;               ///< Unix time the server was made (/v1/models)

  /// Queues `req`; throws ApiError 400 (a request the engine refuses) or 429 (queue full).
  std::unique_ptr<Job> submit(engine::Request req, Clock::time_point arrival,
                              const std::string& param);
  void engine_loop();
  /// "PREFIX" followed by 24 random hex digits.
  std::string make_id(const std::string& prefix);
  void log(const std::string& line);
  /// Throws ApiError 404 when `model` is neither empty nor the served name.
  void check_model(const std::string& model) const;
  int64_t max_seq() const { return model->max_seq(); }
};

/// The server-side socket of `req`'s connection (found by its peer address among this process's
/// descriptors), or -1. cpp-httplib 0.11 does not hand it out; a waiting non-streaming handler
/// uses it to notice a client that went away.
int find_client_socket(const Server::State& st, const httplib::Request& req);
/// True when the peer of `fd` closed its side (nothing left to read and end of stream).
bool peer_closed(int fd);

/// Routes of the completion endpoints (serve_chat.cpp) and the token endpoints.
void handle_chat(Server::State& st, const httplib::Request& req, httplib::Response& res);
void handle_responses(Server::State& st, const httplib::Request& req, httplib::Response& res);
void handle_completion(Server::State& st, const httplib::Request& req, httplib::Response& res);
void handle_tokenize(Server::State& st, const httplib::Request& req, httplib::Response& res);
void handle_detokenize(Server::State& st, const httplib::Request& req, httplib::Response& res);

/// JSON text that never throws on invalid UTF-8 (replaced by U+FFFD).
std::string dump_json(const openai::Json& j);
/// Sets `res` to the error's status and body.
void set_error(httplib::Response& res, const openai::ApiError& e);

} // namespace xserv::server
