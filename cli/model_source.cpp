// Plan-or-checkpoint resolution, model construction and tokenizer lookup shared by commands.
#include "cli/model_source.h"

#include <cstdio>

#include <fmt/format.h>

#include "cli/env.h"
#include "driver/compile_graph.h"
#include "engine/cpu_model.h"
#include "engine/cuda_model.h"
#include "engine/load_model.h"
#include "models/config.h"
#include "models/gpt_oss.h"
#include "runtime/device.h"

namespace xserv::cli {
namespace fs = std::filesystem;

ModelSource resolve_source(const std::string& path, const ParsedArgs& args) {
  ModelSource src;
  if (!fs::is_directory(path))
    throw UsageError(fmt::format("'{}' is not a plan or checkpoint directory", path));
  if (fs::exists(fs::path(path) / "plan.json")) {
    runtime::OpenPlanOptions o;
    if (args.has("--weights"))
      o.weights = args.get("--weights");
    o.verify_weights = args.has("--verify-weights");
    o.read_config = [](const fs::path& config) {
      return models::ModelConfig::load(config).to_json();
    };
    src.plan = runtime::open_plan(path, o);
    src.model_dir = src.plan->model_dir;
    src.max_batch = src.plan->plan->options.max_batch;
    src.max_seq = src.plan->plan->options.max_seq;
  } else if (fs::exists(fs::path(path) / "config.json")) {
    src.model_dir = args.has("--weights") ? fs::path(args.get("--weights")) : fs::path(path);
    if (!fs::is_directory(src.model_dir))
      throw UsageError(
          fmt::format("checkpoint directory '{}' does not exist", src.model_dir.string()));
    if (args.has("--verify-weights"))
      throw UsageError(fmt::format("--verify-weights checks a checkpoint against the digests a "
                                   "plan recorded at compile: '{}' is not a plan",
                                   path));
  } else {
    throw UsageError(fmt::format("'{}' holds neither plan.json nor config.json", path));
  }
  const int64_t plan_seq = src.max_seq, plan_batch = src.max_batch;
  src.max_seq = args.get_int("--max-seq", src.max_seq, 1, src.plan ? plan_seq : (1 << 20));
  src.max_batch = args.get_int("--max-batch", src.max_batch, 1, src.plan ? plan_batch : 4096);
  return src;
}

engine::CudaModelOptions cuda_model_options() {
  const Env& e = env();
  engine::CudaModelOptions o;
  o.cache_dir = kernel_cache_dir();
  o.cuda_graphs = e.cuda_graphs;
  o.profile = e.profile;
  o.dependent_launch = e.pdl;
  o.repeat_kernel = e.profile_repeat;
  o.repeat_times = e.profile_repeat_times;
  return o;
}

void kv_memory_options(const ParsedArgs& args, engine::CudaModelOptions& o) {
  if (args.has("--kv-memory")) {
    const double gib = args.get_double("--kv-memory", 0.0);
    if (!(gib > 0 && gib < 1 << 20))
      throw UsageError("--kv-memory must be a positive number of GiB");
    o.kv_memory = uint64_t(gib * double(uint64_t(1) << 30));
    if (args.has("--gpu-memory-utilization"))
      throw UsageError("give --kv-memory or --gpu-memory-utilization, not both");
    return;
  }
  o.gpu_memory_utilization = args.get_double("--gpu-memory-utilization", 0.9);
  if (!(o.gpu_memory_utilization > 0 && o.gpu_memory_utilization <= 1))
    throw UsageError("--gpu-memory-utilization must be a fraction in (0, 1]");
}

void engine_kv_options(const ParsedArgs& args, engine::EngineOptions& o) {
  o.prefix_caching = !args.has("--no-prefix-cache");
  o.prefill_budget = args.get_int("--prefill-budget", o.prefill_budget, 0, 1 << 24);
  o.backlog_steps = args.get_int("--backlog-steps", o.backlog_steps, 0, 1 << 20);
  o.itl_target_ms = args.get_double("--itl-target", o.itl_target_ms);
  if (!(o.itl_target_ms >= 0 && o.itl_target_ms <= 1e6))
    throw UsageError("--itl-target must be a number of milliseconds in [0, 1000000]");
  o.itl_factor = args.get_double("--itl-factor", o.itl_factor);
  if (!(o.itl_factor == 0 || (o.itl_factor >= 1 && o.itl_factor <= 1000)))
    throw UsageError("--itl-factor must be 0 (off) or a factor in [1, 1000]");
  o.itl_tail = args.get_double("--itl-tail", o.itl_tail);
  if (!(o.itl_tail >= 0 && o.itl_tail <= 0.5))
    throw UsageError("--itl-tail must be a fraction in [0, 0.5]");
}

runtime::RunSettings run_settings() {
  return {env().prefill_chunk, env().gemm_split};
}

std::string pipeline_token_given(const ParsedArgs& args) {
  if (!args.has("--pipeline-token"))
    return env().pipeline_token;
  const std::string t = args.get("--pipeline-token", "");
  if (t.empty())
    throw UsageError("--pipeline-token is empty: give every rank the same secret");
  return t;
}

engine::pipeline::PipelineOptions pipeline_options(const ParsedArgs& args) {
  const Env& e = env();
  engine::pipeline::PipelineOptions o;
  o.coordinator = args.get("--coordinator", "");
  if (args.has("--weights"))
    o.weights = args.get("--weights");
  o.token = pipeline_token_given(args);
  o.rank_timeout = e.pipeline_timeout;
  o.step_timeout = e.pipeline_step_timeout;
  o.micro_batches = e.pipeline_micro_batches;
  o.transport = e.pipeline_transport;
  o.fault = e.pipeline_fault;
  return o;
}

std::unique_ptr<engine::Model> make_model(const ModelSource& src, const ParsedArgs& args) {
  const std::string requested = args.get("--backend", "auto");
  if (src.plan) {
    engine::LoadOptions o;
    o.backend = requested;
    o.max_batch = src.max_batch;
    o.max_seq = src.max_seq;
    o.pp_local = args.has("--pp-local");
    if (args.has("--world"))
      o.world = static_cast<int>(args.get_int("--world", 1, 1, 1 << 16));
    o.cuda = cuda_model_options();
    kv_memory_options(args, o.cuda);
    o.settings = run_settings();
    o.pipeline = pipeline_options(args);
    return engine::load_model(*src.plan, o);
  }
  // A checkpoint directory: the interpreter, or the graph compiled in memory with compile's
  // defaults (plain bf16 gemm activations unless XSERV_GEMM_PRECISION says split, MXFP4
  // experts).
  if (engine::resolve_backend("", requested) == "cpu")
    return std::make_unique<engine::CpuModel>(src.model_dir, src.max_batch, src.max_seq);
  driver::GraphCompileOptions co;
  co.prefill_chunk = env().prefill_chunk.value_or(co.prefill_chunk);
  co.gemm_split = env().gemm_split.value_or(false);
  co.expert_format = runtime::ExpertFormat::Mxfp4;
  co.kernel_cache = kernel_cache_dir();
  const ir::Graph g =
      models::build_gpt_oss(models::ModelConfig::load(src.model_dir / "config.json"));
  driver::CompiledGraph c = driver::compile_graph(g, src.max_batch, src.max_seq, co);
  engine::CudaModelOptions mo = cuda_model_options();
  kv_memory_options(args, mo);
  return std::make_unique<engine::CudaModel>(src.model_dir, std::move(c.program), mo);
}

models::Tokenizer load_tokenizer(const ModelSource& src, const ParsedArgs& args) {
  std::vector<fs::path> tried;
  if (args.has("--tokenizer"))
    return models::Tokenizer::load(args.get("--tokenizer"));
  // The tokenizer compile found beside the config, else the usual name.
  const std::string recorded = src.plan ? src.plan->plan->tokenizer : std::string();
  tried.push_back(src.model_dir / (recorded.empty() ? "tokenizer.json" : recorded));
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
