// libFuzzer target: any byte stream a pipeline peer may send, read by runtime::Connection::receive
// (runtime/net.h) over a socketpair, frame after frame, with a bound by frame type. Each frame
// must come out as an independent reading of the stream says ("XSPF", type, u64 length, payload):
// the same type and payload, or an xserv::Error of the right kind (a closed connection, foreign
// bytes, a frame announcing more than its type's bound); and in the sanitizer builds no single
// allocation while receiving exceeds 64 KiB or twice the bytes the peer still had to send, so a
// frame that announces gigabytes costs what was sent.
//
// Input: 4 bytes of per-type bounds (type % 4; each byte b: (b & 63) << 10 * (b >> 6), 255: no
// bound), then ops until the input ends (op % 4): 0 a frame header (type, shift, u16 m: length
// m << shift), 1 n raw bytes, 2 a run of up to 2 MiB of one byte, 3 a boundary between the
// writer's send() calls. The stream is written by a second thread, then its end shut.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "runtime/net.h"

#if defined(__SANITIZE_ADDRESS__)
#define XSERV_FUZZ_MALLOC_HOOKS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define XSERV_FUZZ_MALLOC_HOOKS 1
#endif
#endif

#ifdef XSERV_FUZZ_MALLOC_HOOKS
// From the sanitizer runtime (sanitizer/allocator_interface.h, which GCC does not ship).
extern "C" int __sanitizer_install_malloc_and_free_hooks(void (*)(const volatile void*, size_t),
                                                         void (*)(const volatile void*));
#endif

namespace {

constexpr uint32_t kMagic = 0x46505358; // "XSPF" little-endian, as runtime/net.cpp sends it
constexpr size_t kMaxStream = 4 << 20;

/// The largest allocation made on the receiving thread while `watching` is set.
thread_local bool watching = false;
std::atomic<size_t> largest{0};

#ifdef XSERV_FUZZ_MALLOC_HOOKS
void on_malloc(const volatile void*, size_t size) {
  if (watching) {
    size_t seen = largest.load(std::memory_order_relaxed);
    while (size > seen && !largest.compare_exchange_weak(seen, size))
      ;
  }
}
void on_free(const volatile void*) {}
[[maybe_unused]] const bool hooks_installed =
    __sanitizer_install_malloc_and_free_hooks(on_malloc, on_free) != 0;
#endif

/// Reads the fuzz input front to back; zeros past its end.
struct Reader {
  const uint8_t* data;
  size_t size;
  size_t at = 0;
  bool done() const { return at >= size; }
  uint8_t byte() { return at < size ? data[at++] : 0; }
};

uint64_t bound_of(uint8_t b) {
  return b == 255 ? UINT64_MAX : uint64_t{b & 63u} << (10 * (b >> 6));
}

/// What receive() must do with the stream from `at`: a frame, or one kind of error.
enum class Expect { Frame, Closed, Foreign, TooLarge };

[[noreturn]] void contract_broken() {
  std::abort();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace xserv;
  Reader in{data, size};
  uint64_t bounds[4];
  for (uint64_t& b : bounds)
    b = bound_of(in.byte());

  // The stream, and where the writer's send() calls split it.
  std::string stream;
  std::vector<size_t> cuts;
  while (!in.done() && stream.size() < kMaxStream) {
    switch (in.byte() % 4) {
    case 0: {
      const uint8_t type = in.byte();
      const int shift = in.byte() % 64;
      const uint64_t m = in.byte() | uint64_t{in.byte()} << 8;
      const uint64_t len = m << shift;
      char head[13];
      std::memcpy(head, &kMagic, 4);
      head[4] = static_cast<char>(type);
      std::memcpy(head + 5, &len, 8);
      stream.append(head, sizeof(head));
      break;
    }
    case 1: {
      const size_t n = std::min<size_t>(in.byte(), in.size - in.at);
      stream.append(reinterpret_cast<const char*>(in.data + in.at), n);
      in.at += n;
      break;
    }
    case 2: {
      const size_t n = (in.byte() | size_t{in.byte()} << 8) * 32;
      stream.append(std::min(n, kMaxStream - stream.size()), static_cast<char>(in.byte()));
      break;
    }
    default:
      cuts.push_back(stream.size());
    }
  }
  cuts.push_back(stream.size());

  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0)
    std::abort();
  std::thread writer([&] {
    size_t sent = 0;
    for (size_t cut : cuts) {
      while (sent < cut) {
        const ssize_t n = ::send(fds[1], stream.data() + sent, cut - sent, MSG_NOSIGNAL);
        if (n <= 0)
          break; // the reader stopped and closed its end
        sent += static_cast<size_t>(n);
      }
      if (sent < cut)
        break;
    }
    ::shutdown(fds[1], SHUT_WR);
  });

  const runtime::FrameBound bound = [&bounds](uint8_t type) { return bounds[type % 4]; };
  {
    runtime::Connection c(fds[0], "fuzz-peer");
    size_t at = 0;
    for (int frames = 0; frames < 64; ++frames) {
      // The independent reading of the stream at `at`.
      const size_t left = stream.size() - at;
      Expect expect = Expect::Frame;
      uint8_t type = 0;
      uint64_t len = 0;
      if (left < 13) {
        expect = Expect::Closed;
      } else {
        uint32_t magic = 0;
        std::memcpy(&magic, stream.data() + at, 4);
        type = static_cast<uint8_t>(stream[at + 4]);
        std::memcpy(&len, stream.data() + at + 5, 8);
        if (magic != kMagic)
          expect = Expect::Foreign;
        else if (len > std::min(bounds[type % 4], runtime::kMaxFramePayload))
          expect = Expect::TooLarge;
        else if (len > left - 13)
          expect = Expect::Closed;
      }
      const size_t can_come = left < 13 ? 0 : left - 13; // payload bytes the peer still sends

      largest = 0;
      watching = true;
      runtime::Frame f;
      std::string error;
      try {
        f = c.receive(std::chrono::seconds(20), bound);
      } catch (const Error& e) {
        error = e.what();
      }
      watching = false;
      if (largest > std::max<size_t>(64 << 10, 2 * can_come) + 4096)
        contract_broken(); // allocated ahead of what came

      if (expect == Expect::Frame) {
        if (!error.empty() || f.type != type || f.payload.size() != len ||
            stream.compare(at + 13, len, f.payload) != 0)
          contract_broken();
        at += 13 + len;
        continue;
      }
      const char* says = expect == Expect::Closed    ? "closed the connection"
                         : expect == Expect::Foreign ? "malformed frame"
                                                     : "announced a frame of";
      if (error.find(says) == std::string::npos || error.find("fuzz-peer") == std::string::npos)
        contract_broken();
      break;
    }
  } // closes the reading end: a writer still sending fails and stops
  writer.join();
  ::close(fds[1]);
  return 0;
}
