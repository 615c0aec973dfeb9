// A pipeline stage's side of a step: the named activations it receives and sends, the
// micro-batches rank 0 cuts a step into, and StageRunner, one stage on this process's device (its
// program on the CPU interpreter, or its plan's launch table on a CudaModel).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/pipeline/boundary.h"
#include "ir/graph.h"
#include "models/config.h"
#include "models/step.h"
#include "runtime/plan_stage.h"

namespace xserv::runtime {
class NcclComm;
struct OpenedPlan;  // runtime/open_plan.h
struct RunSettings; // runtime/open_plan.h
} // namespace xserv::runtime

namespace xserv::engine {
struct CudaModelOptions; // engine/cuda_options.h
}

namespace xserv::engine::pipeline {

/// The names and tensors a stage's outputs stand for: its sends by name, else "out.I".
Named name_outputs(const ir::Graph& g, std::vector<ir::Tensor> out);

/// A part of a step: consecutive tokens of it, each sequence's share as one piece.
struct MicroBatch {
  models::StepInput in;
  std::vector<size_t> seq; ///< the step's sequence each piece belongs to
  std::vector<bool> last;  ///< whether the piece holds its sequence's last token of the step
};

/// Cuts `in` into min(count, tokens) micro-batches (at least 1) whose token counts differ by at
/// most one, in token order: a sequence's pieces keep their order, each starting where the
/// previous ended (its context length grows by the earlier pieces).
std::vector<MicroBatch> micro_batches(const models::StepInput& in, int count);

/// One stage's program on this rank's device.
class StageRunner {
public:
  virtual ~StageRunner() = default;
  virtual const models::ModelConfig& config() const = 0;
  /// The paging of the stage's KV caches (every stage of a plan pages alike).
  virtual const models::KvGeometry& kv_geometry() const = 0;
  /// Runs the step with the activations this stage receives (by recv name); returns what it
  /// sends on, by name (the last stage: its logits as "out.0").
  virtual Named run(const models::StepInput& in, const Named& received) = 0;
  /// The last stage: run() that returns each sequence's greedy token instead of its logits.
  virtual std::vector<int32_t> run_greedy(const models::StepInput& in, const Named& received) = 0;
  virtual void reset() = 0;
  /// From now on the boundary activations move over `comm` (this process is rank `rank` of it)
  /// on the device: run() receives from rank - 1 and sends to rank + 1 itself, ignores
  /// `received` and returns nothing but the last stage's results; every transfer and the
  /// step end within `timeout` or throw naming the peer. Only the CUDA backend can.
  virtual void use_nccl(runtime::NcclComm* comm, int rank, std::chrono::milliseconds timeout);
};

/// The stage's program `stage` on the interpreter (the runner keeps its own copy).
std::unique_ptr<StageRunner> make_cpu_stage(const std::filesystem::path& model_dir,
                                            int64_t max_batch, int64_t max_seq, ir::Graph stage);

/// A CudaModel over a plan stage's program on this process's GPU (activations cross the host,
/// or the device with use_nccl). Throws xserv::Error for a stage that sends more than one value.
std::unique_ptr<StageRunner> make_cuda_stage(const std::filesystem::path& model_dir,
                                             runtime::StageProgram program,
                                             const CudaModelOptions& options);

/// Stage `stage` of the pipelined plan `plan` on this process's `backend`, for `max_batch`
/// sequences of up to `max_seq` positions: "cpu" runs the stage's program (stageN.ir) on the
/// interpreter; "cuda" the plan's launch table and cubins for the stage, which read no stageN.ir
/// and need the plan's sizes and settings (runtime::check_plan_run's message otherwise). Throws
/// xserv::Error for another backend.
std::unique_ptr<StageRunner> make_plan_stage(const runtime::OpenedPlan& plan, size_t stage,
                                             const std::string& backend, int64_t max_batch,
                                             int64_t max_seq, const CudaModelOptions& cuda,
                                             const runtime::RunSettings& settings);

} // namespace xserv::engine::pipeline
