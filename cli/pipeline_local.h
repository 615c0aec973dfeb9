// Pipeline stages on one GPU, the same-device transport: a CudaModel per stage (each uploads
// only its own weights), the boundary activations passed on by device-to-device copies through
// the StageTransport interface the NCCL ranks use (CudaModel::step_stage_device), greedy picks
// on the GPU. Any --pp plan runs on one GPU, which is how tests compare stages against the whole
// model.
#pragma once

#include <filesystem>
#include <memory>
#include <vector>

#include "cli/engine.h"
#include "ir/graph.h"

namespace xserv::cli {

/// An Model over `stages` (a --pp plan's stage programs, in order), all on this GPU.
std::unique_ptr<Model> make_local_cuda_pipeline(const std::filesystem::path& model_dir,
                                                 int64_t max_batch, int64_t max_seq,
                                                 const std::vector<ir::Graph>& stages);

} // namespace xserv::cli
