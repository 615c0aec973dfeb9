// A connection's session: deadlines on every read and write, the parser's limits set before the
// first byte, one request at a time (so pipelined ones are answered in order), streamed replies
// written as their events come (all that is ready in one chunk), and the drain.
#include "server/http_session.h"

#include <sys/socket.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <string_view>

#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>

#include <fmt/format.h>

#include "server/http_framing.h"

namespace xserv::server {

namespace http = beast::http;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kPing = std::chrono::seconds(1); ///< an SSE comment after this long without bytes
constexpr size_t kFirstRead = 4096;
constexpr size_t kMaxLinger = size_t{1} << 20; ///< what a closing connection may still send

std::string to_string(beast::string_view s) {
  return {s.data(), s.size()};
}

bool iequal(beast::string_view a, const char* b) {
  return beast::iequals(a, beast::string_view(b));
}

} // namespace

Session::Session(net::ip::tcp::socket socket, Connections& owner, std::string peer)
    : stream_(std::move(socket)), owner_(owner), limits_(owner.limits()), peer_(std::move(peer)),
      ping_(stream_.get_executor()) {
  // Without TCP_NODELAY, Nagle's algorithm holds a stream's first event (a small write behind
  // the unacknowledged response header) until the client's delayed ACK, ~40 ms on Linux: a
  // prefix-cache hit's 9 ms TTFT reached the client after 43 (docs/PERF.md, Serving).
  beast::error_code ec;
  stream_.socket().set_option(net::ip::tcp::no_delay(true), ec);
}

Session::~Session() {
  owner_.forget(this, peer_);
}

void Session::start() {
  net::post(stream_.get_executor(), [self = shared_from_this()] { self->read_header(); });
}

void Session::drain() {
  net::post(stream_.get_executor(), [self = shared_from_this()] {
    self->draining_ = true;
    switch (self->phase_) {
    case Phase::Idle:
    case Phase::Head:
    case Phase::Body:
    case Phase::Lingering:
      self->close();
      break;
    default: // a request in hand: closes after its response
      break;
    }
  });
}

void Session::shut() {
  net::post(stream_.get_executor(), [self = shared_from_this()] { self->close(); });
}

void Session::read_request() {
  phase_ = Phase::Idle;
  parser_.reset();
  if (draining_) {
    close();
    return;
  }
  if (buffer_.size() > 0) { // a pipelined request is already here
    read_header();
    return;
  }
  // Kept alive: the idle deadline runs until the next request's first byte, the header's from
  // there.
  stream_.expires_after(limits_.idle_timeout);
  stream_.async_read_some(
      buffer_.prepare(kFirstRead),
      [self = shared_from_this()](beast::error_code ec, size_t n) { self->on_first_bytes(ec, n); });
}

void Session::on_first_bytes(beast::error_code ec, size_t n) {
  if (closed())
    return;
  if (ec) {
    on_read_error(ec);
    return;
  }
  buffer_.commit(n);
  read_header();
}

void Session::read_header() {
  if (closed())
    return;
  phase_ = Phase::Head;
  head_method_ = false; // until this request's header says otherwise (a refusal has a body)
  parser_.emplace();
  parser_->header_limit(
      static_cast<uint32_t>(std::min<size_t>(limits_.max_header_bytes, UINT32_MAX)));
  parser_->body_limit(limits_.max_body_bytes);
  stream_.expires_after(limits_.header_timeout);
  http::async_read_header(
      stream_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
}

void Session::on_read_error(beast::error_code ec) {
  if (ec == beast::error::timeout)
    owner_.count_timeout(); // the stream is closed already: no answer to a client this slow
  static const auto& parse_errors = http::make_error_code(http::error::bad_method).category();
  if (ec == beast::error::timeout || ec == http::error::end_of_stream ||
      ec == http::error::partial_message || ec.category() != parse_errors) {
    close(); // the client went away or was cut off, or the connection failed
    return;
  }
  owner_.count_malformed();
  // The header as far as it goes: the parser has taken the request line and the fields before
  // the one it refused (they are in its message), the rest is still in the buffer.
  std::string head;
  if (parser_)
    for (const auto& f : parser_->get())
      head += std::string(f.name_string()) + ": " + std::string(f.value()) + "\r\n";
  const auto rest = buffer_.data();
  head.append(static_cast<const char*>(rest.data()), rest.size());
  refuse(parser_refusal(ec, limits_.max_header_bytes, limits_.max_body_bytes, head));
}

namespace {

/// The request as the handler sees it (without its body).
HttpRequest head_of(const http::request<http::string_body>& req, const std::string& peer) {
  HttpRequest r;
  r.method = to_string(req.method_string());
  const beast::string_view target = req.target();
  r.path = to_string(target.substr(0, target.find('?')));
  if (const auto it = req.find(http::field::authorization); it != req.end())
    r.authorization = to_string(it->value());
  r.peer = peer;
  return r;
}

} // namespace

void Session::on_header(beast::error_code ec) {
  if (closed())
    return;
  if (ec) {
    on_read_error(ec);
    return;
  }
  const auto& req = parser_->get();
  keep_alive_ = req.keep_alive();
  version_11_ = req.version() >= 11;
  head_method_ = req.method() == http::verb::head;
  std::vector<std::string_view> lengths, encodings;
  for (auto [it, end] = req.equal_range(http::field::content_length); it != end; ++it)
    lengths.emplace_back(it->value().data(), it->value().size());
  for (auto [it, end] = req.equal_range(http::field::transfer_encoding); it != end; ++it)
    encodings.emplace_back(it->value().data(), it->value().size());
  if (const auto bad = framing_refusal(
          std::string_view(req.method_string().data(), req.method_string().size()), lengths,
          encodings)) {
    owner_.count_malformed();
    refuse(*bad);
    return;
  }
  // The API key, loading and draining: decided before a byte of the body is read.
  if (std::optional<Reply> early = owner_.handler_.on_head(head_of(req, peer_))) {
    const bool body = parser_->chunked() || parser_->content_length().value_or(0) > 0;
    phase_ = Phase::Handling;
    write_reply(early->status, early->content_type, std::move(early->body), early->headers, body);
    return;
  }
  if (const auto expect = req.find(http::field::expect);
      expect != req.end() && iequal(expect->value(), "100-continue")) {
    static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    phase_ = Phase::Body;
    stream_.expires_after(limits_.write_timeout);
    net::async_write(stream_, net::buffer(kContinue),
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (self->closed())
                         return;
                       if (ec) {
                         self->on_read_error(ec);
                         return;
                       }
                       self->read_body();
                     });
    return;
  }
  read_body();
}

