// A client of an OpenAI-compatible server (xserv serve, llama-server, vLLM), for `xserv eval
// --endpoint`: the server's model list and non-streaming chat completions, each reply or error
// as a value (the load generator of `xserv bench --endpoint` streams: server/http_load.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace xserv::server {

/// What one chat completion came back with.
struct ChatReply {
  std::string content, reasoning; ///< the message's content and reasoning (or reasoning_content)
  int64_t completion_tokens = 0;  ///< usage.completion_tokens, 0 when absent
  double seconds = 0;             ///< wall time of the request
  std::string error;              ///< transport or HTTP error; empty on success
};

class OpenAIClient {
public:
  /// `url`: "http://host:port", optionally with "/v1" and a trailing "/". Throws UsageError for
  /// anything else (another scheme, a path beyond /v1).
  OpenAIClient(const std::string& url, std::string api_key = "");
  ~OpenAIClient();
  OpenAIClient(const OpenAIClient&) = delete;
  OpenAIClient& operator=(const OpenAIClient&) = delete;

  /// "http://host:port", as requests go to it.
  const std::string& base() const { return base_; }
  /// The first model GET /v1/models lists. Throws xserv::Error naming the URL otherwise.
  std::string first_model();
  /// POST /v1/chat/completions with `body` (non-streaming), waiting up to an hour. Safe to call
  /// from one thread per client; make a client per thread for concurrency.
  ChatReply chat(const nlohmann::ordered_json& body);

private:
  struct Http;
  std::string base_, api_key_;
  std::unique_ptr<Http> http_;
};

} // namespace xserv::server
