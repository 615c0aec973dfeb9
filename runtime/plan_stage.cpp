// load_stage_program() and run_mismatch(): a plan stage's program for the CUDA model.
#include "runtime/plan_stage.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>

#include <fmt/format.h>

#include "base/error.h"
#include "runtime/kernel_cache.h"

namespace xserv::runtime {
namespace fs = std::filesystem;

namespace {

std::string read_bytes(const fs::path& f) {
  std::ifstream in(f, std::ios::binary);
  if (!in)
    throw Error(fmt::format("{}: cannot read", f.string()));
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

} // namespace

std::string run_mismatch(const StageLayout& l, int64_t max_batch, int64_t max_seq) {
  if (l.max_batch != max_batch || l.max_seq != max_seq)
    return fmt::format("the plan is for max batch {} and max sequence {}, this run {} and {}",
                       l.max_batch, l.max_seq, max_batch, max_seq);
  return "";
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

StageProgram load_stage_program(const fs::path& plan_dir, const Plan& plan, size_t stage,
                                const std::string& arch, const fs::path& cache_dir) {
  const auto t0 = std::chrono::steady_clock::now();
  if (stage >= plan.stages.size())
    throw Error(fmt::format("{}: the plan has {} stage(s), not a stage {}",
                            (plan_dir / "plan.json").string(), plan.stages.size(), stage));
  StageProgram out;
  out.layout = plan.stages[stage].layout;
  out.table = plan.stages[stage].table;
  out.sends = plan.stages[stage].sends;
  out.recvs = plan.stages[stage].recvs;
  out.source = fmt::format("{} stage {}", (plan_dir / "plan.json").string(), stage);
  const LaunchTable& table = out.table;
  const bool same_arch = plan.codegen.arch == arch;
  CompileOptions opts;
  opts.arch = arch;
  if (!same_arch || !std::all_of(table.kernels.begin(), table.kernels.end(), [&](const auto& k) {
        return fs::exists(plan_dir / "kernels" / (k.name + ".cubin"));
      }))
    opts.headers = plan_kernel_headers(plan_dir); // compile as the plan was compiled
  for (const PlanKernel& k : table.kernels) {
    const fs::path cubin = plan_dir / "kernels" / (k.name + ".cubin");
    if (same_arch && fs::exists(cubin)) {
      const std::string b = read_bytes(cubin);
      out.cubins.emplace_back(b.begin(), b.end());
    } else {
      CachedCubin c = get_or_compile(read_bytes(plan_dir / "kernels" / (k.name + ".cu")), k.name,
                                     opts, cache_dir);
      out.compiled += c.compiled ? 1 : 0;
      out.cubins.push_back(std::move(c.cubin));
    }
  }
  out.load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

} // namespace xserv::runtime
