// NCCL point-to-point between two GPUs of this host (two ranks, one thread each): bytes arrive
// intact, and a receive whose sender never comes ends in a bounded wait with an error naming
// the peer instead of a hang. Needs two GPUs and libnccl.so.2; skips with a message otherwise.
#include "base/error.h"
#include "runtime/device.h"
#include "runtime/nccl.h"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

using namespace xserv::runtime;
using namespace std::chrono_literals;

namespace {

/// Runs `body(rank)` on two threads, each on its own GPU; rethrows the first failure.
template <typename F> void two_ranks(F body) {
  std::exception_ptr failure[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        REQUIRE(cudaSetDevice(r) == cudaSuccess);
        body(r);
      } catch (...) {
        failure[r] = std::current_exception();
      }
    });
  for (auto& t : threads)
    t.join();
  for (auto& f : failure)
    if (f)
      std::rethrow_exception(f);
}

} // namespace

TEST_CASE("gpu: NCCL send/recv between two GPUs, and a missing sender ends in a bounded wait") {
  const DeviceInfo dev = probe_device();
  std::string why;
  if (!dev.available || dev.count < 2 || !nccl_available(&why)) {
    MESSAGE("skipped: needs two GPUs and NCCL (" << (dev.available ? why : dev.reason) << ", "
                                                 << dev.count << " GPU(s))");
    return;
  }
  const std::string id = nccl_unique_id();
  REQUIRE(id.size() == 128);
  const size_t n = (1 << 20) + 3; // not a multiple of anything convenient
  std::vector<uint8_t> got(n);
  double connect_ms[2] = {0, 0};
  two_ranks([&](int rank) {
    NcclComm comm(id, 2, rank, 60s);
    const auto t0 = std::chrono::steady_clock::now();
    comm.connect_pipeline(30s); // the pipeline's first transfer, made at join
    connect_ms[rank] =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    cudaStream_t s;
    REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    void* buf = nullptr;
    REQUIRE(cudaMalloc(&buf, n) == cudaSuccess);
    if (rank == 0) {
      std::vector<uint8_t> host(n);
      for (size_t i = 0; i < n; ++i)
        host[i] = static_cast<uint8_t>(i * 131 + 7);
      REQUIRE(cudaMemcpy(buf, host.data(), n, cudaMemcpyHostToDevice) == cudaSuccess);
      comm.send(buf, n, 1, s);
      comm.wait(s, 30s, "sending the test buffer to rank 1");
    } else {
      REQUIRE(cudaMemset(buf, 0, n) == cudaSuccess);
      comm.recv(buf, n, 0, s);
      comm.wait(s, 30s, "receiving the test buffer from rank 0");
      REQUIRE(cudaMemcpy(got.data(), buf, n, cudaMemcpyDeviceToHost) == cudaSuccess);
    }
    cudaFree(buf);
    cudaStreamDestroy(s);
  });
  MESSAGE("connect_pipeline: rank 0 " << connect_ms[0] << " ms, rank 1 " << connect_ms[1] << " ms");
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i)
    wrong += got[i] != static_cast<uint8_t>(i * 131 + 7);
  CHECK(wrong == 0);

  // Rank 1 waits for bytes rank 0 never sends: the wait gives up after its bound and says so.
  const std::string id2 = nccl_unique_id();
  std::string message;
  double waited = 0;
  two_ranks([&](int rank) {
    NcclComm comm(id2, 2, rank, 60s);
    if (rank == 0)
      return; // joins, then leaves without sending
    cudaStream_t s;
    REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    void* buf = nullptr;
    REQUIRE(cudaMalloc(&buf, 4096) == cudaSuccess);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      comm.recv(buf, 4096, 0, s, 3s);
      comm.wait(s, 3s, "receiving activations from rank 0");
    } catch (const xserv::Error& e) {
      message = e.what();
    }
    waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    cudaStreamDestroy(s); // the aborted communicator released the stream's work
  });
  MESSAGE("missing sender: " << message << " after " << waited << " s");
  CHECK(message.find("from rank 0") != std::string::npos);
  CHECK(waited < 30.0);
}
