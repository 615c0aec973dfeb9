// The JSON an OpenAI-compatible endpoint reads and writes, and the error it answers with: every
// refusal names its HTTP status, the offending field and a machine-readable code.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/error.h"

namespace xserv::server::openai {

/// JSON with object keys in the order they came (tool schemas keep their property order).
using Json = nlohmann::ordered_json;

/// An error reported to the client as HTTP `status` with the body
/// {"error": {"message", "type", "param", "code"}}.
class ApiError : public Error {
public:
  ApiError(int status, std::string message, std::string param = "",
           std::string type = "invalid_request_error", std::string code = "")
      : Error(message), status(status), type(std::move(type)), param(std::move(param)),
        code(std::move(code)) {}
  int status;
  std::string type;  ///< invalid_request_error, authentication_error, ...
  std::string param; ///< the offending field ("" when none)
  std::string code;  ///< a machine-readable code ("" when none)
  /// Fields the error object carries besides those four (an object, or null for none): a
  /// context overflow's n_prompt_tokens and n_ctx, as llama.cpp's server names them.
  Json details;
};

/// The error object's JSON (an `error` member holding message, type, param and code; param
/// and code are null when empty).
Json error_body(const ApiError& e);

/// How deep a request body may nest arrays and objects unless --max-json-depth says otherwise
/// (as llama.cpp's server: OpenAI request bodies nest a dozen levels, tool schemas a few more).
inline constexpr int kMaxJsonDepth = 64;

/// Where `text` opens an array or object nested deeper than `max_depth` (the top level is depth
/// 1): its byte offset, or npos when it nests no deeper. One pass that skips strings as JSON
/// reads them, so for any text it never counts less than the parser would build before it
/// stops; nothing recursive touches a body before this has passed.
size_t json_too_deep_at(std::string_view text, int max_depth);

/// A request body as JSON; throws ApiError 400 when it nests deeper than `max_depth` (checked
/// before it is parsed: copying and printing a value recurse) or is not a JSON object.
Json parse_body(const std::string& body, int max_depth = kMaxJsonDepth);

} // namespace xserv::server::openai
