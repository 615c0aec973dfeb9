// Rank 0's control plane of a multi-process pipeline: it listens, spawns the workers on this
// host or waits for them to join from others, authenticates each (HMAC challenge-response over
// the shared token) and refuses a rank holding another compile's plan, welcomes it with the run's
// sizes and backend, keeps one connection and a heartbeat to each rank, and bounds every wait for
// a frame so that a dead or hung rank ends the run with a message naming it. The step driver
// (pipeline_model.cpp) sends and awaits frames through it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <sys/types.h>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "engine/pipeline/boundary.h"
#include "engine/pipeline/options.h"
#include "runtime/net.h"
#include "runtime/open_plan.h"

namespace xserv::engine::pipeline {

/// What rank 0 tells every worker it accepts.
struct Welcome {
  std::string backend;   ///< "cpu" or "cuda"
  int64_t max_batch = 0; ///< the run's sizes, within the plan's
  int64_t max_seq = 0;
  std::string nccl_id; ///< the NCCL unique id (bytes) when activations go over NCCL
};

class Coordinator {
public:
  /// Listens (options.coordinator, else an ephemeral port on 127.0.0.1 for workers it spawns
  /// itself), then waits up to options.connect_timeout until every rank of the pipelined plan
  /// has connected and proven it holds the token. Strays (garbage, idle or unauthenticated
  /// connections) are logged and dropped; an authenticated rank with another world, digest or a
  /// rank taken twice ends the start naming it. Spawned workers with the CUDA backend get GPU
  /// r mod `gpus`. Throws xserv::Error when not every rank joins.
  Coordinator(const runtime::OpenedPlan& plan, const PipelineOptions& options,
              const Welcome& welcome, int gpus);
  /// Stops the heartbeats, tells every rank to quit and reaps the workers it spawned (SIGKILL
  /// after 5 s).
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  int world() const { return static_cast<int>(ranks_.size()); }
  /// From now on every worker hears from rank 0 at least once a second, so a frozen rank 0 ends
  /// the workers' runs (their rank timeout) instead of leaving them waiting.
  void start_heartbeats();
  /// Sends `f` to rank `r` (serialised with the heartbeats); a failed send ends the run naming r.
  void send(int r, const runtime::Frame& f);
  /// Waits for a frame of `type` from rank `r` (heartbeats extend the wait up to the step
  /// timeout), decoding its tensors into `tensors` and returning its header; a failure frame, a
  /// silence past the rank timeout, a dropped connection or a frame announcing more than
  /// `max_bytes` throws naming the rank (fail()).
  nlohmann::json await(int r, uint8_t type, Named* tensors, uint64_t max_bytes);
  /// Throws xserv::Error naming rank `r` for `e`, after a moment for a worker this process
  /// started to exit, so the message can say how it ended.
  [[noreturn]] void fail(int r, const Error& e);
  /// Throws naming the rank when a worker this process started has exited.
  void check_children();
  /// Why a rank is lost though no step is running ("" while none is): a heartbeat to it
  /// failed, so its connection is gone (a killed worker is seen within two heartbeats). Any
  /// thread may ask; the step driver's Model::broken() can report it between steps.
  std::string lost() const;

private:
  class Handshakes;
  /// The handshake of a new connection up to its proof (thread-safe: it reads only the token).
  nlohmann::json authenticate(runtime::Connection& c);
  /// Accepts until every rank has joined: each connection is authenticated concurrently under
  /// its own deadline, so strays cannot use up options.connect_timeout.
  void accept_ranks(const Welcome& welcome);
  void spawn_workers(int gpus);
  void stop_heartbeats();
  /// Quit to every rank, then the spawned workers reaped (killed after `grace`).
  void shut_down(std::chrono::milliseconds grace);
  void beat_workers();
  bool child_rank_has(int r) const;

  runtime::OpenedPlan plan_;
  PipelineOptions options_;
  std::string token_;  ///< the shared secret every rank proves it holds
  std::string digest_; ///< the plan's pipeline_plan_digest
  runtime::Listener listener_;
  std::vector<runtime::Connection> ranks_;           ///< [0] unused: this process
  std::vector<std::unique_ptr<std::mutex>> send_mu_; ///< per rank: sends vs heartbeats
  mutable std::mutex beat_mu_;
  std::condition_variable beat_wake_;
  bool beat_done_ = false;
  std::string lost_; ///< guarded by beat_mu_
  std::thread beat_;
  std::vector<pid_t> children_;
  std::map<pid_t, int> child_rank_;
};

/// What identifies a compile of a pipelined plan: sha256 over its options, model digest and
/// stage programs (their SHA-256 in plan.json's digests, which open_plan checked). Ranks must
/// agree on it. Throws xserv::Error for a plan that is not pipelined.
std::string pipeline_plan_digest(const runtime::OpenedPlan& plan);

/// The transport `o` asks for, "auto" resolved as PipelineOptions::transport says; `gpus` is the
/// number of visible GPUs and `nccl_loads` whether NCCL opened. `why` gets the reason for tcp.
std::string resolve_transport(const PipelineOptions& o, int world, int gpus, bool nccl_loads,
                              std::string* why = nullptr);

} // namespace xserv::engine::pipeline
