// `xserv trace`: the residual stream of a teacher-forced prompt, layer by layer, for comparison
// with another implementation (tools/hf_layer_compare.py does it against HF transformers).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/env.h"
#include "cli/float_file.h"
#include "cli/model_source.h"
#include "driver/compile_graph.h"
#include "engine/cpu_model.h"
#include "engine/cuda_model.h"
#include "engine/load_model.h"
#include "models/config.h"
#include "models/step.h"

namespace xserv::cli {
namespace {

/// The values a trace records, in order: the embedding, then each layer's output (the residual
/// stream after its MoE block).
struct Tracked {
  std::vector<ir::ValueId> values;
  std::vector<std::string> names;
};

Tracked tracked_values(const ir::Graph& g) {
  Tracked t;
  int layer = 0;
  for (ir::ValueId v = 0; v < static_cast<ir::ValueId>(g.size()); ++v) {
    const ir::Op op = g.node(v).op;
    if (op == ir::Op::Embedding && t.values.empty()) {
      t.values.push_back(v);
      t.names.push_back("embedding");
    } else if (op == ir::Op::MoeExpertsResidual) {
      t.values.push_back(v);
      t.names.push_back(fmt::format("layer {}", layer++));
    }
  }
  if (t.values.empty() || t.names.front() != "embedding" || layer == 0)
    throw Error("xserv trace: the plan's graph has no embedding or no moe_experts_residual "
                "nodes (plans from `xserv compile` with the default passes have both)");
  return t;
}

} // namespace

int cmd_trace(const ParsedArgs& args) {
  ModelSource src = resolve_source(args.positional()[0], args);
  if (!src.plan)
    throw UsageError("xserv trace runs a plan: `xserv compile MODEL_DIR -o PLAN` first");
  const std::vector<int32_t> ids = parse_prompt_ids(args);
  const std::string out = args.get("-o", "");
  if (out.empty())
    throw UsageError("xserv trace needs -o FILE");
  const runtime::PlanOptions& plan = src.plan->plan->options;
  const std::string backend = engine::resolve_backend(plan.arch, args.get("--backend", "cpu"));
  ir::Graph g = ir::parse_file(src.plan->dir / "graph.ir", "the plan's graph");
  const models::ModelConfig config = models::ModelConfig::load(src.model_dir / "config.json");
  const int64_t tokens = static_cast<int64_t>(ids.size()), hidden = config.hidden_size;
  engine::check_prompt(ids, src.max_seq, config.vocab_size);
  models::StepInput step; // one sequence in row 0 of the pools
  step.tokens = {ids};
  step.ctx_lens = {0};

  std::vector<std::vector<float>> rows; // per tracked value: tokens x hidden
  std::vector<std::string> names;
  if (backend == "cpu") {
    const Tracked t = tracked_values(g);
    for (ir::ValueId v : t.values)
      g.outputs.push_back(v);
    engine::CpuModel cpu(src.model_dir, 1, src.max_seq, &g);
    models::assign_rows(step, {0}, cpu.kv_geometry());
    const std::vector<ir::Tensor> res = cpu.run_graph(g, models::step_params(step));
    for (size_t i = 0; i < t.values.size(); ++i) {
      const ir::Tensor& x = res.at(res.size() - t.values.size() + i);
      if (x.numel() != tokens * hidden)
        throw Error(fmt::format("xserv trace: {} has {} values, expected {} x {}", t.names[i],
                                x.numel(), tokens, hidden));
      rows.push_back(x.f);
    }
    names = t.names;
  } else {
    // The plan's graph compiled again in memory with every value in its own buffer (the plan's
    // launch table reuses them), read back after one step.
    driver::GraphCompileOptions opts;
    opts.keep_activations = true; // every value keeps its own buffer until the next step
    opts.prefill_chunk = static_cast<int>(std::clamp<int64_t>(plan.prefill_chunk, 8, 65536));
    opts.gemm_split = plan.gemm_split;
    opts.expert_format = plan.expert_format;
    opts.kernel_cache = kernel_cache_dir();
    if (tokens > opts.prefill_chunk)
      throw Error(fmt::format("xserv trace --backend cuda takes at most {} tokens (one prefill "
                              "sub-step), got {}",
                              opts.prefill_chunk, tokens));
    driver::CompiledGraph compiled = driver::compile_graph(g, 1, src.max_seq, opts);
    const Tracked t = tracked_values(compiled.graph);
    std::vector<uint64_t> offsets;
    for (ir::ValueId v : t.values)
      offsets.push_back(compiled.offset_of(v));
    engine::CudaModelOptions mo = cuda_model_options();
    mo.cuda_graphs = false;
    engine::CudaModel gpu(src.model_dir, std::move(compiled.program), mo);
    models::assign_rows(step, {0}, gpu.kv_geometry());
    gpu.step(step);
    for (uint64_t off : offsets)
      rows.push_back(gpu.read_activation(off, static_cast<size_t>(tokens * hidden)));
    names = t.names;
  }

  const std::string meta_path = out + ".json";
  std::remove(meta_path.c_str()); // never a stale description beside a new trace
  FloatFile file(out, "");
  for (const auto& r : rows)
    file.write(r.data(), r.size());
  file.commit();
  const nlohmann::json meta = {{"format", "float32 little-endian [values, tokens, hidden]"},
                               {"values", names},
                               {"tokens", tokens},
                               {"hidden", hidden},
                               {"ids", ids},
                               {"backend", backend},
                               {"plan", src.plan->dir.string()},
                               {"model_dir", src.model_dir.string()}};
  std::ofstream meta_out(meta_path);
  meta_out << meta.dump(1) << "\n";
  meta_out.close();
  if (!meta_out) {
    file.discard();
    std::remove(meta_path.c_str());
    throw Error(fmt::format("writing {} failed", meta_path));
  }
  std::fprintf(stderr,
               "[trace] %s: %zu values (the embedding and %zu layers) x %lld tokens x %lld "
               "in %s (+ .json)\n",
               backend.c_str(), rows.size(), rows.size() - 1, static_cast<long long>(tokens),
               static_cast<long long>(hidden), out.c_str());
  return 0;
}

} // namespace xserv::cli
