// Pipeline parallelism on the CPU backend: one process per stage, rank 0 drives generation and
// runs stage 0, ranks 1..N-1 (`xserv worker`) run theirs; activations and step inputs travel over
// TCP (runtime/net). The control plane is the one the GPU pipeline uses: a handshake that refuses
// a rank holding another compile's plan, heartbeats while a stage computes, and every wait
// bounded so a dead or hung rank ends the run with a message naming it.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cli/engine.h"
#include "ir/graph.h"

namespace xserv::cli {

/// What identifies a compile of a pipelined plan: sha256 over its options, model digest and
/// stage programs. Ranks must agree on it.
std::string pipeline_plan_digest(const std::filesystem::path& plan_dir);

/// How rank 0 finds its workers.
struct PipelineLaunch {
  /// Empty: spawn the workers on this host (this executable's `worker` command) and listen on an
  /// ephemeral port; else "HOST:PORT" to listen on, for workers started elsewhere.
  std::string coordinator;
  std::filesystem::path weights; ///< passed to spawned workers as --weights when set
  /// No frame from a computing rank (not even a heartbeat) for this long: it is declared hung
  /// (XSERV_PIPELINE_TIMEOUT, seconds, sets it for xserv run).
  std::chrono::milliseconds rank_timeout{10000};
  /// How long to wait for every rank to connect.
  std::chrono::milliseconds connect_timeout{30000};
};

/// Rank 0 of a CPU pipeline: an Engine whose steps run stage 0 here and the rest on the workers.
std::unique_ptr<Engine> make_pipeline_cpu_engine(const std::filesystem::path& plan_dir,
                                                 const std::filesystem::path& model_dir,
                                                 int64_t max_batch, int64_t max_seq,
                                                 std::vector<ir::Graph> stages,
                                                 const PipelineLaunch& launch);

/// The body of `xserv worker`: connects to the coordinator, handshakes as `rank` of `world`,
/// then runs its stage for every step until told to quit. Returns the exit code.
int run_pipeline_worker(const std::filesystem::path& plan_dir,
                        const std::filesystem::path& model_dir, int rank, int world,
                        const std::string& coordinator);

} // namespace xserv::cli
