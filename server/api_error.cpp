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
  Json out = Json::object();
  out["error"] = std::move(err);
  return out;
}

Json parse_body(const std::string& body) {
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
