// The server's machinery: routes, API key, errors, the engine loop, request channels, drain.
#include "server/state.h"

#include "server/http_framing.h"

#include <arpa/inet.h>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <netinet/in.h>
#include <sys/socket.h>

#include <fmt/format.h>

namespace xserv::server {

using openai::ApiError;
using openai::Json;

std::string dump_json(const Json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void set_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 429 || e.status == 503)
    res.set_header("Retry-After", "1"); // a step or two frees a row; clients back off and retry
  res.set_content(dump_json(openai::error_body(e)), "application/json");
}

int find_client_socket(const Server::State& st, const httplib::Request& req) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    int fd = -1;
    try {
      fd = std::stoi(entry.path().filename().string());
    } catch (const std::exception&) {
      continue;
    }
    sockaddr_storage peer{}, local{};
    socklen_t pn = sizeof peer, ln = sizeof local;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pn) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ln) != 0)
      continue;
    char addr[INET6_ADDRSTRLEN] = {};
    int peer_port = -1, local_port = -1;
    if (peer.ss_family == AF_INET && local.ss_family == AF_INET) {
      auto* p = reinterpret_cast<sockaddr_in*>(&peer);
      inet_ntop(AF_INET, &p->sin_addr, addr, sizeof addr);
      peer_port = ntohs(p->sin_port);
      local_port = ntohs(reinterpret_cast<sockaddr_in*>(&local)->sin_port);
    } else if (peer.ss_family == AF_INET6 && local.ss_family == AF_INET6) {
      auto* p = reinterpret_cast<sockaddr_in6*>(&peer);
      inet_ntop(AF_INET6, &p->sin6_addr, addr, sizeof addr);
      peer_port = ntohs(p->sin6_port);
      local_port = ntohs(reinterpret_cast<sockaddr_in6*>(&local)->sin6_port);
    } else {
      continue;
    }
    if (peer_port == req.remote_port && local_port == st.port && req.remote_addr == addr)
      return fd;
  }
  return -1;
}

bool peer_closed(int fd) {
  char c;
  return fd >= 0 && ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

Job::Job(Server::State& st, engine::RequestId id, std::shared_ptr<Channel> ch,
         int64_t prompt_tokens, Clock::time_point arrival)
    : st_(st), id_(id), ch_(std::move(ch)), prompt_tokens_(prompt_tokens), arrival_(arrival),
      last_token_(arrival) {
  ++st_.live_jobs;
}

Job::~Job() {
  if (!finished_) { // the stream's client went away (a failed write ends its handler)
    st_.engine->abort(id_);
    st_.metrics.count_disconnect();
  }
  if (!completed_)
    complete("request " + std::to_string(id_), "abort");
  --st_.live_jobs;
}

void Job::abort() {
  st_.engine->abort(id_);
}

std::optional<TimedEvent> Job::next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(ch_->mu);
  if (!ch_->cv.wait_for(lock, timeout, [&] { return !ch_->events.empty() || !ch_->error.empty(); }))
    return std::nullopt;
  if (ch_->events.empty()) {
    // The loop thread already ended it (a failed step aborts every request; non-finite logits
    // end this one) and dropped the channel.
    finished_ = true;
    const std::string error = ch_->error;
    lock.unlock();
    complete("request " + std::to_string(id_), "error");
    throw ApiError(500, "the engine failed: " + error, "", "server_error");
  }
  TimedEvent t = std::move(ch_->events.front());
  ch_->events.pop_front();
  lock.unlock();
  if (t.event.token >= 0) {
    const double dt = std::chrono::duration<double>(t.at - last_token_).count();
    if (record_.ttft_s < 0)
      record_.ttft_s = dt;
    else
      record_.itl_s.push_back(dt);
    last_token_ = t.at;
    generated_ = t.event.generated_tokens;
  }
  if (t.event.finish != engine::FinishReason::None)
    finished_ = true;
  return t;
}

