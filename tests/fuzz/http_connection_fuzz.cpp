// libFuzzer target: any byte string as what one client sends on one connection to the server's
// connection layer (server/http_connection.h, a real loopback socket, deadlines of 50-100 ms),
// written in pieces of a size the input picks (partial reads), optionally half-closed after.
// The answers are held to the layer's contract: every byte that comes back parses as HTTP/1.1
// responses (the last may be cut short only by a reset, or when the client half-closed with a
// request in hand, which abandons it); the handler's replies come in the order of their
// requests (pipelined requests answered in order); a reply the layer makes itself (a refused,
// malformed request: 400, 411, 413, 431 or 501) is the last on its connection; a response to HEAD has no body; a stream's
// events arrive whole and in order; and the server closes the connection by itself (at the
// latest when a deadline passes), never hangs, never crashes.
//
// Input: byte 0 picks the write size (bits 0-2: 1, 2, 3, 7, 16, 64, 512, all) and whether the
// client half-closes after writing (bit 3); the rest is the byte stream. Paths the fake handler
// knows: /refuse (401 from on_head, before the body), /wait (an answer that comes later, one
// body), /stream (three SSE events, each in its own take), anything else: answered at once.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "server/http_connection.h"

namespace {

using namespace xserv::server;
namespace http = boost::beast::http;

[[noreturn]] void contract_broken(const char* what) {
  std::fprintf(stderr, "http_connection_fuzz: %s\n", what);
  std::abort();
}

std::atomic<int64_t> g_seq{0}; ///< the number of the request whose header came last
std::mutex g_mu;
std::map<int64_t, bool> g_head; ///< per request number: was it a HEAD (no body in its answer)

/// A reply that comes over several takes: `parts` event strings for a stream, else one body.
class Later : public Pending {
public:
  Later(bool stream, int64_t seq) : stream_(stream), seq_(seq) {}
  bool streaming() const override { return stream_; }
  void start(std::function<void()> wake) override {
    wake_ = std::move(wake);
    wake_();
  }
  bool take(std::string& out, unsigned& status) override {
    ++takes_;
    if (stream_) {
      out += "data: " + std::to_string(seq_) + "." + std::to_string(takes_) + "\n\n";
      if (takes_ < 3)
        wake_();
      return takes_ >= 3;
    }
    if (takes_ < 2) {
      wake_();
      return false;
    }
    status = 200;
    out = "later " + std::to_string(seq_);
    return true;
  }
  void cancel() override {}

private:
  bool stream_;
  int64_t seq_;
  int takes_ = 0;
  std::function<void()> wake_;
};

class FakeHandler : public HttpHandler {
public:
  std::optional<Reply> on_head(const HttpRequest& head) override {
    const int64_t seq = ++g_seq;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      g_head[seq] = head.method == "HEAD";
    }
    if (head.path != "/refuse")
      return std::nullopt;
    Reply r;
    r.status = 401;
    r.body = "refused";
    r.headers = {{"X-Seq", std::to_string(seq)}};
    return r;
  }
  void on_request(HttpRequest req, std::function<void(Reply)> done) override {
    const int64_t seq = g_seq.load();
    Reply r;
    r.headers = {{"X-Seq", std::to_string(seq)}};
    if (req.path == "/wait" || req.path == "/stream")
      r.pending = std::make_shared<Later>(req.path == "/stream", seq);
    else
      r.body = "body of " + std::to_string(req.body.size()) + " bytes";
    done(std::move(r));
  }
};

struct Server {
  FakeHandler handler;
  Connections connections;
  int port;
  static ConnectionLimits limits() {
    ConnectionLimits l;
    l.header_timeout = std::chrono::milliseconds(100);
    l.body_timeout = std::chrono::milliseconds(100);
    l.idle_timeout = std::chrono::milliseconds(50);
    l.write_timeout = std::chrono::milliseconds(2000);
    l.linger_timeout = std::chrono::milliseconds(50);
    l.max_header_bytes = 1024;
    l.max_body_bytes = 4096;
    return l;
  }
  Server() : connections(limits(), handler, 1), port(connections.listen("127.0.0.1", 0)) {}
};

