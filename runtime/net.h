// TCP for the pipeline's control plane: a listening socket, connections with deadlines, and
// length-prefixed frames. Every wait has a timeout, so a dead or hung peer is an error naming it,
// never a hang.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/error.h"

namespace xserv::runtime {

/// The largest frame payload Connection::receive accepts unless told a smaller bound.
inline constexpr uint64_t kMaxFramePayload = uint64_t{1} << 34;

/// A frame: a type byte and a payload.
struct Frame {
  uint8_t type = 0;
  std::string payload;
};

/// The most payload bytes a frame of type `type` may announce where it is received.
using FrameBound = std::function<uint64_t(uint8_t type)>;

/// What Connection::receive throws for a frame it will not read: a malformed header, or one that
/// announces more than the bound allows (the peer is there, its frame is refused); any other
/// failure (a timeout, a closed connection) is a plain Error.
class FrameRefused : public Error {
public:
  using Error::Error;
};

/// One TCP connection (moves, closes on destruction).
class Connection {
public:
  Connection() = default;
  explicit Connection(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}
  Connection(Connection&& o) noexcept;
  Connection& operator=(Connection&& o) noexcept;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection();

  /// Connects to "host:port", retrying until `deadline` (the other side may still be starting).
  static Connection connect(const std::string& address,
                            std::chrono::steady_clock::time_point deadline);

  /// Sends one frame (whole, or throws xserv::Error naming the peer).
  void send(const Frame& f);
  /// Receives one frame, waiting at most `timeout`; throws xserv::Error naming the peer when
  /// it closes the connection, on a socket error, a malformed frame, a frame announcing more
  /// than `max_payload` bytes (checked before anything is allocated), or the timeout. The
  /// payload grows as its bytes arrive (at most twice what came, from 64 KiB), so a frame that
  /// announces more than its peer sends costs only what was sent.
  Frame receive(std::chrono::milliseconds timeout, uint64_t max_payload = kMaxFramePayload);
  /// receive() with the bound chosen by the frame's type (and never above kMaxFramePayload).
  Frame receive(std::chrono::milliseconds timeout, const FrameBound& max_payload);

  bool valid() const { return fd_ >= 0; }
  int fd_for_tests() const { return fd_; } ///< raw socket, for tests that send foreign bytes
  const std::string& peer() const { return peer_; }
  void close();

private:
  int fd_ = -1;
  std::string peer_;
};

/// A listening socket on one address.
class Listener {
public:
  /// Listens on 127.0.0.1:`port` (0: an ephemeral port, see port()).
  explicit Listener(uint16_t port);
  /// Listens on `host` (a name or IPv4 address; "0.0.0.0" for every interface) and `port`.
  Listener(const std::string& host, uint16_t port);
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;
  ~Listener();
  uint16_t port() const { return port_; }
  /// Accepts one connection, waiting at most until `deadline`.
  Connection accept(std::chrono::steady_clock::time_point deadline);

private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

/// Splits "host:port"; throws xserv::Error for anything else. `allow_port_0` for an address to
/// listen on (0: an ephemeral port).
std::pair<std::string, uint16_t> split_address(const std::string& address,
                                               bool allow_port_0 = false);

} // namespace xserv::runtime
