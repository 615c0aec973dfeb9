// CudaModel's set-up pieces: weights, caches and the arena, the program's kernels, decode-graph
// capture and the per-op profile.
#include "cli/cuda_model_impl.h"

namespace xserv::cli {
namespace fs = std::filesystem;
using cuda_impl::check;
using cuda_impl::seconds_since;

void CudaModel::Impl::upload_weights(const fs::path& cache_dir) {
  // The graph's tensors go up in one streamed pass (runtime/weights: MXFP4 experts are
  // dequantised to BF16 on the GPU, or kept as MXFP4 as the stage layout says), then are looked
  // up by name and checked.
  runtime::UploadOptions o;
  o.cache_dir = cache_dir;
  if (!quiet)
    o.progress = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  std::vector<std::string> names;
  for (const runtime::StageLayout::Weight& w : stage.weights)
    names.push_back(w.name);
  device_weights =
      runtime::DeviceWeights::upload(weight_specs_named(ckpt, names, stage.expert_format), o);
  for (const runtime::StageLayout::Weight& w : stage.weights) {
    const std::string& name = w.name;
    const runtime::DeviceTensor* t = device_weights.find(name);
    uint64_t numel = 1;
    for (int64_t d : w.shape)
      numel *= static_cast<uint64_t>(d);
    // MXFP4 on the device: 16 bytes of blocks and one scale byte per 32 values.
    const bool mx = t && t->dtype == "MXFP4";
    const uint64_t want = mx ? numel / 2 + numel / 32 : numel * 2;
    if (!t || (t->dtype != "BF16" && !mx) || t->bytes != want)
      throw Error(fmt::format("weight '{}': the model wants {} [{}], the checkpoint {}", name,
                              mx ? "MXFP4" : "BF16", fmt::join(w.shape, ", "),
                              t ? fmt::format("holds {} ({} bytes)", t->dtype, t->bytes)
                                : std::string("has no such tensor")));
    weights[name] = const_cast<void*>(device_weights.get(name));
  }
  allocated += device_weights.device_bytes();
}

void CudaModel::Impl::load_kernels(const runtime::LaunchTable& table,
                                   const std::vector<std::vector<char>>& cubins) {
  if (cubins.size() != table.kernels.size())
    throw Error(fmt::format("the CUDA program holds {} cubins for the {} kernels of its launch "
                            "table",
                            cubins.size(), table.kernels.size()));
  modules.reserve(cubins.size()); // stable addresses for the executor
  kernels.reserve(cubins.size());
  for (size_t i = 0; i < cubins.size(); ++i) {
    const std::string& name = table.kernels[i].name;
    modules.push_back(runtime::Module::load(cubins[i], name));
    kernels.push_back(modules.back().kernel(name));
  }
}

cudaGraphExec_t CudaModel::Impl::capture(const runtime::StepShape& s) {
  // Relaxed: a first launch of a kernel may set its shared-memory attribute, which is no stream
  // operation and safe to run while capturing.
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), "starting a graph capture");
  cudaGraph_t g = nullptr;
  try {
    executor->run(s, stream);
  } catch (...) {
    if (cudaStreamEndCapture(stream, &g) == cudaSuccess && g)
      cudaGraphDestroy(g);
    cudaGetLastError();
    throw;
  }
  check(cudaStreamEndCapture(stream, &g), "capturing a decode step");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  check(err, "instantiating a decode graph");
  return exec;
}

void CudaModel::Impl::print_profile() const {
  // Per phase: each op's share of the summed launch times, largest first.
  std::map<std::string, std::vector<std::pair<std::string, OpTime>>> by_phase;
  for (const auto& [key, t] : op_times)
    by_phase[key.first].push_back({key.second, t});
  for (auto& [phase, ops] : by_phase) {
    double total = 0;
    for (const auto& [op, t] : ops)
      total += t.ms;
    std::sort(ops.begin(), ops.end(),
              [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    const double steps = double(phase_steps.at(phase));
    std::fprintf(stderr, "[profile] %s: %lld steps, %.3f ms per step (launch to launch)\n",
                 phase.c_str(), static_cast<long long>(phase_steps.at(phase)), total / steps);
    for (const auto& [op, t] : ops)
      std::fprintf(stderr, "[profile]   %-24s %9.3f ms/step %5.1f%%  %6.1f us/entry\n", op.c_str(),
                   t.ms / steps, 100.0 * t.ms / total, 1e3 * t.ms / double(t.calls));
  }
}

void CudaModel::Impl::allocate_stage() {
  layout = ParamLayout(static_cast<size_t>(tcap), static_cast<size_t>(max_batch));
  params_dev = static_cast<int32_t*>(allocate(layout.total * sizeof(int32_t)));
  check(cudaMallocHost(reinterpret_cast<void**>(&params_host), layout.total * sizeof(int32_t)),
        "pinned params");
  const size_t out_rows = static_cast<size_t>(per_token ? tcap : max_batch);
  check(cudaMallocHost(reinterpret_cast<void**>(&out_host),
                       out_rows * static_cast<size_t>(vocab) * sizeof(float)),
        "pinned logits");
  arena = static_cast<char*>(allocate(static_cast<size_t>(stage.arena_bytes)));
  for (const runtime::StageLayout::Cache& c : stage.caches) {
    size_t bytes = static_cast<size_t>(c.elem_bytes);
    for (int64_t d : c.shape)
      bytes *= static_cast<size_t>(d);
    caches.emplace_back(allocate(bytes), bytes);
  }
}

} // namespace xserv::cli
