// compile_graph() and graph_cuda_model(): what `xserv compile` does for one stage, kept in
// memory, for a CUDA model that has no plan.
#include "cli/graph_model.h"

#include <chrono>

#include <fmt/format.h>

#include "cli/env.h"
#include "compiler/pass_manager.h"
#include "ir/error.h"
#include "models/config.h"
#include "models/gpt_oss.h"
#include "runtime/device.h"
#include "runtime/kernel_cache.h"

namespace xserv::cli {
namespace fs = std::filesystem;

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

GraphModelOptions graph_model_options() {
  const Env& e = env();
  GraphModelOptions o;
  static_cast<engine::CudaModelOptions&>(o) = cuda_model_options();
  o.prefill_chunk = e.prefill_chunk.value_or(o.prefill_chunk);
  o.gemm_split = e.gemm_split.value_or(o.gemm_split);
  return o;
}

GraphModelOptions checkpoint_model_options() {
  GraphModelOptions o = graph_model_options();
  o.gemm_split = env().gemm_split.value_or(false);
  o.expert_format = runtime::ExpertFormat::Mxfp4;
  return o;
}

uint64_t CompiledGraph::offset_of(ir::ValueId v, int r) const {
  const int32_t b = memory.buffer_of.at(static_cast<size_t>(v)).at(static_cast<size_t>(r));
  XSERV_CHECK(b >= 0, "value without a buffer: " + ir::print_node(graph, v));
  return static_cast<uint64_t>(memory.buffers.at(static_cast<size_t>(b)).offset);
}

CompiledGraph compile_graph(const ir::Graph& g, int64_t max_batch, int64_t max_seq,
                            const GraphModelOptions& opts) {
  const runtime::DeviceInfo dev = runtime::probe_device();
  if (!dev.available)
    throw Error("no GPU: " + dev.reason);
  if (opts.prefill_chunk < 8 || opts.prefill_chunk > 65536)
    throw Error(fmt::format("prefill chunk {} is outside [8, 65536]", opts.prefill_chunk));
  const auto t0 = std::chrono::steady_clock::now();
  CompiledGraph out;
  compiler::PassManager pm;
  pm.add_pipeline(compiler::kDefaultPipeline);
  out.graph = pm.run(g);
  XSERV_CHECK(out.graph.outputs.size() >= 1, "graph without outputs");
  codegen::StageOptions so;
  so.max_batch = max_batch;
  so.max_seq = max_seq;
  so.prefill_chunk = opts.prefill_chunk;
  so.gemm_split = opts.gemm_split;
  so.expert_format = opts.expert_format;
  so.keep_activations = opts.keep_activations;
  so.wgmma = dev.arch() == "sm_90";
  codegen::LoweredStage lowered = codegen::lower_stage(out.graph, so);
  out.memory = std::move(lowered.memory);
  runtime::StageProgram& p = out.program;
  p.layout = std::move(lowered.layout);
  p.table = std::move(lowered.table);
  p.source = "a graph compiled in memory";
  for (const ir::Node& n : out.graph.nodes) // a pipeline stage's boundary values
    if (n.op == ir::Op::Send || n.op == ir::Op::Recv)
      (n.op == ir::Op::Send ? p.sends : p.recvs)
          .push_back({n.attr_str("name"), static_cast<int>(n.attr_int("peer"))});
  runtime::CompileOptions co;
  co.arch = dev.arch();
  co.headers = codegen::kernel_headers();
  std::vector<runtime::KernelCode> code;
  for (size_t i = 0; i < lowered.kernels.size(); ++i) {
    const codegen::KernelSource& s = lowered.kernels.source(static_cast<int>(i));
    code.push_back({s.name, s.source});
  }
  const fs::path cache = opts.cache_dir.empty() ? kernel_cache_dir() : opts.cache_dir;
  for (runtime::CachedCubin& c : runtime::get_or_compile_all(code, co, cache)) {
    p.compiled += c.compiled ? 1 : 0;
    p.cubins.push_back(std::move(c.cubin));
  }
  p.load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

std::unique_ptr<engine::CudaModel> graph_cuda_model(const fs::path& model_dir, int64_t max_batch,
                                                    int64_t max_seq, const ir::Graph* graph,
                                                    const GraphModelOptions& opts) {
  const ir::Graph g =
      graph ? *graph : models::build_gpt_oss(models::ModelConfig::load(model_dir / "config.json"));
  CompiledGraph c = compile_graph(g, max_batch, max_seq, opts);
  engine::CudaModelOptions mo = opts;
  if (mo.cache_dir.empty())
    mo.cache_dir = kernel_cache_dir();
  return std::make_unique<engine::CudaModel>(model_dir, std::move(c.program), mo);
}

} // namespace xserv::cli
