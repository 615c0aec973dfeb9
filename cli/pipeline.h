// Pipeline parallelism, one process per stage: rank 0 drives generation and runs stage 0, ranks
// 1..N-1 (`xserv worker`) run theirs, on the CPU (interpreter) or each on its own GPU (a
// CudaModel over the stage's launch table from the plan). Step inputs and activations travel over
// TCP (runtime/net), through rank 0. The control plane: a handshake that refuses a rank holding
// another compile's plan and tells every rank the backend, heartbeats while a stage computes,
// and every wait bounded so a dead or hung rank ends the run with a message naming it.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cli/engine.h"
#include "cli/model_source.h"
#include "engine/pipeline_stage.h"
#include "ir/graph.h"

namespace xserv::cli {

/// What identifies a compile of a pipelined plan: sha256 over its options, model digest and
/// stage programs (their SHA-256 in plan.json's digests, which verify_plan_files checked), of
/// the plan resolve_source read (loaded_plan). Ranks must agree on it.
std::string pipeline_plan_digest(const std::filesystem::path& plan_dir);

/// How rank 0 finds its workers.
struct PipelineLaunch {
  /// Empty: spawn the workers on this host (this executable's `worker` command) and listen on an
  /// ephemeral port; else "HOST:PORT" to listen on, for workers started elsewhere.
  std::string coordinator;
  std::filesystem::path weights; ///< passed to spawned workers as --weights when set
  /// The shared secret every rank proves it holds (--pipeline-token, else XSERV_PIPELINE_TOKEN:
  /// pipeline_token_given); empty: a random one for spawned workers (wire::pipeline_token).
  std::string token;
  /// No frame from a computing rank (not even a heartbeat) for this long: it is declared hung
  /// (XSERV_PIPELINE_TIMEOUT, seconds, sets it for xserv run).
  std::chrono::milliseconds rank_timeout{10000};
  /// How long to wait for every rank to connect.
  std::chrono::milliseconds connect_timeout{30000};
  /// "cpu" or "cuda": every rank runs its stage there. With cuda, spawned worker r gets GPU
  /// r mod (visible GPUs); rank 0 runs on the first visible GPU.
  std::string backend = "cpu";
  /// Micro-batches per step, so that stages overlap (rank r works on micro-batch m while rank
  /// r + 1 works on m - 1): consecutive token ranges of the step, a sequence's pieces in order.
  /// 0: as many as ranks when the step has a prompt piece (some sequence brings two or more
  /// tokens) and at least two tokens per rank, else 1; a decode step stays whole because every
  /// micro-batch reads the stage's weights again (XSERV_PIPELINE_MICROBATCHES sets it for xserv
  /// run).
  int micro_batches = 0;
  /// How activations move between ranks: "tcp" (through rank 0's host memory, every backend),
  /// "nccl" (GPU to GPU, rank to rank; the CUDA backend) or "auto": nccl with the CUDA backend
  /// when NCCL loads and each rank has a GPU of its own (workers on other hosts count as such),
  /// else tcp (XSERV_PIPELINE_TRANSPORT sets it for xserv run).
  std::string transport = "auto";
};

/// The transport `launch` asks for, "auto" resolved as PipelineLaunch::transport says; `gpus` is
/// the number of visible GPUs and `nccl_loads` whether NCCL opened. `why` gets the reason for tcp.
std::string resolve_transport(const PipelineLaunch& launch, int world, int gpus, bool nccl_loads,
                              std::string* why = nullptr);

/// Micro-batches for a step of `tokens` tokens over `world` ranks, `prompt` when some sequence
/// brings two or more tokens; `requested` > 0 wins (PipelineLaunch::micro_batches).
int pipeline_micro_batches(int requested, size_t tokens, bool prompt, int world);

/// How long a computing rank may stay silent before it is declared hung:
/// XSERV_PIPELINE_TIMEOUT seconds (at least 0.1), else 10 s.
std::chrono::milliseconds pipeline_rank_timeout();

/// XSERV_PIPELINE_STEP_TIMEOUT in seconds (default 600): the most rank 0 waits for one rank's
/// answer in a step, however many heartbeats arrive meanwhile; past it the run ends naming the
/// rank.
std::chrono::milliseconds pipeline_step_timeout();

/// Rank 0 of a pipeline: a Model whose steps run stage 0 of the pipelined plan `src` here and
/// the rest on the workers, at the run's sizes (src.max_batch, src.max_seq).
std::unique_ptr<Model> make_pipeline_model(const ModelSource& src, const PipelineLaunch& launch);

/// Stage `stage` of the pipelined plan `src` on this process's `backend`, for `max_batch`
/// sequences of up to `max_seq` positions: "cpu" runs the stage's program (stageN.ir) on the
/// interpreter; "cuda" the plan's launch table and cubins for the stage, which read no stageN.ir
/// and need the plan's sizes (check_plan_run's message otherwise). Throws xserv::Error for
/// another backend.
std::unique_ptr<engine::StageRunner> make_stage_runner(const ModelSource& src, size_t stage,
                                                       const std::string& backend,
                                                       int64_t max_batch, int64_t max_seq);

/// The body of `xserv worker` for the pipelined plan `src` (its stage programs and limits, as
/// resolve_source read them): connects to the coordinator, handshakes as `rank` of `world`,
/// then runs its stage (on the backend rank 0 names) for every step until told to quit.
/// `token_flag` is the shared secret given (--pipeline-token, else XSERV_PIPELINE_TOKEN).
/// Returns the exit code. With the CUDA backend the process uses its first visible GPU
/// (`xserv worker --device D` narrows CUDA_VISIBLE_DEVICES before any CUDA call).
int run_pipeline_worker(const ModelSource& src, int rank, int world, const std::string& coordinator,
                        const std::string& token_flag = "");

} // namespace xserv::cli