/// The X-Seq value of a response header block, or -1.
int64_t seq_of(const std::string& head) {
  const size_t at = head.find("\r\nX-Seq: ");
  return at == std::string::npos ? -1 : std::stoll(head.substr(at + 9));
}

/// Checks what came back: well-formed responses, the handler's in order. `cut`: the last
/// response may be cut short (the connection was reset, or the client half-closed with a
/// request in hand, which abandons it).
void check_answers(const std::string& got, int64_t first_seq, bool cut) {
  size_t at = 0;
  int64_t want = first_seq;
  bool layer_reply = false;
  while (at < got.size()) {
    if (layer_reply)
      contract_broken("a response after the connection layer's own refusal");
    const size_t head_end = got.find("\r\n\r\n", at);
    if (head_end == std::string::npos) {
      if (cut)
        return;
      contract_broken("the answer ends inside a response header");
    }
    const int64_t n = seq_of(got.substr(at, head_end - at));
    http::response_parser<http::string_body> p;
    p.body_limit(1 << 20);
    p.header_limit(1 << 16);
    if (n >= 0) {
      std::lock_guard<std::mutex> lock(g_mu);
      p.skip(g_head[n]);
    }
    boost::beast::error_code ec;
    while (!p.is_done()) {
      size_t used = 0;
      if (at < got.size())
        used = p.put(boost::asio::buffer(got.data() + at, got.size() - at), ec);
      at += used;
      if (ec == http::error::need_more && at < got.size() && used > 0) {
        ec = {};
        continue;
      }
      if (used == 0 && (!ec || ec == http::error::need_more))
        at = got.size(); // what is left cannot complete a response: as at the end
      if (at == got.size() && (!ec || ec == http::error::need_more)) { // the end of the data
        ec = {};
        p.put_eof(ec); // a body delimited by the close (an HTTP/1.0 stream)
        if (ec && cut)
          return;
        if (ec)
          contract_broken("the answer ends inside a response");
        break;
      }
      if (ec)
        contract_broken("the answer does not parse as HTTP/1.1 responses");
    }
    const auto& res = p.get();
    if (res.result_int() == 100) // 100 Continue before a body
      continue;
    if (n < 0) { // the layer's own: 400, 411, 413, 431 or 501, then the connection ends
      const unsigned s = res.result_int();
      if (s != 400 && s != 411 && s != 413 && s != 431 && s != 501)
        contract_broken("a response the handler did not make, with an unexpected status");
      layer_reply = true;
      continue;
    }
    if (n < want)
      contract_broken("responses out of the order of their requests");
    want = n + 1;
    if (res.body().rfind("data: ", 0) == 0 &&
        res.body() != "data: " + std::to_string(n) + ".1\n\ndata: " + std::to_string(n) +
                          ".2\n\ndata: " + std::to_string(n) + ".3\n\n")
      contract_broken("a stream's events arrived changed or out of order");
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Server server;
  if (size < 1)
    return 0;
  static const size_t kSizes[] = {1, 2, 3, 7, 16, 64, 512, size_t(1) << 30};
  const size_t piece = kSizes[data[0] & 7];
  const bool half_close = (data[0] & 8) != 0;
  const std::string in(reinterpret_cast<const char*>(data) + 1, size - 1);
  const int64_t first_seq = g_seq.load() + 1;

  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    contract_broken("no socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(server.port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
    contract_broken("cannot connect");
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  timeval tv{10, 0}; // the server must close the connection well before this
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  for (size_t off = 0; off < in.size();) {
    const ssize_t n = ::send(fd, in.data() + off, std::min(piece, in.size() - off), MSG_NOSIGNAL);
    if (n <= 0)
      break; // the server closed it (a refusal or a deadline): fine
    off += size_t(n);
  }
  if (half_close)
    ::shutdown(fd, SHUT_WR);
  std::string got;
  char buf[65536];
  bool reset = false;
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0)
      break;
    if (n < 0 && errno == ECONNRESET) {
      reset = true;
      break;
    }
    if (n < 0) {
      if (errno == EINTR)
        continue;
      contract_broken("the server kept the connection open past every deadline");
    }
    got.append(buf, size_t(n));
  }
  ::close(fd);
  check_answers(got, first_seq, reset || half_close);
  return 0;
}
