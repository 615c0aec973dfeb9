// `xserv worker`: pipeline rank R > 0. It joins rank 0 over TCP (the plan's digest in the
// handshake), loads its stage, joins NCCL when rank 0 offers it, then runs each step rank 0
// sends until told to quit, with heartbeats while it computes.
#pragma once

#include "engine/cuda_options.h"
#include "engine/pipeline/options.h"
#include "runtime/open_plan.h"

namespace xserv::engine::pipeline {

/// Runs rank `rank` of `world` of the pipelined plan `plan`, joining rank 0 at
/// options.coordinator with options.token (the rank timeout bounds every wait for rank 0).
/// Returns the exit code (0 when rank 0 says quit); throws xserv::Error naming rank 0 or the
/// stage for anything else. With the CUDA backend the process uses its first visible GPU.
int run_worker(const runtime::OpenedPlan& plan, int rank, int world, const PipelineOptions& options,
               const CudaModelOptions& cuda, const runtime::RunSettings& settings);

} // namespace xserv::engine::pipeline
