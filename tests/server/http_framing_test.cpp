// check_body_framing (cli/http_framing.h): every Content-Length and Transfer-Encoding oddity that
// cpp-httplib 0.11 would misread is refused with the right status before a body byte is read.
#include <doctest/doctest.h>

#include <string>
#include <utility>
#include <vector>

#include "server/http_framing.h"

using xserv::server::check_body_framing;

namespace {

/// The status check_body_framing gives `method` with `headers` (0: accepted), and its message.
std::pair<int, std::string> framing(const std::string& method,
                                    const std::vector<std::pair<std::string, std::string>>& headers,
                                    uint64_t max_body = 1000) {
  httplib::Headers h;
  for (const auto& [k, v] : headers)
    h.emplace(k, v);
  const auto e = check_body_framing(method, h, max_body);
  return e ? std::pair<int, std::string>{e->status, e->what()} : std::pair<int, std::string>{0, ""};
}

} // namespace

TEST_CASE("check_body_framing: Content-Length must be decimal digits within the limit") {
  CHECK(framing("POST", {{"Content-Length", "12"}}).first == 0);
  CHECK(framing("POST", {{"Content-Length", "0"}}).first == 0);
  CHECK(framing("POST", {{"content-length", "1000"}}).first == 0); // names without case
  for (const char* v : {"abc", "-1", "+5", "1,1", "5 5", "0x10", "1e3", "12abc", " 7"}) {
    INFO(v);
    const auto [status, msg] = framing("POST", {{"Content-Length", v}});
    CHECK(status == 400);
    CHECK(msg == std::string("Content-Length '") + v +
                     "' is not a number of bytes (decimal "
                     "digits)");
  }
  const auto [status, msg] = framing("POST", {{"Content-Length", "1001"}});
  CHECK(status == 413);
  CHECK(msg == "the request body of 1001 bytes is larger than the server's limit of 1000 bytes "
               "(--max-body)");
  // Past 2^64: still a size, still too large (strtoull would give 2^64 - 1).
  const auto huge = framing("POST", {{"Content-Length", "99999999999999999999999999"}});
  CHECK(huge.first == 413);
  CHECK(huge.second.find("of 9999999999") != std::string::npos);
}

TEST_CASE("check_body_framing: duplicates and Transfer-Encoding") {
  CHECK(framing("POST", {{"Content-Length", "5"}, {"Content-Length", "5"}}).first == 0);
  const auto twice = framing("POST", {{"Content-Length", "5"}, {"Content-Length", "50"}});
  CHECK(twice.first == 400);
  CHECK(twice.second.find("given 2 times with different values") != std::string::npos);
  const auto both = framing("POST", {{"Content-Length", "5"}, {"Transfer-Encoding", "chunked"}});
  CHECK(both.first == 400);
  CHECK(both.second.find("Transfer-Encoding and Content-Length together") != std::string::npos);
  CHECK(framing("POST", {{"Transfer-Encoding", "chunked"}}).first == 411);
  CHECK(framing("POST", {{"Transfer-Encoding", "gzip, chunked"}}).first == 400);
  CHECK(
      framing("POST", {{"Transfer-Encoding", "chunked"}, {"Transfer-Encoding", "chunked"}}).first ==
      400);
  // No length at all: the library would read until the client closes.
  const auto none = framing("POST", {});
  CHECK(none.first == 411);
  CHECK(none.second == "a POST request needs Content-Length");
  CHECK(framing("GET", {}).first == 0);
  CHECK(framing("GET", {{"Content-Length", "0"}}).first == 0);
  CHECK(framing("GET", {{"Content-Length", "10"}}).first == 400);
  CHECK(framing("GET", {{"Transfer-Encoding", "chunked"}}).first == 400);
  CHECK(framing("GET", {{"Content-Length", "x"}}).first == 400);
}

TEST_CASE("check_body_framing: lengths past 2^64 are compared as written, and always too large") {
  // http_framing_fuzz: both saturated to 2^64 - 1 and passed as one value (413, not 400).
  const auto two = framing("",
                           {{"Content-Length", "9999999999999999999900"},
                            {"Content-Length", "9999999999999999999999999"}},
                           0);
  CHECK(two.first == 400);
  CHECK(two.second.find("with different values") != std::string::npos);
  // Leading zeros spell the same number.
  CHECK(framing("POST", {{"Content-Length", "0007"}, {"Content-Length", "7"}}).first == 0);
  // 2^64 is not 2^64 - 1, even under the largest limit.
  CHECK(framing("POST", {{"Content-Length", "18446744073709551615"}}, UINT64_MAX).first == 0);
  const auto over = framing("POST", {{"Content-Length", "18446744073709551616"}}, UINT64_MAX);
  CHECK(over.first == 413);
  CHECK(over.second.find("of 18446744073709551616 bytes") != std::string::npos);
}
