// The CUDA model: one stage's launch table and cubins (a plan's, runtime/plan_stage.h) replayed
// on one GPU over the checkpoint's weights.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/cuda_options.h"
#include "engine/model.h"
#include "runtime/device_stage.h"
#include "runtime/plan_stage.h"

namespace xserv::engine {

/// Rows of a pipeline stage's received values, by recv name: one row per token of the step.
using StageInputs = std::map<std::string, std::vector<std::vector<float>>>;

using runtime::StageTransport;
using runtime::Stream;

/// Runs one stage program on the GPU: weights in BF16 (MXFP4 experts dequantised, or kept as the
/// layout says), activations fp32 in the layout's arena, KV caches as the layout shapes them. It
/// never runs a pass nor lowers: the program is all it knows of the graph (a plan's stage, or a
/// graph compiled in memory by the command line). A step of more tokens than the arena holds
/// (layout.tokens) runs as several consecutive sub-steps, which is exact because attention reads
/// the earlier sub-steps' keys from the cache.
class CudaModel : public Model {
public:
  /// Opens the checkpoint in `model_dir`, uploads the weights the layout names, allocates the
  /// arena and the caches for layout.max_batch x layout.max_seq and loads the program's cubins.
  /// Throws xserv::Error "no GPU: ..." without a usable GPU, and naming the weight or kernel
  /// that does not fit.
  CudaModel(const std::filesystem::path& model_dir, runtime::StageProgram program,
            const CudaModelOptions& options);
  ~CudaModel() override;
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  const models::ModelConfig& config() const override;
  int64_t max_batch() const override;
  int64_t max_seq() const override;
  const models::KvGeometry& kv_geometry() const override;
  std::string backend() const override { return "cuda"; }
  std::vector<std::vector<float>> step(const models::StepInput& in) override;
  /// Greedy tokens picked on the GPU (the plan's argmax kernel): only a few bytes per sequence
  /// come back.
  std::vector<int32_t> step_greedy(const models::StepInput& in) override;
  /// Greedy picks on the GPU for every sequence, and only the wanted logits rows copied back.
  StepOutput step_mixed(const models::StepInput& in, const std::vector<bool>& need_logits) override;
  /// Masked greedy picks on the GPU (the plan's masked pick, after the step's argmax): a masked
  /// sequence's mask goes up (25 KB for the 20b), its logits row stays there.
  StepOutput step_masked(const models::StepInput& in, const std::vector<bool>& need_logits,
                         const std::vector<bool>& masked, const MaskSource& masks) override;
  bool picks_masked() const override;
  /// Every row the graph returns, sub-steps concatenated: one per token, in the step's
  /// flattened order, for a graph built with last_logits_only = false.
  std::vector<std::vector<float>> step_all(const models::StepInput& in) override;
  bool all_rows() const override;
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
  /// CUDA events on the model's stream.
  std::unique_ptr<Stopwatch> stopwatch() override;
  /// How many CUDA graphs the model has captured so far (0 with cuda_graphs off).
  size_t graphs_captured() const;
  /// Whether the graph ends in per-sequence logits with the sampling epilogue, so greedy steps
  /// pick on the GPU (step_greedy, step_stage_device with `greedy`).
  bool picks_greedy() const;

  /// `count` floats of the activation arena from byte `offset` (a value's buffer: with a program
  /// compiled to keep every activation, any value of the last sub-step), copied back after the
  /// queued work. Throws xserv::Error for a range outside the arena.
  std::vector<float> read_activation(uint64_t offset, size_t count) const;

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace xserv::engine
