// KernelSet (the generated kernels of an engine, compiled together) and the lowering's sizes.
#include "cli/cuda_lower.h"

#include <algorithm>
#include <cstdlib>
#include <future>

#include "cli/env.h"
#include "runtime/device.h"
#include "runtime/kernel_cache.h"

namespace xserv::cli {

std::filesystem::path kernel_cache_dir() {
  namespace fs = std::filesystem;
  if (const std::string& d = env().kernel_cache; !d.empty())
    return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d)
    return fs::path(d) / "xserv/kernels";
  if (const char* h = std::getenv("HOME"); h && *h)
    return fs::path(h) / ".cache/xserv/kernels";
  return fs::temp_directory_path() / "xserv-kernels";
}

int KernelSet::add(codegen::KernelSource src) {
  if (auto it = by_name_.find(src.name); it != by_name_.end()) {
    ++uses_[static_cast<size_t>(it->second)];
    return it->second;
  }
  const int i = static_cast<int>(sources_.size());
  by_name_[src.name] = i;
  sources_.push_back(std::move(src));
  uses_.push_back(1);
  return i;
}

int KernelSet::build(const std::filesystem::path& cache_dir) {
  runtime::CompileOptions opts;
  opts.arch = runtime::probe_device().arch();
  opts.headers = codegen::kernel_headers();
  // NVRTC compiles independent programs in parallel; each kernel has its own cache files.
  std::vector<std::future<runtime::CachedCubin>> jobs;
  for (const auto& s : sources_)
    jobs.push_back(std::async(std::launch::async, [&s, &opts, &cache_dir] {
      return runtime::get_or_compile(s.source, s.name, opts, cache_dir);
    }));
  int compiled = 0;
  for (size_t i = 0; i < sources_.size(); ++i) {
    runtime::CachedCubin c = jobs[i].get();
    compiled += c.compiled ? 1 : 0;
    modules_.push_back(runtime::Module::load(c.cubin, sources_[i].name));
    kernels_.push_back(modules_.back().kernel(sources_[i].name));
  }
  return compiled;
}

std::vector<runtime::PlanKernel> KernelSet::plan_kernels() const {
  std::vector<runtime::PlanKernel> out;
  for (const codegen::KernelSource& s : sources_) {
    const codegen::LaunchRule& r = s.launch;
    runtime::PlanKernel k;
    k.name = s.name;
    k.block = r.block;
    k.blocks_x = r.blocks_x;
    k.y_per_token = r.y_per_token;
    k.z_splits = r.z_splits;
    k.blocks_z = r.blocks_z;
    k.y_tile = r.y_tile;
    k.y_extra = r.y_extra;
    k.smem_per_row = r.smem_per_token;
    k.smem_fixed = r.smem_fixed;
    out.push_back(std::move(k));
  }
  return out;
}

std::vector<runtime::LoadedKernel> KernelSet::loaded() const {
  return runtime::loaded_kernels(modules_, kernels_);
}

int step_token_capacity(int64_t max_batch, int prefill_chunk) {
  return static_cast<int>(std::max<int64_t>({8, max_batch, prefill_chunk}));
}

} // namespace xserv::cli
