// The server's routes: which path goes to which handler, the API key and the phase checks made
// as soon as a request's header is in, and the handler threads that parse bodies.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "server/handlers.h"
#include "server/http_connection.h"
#include "server/lifecycle.h"

namespace boost::asio {
class thread_pool;
}

namespace xserv::server {

/// The HttpHandler of `xserv serve`. GET routes (/health, /metrics, /v1/models) answer on the
/// connection's own thread, so they never wait behind a body being parsed; the JSON endpoints
/// run on a small pool of handler threads (parsing, tokenizing, rendering) and reply with an
/// Exchange when they reach the engine.
class Routes : public HttpHandler {
public:
  Routes(const ServeOptions& options, Lifecycle& life, Jobs& jobs, ServeLog& log, int threads);
  ~Routes() override;

  /// The model is attached: the JSON endpoints can run.
  void attach(const models::Tokenizer& tok);
  /// The connections, for /metrics.
  void set_connections(const Connections* c) { connections_ = c; }
  /// Waits for the handler threads (after the connections are closed).
  void join();

  std::optional<Reply> on_head(const HttpRequest& head) override;
  void on_request(HttpRequest request, std::function<void(Reply)> done) override;

private:
  Reply health() const;
  Reply metrics() const;
  Reply models() const;
  Reply dispatch(const HttpRequest& req) const;

  const ServeOptions& options_;
  Lifecycle& life_;
  Jobs& jobs_;
  ServeLog& log_;
  const Connections* connections_ = nullptr;
  std::unique_ptr<models::Tokenizer> tok_;
  std::unique_ptr<Api> api_;
  std::unique_ptr<boost::asio::thread_pool> pool_;
  int64_t created_ = 0; ///< Unix time the server was made (/v1/models)
};

} // namespace xserv::server
