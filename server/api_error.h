// The JSON an OpenAI-compatible endpoint reads and writes, and the error it answers with: every
// refusal names its HTTP status, the offending field and a machine-readable code.
#pragma once

#include <string>

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
};

/// The error object's JSON (an `error` member holding message, type, param and code; param
/// and code are null when empty).
Json error_body(const ApiError& e);

/// A request body as JSON; throws ApiError 400 when it is not a JSON object.
Json parse_body(const std::string& body);

} // namespace xserv::server::openai
