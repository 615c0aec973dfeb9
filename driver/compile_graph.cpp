// compile_graph(): the passes, the lowering and NVRTC for one graph, in memory.
#include "driver/compile_graph.h"

#include <chrono>

#include <fmt/format.h>

#include "base/error.h"
#include "codegen/emit.h"
#include "compiler/pass_manager.h"
#include "runtime/device.h"
#include "runtime/kernel_cache.h"

namespace xserv::driver {

uint64_t CompiledGraph::offset_of(ir::ValueId v, int r) const {
  const int32_t b = memory.buffer_of.at(static_cast<size_t>(v)).at(static_cast<size_t>(r));
  XSERV_CHECK(b >= 0, "value without a buffer: " + ir::print_node(graph, v));
  return static_cast<uint64_t>(memory.buffers.at(static_cast<size_t>(b)).offset);
}

CompiledGraph compile_graph(const ir::Graph& g, int64_t max_batch, int64_t max_seq,
                            const GraphCompileOptions& opts) {
  const runtime::DeviceInfo dev = runtime::probe_device();
  if (!dev.available)
    throw Error("no GPU: " + dev.reason);
  if (opts.prefill_chunk < 8 || opts.prefill_chunk > 65536)
    throw Error(fmt::format("prefill chunk {} is outside [8, 65536]", opts.prefill_chunk));
  const auto t0 = std::chrono::steady_clock::now();
  CompiledGraph out;
  compiler::PassManager pm;
  pm.add_passes(compiler::kDefaultPasses);
  out.graph = pm.run(g);
  XSERV_CHECK(out.graph.outputs.size() >= 1, "graph without outputs");
  codegen::StageOptions so;
  so.max_batch = max_batch;
  so.max_seq = max_seq;
  so.prefill_chunk = opts.prefill_chunk;
  so.gemm_split = opts.gemm_split;
  so.expert_format = opts.expert_format;
  so.keep_activations = opts.keep_activations;
  so.canonical = opts.gemm_canonical;
  so.natural = opts.gemm_natural;
  so.wgmma = dev.arch() == "sm_90";
  so.dense_cublas = opts.dense_cublas && so.wgmma && !opts.gemm_split;
  if (opts.gemm_natural && (!opts.gemm_canonical || !so.dense_cublas))
    throw Error(fmt::format("compile_graph: the natural K order needs the canonical order, plain "
                            "bf16 gemms, cuBLAS's projections and an sm_90 GPU (this one is {})",
                            dev.arch()));
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
  for (runtime::CachedCubin& c : runtime::get_or_compile_all(code, co, opts.kernel_cache)) {
    p.compiled += c.compiled ? 1 : 0;
    p.cubins.push_back(std::move(c.cubin));
  }
  p.load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

} // namespace xserv::driver
