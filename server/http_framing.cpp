// check_body_framing: Content-Length and Transfer-Encoding as RFC 9112 section 6 reads them.
#include "server/http_framing.h"

#include <strings.h>

#include <vector>

#include <fmt/format.h>

namespace xserv::server {

namespace {

using openai::ApiError;

/// Every value of header `name` (names compare without case, as the library stores them).
std::vector<std::string> values_of(const httplib::Headers& headers, const char* name) {
  std::vector<std::string> out;
  const auto [first, last] = headers.equal_range(name);
  for (auto it = first; it != last; ++it)
    out.push_back(it->second);
  return out;
}

/// A header value as the client wrote it, cut and printable, for an error message.
std::string shown(const std::string& v) {
  std::string out;
  for (char c : v.substr(0, 40))
    out += c >= 0x20 && c < 0x7f ? c : '?';
  return v.size() > 40 ? out + "..." : out;
}

ApiError bad(const std::string& message, int status = 400) {
  return ApiError(status, message, "", "invalid_request_error", "invalid_body_framing");
}

} // namespace

std::optional<ApiError> check_body_framing(const std::string& method,
                                           const httplib::Headers& headers, uint64_t max_body) {
  const std::vector<std::string> lengths = values_of(headers, "Content-Length");
  const std::vector<std::string> codings = values_of(headers, "Transfer-Encoding");
  std::optional<uint64_t> length;         // saturated at UINT64_MAX
  bool length_huge = false;               // past UINT64_MAX: larger than any limit
  std::string length_text, length_digits; // digits without leading zeros, compared exactly
  for (const std::string& v : lengths) {
    // Digits only: strtoull would skip spaces, take a sign and stop at the first non-digit.
    uint64_t n = 0;
    bool huge = false;
    for (char c : v) {
      if (c < '0' || c > '9')
        return bad(
            fmt::format("Content-Length '{}' is not a number of bytes (decimal digits)", shown(v)));
      const auto d = static_cast<uint64_t>(c - '0');
      huge = huge || n > (UINT64_MAX - d) / 10;
      n = huge ? UINT64_MAX : n * 10 + d;
    }
    if (v.empty())
      return bad("Content-Length is empty");
    // The digits, not the saturated value: two numbers past 2^64 are still different lengths.
    const size_t first = v.find_first_not_of('0');
    const std::string digits = first == std::string::npos ? "0" : v.substr(first);
    if (length && digits != length_digits)
      return bad(fmt::format("Content-Length is given {} times with different values: the "
                             "body's end is ambiguous",
                             lengths.size()));
    length = n;
    length_huge = huge;
    length_text = v;
    length_digits = digits;
  }
  const bool bodyless = method == "GET" || method == "HEAD";
  if (bodyless && ((length && *length > 0) || !codings.empty()))
    return bad(fmt::format("a {} request carries no body (Content-Length {}{})", method,
                           length ? shown(length_text) : "none",
                           codings.empty() ? "" : ", Transfer-Encoding"));
  if (!codings.empty()) {
    if (length)
      return bad("Transfer-Encoding and Content-Length together: the body's end is ambiguous");
    if (codings.size() > 1 || strcasecmp(codings[0].c_str(), "chunked") != 0)
      return bad(fmt::format("Transfer-Encoding '{}' is not supported",
                             shown(codings.size() > 1 ? codings[1] : codings[0])));
    return bad("a chunked request body is not accepted: send Content-Length", 411);
  }
  const bool wants_body =
      method == "POST" || method == "PUT" || method == "PATCH" || method == "DELETE";
  if (wants_body && !length)
    return bad(fmt::format("a {} request needs Content-Length", method), 411);
  if (length && (length_huge || *length > max_body))
    return bad(fmt::format("the request body of {} bytes is larger than the server's limit of {} "
                           "bytes (--max-body)",
                           shown(length_text), max_body),
               413);
  return std::nullopt;
}

} // namespace xserv::server
