// OpenAIClient over server/http_client.h.
#include "server/openai_client.h"

#include <chrono>

#include <fmt/format.h>

#include "base/error.h"
#include "server/http_client.h"

namespace xserv::server {

struct OpenAIClient::Http {
  explicit Http(const HttpBase& base) : client(base, std::chrono::hours(1)) {}
  HttpClient client;
  std::vector<std::pair<std::string, std::string>> headers;
};

OpenAIClient::OpenAIClient(const std::string& url, std::string api_key)
    : api_key_(std::move(api_key)) {
  const HttpBase b = parse_http_base(url);
  base_ = b.url();
  http_ = std::make_unique<Http>(b);
  if (!api_key_.empty())
    http_->headers.emplace_back("Authorization", "Bearer " + api_key_);
}

OpenAIClient::~OpenAIClient() = default;

std::string OpenAIClient::first_model() {
  using Json = nlohmann::ordered_json;
  const HttpReply res = http_->client.request("GET", "/v1/models", "", http_->headers);
  Json j = res.ok() ? Json::parse(res.body, nullptr, false) : Json();
  if (!res.ok() || j.is_discarded() || !j.contains("data") || !j["data"].is_array() ||
      j["data"].empty() || !j["data"][0].contains("id") || !j["data"][0]["id"].is_string())
    throw Error(fmt::format("{} (give --model NAME)",
                            !res.error.empty()
                                ? res.error
                                : fmt::format("{}/v1/models: {}", base_,
                                              res.status != 200 ? fmt::format("HTTP {}", res.status)
                                                                : std::string("no model listed"))));
  return j["data"][0]["id"].get<std::string>();
}

ChatReply OpenAIClient::chat(const nlohmann::ordered_json& body) {
  using Json = nlohmann::ordered_json;
  ChatReply s;
  const auto t0 = std::chrono::steady_clock::now();
  const HttpReply res =
      http_->client.request("POST", "/v1/chat/completions", body.dump(), http_->headers);
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!res.error.empty()) {
    s.error = "request failed: " + res.error;
    return s;
  }
  Json j = Json::parse(res.body, nullptr, false);
  if (res.status != 200 || j.is_discarded() || !j.contains("choices") || !j["choices"].is_array() ||
      j["choices"].empty()) {
    s.error = fmt::format("HTTP {}: {}", res.status, res.body.substr(0, 300));
    return s;
  }
  const Json& m = j["choices"][0]["message"];
  if (m.contains("content") && m["content"].is_string())
    s.content = m["content"].get<std::string>();
  for (const char* k : {"reasoning", "reasoning_content"})
    if (m.contains(k) && m[k].is_string())
      s.reasoning = m[k].get<std::string>();
  if (j.contains("usage") && j["usage"].contains("completion_tokens") &&
      j["usage"]["completion_tokens"].is_number_integer())
    s.completion_tokens = j["usage"]["completion_tokens"].get<int64_t>();
  return s;
}

} // namespace xserv::server