void Session::read_body() {
  phase_ = Phase::Body;
  stream_.expires_after(limits_.body_timeout);
  http::async_read(
      stream_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code ec, size_t) { self->on_body(ec); });
}

void Session::on_body(beast::error_code ec) {
  if (closed())
    return;
  if (ec) {
    on_read_error(ec);
    return;
  }
  phase_ = Phase::Handling;
  stream_.expires_never(); // nothing is read until the reply is written
  http::request<http::string_body> req = parser_->release();
  parser_.reset();
  keep_alive_ = req.keep_alive();
  HttpRequest r = head_of(req, peer_);
  r.body = std::move(req.body());
  watch_peer();
  owner_.handler_.on_request(std::move(r), [self = shared_from_this()](Reply reply) {
    net::post(self->stream_.get_executor(),
              [self, reply = std::move(reply)]() mutable { self->on_reply(std::move(reply)); });
  });
}

void Session::on_reply(Reply r) {
  if (closed()) {
    if (r.pending)
      r.pending->cancel();
    return;
  }
  if (!r.pending) {
    write_reply(r.status, r.content_type, std::move(r.body), r.headers, false);
    return;
  }
  phase_ = Phase::Replying;
  reply_headers_ = std::move(r.headers);
  pending_ = std::move(r.pending);
  pending_done_ = false;
  stream_open_ = false;
  pending_->start([weak = weak_from_this(), ex = stream_.get_executor()] {
    if (auto self = weak.lock())
      net::post(ex, [self] { self->pump(); });
  });
  pump();
}

void Session::write_reply(unsigned status, const std::string& content_type, std::string body,
                          const std::vector<std::pair<std::string, std::string>>& headers,
                          bool close) {
  auto res =
      std::make_shared<http::response<http::string_body>>(static_cast<http::status>(status), 11);
  res->set(http::field::server, "xserv");
  res->set(http::field::content_type, content_type);
  for (const auto& [k, v] : headers)
    res->set(k, v);
  res->body() = std::move(body);
  const bool keep = keep_alive_ && !close && !draining_;
  res->keep_alive(keep);
  res->prepare_payload();
  if (head_method_)
    res->body().clear(); // a response to HEAD: the length of the body, not the body
  phase_ = Phase::Replying;
  writing_ = true;
  message_ = res;
  stream_.expires_after(limits_.write_timeout);
  http::async_write(stream_, *res, [self = shared_from_this(), keep](beast::error_code ec, size_t) {
    self->writing_ = false;
    self->message_.reset();
    if (self->closed())
      return;
    if (ec) {
      if (ec == beast::error::timeout)
        self->owner_.count_timeout();
      self->close();
      return;
    }
    self->finish_response(!keep);
  });
}

void Session::refuse(const openai::ApiError& e) {
  keep_alive_ = false; // what follows a refused request cannot be read as the next one
  std::vector<std::pair<std::string, std::string>> headers;
  if (e.status == 503 || e.status == 429)
    headers.emplace_back("Retry-After", "1");
  phase_ = Phase::Handling;
  write_reply(static_cast<unsigned>(e.status), "application/json",
              openai::error_body(e).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
              headers, true);
}

