// load_model(): one plan, four ways to run it (CPU, CUDA, same-device pipeline, ranks).
#include "engine/load_model.h"

#include <cstdio>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "base/error.h"
#include "engine/cpu_model.h"
#include "engine/cuda_model.h"
#include "engine/pipeline/local.h"
#include "engine/pipeline/pipeline_model.h"
#include "runtime/device.h"
#include "runtime/plan_stage.h"

namespace xserv::engine {

std::string resolve_backend(const std::string& plan_arch, const std::string& requested) {
  if (requested != "cpu" && requested != "cuda" && requested != "auto")
    throw UsageError(fmt::format("--backend must be auto, cpu or cuda, got '{}'", requested));
  if (requested == "cpu")
    return requested;
  const runtime::DeviceInfo dev = runtime::probe_device();
  if (!dev.available && requested == "cuda")
    throw Error("no GPU: " + dev.reason + " (use --backend cpu)");
  if (!dev.available)
    return "cpu";
  runtime::check_plan_arch(plan_arch, dev.arch(), dev.name);
  return "cuda";
}

std::unique_ptr<Model> load_model(const runtime::OpenedPlan& plan, const LoadOptions& o) {
  const runtime::Plan& p = *plan.plan;
  const std::string backend = resolve_backend(p.options.arch, o.backend);
  const int64_t max_batch = o.max_batch > 0 ? o.max_batch : p.options.max_batch;
  const int64_t max_seq = o.max_seq > 0 ? o.max_seq : p.options.max_seq;
  const size_t stages = p.pipelined() ? p.stages.size() : 0;
  if (o.world > 0 && !o.pp_local && stages > 0 && size_t(o.world) != stages)
    throw UsageError(
        fmt::format("--world {} but the plan has {} pipeline stages", o.world, stages));
  if (backend == "cuda") // every stage runs the plan's sizes and settings
    runtime::check_plan_run(plan, p.stages.at(0).layout, max_batch, max_seq, o.settings);
  const std::string arch = backend == "cuda" ? runtime::probe_device().arch() : std::string();
  if (backend == "cuda" && stages == 0)
    return std::make_unique<CudaModel>(
        plan.model_dir, runtime::load_stage_program(plan.dir, p, 0, arch, o.cuda.cache_dir),
        o.cuda);
  if (backend == "cuda" && o.pp_local) {
    std::fprintf(stderr, "[plan] %zu pipeline stages on this GPU (same-device transport)\n",
                 stages);
    std::vector<runtime::StageProgram> programs;
    for (size_t s = 0; s < stages; ++s)
      programs.push_back(runtime::load_stage_program(plan.dir, p, s, arch, o.cuda.cache_dir));
    return pipeline::make_local_cuda_pipeline(plan.model_dir, std::move(programs), o.cuda);
  }
  if (stages > 0 && !o.pp_local) {
    // One process per stage (per GPU with cuda): this one is rank 0 and drives; the others run
    // `xserv worker`.
    pipeline::PipelineOptions po = o.pipeline;
    po.backend = backend;
    return pipeline::make_pipeline_model(plan, po, max_batch, max_seq, o.cuda, o.settings);
  }
  // The CPU reference: the plan's graph.ir, or its stage programs one after another.
  std::optional<ir::Graph> graph;
  if (stages == 0)
    graph = ir::parse_file(plan.dir / "graph.ir", "the plan's graph");
  std::vector<ir::Graph> programs;
  for (const runtime::PlanStage& s : p.stages)
    if (stages > 0)
      programs.push_back(ir::parse_file(plan.dir / s.graph, "pipeline stage program"));
  if (stages > 0)
    std::fprintf(stderr, "[plan] %zu pipeline stages, run one after another in this process\n",
                 stages);
  return std::make_unique<CpuModel>(plan.model_dir, max_batch, max_seq, graph ? &*graph : nullptr,
                                    std::move(programs));
}

} // namespace xserv::engine
