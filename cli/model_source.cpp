// Plan-or-checkpoint resolution, engine construction and tokenizer lookup shared by commands.
#include "cli/model_source.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include <fmt/format.h>

#include "cli/env.h"
#include "cli/graph_model.h"
#include "cli/pipeline.h"
#include "cli/loaded_plan.h"
#include "engine/cpu_model.h"
#include "engine/cuda_model.h"
#include "engine/pipeline_local.h"
#include "ir/graph.h"
#include "models/config.h"
#include "runtime/device.h"
#include "runtime/plan_checkpoint.h"
#include "runtime/plan_io.h"
#include "runtime/plan_stage.h"

namespace xserv::cli {
namespace fs = std::filesystem;

void check_plan_arch(const std::string& plan_arch, const std::string& gpu_arch,
                     const std::string& gpu_name) {
  if (!plan_arch.empty() && plan_arch != gpu_arch)
    throw Error(fmt::format("the plan was compiled for {} but GPU 0 ({}) is {}: recompile it with "
                            "--arch {}",
                            plan_arch, gpu_name, gpu_arch, gpu_arch));
}

ModelSource resolve_source(const std::string& path, const ParsedArgs& args) {
  ModelSource src;
  if (!fs::is_directory(path))
    throw UsageError(fmt::format("'{}' is not a plan or checkpoint directory", path));
  if (fs::exists(fs::path(path) / "plan.json")) {
    auto plan = std::make_shared<const runtime::Plan>(runtime::read_plan(path));
    runtime::verify_plan_files(path, *plan);
    share_plan(path, plan);
    src.plan_dir = path;
    src.model_dir = plan->model_dir;
    src.max_batch = plan->options.max_batch;
    src.max_seq = plan->options.max_seq;
    src.arch = plan->options.arch;
    if (plan->pipelined())
      for (const runtime::PlanStage& s : plan->stages)
        src.stage_graphs.push_back(s.graph);
    src.plan = std::move(plan);
  } else if (fs::exists(fs::path(path) / "config.json")) {
    src.model_dir = path;
  } else {
    throw UsageError(fmt::format("'{}' holds neither plan.json nor config.json", path));
  }
  if (args.has("--weights"))
    src.model_dir = args.get("--weights");
  if (!fs::is_directory(src.model_dir))
    throw UsageError(fmt::format("checkpoint directory '{}' does not exist{}",
                                 src.model_dir.string(),
                                 src.plan_dir.empty() ? "" : " (give --weights DIR)"));
  if (src.plan) {
    runtime::check_checkpoint(src.plan_dir, *src.plan, src.model_dir);
    const fs::path config = src.model_dir / "config.json";
    runtime::check_plan_config(src.plan_dir, *src.plan, config,
                               models::ModelConfig::load(config).to_json());
  }
  if (args.has("--verify-weights")) {
    if (!src.plan)
      throw UsageError(fmt::format("--verify-weights checks a checkpoint against the digests a "
                                   "plan recorded at compile: '{}' is not a plan",
                                   path));
    const runtime::WeightsVerified v =
        runtime::verify_weights(src.plan_dir, *src.plan, src.model_dir);
    std::fprintf(stderr,
                 "[plan] --verify-weights: %zu file(s), %.2f GB, SHA-256 as at compile, in %.1f s "
                 "(%.2f GB/s)\n",
                 v.files, double(v.bytes) / 1e9, v.seconds,
                 double(v.bytes) / 1e9 / std::max(v.seconds, 1e-9));
  }
  const int64_t plan_seq = src.max_seq, plan_batch = src.max_batch;
  src.max_seq =
      args.get_int("--max-seq", src.max_seq, 1, src.plan_dir.empty() ? (1 << 20) : plan_seq);
  src.max_batch =
      args.get_int("--max-batch", src.max_batch, 1, src.plan_dir.empty() ? 4096 : plan_batch);
  return src;
}

std::string resolve_backend(const ModelSource& src, const std::string& requested) {
  if (requested != "cpu" && requested != "cuda" && requested != "auto")
    throw UsageError(fmt::format("--backend must be auto, cpu or cuda, got '{}'", requested));
  if (requested == "cpu")
    return requested;
  const runtime::DeviceInfo dev = runtime::probe_device();
  if (!dev.available && requested == "cuda")
    throw Error("no GPU: " + dev.reason + " (use --backend cpu)");
  if (!dev.available)
    return "cpu";
  check_plan_arch(src.arch, dev.arch(), dev.name);
  return "cuda";
}

ir::Graph read_graph(const fs::path& file, std::string_view what) {
  std::ifstream in(file);
  if (!in)
    throw Error(fmt::format("{}: {} missing", file.string(), what));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return ir::parse(text, file.string());
}

std::string pipeline_token_given(const ParsedArgs& args) {
  if (!args.has("--pipeline-token"))
    return env().pipeline_token;
  const std::string t = args.get("--pipeline-token", "");
  if (t.empty())
    throw UsageError("--pipeline-token is empty: give every rank the same secret");
  return t;
}

void check_plan_run(const ModelSource& src, const runtime::StageLayout& layout, const Env& e) {
  const fs::path file = src.plan_dir / "plan.json";
  if (const std::string why = runtime::run_mismatch(layout, src.max_batch, src.max_seq);
      !why.empty())
    throw UsageError(fmt::format(
        "{}: {}; a plan runs as compiled: recompile it with xserv compile --max-batch {} "
        "--max-seq {}, or leave --max-batch / --max-seq out",
        src.plan_dir.string(), why, src.max_batch, src.max_seq));
  const runtime::PlanOptions& o = src.plan->options;
  if (const std::optional<int> chunk = e.prefill_chunk; chunk && *chunk != o.prefill_chunk)
    throw UsageError(fmt::format("XSERV_PREFILL_CHUNK={} but {} was compiled with "
                                 "--prefill-chunk {}; a plan runs as compiled: recompile it with "
                                 "xserv compile --prefill-chunk {}, or unset XSERV_PREFILL_CHUNK",
                                 *chunk, file.string(), o.prefill_chunk, *chunk));
  auto precision = [](bool split) { return split ? "split" : "bf16"; };
  if (const std::optional<bool> split = e.gemm_split; split && *split != o.gemm_split)
    throw UsageError(fmt::format("XSERV_GEMM_PRECISION={} but {} was compiled with "
                                 "--gemm-precision {}; a plan runs as compiled: recompile it with "
                                 "xserv compile --gemm-precision {}, or unset XSERV_GEMM_PRECISION",
                                 precision(*split), file.string(), precision(o.gemm_split),
                                 precision(*split)));
}

std::unique_ptr<engine::CudaModel> plan_cuda_model(const ModelSource& src,
                                                   const engine::CudaModelOptions& opts) {
  // The plan's stage layout, launch table and kernels, as compiled: graph.ir is not read.
  check_plan_run(src, src.plan->stages.at(0).layout);
  runtime::StageProgram program = runtime::load_stage_program(
      src.plan_dir, *src.plan, 0, runtime::probe_device().arch(), opts.cache_dir);
  return std::make_unique<engine::CudaModel>(src.model_dir, std::move(program), opts);
}

std::unique_ptr<engine::StageRunner> make_stage_runner(const ModelSource& src, size_t stage,
                                                       const std::string& backend,
                                                       int64_t max_batch, int64_t max_seq) {
  const runtime::PlanStage& st = src.plan->stages.at(stage);
  if (backend == "cpu")
    return engine::make_cpu_stage(src.model_dir, max_batch, max_seq,
                                  read_graph(src.plan_dir / st.graph, "pipeline stage program"));
  if (backend != "cuda")
    throw Error(fmt::format("pipeline: unknown backend '{}'", backend));
  ModelSource run = src;
  run.max_batch = max_batch;
  run.max_seq = max_seq;
  check_plan_run(run, st.layout);
  const engine::CudaModelOptions opts = cuda_model_options();
  return engine::make_cuda_stage(src.model_dir,
                                 runtime::load_stage_program(src.plan_dir, *src.plan, stage,
                                                             runtime::probe_device().arch(),
                                                             opts.cache_dir),
                                 opts);
}

std::unique_ptr<Model> make_model(const ModelSource& src, const ParsedArgs& args) {
  const std::string backend = resolve_backend(src, args.get("--backend", "auto"));
  if (backend == "cuda" && src.plan_dir.empty()) // a checkpoint directory: compiled in memory
    return graph_cuda_model(src.model_dir, src.max_batch, src.max_seq, nullptr,
                            checkpoint_model_options());
  if (backend == "cuda" && src.stage_graphs.empty())
    return plan_cuda_model(src, cuda_model_options());
  const size_t stages = src.stage_graphs.size();
  if (backend == "cuda" && stages > 0) // every stage runs the plan's sizes
    check_plan_run(src, src.plan->stages.at(0).layout);
  if (backend == "cuda" && stages > 0 && args.has("--pp-local")) {
    std::fprintf(stderr, "[plan] %zu pipeline stages on this GPU (same-device transport)\n",
                 stages);
    const engine::CudaModelOptions opts = cuda_model_options();
    const std::string arch = runtime::probe_device().arch();
    std::vector<runtime::StageProgram> programs;
    for (size_t s = 0; s < stages; ++s)
      programs.push_back(
          runtime::load_stage_program(src.plan_dir, *src.plan, s, arch, opts.cache_dir));
    return engine::make_local_cuda_pipeline(src.model_dir, std::move(programs), opts);
  }
  if (stages > 0 && !args.has("--pp-local")) {
    // One process per stage (per GPU with cuda): this one is rank 0 and drives; the others run
    // `xserv worker`.
    PipelineLaunch launch;
    launch.backend = backend;
    launch.coordinator = args.get("--coordinator", "");
    launch.rank_timeout = pipeline_rank_timeout();
    launch.micro_batches = env().pipeline_micro_batches;
    launch.transport = env().pipeline_transport;
    if (args.has("--weights"))
      launch.weights = src.model_dir;
    launch.token = pipeline_token_given(args);
    if (args.has("--world") &&
        args.get_int("--world", 1, 1, 1 << 16) != static_cast<int64_t>(stages))
      throw UsageError(fmt::format("--world {} but the plan has {} pipeline stages",
                                   args.get("--world"), stages));
    return make_pipeline_model(src, launch);
  }
  // The CPU reference: the plan's graph.ir, or its stage programs one after another.
  std::optional<ir::Graph> plan_graph;
  if (!src.plan_dir.empty() && stages == 0)
    plan_graph = read_graph(src.plan_dir / "graph.ir", "the plan's graph");
  std::vector<ir::Graph> programs;
  for (const std::string& file : src.stage_graphs)
    programs.push_back(read_graph(src.plan_dir / file, "pipeline stage program"));
  if (stages > 0)
    std::fprintf(stderr, "[plan] %zu pipeline stages, run one after another in this process\n",
                 stages);
  return std::make_unique<engine::CpuModel>(src.model_dir, src.max_batch, src.max_seq,
                                            plan_graph ? &*plan_graph : nullptr,
                                            std::move(programs));
}

models::Tokenizer load_tokenizer(const ModelSource& src, const ParsedArgs& args) {
  std::vector<fs::path> tried;
  if (args.has("--tokenizer"))
    return models::Tokenizer::load(args.get("--tokenizer"));
  // The tokenizer compile found beside the config, else the usual name.
  tried.push_back(src.model_dir / (src.plan && !src.plan->tokenizer.empty() ? src.plan->tokenizer
                                                                            : "tokenizer.json"));
  if (fs::exists(tried.back()))
    return models::Tokenizer::load(tried.back());
  if (const std::string& data = env().data; !data.empty()) {
    tried.push_back(fs::path(data) / "o200k_base.tiktoken");
    if (fs::exists(tried.back()))
      return models::Tokenizer::load(tried.back());
  }
  std::string list;
  for (const auto& p : tried)
    list += "\n  " + p.string();
  throw UsageError("no tokenizer found (give --tokenizer FILE); tried:" + list);
}

} // namespace xserv::cli
