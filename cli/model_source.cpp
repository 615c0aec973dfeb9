// Plan-or-checkpoint resolution, engine construction and tokenizer lookup shared by commands.
#include "cli/model_source.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include <fmt/format.h>

#include "cli/cpu_model.h"
#include "cli/cuda_model.h"
#include "cli/env.h"
#include "cli/pipeline.h"
#include "cli/pipeline_local.h"
#include "cli/plan_file.h"
#include "ir/graph.h"
#include "models/config.h"
#include "runtime/device.h"
#include "runtime/plan_checkpoint.h"
#include "runtime/plan_io.h"

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
    src.prefill_chunk = plan->options.prefill_chunk;
    src.expert_format = plan->options.expert_format;
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

std::unique_ptr<Model> make_model(const ModelSource& src, const ParsedArgs& args) {
  const std::string backend = resolve_backend(src, args.get("--backend", "auto"));
  if (backend == "cuda" && src.stage_graphs.empty()) {
    // The plan's stage layout, launch table and kernels: graph.ir is read only when the plan
    // does not fit the run (and then the run lowers the graph itself, saying why).
    CudaModelOptions opts;
    opts.plan_dir = src.plan_dir;
    opts.plan_only = true;
    opts.expert_format = src.expert_format; // the layout says it too; graph mode needs it
    if (src.prefill_chunk > 0)
      opts.prefill_chunk = static_cast<int>(src.prefill_chunk);
    return std::make_unique<CudaModel>(src.model_dir, src.max_batch, src.max_seq, nullptr, opts);
  }
  std::optional<ir::Graph> plan_graph;
  if (!src.plan_dir.empty())
    plan_graph = read_graph(src.plan_dir / "graph.ir", "the plan's graph");
  const ir::Graph* g = plan_graph ? &*plan_graph : nullptr;
  std::vector<ir::Graph> stages;
  for (const std::string& file : src.stage_graphs)
    stages.push_back(read_graph(src.plan_dir / file, "pipeline stage program"));
  if (backend == "cuda" && !stages.empty() && args.has("--pp-local")) {
    std::fprintf(stderr, "[plan] %zu pipeline stages on this GPU (same-device transport)\n",
                 stages.size());
    return make_local_cuda_pipeline(src.model_dir, src.max_batch, src.max_seq, stages);
  }
  if (!stages.empty() && !args.has("--pp-local")) {
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
        args.get_int("--world", 1, 1, 1 << 16) != static_cast<int64_t>(stages.size()))
      throw UsageError(fmt::format("--world {} but the plan has {} pipeline stages",
                                   args.get("--world"), stages.size()));
    return make_pipeline_model(src.plan_dir, src.model_dir, src.max_batch, src.max_seq,
                               std::move(stages), launch);
  }
  if (!stages.empty())
    std::fprintf(stderr, "[plan] %zu pipeline stages, run one after another in this process\n",
                 stages.size());
  return std::make_unique<CpuModel>(src.model_dir, src.max_batch, src.max_seq, g,
                                    std::move(stages));
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
