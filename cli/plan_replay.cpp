// plan_launch_table() and load_plan_kernels(): what the CUDA engine needs to replay a plan.
#include "cli/plan_replay.h"

#include <algorithm>
#include <fstream>
#include <iterator>

#include <fmt/format.h>

#include "cli/plan_file.h"
#include "ir/error.h"
#include "runtime/kernel_cache.h"

namespace xserv::cli {
namespace fs = std::filesystem;

namespace {

std::string read_bytes(const fs::path& f) {
  std::ifstream in(f, std::ios::binary);
  if (!in)
    throw Error(fmt::format("{}: cannot read", f.string()));
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

} // namespace

std::string layout_mismatch(const runtime::StageLayout& l, int64_t max_batch, int64_t max_seq,
                            int tcap, bool gemm_split) {
  if (l.max_batch != max_batch || l.max_seq != max_seq)
    return fmt::format("the plan is for max batch {} and max sequence {}, this run {} and {}",
                       l.max_batch, l.max_seq, max_batch, max_seq);
  if (l.tokens != tcap)
    return fmt::format("the plan's steps hold {} tokens, this run's {} (XSERV_PREFILL_CHUNK)",
                       l.tokens, tcap);
  if (l.gemm_split != gemm_split)
    return fmt::format("the plan's gemms take {} activations (XSERV_GEMM_PRECISION)",
                       l.gemm_split ? "split" : "bf16");
  return "";
}

std::optional<runtime::LaunchTable> plan_launch_table(const fs::path& plan_dir, int64_t max_batch,
                                                      int64_t max_seq, int tcap, bool gemm_split,
                                                      int64_t arena_bytes, std::string& why) {
  const std::shared_ptr<const runtime::Plan> plan = loaded_plan(plan_dir); // checked there
  if (plan->stages.size() != 1) {
    why = fmt::format("{} is pipelined: its launch tables are per stage",
                      (plan_dir / "plan.json").string());
    return std::nullopt;
  }
  const runtime::PlanStage& stage = plan->stages[0];
  const runtime::StageLayout& l = stage.layout;
  why = layout_mismatch(l, max_batch, max_seq, tcap, gemm_split);
  if (why.empty() && static_cast<int64_t>(l.arena_bytes) != arena_bytes)
    why = fmt::format("the plan's activation arena is {} bytes, this build plans {} (a plan "
                      "from another xserv build: recompile it)",
                      l.arena_bytes, arena_bytes);
  if (!why.empty())
    return std::nullopt;
  return stage.table;
}

std::map<std::string, std::string> plan_kernel_headers(const fs::path& plan_dir) {
  const fs::path dir = plan_dir / "kernels";
  std::map<std::string, std::string> headers;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file() && it->path().extension() == ".cuh")
      headers[fs::relative(it->path(), dir).generic_string()] = read_bytes(it->path());
  if (headers.empty())
    throw Error(fmt::format("{}: no kernel headers (*.cuh) to compile the plan's sources with; "
                            "recompile the plan",
                            dir.string()));
  return headers;
}

PlanKernels load_plan_kernels(const fs::path& plan_dir, const runtime::LaunchTable& table,
                              const std::string& arch, const fs::path& cache_dir) {
  PlanKernels out;
  const bool same_arch = loaded_plan(plan_dir)->codegen.arch == arch;
  runtime::CompileOptions opts;
  opts.arch = arch;
  if (!same_arch || !std::all_of(table.kernels.begin(), table.kernels.end(), [&](const auto& k) {
        return fs::exists(plan_dir / "kernels" / (k.name + ".cubin"));
      }))
    opts.headers = plan_kernel_headers(plan_dir); // compile as the plan was compiled
  out.modules.reserve(table.kernels.size());      // stable addresses for the executor
  out.kernels.reserve(table.kernels.size());
  for (const runtime::PlanKernel& k : table.kernels) {
    const fs::path cubin = plan_dir / "kernels" / (k.name + ".cubin");
    std::vector<char> bytes;
    if (same_arch && fs::exists(cubin)) {
      const std::string b = read_bytes(cubin);
      bytes.assign(b.begin(), b.end());
    } else {
      const runtime::CachedCubin c = runtime::get_or_compile(
          read_bytes(plan_dir / "kernels" / (k.name + ".cu")), k.name, opts, cache_dir);
      out.compiled += c.compiled ? 1 : 0;
      bytes = c.cubin;
    }
    out.modules.push_back(runtime::Module::load(bytes, k.name));
    out.kernels.push_back(out.modules.back().kernel(k.name));
  }
  return out;
}

std::vector<runtime::LoadedKernel> PlanKernels::loaded() const {
  return runtime::loaded_kernels(modules, kernels);
}

} // namespace xserv::cli
