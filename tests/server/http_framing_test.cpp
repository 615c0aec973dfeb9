// Request framing as a session judges it (server/http_framing.h): Beast's parser under the
// header and body limits, then the server's two rules; every Content-Length and
// Transfer-Encoding oddity gets its status before a byte of the body is read. And the Bearer
// check of the API key.
#include <doctest/doctest.h>

#include <string>
#include <utility>

#include "server/http_framing.h"

using xserv::server::bearer_matches;
using xserv::server::head_refusal;

namespace {

/// The status a request with `method` and `headers` (each "Name: value\r\n") gets as soon as
/// its header is in (0: its body may be read), and the message.
std::pair<int, std::string> framing(const std::string& method, const std::string& headers,
                                    size_t max_body = 1000, size_t max_header = 8192) {
  const std::string bytes = method + " /v1/completions HTTP/1.1\r\nHost: x\r\n" + headers + "\r\n";
  const auto e = head_refusal(bytes, max_header, max_body);
  return e ? std::pair<int, std::string>{e->status, e->what()} : std::pair<int, std::string>{0, ""};
}

} // namespace

TEST_CASE("framing: Content-Length must be decimal digits within the limit") {
  CHECK(framing("POST", "Content-Length: 12\r\n").first == 0);
  CHECK(framing("POST", "Content-Length: 0\r\n").first == 0);
  CHECK(framing("POST", "content-length: 1000\r\n").first == 0); // names without case
  // A list of one value ("1,1"), which RFC 9110 lets a recipient read as 1, is refused: a
  // proxy in front may have read it otherwise.
  for (const char* v : {"abc", "-1", "+5", "5 5", "0x10", "1e3", "12abc", "1,2", "1,1", "7, 7"}) {
    INFO(v);
    const auto [status, msg] = framing("POST", std::string("Content-Length: ") + v + "\r\n");
    CHECK(status == 400);
    CHECK(msg.find("is not a number of bytes") != std::string::npos);
  }
  // Digits past what the parser counts (2^64) are simply too large.
  for (const char* v : {"18446744073709551616", "99999999999999999999999999",
                        "1000000000000000000000000000000"}) {
    INFO(v);
    const auto [status, msg] = framing("POST", std::string("Content-Length: ") + v + "\r\n");
    CHECK(status == 413);
    CHECK(msg.find("larger than the server's limit of 1000 bytes") != std::string::npos);
  }
  const auto [status, msg] = framing("POST", "Content-Length: 1001\r\n");
  CHECK(status == 413);
  CHECK(msg == "the request body is larger than the server's limit of 1000 bytes (--max-body)");
  // The largest length Beast reads, over any limit but the largest.
  CHECK(framing("POST", "Content-Length: 18446744073709551615\r\n").first == 413);
}

TEST_CASE("framing: duplicates and Transfer-Encoding") {
  CHECK(framing("POST", "Content-Length: 5\r\nContent-Length: 5\r\n").first == 0);
  CHECK(framing("POST", "Content-Length: 0007\r\nContent-Length: 7\r\n").first == 0);
  const auto twice = framing("POST", "Content-Length: 5\r\nContent-Length: 50\r\n");
  CHECK(twice.first == 400);
  CHECK(twice.second.find("given again with another value") != std::string::npos);
  const auto both = framing("POST", "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n");
  CHECK(both.first == 400);
  CHECK(both.second.find("together with Content-Length") != std::string::npos);
  CHECK(framing("POST", "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n").first == 400);
  // A chunked body is read under the body limit as it comes.
  CHECK(framing("POST", "Transfer-Encoding: chunked\r\n").first == 0);
  const auto coded = framing("POST", "Transfer-Encoding: gzip, chunked\r\n");
  CHECK(coded.first == 501); // a coding the server would have to decode
  CHECK(coded.second.find("decodes chunked only") != std::string::npos);
  const auto chunked2 = framing("POST", "Transfer-Encoding: chunked, chunked\r\n");
  CHECK(chunked2.first == 400);
  CHECK(chunked2.second.find("applies chunked twice") != std::string::npos);
  CHECK(framing("POST", "Transfer-Encoding: Chunked \r\n").first == 0);
  CHECK(framing("POST", "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n").first ==
        501); // one list over two fields
  CHECK(framing("POST", "Transfer-Encoding: \r\nTransfer-Encoding: chunked\r\n").first == 400);
  const auto gzip = framing("POST", "Transfer-Encoding: chunked, gzip\r\n");
  CHECK(gzip.first == 400);
  CHECK(gzip.second.find("does not end in chunked") != std::string::npos);
  CHECK(framing("POST", "Transfer-Encoding: gzip\r\n").first == 400);
  CHECK(framing("POST", "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n").first ==
        400);
  // No length at all: the body would be read as the next request.
  const auto none = framing("POST", "");
  CHECK(none.first == 411);
  CHECK(none.second == "a POST request needs Content-Length (or a chunked body)");
  CHECK(framing("GET", "").first == 0);
  CHECK(framing("GET", "Content-Length: 0\r\n").first == 0);
  CHECK(framing("GET", "Content-Length: x\r\n").first == 400);
}

TEST_CASE("framing: the header limit, malformed requests, an incomplete header") {
  const auto big = framing("GET", "X-Big: " + std::string(9000, 'b') + "\r\n", 1000, 8192);
  CHECK(big.first == 431);
  CHECK(big.second.find("limit of 8192 bytes") != std::string::npos);
  CHECK(head_refusal("GARBAGE\r\n\r\n", 8192, 1000)->status == 400);
  CHECK(head_refusal("GET / HTTP/1.1\r\nBad Header\r\n\r\n", 8192, 1000)->status == 400);
  // A space before the colon (a smuggling classic) is refused, naming the line.
  const auto spaced =
      head_refusal("POST / HTTP/1.1\r\nHost: x\r\nContent-Length : 2\r\n\r\n", 8192, 1000);
  REQUIRE(spaced);
  CHECK(spaced->status == 400);
  CHECK(std::string(spaced->what()).find("'Content-Length : 2' is not a field") !=
        std::string::npos);
  CHECK(!head_refusal("POST / HTTP/1.1\r\nContent-Len", 8192, 1000));
}

TEST_CASE("bearer_matches: the scheme in any case, the key exactly") {
  CHECK(bearer_matches("Bearer sekrit", "sekrit"));
  CHECK(bearer_matches("bearer sekrit", "sekrit"));
  CHECK(bearer_matches("BEARER  sekrit", "sekrit"));
  CHECK(!bearer_matches("Bearer sekri", "sekrit"));
  CHECK(!bearer_matches("Bearer sekritt", "sekrit"));
  CHECK(!bearer_matches("Bearer Sekrit", "sekrit"));
  CHECK(!bearer_matches("Basic sekrit", "sekrit"));
  CHECK(!bearer_matches("Bearersekrit", "sekrit"));
  CHECK(!bearer_matches("", "sekrit"));
  CHECK(!bearer_matches("sekrit", "sekrit"));
}
