// parser_refusal, framing_refusal, bearer_matches and head_refusal: Beast's verdicts named.
#include "server/http_framing.h"

#include <algorithm>
#include <cctype>
#include <vector>

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

namespace {

std::string_view trim(std::string_view v) {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t'))
    v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t'))
    v.remove_suffix(1);
  return v;
}

bool digits(std::string_view v) {
  return !v.empty() && std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
}

/// A decimal length as written, leading zeros dropped: compared by length then text, so that
/// values past 2^64 are still ordered.
std::string_view significant(std::string_view v) {
  while (v.size() > 1 && v.front() == '0')
    v.remove_prefix(1);
  return v;
}

bool larger(std::string_view a, std::string_view b) {
  a = significant(a), b = significant(b);
  return a.size() != b.size() ? a.size() > b.size() : a > b;
}

/// The header's field lines (after the request line, if `head` still starts with it: a session's
/// parser has consumed it by the time a field fails; up to the empty line), as written.
std::vector<std::string_view> field_lines(std::string_view head) {
  std::vector<std::string_view> out;
  bool first = true;
  for (size_t at = 0; at < head.size();) {
    const size_t end = std::min(head.find('\n', at), head.size());
    std::string_view line = head.substr(at, end - at);
    at = end + 1;
    if (!line.empty() && line.back() == '\r')
      line.remove_suffix(1);
    const bool request_line = first && line.size() > 9 &&
                              line.substr(line.size() - 9, 7) == " HTTP/1";
    first = false;
    if (request_line)
      continue;
    if (line.empty())
      break;
    out.push_back(line);
  }
  return out;
}

/// The values of the fields named `name` (without regard to case) among `head`'s lines.
std::vector<std::string_view> field_values(std::string_view head, std::string_view name) {
  std::vector<std::string_view> out;
  for (std::string_view line : field_lines(head)) {
    const size_t colon = line.find(':');
    if (colon != std::string_view::npos && iequal(line.substr(0, colon), name))
      out.push_back(trim(line.substr(colon + 1)));
  }
  return out;
}

/// A field line that is not `token ":" value` (a space before the colon, no colon, a name of
/// other characters), or "".
std::string_view malformed_line(std::string_view head) {
  static const std::string_view kTchar = "!#$%&'*+-.^_`|~";
  for (std::string_view line : field_lines(head)) {
    const size_t colon = line.find(':');
    const std::string_view name = line.substr(0, colon);
    const bool ok = colon != std::string_view::npos && colon > 0 &&
                    std::all_of(name.begin(), name.end(), [](char c) {
                      return std::isalnum(static_cast<unsigned char>(c)) ||
                             kTchar.find(c) != std::string_view::npos;
                    });
    if (!ok)
      return line;
  }
  return {};
}

} // namespace

