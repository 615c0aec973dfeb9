// `xserv compile`: config (and safetensors headers) -> IR -> passes -> plan directory.
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <unistd.h>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/env.h"
#include "cli/plan_kernels.h"
#include "compiler/memory_plan.h"
#include "compiler/partition.h"
#include "compiler/pass_manager.h"
#include "models/checkpoint.h"
#include "models/config.h"
#include "models/gpt_oss.h"
#include "runtime/plan_checkpoint.h"
#include "runtime/plan_io.h"

namespace xserv::cli {
namespace fs = std::filesystem;

namespace {

/// Writes `text` to `path`; throws naming the file when it cannot.
void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out.flush())
    throw Error(fmt::format("{}: cannot write", path.string()));
}

/// A plan written into a temporary sibling directory and renamed into place by commit() once
/// complete, so that a failed compile leaves the previous plan (or nothing) behind, never a mix.
class PlanWriter {
public:
  explicit PlanWriter(fs::path plan) : plan_(std::move(plan)) {
    const fs::path abs = fs::absolute(plan_).lexically_normal();
    const fs::path name = abs.has_filename() ? abs.filename() : abs.parent_path().filename();
    const fs::path parent =
        abs.has_filename() ? abs.parent_path() : abs.parent_path().parent_path();
    std::error_code ec;
    if (fs::exists(plan_, ec) && !fs::is_directory(plan_, ec))
      throw UsageError(fmt::format("-o {}: exists and is not a directory", plan_.string()));
    if (fs::is_directory(plan_, ec) && !fs::is_empty(plan_, ec) && !fs::exists(plan_ / "plan.json"))
      throw UsageError(fmt::format("-o {}: a non-empty directory that holds no plan.json; "
                                   "compile will not replace it (choose another -o)",
                                   plan_.string()));
    fs::create_directories(parent, ec);
    const std::string tag = fmt::format(".{}.{}", name.string(), ::getpid());
    tmp_ = parent / (tag + ".tmp");
    old_ = parent / (tag + ".old");
    fs::remove_all(tmp_, ec);
    fs::create_directories(tmp_, ec);
    if (ec)
      throw Error(fmt::format("{}: cannot create directory: {}", tmp_.string(), ec.message()));
  }
  ~PlanWriter() {
    std::error_code ec;
    if (!committed_)
      fs::remove_all(tmp_, ec);
  }
  PlanWriter(const PlanWriter&) = delete;
  PlanWriter& operator=(const PlanWriter&) = delete;

  /// Where the files go until commit().
  const fs::path& dir() const { return tmp_; }

  /// Replaces the plan directory with the temporary one.
  void commit() {
    std::error_code ec;
    const bool had_old = fs::exists(plan_, ec);
    if (had_old) {
      fs::remove_all(old_, ec);
      fs::rename(plan_, old_, ec);
      if (ec)
        throw Error(fmt::format("{}: cannot move the previous plan aside: {}", plan_.string(),
                                ec.message()));
    }
    fs::rename(tmp_, plan_, ec);
    if (ec) {
      std::error_code ignored;
      if (had_old)
        fs::rename(old_, plan_, ignored);
      throw Error(fmt::format("{}: cannot rename {} into place: {}", plan_.string(), tmp_.string(),
                              ec.message()));
    }
    committed_ = true;
    if (had_old)
      fs::remove_all(old_, ec);
  }

private:
  fs::path plan_, tmp_, old_;
  bool committed_ = false;
};

/// The send and recv nodes of a stage's program.
void stage_transfers(const ir::Graph& g, runtime::PlanStage& s) {
  for (const ir::Node& n : g.nodes)
    if (n.op == ir::Op::Send || n.op == ir::Op::Recv)
      (n.op == ir::Op::Send ? s.sends : s.recvs)
          .push_back({n.attr_str("name"), static_cast<int>(n.attr_int("peer"))});
}

