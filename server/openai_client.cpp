// OpenAIClient over cpp-httplib's client.
#include "server/openai_client.h"

#include <chrono>

#include <fmt/format.h>
#include <httplib.h>

#include "base/error.h"

namespace xserv::server {

namespace {

/// "http://host:port[/v1][/]" -> "http://host:port"; UsageError for anything else.
std::string endpoint_base(std::string url) {
  if (!url.starts_with("http://") && !url.starts_with("https://"))
    throw UsageError(fmt::format("--endpoint '{}' must start with http:// or https://", url));
  while (url.ends_with("/"))
    url.pop_back();
  if (url.ends_with("/v1"))
    url.resize(url.size() - 3);
  if (url.find('/', url.find("//") + 2) != std::string::npos)
    throw UsageError(fmt::format("--endpoint '{}': give the server's root or its /v1", url));
  return url;
}

} // namespace

struct OpenAIClient::Http {
  explicit Http(const std::string& base) : client(base) {
    client.set_read_timeout(std::chrono::hours(1));
  }
  httplib::Client client;
  httplib::Headers headers;
};

OpenAIClient::OpenAIClient(const std::string& url, std::string api_key)
    : base_(endpoint_base(url)), api_key_(std::move(api_key)),
      http_(std::make_unique<Http>(base_)) {
  if (!api_key_.empty())
    http_->headers.emplace("Authorization", "Bearer " + api_key_);
}

OpenAIClient::~OpenAIClient() = default;

std::string OpenAIClient::first_model() {
  using Json = nlohmann::ordered_json;
  auto res = http_->client.Get("/v1/models", http_->headers);
  Json j = res ? Json::parse(res->body, nullptr, false) : Json();
  if (!res || res->status != 200 || j.is_discarded() || !j.contains("data") || j["data"].empty())
    throw Error(
        fmt::format("{}/v1/models: {} (give --model NAME)", base_,
                    res ? fmt::format("HTTP {}", res->status) : httplib::to_string(res.error())));
  return j["data"][0]["id"].get<std::string>();
}

ChatReply OpenAIClient::chat(const nlohmann::ordered_json& body) {
  using Json = nlohmann::ordered_json;
  ChatReply s;
  const auto t0 = std::chrono::steady_clock::now();
  auto res =
      http_->client.Post("/v1/chat/completions", http_->headers, body.dump(), "application/json");
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!res) {
    s.error = "request failed: " + httplib::to_string(res.error());
    return s;
  }
  Json j = Json::parse(res->body, nullptr, false);
  if (res->status != 200 || j.is_discarded() || !j.contains("choices")) {
    s.error = fmt::format("HTTP {}: {}", res->status, res->body.substr(0, 300));
    return s;
  }
  const Json& m = j["choices"][0]["message"];
  if (m.contains("content") && m["content"].is_string())
    s.content = m["content"].get<std::string>();
  for (const char* k : {"reasoning", "reasoning_content"})
    if (m.contains(k) && m[k].is_string())
      s.reasoning = m[k].get<std::string>();
  if (j.contains("usage") && j["usage"].contains("completion_tokens"))
    s.completion_tokens = j["usage"]["completion_tokens"].get<int64_t>();
  return s;
}

} // namespace xserv::server
