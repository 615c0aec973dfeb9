// What the GPU tests of the CUDA model share: skipping cleanly without a GPU, and a CUDA model of
// a graph compiled in memory (driver::compile_graph) with quiet options, the fixture maker of the
// engine's GPU tests.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <memory>

#include "driver/compile_graph.h"
#include "engine/cuda_model.h"
#include "engine/load_model.h"
#include "models/config.h"
#include "models/gpt_oss.h"
#include "runtime/device.h"
#include "runtime/open_plan.h"
#include "runtime/plan_io.h"

/// Skips the rest of a test case when there is no usable GPU, saying why.
#define XSERV_REQUIRE_GPU()                                                                        \
  if (const ::xserv::runtime::DeviceInfo dev = ::xserv::runtime::probe_device(); !dev.available) { \
    MESSAGE("skipped: no GPU (" << dev.reason << ")");                                             \
    return;                                                                                        \
  }

namespace xserv::testing {

/// The kernel cache the tests share: $XSERV_KERNEL_CACHE (ctest sets one in the build tree),
/// else a directory under the system's temporary directory.
inline std::filesystem::path test_kernel_cache() {
  if (const char* d = std::getenv("XSERV_KERNEL_CACHE"); d && *d)
    return d;
  return std::filesystem::temp_directory_path() / "xserv-test-kernels";
}

/// How a graph is compiled in memory and its CUDA model runs: split gemms and BF16 experts by
/// default (the GPU tests' fp32-grade reference), no "[cuda] ..." progress lines.
struct GraphModelOptions : engine::CudaModelOptions, driver::GraphCompileOptions {
  GraphModelOptions() {
    cache_dir = test_kernel_cache();
    kernel_cache = cache_dir;
    quiet = true;
  }
};

inline GraphModelOptions quiet() {
  return {};
}

/// A CUDA model of `graph` (default: build_gpt_oss of the checkpoint's config, last-token
/// logits) compiled in memory for `max_batch` sequences of up to `max_seq` positions.
inline std::unique_ptr<engine::CudaModel> graph_cuda_model(const std::filesystem::path& model_dir,
                                                           int64_t max_batch, int64_t max_seq,
                                                           const ir::Graph* graph = nullptr,
                                                           const GraphModelOptions& opts = {}) {
  const ir::Graph g =
      graph ? *graph : models::build_gpt_oss(models::ModelConfig::load(model_dir / "config.json"));
  driver::CompiledGraph c = driver::compile_graph(g, max_batch, max_seq, opts);
  return std::make_unique<engine::CudaModel>(model_dir, std::move(c.program), opts);
}

/// A plan directory as open_plan would give it, read without the file and checkpoint checks
/// (the tests compile and run their own plans).
inline runtime::OpenedPlan read_opened_plan(const std::filesystem::path& plan,
                                            const std::filesystem::path& model_dir) {
  return {plan, model_dir, std::make_shared<const runtime::Plan>(runtime::read_plan(plan))};
}

/// The CUDA model of a pp 1 plan as compiled, through engine::load_model, for a run of
/// `max_batch` sequences of up to `max_seq` positions (the plan's, or load_model refuses).
inline std::unique_ptr<engine::Model> plan_cuda_model(const runtime::OpenedPlan& plan,
                                                      int64_t max_batch, int64_t max_seq,
                                                      const GraphModelOptions& opts = {}) {
  engine::LoadOptions o;
  o.backend = "cuda";
  o.max_batch = max_batch;
  o.max_seq = max_seq;
  o.cuda = opts;
  return engine::load_model(plan, o);
}

} // namespace xserv::testing
