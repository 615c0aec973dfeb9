// POSIX sockets with poll() timeouts; frames are "XSPF", type, u64 length, payload.
#include "runtime/net.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "base/error.h"

namespace xserv::runtime {

namespace {

constexpr uint32_t kMagic = 0x46505358; // "XSPF" little-endian

std::string errno_text() {
  return std::strerror(errno);
}

/// Waits until fd is readable (or writable), at most `ms`; false on timeout.
bool wait_fd(int fd, short events, int ms) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int r = ::poll(&p, 1, ms);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0)
      throw Error("poll failed: " + errno_text());
    return r > 0;
  }
}

} // namespace

std::pair<std::string, uint16_t> split_address(const std::string& address, bool allow_port_0) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size())
    throw Error("address '" + address + "' is not HOST:PORT");
  const std::string port = address.substr(colon + 1);
  char* end = nullptr;
  const long p = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || p < (allow_port_0 ? 0 : 1) || p > 65535)
    throw Error("address '" + address + "': port must be " + (allow_port_0 ? "0" : "1") +
                " to 65535");
  return {address.substr(0, colon), static_cast<uint16_t>(p)};
}

Connection::Connection(Connection&& o) noexcept : fd_(o.fd_), peer_(std::move(o.peer_)) {
  o.fd_ = -1;
}

Connection& Connection::operator=(Connection&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.fd_;
    peer_ = std::move(o.peer_);
    o.fd_ = -1;
  }
  return *this;
}

Connection::~Connection() {
  close();
}

void Connection::close() {
  if (fd_ >= 0)
    ::close(fd_);
  fd_ = -1;
}

Connection Connection::connect(const std::string& address,
                               std::chrono::steady_clock::time_point deadline) {
  const auto [host, port] = split_address(address);
  std::string last = "no attempt";
  while (std::chrono::steady_clock::now() < deadline) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (gai != 0)
      throw Error("cannot resolve '" + host + "': " + ::gai_strerror(gai));
    for (addrinfo* a = res; a; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
      if (fd < 0)
        continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        ::freeaddrinfo(res);
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        return Connection(fd, address);
      }
      last = errno_text();
      ::close(fd);
    }
    ::freeaddrinfo(res);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  throw Error("cannot connect to " + address + " before the deadline (" + last + ")");
}

void Connection::send(const Frame& f) {
  if (fd_ < 0)
    throw Error("sending to " + peer_ + ": the connection is closed");
  std::string buf(13, '\0');
  const uint64_t len = f.payload.size();
  std::memcpy(buf.data(), &kMagic, 4);
  buf[4] = static_cast<char>(f.type);
  std::memcpy(buf.data() + 5, &len, 8);
  buf += f.payload;
  size_t done = 0;
  while (done < buf.size()) {
    const ssize_t n = ::send(fd_, buf.data() + done, buf.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      throw Error("sending to " + peer_ + " failed: " + errno_text());
    done += static_cast<size_t>(n);
  }
}

Frame Connection::receive(std::chrono::milliseconds timeout, uint64_t max_payload) {
  return receive(timeout, [max_payload](uint8_t) { return max_payload; });
}

Frame Connection::receive(std::chrono::milliseconds timeout, const FrameBound& max_payload) {
  if (fd_ < 0)
    throw Error("receiving from " + peer_ + ": the connection is closed");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto read_exact = [&](char* dst, size_t want) {
    size_t got = 0;
    while (got < want) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || !wait_fd(fd_, POLLIN, static_cast<int>(left.count())))
        throw Error(peer_ + " sent nothing for " + std::to_string(timeout.count() / 1000) + " s");
      const ssize_t n = ::recv(fd_, dst + got, want - got, 0);
      if (n < 0 && errno == EINTR)
        continue;
      if (n == 0)
        throw Error(peer_ + " closed the connection");
      if (n < 0)
        throw Error("receiving from " + peer_ + " failed: " + errno_text());
      got += static_cast<size_t>(n);
    }
  };
  char head[13];
  read_exact(head, sizeof(head));
  uint32_t magic = 0;
  uint64_t len = 0;
  std::memcpy(&magic, head, 4);
  std::memcpy(&len, head + 5, 8);
  if (magic != kMagic)
    throw FrameRefused(peer_ + " sent a malformed frame (not an xserv pipeline peer?)");
  Frame f;
  f.type = static_cast<uint8_t>(head[4]);
  const uint64_t bound = std::min(max_payload(f.type), kMaxFramePayload);
  if (len > bound)
    throw FrameRefused(peer_ + " announced a frame of " + std::to_string(len) + " bytes (type " +
                       std::to_string(f.type) + "), more than the " + std::to_string(bound) +
                       " expected here");
  // Grown as the bytes come, never ahead by more than what already came: a peer that announces
  // gigabytes and sends a few bytes makes this side allocate a few bytes, not its claim.
  constexpr uint64_t kFirstChunk = 64 << 10;
  uint64_t have = 0;
  while (have < len) {
    const uint64_t next = std::min(len, std::max(kFirstChunk, 2 * have));
    f.payload.resize(static_cast<size_t>(next));
    read_exact(f.payload.data() + have, static_cast<size_t>(next - have));
    have = next;
  }
  return f;
}

Listener::Listener(uint16_t port) : Listener("127.0.0.1", port) {}

Listener::Listener(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  if (const int gai = ::getaddrinfo(host.c_str(), nullptr, &hints, &res); gai != 0 || !res)
    throw Error("cannot listen on '" + host + "': " + ::gai_strerror(gai));
  sockaddr_in addr = *reinterpret_cast<const sockaddr_in*>(res->ai_addr);
  ::freeaddrinfo(res);
  addr.sin_port = htons(port);
  fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd_ < 0)
    throw Error("cannot create a socket: " + errno_text());
  const int one = 1;
  ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(fd_, 64) != 0) {
    const std::string why = errno_text();
    ::close(fd_);
    throw Error("cannot listen on " + host + ":" + std::to_string(port) + ": " + why);
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
}

Listener::~Listener() {
  if (fd_ >= 0)
    ::close(fd_);
}

Connection Listener::accept(std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  if (left.count() <= 0 || !wait_fd(fd_, POLLIN, static_cast<int>(left.count())))
    throw Error("no connection on port " + std::to_string(port_) + " before the deadline");
  sockaddr_in peer{};
  socklen_t len = sizeof(peer);
  const int fd = ::accept(fd_, reinterpret_cast<sockaddr*>(&peer), &len);
  if (fd < 0)
    throw Error("accept failed: " + errno_text());
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  char ip[INET_ADDRSTRLEN] = "?";
  ::inet_ntop(AF_INET, &peer.sin_addr, ip, sizeof(ip));
  return Connection(fd, std::string(ip) + ":" + std::to_string(ntohs(peer.sin_port)));
}

} // namespace xserv::runtime
