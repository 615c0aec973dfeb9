// error_body() and parse_body().
#include "server/api_error.h"

#include <fmt/format.h>

#include "models/json_error.h"
#include "server/openai_fields.h"

namespace xserv::server::openai {

Json error_body(const ApiError& e) {
  Json err = Json::object();
  err["message"] = e.what();
  err["type"] = e.type;
  err["param"] = e.param.empty() ? Json(nullptr) : Json(e.param);
  err["code"] = e.code.empty() ? Json(nullptr) : Json(e.code);
  if (e.details.is_object())
    for (const auto& [k, v] : e.details.items())
      if (!err.contains(k))
        err[k] = v;
  Json out = Json::object();
  out["error"] = std::move(err);
  return out;
}

size_t json_too_deep_at(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i; // the escaped character cannot end the string
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth)
        return i;
    } else if (c == ']' || c == '}') {
      depth = depth > 0 ? depth - 1 : 0;
    }
  }
  return std::string_view::npos;
}

Json parse_body(const std::string& body, int max_depth) {
  if (const size_t at = json_too_deep_at(body, max_depth); at != std::string_view::npos)
    throw ApiError(400,
                   fmt::format("the request body nests arrays and objects deeper than the "
                               "server's limit of {} levels (at byte {}; --max-json-depth)",
                               max_depth, at),
                   "", "invalid_request_error", "json_too_deep");
  Json j;
  try {
    j = Json::parse(body);
  } catch (const nlohmann::json::exception& e) {
    // parse_error, and out_of_range for a number no double holds (1e400)
    throw ApiError(400, fmt::format("the request body is not valid JSON: {}",
                                    models::json_error_text(e.what())));
  }
  if (!j.is_object())
    throw ApiError(400, "the request body must be a JSON object, not " + type_name(j));
  return j;
}

} // namespace xserv::server::openai
