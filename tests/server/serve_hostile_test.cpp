// `xserv serve` against hostile clients: bodies nested past the depth limit on every JSON
// endpoint, hundreds of connections trickling their headers, the header, body and idle
// deadlines, a drain that does not wait for tricklers, pipelined requests, the connection caps,
// the API key's reach, and a model that breaks.
#include <doctest/doctest.h>

#include <csignal>
#include <netinet/tcp.h>
#include <sys/resource.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <thread>

#include "tests/server/tiny_server.h"

namespace fs = std::filesystem;
using namespace xserv;
using namespace xserv::testing;
using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

/// Connections that each sent the start of a request header and then add one byte to it every
/// `gap` (on a thread of their own) and never finish it, until destroyed.
struct Tricklers {
  std::vector<std::unique_ptr<Socket>> socks;
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::thread t;
  Tricklers(int port, int n, milliseconds gap) {
    for (int i = 0; i < n; ++i) {
      socks.push_back(std::make_unique<Socket>(port));
      socks.back()->send_all("GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ");
    }
    t = std::thread([this, gap] {
      std::unique_lock<std::mutex> lock(mu);
      while (!cv.wait_for(lock, gap, [&] { return stop; }))
        for (auto& s : socks)
          (void)::send(s->fd, "a", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    });
  }
  ~Tricklers() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    t.join();
  }
  /// How many the server has closed (end of stream or reset), looked at without waiting.
  size_t closed() {
    size_t n = 0;
    for (auto& s : socks) {
      char c;
      const ssize_t r = ::recv(s->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
      n += r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
    }
    return n;
  }
};

/// Seconds since `t0`.
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// `depth` arrays nested in one another.
std::string nested_arrays(size_t depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

/// `depth` objects nested as {"a": {"a": ... {} ...}}.
std::string nested_objects(size_t depth) {
  std::string s;
  s.reserve(depth * 7);
  for (size_t i = 0; i < depth; ++i)
    s += "{\"a\": ";
  s += "{}";
  s += std::string(depth, '}');
  return s;
}

} // namespace

TEST_CASE("hostile: bodies nested past the depth limit get 400 on every JSON endpoint") {
  XSERV_REQUIRE_DATA(data);
  TinyServer s;
  const std::string deep = nested_arrays(100000), deep_objects = nested_objects(100000);
  const std::string user = R"({"role": "user", "content": "Hi"})";
  const std::vector<std::pair<std::string, std::string>> cases = {
      // The probe's body: 90k levels, then another key.
      {"/v1/chat/completions", R"({"messages": )" + nested_arrays(90000) + R"(, "model": "x"})"},
      {"/v1/chat/completions",
       R"({"messages": [)" + user +
           R"(], "tools": [{"type": "function", "function": {"name": "f", "parameters": )" +
           deep_objects + "}}]}"},
      {"/v1/responses", R"({"input": "Hi", "metadata": )" + deep_objects + "}"},
      {"/v1/responses", R"({"input": )" + deep + "}"},
      {"/v1/completions", R"({"prompt": )" + deep + "}"},
      {"/tokenize", R"({"prompt": )" + deep + "}"},
      {"/tokenize", R"({"messages": [)" + user + R"(], "tools": )" + deep + "}"},
      {"/detokenize", R"({"tokens": )" + deep + "}"},
  };
  for (const auto& [path, body] : cases) {
    INFO(path);
    const HttpResponse r = s.post(path, body);
    CHECK(r.status == 400);
    const Json err = error_of(r);
    CHECK(err["code"] == "json_too_deep");
    CHECK(err["message"].get<std::string>().find("limit of 64 levels") != std::string::npos);
  }
  // Nesting within the limit is served: a tool schema 40 objects deep.
  const HttpResponse ok =
      s.post("/v1/chat/completions",
             R"({"max_tokens": 2, "messages": [)" + user +
                 R"(], "tools": [{"type": "function", "function": {"name": "f", "parameters": )" +
                 nested_objects(40) + "}}]}");
  CHECK(ok.status == 200);
  CHECK(s.post("/v1/chat/completions", kChat).status == 200); // and the server goes on
  CHECK(http(s.port, "GET", "/health").status == 200);
}

TEST_CASE("hostile: --max-json-depth sets the limit") {
  XSERV_REQUIRE_DATA(data);
  server::ServeOptions opt;
  opt.max_json_depth = 3;
  TinyServer s(opt);
  CHECK(s.post("/v1/chat/completions", kChat).status == 200); // {"messages": [{...}]}: 3
  const HttpResponse r = s.post("/v1/chat/completions", R"({"messages": [{"role": "user",
    "content": [{"type": "text", "text": "Hi"}]}], "max_tokens": 2})");
  CHECK(r.status == 400);
  CHECK(error_of(r)["message"].get<std::string>().find("limit of 3 levels") != std::string::npos);
}

