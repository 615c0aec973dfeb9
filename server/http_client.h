// A blocking HTTP/1.1 client over Boost.Beast (kept out of this header) for the clients of an
// OpenAI-compatible server: `xserv eval --endpoint` (server/openai_client.h) and `xserv bench
// --endpoint` (server/http_load.h). One connection, kept alive between requests and opened again
// when the server closed it; every read and write under a deadline; a streamed body handed over
// as it arrives.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace xserv::server {

/// "http://host:port[/v1][/]" split into host and port ("80" when none). Throws UsageError naming
/// `what` (the flag) for another scheme, a path beyond /v1 or a bad port.
struct HttpBase {
  std::string host, port;
  std::string url() const { return "http://" + host + ":" + port; }
};
HttpBase parse_http_base(std::string url, std::string_view what = "--endpoint");

/// What a request came back with. `error` is set for a transport failure (refused, timed out, a
/// malformed response); `status` is 0 then.
struct HttpReply {
  int status = 0;
  std::string body; ///< the whole body, unless a body callback took it
  std::string error;
  bool ok() const { return error.empty() && status == 200; }
};

class HttpClient {
public:
  /// `timeout` bounds connecting and each read or write (not a whole streamed response).
  HttpClient(HttpBase base, std::chrono::milliseconds timeout);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  /// Receives a piece of a 200 response's body as it arrives; false hangs up (the connection is
  /// closed and the reply's error stays empty).
  using BodySink = std::function<bool(std::string_view)>;

  /// One request; `headers` are (name, value) pairs beyond Host, Content-Type (JSON when a body
  /// is given) and Content-Length. With `sink`, a 200 response's body goes to it and not to
  /// HttpReply::body (other statuses keep their body for the error).
  HttpReply request(std::string_view method, std::string_view target, std::string_view body,
                    const std::vector<std::pair<std::string, std::string>>& headers = {},
                    const BodySink& sink = {});

  const HttpBase& base() const { return base_; }

private:
  struct Impl;
  HttpBase base_;
  std::unique_ptr<Impl> impl_;
};

} // namespace xserv::server
