// plan_launch_table() and load_plan_kernels(): what the CUDA engine needs to replay a plan.
#include "cli/plan_replay.h"

#include <algorithm>
#include <fstream>
#include <iterator>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/plan_file.h"
#include "ir/error.h"
#include "runtime/kernel_cache.h"
#include "runtime/plan_json.h"

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

std::optional<runtime::LaunchTable> plan_launch_table(const fs::path& plan_dir, int64_t max_batch,
                                                      int64_t max_seq, int tcap, bool gemm_split,
                                                      int64_t arena_bytes, std::string& why) {
  const PlanFile plan = read_plan_file(plan_dir); // types and ranges checked there
  if (!plan.has_codegen || !plan.doc["codegen"].contains("launch_table")) {
    why = plan.file.string() + " has no launch table (compiled by an older xserv)";
    return std::nullopt;
  }
  const nlohmann::json& cg = plan.doc["codegen"];
  const int64_t plan_batch = plan.max_batch;
  const int64_t plan_seq = plan.max_seq;
  if (plan_batch != max_batch || plan_seq != max_seq)
    why = fmt::format("the plan is for max batch {} and max sequence {}, this run {} and {}",
                      plan_batch, plan_seq, max_batch, max_seq);
  else if (cg.value("arena_tokens", int64_t{-1}) != tcap)
    why = fmt::format("the plan's steps hold {} tokens, this run's {} (XSERV_PREFILL_CHUNK)",
                      cg.value("arena_tokens", int64_t{-1}), tcap);
  else if (cg.value("gemm_precision", std::string("split")) != (gemm_split ? "split" : "bf16"))
    why = fmt::format("the plan's gemms take {} activations (XSERV_GEMM_PRECISION)",
                      cg.value("gemm_precision", std::string("split")));
  else if (cg.value("arena_bytes", int64_t{-1}) != arena_bytes)
    why = fmt::format("the plan's activation arena is {} bytes, this build plans {} (a plan "
                      "from another xserv build: recompile it)",
                      cg.value("arena_bytes", int64_t{-1}), arena_bytes);
  if (!why.empty())
    return std::nullopt;
  try {
    return runtime::launch_table_from_json(cg["launch_table"]);
  } catch (const Error& e) {
    throw Error(plan.field_error("codegen.launch_table", e.what()));
  }
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
  const PlanFile plan = read_plan_file(plan_dir);
  const bool same_arch =
      plan.has_codegen && plan.doc["codegen"].value("arch", std::string()) == arch;
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
