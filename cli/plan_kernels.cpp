// write_plan_kernels(): the lowering run once at compile time, with no GPU, to emit the kernels.
#include "cli/plan_kernels.h"

#include <algorithm>
#include <fstream>
#include <future>
#include <set>

#include <fmt/format.h>

#include "cli/cuda_engine.h"
#include "cli/cuda_lower.h"
#include "codegen/emit.h"
#include "ir/error.h"
#include "runtime/kernel_cache.h"
#include "runtime/nvrtc.h"

namespace xserv::cli {
namespace fs = std::filesystem;

namespace {

/// The lowering with placeholder addresses: at compile time no device memory exists and nothing
/// is launched, so every address is a placeholder that is never dereferenced.
std::vector<LaunchFn> lower_for_plan(const ir::Graph& g, KernelSet& kernels,
                                     const PlanKernelOptions& opts, LoweringContext& ctx) {
  static char placeholder;
  ctx.max_tokens = step_token_capacity(opts.max_batch, kPrefillChunk);
  ctx.max_seqs = static_cast<int>(opts.max_batch);
  ctx.cache_rows = opts.max_batch;
  ctx.max_seq = opts.max_seq;
  ctx.address = [](ir::ValueId, int) -> void* { return &placeholder; };
  ctx.allocate = [](size_t, const void*) -> void* { return &placeholder; };
  return lower_graph(g, kernels, ctx);
}

} // namespace

nlohmann::json stage_launches(const ir::Graph& stage, const nlohmann::json& plan_kernels,
                              const PlanKernelOptions& opts) {
  KernelSet kernels;
  LoweringContext ctx;
  const std::vector<LaunchFn> launches = lower_for_plan(stage, kernels, opts, ctx);
  std::vector<int> counts;
  kernels.count_launches(&counts);
  for (const LaunchFn& f : launches)
    f(DeviceStep{1, 1, 0, nullptr});
  kernels.count_launches(nullptr);
  std::set<std::string> known;
  for (const auto& k : plan_kernels.at("kernels"))
    known.insert(k.at("name").get<std::string>());
  int total = 0;
  for (size_t i = 0; i < kernels.size(); ++i) {
    const std::string& name = kernels.source(static_cast<int>(i)).name;
    if (!known.count(name))
      throw Error(
          fmt::format("pipeline stage needs kernel {}, which the plan does not hold", name));
    total += counts[i];
  }
  return {{"launches_per_decode_step", total}, {"kernels", kernels.size()}};
}

nlohmann::json write_plan_kernels(const ir::Graph& g, const fs::path& plan,
                                  const PlanKernelOptions& opts) {
  KernelSet kernels;
  LoweringContext ctx;
  const std::vector<LaunchFn> launches = lower_for_plan(g, kernels, opts, ctx);

  // Kernel launches of a decode step (one sequence) and of a prefill step, counted by running
  // the launch functions with launches only counted.
  const int prefill_tokens = std::min(512, ctx.max_tokens);
  std::vector<int> decode_counts, prefill_counts;
  kernels.count_launches(&decode_counts);
  for (const LaunchFn& f : launches)
    f(DeviceStep{1, 1, 0, nullptr});
  kernels.count_launches(&prefill_counts);
  for (const LaunchFn& f : launches)
    f(DeviceStep{prefill_tokens, 1, prefill_tokens - 1, nullptr});
  kernels.count_launches(nullptr);
  int decode_total = 0, prefill_total = 0;

  const fs::path dir = plan / "kernels";
  fs::create_directories(dir);
  // The templates the sources include, so the plan directory reads (and compiles) on its own.
  for (const auto& [name, text] : codegen::kernel_headers()) {
    fs::create_directories((dir / name).parent_path());
    std::ofstream(dir / name) << text;
  }
  nlohmann::json table = nlohmann::json::array();
  for (size_t i = 0; i < kernels.size(); ++i) {
    const codegen::KernelSource& k = kernels.source(static_cast<int>(i));
    std::ofstream(dir / (k.name + ".cu")) << k.source;
    table.push_back({{"name", k.name},
                     {"source", "kernels/" + k.name + ".cu"},
                     {"block", k.launch.block},
                     {"nodes", kernels.uses(static_cast<int>(i))},
                     {"decode_launches", decode_counts[i]},
                     {"prefill_launches", prefill_counts[i]}});
    decode_total += decode_counts[i];
    prefill_total += prefill_counts[i];
  }
  if (opts.cubins) {
    runtime::CompileOptions co;
    co.arch = opts.arch;
    co.headers = codegen::kernel_headers();
    std::vector<std::future<runtime::CachedCubin>> jobs;
    const fs::path cache = kernel_cache_dir();
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
      table[i]["cubin"] = file;
    }
  }
  return {{"arch", opts.arch},
          {"launches_per_decode_step", decode_total},
          {"prefill_step_tokens", prefill_tokens},
          {"launches_per_prefill_step", prefill_total},
          {"kernels", std::move(table)}};
}

} // namespace xserv::cli
