// Pipeline stages on one GPU, the same-device transport: a CudaModel per stage (each uploads
// only its own weights), the boundary activations passed on by device-to-device copies through
// the StageTransport interface the NCCL ranks use (CudaModel::step_stage_device), greedy picks
// on the GPU. Any --pp plan runs on one GPU, which is how tests compare stages against the whole
// model.
#pragma once

#include <filesystem>
#include <memory>
#include <vector>

#include "engine/cuda_options.h"
#include "engine/model.h"
#include "runtime/plan_stage.h"

namespace xserv::engine::pipeline {

/// A Model over `stages` (a --pp plan's stage programs, in order: runtime::load_stage_program),
/// all on this GPU; stage s + 1 must receive exactly the one value stage s sends.
std::unique_ptr<Model> make_local_cuda_pipeline(const std::filesystem::path& model_dir,
                                                std::vector<runtime::StageProgram> stages,
                                                const CudaModelOptions& options);

} // namespace xserv::engine::pipeline
