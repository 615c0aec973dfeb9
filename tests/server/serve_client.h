// Test helpers for `xserv serve`: raw HTTP/1.1 over loopback sockets, SSE parsing, polling.
#pragma once

#include <arpa/inet.h>
#include <chrono>
#include <functional>
#include <netinet/in.h>
#include <poll.h>
#include <string>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <doctest/doctest.h>

namespace xserv::testing {

/// A response read to the end of the connection; `body` is de-chunked.
struct HttpResponse {
  int status = 0;
  std::string headers; ///< the header block, lower-cased names kept as sent
  std::string body;
};

/// A connected TCP socket to 127.0.0.1:port (closed by the destructor).
struct Socket {
  int fd = -1;
  explicit Socket(int port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  }
  ~Socket() { close(); }
  void close() {
    if (fd >= 0)
      ::close(fd);
    fd = -1;
  }
  void send_all(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      REQUIRE(n > 0);
      off += size_t(n);
    }
  }
  /// Reads what is there (blocking for at least one byte); "" at end of stream.
  std::string read_some() {
    char buf[65536];
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    return n > 0 ? std::string(buf, size_t(n)) : std::string();
  }
};

/// The bytes of one request with `Connection: close`.
inline std::string http_request(const std::string& method, const std::string& path,
                                const std::string& body, const std::string& extra_headers = "") {
  return method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" +
         "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n" + extra_headers + "\r\n" + body;
}

/// Decodes a chunked transfer-encoded body, checking the framing: each chunk's data is exactly
/// its size line's length and ends with CRLF.
inline std::string dechunk(const std::string& raw) {
  std::string out;
  size_t i = 0;
  while (i < raw.size()) {
    size_t eol = raw.find("\r\n", i);
    if (eol == std::string::npos)
      break;
    size_t n = std::stoul(raw.substr(i, eol - i), nullptr, 16);
    if (n == 0)
      break;
    out += raw.substr(eol + 2, n);
    CHECK_MESSAGE(raw.compare(eol + 2 + n, 2, "\r\n") == 0,
                  "a chunk of " << n << " bytes is not followed by CRLF");
    i = eol + 2 + n + 2;
  }
  return out;
}

/// Sends a request and reads the whole response.
inline HttpResponse http(int port, const std::string& method, const std::string& path,
                         const std::string& body = "", const std::string& extra_headers = "") {
  Socket s(port);
  s.send_all(http_request(method, path, body, extra_headers));
  std::string raw;
  for (std::string part = s.read_some(); !part.empty(); part = s.read_some())
    raw += part;
  HttpResponse r;
  size_t head_end = raw.find("\r\n\r\n");
  REQUIRE(head_end != std::string::npos);
  r.headers = raw.substr(0, head_end);
  r.status = std::stoi(raw.substr(9, 3));
  r.body = raw.substr(head_end + 4);
  if (r.headers.find("Transfer-Encoding: chunked") != std::string::npos)
    r.body = dechunk(r.body);
  return r;
}

/// What a socket received until the server closed it, waiting at most `limit` in all; `closed`
/// says whether it did (end of stream or a reset) within the limit.
struct Drained {
  std::string bytes;
  bool closed = false;
};
inline Drained read_until_closed(Socket& s, std::chrono::milliseconds limit) {
  Drained d;
  const auto end = std::chrono::steady_clock::now() + limit;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      return d;
    pollfd p{s.fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0)
      continue;
    char buf[65536];
    const ssize_t n = ::recv(s.fd, buf, sizeof buf, 0);
    if (n <= 0) {
      d.closed = true;
      return d;
    }
    d.bytes.append(buf, size_t(n));
  }
}

/// The responses in `raw`, one after another (bodies by Content-Length or chunked); stops at
/// the first that is not complete.
inline std::vector<HttpResponse> parse_responses(const std::string& raw) {
  std::vector<HttpResponse> out;
  size_t at = 0;
  while (at < raw.size()) {
    const size_t head_end = raw.find("\r\n\r\n", at);
    if (head_end == std::string::npos || raw.compare(at, 5, "HTTP/") != 0)
      break;
    HttpResponse r;
    r.headers = raw.substr(at, head_end - at);
    r.status = std::stoi(raw.substr(at + 9, 3));
    size_t body = head_end + 4;
    if (r.headers.find("Transfer-Encoding: chunked") != std::string::npos) {
      const size_t last = raw.find("\r\n0\r\n\r\n", body - 2);
      if (last == std::string::npos)
        break;
      r.body = dechunk(raw.substr(body, last + 7 - body));
      at = last + 7;
    } else {
      const size_t cl = r.headers.find("Content-Length: ");
      const size_t n = cl == std::string::npos ? 0 : std::stoul(r.headers.substr(cl + 16));
      if (body + n > raw.size())
        break;
      r.body = raw.substr(body, n);
      at = body + n;
    }
    out.push_back(std::move(r));
  }
  return out;
}

/// The payloads of the `data: ` lines of an SSE body, in order.
inline std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < body.size()) {
    size_t eol = body.find('\n', i);
    if (eol == std::string::npos)
      eol = body.size();
    std::string line = body.substr(i, eol - i);
    if (line.rfind("data: ", 0) == 0)
      out.push_back(line.substr(6));
    i = eol + 1;
  }
  return out;
}

/// Polls `done` every 10 ms until it holds or `limit` passes (a liveness bound, not a timing
/// assertion); returns whether it held.
inline bool eventually(const std::function<bool()>& done,
                       std::chrono::milliseconds limit = std::chrono::seconds(120)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (done())
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

} // namespace xserv::testing
