// Helpers shared by tests: locating ../shared/data and the source tree, raw float files.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <vector>

namespace xserv::testing {

/// ||got - want|| / ||want|| over n values, in double; NaN when got holds a non-finite value.
inline double rel_l2(const float* got, const float* want, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i]))
      return std::numeric_limits<double>::quiet_NaN();
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

/// rel_l2 of two vectors; NaN when their sizes differ.
inline double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  return got.size() == want.size() ? rel_l2(got.data(), want.data(), got.size())
                                   : std::numeric_limits<double>::quiet_NaN();
}

/// The shared data directory: $XSERV_DATA, else ../shared/data beside the source tree.
/// Empty when neither exists; callers skip with a message then.
inline std::optional<std::filesystem::path> data_dir() {
  if (const char* env = std::getenv("XSERV_DATA"); env && *env) {
    if (std::filesystem::is_directory(env))
      return std::filesystem::path(env);
    return std::nullopt;
  }
  std::filesystem::path p = XSERV_DATA_DEFAULT;
  if (std::filesystem::is_directory(p))
    return p;
  return std::nullopt;
}

/// The source tree: $XSERV_SOURCE_DIR when set (the GPU machine runs a copy of the tree in
/// another place), else the one this test was built from.
inline std::filesystem::path source_dir() {
  if (const char* env = std::getenv("XSERV_SOURCE_DIR"); env && *env)
    return env;
  return XSERV_SOURCE_DIR;
}

/// A fresh directory under the system temp dir, unique to this process and object (named after
/// `name`, the process id and a counter), removed with everything in it when the test leaves,
/// failed or not.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& name = "test")
      : path(std::filesystem::temp_directory_path() /
             ("xserv_" + name + "_" + std::to_string(getpid()) + "_" + std::to_string(next()))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

private:
  static int next() {
    static std::atomic<int> n{0};
    return n++;
  }
};

/// A TCP port of this machine held for the life of the object, instead of a fixed number: a
/// socket bound to port 0 (the kernel picks a free one) with SO_REUSEADDR and never listening.
/// No other process gets the port from the kernel meanwhile, and nothing connects to it
/// (connections are refused), but a listener that sets SO_REUSEADDR, as runtime::Listener does,
/// can still bind and listen on it: hand `port` to the process under test.
struct ReservedPort {
  int fd = -1;
  uint16_t port = 0;
  ReservedPort() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof(addr);
    if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
      port = ntohs(addr.sin_port);
  }
  ~ReservedPort() {
    if (fd >= 0)
      ::close(fd);
  }
  ReservedPort(const ReservedPort&) = delete;
  ReservedPort& operator=(const ReservedPort&) = delete;
};

/// The float32 values of a raw little-endian file (what --logits-out and xserv trace write).
inline std::vector<float> read_floats(const std::filesystem::path& f) {
  std::ifstream in(f, std::ios::binary);
  std::vector<float> v(std::filesystem::file_size(f) / sizeof(float));
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  return v;
}

} // namespace xserv::testing

/// Skips the rest of a test case when the shared data directory is absent, saying why. Put it
/// before any assertion: ctest reports an entry that prints "skipped:" as skipped whatever its
/// exit code (tests/CMakeLists.txt), so a failure before the skip would be hidden.
#define XSERV_REQUIRE_DATA(var)                                                                    \
  auto var##_opt = ::xserv::testing::data_dir();                                                   \
  if (!var##_opt) {                                                                                \
    MESSAGE("skipped: shared data directory not found (set XSERV_DATA)");                          \
    return;                                                                                        \
  }                                                                                                \
  const std::filesystem::path var = *var##_opt
