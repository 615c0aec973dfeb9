// NCCL point-to-point between pipeline ranks: a communicator joined through a unique id that the
// ranks exchange over their own TCP control plane, send/recv on the caller's streams, and waits
// that never hang: every wait polls NCCL's asynchronous error and aborts the communicator on an
// error or a deadline, so a dead or stuck peer becomes an exception naming it.
//
// libnccl.so.2 is opened at run time (dlopen), so xserv starts and runs everything else on
// machines without NCCL; the first NcclComm (or nccl_unique_id) says clearly when it is missing.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include <cuda_runtime_api.h>

namespace xserv::runtime {

/// Whether libnccl.so.2 can be loaded here (and why not, in `reason`).
bool nccl_available(std::string* reason = nullptr);

/// A fresh NCCL unique id (ncclGetUniqueId) as its 128 raw bytes, for rank 0 to hand the others.
std::string nccl_unique_id();

/// One rank's membership of a communicator of `world` ranks on this process's current GPU.
class NcclComm {
public:
  /// Joins the communicator named by `unique_id` (from nccl_unique_id on some rank) as `rank`.
  /// Non-blocking initialisation, polled until every rank has joined or `timeout` passes (then
  /// aborted, and xserv::Error says which rank waited for how long).
  NcclComm(const std::string& unique_id, int world, int rank, std::chrono::milliseconds timeout);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }

  /// Enqueues sending `bytes` bytes at device address `buf` to rank `peer` on `stream`. The
  /// first transfer to a peer connects to it: if that is not done within `timeout`, the
  /// communicator is aborted and xserv::Error names the peer.
  void send(const void* buf, size_t bytes, int peer, cudaStream_t stream,
            std::chrono::milliseconds timeout = std::chrono::seconds(30));
  /// Enqueues receiving `bytes` bytes from rank `peer` into device address `buf` on `stream`
  /// (bounded like send()).
  void recv(void* buf, size_t bytes, int peer, cudaStream_t stream,
            std::chrono::milliseconds timeout = std::chrono::seconds(30));

  /// Sends 4 bytes from every rank to the next (rank r receives from r - 1, then sends to
  /// r + 1), so NCCL sets up the connections a pipeline's activations take now rather than in
  /// the first step (about 0.1 s on two H200s). Every rank calls it once after joining; bounded
  /// like send() and wait().
  void connect_pipeline(std::chrono::milliseconds timeout);

  /// Waits until `stream` has finished, polling the communicator: an asynchronous NCCL error
  /// or no completion within `timeout` aborts the communicator and throws xserv::Error with
  /// `what` (e.g. "receiving layer 12's activations from rank 0").
  void wait(cudaStream_t stream, std::chrono::milliseconds timeout, const std::string& what);

  /// Aborts the communicator (pending operations end with an error); later calls throw.
  void abort();

private:
  /// Polls until no NCCL call of this communicator is in progress; throws (after aborting) on
  /// an asynchronous error or when `timeout` passes.
  void settle(const std::string& what, std::chrono::milliseconds timeout);
  /// After posting a send or receive that returned `result` (an ncclResult_t): an immediate
  /// error aborts and throws with `what`, else settle().
  void after_post(int result, const std::string& what, std::chrono::milliseconds timeout);

  void* comm_ = nullptr; ///< ncclComm_t
  int world_ = 0, rank_ = 0;
  bool aborted_ = false;
};

} // namespace xserv::runtime
