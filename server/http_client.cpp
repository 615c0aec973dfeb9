// HttpClient over Boost.Beast: a tcp_stream with a deadline per operation, a response parser with
// a buffer body so streamed events reach the caller as they arrive.
#include "server/http_client.h"

#include <cstdint>
#include <limits>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>

#include "base/error.h"

namespace xserv::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

HttpBase parse_http_base(std::string url, std::string_view what) {
  if (url.starts_with("https://"))
    throw UsageError(fmt::format("{} '{}': https is not supported; give the server's http:// "
                                 "address (or a local TLS-terminating proxy's)",
                                 what, url));
  if (!url.starts_with("http://"))
    throw UsageError(fmt::format("{} '{}' must start with http://", what, url));
  std::string rest = url.substr(7);
  while (rest.ends_with("/"))
    rest.pop_back();
  if (rest.ends_with("/v1"))
    rest.resize(rest.size() - 3);
  if (rest.find('/') != std::string::npos || rest.empty())
    throw UsageError(fmt::format("{} '{}': give the server's root or its /v1", what, url));
  HttpBase b;
  // host[:port], where host may be a bracketed IPv6 literal.
  size_t colon = rest.rfind(':');
  if (colon != std::string::npos && rest.find(']', colon) == std::string::npos) {
    b.host = rest.substr(0, colon);
    b.port = rest.substr(colon + 1);
  } else {
    b.host = rest;
    b.port = "80";
  }
  if (b.host.size() > 2 && b.host.front() == '[' && b.host.back() == ']')
    b.host = b.host.substr(1, b.host.size() - 2);
  const bool digits = !b.port.empty() && b.port.size() <= 5 &&
                      b.port.find_first_not_of("0123456789") == std::string::npos;
  if (b.host.empty() || !digits || std::stoi(b.port) < 1 || std::stoi(b.port) > 65535)
    throw UsageError(fmt::format("{} '{}': expected http://HOST:PORT", what, url));
  return b;
}

struct HttpClient::Impl {
  asio::io_context ioc;
  beast::tcp_stream stream{ioc};
  beast::flat_buffer buffer;
  bool connected = false;
  std::chrono::milliseconds timeout;

  void close() {
    beast::error_code ignored;
    stream.socket().shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
    stream.close();
    buffer.clear();
    connected = false;
  }
};

HttpClient::HttpClient(HttpBase base, std::chrono::milliseconds timeout)
    : base_(std::move(base)), impl_(std::make_unique<Impl>()) {
  impl_->timeout = timeout;
}

HttpClient::~HttpClient() {
  if (impl_->connected)
    impl_->close();
}

HttpReply HttpClient::request(std::string_view method, std::string_view target,
                              std::string_view body,
                              const std::vector<std::pair<std::string, std::string>>& headers,
                              const BodySink& sink) {
  Impl& m = *impl_;
  http::request<http::string_body> req;
  req.method_string(beast::string_view(method.data(), method.size()));
  req.target(beast::string_view(target.data(), target.size()));
  req.version(11);
  req.set(http::field::host, base_.host + ":" + base_.port);
  req.set(http::field::user_agent, "xserv");
  for (const auto& [k, v] : headers)
    req.set(k, v);
  if (!body.empty()) {
    req.set(http::field::content_type, "application/json");
    req.body() = std::string(body);
  }
  req.prepare_payload();

  HttpReply reply;
  // A kept-alive connection the server has closed meanwhile fails at the first write or read:
  // that one attempt is repeated on a new connection, nothing else is.
  for (int attempt = 0; attempt < 2; ++attempt) {
    const bool reused = m.connected;
    beast::error_code ec;
    if (!m.connected) {
      asio::ip::tcp::resolver resolver(m.ioc);
      auto hosts = resolver.resolve(base_.host, base_.port, ec);
      if (ec) {
        reply.error = fmt::format("{}: cannot resolve: {}", base_.url(), ec.message());
        return reply;
      }
      m.stream.expires_after(m.timeout);
      m.stream.connect(hosts, ec);
      if (ec) {
        reply.error = fmt::format("{}: cannot connect: {}", base_.url(), ec.message());
        m.close();
        return reply;
      }
      m.connected = true;
      // A request's header and body may go out as two writes: no Nagle delay between them.
      m.stream.socket().set_option(asio::ip::tcp::no_delay(true), ec);
    }
    m.stream.expires_after(m.timeout);
    http::write(m.stream, req, ec);
    http::response_parser<http::buffer_body> parser;
    // No limit (Boost 1.74 compares a Content-Length against an unset limit as exceeding it).
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    if (!ec) {
      m.stream.expires_after(m.timeout);
      http::read_header(m.stream, m.buffer, parser, ec);
    }
    if (ec) {
      m.close();
      if (reused && (ec == http::error::end_of_stream || ec == asio::error::connection_reset ||
                     ec == asio::error::broken_pipe || ec == asio::error::eof))
        continue;
      reply.error = fmt::format("{}{}: {}", base_.url(), target, ec.message());
      return reply;
    }
    reply.status = static_cast<int>(parser.get().result_int());
    const bool to_sink = sink && reply.status == 200;
    char chunk[16384];
    while (!parser.is_done()) {
      parser.get().body().data = chunk;
      parser.get().body().size = sizeof chunk;
      m.stream.expires_after(m.timeout);
      // read_some: what has arrived, so a stream's events reach the sink one by one rather
      // than when the buffer fills.
      http::read_some(m.stream, m.buffer, parser, ec);
      if (ec == http::error::need_buffer)
        ec = {};
      if (ec) {
        reply.error =
            fmt::format("{}{}: {} (reading the response)", base_.url(), target, ec.message());
        reply.status = 0;
        m.close();
        return reply;
      }
      const std::string_view got(chunk, sizeof chunk - parser.get().body().size);
      if (to_sink) {
        if (!got.empty() && !sink(got)) {
          m.close(); // hang up
          return reply;
        }
      } else {
        reply.body.append(got);
      }
    }
    if (!parser.get().keep_alive())
      m.close();
    return reply;
  }
  return reply;
}

} // namespace xserv::server
