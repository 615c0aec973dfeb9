// The completion endpoints: /v1/chat/completions, /v1/responses and /v1/completions, each an
// Exchange over the engine (streamed as it comes, or one body at the end).
#include <algorithm>
#include <ctime>

#include <fmt/format.h>

#include "server/exchange.h"
#include "server/handlers.h"
#include "server/openai_responses.h"
#include "server/session.h"

namespace xserv::server {

using openai::ApiError;
using openai::Json;

namespace {

/// The engine request of a prompt and the client's parameters. `stop_ids` are the model's
/// end ids, dropped with ignore_eos.
engine::Request make_request(const Api& api, std::vector<int32_t> prompt,
                             const openai::GenParams& p, std::vector<int32_t> stop_ids) {
  openai::check_stop_token_ids(p, api.jobs.model()->config().vocab_size);
  engine::Request r;
  const int64_t room = api.max_seq() - static_cast<int64_t>(prompt.size());
  r.max_tokens = p.max_tokens == 0 // an echoed completion's scores alone
                     ? 0
                     : std::max<int64_t>(1, p.max_tokens ? std::min(*p.max_tokens, room) : room);
  r.prompt = std::move(prompt);
  r.sampling = p.sampling;
  if (!p.ignore_eos)
    r.stop_ids = std::move(stop_ids);
  r.stop_ids.insert(r.stop_ids.end(), p.stop_token_ids.begin(), p.stop_token_ids.end());
  r.top_logprobs = p.top_logprobs;
  r.n = p.n;
  r.constraint = api.compile(p.constraint);
  r.adjust = p.adjust;
  return r;
}

/// The non-streaming body: the `object` response with its choices.
Json whole_response(const Exchange& x, const char* object, int64_t created,
                    const std::string& model, Json choices) {
  return {{"id", x.id},
          {"object", object},
          {"created", created},
          {"model", model},
          {"choices", std::move(choices)},
          {"usage", usage_json(x.job->prompt_tokens(), x.job->generated())}};
}

/// The choice an event belongs to, within [0, n).
size_t choice_of(const engine::Event& ev, size_t n) {
  return size_t(std::clamp(ev.choice, 0, int(n) - 1));
}

/// A stream's usage chunk (stream_options.include_usage): no choices, the request's usage.
Json usage_chunk(const Exchange& x, const char* object, int64_t created, const std::string& model) {
  return {{"id", x.id},
          {"object", object},
          {"created", created},
          {"model", model},
          {"choices", Json::array()},
          {"usage", usage_json(x.job->prompt_tokens(), x.job->generated())}};
}

int64_t now_s() {
  return static_cast<int64_t>(std::time(nullptr));
}

Reply pending(std::shared_ptr<Exchange> x) {
  Reply r;
  r.pending = std::move(x);
  return r;
}

/// A chat request queued: its exchange (id PREFIX + random hex) and the sessions (one per choice)
/// that turn its events into deltas. The prompt is the messages' harmony rendering; with tools,
/// <|call|> does not end generation: the model may make several calls in one turn (ChatSession ends
/// the turn at the first id after a call that is not <|start|>). `param` names the prompt's
/// field in a refusal.
using ChatSessions = std::vector<std::unique_ptr<ChatSession>>;

std::pair<std::shared_ptr<Exchange>, std::shared_ptr<ChatSessions>>
start_chat(const Api& api, const openai::ChatRequest& cr, Clock::time_point arrival,
           const std::string& prefix, const std::string& param) {
  const auto ids = models::render_for_completion(api.tok, cr.messages);
  const bool tools = std::any_of(cr.messages.begin(), cr.messages.end(), [](const auto& m) {
    return m.developer && !m.developer->tools.empty();
  });
  std::vector<int32_t> stops = models::stop_token_ids(); // <|return|>, <|call|>
  if (tools)
    stops = {static_cast<int32_t>(api.tok.special_id("<|return|>"))};
  engine::Request er =
      make_request(api, std::vector<int32_t>(ids.begin(), ids.end()), cr.params, std::move(stops));
  auto x = std::make_shared<Exchange>(api.log.make_id(prefix));
  x->job = api.jobs.submit(std::move(er), arrival, param);
  x->stream = cr.params.stream;
  auto sessions = std::make_shared<ChatSessions>();
  for (int c = 0; c < cr.params.n; ++c)
    sessions->push_back(std::make_unique<ChatSession>(api.tok, cr.params, x->id));
  x->stop_hit = [sessions](int c) { return (*sessions)[size_t(c)]->stop_hit(); };
  x->finish_reason = [sessions] { return sessions->front()->finish_reason(); };
  return {x, sessions};
}

} // namespace

Reply handle_chat(const Api& api, const HttpRequest& req) {
  const auto arrival = Clock::now();
  try {
    openai::ChatRequest cr = openai::parse_chat_request(api.parse(req.body));
    api.check_model(cr.model);
    auto [x, sessions] = start_chat(api, cr, arrival, "chatcmpl-", "messages");
    const int64_t created = now_s();
    const bool want_logprobs = cr.params.top_logprobs >= 0;
    auto chunk = [id = x->id, created, model = api.options.model_name](size_t index, Json delta,
                                                                       Json logprobs, Json finish) {
      Json choice = {{"index", index}, {"delta", std::move(delta)}, {"logprobs", nullptr}};
      if (!logprobs.is_null())
        choice["logprobs"] = {{"content", std::move(logprobs)}};
      choice["finish_reason"] = std::move(finish);
      return Json{{"id", id},
                  {"object", "chat.completion.chunk"},
                  {"created", created},
                  {"model", model},
                  {"choices", Json::array({std::move(choice)})}};
    };
    auto all_logprobs = std::make_shared<std::vector<Json>>(sessions->size(), Json(Json::array()));
    const bool stream = cr.params.stream;
    x->on_event = [sessions, chunk, want_logprobs, all_logprobs, stream](const engine::Event& ev) {
      const size_t c = choice_of(ev, sessions->size());
      Json lp = Json::array();
      std::vector<Json> deltas = (*sessions)[c]->on_event(ev, lp);
      std::vector<Json> chunks;
      if (!stream) { // the whole response is built at the end
        for (Json& e : lp)
          (*all_logprobs)[c].push_back(std::move(e));
        return chunks;
      }
      for (size_t i = 0; i < deltas.size(); ++i)
        chunks.push_back(
            chunk(c, std::move(deltas[i]), want_logprobs && i == 0 ? lp : Json(nullptr), nullptr));
      if (deltas.empty() && want_logprobs && !lp.empty())
        chunks.push_back(chunk(c, Json::object(), std::move(lp), nullptr));
      return chunks;
    };
    if (stream) {
      const bool include_usage = cr.params.include_usage;
      for (size_t c = 0; c < sessions->size(); ++c)
        x->first.push_back(chunk(c, {{"role", "assistant"}, {"content", ""}}, nullptr, nullptr));
      x->last = [x = x.get(), chunk, sessions, include_usage, created,
                 model = api.options.model_name] {
        std::vector<Json> out;
        for (size_t c = 0; c < sessions->size(); ++c)
          out.push_back(chunk(c, Json::object(), nullptr, (*sessions)[c]->finish_reason()));
        if (include_usage)
          out.push_back(usage_chunk(*x, "chat.completion.chunk", created, model));
        return out;
      };
      return pending(x);
    }
    x->result = [x = x.get(), sessions, all_logprobs, want_logprobs, created,
                 model = api.options.model_name] {
      Json choices = Json::array();
      for (size_t c = 0; c < sessions->size(); ++c) {
        const ChatSession& s = *(*sessions)[c];
        choices.push_back(Json{
            {"index", c},
            {"message", s.message()},
            {"logprobs", want_logprobs ? Json{{"content", std::move((*all_logprobs)[c])}} : Json()},
            {"finish_reason", s.finish_reason()}});
      }
      return whole_response(*x, "chat.completion", created, model, std::move(choices));
    };
    return pending(x);
  } catch (const ApiError& e) {
    return error_reply(e);
  } catch (const Error& e) {
    return error_reply(ApiError(400, e.what(), "messages"));
  }
}

Reply handle_responses(const Api& api, const HttpRequest& req) {
  const auto arrival = Clock::now();
  try {
    openai::ResponsesRequest rr = openai::parse_responses_request(api.parse(req.body));
    const openai::ChatRequest cr = openai::parse_responses_chat(rr);
    api.check_model(cr.model);
    const std::string prefix = "resp_";
    auto started = [&] {
      try {
        return start_chat(api, cr, arrival, prefix, "input");
      } catch (const ApiError& e) { // a text.format that cannot be enforced
        throw openai::as_responses_error(e);
      }
    }();
    auto& [x, sessions] = started;
    // The Responses API has no n: one choice.
    std::shared_ptr<ChatSession> session(sessions, sessions->front().get());
    const int64_t created = now_s();
    auto out = std::make_shared<openai::ResponsesOutput>(x->id.substr(prefix.size()));
    x->on_event = [session, out](const engine::Event& ev) {
      Json logprobs = Json::array(); // not asked for: top_logprobs is refused
      std::vector<Json> events;
      for (const Json& delta : session->on_event(ev, logprobs))
        for (Json& e : out->push(delta))
          events.push_back(std::move(e));
      return events;
    };
    // The response object as it stands; `status` empty: from the finish reason.
    auto echo = std::make_shared<const Json>(std::move(rr.echo));
    auto object = [x = x.get(), session, out, created, echo,
                   model = api.options.model_name](const std::string& status) {
      Json r = openai::response_object(x->id, created, model, *echo, status, out->output(),
                                       x->job->prompt_tokens(), x->job->generated(),
                                       session->reasoning_tokens());
      if (status == "in_progress")
        r["usage"] = nullptr;
      return r;
    };
    if (rr.stream) {
      x->format = StreamFormat{true, openai::responses_error_event};
      const Json initial = object("in_progress");
      x->first = {{{"type", "response.created"}, {"response", initial}},
                  {{"type", "response.in_progress"}, {"response", initial}}};
      x->last = [session, out, object] {
        const std::string status = openai::responses_status(session->finish_reason());
        std::vector<Json> events = out->finish(status == "completed");
        events.push_back(
            {{"type", status == "completed" ? "response.completed" : "response.incomplete"},
             {"response", object(status)}});
        return events;
      };
      return pending(x);
    }
    x->result = [session, out, object] {
      const std::string status = openai::responses_status(session->finish_reason());
      out->finish(status == "completed");
      return object(status);
    };
    return pending(x);
  } catch (const ApiError& e) {
    return error_reply(e);
  } catch (const Error& e) {
    return error_reply(ApiError(400, e.what(), "input"));
  }
}

Reply handle_completion(const Api& api, const HttpRequest& req) {
  const auto arrival = Clock::now();
  try {
    openai::CompletionRequest cr = openai::parse_completion_request(api.parse(req.body));
    api.check_model(cr.model);
    std::vector<int32_t> prompt = cr.prompt_ids;
    if (cr.prompt_text) {
      auto ids = api.tok.encode(*cr.prompt_text, models::AllowedSpecial::all());
      prompt.assign(ids.begin(), ids.end());
    }
    const std::vector<int32_t> echo = cr.echo ? prompt : std::vector<int32_t>{};
    engine::Request er =
        make_request(api, std::move(prompt), cr.params, api.jobs.model()->config().eos_ids());
    if (cr.echo) // the prompt's tokens scored too (one a step), where log-probabilities are asked
      er.prompt_logprobs = cr.params.top_logprobs;
    auto x = std::make_shared<Exchange>(api.log.make_id("cmpl-"));
    x->job = api.jobs.submit(std::move(er), arrival, "prompt");
    x->stream = cr.params.stream;
    auto sessions = std::make_shared<std::vector<CompletionSession>>();
    for (int c = 0; c < cr.params.n; ++c)
      sessions->emplace_back(api.tok, cr.params, echo);
    const int64_t created = now_s();
    auto chunk = [id = x->id, created, model = api.options.model_name](
                     size_t index, std::string text, Json logprobs, Json finish) {
      Json choice = {{"index", index},
                     {"text", std::move(text)},
                     {"logprobs", std::move(logprobs)},
                     {"finish_reason", std::move(finish)}};
      return Json{{"id", id},
                  {"object", "text_completion"},
                  {"created", created},
                  {"model", model},
                  {"choices", Json::array({std::move(choice)})}};
    };
    auto all_logprobs = std::make_shared<std::vector<Json>>(sessions->size(), Json(nullptr));
    x->on_event = [sessions, chunk, all_logprobs](const engine::Event& ev) {
      const size_t c = choice_of(ev, sessions->size());
      Json lp = nullptr;
      std::string text = (*sessions)[c].on_event(ev, lp);
      if (!lp.is_null()) {
        Json& all = (*all_logprobs)[c];
        if (all.is_null())
          all = lp;
        else
          for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
            for (const Json& v : lp[k])
              all[k].push_back(v);
      }
      // A chunk per generated token, its text possibly empty (a token that ends inside a
      // character, a special id, text held back for a stop string), as llama-server and vLLM
      // stream: a client sees each token arrive and can count and time them.
      std::vector<Json> chunks;
      if (ev.token >= 0 || !text.empty() || !lp.is_null())
        chunks.push_back(chunk(c, std::move(text), std::move(lp), nullptr));
      return chunks;
    };
    x->stop_hit = [sessions](int c) { return (*sessions)[size_t(c)].stop_hit(); };
    x->finish_reason = [sessions] { return sessions->front().finish_reason(); };
    if (cr.params.stream) {
      const bool include_usage = cr.params.include_usage;
      x->last = [x = x.get(), chunk, sessions, include_usage, created,
                 model = api.options.model_name] {
        std::vector<Json> out;
        for (size_t c = 0; c < sessions->size(); ++c)
          out.push_back(chunk(c, "", nullptr, (*sessions)[c].finish_reason()));
        if (include_usage)
          out.push_back(usage_chunk(*x, "text_completion", created, model));
        return out;
      };
      return pending(x);
    }
    x->result = [x = x.get(), sessions, all_logprobs, created, model = api.options.model_name] {
      Json choices = Json::array();
      for (size_t c = 0; c < sessions->size(); ++c)
        choices.push_back(Json{{"index", c},
                               {"text", (*sessions)[c].text()},
                               {"logprobs", std::move((*all_logprobs)[c])},
                               {"finish_reason", (*sessions)[c].finish_reason()}});
      return whole_response(*x, "text_completion", created, model, std::move(choices));
    };
    return pending(x);
  } catch (const ApiError& e) {
    return error_reply(e);
  } catch (const Error& e) {
    return error_reply(ApiError(400, e.what(), "prompt"));
  }
}

} // namespace xserv::server
