// write_plan_kernels(): the lowering run once at compile time, with no GPU, to emit the kernels
// and the launch table.
#include "driver/plan_kernels.h"

#include <algorithm>
#include <fstream>
#include <future>
#include <set>

#include <fmt/format.h>

#include "base/error.h"
#include "codegen/emit.h"
#include "codegen/lower_stage.h"
#include "runtime/executor.h"
#include "runtime/kernel_cache.h"
#include "runtime/nvrtc.h"

namespace xserv::driver {
namespace fs = std::filesystem;

namespace {

/// Kernel launches per kernel of one step of `shape`, counted by the executor's recording mode
/// (placeholder addresses, no GPU).
std::vector<int> count_launches(const runtime::LaunchTable& table, runtime::StepShape shape) {
  const runtime::Executor ex(table, runtime::placeholder_bindings(table));
  std::vector<int> counts(table.kernels.size(), 0);
  for (const runtime::LaunchRecord& r : ex.record(shape))
    if (r.kernel >= 0) // library calls are no kernels of the plan
      ++counts[static_cast<size_t>(r.kernel)];
  return counts;
}

} // namespace

PlanStageCode stage_launches(const ir::Graph& stage, const runtime::PlanCodegen& plan_kernels,
                             const PlanKernelOptions& opts) {
  codegen::LoweredStage pl = codegen::lower_stage(stage, opts);
  const std::vector<int> counts = count_launches(pl.table, {1, 1, 0});
  std::set<std::string> known;
  for (const runtime::PlanKernelFile& k : plan_kernels.kernels)
    known.insert(k.name);
  int total = 0;
  for (size_t i = 0; i < pl.kernels.size(); ++i) {
    const std::string& name = pl.kernels.source(static_cast<int>(i)).name;
    if (!known.count(name))
      throw Error(
          fmt::format("pipeline stage needs kernel {}, which the plan does not hold", name));
    total += counts[i];
  }
  return {std::move(pl.table), std::move(pl.layout), total};
}

PlanKernelsResult write_plan_kernels(const ir::Graph& g, const fs::path& plan,
                                     const PlanKernelOptions& opts) {
  codegen::LoweredStage pl = codegen::lower_stage(g, opts);
  const codegen::KernelSet& kernels = pl.kernels;

  // Kernel launches of a decode step (one sequence) and of a prefill step.
  const int prefill_tokens = std::min<int>(512, static_cast<int>(pl.layout.tokens));
  const std::vector<int> decode_counts = count_launches(pl.table, {1, 1, 0});
  const std::vector<int> prefill_counts =
      count_launches(pl.table, {prefill_tokens, 1, prefill_tokens - 1});
  int decode_total = 0, prefill_total = 0;

  const fs::path dir = plan / "kernels";
  fs::create_directories(dir);
  // The templates the sources include, so the plan directory reads (and compiles) on its own.
  for (const auto& [name, text] : codegen::kernel_headers()) {
    fs::create_directories((dir / name).parent_path());
    std::ofstream(dir / name) << text;
  }
  std::vector<runtime::PlanKernelFile> table;
  for (size_t i = 0; i < kernels.size(); ++i) {
    const codegen::KernelSource& k = kernels.source(static_cast<int>(i));
    std::ofstream(dir / (k.name + ".cu")) << k.source;
    table.push_back({.name = k.name,
                     .block = k.launch.block,
                     .nodes = kernels.uses(static_cast<int>(i)),
                     .decode_launches = decode_counts[i],
                     .prefill_launches = prefill_counts[i]});
    decode_total += decode_counts[i];
    prefill_total += prefill_counts[i];
  }
  if (opts.cubins) {
    runtime::CompileOptions co;
    co.arch = opts.arch;
    co.headers = codegen::kernel_headers();
    std::vector<std::future<runtime::CachedCubin>> jobs;
    const fs::path& cache = opts.cache_dir;
    for (size_t i = 0; i < kernels.size(); ++i)
      jobs.push_back(std::async(std::launch::async, [&, i] {
        const codegen::KernelSource& k = kernels.source(static_cast<int>(i));
        return runtime::get_or_compile(k.source, k.name, co, cache);
      }));
    for (size_t i = 0; i < jobs.size(); ++i) {
      runtime::CachedCubin c;
      try {
        c = jobs[i].get();
      } catch (const Error& e) { // the log and the numbered source, kept beside the sources
        for (size_t j = i + 1; j < jobs.size(); ++j)
          jobs[j].wait();
        std::ofstream(dir / "nvrtc.log") << e.what() << "\n";
        throw;
      }
      const std::string file = "kernels/" + kernels.source(static_cast<int>(i)).name + ".cubin";
      std::ofstream(plan / file, std::ios::binary)
          .write(reinterpret_cast<const char*>(c.cubin.data()),
                 static_cast<std::streamsize>(c.cubin.size()));
      table[i].cubin = true;
    }
  }
  // The launch table replays on an arena planned for layout.tokens tokens and max_batch
  // sequences (the plan's prefill chunk).
  PlanKernelsResult out;
  out.codegen = {.arch = opts.arch,
                 .kernels = std::move(table),
                 .launches_per_decode_step = decode_total,
                 .prefill_step_tokens = prefill_tokens,
                 .launches_per_prefill_step = prefill_total};
  out.code = {std::move(pl.table), std::move(pl.layout), decode_total};
  return out;
}

} // namespace xserv::driver