TEST_CASE("hostile: 600 connections trickling headers do not delay /health or a chat request") {
  XSERV_REQUIRE_DATA(data);
  server::ServeOptions opt;
  opt.connections.max_per_client = 0; // the test's connections all come from 127.0.0.1
  TinyServer s(opt);
  Tricklers slow(s.port, 600, milliseconds(200));
  REQUIRE(eventually([&] { return s.server.connection_stats().open >= 600; }));
  const auto t0 = Clock::now();
  const HttpResponse h = http(s.port, "GET", "/health");
  const double health_s = since(t0);
  const auto t1 = Clock::now();
  const HttpResponse c = s.post("/v1/chat/completions", kChat);
  const double chat_s = since(t1);
  CHECK(h.status == 200);
  CHECK(c.status == 200);
  CHECK(health_s < 1.0);
  CHECK(chat_s < 1.0);
  CHECK(slow.closed() == 0); // still within their header deadline
}

TEST_CASE("hostile: the header, body and idle deadlines cut slow clients off") {
  XSERV_REQUIRE_DATA(data);
  server::ServeOptions opt;
  opt.connections.header_timeout = milliseconds(300);
  opt.connections.body_timeout = milliseconds(300);
  opt.connections.idle_timeout = milliseconds(300);
  TinyServer s(opt);
  { // a header one byte every 20 ms: cut off at the deadline, counted, no answer
    Tricklers one(s.port, 1, milliseconds(20));
    const auto t0 = Clock::now();
    REQUIRE(eventually([&] { return one.closed() == 1; }, std::chrono::seconds(30)));
    CHECK(since(t0) >= 0.29); // never before the deadline
    CHECK(eventually([&] { return s.server.connection_stats().timed_out == 1; }));
  }
  { // a body that never comes whole
    Socket sock(s.port);
    sock.send_all("POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro");
    const Drained d = read_until_closed(sock, std::chrono::seconds(30));
    CHECK(d.closed);
    CHECK(d.bytes.empty());
    // Counted just after the close the client saw.
    CHECK(eventually([&] { return s.server.connection_stats().timed_out == 2; }));
  }
  { // kept alive after an answer, then idle
    Socket sock(s.port);
    sock.send_all("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    const Drained d = read_until_closed(sock, std::chrono::seconds(30));
    CHECK(d.closed);
    CHECK(d.bytes.find("HTTP/1.1 200 OK") == 0);
    CHECK(eventually([&] { return s.server.connection_stats().timed_out == 3; }));
  }
  CHECK(http(s.port, "GET", "/metrics").body.find("xserv:http_timeouts_total 3") !=
        std::string::npos);
}

TEST_CASE("hostile: SIGTERM with 100 trickling clients exits 0 within the grace period") {
  XSERV_REQUIRE_DATA(data);
  const TempDir tmp("serve_trickle_term");
  const fs::path log = tmp.path / "stderr.txt";
  const auto [pid, port] = serve_process(
      tiny_model(), log, data / "o200k_base.tiktoken",
      {"--max-seq", "128", "--max-batch", "2", "--grace", "5", "--header-timeout", "120"});
  auto metric = [&](const std::string& name) {
    const std::string body = http(port, "GET", "/metrics").body;
    const size_t at = body.find("\n" + name + " ");
    return at == std::string::npos ? -1L : std::stol(body.substr(at + name.size() + 2));
  };
  Tricklers slow(port, 100, milliseconds(200));
  REQUIRE(eventually([&] { return metric("xserv:http_connections") >= 100; }));
  ::kill(pid, SIGTERM);
  // Their header deadline is two minutes away: the drain closes them at once instead.
  CHECK(wait_exit(pid, std::chrono::seconds(5)) == 0);
  CHECK(eventually([&] { return slow.closed() == 100; }, std::chrono::seconds(5)));
  CHECK(read_text(log).find("[serve] stopped:") != std::string::npos);
}

TEST_CASE("hostile: pipelined requests on one connection are answered in order") {
  XSERV_REQUIRE_DATA(data);
  TinyServer s;
  auto post = [](const std::string& path, const std::string& body, const char* extra = "") {
    return "POST " + path +
           " HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" +
           extra + "\r\n" + body;
  };
  Socket sock(s.port);
  sock.send_all("GET /health HTTP/1.1\r\nHost: x\r\n\r\n" +
                post("/v1/completions", R"({"prompt": "Hi", "max_tokens": 3})") +
                post("/tokenize", R"({"prompt": "Hello world"})") +
                "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n" +
                post("/v1/completions", R"({"prompt": "Hi", "max_tokens": 2, "stream": true})") +
                post("/detokenize", R"({"tokens": [13225]})", "Connection: close\r\n"));
  const Drained d = read_until_closed(sock, std::chrono::seconds(60));
  CHECK(d.closed);
  const std::vector<HttpResponse> rs = parse_responses(d.bytes);
  REQUIRE(rs.size() == 6);
  for (const HttpResponse& r : rs)
    CHECK(r.status == 200);
  CHECK(Json::parse(rs[0].body)["status"] == "ok");
  CHECK(Json::parse(rs[1].body)["usage"]["completion_tokens"] == 3);
  CHECK(Json::parse(rs[2].body)["count"] == 2);
  CHECK(Json::parse(rs[3].body)["object"] == "list");
  CHECK(sse_data(rs[4].body).back() == "[DONE]");
  CHECK(Json::parse(rs[5].body).contains("prompt"));
  CHECK(rs[5].headers.find("Connection: close") != std::string::npos);
}

TEST_CASE("hostile: connections past a cap get 503 and are closed") {
  XSERV_REQUIRE_DATA(data);
  for (const bool per_client : {true, false}) {
    INFO(per_client);
    server::ServeOptions opt;
    opt.connections.max_per_client = per_client ? 3 : 0;
    opt.connections.max_connections = per_client ? 8192 : 3;
    TinyServer s(opt);
    std::vector<std::unique_ptr<Socket>> held;
    for (int i = 0; i < 3; ++i)
      held.push_back(std::make_unique<Socket>(s.port));
    REQUIRE(eventually([&] { return s.server.connection_stats().open == 3; }));
    Socket over(s.port);
    const Drained d = read_until_closed(over, std::chrono::seconds(30));
    CHECK(d.closed);
    CHECK(d.bytes.find("HTTP/1.1 503") == 0);
    CHECK(d.bytes.find("Retry-After: 1") != std::string::npos);
    CHECK(d.bytes.find("too many connections") != std::string::npos);
    CHECK(s.server.connection_stats().refused == 1);
    held.pop_back(); // one closes: room for another
    REQUIRE(eventually([&] { return s.server.connection_stats().open == 2; }));
    CHECK(http(s.port, "GET", "/health").status == 200);
  }
}

TEST_CASE("hostile: the API key guards /metrics unless --metrics-public, /health stays open") {
  XSERV_REQUIRE_DATA(data);
  server::ServeOptions opt;
  opt.api_key = "k";
  opt.metrics_public = true;
  TinyServer s(opt);
  const HttpResponse m = http(s.port, "GET", "/metrics");
  CHECK(m.status == 200);
  CHECK(m.body.find("xserv:http_connections ") != std::string::npos);
  CHECK(http(s.port, "GET", "/health").status == 200);
  { // HEAD: the length of the answer, not the answer
    Socket head(s.port);
    head.send_all("HEAD /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    const Drained d = read_until_closed(head, std::chrono::seconds(30));
    CHECK(d.bytes.find("HTTP/1.1 200 OK") == 0);
    CHECK(d.bytes.find("Content-Length: 15") != std::string::npos); // {"status":"ok"}
    CHECK(d.bytes.substr(d.bytes.size() - 4) == "\r\n\r\n");
  }
  CHECK(http(s.port, "GET", "/v1/models").status == 401);
  CHECK(http(s.port, "GET", "/v1/models", "", "Authorization: BEARER k\r\n").status == 200);
  // A chunked request body is read under the body limit like any other.
  Socket sock(s.port);
  sock.send_all("POST /tokenize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n"
                "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                "c\r\n{\"prompt\": \"\r\nd\r\nHello world\"}\r\n0\r\n\r\n");
  const std::vector<HttpResponse> rs =
      parse_responses(read_until_closed(sock, std::chrono::seconds(30)).bytes);
  REQUIRE(rs.size() == 1);
  CHECK(rs[0].status == 200);
  CHECK(Json::parse(rs[0].body)["count"] == 2);
}

TEST_CASE("hostile: a broken model answers 503 to running and new requests, /health 503") {
  XSERV_REQUIRE_DATA(data);
  TinyServer s;
  s.model.set_open(false);
  Json stream = Json::parse(kChat);
  stream["stream"] = true;
  HttpResponse plain, streamed;
  std::thread a([&] { plain = s.post("/v1/chat/completions", kChat); });
  std::thread b([&] { streamed = s.post("/v1/chat/completions", stream.dump()); });
  REQUIRE(eventually([&] { return s.server.stats().running + s.server.stats().waiting == 2; }));
  s.model.wait_blocked(); // a step is in the model
  s.model.set_broken("pipeline rank 1 stopped: it exited on signal 9");
  s.model.set_open(true);
  a.join();
  b.join();
  CHECK(plain.status == 503);
  CHECK(error_of(plain)["code"] == "model_broken");
  CHECK(error_of(plain)["message"].get<std::string>().find("pipeline rank 1") != std::string::npos);
  CHECK(streamed.status == 200); // the stream had begun: the error is its last event
  const auto events = sse_data(streamed.body);
  REQUIRE(events.size() >= 2);
  CHECK(Json::parse(events[events.size() - 2])["error"]["code"] == "model_broken");
  const HttpResponse h = http(s.port, "GET", "/health");
  CHECK(h.status == 503);
  CHECK(Json::parse(h.body)["status"] == "broken");
  CHECK(Json::parse(h.body)["reason"].get<std::string>().find("pipeline rank 1") !=
        std::string::npos);
  const HttpResponse later = s.post("/v1/completions", R"({"prompt": "Hi", "max_tokens": 2})");
  CHECK(later.status == 503);
  CHECK(error_of(later)["code"] == "model_broken");
  CHECK(s.server.broken().find("pipeline rank 1") != std::string::npos);
}

TEST_CASE("hostile: a model that breaks while idle turns /health to 503") {
  XSERV_REQUIRE_DATA(data);
  TinyServer s;
  CHECK(http(s.port, "GET", "/health").status == 200);
  s.model.set_broken("pipeline rank 1 stopped");
  CHECK(eventually([&] { return http(s.port, "GET", "/health").status == 503; },
                   std::chrono::seconds(30)));
  CHECK(s.post("/tokenize", R"({"prompt": "x"})").status == 503);
}

TEST_CASE("hostile: accepted connections send without Nagle's delay (TCP_NODELAY)") {
  // A stream's first event is a small write behind the response header; with Nagle's algorithm
  // it would wait for the client's delayed ACK (~40 ms). The server's end of a connection is
  // found among this process's descriptors by its two ports, after one keep-alive request has
  // been answered on it: accept() makes the descriptor before the session that sets the option
  // exists, so a look right after connect() can see it without.
  XSERV_REQUIRE_DATA(data);
  TinyServer s;
  Socket client(s.port);
  client.send_all("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  std::string answer;
  while (answer.find("\r\n\r\n") == std::string::npos) {
    const std::string more = client.read_some();
    REQUIRE(!more.empty());
    answer += more;
  }
  REQUIRE(answer.rfind("HTTP/1.1 200", 0) == 0);
  sockaddr_in mine{};
  socklen_t len = sizeof mine;
  REQUIRE(::getsockname(client.fd, reinterpret_cast<sockaddr*>(&mine), &len) == 0);
  auto port_of = [](int fd, bool peer) {
    sockaddr_in a{};
    socklen_t n = sizeof a;
    const int rc = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &n)
                        : ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
    return rc == 0 && a.sin_family == AF_INET ? int(ntohs(a.sin_port)) : -1;
  };
  int server_end = -1;
  REQUIRE(eventually([&] { // the accept is asynchronous
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
      const int fd = std::stoi(e.path().filename().string());
      if (fd != client.fd && port_of(fd, false) == s.port &&
          port_of(fd, true) == int(ntohs(mine.sin_port)))
        server_end = fd;
    }
    return server_end >= 0;
  }));
  int nodelay = 0;
  socklen_t size = sizeof nodelay;
  REQUIRE(::getsockopt(server_end, IPPROTO_TCP, TCP_NODELAY, &nodelay, &size) == 0);
  CHECK(nodelay != 0);
}