void Session::pump() {
  if (closed() || writing_ || !pending_ || pending_done_)
    return;
  out_.clear();
  unsigned status = 200;
  const bool done = pending_->take(out_, status);
  if (!pending_->streaming()) {
    if (!done)
      return;
    pending_done_ = true;
    write_reply(status, "application/json", std::move(out_), reply_headers_, false);
    return;
  }
  // The bytes go out as three buffers: the header (once) and the chunk's size line, the
  // events as take() wrote them (not copied), and the chunk's end (and the last chunk).
  const bool chunked = version_11_;
  wire_.clear();
  tail_ = "";
  if (!stream_open_) {
    stream_open_ = true;
    stream_keep_ = keep_alive_ && !draining_ && chunked;
    wire_ = "HTTP/1.1 200 OK\r\nServer: xserv\r\nContent-Type: text/event-stream\r\n"
            "Cache-Control: no-cache\r\n";
    for (const auto& [k, v] : reply_headers_)
      wire_ += k + ": " + v + "\r\n";
    wire_ += chunked ? "Transfer-Encoding: chunked\r\n" : "";
    wire_ += stream_keep_ ? "\r\n" : "Connection: close\r\n\r\n";
  }
  if (!out_.empty() && chunked) {
    fmt::format_to(std::back_inserter(wire_), "{:x}\r\n", out_.size());
    tail_ = done ? "\r\n0\r\n\r\n" : "\r\n";
  } else if (done && chunked) {
    tail_ = "0\r\n\r\n";
  }
  if (done)
    pending_done_ = true;
  if (wire_.empty() && out_.empty() && *tail_ == '\0') {
    arm_ping();
    return;
  }
  write_wire(done);
}

void Session::write_wire(bool last) {
  writing_ = true;
  stream_.expires_after(limits_.write_timeout);
  const std::array<net::const_buffer, 3> bufs = {net::buffer(wire_), net::buffer(out_),
                                                 net::buffer(tail_, std::strlen(tail_))};
  net::async_write(stream_, bufs, [self = shared_from_this(), last](beast::error_code ec, size_t) {
    self->writing_ = false;
    if (self->closed())
      return;
    if (ec) { // the client left or stopped reading: the request is abandoned
      if (ec == beast::error::timeout)
        self->owner_.count_timeout();
      self->close();
      return;
    }
    self->last_write_ = Clock::now();
    if (last)
      self->finish_response(!self->stream_keep_ || self->draining_);
    else
      self->pump();
  });
}

void Session::arm_ping() {
  if (ping_armed_)
    return;
  ping_armed_ = true;
  ping_.expires_after(kPing);
  ping_.async_wait([self = shared_from_this()](beast::error_code ec) {
    self->ping_armed_ = false;
    if (ec || self->closed() || !self->pending_ || self->pending_done_)
      return;
    if (self->writing_ || Clock::now() - self->last_write_ < kPing) {
      self->arm_ping();
      return;
    }
    // An SSE comment: a stream with nothing to say finds out whether its client is still there.
    static constexpr std::string_view kComment = ": ping\n\n";
    self->wire_ = self->version_11_ ? fmt::format("{:x}\r\n{}\r\n", kComment.size(), kComment)
                                    : std::string(kComment);
    self->out_.clear();
    self->tail_ = "";
    self->write_wire(false);
  });
}

void Session::finish_response(bool close) {
  pending_.reset();
  pending_done_ = false;
  ++request_;
  if (close || draining_) {
    linger();
    return;
  }
  read_request();
}

void Session::watch_peer() {
  stream_.socket().async_wait(net::socket_base::wait_read,
                              [self = shared_from_this(), request = request_](
                                  beast::error_code ec) { self->on_peer(ec, request); });
}

void Session::on_peer(beast::error_code ec, uint64_t request) {
  if (ec || closed() || request != request_ ||
      (phase_ != Phase::Handling && phase_ != Phase::Replying))
    return;
  char c;
  const ssize_t n = ::recv(stream_.socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0)
    return; // the client sent more (a pipelined request): it is there, and read in turn
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    watch_peer();
    return;
  }
  close(); // the end of its stream, or a reset: the request in hand is abandoned
}

void Session::linger() {
  phase_ = Phase::Lingering;
  beast::error_code ec;
  stream_.socket().shutdown(net::socket_base::shutdown_send, ec);
  if (ec || draining_) { // a drain does not wait for what a client still sends
    close();
    return;
  }
  stream_.expires_after(limits_.linger_timeout);
  linger_read();
}

void Session::linger_read() {
  stream_.async_read_some(net::buffer(scratch_),
                          [self = shared_from_this()](beast::error_code ec, size_t n) {
                            if (self->closed())
                              return;
                            self->lingered_ += n;
                            if (ec || self->lingered_ > kMaxLinger) {
                              self->close();
                              return;
                            }
                            self->linger_read();
                          });
}

void Session::close() {
  if (closed())
    return;
  phase_ = Phase::Closed;
  if (pending_ && !pending_done_)
    pending_->cancel();
  pending_.reset();
  beast::error_code ec;
  stream_.socket().shutdown(net::socket_base::shutdown_both, ec);
  stream_.close();
  ping_.cancel();
}

} // namespace xserv::server
