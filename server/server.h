// The HTTP server of `xserv serve`: OpenAI-compatible endpoints over one continuous-batching
// Engine.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "models/tokenizer.h"

namespace xserv::server {

/// How the server listens and what it accepts.
struct ServeOptions {
  std::string model_name = "gpt-oss"; ///< what /v1/models lists and requests must name
  std::string api_key;                ///< empty: no key needed
  size_t max_body_bytes = 16u << 20;  ///< larger request bodies get 413
  /// HTTP worker threads; 0: 512 + max_running (docs/DESIGN.md, "HTTP server").
  int http_threads = 0;
  engine::EngineOptions engine;
  bool log_requests = true; ///< one line per request on stderr
};

/// An OpenAI-compatible server. Handler threads parse requests, add them to the engine and wait
/// on per-request channels; one loop thread calls Engine::step() and hands out the events.
/// /health answers 503 until attach() and while draining.
class Server {
public:
  explicit Server(ServeOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Binds host:port (port 0: any free port) and starts accepting on a background thread.
  /// Returns the port. Throws xserv::Error naming host and port when binding fails.
  int listen(const std::string& host, int port);
  /// Serves `model` from now on: starts the engine and its loop thread. The model must outlive
  /// the server (or the next drain()).
  void attach(engine::Model& model, models::Tokenizer tokenizer);
  /// Stops accepting, lets running requests finish for up to `grace`, aborts the rest and waits
  /// until every handler has returned. Idempotent.
  void drain(std::chrono::milliseconds grace);
  /// The engine's counters (zeros before attach()).
  engine::EngineStats stats() const;

  struct State;

private:
  std::unique_ptr<State> state_;
};

} // namespace xserv::server