void Job::complete(const std::string& log_id, const std::string& finish) {
  if (completed_)
    return;
  completed_ = true;
  record_.e2e_s = std::chrono::duration<double>(Clock::now() - arrival_).count();
  record_.prompt_tokens = prompt_tokens_;
  record_.generated_tokens = generated_;
  record_.finish = finish;
  st_.metrics.record(record_);
  if (!st_.options.log_requests)
    return;
  const double gen_s =
      std::chrono::duration<double>(last_token_ - arrival_).count() - std::max(record_.ttft_s, 0.0);
  st_.log(fmt::format("[serve] {} prompt {} output {} ttft {:.1f} ms {:.1f} tok/s finish {}",
                      log_id, prompt_tokens_, generated_, std::max(record_.ttft_s, 0.0) * 1e3,
                      generated_ > 1 && gen_s > 0 ? double(generated_ - 1) / gen_s : 0.0, finish));
}

std::unique_ptr<Job> Server::State::submit(engine::Request req, Clock::time_point arrival,
                                           const std::string& param) {
  if (draining)
    throw ApiError(503, "the server is shutting down", "", "service_unavailable");
  const int64_t n = static_cast<int64_t>(req.prompt.size());
  if (n >= max_seq())
    throw ApiError(400,
                   fmt::format("the prompt has {} tokens; the model's context (max-seq) is {} "
                               "tokens, so at most {} prompt tokens leave room for output",
                               n, max_seq(), max_seq() - 1),
                   param, "invalid_request_error", "context_length_exceeded");
  auto ch = std::make_shared<Channel>();
  std::lock_guard<std::mutex> lock(registry_mu);
  engine::RequestId id = 0;
  try {
    id = engine->add(std::move(req));
  } catch (const engine::QueueFull& e) {
    throw ApiError(429, std::string("the server is busy: ") + e.what(), "", "rate_limit_exceeded",
                   "queue_full");
  } catch (const Error& e) {
    throw ApiError(400, e.what(), param);
  }
  channels[id] = ch;
  // The job (drain()'s count of responses still being written) under the same lock as its
  // channel: a drain that finds the channel and aborts it must also find the job, or it could
  // close the server before this request's handler has written a byte of its stream.
  return std::make_unique<Job>(*this, id, std::move(ch), n, arrival);
}

void Server::State::engine_loop() {
  while (!stop_loop) {
    if (!engine->wait_for_work(std::chrono::milliseconds(50)))
      continue;
    std::vector<engine::Event> events;
    try {
      events = engine->step();
    } catch (const std::exception& e) {
      log(fmt::format("[serve] engine step failed: {}", e.what()));
      std::lock_guard<std::mutex> lock(registry_mu);
      for (auto& [id, ch] : channels) {
        engine->abort(id);
        std::lock_guard<std::mutex> cl(ch->mu);
        ch->error = e.what();
        ch->cv.notify_all();
      }
      channels.clear();
      continue;
    }
    const auto now = Clock::now();
    std::lock_guard<std::mutex> lock(registry_mu);
    for (engine::Event& ev : events) {
      auto it = channels.find(ev.id);
      if (it == channels.end())
        continue;
      const bool last = ev.finish != engine::FinishReason::None;
      if (ev.finish == engine::FinishReason::Error)
        log(fmt::format("[serve] request {} failed: {}", ev.id, ev.error));
      {
        std::lock_guard<std::mutex> cl(it->second->mu);
        if (ev.finish == engine::FinishReason::Error) { // this request alone: a 500 for it
          it->second->error = ev.error;
        } else {
          it->second->events.push_back({std::move(ev), now});
        }
        it->second->cv.notify_all();
      }
      if (last)
        channels.erase(it);
    }
  }
}

std::string Server::State::make_id(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(misc_mu);
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), uint32_t(rng()));
}

