// parser_refusal, framing_refusal, bearer_matches and head_refusal: Beast's verdicts named.
#include "server/http_framing.h"

#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <fmt/format.h>

namespace xserv::server {

namespace http = boost::beast::http;
using openai::ApiError;

namespace {

ApiError bad(const std::string& message, int status = 400) {
  return ApiError(status, message, "", "invalid_request_error", "invalid_body_framing");
}

std::string_view view(boost::beast::string_view s) {
  return {s.data(), s.size()};
}

bool iequal(std::string_view a, std::string_view b) {
  if (a.size() != b.size())
    return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto x = static_cast<unsigned char>(a[i]), y = static_cast<unsigned char>(b[i]);
    if ((x >= 'A' && x <= 'Z' ? x + 32 : x) != (y >= 'A' && y <= 'Z' ? y + 32 : y))
      return false;
  }
  return true;
}

} // namespace

ApiError parser_refusal(const boost::beast::error_code& ec, size_t max_header, size_t max_body) {
  if (ec == http::error::header_limit || ec == http::error::buffer_overflow)
    return ApiError(431,
                    fmt::format("the request's header is larger than the server's limit of {} "
                                "bytes",
                                max_header),
                    "", "invalid_request_error", "header_too_large");
  if (ec == http::error::body_limit)
    return bad(fmt::format("the request body is larger than the server's limit of {} bytes "
                           "(--max-body)",
                           max_body),
               413);
  if (ec == http::error::bad_content_length)
    return bad("Content-Length is not a number of bytes (decimal digits), or is given again with "
               "another value or after Transfer-Encoding: the body's end is ambiguous");
  if (ec == http::error::bad_transfer_encoding)
    return bad("Transfer-Encoding is given twice or together with Content-Length: the body's "
               "end is ambiguous");
  if (ec == http::error::bad_chunk || ec == http::error::bad_chunk_extension)
    return bad("the chunked request body is malformed");
  return ApiError(400, fmt::format("the request is not valid HTTP/1.1: {}", ec.message()), "",
                  "invalid_request_error", "bad_request");
}

std::optional<ApiError> framing_refusal(std::string_view method, bool content_length,
                                        std::string_view coding) {
  if (!coding.empty()) {
    // The last coding must be chunked, or the body runs to the end of the connection.
    std::string_view last =
        coding.substr(coding.rfind(',') == std::string_view::npos ? 0 : coding.rfind(',') + 1);
    while (!last.empty() && (last.front() == ' ' || last.front() == '\t'))
      last.remove_prefix(1);
    while (!last.empty() && (last.back() == ' ' || last.back() == '\t'))
      last.remove_suffix(1);
    if (!iequal(last, "chunked"))
      return bad(fmt::format("Transfer-Encoding '{}' does not end in chunked: the body's end is "
                             "unknown",
                             std::string(coding.substr(0, 40))));
    return std::nullopt;
  }
  if (!content_length && (method == "POST" || method == "PUT" || method == "PATCH"))
    return bad(fmt::format("a {} request needs Content-Length (or a chunked body)", method), 411);
  return std::nullopt;
}

bool bearer_matches(std::string_view authorization, std::string_view key) {
  if (authorization.size() < 7 || !iequal(authorization.substr(0, 6), "bearer") ||
      authorization[6] != ' ')
    return false;
  std::string_view token = authorization.substr(7);
  while (!token.empty() && token.front() == ' ')
    token.remove_prefix(1);
  // Constant time in the key's length: how much of a guess matched is not measurable.
  unsigned char diff = token.size() == key.size() ? 0 : 1;
  for (size_t i = 0; i < key.size(); ++i)
    diff |= static_cast<unsigned char>(key[i] ^ (i < token.size() ? token[i] : ~key[i]));
  return diff == 0;
}

std::optional<ApiError> head_refusal(std::string_view bytes, size_t max_header, size_t max_body) {
  http::request_parser<http::string_body> p;
  p.header_limit(static_cast<uint32_t>(std::min<size_t>(max_header, UINT32_MAX)));
  p.body_limit(max_body);
  boost::beast::error_code ec;
  p.put(boost::asio::buffer(bytes.data(), bytes.size()), ec);
  if (ec == http::error::need_more)
    return std::nullopt;
  if (ec)
    return parser_refusal(ec, max_header, max_body);
  if (!p.is_header_done())
    return std::nullopt;
  const auto& h = p.get();
  const auto te = h.find(http::field::transfer_encoding);
  return framing_refusal(view(h.method_string()), h.find(http::field::content_length) != h.end(),
                         te == h.end() ? std::string_view() : view(te->value()));
}

} // namespace xserv::server
