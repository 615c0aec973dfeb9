// open_plan() and the checks a run of a plan must pass.
#include "runtime/open_plan.h"

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

#include "base/error.h"
#include "runtime/plan_checkpoint.h"
#include "runtime/plan_io.h"
#include "runtime/plan_stage.h"

namespace xserv::runtime {
namespace fs = std::filesystem;

OpenedPlan open_plan(const fs::path& dir, const OpenPlanOptions& options) {
  OpenedPlan out;
  out.dir = dir;
  auto plan = std::make_shared<const Plan>(read_plan(dir));
  verify_plan_files(dir, *plan);
  out.model_dir = options.weights.empty() ? fs::path(plan->model_dir) : options.weights;
  if (!fs::is_directory(out.model_dir))
    throw UsageError(fmt::format("checkpoint directory '{}' does not exist{}",
                                 out.model_dir.string(),
                                 options.weights.empty() ? " (give --weights DIR)" : ""));
  check_checkpoint(dir, *plan, out.model_dir);
  if (options.read_config) {
    const fs::path config = out.model_dir / "config.json";
    check_plan_config(dir, *plan, config, options.read_config(config));
  }
  if (options.verify_weights) {
    const WeightsVerified v = verify_weights(dir, *plan, out.model_dir);
    std::fprintf(stderr,
                 "[plan] --verify-weights: %zu file(s), %.2f GB, SHA-256 as at compile, in %.1f s "
                 "(%.2f GB/s)\n",
                 v.files, double(v.bytes) / 1e9, v.seconds,
                 double(v.bytes) / 1e9 / std::max(v.seconds, 1e-9));
  }
  out.plan = std::move(plan);
  return out;
}

void check_plan_arch(const std::string& plan_arch, const std::string& gpu_arch,
                     const std::string& gpu_name) {
  if (!plan_arch.empty() && plan_arch != gpu_arch)
    throw Error(fmt::format("the plan was compiled for {} but GPU 0 ({}) is {}: recompile it with "
                            "--arch {}",
                            plan_arch, gpu_name, gpu_arch, gpu_arch));
}

void check_plan_run(const OpenedPlan& p, const StageLayout& layout, int64_t max_batch,
                    int64_t max_seq, const RunSettings& settings) {
  const fs::path file = p.dir / "plan.json";
  if (const std::string why = run_mismatch(layout, max_batch, max_seq); !why.empty())
    throw UsageError(fmt::format(
        "{}: {}; a plan runs as compiled: recompile it with xserv compile --max-batch {} "
        "--max-seq {}, or leave --max-batch / --max-seq out",
        p.dir.string(), why, max_batch, max_seq));
  const PlanOptions& o = p.plan->options;
  if (const std::optional<int> chunk = settings.prefill_chunk; chunk && *chunk != o.prefill_chunk)
    throw UsageError(fmt::format("XSERV_PREFILL_CHUNK={} but {} was compiled with "
                                 "--prefill-chunk {}; a plan runs as compiled: recompile it with "
                                 "xserv compile --prefill-chunk {}, or unset XSERV_PREFILL_CHUNK",
                                 *chunk, file.string(), o.prefill_chunk, *chunk));
  auto precision = [](bool split) { return split ? "split" : "bf16"; };
  if (const std::optional<bool> split = settings.gemm_split; split && *split != o.gemm_split)
    throw UsageError(fmt::format("XSERV_GEMM_PRECISION={} but {} was compiled with "
                                 "--gemm-precision {}; a plan runs as compiled: recompile it with "
                                 "xserv compile --gemm-precision {}, or unset XSERV_GEMM_PRECISION",
                                 precision(*split), file.string(), precision(o.gemm_split),
                                 precision(*split)));
}

} // namespace xserv::runtime
