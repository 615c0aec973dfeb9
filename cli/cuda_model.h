// The CUDA engine: a fused gpt-oss graph lowered to generated kernels, run on one GPU.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cli/engine.h"
#include "runtime/plan.h"
#include "ir/graph.h"

struct CUstream_st; // cudaStream_t is CUstream_st*

namespace xserv::cli {

/// Rows of a pipeline stage's received values, by recv name: one row per token of the step.
using StageInputs = std::map<std::string, std::vector<std::vector<float>>>;

/// A CUDA stream (cudaStream_t) without including the CUDA headers here.
using Stream = ::CUstream_st*;

/// How a pipeline stage's boundary activations move on the device, sub-step by sub-step (NCCL
/// between ranks): the engine calls receive() for each recv value before a sub-step runs (fill
/// `bytes` at `dst` on `stream`), send() with its send value after it, and wait() instead of
/// synchronising the stream (a bounded wait that notices a dead peer).
struct StageTransport {
  std::function<void(const std::string& name, void* dst, size_t bytes, Stream stream)> receive;
  std::function<void(const void* src, size_t bytes, Stream stream)> send;
  std::function<void(Stream stream)> wait;
};

/// Default tokens per prefill sub-step of the CUDA model, and `xserv compile --prefill-chunk`'s
/// default for max-seq >= 2048: a serving step that mixes 64 decode tokens with four 512-token
/// prompts runs as one sub-step (docs/PERF.md, session 6: 1024 split it in two).
constexpr int kPrefillChunk = 2048;

/// How a CudaModel is built.
struct CudaModelOptions {
  /// Cubin cache; empty: $XSERV_KERNEL_CACHE, else $XDG_CACHE_HOME/xserv/kernels, else
  /// ~/.cache/xserv/kernels.
  std::filesystem::path cache_dir;
  bool quiet = false; ///< no "[cuda] ..." progress lines on stderr
  /// Debugging: give every activation its own buffer (no reuse), so debug_address() reads any
  /// value of the last sub-step after it ran.
  bool keep_activations = false;
  /// Decode sub-steps (one token per sequence) run as CUDA graphs, captured once per (batch
  /// size, attention key bucket) and replayed; off: every launch goes out eagerly. The
  /// environment variable XSERV_CUDA_GRAPHS=0 turns them off whatever this says.
  bool cuda_graphs = true;
  /// With cuda_graphs: capture the graph of every decode shape (batch 1..max_batch x attention
  /// key buckets up to max_seq) when the model loads, so no request waits for a capture.
  bool capture_at_start = true;
  /// Tokens per prefill sub-step (at least 8): steps of more than 8 tokens run the tensor-core
  /// gemm kernels; 8 keeps every step on the decode kernels. XSERV_PREFILL_CHUNK overrides it.
  int prefill_chunk = kPrefillChunk;
  /// Gemm activations as bf16 hi + lo pairs (about fp32 precision) rather than plain bf16;
  /// XSERV_GEMM_PRECISION=bf16 turns it off.
  bool gemm_split = true;
  /// The expert matrices on the device when the model lowers its graph itself (graph mode); a
  /// plan's stage layout says it in plan mode (compile --expert-format).
  runtime::ExpertFormat expert_format = runtime::ExpertFormat::Bf16;
  /// Kernels launch with programmatic dependent launch on sm_90 and newer (each grid is
  /// scheduled while the previous one drains; every generated kernel first waits for it).
  /// XSERV_PDL=0 turns it off.
  bool dependent_launch = true;
  /// The plan being run: when the run's sizes and options are the ones it was compiled for,
  /// the engine replays the plan's launch table (plan.json) with the plan's cubins
  /// (kernels/NAME.cubin, compiled again from kernels/NAME.cu through the kernel cache when
  /// absent or built for another GPU) instead of lowering the graph itself; otherwise it says
  /// why and lowers for the run. Empty: always lower.
  std::filesystem::path plan_dir;
  /// With plan_dir: a run whose max batch or max sequence is not the plan's is refused
  /// (UsageError naming the compile flags) instead of lowering the graph for it. The
  /// developer knobs XSERV_PREFILL_CHUNK and XSERV_GEMM_PRECISION still lower, saying why.
  bool plan_only = false;
};

/// Runs a gpt-oss graph on the GPU: weights in BF16 (MXFP4 experts dequantised), activations
/// fp32 in one planned arena, KV caches in the plan's dtype (fp32 by default). A step of more
/// tokens than the arena holds (step_token_capacity) runs as several consecutive sub-steps, which
/// is exact because attention reads the earlier sub-steps' keys from the cache.
class CudaModel : public Model {
public:
  /// Opens the checkpoint in `model_dir`, runs the default pass pipeline over `graph` (default:
  /// build_gpt_oss(config) with last-token logits), compiles its kernels and uploads the
  /// weights. Throws xserv::Error "no GPU: ..." without a usable GPU, and for graphs with ops
  /// it cannot lower.
  CudaModel(const std::filesystem::path& model_dir, int64_t max_batch, int64_t max_seq,
             const ir::Graph* graph = nullptr, const CudaModelOptions& options = {});
  ~CudaModel() override;
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  const models::ModelConfig& config() const override;
  int64_t max_batch() const override;
  int64_t max_seq() const override;
  std::string backend() const override { return "cuda"; }
  std::vector<std::vector<float>> step(const models::StepInput& in) override;
  /// Greedy tokens picked on the GPU (the plan's argmax kernel): only a few bytes per sequence
  /// come back.
  std::vector<int32_t> step_greedy(const models::StepInput& in) override;
  /// Greedy picks on the GPU for every sequence, and only the wanted logits rows copied back.
  engine::StepOutput step_mixed(const models::StepInput& in,
                                const std::vector<bool>& need_logits) override;
  /// Every row the graph returns, sub-steps concatenated: one per token, in the step's
  /// flattened order, for a graph built with last_logits_only = false.
  std::vector<std::vector<float>> step_all(const models::StepInput& in);
  /// For a pipeline stage's graph: runs the step with `inputs` (per recv name, one row per token
  /// of the step in its flattened order) in the recv buffers, and returns every token's row of
  /// the output (what the stage sends on), or one row per sequence for the last stage's logits.
  std::vector<std::vector<float>> step_stage(const models::StepInput& in,
                                             const StageInputs& inputs);
  /// step_stage for the last stage, returning each sequence's greedy token (picked on the GPU)
  /// instead of its logits.
  std::vector<int32_t> step_stage_greedy(const models::StepInput& in, const StageInputs& inputs);
  /// A pipeline stage's step with its boundary activations moved by `transport` on the device.
  /// The last stage returns its logits rows, one per sequence, or with `greedy` nothing and the
  /// sequences' greedy tokens in `*greedy`; a stage that sends returns empty rows.
  std::vector<std::vector<float>> step_stage_device(const models::StepInput& in,
                                                    const StageTransport& transport,
                                                    std::vector<int32_t>* greedy = nullptr);
  void reset() override;
  void synchronize() override;
  double peak_memory_gib() const override;
  /// CUDA events on the engine's stream.
  std::unique_ptr<Stopwatch> stopwatch() override;
  /// Whether the engine replays the plan's launch table and cubins (CudaModelOptions::plan_dir)
  /// rather than a lowering of its own.
  bool replays_plan() const;
  /// How many CUDA graphs the engine has captured so far (0 with cuda_graphs off).
  size_t graphs_captured() const;
  /// Whether the graph ends in per-sequence logits with the sampling epilogue, so greedy steps
  /// pick on the GPU (step_greedy, step_stage_device with `greedy`).
  bool picks_greedy() const;

  /// Device address of the buffer holding value `v` (result `r`) of the engine's graph, for
  /// tests that compare intermediate activations; valid until the next step.
  const void* debug_address(int v, int r = 0) const;
  /// The graph the engine runs (after the pass pipeline).
  const ir::Graph& graph() const;

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace xserv::cli
