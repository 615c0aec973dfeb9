// compile_plan(): checkpoint -> config -> IR -> passes -> memory -> stages -> kernels -> plan.
//
// The steps, each logged with its time ("[compile] STEP ... DETAIL, N ms"):
//   1. Read config.json (ModelConfig) and check the flags against it.
//   2. With weights present: read every safetensors header (the tensor bytes are never parsed)
//      and hash each shard, sampled and whole, for run's checks (docs/DESIGN.md, "Checkpoint
//      fingerprints"); the largest MXFP4 scale byte (up to 128: one multiply a decoded pair).
//   3. Build the gpt-oss graph (models::build_gpt_oss).
//   4. Run the passes (compiler::PassManager), verified at the end.
//   5. Plan the activation arena for the largest step.
//   6. With --pp N: partition the layers into N stages balanced by the cost model.
//   7. Write graph.ir and the stage programs, then generate every kernel, compile it with NVRTC
//      and record the launch tables (driver/plan_kernels.h).
//   8. Digest the plan's files, write plan.json and rename the directory into place.
#include "driver/compile_plan.h"

#include <algorithm>
#include <fstream>

#include <fmt/format.h>

#include "base/error.h"
#include "base/progress.h"
#include "compiler/memory_plan.h"
#include "compiler/partition.h"
#include "compiler/pass_manager.h"
#include "driver/plan_kernels.h"
#include "driver/plan_writer.h"
#include "ir/dims.h"
#include "models/checkpoint.h"
#include "models/config.h"
#include "models/gpt_oss.h"
#include "runtime/plan_checkpoint.h"
#include "runtime/plan_io.h"

