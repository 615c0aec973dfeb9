// runtime/net: frames round-trip; every failure (timeout, closed peer, foreign bytes, bad
// address) is an error naming the peer, never a hang.
#include <doctest/doctest.h>

#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>

#include "base/error.h"
#include "runtime/net.h"
#include "tests/test_util.h"

using namespace xserv;
using runtime::Connection;
using runtime::Frame;
using runtime::Listener;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

/// A connected pair through a listener on an ephemeral port.
std::pair<Connection, Connection> connected_pair(Listener& l) {
  Connection client;
  std::thread t([&] {
    client = Connection::connect("127.0.0.1:" + std::to_string(l.port()),
                                 Clock::now() + std::chrono::seconds(5));
  });
  Connection server = l.accept(Clock::now() + std::chrono::seconds(5));
  t.join();
  return {std::move(server), std::move(client)};
}

} // namespace

TEST_CASE("net: frames round-trip, large and empty") {
  Listener l(0);
  CHECK(l.port() > 0);
  auto [server, client] = connected_pair(l);
  std::string big(3 << 20, 'x');
  for (size_t i = 0; i < big.size(); i += 4099)
    big[i] = static_cast<char>(i);
  std::thread t([&] {
    client.send({7, big});
    client.send({9, ""});
  });
  const Frame a = server.receive(milliseconds(5000));
  const Frame b = server.receive(milliseconds(5000));
  t.join();
  CHECK(a.type == 7);
  CHECK(a.payload == big);
  CHECK(b.type == 9);
  CHECK(b.payload.empty());
}

TEST_CASE("net: silence, a closed peer and foreign bytes are errors naming the peer") {
  Listener l(0);
  auto [server, client] = connected_pair(l);
  CHECK_THROWS_WITH(server.receive(milliseconds(300)), doctest::Contains("sent nothing for"));
  const char junk[13] = "GET / HTTP/1";
  REQUIRE(::send(client.fd_for_tests(), junk, sizeof(junk), 0) == sizeof(junk));
  CHECK_THROWS_WITH(server.receive(milliseconds(2000)), doctest::Contains("malformed frame"));
  client.close();
  Listener l2(0);
  auto [s2, c2] = connected_pair(l2);
  c2.close();
  CHECK_THROWS_WITH(s2.receive(milliseconds(2000)), doctest::Contains("closed the connection"));
}

TEST_CASE("net: addresses and deadlines") {
  CHECK(runtime::split_address("10.0.0.2:29500") ==
        std::pair<std::string, uint16_t>{"10.0.0.2", 29500});
  CHECK_THROWS_WITH(runtime::split_address("nohost"), doctest::Contains("is not HOST:PORT"));
  CHECK_THROWS_WITH(runtime::split_address("h:0"), doctest::Contains("port must be 1 to 65535"));
  CHECK_THROWS_WITH(runtime::split_address("h:70000"),
                    doctest::Contains("port must be 1 to 65535"));
  Listener l(0);
  CHECK_THROWS_WITH(l.accept(Clock::now() + milliseconds(200)),
                    doctest::Contains("no connection on port"));
  // Nothing listens on a port we hold bound: connect gives up at its deadline.
  xserv::testing::ReservedPort held;
  REQUIRE(held.port != 0);
  CHECK_THROWS_WITH(Connection::connect("127.0.0.1:" + std::to_string(held.port),
                                        Clock::now() + milliseconds(300)),
                    doctest::Contains("before the deadline"));
}

TEST_CASE("net: a Listener can take a port the tests hold with ReservedPort") {
  // What tests/cli/pipeline_test.cpp relies on to hand rank 0 a port without a fixed number.
  xserv::testing::ReservedPort held;
  REQUIRE(held.port != 0);
  Listener l(held.port);
  CHECK(l.port() == held.port);
  auto [server, client] = connected_pair(l);
  client.send({3, "x"});
  CHECK(server.receive(milliseconds(5000)).payload == "x");
}

TEST_CASE("net: a frame larger than the receiver's bound is refused before it is read") {
  Listener l(0);
  auto [server, client] = connected_pair(l);
  std::thread t([&] { client.send({1, std::string(100, 'x')}); });
  CHECK_THROWS_WITH(server.receive(milliseconds(5000), 64),
                    doctest::Contains("announced a frame of 100 bytes (type 1), more than the 64"));
  t.join();
}

TEST_CASE("net: the bound may depend on the frame's type") {
  Listener l(0);
  auto [server, client] = connected_pair(l);
  std::thread t([&] {
    client.send({1, std::string(100, 'x')});
    client.send({2, std::string(100, 'x')});
  });
  const runtime::FrameBound bound = [](uint8_t type) { return type == 1 ? 100 : 10; };
  CHECK(server.receive(milliseconds(5000), bound).payload.size() == 100);
  CHECK_THROWS_WITH(server.receive(milliseconds(5000), bound),
                    doctest::Contains("announced a frame of 100 bytes (type 2), more than the 10"));
  t.join();
}

TEST_CASE("net: a frame that announces 1 GiB and sends 10 bytes costs no more than it sent") {
  // Within the bound, a lying header is found out only as the bytes fail to come: the payload
  // must grow with what arrives, not be allocated (and zeroed) at the announced size first.
  Listener l(0);
  auto [server, client] = connected_pair(l);
  char head[13];
  const uint32_t magic = 0x46505358; // "XSPF"
  const uint64_t len = uint64_t{1} << 30;
  std::memcpy(head, &magic, 4);
  head[4] = 3;
  std::memcpy(head + 5, &len, 8);
  REQUIRE(::send(client.fd_for_tests(), head, sizeof(head), 0) == ssize_t(sizeof(head)));
  REQUIRE(::send(client.fd_for_tests(), "0123456789", 10, 0) == 10);
  client.close();
  rusage before{};
  ::getrusage(RUSAGE_SELF, &before);
  CHECK_THROWS_WITH(server.receive(milliseconds(5000), uint64_t{1} << 31),
                    doctest::Contains("closed the connection"));
  rusage after{};
  ::getrusage(RUSAGE_SELF, &after);
  // ru_maxrss is the peak in KiB: allocating the claim would have touched 1 GiB.
  CHECK(after.ru_maxrss - before.ru_maxrss < 64 * 1024);
}

TEST_CASE("net: a listener binds only the address it is given") {
  // The default is the loopback interface; "HOST" names one address. A port of 0 is for
  // listening only.
  Listener local(0);
  Listener named("127.0.0.1", 0);
  CHECK(named.port() > 0);
  auto [s, c] = connected_pair(named);
  CHECK(c.valid());
  CHECK_THROWS_WITH(Listener("no-such-host.invalid", 0), doctest::Contains("cannot listen on"));
  CHECK(runtime::split_address("127.0.0.1:0", true).second == 0);
  CHECK_THROWS_WITH(runtime::split_address("127.0.0.1:0"), doctest::Contains("port must be 1"));
}
