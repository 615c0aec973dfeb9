// The completion endpoints: /v1/chat/completions, /v1/responses, /v1/completions, /tokenize,
// /detokenize.
#include <algorithm>
#include <ctime>

#include <fmt/format.h>

#include "server/openai_responses.h"
#include "server/session.h"
#include "server/state.h"

namespace xserv::server {

using openai::ApiError;
using openai::Json;

namespace {

constexpr std::chrono::milliseconds kPing{1000}; ///< SSE comment after this long without events
/// How often a waiting non-streaming handler checks that its client is still connected.
constexpr std::chrono::milliseconds kProbe{200};

/// The engine request of a prompt and the client's parameters. `stop_ids` are the model's
/// end ids, dropped with ignore_eos.
engine::Request make_request(const Server::State& st, std::vector<int32_t> prompt,
                             const openai::GenParams& p, std::vector<int32_t> stop_ids) {
  engine::Request r;
  const int64_t room = st.max_seq() - static_cast<int64_t>(prompt.size());
  r.max_tokens = std::max<int64_t>(1, p.max_tokens ? std::min(*p.max_tokens, room) : room);
  r.prompt = std::move(prompt);
  r.sampling = p.sampling;
  if (!p.ignore_eos)
    r.stop_ids = std::move(stop_ids);
  r.stop_ids.insert(r.stop_ids.end(), p.stop_token_ids.begin(), p.stop_token_ids.end());
  r.top_logprobs = p.top_logprobs;
  return r;
}

/// Drives a request to its end, streaming or not. `on_event` turns an event into the chunks to
/// send (streaming) and updates the session; `finish` gives the closing chunks.
struct Driver {
  Driver(Server::State& st, std::string id) : st(st), id(std::move(id)) {}
  Server::State& st;
  std::string id;
  std::shared_ptr<Job> job;
  std::function<std::vector<Json>(const engine::Event&)> on_event;
  std::function<bool()> stop_hit; ///< a stop string matched: abort the engine request
  std::function<std::string()> finish_reason;

  /// Answers a request without a stream: runs it to its end, then the `object` response with
  /// the one choice `choice()` builds, and the usage.
  void respond(const httplib::Request& req, httplib::Response& res, const char* object,
               int64_t created, const std::function<Json()>& choice) {
    run_blocking(req);
    Json out = {{"id", id},
                {"object", object},
                {"created", created},
                {"model", st.options.model_name},
                {"choices", Json::array({choice()})},
                {"usage", usage_json(job->prompt_tokens(), job->generated())}};
    res.set_content(dump_json(out), "application/json");
    job.reset(); // counts as done for drain() now, not when the lambdas let go of the driver
  }

