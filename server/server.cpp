// Server: the connections, the routes, the jobs and the lifecycle put together; the drain.
#include "server/server.h"

#include <fmt/format.h>

#include "server/jobs.h"
#include "server/lifecycle.h"
#include "server/metrics.h"
#include "server/routes.h"

namespace xserv::server {

/// Declared in the order they are needed: each part outlives the ones after it (the connections,
/// destroyed first, hold the routes' handlers; the routes and sessions hold jobs).
struct Server::Parts {
  explicit Parts(ServeOptions o)
      : options(std::move(o)), log(options.log_requests), jobs(metrics, life, log),
        routes(options, life, jobs, log, options.handler_threads),
        connections(options.connections, routes, options.io_threads) {
    routes.set_connections(&connections);
  }
  ServeOptions options;
  Lifecycle life;
  ServeLog log;
  ServeMetrics metrics;
  Jobs jobs;
  Routes routes;
  Connections connections;
  bool drained = false;
};

Server::Server(ServeOptions options) : p_(std::make_unique<Parts>(std::move(options))) {}

Server::~Server() {
  drain(std::chrono::milliseconds(0));
}

int Server::listen(const std::string& host, int port) {
  return p_->connections.listen(host, port);
}

void Server::attach(engine::Model& model, models::Tokenizer tokenizer) {
  p_->routes.attach(tokenizer);
  p_->jobs.start(model, p_->options.engine);
  p_->life.set_ready();
}

void Server::drain(std::chrono::milliseconds grace) {
  Parts& p = *p_;
  if (p.drained)
    return;
  p.drained = true;
  // 1. Nothing new: the listener closes, requests still arriving get 503, connections without
  //    a request in hand (idle, trickling a header or a body) close now.
  p.life.set_draining();
  p.connections.stop_accepting();
  p.connections.close_idle();
  // 2. Running requests get the grace period; the rest are aborted and end with 503.
  if (!p.jobs.wait_idle(Clock::now() + grace)) {
    const size_t n = p.jobs.abort_all();
    p.log.line(
        fmt::format("[serve] grace period over: aborting {} request{}", n, n == 1 ? "" : "s"));
  }
  // 3. Every response written (each write is bounded by the write deadline), then whatever is
  //    left is cut; the handler threads and the loop thread end.
  const auto limit = p.options.connections.write_timeout + std::chrono::seconds(1);
  if (!p.connections.wait_closed(Clock::now() + limit))
    p.log.line("[serve] closing the connections still writing");
  p.connections.stop();
  p.routes.join();
  p.jobs.stop();
}

std::string Server::broken() const {
  return p_->life.broken();
}

engine::EngineStats Server::stats() const {
  return p_->jobs.stats();
}

ConnectionStats Server::connection_stats() const {
  return p_->connections.stats();
}

} // namespace xserv::server
