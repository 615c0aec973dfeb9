// The endpoints that read a JSON body (chat, Responses, text completions, tokenize, detokenize):
// each parses and validates its body, and answers at once or with an Exchange over the engine.
#pragma once

#include <string>

#include "models/tokenizer.h"
#include "server/http_connection.h"
#include "server/jobs.h"
#include "server/server.h"

namespace xserv::server {

/// What the endpoint handlers use: the options, the jobs (the engine and the model), the
/// tokenizer and the log. Valid once the model is attached.
struct Api {
  const ServeOptions& options;
  Jobs& jobs;
  const models::Tokenizer& tok;
  ServeLog& log;
  int64_t max_seq() const { return jobs.model()->max_seq(); }
  /// Throws ApiError 404 when `model` is neither empty nor the served name.
  void check_model(const std::string& model) const;
  /// The body as a JSON object, its nesting within --max-json-depth (ApiError 400 otherwise).
  openai::Json parse(const std::string& body) const;
};

/// The reply carrying `e`'s status and body (Retry-After on 429 and 503).
Reply error_reply(const openai::ApiError& e);

Reply handle_chat(const Api& api, const HttpRequest& req);
Reply handle_responses(const Api& api, const HttpRequest& req);
Reply handle_completion(const Api& api, const HttpRequest& req);
Reply handle_tokenize(const Api& api, const HttpRequest& req);
Reply handle_detokenize(const Api& api, const HttpRequest& req);

} // namespace xserv::server
