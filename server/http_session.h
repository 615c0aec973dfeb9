// One HTTP/1.1 connection of the server (internal to server/http_*.cpp): a Beast session that
// reads a request under deadlines, hands it to the handler, writes its reply (streamed or whole)
// and only then reads the next, on its own strand.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "server/api_error.h"
#include "server/http_connection.h"

namespace xserv::server {

namespace net = boost::asio;
namespace beast = boost::beast;

/// A connection's session. Every member runs on the session's strand; start(), drain() and
/// shut() may be called from any thread (they post to it).
class Session : public std::enable_shared_from_this<Session> {
public:
  Session(net::ip::tcp::socket socket, Connections& owner, std::string peer);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  /// Reads the first request (its header under the header deadline from now).
  void start();
  /// The drain: closes now unless a request is in hand, else after its response.
  void drain();
  /// Closes now, abandoning a request in hand.
  void shut();

private:
  /// Where the session is: what a drain may cut (Idle, Head, Body, Lingering) and what it waits
  /// for (Handling: the handler has the request; Replying: its response is being written).
  enum class Phase { Idle, Head, Body, Handling, Replying, Lingering, Closed };

  void read_request();
  void on_first_bytes(beast::error_code ec, size_t n);
  void read_header();
  void on_header(beast::error_code ec);
  void read_body();
  void on_body(beast::error_code ec);
  /// A read that failed: a deadline, the client gone, or a request the parser refused.
  void on_read_error(beast::error_code ec);
  void on_reply(Reply r);
  /// Writes a whole response; the connection is kept unless `close`, the client or a drain
  /// says otherwise.
  void write_reply(unsigned status, const std::string& content_type, std::string body,
                   const std::vector<std::pair<std::string, std::string>>& headers, bool close);
  void refuse(const openai::ApiError& e);
  /// Takes what the pending reply has ready and writes it (one chunk for all of it).
  void pump();
  void write_wire(bool last);
  void arm_ping();
  void finish_response(bool close);
  /// Notices a client that leaves while its request is in hand (nothing to write yet).
  void watch_peer();
  void on_peer(beast::error_code ec, uint64_t request);
  /// After a closing response: stops sending, reads and drops what still comes, then closes.
  void linger();
  void linger_read();
  void close();
  bool closed() const { return phase_ == Phase::Closed; }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<beast::http::request_parser<beast::http::string_body>> parser_;
  Connections& owner_;
  const ConnectionLimits& limits_;
  std::string peer_;
  Phase phase_ = Phase::Idle;
  uint64_t request_ = 0; ///< requests answered so far: a watch knows whose it was
  bool draining_ = false, keep_alive_ = true, version_11_ = true, head_method_ = false;
  bool writing_ = false, ping_armed_ = false, stream_open_ = false, stream_keep_ = false;
  std::shared_ptr<Pending> pending_;
  std::vector<std::pair<std::string, std::string>> reply_headers_; ///< the pending reply's
  bool pending_done_ = false;
  std::string out_;               ///< what take() gave (a stream's events: written as they are)
  std::string wire_;              ///< the status line and header, a chunk's size line
  const char* tail_ = "";         ///< a chunk's end, and the last chunk
  std::shared_ptr<void> message_; ///< a whole response being written
  net::steady_timer ping_;
  std::chrono::steady_clock::time_point last_write_;
  size_t lingered_ = 0;
  char scratch_[4096];
};

} // namespace xserv::server
