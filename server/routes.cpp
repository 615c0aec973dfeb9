// Routes: the API key, the phase checks and the routes of `xserv serve`; /health, /metrics and
// /v1/models.
#include "server/routes.h"

#include <ctime>

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <fmt/format.h>

#include "server/exchange.h"
#include "server/http_framing.h"

namespace xserv::server {

using openai::ApiError;
using openai::Json;

namespace {

enum class Route {
  None,
  Health,
  Metrics,
  Models,
  Chat,
  Responses,
  Completions,
  Tokenize,
  Detokenize
};

Route route_of(const std::string& method, const std::string& path) {
  if (method == "GET" || method == "HEAD") { // HEAD: the same answer without its body
    if (path == "/health")
      return Route::Health;
    if (path == "/metrics")
      return Route::Metrics;
    if (path == "/v1/models")
      return Route::Models;
  } else if (method == "POST") {
    if (path == "/v1/chat/completions")
      return Route::Chat;
    if (path == "/v1/responses")
      return Route::Responses;
    if (path == "/v1/completions")
      return Route::Completions;
    if (path == "/tokenize")
      return Route::Tokenize;
    if (path == "/detokenize")
      return Route::Detokenize;
  }
  return Route::None;
}

} // namespace

Routes::Routes(const ServeOptions& options, Lifecycle& life, Jobs& jobs, ServeLog& log, int threads)
    : options_(options), life_(life), jobs_(jobs), log_(log),
      pool_(std::make_unique<boost::asio::thread_pool>(static_cast<size_t>(std::max(1, threads)))),
      created_(static_cast<int64_t>(std::time(nullptr))) {}

Routes::~Routes() {
  join();
}

void Routes::attach(const models::Tokenizer& tok) {
  tok_ = std::make_unique<models::Tokenizer>(tok);
  api_ = std::make_unique<Api>(Api{options_, jobs_, *tok_, log_});
}

void Routes::join() {
  pool_->join();
}

std::optional<Reply> Routes::on_head(const HttpRequest& head) {
  const Route route = route_of(head.method, head.path);
  // /health is open (as vLLM's and llama-server's): a load balancer or supervisor probes it
  // without the key. /metrics is behind the key unless --metrics-public.
  const bool open = route == Route::Health || (route == Route::Metrics && options_.metrics_public);
  if (!open && !options_.api_key.empty() && !bearer_matches(head.authorization, options_.api_key))
    return error_reply(ApiError(401, "a valid API key is needed: Authorization: Bearer KEY", "",
                                "authentication_error", "invalid_api_key"));
  if (route == Route::None)
    return error_reply(
        ApiError(404, "no route " + head.method + " " + head.path, "", "not_found_error"));
  if (route == Route::Health || route == Route::Metrics || life_.ready())
    return std::nullopt;
  switch (life_.phase()) {
  case Lifecycle::Phase::Loading:
    return error_reply(ApiError(503, "the model is loading", "", "service_unavailable"));
  case Lifecycle::Phase::Broken:
    return error_reply(ApiError(503, "the model can serve no more: " + life_.broken(), "",
                                "service_unavailable", "model_broken"));
  default:
    return error_reply(ApiError(503, "the server is shutting down", "", "service_unavailable"));
  }
}

void Routes::on_request(HttpRequest request, std::function<void(Reply)> done) {
  if (request.method != "POST") { // cheap: answered here, never queued behind a body
    done(dispatch(request));
    return;
  }
  boost::asio::post(*pool_, [this, request = std::move(request), done = std::move(done)] {
    done(dispatch(request));
  });
}

Reply Routes::dispatch(const HttpRequest& req) const {
  try {
    const Route route = route_of(req.method, req.path);
    if (route == Route::Health)
      return health();
    if (route == Route::Metrics)
      return metrics();
    if (!api_ || !life_.ready()) // the phase changed since the header came
      return error_reply(ApiError(503,
                                  life_.phase() == Lifecycle::Phase::Broken
                                      ? "the model can serve no more: " + life_.broken()
                                      : std::string("the server is not serving"),
                                  "", "service_unavailable"));
    switch (route) {
    case Route::Models:
      return models();
    case Route::Chat:
      return handle_chat(*api_, req);
    case Route::Responses:
      return handle_responses(*api_, req);
    case Route::Completions:
      return handle_completion(*api_, req);
    case Route::Tokenize:
      return handle_tokenize(*api_, req);
    case Route::Detokenize:
      return handle_detokenize(*api_, req);
    default:
      return error_reply(
          ApiError(404, "no route " + req.method + " " + req.path, "", "not_found_error"));
    }
  } catch (const std::exception& e) {
    log_.line(std::string("[serve] internal error: ") + e.what());
    return error_reply(
        ApiError(500, std::string("internal error: ") + e.what(), "", "server_error"));
  }
}

Reply Routes::health() const {
  Json j = {{"status", life_.name()}};
  if (const std::string why = life_.broken(); !why.empty())
    j["reason"] = why;
  Reply r;
  r.status = life_.ready() ? 200 : 503;
  r.body = dump_json(j);
  return r;
}

Reply Routes::metrics() const {
  Reply r;
  r.content_type = "text/plain; version=0.0.4";
  r.body = jobs_.metrics().render(jobs_.stats());
  if (connections_) {
    const ConnectionStats c = connections_->stats();
    auto line = [&](const char* name, const char* type, const char* help, int64_t v) {
      r.body += fmt::format("# HELP xserv:{} {}\n# TYPE xserv:{} {}\nxserv:{} {}\n", name, help,
                            name, type, name, v);
    };
    line("http_connections", "gauge", "HTTP connections open.", c.open);
    line("http_connections_total", "counter", "HTTP connections accepted.", c.accepted);
    line("http_connections_refused_total", "counter",
         "HTTP connections refused with 503 over a connection cap.", c.refused);
    line("http_timeouts_total", "counter",
         "HTTP connections cut off by a header, body, idle or write deadline.", c.timed_out);
    line("http_malformed_requests_total", "counter",
         "HTTP requests refused by the parser or the framing checks.", c.malformed);
  }
  return r;
}

Reply Routes::models() const {
  Json m = {{"id", options_.model_name},
            {"object", "model"},
            {"created", created_},
            {"owned_by", "xserv"},
            {"max_model_len", api_->max_seq()}};
  Reply r;
  r.body = dump_json(Json{{"object", "list"}, {"data", Json::array({m})}});
  return r;
}

} // namespace xserv::server
