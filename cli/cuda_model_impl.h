// CudaModel's private state (CudaModel::Impl), shared by cuda_model.cpp (construction and the
// step loop) and cuda_model_setup.cpp (weights, caches and arena, graph capture, the profile).
#pragma once

#include <cuda_runtime_api.h>

#include "cli/cuda_model.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "cli/step_split.h"
#include "cli/weight_specs.h"
#include "ir/error.h"
#include "models/checkpoint.h"
#include "models/gpt_oss.h"
#include "models/step.h"
#include "runtime/device.h"
#include "runtime/executor.h"
#include "runtime/module.h"
#include "runtime/weights.h"

namespace xserv::cli {
namespace cuda_impl {

inline void check(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess)
    throw Error(fmt::format("CUDA error in {}: {}", what, cudaGetErrorString(err)));
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

} // namespace cuda_impl

struct CudaModel::Impl {
  models::Checkpoint ckpt;
  int64_t max_batch = 1, max_seq = 1;
  int tcap = 8; ///< tokens per sub-step
  bool quiet = false;
  std::vector<void*> allocations;
  size_t allocated = 0;
  char* arena = nullptr;
  int32_t* params_dev = nullptr;
  int32_t* params_host = nullptr; ///< pinned
  float* out_host = nullptr;      ///< pinned, [rows, V] of the output
  void* argmax_keys = nullptr;    ///< device greedy keys of the sampling epilogue (or nullptr)
  int argmax_chunks = 0;          ///< keys per sequence
  uint64_t* keys_host = nullptr;  ///< pinned, [max_batch, argmax_chunks]
  ParamLayout layout{8, 1};
  runtime::DeviceWeights device_weights;
  std::map<std::string, void*> weights;
  std::vector<std::pair<void*, size_t>> caches; ///< in the layout's order
  cudaStream_t stream = nullptr;
  /// The program's kernels, loaded (the executor holds pointers to them: filled once).
  std::vector<runtime::Module> modules;
  std::vector<runtime::Kernel> kernels;
  std::unique_ptr<runtime::Executor> executor; ///< the launch table bound to this model's memory
  /// What the model binds and allocates: the program's layout.
  runtime::StageLayout stage;
  bool per_token = false;
  bool sends = false; ///< the stage ends in a pipeline send (a stage that is not the last)
  int64_t vocab = 0;
  bool cuda_graphs = true;
  /// Captured decode graphs by (tokens, sequences, attention key bucket).
  std::map<std::tuple<int, int, int>, cudaGraphExec_t> graph_execs;
  /// CudaModelOptions::profile (XSERV_PROFILE=1): every launch table entry timed with CUDA
  /// events (graphs off), summed per (phase, op) and printed when the model closes.
  bool profile = false;
  std::vector<cudaEvent_t> events;
  std::vector<size_t> entry_launches; ///< kernels each table entry launched in the last sub-step
  struct OpTime {
    double ms = 0;
    int64_t calls = 0;
  };
  std::map<std::pair<std::string, std::string>, OpTime> op_times;
  std::map<std::string, int64_t> phase_steps;

  void print_profile() const;

  Impl(const std::filesystem::path& dir)
      : ckpt(models::Checkpoint::open(dir, {.map_data = true})) {}

  ~Impl() {
    if (stream)
      cudaStreamSynchronize(stream);
    if (!graph_execs.empty())
      log(fmt::format("{} CUDA graphs captured", graph_execs.size()));
    if (profile)
      print_profile();
    for (cudaEvent_t e : events)
      cudaEventDestroy(e);
    for (auto& [key, exec] : graph_execs)
      cudaGraphExecDestroy(exec);
    for (void* p : allocations)
      cudaFree(p);
    if (params_host)
      cudaFreeHost(params_host);
    if (keys_host)
      cudaFreeHost(keys_host);
    if (out_host)
      cudaFreeHost(out_host);
    if (stream)
      cudaStreamDestroy(stream);
  }

  void log(const std::string& line) const {
    if (!quiet)
      std::fprintf(stderr, "[cuda] %s\n", line.c_str());
  }

  void* allocate(size_t bytes, const void* host = nullptr) {
    void* p = nullptr;
    cuda_impl::check(cudaMalloc(&p, std::max<size_t>(bytes, 16)),
                     fmt::format("allocating {:.1f} MiB", double(bytes) / (1 << 20)));
    allocations.push_back(p);
    allocated += bytes;
    if (host)
      cuda_impl::check(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice), "uploading a constant");
    return p;
  }

  void upload_weights(const std::filesystem::path& cache_dir);
  /// Loads `cubins` (one per table.kernels entry) into `modules` and `kernels`.
  void load_kernels(const runtime::LaunchTable& table,
                    const std::vector<std::vector<char>>& cubins);
  /// The recv named `name` (a pipeline stage's input).
  const runtime::StageLayout::Recv& recv(const std::string& name) const {
    const auto it = std::find_if(stage.recvs.begin(), stage.recvs.end(),
                                 [&](const auto& r) { return r.name == name; });
    if (it == stage.recvs.end())
      throw Error(fmt::format("this stage receives nothing called '{}'", name));
    return *it;
  }
  char* output_ptr() const { return arena + stage.output.offset; }
  cudaGraphExec_t capture(const runtime::StepShape& s);
  /// With `greedy`, also the logits rows of the sub-step's sequences b with want_rows[b] come
  /// back in `rows` (an empty row for the others).
  void run_substep(const models::StepInput& sub, std::vector<std::vector<float>>& rows, bool all,
                   std::vector<int32_t>* greedy, const StageInputs& inputs = {},
                   const std::vector<size_t>& input_rows = {},
                   const StageTransport* transport = nullptr,
                   const std::vector<bool>* want_rows = nullptr);
  /// Allocates the arena, the caches and the host buffers `stage` asks for.
  void allocate_stage();
  /// One step, sub-step by sub-step. With `greedy`, the sequences' greedy tokens go there
  /// (needs the sampling epilogue) and no logits come back.
  /// With `greedy` and `want`, the sequences b with want[b] also get their logits rows back.
  std::vector<std::vector<float>> run(const models::StepInput& in, bool all,
                                      const StageInputs& inputs = {},
                                      std::vector<int32_t>* greedy = nullptr,
                                      const StageTransport* transport = nullptr,
                                      const std::vector<bool>* want = nullptr);
};

} // namespace xserv::cli