void Server::State::log(const std::string& line) {
  std::lock_guard<std::mutex> lock(misc_mu);
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

void Server::State::check_model(const std::string& name) const {
  if (!name.empty() && name != options.model_name)
    throw ApiError(404,
                   fmt::format("the model '{}' does not exist; this server serves '{}'", name,
                               options.model_name),
                   "model", "invalid_request_error", "model_not_found");
}

namespace {

/// Set by the pre-routing gate on the thread that handles a request whose connection must end
/// after its response, and taken by the logger, which cpp-httplib calls once the response is
/// written.
thread_local bool t_close_connection = false;

/// Ends the connection of `req` after its response: what follows a request whose body was not
/// read (refused before, or its end in doubt) cannot be read as the next request. cpp-httplib
/// 0.11 keeps the connection of a response from the pre-routing handler, and writes nothing to
/// a socket that reads as closed, so this runs after the write: what the client already sent is
/// read and dropped (so the close does not reset the connection under the response), then the
/// socket is shut down and the library, finding the end of the stream, closes it.
void close_after_response(const Server::State& st, const httplib::Request& req) {
  const int fd = find_client_socket(st, req);
  if (fd < 0)
    return;
  char buf[16384];
  for (size_t dropped = 0; dropped < (size_t{1} << 20);) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n <= 0)
      break;
    dropped += size_t(n);
  }
  ::shutdown(fd, SHUT_RDWR);
}

/// Body framing, API key, loading and draining checks in front of every route. They run before
/// the library reads the body, so a request refused here that has one ends its connection.
httplib::Server::HandlerResponse gate(Server::State& st, const httplib::Request& req,
                                      httplib::Response& res) {
  t_close_connection = false; // the logger of an earlier response may not have run
  auto refuse = [&](const ApiError& e, bool unread_body) {
    set_error(res, e);
    if (unread_body) {
      res.set_header("Connection", "close");
      t_close_connection = true;
    }
    return httplib::Server::HandlerResponse::Handled;
  };
  // Before the library reads a body by a Content-Length or Transfer-Encoding it misreads.
  if (const auto bad = check_body_framing(req.method, req.headers, st.options.max_body_bytes))
    return refuse(*bad, true);
  const bool body =
      req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0";
  const bool open_path = req.path == "/health" || req.path == "/metrics";
  if (!open_path && !st.options.api_key.empty() &&
      req.get_header_value("Authorization") != "Bearer " + st.options.api_key)
    return refuse(ApiError(401, "a valid API key is needed: Authorization: Bearer KEY", "",
                           "authentication_error", "invalid_api_key"),
                  body);
  if (!open_path && (!st.ready || st.draining))
    return refuse(ApiError(503,
                           st.draining ? "the server is shutting down" : "the model is loading", "",
                           "service_unavailable"),
                  body);
  return httplib::Server::HandlerResponse::Unhandled;
}

void add_routes(Server::State& st) {
  httplib::Server& h = st.http;
  h.set_pre_routing_handler(
      [&st](const httplib::Request& req, httplib::Response& res) { return gate(st, req, res); });
  h.set_logger([&st](const httplib::Request& req, const httplib::Response&) {
    if (t_close_connection) {
      t_close_connection = false;
      close_after_response(st, req);
    }
  });
  h.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty())
          return httplib::Server::HandlerResponse::Unhandled;
        std::string msg = res.status == 404   ? "no route " + req.method + " " + req.path
                          : res.status == 413 ? "the request body is too large"
                                              : fmt::format("HTTP error {}", res.status);
        set_error(res, ApiError(res.status, msg, "",
                                res.status == 404 ? "not_found_error" : "invalid_request_error"));
        return httplib::Server::HandlerResponse::Handled;
      }));
  h.set_exception_handler(
      [&st](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        st.log("[serve] internal error: " + what);
        set_error(res, ApiError(500, "internal error: " + what, "", "server_error"));
      });
  h.Get("/health", [&st](const httplib::Request&, httplib::Response& res) {
    const char* state = st.draining ? "draining" : st.ready ? "ok" : "loading";
    res.status = st.ready && !st.draining ? 200 : 503;
    res.set_content(fmt::format("{{\"status\":\"{}\"}}", state), "application/json");
  });
  h.Get("/metrics", [&st](const httplib::Request&, httplib::Response& res) {
    engine::EngineStats s = st.engine ? st.engine->stats() : engine::EngineStats{};
    res.set_content(st.metrics.render(s), "text/plain; version=0.0.4");
  });
  h.Get("/v1/models", [&st](const httplib::Request&, httplib::Response& res) {
    Json m = {{"id", st.options.model_name},
              {"object", "model"},
              {"created", st.created},
              {"owned_by", "xserv"},
              {"max_model_len", st.max_seq()}};
    res.set_content(dump_json(Json{{"object", "list"}, {"data", Json::array({m})}}),
                    "application/json");
  });
  h.Post("/v1/chat/completions",
         [&st](const httplib::Request& req, httplib::Response& res) { handle_chat(st, req, res); });
  h.Post("/v1/responses", [&st](const httplib::Request& req, httplib::Response& res) {
    handle_responses(st, req, res);
  });
  h.Post("/v1/completions", [&st](const httplib::Request& req, httplib::Response& res) {
    handle_completion(st, req, res);
  });
  h.Post("/tokenize", [&st](const httplib::Request& req, httplib::Response& res) {
    handle_tokenize(st, req, res);
  });
  h.Post("/detokenize", [&st](const httplib::Request& req, httplib::Response& res) {
    handle_detokenize(st, req, res);
  });
}

} // namespace

