// NcclComm over a dlopen'ed libnccl.so.2: non-blocking communicators, every wait bounded.
#include "runtime/nccl.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nccl.h>

#include "base/error.h"
#include "runtime/dl_library.h"

namespace xserv::runtime {
namespace {

/// The NCCL entry points xserv uses, resolved once.
struct Api {
  DlLibrary lib;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRankConfig) init_rank_config = nullptr;
  decltype(&ncclCommGetAsyncError) get_async_error = nullptr;
  decltype(&ncclCommAbort) abort = nullptr;
  decltype(&ncclCommFinalize) finalize = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclGetLastError) last_error = nullptr;
};

const Api& api() {
  static Api a;
  static std::once_flag once;
  std::call_once(once, [] {
    a.lib = dl_open_cuda_library("libnccl.so.2", "NCCL");
    if (!a.lib.handle)
      return;
    dl_resolve(a.lib, a.get_unique_id, "ncclGetUniqueId");
    dl_resolve(a.lib, a.init_rank_config, "ncclCommInitRankConfig");
    dl_resolve(a.lib, a.get_async_error, "ncclCommGetAsyncError");
    dl_resolve(a.lib, a.abort, "ncclCommAbort");
    dl_resolve(a.lib, a.finalize, "ncclCommFinalize");
    dl_resolve(a.lib, a.destroy, "ncclCommDestroy");
    dl_resolve(a.lib, a.send, "ncclSend");
    dl_resolve(a.lib, a.recv, "ncclRecv");
    dl_resolve(a.lib, a.error_string, "ncclGetErrorString");
    dl_resolve(a.lib, a.last_error, "ncclGetLastError");
  });
  return a;
}

const Api& loaded() {
  return dl_loaded(api());
}

ncclComm_t as_comm(void* p) {
  return static_cast<ncclComm_t>(p);
}

} // namespace

bool nccl_available(std::string* reason) {
  const Api& a = api();
  if (reason)
    *reason = a.lib.error;
  return a.lib.error.empty();
}

std::string nccl_unique_id() {
  const Api& a = loaded();
  ncclUniqueId id;
  const ncclResult_t r = a.get_unique_id(&id);
  if (r != ncclSuccess)
    throw Error(fmt::format("ncclGetUniqueId failed: {}", a.error_string(r)));
  return std::string(id.internal, sizeof(id.internal));
}