ApiError parser_refusal(const boost::beast::error_code& ec, size_t max_header, size_t max_body,
                        std::string_view head) {
  if (ec == http::error::header_limit || ec == http::error::buffer_overflow)
    return ApiError(431,
                    fmt::format("the request's header is larger than the server's limit of {} "
                                "bytes",
                                max_header),
                    "", "invalid_request_error", "header_too_large");
  const std::string too_large = fmt::format(
      "the request body is larger than the server's limit of {} bytes (--max-body)", max_body);
  if (ec == http::error::body_limit)
    return bad(too_large, 413);
  if (ec == http::error::bad_content_length) {
    // One length of digits that the parser still refused is past what it counts (2^64): too
    // large. Two that differ, or one beside Transfer-Encoding, leave the body's end ambiguous.
    const std::vector<std::string_view> lengths = field_values(head, "content-length");
    const bool all_digits =
        !lengths.empty() && std::all_of(lengths.begin(), lengths.end(), digits);
    const bool agree = all_digits && std::all_of(lengths.begin(), lengths.end(), [&](auto v) {
                         return significant(v) == significant(lengths[0]);
                       });
    if (agree && field_values(head, "transfer-encoding").empty() &&
        significant(lengths[0]).size() > 19) // past 2^64 - 1's 20 digits, or at them
      return bad(too_large, 413);
    return bad("Content-Length is not a number of bytes (decimal digits), or is given again with "
               "another value or after Transfer-Encoding: the body's end is ambiguous");
  }
  if (ec == http::error::bad_transfer_encoding)
    return bad("Transfer-Encoding is given twice or together with Content-Length: the body's "
               "end is ambiguous");
  if (ec == http::error::bad_chunk || ec == http::error::bad_chunk_extension)
    return bad("the chunked request body is malformed");
  if (ec == http::error::bad_field)
    if (const std::string_view line = malformed_line(head); !line.empty())
      return ApiError(400,
                      fmt::format("the request is not valid HTTP/1.1: the header line '{}' is not "
                                  "a field (NAME: value, no space before the colon)",
                                  std::string(line.substr(0, 60))),
                      "", "invalid_request_error", "bad_request");
  return ApiError(400, fmt::format("the request is not valid HTTP/1.1: {}", ec.message()), "",
                  "invalid_request_error", "bad_request");
}

std::optional<ApiError> framing_refusal(std::string_view method,
                                        const std::vector<std::string_view>& lengths,
                                        const std::vector<std::string_view>& encodings) {
  if (!encodings.empty()) {
    // Chunked, once and last: the only coding whose end the server can find and decode (RFC
    // 9112 6.1: chunked at most once; a coding the server cannot decode gets 501). Several
    // fields are one list; an empty one is refused, not skipped.
    std::vector<std::string_view> codings;
    std::string coding;
    for (std::string_view field : encodings) {
      if (trim(field).empty())
        return bad("Transfer-Encoding is given empty: the body's end is ambiguous");
      coding += (coding.empty() ? "" : ", ") + std::string(field);
      for (size_t at = 0; at <= field.size();) {
        const size_t comma = std::min(field.find(',', at), field.size());
        if (const std::string_view c = trim(field.substr(at, comma - at)); !c.empty())
          codings.push_back(c);
        at = comma + 1;
      }
    }
    const std::string shown = coding.substr(0, 40);
    if (codings.empty() || !iequal(codings.back(), "chunked"))
      return bad(fmt::format("Transfer-Encoding '{}' does not end in chunked: the body's end is "
                             "unknown",
                             shown));
    if (codings.size() == 1)
      return std::nullopt;
    if (std::any_of(codings.begin(), codings.end() - 1,
                    [](std::string_view c) { return iequal(c, "chunked"); }))
      return bad(fmt::format("Transfer-Encoding '{}' applies chunked twice", shown));
    return bad(fmt::format("Transfer-Encoding '{}': the server decodes chunked only (send the "
                           "body without other codings)",
                           shown),
               501);
  }
  // Content-Length as one decimal number: a list ("1,1", which RFC 9110 lets a recipient take
  // as 1) is refused, so that no proxy before the server can have read another length.
  for (std::string_view v : lengths)
    if (!digits(v))
      return bad(fmt::format("Content-Length '{}' is not a number of bytes (decimal digits): "
                             "the body's end is ambiguous",
                             std::string(v.substr(0, 40))));
  if (lengths.empty() && (method == "POST" || method == "PUT" || method == "PATCH"))
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
    return parser_refusal(ec, max_header, max_body, bytes);
  if (!p.is_header_done())
    return std::nullopt;
  const auto& h = p.get();
  std::vector<std::string_view> lengths, encodings;
  for (auto [it, end] = h.equal_range(http::field::content_length); it != end; ++it)
    lengths.push_back(view(it->value()));
  for (auto [it, end] = h.equal_range(http::field::transfer_encoding); it != end; ++it)
    encodings.push_back(view(it->value()));
  return framing_refusal(view(h.method_string()), lengths, encodings);
}

} // namespace xserv::server