Server::Server(ServeOptions options) : state_(std::make_unique<State>()) {
  State& st = *state_;
  st.options = std::move(options);
  st.created = static_cast<int64_t>(std::time(nullptr));
  // Each connection holds a worker for as long as it is kept alive, idle or not: size the pool
  // for the running requests plus hundreds of idle keep-alive connections (docs/DESIGN.md).
  size_t threads = st.options.http_threads > 0
                       ? size_t(st.options.http_threads)
                       : size_t(512 + std::max<int64_t>(st.options.engine.max_running, 64));
  st.http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  st.http.set_payload_max_length(st.options.max_body_bytes);
  st.http.set_keep_alive_max_count(1000);
  add_routes(st);
}

Server::~Server() {
  drain(std::chrono::milliseconds(0));
}

int Server::listen(const std::string& host, int port) {
  State& st = *state_;
  int bound = port;
  if (port == 0)
    bound = st.http.bind_to_any_port(host);
  else if (!st.http.bind_to_port(host, port))
    bound = -1;
  if (bound <= 0)
    throw Error(
        fmt::format("cannot listen on {}:{} (address in use or not available)", host, port));
  st.port = bound;
  st.listen_thread = std::thread([&st] { st.http.listen_after_bind(); });
  return bound;
}

void Server::attach(engine::Model& model, models::Tokenizer tokenizer) {
  State& st = *state_;
  st.model = &model;
  st.tok = std::move(tokenizer);
  st.engine = std::make_unique<engine::Engine>(model, st.options.engine);
  st.loop_thread = std::thread([&st] { st.engine_loop(); });
  st.ready = true;
}

void Server::drain(std::chrono::milliseconds grace) {
  State& st = *state_;
  if (st.drained)
    return;
  st.drained = true;
  // 1. New requests get 503 from now on (the listening socket stays open: cpp-httplib's stop()
  //    would also cut short the streams it has not started writing).
  st.draining = true;
  if (st.engine) {
    // 2. Running requests get the grace period, then the rest are aborted.
    const auto deadline = Clock::now() + grace;
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(st.registry_mu);
        if (st.channels.empty())
          break;
        if (Clock::now() >= deadline) {
          st.log(
              fmt::format("[serve] grace period over: aborting {} requests", st.channels.size()));
          for (auto& [id, ch] : st.channels)
            st.engine->abort(id);
          break;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    // 3. Every response is written to its end (an aborted one ends at the next step).
    while (st.live_jobs > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // 4. Close the listening socket and wait for the handlers, then the loop thread.
  st.http.stop();
  if (st.listen_thread.joinable())
    st.listen_thread.join();
  st.stop_loop = true;
  if (st.loop_thread.joinable())
    st.loop_thread.join();
}

engine::EngineStats Server::stats() const {
  return state_->engine ? state_->engine->stats() : engine::EngineStats{};
}

} // namespace xserv::server
