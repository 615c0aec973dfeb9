// Pipeline stages on one GPU: a CudaEngine per stage (each uploads only its own weights), the
// boundary activations passed between them through host memory. The same-device transport: any
// --pp plan runs on one GPU, which is how tests compare stages against the whole model.
#pragma once

#include <filesystem>
#include <memory>
#include <vector>

#include "cli/engine.h"
#include "ir/graph.h"

namespace xserv::cli {

/// An Engine over `stages` (a --pp plan's stage programs, in order), all on this GPU.
std::unique_ptr<Engine> make_local_cuda_pipeline(const std::filesystem::path& model_dir,
                                                 int64_t max_batch, int64_t max_seq,
                                                 const std::vector<ir::Graph>& stages);

} // namespace xserv::cli
