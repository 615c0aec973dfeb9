// The HTTP/1.1 connection layer of `xserv serve`: a listener, one session per connection on a few
// I/O threads (Boost.Beast over Asio, kept out of this header), deadlines on every read and write,
// caps on connections, in-order answers to pipelined requests, streamed replies and the drain.
// It knows nothing of the engine: a handler turns requests into replies.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace xserv::server {

/// Deadlines and caps of the connections. Every read and write runs under one of the deadlines,
/// so no client can hold a connection without sending or reading at the pace they allow.
struct ConnectionLimits {
  /// A request's whole header, from its first byte (a new connection: from the accept). A
  /// client still sending its header then is cut off, without an answer.
  std::chrono::milliseconds header_timeout{10000};
  /// A request's whole body, from the end of its header.
  std::chrono::milliseconds body_timeout{60000};
  /// A kept-alive connection waiting for the first byte of its next request.
  std::chrono::milliseconds idle_timeout{30000};
  /// One write of a response (a whole body, or one batch of a stream's events): a client that
  /// reads nothing for this long is cut off and its request aborted.
  std::chrono::milliseconds write_timeout{60000};
  /// After a response that closes the connection, how long what the client still sends is read
  /// and dropped, so the close does not reset the connection under the response.
  std::chrono::milliseconds linger_timeout{2000};
  size_t max_header_bytes = 32u << 10; ///< request line and header fields; more get 431
  size_t max_body_bytes = 16u << 20;   ///< larger bodies get 413 (before a byte of one is read)
  size_t max_connections = 8192;       ///< open at once; more get 503 and are closed
  size_t max_per_client = 512;         ///< open at once from one address; 0: no cap
};

/// A request as the handler sees it.
struct HttpRequest {
  std::string method;        ///< "GET", "POST", ...
  std::string path;          ///< the target without its query ("/v1/chat/completions")
  std::string authorization; ///< the Authorization header's value ("" when none)
  std::string body;          ///< empty in HttpHandler::on_head
  std::string peer;          ///< the client's address
};

/// A response produced over time: a stream (Server-Sent Events in chunked encoding, written as
/// they come) or one body at the end (a request waiting for the engine). The connection calls
/// start() once, then take() after every wake and whenever it is ready to write more.
class Pending {
public:
  virtual ~Pending() = default;
  /// True: a text/event-stream sent at once and written as take() gives bytes.
  virtual bool streaming() const = 0;
  /// `wake` may be called from any thread, any number of times, when take() has more.
  virtual void start(std::function<void()> wake) = 0;
  /// Appends what is ready to `out`: a stream's event bytes, or (not streaming) nothing until
  /// the end, then the whole body with `status` set. Returns true once the response is whole.
  virtual bool take(std::string& out, unsigned& status) = 0;
  /// The connection is gone or closing before take() returned true: abandon the request.
  virtual void cancel() = 0;
};

/// A handler's answer.
struct Reply {
  unsigned status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers; ///< extra fields (Retry-After, ...)
  std::shared_ptr<Pending> pending; ///< set: the body comes from it (status, body unused)
};

/// What the connections hand requests to.
class HttpHandler {
public:
  virtual ~HttpHandler() = default;
  /// As soon as a request's header is in, before its body is read: a reply refuses it (the
  /// connection closes after it when a body was announced), nullopt lets the body be read.
  virtual std::optional<Reply> on_head(const HttpRequest& head) = 0;
  /// A whole request. `done` must be called exactly once, from any thread, at once or later.
  virtual void on_request(HttpRequest request, std::function<void(Reply)> done) = 0;
};

/// Counters of the connections (/metrics).
struct ConnectionStats {
  int64_t open = 0;      ///< connections now
  int64_t accepted = 0;  ///< since the start
  int64_t refused = 0;   ///< closed at once with 503: over a cap
  int64_t timed_out = 0; ///< cut off by a deadline (header, body, idle, write)
  int64_t malformed = 0; ///< refused by the parser or the framing checks (400, 411, 413, 431)
};

class Session;
struct IoContext;

/// The listening socket and every connection's session, served by `threads` I/O threads.
/// Each session reads one request, hands it to the handler, writes its reply and only then
/// reads the next, so pipelined requests are answered in the order they came.
class Connections {
public:
  Connections(ConnectionLimits limits, HttpHandler& handler, int threads);
  /// Closes every connection and joins the I/O threads.
  ~Connections();
  Connections(const Connections&) = delete;
  Connections& operator=(const Connections&) = delete;

  /// Binds host:port (0: any free port), starts accepting; returns the port. Throws
  /// xserv::Error naming host and port when binding fails. max_connections is lowered to what
  /// the process's descriptor limit (raised to its hard limit) leaves room for.
  int listen(const std::string& host, int port);
  /// Closes the listening socket: new connections are refused by the system.
  void stop_accepting();
  /// The drain: connections without a request in hand (idle, or still sending a header or a
  /// body) are closed now; the others close after their response.
  void close_idle();
  /// Waits until every connection has closed or `deadline` passes; returns whether all did.
  bool wait_closed(std::chrono::steady_clock::time_point deadline);
  /// Closes every connection now (their requests are abandoned) and stops the I/O threads.
  void stop();
  ConnectionStats stats() const;
  const ConnectionLimits& limits() const { return limits_; }

private:
  friend class Session;
  void accept_next();
  /// Counts a new connection from `peer` in; false (counted as refused) when a cap is reached.
  bool admit(const std::string& peer);
  void enroll(const std::shared_ptr<Session>& s);
  /// A session's end (its destructor): out of the registry and its address's count.
  void forget(Session* s, const std::string& peer);
  void count_timeout();
  void count_malformed();
  std::vector<std::shared_ptr<Session>> sessions() const;

  ConnectionLimits limits_;
  HttpHandler& handler_;
  int threads_;
  // The registry outlives the I/O context (declared first): sessions leave it as they go.
  mutable std::mutex mu_;
  std::condition_variable closed_cv_;
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions_;
  std::unordered_map<std::string, size_t> per_client_;
  size_t max_connections_ = 0; ///< limits_.max_connections within the descriptor limit
  ConnectionStats stats_;
  bool stopped_ = false;
  std::unique_ptr<IoContext> io_; ///< the io_context, the acceptor, the threads
};

} // namespace xserv::server
