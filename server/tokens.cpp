// The token endpoints (/tokenize, /detokenize), the JSON body reader with its depth limit, and
// error replies.
#include <fmt/format.h>

#include "server/exchange.h"
#include "server/handlers.h"
#include "server/openai_request.h"

namespace xserv::server {

using openai::ApiError;
using openai::Json;

void Api::check_model(const std::string& name) const {
  if (!name.empty() && name != options.model_name)
    throw ApiError(404,
                   fmt::format("the model '{}' does not exist; this server serves '{}'", name,
                               options.model_name),
                   "model", "invalid_request_error", "model_not_found");
}

Json Api::parse(const std::string& body) const {
  return openai::parse_body(body, options.max_json_depth);
}

std::shared_ptr<const engine::Constraint>
Api::compile(const engine::ConstraintRequest& c) const {
  if (c.empty())
    return nullptr;
  std::call_once(grammars->once, [&] {
    const auto& cfg = jobs.model()->config();
    grammars->compiler =
        std::make_unique<engine::ConstraintCompiler>(tok, cfg.vocab_size, cfg.eos_ids());
  });
  try {
    return grammars->compiler->compile(c);
  } catch (const engine::ConstraintError& e) {
    throw ApiError(400, e.what(), e.field());
  }
}

Reply error_reply(const ApiError& e) {
  Reply r;
  r.status = static_cast<unsigned>(e.status);
  if (e.status == 429 || e.status == 503)
    r.headers.emplace_back("Retry-After", "1"); // a step or two frees a row; clients retry
  r.body = dump_json(openai::error_body(e));
  return r;
}

namespace {

Reply json_reply(const Json& j) {
  Reply r;
  r.body = dump_json(j);
  return r;
}

} // namespace

Reply handle_tokenize(const Api& api, const HttpRequest& req) {
  try {
    Json body = api.parse(req.body);
    std::vector<models::TokenId> ids;
    for (auto it = body.begin(); it != body.end(); ++it)
      if (it.key() != "model" && it.key() != "prompt" && it.key() != "messages" &&
          it.key() != "reasoning_effort" && it.key() != "tools")
        throw ApiError(400, fmt::format("unknown field '{}'", it.key()), it.key());
    if (body.contains("model") && !body["model"].is_string())
      throw ApiError(400, "'model' must be a string", "model");
    api.check_model(body.value("model", ""));
    if (body.contains("prompt") == body.contains("messages"))
      throw ApiError(400, "give exactly one of 'prompt' (text) or 'messages' (a chat)", "prompt");
    if (body.contains("prompt")) {
      if (!body["prompt"].is_string())
        throw ApiError(400, "'prompt' must be a string", "prompt");
      ids = api.tok.encode(body["prompt"].get<std::string>(), models::AllowedSpecial::all());
    } else {
      Json chat = Json::object();
      for (const char* k : {"messages", "reasoning_effort", "tools"}) // moved, not copied
        if (body.contains(k))
          chat[k] = std::move(body[k]);
      ids = models::render_for_completion(api.tok, openai::parse_chat_request(chat).messages);
    }
    return json_reply({{"tokens", ids}, {"count", ids.size()}, {"max_model_len", api.max_seq()}});
  } catch (const ApiError& e) {
    return error_reply(e);
  } catch (const Error& e) {
    return error_reply(ApiError(400, e.what(), "prompt"));
  }
}

Reply handle_detokenize(const Api& api, const HttpRequest& req) {
  try {
    Json body = api.parse(req.body);
    for (auto it = body.begin(); it != body.end(); ++it)
      if (it.key() != "model" && it.key() != "tokens")
        throw ApiError(400, fmt::format("unknown field '{}'", it.key()), it.key());
    if (body.contains("model") && !body["model"].is_string())
      throw ApiError(400, "'model' must be a string", "model");
    api.check_model(body.value("model", ""));
    if (!body.contains("tokens") || !body["tokens"].is_array())
      throw ApiError(400, "'tokens' must be an array of token ids", "tokens");
    std::vector<models::TokenId> ids;
    for (const Json& t : body["tokens"]) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
          t.get<int64_t>() >= static_cast<int64_t>(api.tok.vocab_size()))
        throw ApiError(400,
                       fmt::format("'tokens' holds {}, not a token id in [0, {})", t.dump(),
                                   api.tok.vocab_size()),
                       "tokens");
      ids.push_back(static_cast<models::TokenId>(t.get<int64_t>()));
    }
    return json_reply(Json{{"prompt", api.tok.decode(ids)}});
  } catch (const ApiError& e) {
    return error_reply(e);
  } catch (const Error& e) {
    return error_reply(ApiError(400, e.what(), "tokens"));
  }
}

} // namespace xserv::server
