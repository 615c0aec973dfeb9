// How a multi-process pipeline runs: where rank 0 finds its workers, the shared secret, the
// timeouts every wait is bounded by, how steps are cut and how activations travel. The caller
// fills it (the CLI from its flags and XSERV_PIPELINE_* variables); nothing below reads the
// environment.
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>

namespace xserv::engine::pipeline {

/// A fault a test injects (XSERV_PIPELINE_FAULT="RANK:WHAT@STEP"): rank `rank` fails at step
/// `step` in the way `what` says (wire.h: maybe_fault and its siblings).
struct Fault {
  int rank = 0;
  std::string what; ///< exit, hang, stop, stall or narrow
  int64_t step = 0;
};

/// Settings every rank of a pipeline shares.
struct PipelineOptions {
  /// Rank 0: empty spawns the workers on this host (this executable's `worker` command) and
  /// listens on an ephemeral port; else "HOST:PORT" to listen on, for workers started
  /// elsewhere. A worker: the HOST:PORT of rank 0.
  std::string coordinator;
  std::filesystem::path weights; ///< passed to spawned workers as --weights when set
  /// The shared secret every rank proves it holds (--pipeline-token, else
  /// XSERV_PIPELINE_TOKEN); empty on rank 0: a random one for spawned workers.
  std::string token;
  /// No frame from a computing rank (not even a heartbeat) for this long: it is declared hung
  /// (XSERV_PIPELINE_TIMEOUT).
  std::chrono::milliseconds rank_timeout{10000};
  /// The most rank 0 waits for one rank's answer in a step, however many heartbeats arrive
  /// meanwhile (XSERV_PIPELINE_STEP_TIMEOUT).
  std::chrono::milliseconds step_timeout{60000};
  /// How long to wait for every rank to connect.
  std::chrono::milliseconds connect_timeout{30000};
  /// "cpu" or "cuda": every rank runs its stage there. With cuda, spawned worker r gets GPU
  /// r mod (visible GPUs); rank 0 runs on the first visible GPU.
  std::string backend = "cpu";
  /// Micro-batches per step, so that stages overlap (rank r works on micro-batch m while rank
  /// r + 1 works on m - 1): consecutive token ranges of the step, a sequence's pieces in order.
  /// 0: as many as ranks when the step has a prompt piece (some sequence brings two or more
  /// tokens) and at least two tokens per rank, else 1; a decode step stays whole because every
  /// micro-batch reads the stage's weights again (XSERV_PIPELINE_MICROBATCHES).
  int micro_batches = 0;
  /// How activations move between ranks: "tcp" (through rank 0's host memory, every backend),
  /// "nccl" (GPU to GPU, rank to rank; the CUDA backend) or "auto": nccl with the CUDA backend
  /// when NCCL loads and each rank has a GPU of its own (workers on other hosts count as such),
  /// else tcp (XSERV_PIPELINE_TRANSPORT).
  std::string transport = "auto";
  std::optional<Fault> fault; ///< tests only
};

} // namespace xserv::engine::pipeline