/// --arch: "sm_" and a number, optionally a feature letter ("sm_90a").
std::string arch_flag(const ParsedArgs& args) {
  const std::string arch = args.get("--arch", "sm_90");
  const size_t digits = arch.find_first_not_of("0123456789", 3);
  if (arch.rfind("sm_", 0) != 0 || arch.size() < 4 || digits == 3 ||
      (digits != std::string::npos &&
       (digits + 1 != arch.size() || !std::islower(static_cast<unsigned char>(arch[digits])))))
    throw UsageError(fmt::format("--arch must be a GPU architecture like sm_90, got '{}'", arch));
  return arch;
}

} // namespace

int cmd_compile(const ParsedArgs& args) {
  const fs::path model = args.positional()[0];
  if (!fs::exists(model))
    throw UsageError(fmt::format("model directory '{}' does not exist", model.string()));
  const fs::path config_file = fs::is_directory(model) ? model / "config.json" : model;
  if (!fs::exists(config_file))
    throw UsageError(fmt::format("'{}' holds no config.json", model.string()));
  const std::string emit = args.get("--emit", "plan");
  if (emit != "ir" && emit != "plan")
    throw UsageError(fmt::format("--emit must be 'ir' or 'plan', got '{}'", emit));
  if (emit == "plan" && !args.has("-o"))
    throw UsageError("missing -o PLAN_DIR (or use --emit ir to print the IR)");
  const int64_t max_batch = args.get_int("--max-batch", 64, 1, runtime::kPlanMaxBatch);
  const int64_t max_seq = args.get_int("--max-seq", 8192, 1, runtime::kPlanMaxSeq);
  const int64_t chunk =
      args.get_int("--prefill-chunk", std::min<int64_t>(2048, max_seq), 1, int64_t{1} << 20);
  const std::string arch = arch_flag(args);
  // Defaults from docs/PERF.md (session 8): MXFP4 experts win decode (+31%) and batched decode
  // (+21%) for 6-7% of prefill and hold 40% less memory; plain bf16 gemm activations are 1.6-1.7x
  // the split ones in prefill.
  const std::string experts = args.get("--expert-format", "mxfp4");
  runtime::ExpertFormat expert_format = runtime::ExpertFormat::Bf16;
  if (!runtime::parse_expert_format(experts, expert_format))
    throw UsageError(fmt::format("--expert-format must be bf16, mxfp4 or both, got '{}'", experts));

  const std::string precision = args.get("--gemm-precision", "bf16");
  if (precision != "split" && precision != "bf16")
    throw UsageError(fmt::format("--gemm-precision must be split or bf16, got '{}'", precision));
  // cuBLAS for the dense projections of prompt steps wherever it can serve them (plain bf16
  // activations on sm_90): pp512 +11%, pp2048 +5% on the 20b, decode unchanged (docs/PERF.md
  // session 11).
  const bool cublas_fits = precision == "bf16" && arch == "sm_90";
  const std::string dense = args.get("--dense-gemm", cublas_fits ? "cublas" : "wg");
  if (dense != "wg" && dense != "cublas")
    throw UsageError(fmt::format("--dense-gemm must be wg or cublas, got '{}'", dense));
  if (dense == "cublas" && (precision == "split" || arch != "sm_90"))
    throw UsageError("--dense-gemm cublas needs --gemm-precision bf16 and an sm_90 plan");

  Progress progress("compile");
  progress.step(fmt::format("reading {}", config_file.string()));
  models::ModelConfig cfg = models::ModelConfig::load(config_file);
  if (max_seq > cfg.max_position_embeddings)
    throw UsageError(fmt::format("--max-seq {} exceeds the model's max_position_embeddings {}",
                                 max_seq, cfg.max_position_embeddings));
  progress.finish(
      fmt::format("{} layers, {} experts", cfg.num_hidden_layers, cfg.num_local_experts));

  // With weights present, check them now from the safetensors headers alone (the tensor bytes,
  // 13.8 GB for 20b, are only hashed here, never parsed); a directory with only config.json
  // compiles too and its weights are checked when the plan runs.
  std::vector<runtime::PlanWeightFile> weight_files;
  const bool has_weights =
      fs::is_directory(model) && (fs::exists(model / "model.safetensors") ||
                                  fs::exists(model / "model.safetensors.index.json"));
  if (has_weights) {
    progress.step("checking safetensors headers");
    models::Checkpoint ckpt =
        models::Checkpoint::open(model, {.map_data = false, .validate = true});
    uint64_t total = 0;
    std::vector<fs::path> paths;
    for (const auto& f : ckpt.files()) {
      weight_files.push_back({f.path().filename().string(),
                              f.file_size(),
                              runtime::sampled_file_digest(f.path()),
                              {}}); // sha256: the full read below
      paths.push_back(f.path());
      total += f.file_size();
    }
    progress.finish(fmt::format("{} tensors in {} file(s), {:.2f} GB", ckpt.tensor_names().size(),
                                ckpt.files().size(), static_cast<double>(total) / 1e9));
    // The one full read of the weights at compile: what `run --verify-weights` compares with.
    progress.step("hashing the safetensors files (SHA-256)");
    const std::vector<std::string> digests = runtime::full_file_digests(paths);
    for (size_t i = 0; i < digests.size(); ++i)
      weight_files[i].sha256 = digests[i];
    progress.finish();
  }

  progress.step("building the graph");
  models::BuildOptions bopts;
  bopts.last_logits_only = !args.has("--all-logits");
  const std::string kv = args.get("--kv-dtype", "f32");
  if (kv != "f32" && kv != "bf16")
    throw UsageError(fmt::format("--kv-dtype must be f32 or bf16, got '{}'", kv));
  bopts.kv_dtype = kv == "f32" ? ir::DType::F32 : ir::DType::BF16;
  ir::Graph g = models::build_gpt_oss(cfg, bopts);
  progress.finish(fmt::format("{} nodes", g.size()));

  compiler::PipelineOptions popts;
  popts.dump_after = args.list("--dump-after");
  popts.verify_after_all = args.has("--verify-after-all");
  popts.stop_after = static_cast<int>(args.get_int("--stop-after", -1, 0, 1000));
  popts.debug = env().debug;
  if (args.has("--dump-dir"))
    popts.dump_dir = args.get("--dump-dir");
  compiler::PassOptions pass_opts;
  pass_opts.pipeline_stages = static_cast<int>(args.get_int("--pp", 1, 1, runtime::kPlanMaxStages));
  compiler::PassManager pm(popts, pass_opts);
  pm.add_pipeline(args.get("--passes", compiler::kDefaultPipeline));
  progress.step(fmt::format("running {} passes", pm.passes().size()));
  if (!popts.dump_dir.empty()) {
    fs::create_directories(popts.dump_dir);
    std::ofstream(popts.dump_dir / "00_input.ir") << ir::print(g);
  }
  g = pm.run(std::move(g));
  ir::verify_or_throw(g, "after the pass pipeline");
  progress.finish(fmt::format("{} nodes", g.size()));

  // Activations for the largest step: a prefill chunk, or one token for each of max_batch
  // sequences, whichever holds more tokens.
  progress.step("planning activation memory");
  const compiler::MemoryPlan mem = compiler::plan_memory(
      g, {{models::dims::kTokens, std::max(chunk, max_batch)}, {models::dims::kSeqs, max_batch}});
  progress.finish(compiler::describe(mem));

  // Pipeline stages: contiguous layer ranges balanced by the cost model, send/recv between.
  compiler::Partition partition;
  if (pass_opts.pipeline_stages > 1) {
    progress.step(fmt::format("partitioning into {} pipeline stages", pass_opts.pipeline_stages));
    compiler::PartitionCostModel cost;
    if (expert_format != runtime::ExpertFormat::Bf16) { // decode reads the MXFP4 experts
      cost.mxfp4_read_bytes = 17.0 / 32.0;
      cost.mxfp4_held_bytes =
          expert_format == runtime::ExpertFormat::Both ? 2.0 + 17.0 / 32.0 : 17.0 / 32.0;
    }
    partition = compiler::partition_pipeline(
        g, pass_opts.pipeline_stages,
        {{models::dims::kCacheRows, max_batch}, {models::dims::kMaxSeq, max_seq}}, cost);
    progress.finish(fmt::format("imbalance {:.1f}%", partition.imbalance * 100));
  }

  if (emit == "ir") {
    std::cout << ir::print(g);
    return 0;
  }
  const fs::path plan_out = args.get("-o");
  progress.step(fmt::format("writing {}", plan_out.string()));
  PlanWriter writer(plan_out);
  const fs::path& plan = writer.dir();
  write_file(plan / "graph.ir", ir::print(g));
  runtime::Plan pf;
  pf.model_dir = fs::absolute(fs::is_directory(model) ? model : model.parent_path()).string();
  pf.model_digest = runtime::config_digest(config_file);
  pf.config = cfg.to_json();
  if (fs::is_directory(model) && fs::exists(model / "tokenizer.json"))
    pf.tokenizer = "tokenizer.json";
  pf.options = {.max_batch = max_batch,
                .max_seq = max_seq,
                .prefill_chunk = chunk,
                .pp = pass_opts.pipeline_stages,
                .last_logits_only = bopts.last_logits_only,
                .kv_dtype = kv == "bf16" ? runtime::KvDtype::Bf16 : runtime::KvDtype::F32,
                .gemm_split = precision == "split",
                .arch = arch,
                .expert_format = expert_format,
                .dense_cublas = dense == "cublas",
                .timeline = args.has("--timeline")};
  pf.weights = std::move(weight_files);
  pf.memory = {mem.arena_bytes, mem.peak_live, mem.unpacked,
               static_cast<int64_t>(mem.buffers.size())};
  pf.graph = "graph.ir";
  for (const auto& t : pm.timings())
    pf.passes.push_back({t.name, t.ms, t.changed});
  // One program per stage (graph.ir stays the whole model, which one device can also run).
  for (size_t i = 0; i < partition.stages.size(); ++i) {
    runtime::PlanStage st;
    st.graph = fmt::format("stage{}.ir", i);
    write_file(plan / st.graph, ir::print(partition.stages[i]));
    const compiler::StageInfo& in = partition.info[i];
    st.first_layer = in.first_layer;
    st.last_layer = in.last_layer;
    st.embedding = in.embedding;
    st.head = in.head;
    stage_transfers(partition.stages[i], st);
    st.weight_bytes = in.weight_bytes;
    st.kv_cache_bytes = in.kv_bytes;
    st.decode_bytes_per_token = in.decode_bytes;
    st.prefill_flops_per_token = in.prefill_flops;
    st.estimated_decode_ms = in.decode_seconds * 1e3;
    st.estimated_prefill_us_per_token = in.prefill_seconds * 1e6;
    st.activation_arena_bytes =
        compiler::plan_memory(
            partition.stages[i],
            {{models::dims::kTokens, std::max(chunk, max_batch)}, {models::dims::kSeqs, max_batch}})
            .arena_bytes;
    pf.stages.push_back(std::move(st));
  }
  pf.imbalance = partition.imbalance;
  progress.finish();
  const bool cubins = !args.has("--no-cubins");
  progress.step(cubins ? fmt::format("generating kernels and compiling them for {}", arch)
                       : std::string("generating kernels"));
  PlanKernelOptions ko;
  ko.arch = arch;
  ko.max_batch = max_batch;
  ko.max_seq = max_seq;
  ko.prefill_chunk = static_cast<int>(chunk);
  ko.cubins = cubins;
  ko.expert_format = expert_format;
  ko.gemm_split = pf.options.gemm_split;
  ko.wgmma = arch == "sm_90";
  ko.dense_cublas = pf.options.dense_cublas;
  ko.timeline = pf.options.timeline;
  PlanKernelsResult whole = write_plan_kernels(g, plan, ko);
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
  for (runtime::PlanStage& st : pf.stages)
    st.layout.expert_format = expert_format; // the upload follows it (the lowering did too)
  progress.finish(fmt::format("{} kernels, {} launches per decode step", pf.codegen.kernels.size(),
                              pf.codegen.launches_per_decode_step));
  progress.step("writing plan.json");
  pf.digests = runtime::digest_plan_files(plan); // run refuses a plan whose files changed since
  runtime::write_plan(plan, pf);
  writer.commit();
  progress.finish();
  std::fprintf(stderr, "[compile] done in %.1f ms\n", progress.total_ms());
  return 0;
}

} // namespace xserv::cli