  /// Runs to the finish event without a stream (the handler thread waits); a client that
  /// closed its connection meanwhile aborts the request.
  void run_blocking(const httplib::Request& req) {
    bool aborted = false;
    int fd = -2; // looked up at the first probe: most requests end before it
    auto next_probe = Clock::now() + kProbe;
    while (!job->finished()) {
      auto ev = job->next(kProbe);
      if (!aborted && Clock::now() >= next_probe) {
        next_probe = Clock::now() + kProbe;
        if (fd == -2)
          fd = find_client_socket(st, req);
        if (peer_closed(fd)) {
          job->abort();
          st.metrics.count_disconnect();
          aborted = true;
        }
      }
      if (!ev)
        continue;
      on_event(ev->event);
      if (stop_hit() && !aborted) {
        job->abort();
        aborted = true;
      }
    }
    job->complete(id, finish_reason());
  }
};

/// How a stream puts its events on the wire: chat and text completions send `data: JSON` and
/// end with `data: [DONE]`; the Responses API names each event (`event: TYPE`), numbers it
/// (sequence_number) and ends with its last event.
struct StreamFormat {
  bool named = false; ///< `event: TYPE` lines and sequence numbers (Responses)
  std::function<Json(const ApiError&)> error = openai::error_body;
};

/// Streams `d`'s request: the `first` events, then each event's chunks, then `last()`'s.
void stream_response(httplib::Response& res, std::shared_ptr<Driver> d, std::vector<Json> first,
                     std::function<std::vector<Json>()> last, StreamFormat format = {}) {
  res.set_header("Cache-Control", "no-cache");
  auto seq = std::make_shared<int64_t>(0);
  res.set_chunked_content_provider(
      "text/event-stream",
      [d, first, last, format, seq](size_t, httplib::DataSink& sink) {
        auto send = [&](const Json& j) {
          std::string s;
          if (format.named) {
            Json e = j;
            e["sequence_number"] = (*seq)++;
            s = "event: " + e.value("type", "") + "\ndata: " + dump_json(e) + "\n\n";
          } else {
            s = "data: " + dump_json(j) + "\n\n";
          }
          return sink.write(s.data(), s.size());
        };
        for (const Json& e : first)
          if (!send(e))
            return false; // the job's release aborts the request
        try {
          bool aborted = false;
          while (!d->job->finished()) {
            auto ev = d->job->next(kPing);
            if (!ev) {
              if (!sink.write(": ping\n\n", 9))
                return false;
              continue;
            }
            for (const Json& chunk : d->on_event(ev->event))
              if (!send(chunk))
                return false;
            if (d->stop_hit() && !aborted) {
              d->job->abort();
              aborted = true;
            }
          }
          d->job->complete(d->id, d->finish_reason());
          for (const Json& e : last())
            if (!send(e))
              return false;
        } catch (const ApiError& e) {
          d->job->complete(d->id, "error");
          if (!send(format.error(e)))
            return false;
        }
        if (!format.named) {
          const std::string done = "data: [DONE]\n\n";
          sink.write(done.data(), done.size());
        }
        sink.done();
        return true;
      },
      [d](bool) { d->job.reset(); });
}

/// A stream's usage chunk (stream_options.include_usage): no choices, the request's usage.
Json usage_chunk(const Driver& d, const char* object, int64_t created, const std::string& model) {
  return {{"id", d.id},
          {"object", object},
          {"created", created},
          {"model", model},
          {"choices", Json::array()},
          {"usage", usage_json(d.job->prompt_tokens(), d.job->generated())}};
}

int64_t now_s() {
  return static_cast<int64_t>(std::time(nullptr));
}

/// A chat request queued: its driver (id PREFIX + random hex) and the session that turns its
/// events into deltas. The prompt is the messages' harmony rendering; with tools, <|call|>
/// does not end generation: the model may make several calls in one turn (ChatSession ends
/// the turn at the first id after a call that is not <|start|>). `param` names the prompt's
/// field in a refusal.
std::pair<std::shared_ptr<Driver>, std::shared_ptr<ChatSession>>
start_chat(Server::State& st, const openai::ChatRequest& cr, Clock::time_point arrival,
           const std::string& prefix, const std::string& param) {
  const auto ids = models::render_for_completion(*st.tok, cr.messages);
  const bool tools = std::any_of(cr.messages.begin(), cr.messages.end(), [](const auto& m) {
    return m.developer && !m.developer->tools.empty();
  });
  std::vector<int32_t> stops = models::stop_token_ids(); // <|return|>, <|call|>
  if (tools)
    stops = {static_cast<int32_t>(st.tok->special_id("<|return|>"))};
  engine::Request er =
      make_request(st, std::vector<int32_t>(ids.begin(), ids.end()), cr.params, std::move(stops));
  auto d = std::make_shared<Driver>(st, st.make_id(prefix));
  d->job = st.submit(std::move(er), arrival, param);
  auto session = std::make_shared<ChatSession>(*st.tok, cr.params, d->id);
  d->stop_hit = [session] { return session->stop_hit(); };
  d->finish_reason = [session] { return session->finish_reason(); };
  return {d, session};
}

} // namespace

void handle_chat(Server::State& st, const httplib::Request& req, httplib::Response& res) {
  const auto arrival = Clock::now();
  try {
    openai::ChatRequest cr = openai::parse_chat_request(openai::parse_body(req.body));
    st.check_model(cr.model);
    auto [d, session] = start_chat(st, cr, arrival, "chatcmpl-", "messages");
    const int64_t created = now_s();
    const bool want_logprobs = cr.params.top_logprobs >= 0;
    auto chunk = [id = d->id, created, model = st.options.model_name](Json delta, Json logprobs,
                                                                      Json finish) {
      Json choice = {{"index", 0}, {"delta", std::move(delta)}, {"logprobs", nullptr}};
      if (!logprobs.is_null())
        choice["logprobs"] = {{"content", std::move(logprobs)}};
      choice["finish_reason"] = std::move(finish);
      return Json{{"id", id},
                  {"object", "chat.completion.chunk"},
                  {"created", created},
                  {"model", model},
                  {"choices", Json::array({choice})}};
    };
    auto all_logprobs = std::make_shared<Json>(Json::array());
    d->on_event = [session, chunk, want_logprobs, all_logprobs](const engine::Event& ev) {
      Json lp = Json::array();
      std::vector<Json> deltas = session->on_event(ev, lp);
      for (const Json& e : lp)
        all_logprobs->push_back(e);
      std::vector<Json> chunks;
      for (size_t i = 0; i < deltas.size(); ++i)
        chunks.push_back(chunk(deltas[i], want_logprobs && i == 0 ? lp : Json(nullptr), nullptr));
      if (deltas.empty() && want_logprobs && !lp.empty())
        chunks.push_back(chunk(Json::object(), lp, nullptr));
      return chunks;
    };
    if (cr.params.stream) {
      const bool include_usage = cr.params.include_usage;
      stream_response(res, d, {chunk({{"role", "assistant"}, {"content", ""}}, nullptr, nullptr)},
                      [d, chunk, session, include_usage, created, model = st.options.model_name] {
                        std::vector<Json> out = {
                            chunk(Json::object(), nullptr, session->finish_reason())};
                        if (include_usage)
                          out.push_back(usage_chunk(*d, "chat.completion.chunk", created, model));
                        return out;
                      });
      return;
    }
    d->respond(req, res, "chat.completion", created, [&] {
      return Json{{"index", 0},
                  {"message", session->message()},
                  {"logprobs", want_logprobs ? Json{{"content", *all_logprobs}} : Json(nullptr)},
                  {"finish_reason", session->finish_reason()}};
    });
  } catch (const ApiError& e) {
    set_error(res, e);
  } catch (const Error& e) {
    set_error(res, ApiError(400, e.what(), "messages"));
  }
}

void handle_responses(Server::State& st, const httplib::Request& req, httplib::Response& res) {
  const auto arrival = Clock::now();
  try {
    const openai::ResponsesRequest rr =
        openai::parse_responses_request(openai::parse_body(req.body));
    const openai::ChatRequest cr = openai::parse_responses_chat(rr);
    st.check_model(cr.model);
    const std::string prefix = "resp_";
    auto [d, session] = start_chat(st, cr, arrival, prefix, "input");
    const int64_t created = now_s();
    auto out = std::make_shared<openai::ResponsesOutput>(d->id.substr(prefix.size()));
    d->on_event = [session, out](const engine::Event& ev) {
      Json logprobs = Json::array(); // not asked for: top_logprobs is refused
      std::vector<Json> events;
      for (const Json& delta : session->on_event(ev, logprobs))
        for (Json& e : out->push(delta))
          events.push_back(std::move(e));
      return events;
    };
    // The response object as it stands; `status` empty: from the finish reason.
    auto object = [d, session, out, created, echo = rr.echo,
                   model = st.options.model_name](std::string status) {
      const bool running = status == "in_progress";
      Json r = openai::response_object(d->id, created, model, echo, status, out->output(),
                                       d->job->prompt_tokens(), d->job->generated(),
                                       session->reasoning_tokens());
      if (running)
        r["usage"] = nullptr;
      return r;
    };
    if (rr.stream) {
      const Json initial = object("in_progress");
      stream_response(
          res, d,
          {{{"type", "response.created"}, {"response", initial}},
           {{"type", "response.in_progress"}, {"response", initial}}},
          [session, out, object] {
            const std::string status = openai::responses_status(session->finish_reason());
            std::vector<Json> events = out->finish(status == "completed");
            events.push_back(
                {{"type", status == "completed" ? "response.completed" : "response.incomplete"},
                 {"response", object(status)}});
            return events;
          },
          StreamFormat{true, openai::responses_error_event});
      return;
    }
    d->run_blocking(req);
    const std::string status = openai::responses_status(session->finish_reason());
    out->finish(status == "completed");
    res.set_content(dump_json(object(status)), "application/json");
    d->job.reset(); // counts as done for drain() now, not when the lambdas let go of the driver
  } catch (const ApiError& e) {
    set_error(res, e);
  } catch (const Error& e) {
    set_error(res, ApiError(400, e.what(), "input"));
  }
}

void handle_completion(Server::State& st, const httplib::Request& req, httplib::Response& res) {
  const auto arrival = Clock::now();
  try {
    openai::CompletionRequest cr = openai::parse_completion_request(openai::parse_body(req.body));
    st.check_model(cr.model);
    std::vector<int32_t> prompt = cr.prompt_ids;
    if (cr.prompt_text) {
      auto ids = st.tok->encode(*cr.prompt_text, models::AllowedSpecial::all());
      prompt.assign(ids.begin(), ids.end());
    }
    std::vector<int32_t> eos;
    for (int64_t e : st.model->config().eos_token_ids)
      eos.push_back(static_cast<int32_t>(e));
    engine::Request er = make_request(st, std::move(prompt), cr.params, eos);
    auto d = std::make_shared<Driver>(st, st.make_id("cmpl-"));
    d->job = st.submit(std::move(er), arrival, "prompt");
    auto session = std::make_shared<CompletionSession>(*st.tok, cr.params);
    const int64_t created = now_s();
    auto chunk = [id = d->id, created, model = st.options.model_name](std::string text,
                                                                      Json logprobs, Json finish) {
      Json choice = {{"index", 0},
                     {"text", std::move(text)},
                     {"logprobs", std::move(logprobs)},
                     {"finish_reason", std::move(finish)}};
      return Json{{"id", id},
                  {"object", "text_completion"},
                  {"created", created},
                  {"model", model},
                  {"choices", Json::array({choice})}};
    };
    auto all_logprobs = std::make_shared<Json>(nullptr);
    d->on_event = [session, chunk, all_logprobs](const engine::Event& ev) {
      Json lp = nullptr;
      std::string text = session->on_event(ev, lp);
      if (!lp.is_null()) {
        if (all_logprobs->is_null())
          *all_logprobs = lp;
        else
          for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
            for (const Json& x : lp[k])
              (*all_logprobs)[k].push_back(x);
      }
      std::vector<Json> chunks;
      if (!text.empty() || !lp.is_null())
        chunks.push_back(chunk(text, lp, nullptr));
      return chunks;
    };
    d->stop_hit = [session] { return session->stop_hit(); };
    d->finish_reason = [session] { return session->finish_reason(); };
    if (cr.params.stream) {
      const bool include_usage = cr.params.include_usage;
      stream_response(res, d, {},
                      [d, chunk, session, include_usage, created, model = st.options.model_name] {
                        std::vector<Json> out = {chunk("", nullptr, session->finish_reason())};
                        if (include_usage)
                          out.push_back(usage_chunk(*d, "text_completion", created, model));
                        return out;
                      });
      return;
    }
    d->respond(req, res, "text_completion", created, [&] {
      return Json{{"index", 0},
                  {"text", session->text()},
                  {"logprobs", *all_logprobs},
                  {"finish_reason", session->finish_reason()}};
    });
  } catch (const ApiError& e) {
    set_error(res, e);
  } catch (const Error& e) {
    set_error(res, ApiError(400, e.what(), "prompt"));
  }
}

void handle_tokenize(Server::State& st, const httplib::Request& req, httplib::Response& res) {
  try {
    Json body = openai::parse_body(req.body);
    std::vector<models::TokenId> ids;
    for (auto it = body.begin(); it != body.end(); ++it)
      if (it.key() != "model" && it.key() != "prompt" && it.key() != "messages" &&
          it.key() != "reasoning_effort" && it.key() != "tools")
        throw ApiError(400, fmt::format("unknown field '{}'", it.key()), it.key());
    if (body.contains("model") && !body["model"].is_string())
      throw ApiError(400, "'model' must be a string", "model");
    st.check_model(body.value("model", ""));
    if (body.contains("prompt") == body.contains("messages"))
      throw ApiError(400, "give exactly one of 'prompt' (text) or 'messages' (a chat)", "prompt");
    if (body.contains("prompt")) {
      if (!body["prompt"].is_string())
        throw ApiError(400, "'prompt' must be a string", "prompt");
      ids = st.tok->encode(body["prompt"].get<std::string>(), models::AllowedSpecial::all());
    } else {
      Json chat = {{"messages", body["messages"]}};
      for (const char* k : {"reasoning_effort", "tools"})
        if (body.contains(k))
          chat[k] = body[k];
      ids = models::render_for_completion(*st.tok, openai::parse_chat_request(chat).messages);
    }
    Json out = {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", st.max_seq()}};
    res.set_content(dump_json(out), "application/json");
  } catch (const ApiError& e) {
    set_error(res, e);
  } catch (const Error& e) {
    set_error(res, ApiError(400, e.what(), "prompt"));
  }
}

void handle_detokenize(Server::State& st, const httplib::Request& req, httplib::Response& res) {
  try {
    Json body = openai::parse_body(req.body);
    for (auto it = body.begin(); it != body.end(); ++it)
      if (it.key() != "model" && it.key() != "tokens")
        throw ApiError(400, fmt::format("unknown field '{}'", it.key()), it.key());
    if (body.contains("model") && !body["model"].is_string())
      throw ApiError(400, "'model' must be a string", "model");
    st.check_model(body.value("model", ""));
    if (!body.contains("tokens") || !body["tokens"].is_array())
      throw ApiError(400, "'tokens' must be an array of token ids", "tokens");
    std::vector<models::TokenId> ids;
    for (const Json& t : body["tokens"]) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
          t.get<int64_t>() >= static_cast<int64_t>(st.tok->vocab_size()))
        throw ApiError(400,
                       fmt::format("'tokens' holds {}, not a token id in [0, {})", t.dump(),
                                   st.tok->vocab_size()),
                       "tokens");
      ids.push_back(static_cast<models::TokenId>(t.get<int64_t>()));
    }
    res.set_content(dump_json(Json{{"prompt", st.tok->decode(ids)}}), "application/json");
  } catch (const ApiError& e) {
    set_error(res, e);
  } catch (const Error& e) {
    set_error(res, ApiError(400, e.what(), "tokens"));
  }
}

} // namespace xserv::server
