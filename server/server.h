// The HTTP server of `xserv serve`: OpenAI-compatible endpoints over one continuous-batching
// Engine, on connections that no client can starve.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "models/tokenizer.h"
#include "server/http_connection.h"

namespace xserv::server {

/// How the server listens and what it accepts.
struct ServeOptions {
  std::string model_name = "gpt-oss"; ///< what /v1/models lists and requests must name
  /// Empty: no key. Else every route but /health (and /metrics with metrics_public) needs
  /// `Authorization: Bearer KEY`, the scheme in any case.
  std::string api_key;
  bool metrics_public = false;  ///< /metrics without the key
  int max_json_depth = 64;      ///< deeper request bodies get 400 before they are parsed
  ConnectionLimits connections; ///< deadlines, caps, header and body limits
  int io_threads = 2;           ///< threads serving the connections' reads and writes
  int handler_threads = 4;      ///< threads parsing and validating request bodies
  engine::EngineOptions engine;
  bool log_requests = true; ///< one line per request on stderr
};

/// An OpenAI-compatible server, in four parts with one job each: the connections (listener,
/// sessions, caps, deadlines), the routes (API key, phase checks, handler threads), the jobs
/// (the engine, its loop thread, each request's channel) and the lifecycle (loading, ready,
/// draining, broken). /health answers 503 until attach(), while draining and once the model is
/// broken.
class Server {
public:
  explicit Server(ServeOptions options);
  /// drain(0) if it was not drained.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Binds host:port (port 0: any free port) and starts accepting. Returns the port. Throws
  /// xserv::Error naming host and port when binding fails.
  int listen(const std::string& host, int port);
  /// Serves `model` from now on: starts the engine and its loop thread. The model must outlive
  /// the server.
  void attach(engine::Model& model, models::Tokenizer tokenizer);
  /// Stops accepting, closes the connections that have no request in hand (idle, or still
  /// sending a header or a body), lets running requests finish for up to `grace`, aborts the
  /// rest (they end with 503 "the server is shutting down") and returns once every response is
  /// written and every connection closed. Idempotent.
  void drain(std::chrono::milliseconds grace);
  /// Why the model can serve no more ("" while it can): a pipeline rank stopped. From then on
  /// /health answers 503 and every request 503; the caller decides to exit.
  std::string broken() const;
  /// The engine's counters (zeros before attach()).
  engine::EngineStats stats() const;
  /// The connections' counters.
  ConnectionStats connection_stats() const;

  struct Parts;

private:
  std::unique_ptr<Parts> p_;
};

} // namespace xserv::server
