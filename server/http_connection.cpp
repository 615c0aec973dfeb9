// Connections: the listener, the caps on connections (per server and per client address), the
// registry of sessions the drain walks, and the I/O threads.
#include "server/http_connection.h"

#include <sys/resource.h>

#include <cstdio>
#include <future>
#include <thread>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <fmt/format.h>

#include "base/error.h"
#include "server/http_session.h"

namespace xserv::server {

using tcp = net::ip::tcp;

struct IoContext {
  explicit IoContext(int threads)
      : ioc(threads), work(net::make_work_guard(ioc)), acceptor(net::make_strand(ioc)),
        retry(acceptor.get_executor()) {}
  net::io_context ioc;
  net::executor_work_guard<net::io_context::executor_type> work;
  tcp::acceptor acceptor;
  net::steady_timer retry; ///< accepting again after the process ran out of descriptors
  std::vector<std::thread> threads;
};

namespace {

/// The answer to a connection over a cap, written at once without reading its request.
std::string refusal(const std::string& why) {
  const openai::ApiError e(503, why, "", "service_unavailable", "too_many_connections");
  const std::string body = openai::error_body(e).dump();
  return fmt::format("HTTP/1.1 503 Service Unavailable\r\nServer: xserv\r\n"
                     "Content-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\n"
                     "Content-Length: {}\r\n\r\n{}",
                     body.size(), body);
}

/// Raises the soft descriptor limit to the hard one; returns the soft limit now.
size_t raise_fd_limit() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0)
    return 1024;
  if (r.rlim_cur < r.rlim_max) {
    rlimit want = r;
    want.rlim_cur = r.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &want) == 0)
      r = want;
  }
  return r.rlim_cur == RLIM_INFINITY ? size_t{1} << 20 : static_cast<size_t>(r.rlim_cur);
}

} // namespace

Connections::Connections(ConnectionLimits limits, HttpHandler& handler, int threads)
    : limits_(limits), handler_(handler), threads_(std::max(1, threads)),
      max_connections_(limits.max_connections), io_(std::make_unique<IoContext>(threads_)) {}

Connections::~Connections() {
  stop();
}

int Connections::listen(const std::string& host, int port) {
  // Each connection is a descriptor: keep 64 for the model's files, the pipeline's sockets and
  // the like, and refuse connections past what remains rather than fail to accept them.
  const size_t fds = raise_fd_limit();
  {
    std::lock_guard<std::mutex> lock(mu_);
    max_connections_ = std::min(limits_.max_connections, fds > 128 ? fds - 64 : fds / 2);
  }
  tcp::acceptor& a = io_->acceptor;
  beast::error_code ec;
  tcp::resolver resolver(io_->ioc);
  const auto found = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
  auto fail = [&](const beast::error_code& e) {
    return Error(fmt::format("cannot listen on {}:{} ({})", host, port, e.message()));
  };
  if (ec || found.empty())
    throw fail(ec);
  const tcp::endpoint ep = found.begin()->endpoint();
  a.open(ep.protocol(), ec);
  if (!ec)
    a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec)
    a.bind(ep, ec);
  if (!ec)
    a.listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    throw fail(ec);
  const int bound = a.local_endpoint().port();
  net::post(a.get_executor(), [this] { accept_next(); });
  for (int i = 0; i < threads_; ++i)
    io_->threads.emplace_back([this] {
      for (;;) {
        try {
          io_->ioc.run();
          return;
        } catch (const std::exception& e) { // a handler's bug must not stop the connections
          std::fprintf(stderr, "[serve] internal error on a connection: %s\n", e.what());
        }
      }
    });
  return bound;
}

void Connections::accept_next() {
  io_->acceptor.async_accept(
      net::make_strand(io_->ioc), [this](beast::error_code ec, tcp::socket socket) {
        if (ec == net::error::operation_aborted || !io_->acceptor.is_open())
          return;
        if (ec) {
          if (ec == net::error::no_descriptors) { // EMFILE: wait for some to close
            std::fprintf(stderr, "[serve] out of file descriptors: not accepting for 100 ms\n");
            io_->retry.expires_after(std::chrono::milliseconds(100));
            io_->retry.async_wait([this](beast::error_code e) {
              if (!e)
                accept_next();
            });
            return;
          }
          accept_next();
          return;
        }
        beast::error_code pe;
        const tcp::endpoint remote = socket.remote_endpoint(pe);
        const std::string peer = pe ? std::string("?") : remote.address().to_string();
        if (!admit(peer)) {
          const std::string why =
              fmt::format("too many connections: the server takes {} at once, {} from one "
                          "address; try again",
                          max_connections_, limits_.max_per_client);
          const std::string bytes = refusal(why);
          socket.non_blocking(true, pe);
          socket.write_some(net::buffer(bytes), pe);
          socket.shutdown(tcp::socket::shutdown_both, pe);
          socket.close(pe);
        } else {
          auto session = std::make_shared<Session>(std::move(socket), *this, peer);
          enroll(session);
          session->start();
        }
        accept_next();
      });
}

bool Connections::admit(const std::string& peer) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t& mine = per_client_[peer];
  if (stopped_ || size_t(stats_.open) >= max_connections_ ||
      (limits_.max_per_client > 0 && mine >= limits_.max_per_client)) {
    if (mine == 0)
      per_client_.erase(peer);
    ++stats_.refused;
    return false;
  }
  ++mine;
  ++stats_.open;
  ++stats_.accepted;
  return true;
}

void Connections::enroll(const std::shared_ptr<Session>& s) {
  std::lock_guard<std::mutex> lock(mu_);
  sessions_[s.get()] = s;
}

void Connections::forget(Session* s, const std::string& peer) {
  std::lock_guard<std::mutex> lock(mu_);
  sessions_.erase(s);
  if (auto it = per_client_.find(peer); it != per_client_.end() && --it->second == 0)
    per_client_.erase(it);
  --stats_.open;
  closed_cv_.notify_all();
}

void Connections::count_timeout() {
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.timed_out;
}

void Connections::count_malformed() {
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.malformed;
}

std::vector<std::shared_ptr<Session>> Connections::sessions() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Session>> out;
  for (const auto& [raw, weak] : sessions_)
    if (auto s = weak.lock())
      out.push_back(std::move(s));
  return out;
}

void Connections::stop_accepting() {
  if (io_->threads.empty()) { // never listened, or already stopped
    beast::error_code ec;
    io_->acceptor.close(ec);
    return;
  }
  std::promise<void> closed;
  net::post(io_->acceptor.get_executor(), [this, &closed] {
    beast::error_code ec;
    io_->acceptor.close(ec);
    io_->retry.cancel();
    closed.set_value();
  });
  closed.get_future().wait();
}

void Connections::close_idle() {
  for (const auto& s : sessions())
    s->drain();
}

bool Connections::wait_closed(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  return closed_cv_.wait_until(lock, deadline, [&] { return stats_.open == 0; });
}

void Connections::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_)
      return;
    stopped_ = true;
  }
  stop_accepting();
  for (const auto& s : sessions())
    s->shut();
  if (!io_->threads.empty())
    wait_closed(std::chrono::steady_clock::now() + std::chrono::seconds(2));
  io_->work.reset();
  io_->ioc.stop();
  for (std::thread& t : io_->threads)
    t.join();
  io_->threads.clear();
}

ConnectionStats Connections::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

} // namespace xserv::server