NcclComm::NcclComm(const std::string& unique_id, int world, int rank,
                   std::chrono::milliseconds timeout)
    : world_(world), rank_(rank) {
  const Api& a = loaded();
  ncclUniqueId id;
  if (unique_id.size() != sizeof(id.internal))
    throw Error(fmt::format("NCCL unique id of {} bytes, expected {}", unique_id.size(),
                            sizeof(id.internal)));
  std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0; // every call returns at once; completion is polled with deadlines
  ncclComm_t comm = nullptr;
  ncclResult_t r = a.init_rank_config(&comm, world, id, rank, &config);
  comm_ = comm;
  if (r != ncclSuccess && r != ncclInProgress) {
    abort();
    throw Error(fmt::format("rank {}: joining the NCCL communicator of {} ranks failed: {}", rank,
                            world, a.error_string(r)));
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    ncclResult_t state = ncclInProgress;
    a.get_async_error(comm, &state);
    if (state == ncclSuccess)
      return;
    if (state != ncclInProgress) {
      const std::string why = a.error_string(state);
      abort();
      throw Error(fmt::format("rank {}: joining the NCCL communicator failed: {}", rank, why));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      abort();
      throw Error(fmt::format("rank {}: the NCCL communicator of {} ranks was not complete "
                              "after {} ms (a rank never joined)",
                              rank, world, timeout.count()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

NcclComm::~NcclComm() {
  if (!comm_)
    return;
  const Api& a = api();
  if (aborted_)
    return;
  // A clean shutdown: finalize (non-blocking, polled briefly), then destroy; abort otherwise.
  ncclResult_t state = a.finalize(as_comm(comm_));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (state == ncclInProgress && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    a.get_async_error(as_comm(comm_), &state);
  }
  if (state == ncclSuccess)
    a.destroy(as_comm(comm_));
  else
    a.abort(as_comm(comm_));
}

void NcclComm::abort() {
  if (comm_ && !aborted_)
    api().abort(as_comm(comm_));
  aborted_ = true;
}

void NcclComm::settle(const std::string& what, std::chrono::milliseconds timeout) {
  const Api& a = loaded();
  if (aborted_)
    throw Error(fmt::format("rank {}: {}: the NCCL communicator was aborted", rank_, what));
  // A non-blocking call may still be in progress (the first transfer to a peer connects to it):
  // its outcome decides, within the bound.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    ncclResult_t state = ncclInProgress;
    a.get_async_error(as_comm(comm_), &state);
    if (state == ncclSuccess)
      return;
    if (state != ncclInProgress) {
      const std::string detail = a.last_error(as_comm(comm_));
      abort();
      throw Error(fmt::format("rank {}: {}: NCCL error: {}{}", rank_, what, a.error_string(state),
                              detail.empty() ? "" : " (" + detail + ")"));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      abort();
      throw Error(fmt::format("rank {}: {}: NCCL still busy after {} ms (the peer is gone or "
                              "stuck)",
                              rank_, what, timeout.count()));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void NcclComm::send(const void* buf, size_t bytes, int peer, cudaStream_t stream,
                    std::chrono::milliseconds timeout) {
  const Api& a = loaded();
  const std::string what = fmt::format("sending {} bytes to rank {}", bytes, peer);
  after_post(a.send(buf, bytes, ncclUint8, peer, as_comm(comm_), stream), what, timeout);
}

void NcclComm::recv(void* buf, size_t bytes, int peer, cudaStream_t stream,
                    std::chrono::milliseconds timeout) {
  const Api& a = loaded();
  const std::string what = fmt::format("receiving {} bytes from rank {}", bytes, peer);
  after_post(a.recv(buf, bytes, ncclUint8, peer, as_comm(comm_), stream), what, timeout);
}

void NcclComm::after_post(int result, const std::string& what, std::chrono::milliseconds timeout) {
  const auto r = static_cast<ncclResult_t>(result);
  if (r != ncclSuccess && r != ncclInProgress) {
    abort();
    throw Error(fmt::format("rank {}: {}: {}", rank_, what, loaded().error_string(r)));
  }
  settle(what, timeout);
}

void NcclComm::connect_pipeline(std::chrono::milliseconds timeout) {
  void* buf = nullptr;
  cudaStream_t stream = nullptr;
  auto release = [&] {
    if (stream)
      cudaStreamDestroy(stream);
    if (buf)
      cudaFree(buf);
  };
  if (cudaMalloc(&buf, 4) != cudaSuccess ||
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess ||
      cudaMemsetAsync(buf, 0, 4, stream) != cudaSuccess) {
    release();
    throw Error(fmt::format("rank {}: no GPU memory or stream for NCCL's first transfer", rank_));
  }
  try {
    if (rank_ > 0)
      recv(buf, 4, rank_ - 1, stream, timeout);
    if (rank_ + 1 < world_)
      send(buf, 4, rank_ + 1, stream, timeout);
    wait(stream, timeout, "connecting to the neighbouring pipeline ranks");
  } catch (...) {
    release();
    throw;
  }
  release();
}

void NcclComm::wait(cudaStream_t stream, std::chrono::milliseconds timeout,
                    const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const cudaError_t q = cudaStreamQuery(stream);
    if (q == cudaSuccess)
      return;
    if (q != cudaErrorNotReady) {
      abort();
      throw Error(fmt::format("rank {}: {}: {}", rank_, what, cudaGetErrorString(q)));
    }
    settle(what, std::chrono::milliseconds(
                     std::max<int64_t>(1, std::chrono::duration_cast<std::chrono::milliseconds>(
                                              deadline - std::chrono::steady_clock::now())
                                              .count())));
    if (std::chrono::steady_clock::now() > deadline) {
      abort();
      throw Error(fmt::format("rank {}: {}: not done after {} ms (the peer is gone or stuck)",
                              rank_, what, timeout.count()));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

} // namespace xserv::runtime
