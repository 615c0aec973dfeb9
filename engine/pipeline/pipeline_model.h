// Pipeline parallelism, one process per stage: rank 0 drives generation and runs stage 0, ranks
// 1..N-1 (`xserv worker`, worker.h) run theirs, on the CPU (interpreter) or each on its own GPU
// (a CUDA model over the stage's launch table from the plan). Rank 0's side is two pieces: the
// control plane (coordinator.h: handshakes, heartbeats, bounded waits) and the step driver here,
// a Model whose steps go through every rank as micro-batches.
#pragma once

#include <cstddef>
#include <memory>

#include "engine/cuda_options.h"
#include "engine/model.h"
#include "engine/pipeline/options.h"
#include "runtime/open_plan.h"

namespace xserv::engine::pipeline {

/// Micro-batches for a step of `tokens` tokens over `world` ranks, `prompt` when some sequence
/// brings two or more tokens; `requested` > 0 wins (PipelineOptions::micro_batches).
int micro_batch_count(int requested, size_t tokens, bool prompt, int world);

/// Rank 0 of a pipeline: a Model whose steps run stage 0 of the pipelined plan `plan` here and
/// the rest on the workers, for `max_batch` sequences of up to `max_seq` positions (within the
/// plan's). `cuda` and `settings` are how the CUDA backend loads rank 0's stage.
std::unique_ptr<Model> make_pipeline_model(const runtime::OpenedPlan& plan,
                                           const PipelineOptions& options, int64_t max_batch,
                                           int64_t max_seq, const CudaModelOptions& cuda,
                                           const runtime::RunSettings& settings);

} // namespace xserv::engine::pipeline
