// The endpoints that read a JSON body (chat, Responses, text completions, tokenize, detokenize):
// each parses and validates its body, and answers at once or with an Exchange over the engine.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "engine/constraint.h"

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
  /// `c` compiled against the served vocabulary (null when it asks for nothing); ApiError 400
  /// naming the field and keyword of what cannot be enforced.
  std::shared_ptr<const engine::Constraint> compile(const engine::ConstraintRequest& c) const;

  /// The structured-output compiler, made at the first constrained request (indexing the
  /// vocabulary takes a while; most servers never need it).
  struct Grammars {
    std::once_flag once;
    std::unique_ptr<engine::ConstraintCompiler> compiler;
  };
  std::shared_ptr<Grammars> grammars = std::make_shared<Grammars>();
};

/// The reply carrying `e`'s status and body (Retry-After on 429 and 503).
Reply error_reply(const openai::ApiError& e);

Reply handle_chat(const Api& api, const HttpRequest& req);
Reply handle_responses(const Api& api, const HttpRequest& req);
Reply handle_completion(const Api& api, const HttpRequest& req);
Reply handle_tokenize(const Api& api, const HttpRequest& req);
Reply handle_detokenize(const Api& api, const HttpRequest& req);

} // namespace xserv::server