namespace xserv::driver {
namespace fs = std::filesystem;

namespace {

/// Step 2: each safetensors file's name, size and digests (the one full read of the weights at
/// compile: what `run --verify-weights` compares with), and the largest MXFP4 scale byte
/// (`max_scale`; -1 without MXFP4 experts).
std::vector<runtime::PlanWeightFile> fingerprint_weights(const fs::path& model, Progress& progress,
                                                         int& max_scale) {
  std::vector<runtime::PlanWeightFile> files;
  progress.step("checking safetensors headers");
  // Mapped (nothing read until touched): the scales are read from it after the hashes.
  models::Checkpoint ckpt = models::Checkpoint::open(model, {.map_data = true, .validate = true});
  uint64_t total = 0;
  std::vector<fs::path> paths;
  for (const auto& f : ckpt.files()) {
    files.push_back({f.path().filename().string(),
                     f.file_size(),
                     runtime::sampled_file_digest(f.path()),
                     {}}); // sha256: the full read below
    paths.push_back(f.path());
    total += f.file_size();
  }
  progress.finish(fmt::format("{} tensors in {} file(s), {:.2f} GB", ckpt.tensor_names().size(),
                              ckpt.files().size(), static_cast<double>(total) / 1e9));
  progress.step("hashing the safetensors files (SHA-256)");
  const std::vector<std::string> digests = runtime::full_file_digests(paths);
  for (size_t i = 0; i < digests.size(); ++i)
    files[i].sha256 = digests[i];
  progress.finish();
  progress.step("reading the MXFP4 scales");
  max_scale = ckpt.max_mxfp4_scale();
  progress.finish(max_scale < 0 ? std::string("none")
                  : max_scale <= 128
                      ? fmt::format("largest {}: one multiply a decoded pair", max_scale)
                      : fmt::format("largest {} (past 128): two multiplies a pair", max_scale));
  return files;
}

/// Step 6's record of one stage: its program file, layers, transfers and cost estimates.
runtime::PlanStage stage_record(const ir::Graph& g, const compiler::StageInfo& in, size_t index,
                                const ir::DimBindings& arena_dims) {
  runtime::PlanStage st;
  st.graph = fmt::format("stage{}.ir", index);
  st.first_layer = in.first_layer;
  st.last_layer = in.last_layer;
  st.embedding = in.embedding;
  st.head = in.head;
  for (const ir::Node& n : g.nodes)
    if (n.op == ir::Op::Send || n.op == ir::Op::Recv)
      (n.op == ir::Op::Send ? st.sends : st.recvs)
          .push_back({n.attr_str("name"), static_cast<int>(n.attr_int("peer"))});
  st.weight_bytes = in.weight_bytes;
  st.kv_cache_bytes = in.kv_bytes;
  st.decode_bytes_per_token = in.decode_bytes;
  st.prefill_flops_per_token = in.prefill_flops;
  st.estimated_decode_ms = in.decode_seconds * 1e3;
  st.estimated_prefill_us_per_token = in.prefill_seconds * 1e6;
  st.activation_arena_bytes = compiler::plan_memory(g, arena_dims).arena_bytes;
  return st;
}

} // namespace

CompileResult compile_plan(const CompileOptions& o) {
  const fs::path& model = o.model;
  const fs::path config_file = fs::is_directory(model) ? model / "config.json" : model;
  const int64_t chunk = o.prefill_chunk > 0 ? o.prefill_chunk : std::min<int64_t>(2048, o.max_seq);
  // cuBLAS sums in an order of its own: a canonical plan keeps gemm_wg for the projections;
  // one in the natural order calls cuBLAS with a pinned algorithm, whose sums are that order's.
  const bool natural = o.gemm_canonical && o.gemm_natural;
  const bool dense_cublas =
      o.dense_cublas.value_or(!o.gemm_split && o.arch == "sm_90" && (!o.gemm_canonical || natural));
  if (dense_cublas && o.gemm_canonical && !natural)
    throw Error("compile: --gemm-order canonical needs gemm_wg's projections (--dense-gemm wg): "
                "cuBLAS sums in an order of its own");
  if (natural && (o.gemm_split || o.arch != "sm_90" || !dense_cublas))
    throw Error("compile: --gemm-order natural needs plain bf16 gemms, an sm_90 plan and cuBLAS's "
                "projections (its prompt steps)");
  Progress progress("compile");
  CompileResult out;

  // 1. The model description.
  progress.step(fmt::format("reading {}", config_file.string()));
  const models::ModelConfig cfg = models::ModelConfig::load(config_file);
  if (o.max_seq > cfg.max_position_embeddings)
    throw UsageError(fmt::format("--max-seq {} exceeds the model's max_position_embeddings {}",
                                 o.max_seq, cfg.max_position_embeddings));
  progress.finish(
      fmt::format("{} layers, {} experts", cfg.num_hidden_layers, cfg.num_local_experts));

  // 2. The weights, from their headers alone; a directory with only config.json compiles too
  //    and its weights are checked when the plan runs.
  std::vector<runtime::PlanWeightFile> weight_files;
  int max_scale = -1; // the checkpoint's largest MXFP4 scale byte (-1: none, or no weights)
  if (fs::is_directory(model) && (fs::exists(model / "model.safetensors") ||
                                  fs::exists(model / "model.safetensors.index.json")))
    weight_files = fingerprint_weights(model, progress, max_scale);
  // Scale bytes of at most 128 make 2^(s - 1) a bf16 factor: the MoE gemms that decode MXFP4
  // scale a pair with one multiply, and the plan promises no larger one (the upload checks).
  const bool small_scales =
      max_scale >= 0 && max_scale <= 128 && o.expert_format != runtime::ExpertFormat::Bf16;

  // 3. The graph.
  progress.step("building the graph");
  models::BuildOptions bopts;
  bopts.last_logits_only = !o.all_logits;
  bopts.kv_dtype = o.kv_dtype;
  bopts.kv_block = o.kv_block;
  ir::Graph g = models::build_gpt_oss(cfg, bopts);
  progress.finish(fmt::format("{} nodes", g.size()));

  // 4. The passes.
  compiler::PassManagerOptions popts;
  popts.dump_after = o.dump_after;
  popts.verify_after_all = o.verify_after_all;
  popts.stop_after = o.stop_after;
  popts.debug = o.debug;
  popts.dump_dir = o.dump_dir;
  compiler::PassOptions pass_opts;
  pass_opts.pipeline_stages = o.pp;
  compiler::PassManager pm(popts, pass_opts);
  pm.add_passes(o.passes.empty() ? compiler::kDefaultPasses : o.passes);
  progress.step(fmt::format("running {} passes", pm.passes().size()));
  if (!o.dump_dir.empty()) {
    fs::create_directories(o.dump_dir);
    std::ofstream(o.dump_dir / "00_input.ir") << ir::print(g);
  }
  g = pm.run(std::move(g));
  ir::verify_or_throw(g, "after the passes");
  progress.finish(fmt::format("{} nodes", g.size()));

  // 5. Activations for the largest step: a prefill chunk, or one token for each of max_batch
  //    sequences, whichever holds more tokens.
  const ir::DimBindings arena_dims = {
      {ir::dims::kTokens, std::max(chunk, o.max_batch)},
      {ir::dims::kSeqs, o.max_batch},
      {ir::dims::kTableBlocks, (o.max_seq + o.kv_block - 1) / o.kv_block}};
  progress.step("planning activation memory");
  const compiler::MemoryPlan mem = compiler::plan_memory(g, arena_dims);
  progress.finish(compiler::describe(mem));

  // 6. Pipeline stages: contiguous layer ranges balanced by the cost model, send/recv between.
  compiler::Partition partition;
  if (o.pp > 1) {
    progress.step(fmt::format("partitioning into {} pipeline stages", o.pp));
    compiler::PartitionCostModel cost;
    if (o.expert_format != runtime::ExpertFormat::Bf16) { // decode reads the MXFP4 experts
      cost.mxfp4_read_bytes = 17.0 / 32.0;
      cost.mxfp4_held_bytes =
          o.expert_format == runtime::ExpertFormat::Both ? 2.0 + 17.0 / 32.0 : 17.0 / 32.0;
    }
    // KV bytes per stage: of one block of positions of each of its caches.
    partition = compiler::partition_pipeline(
        g, o.pp, {{ir::dims::kKvBlocks, 1}, {ir::dims::kWindowBlocks, 1}}, cost);
    progress.finish(fmt::format("imbalance {:.1f}%", partition.imbalance * 100));
  }
  if (o.output.empty()) {
    out.graph = std::move(g);
    out.total_ms = progress.total_ms();
    return out;
  }

  // 7. The plan's files: programs, then kernels and launch tables.
  progress.step(fmt::format("writing {}", o.output.string()));
  PlanWriter writer(o.output);
  writer.write("graph.ir", ir::print(g));
  runtime::Plan& pf = out.plan;
  pf.model_dir = fs::absolute(fs::is_directory(model) ? model : model.parent_path()).string();
  pf.model_digest = runtime::config_digest(config_file);
  pf.config = cfg.to_json();
  if (fs::is_directory(model) && fs::exists(model / "tokenizer.json"))
    pf.tokenizer = "tokenizer.json";
  pf.options = {.max_batch = o.max_batch,
                .max_seq = o.max_seq,
                .prefill_chunk = chunk,
                .pp = o.pp,
                .last_logits_only = bopts.last_logits_only,
                .kv_dtype =
                    o.kv_dtype == ir::DType::BF16 ? runtime::KvDtype::Bf16 : runtime::KvDtype::F32,
                .kv_block = o.kv_block,
                .gemm_split = o.gemm_split,
                .arch = o.arch,
                .expert_format = o.expert_format,
                .dense_cublas = dense_cublas,
                .gemm_canonical = o.gemm_canonical,
                .gemm_natural = natural,
                .timeline = o.timeline,
                .mxfp4_max_scale = small_scales ? max_scale : -1};
  pf.weights = std::move(weight_files);
  pf.memory = {mem.arena_bytes, mem.peak_live, mem.unpacked,
               static_cast<int64_t>(mem.buffers.size())};
  pf.graph = "graph.ir";
  for (const auto& t : pm.timings())
    pf.passes.push_back({t.name, t.ms, t.changed});
  // One program per stage (graph.ir stays the whole model, which one device can also run).
  for (size_t i = 0; i < partition.stages.size(); ++i) {
    pf.stages.push_back(stage_record(partition.stages[i], partition.info[i], i, arena_dims));
    writer.write(pf.stages.back().graph, ir::print(partition.stages[i]));
  }
  pf.imbalance = partition.imbalance;
  progress.finish();
  progress.step(o.cubins ? fmt::format("generating kernels and compiling them for {}", o.arch)
                         : std::string("generating kernels"));
  PlanKernelOptions ko;
  ko.arch = o.arch;
  ko.max_batch = o.max_batch;
  ko.max_seq = o.max_seq;
  ko.prefill_chunk = static_cast<int>(chunk);
  ko.cubins = o.cubins;
  ko.cache_dir = o.kernel_cache;
  ko.expert_format = o.expert_format;
  ko.gemm_split = o.gemm_split;
  ko.wgmma = o.arch == "sm_90";
  ko.dense_cublas = dense_cublas;
  ko.canonical = o.gemm_canonical;
  ko.natural = natural;
  ko.mxfp4_small_scales = small_scales;
  ko.timeline = o.timeline;
  PlanKernelsResult whole = write_plan_kernels(g, writer.dir(), ko);
  pf.codegen = std::move(whole.codegen);
  if (pf.stages.empty()) { // pp 1: the whole graph is the one stage
    runtime::PlanStage st;
    st.graph = pf.graph;
    st.first_layer = 0;
    st.last_layer = static_cast<int>(cfg.num_hidden_layers) - 1;
    st.activation_arena_bytes = mem.arena_bytes;
    st.launches_per_decode_step = whole.code.launches_per_decode_step;
    st.layout = std::move(whole.code.layout);
    st.table = std::move(whole.code.table);
    pf.stages.push_back(std::move(st));
  }
  // Each stage lowers to kernels of the whole graph (checked here, so a plan never holds a
  // stage the CUDA runtime cannot run), and its launch table and layout go into the plan.
  for (size_t i = 0; i < partition.stages.size(); ++i) {
    PlanStageCode code = stage_launches(partition.stages[i], pf.codegen, ko);
    pf.stages[i].launches_per_decode_step = code.launches_per_decode_step;
    pf.stages[i].layout = std::move(code.layout);
    pf.stages[i].table = std::move(code.table);
  }
  for (runtime::PlanStage& st : pf.stages) {
    st.layout.expert_format = o.expert_format; // the upload follows it (the lowering did too)
    st.layout.mxfp4_max_scale = pf.options.mxfp4_max_scale; // and holds the scales to it
  }
  progress.finish(fmt::format("{} kernels, {} launches per decode step", pf.codegen.kernels.size(),
                              pf.codegen.launches_per_decode_step));

  // 8. Sealed: run refuses a plan whose files changed since.
  progress.step("writing plan.json");
  pf.digests = runtime::digest_plan_files(writer.dir());
  runtime::write_plan(writer.dir(), pf);
  writer.commit();
  progress.finish();
  out.graph = std::move(g);
  out.total_ms = progress.total_ms();
  return out;
}

} // namespace xserv::driver
