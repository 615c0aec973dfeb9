// The CPU reference engine: the IR interpreter over a checkpoint's weights, with a KV cache.
#pragma once

#include <filesystem>
#include <memory>

#include "engine/model.h"
#include "ir/graph.h"
#include "ir/interpreter.h"
#include "models/checkpoint.h"

#include <map>
#include <string_view>
#include <vector>

namespace xserv::engine {

/// Runs build_gpt_oss()'s graph (or a compiled plan's graph.ir) on the interpreter in fp32.
/// Slow by design; it is the reference the GPU path is checked against and the fallback when
/// there is no GPU.
class CpuModel : public Model {
public:
  /// Opens and validates the checkpoint in `model_dir` (weights are memory-mapped and decoded
  /// lazily, each once). `graph` defaults to build_gpt_oss(config) with last-token logits.
  /// With `stages` (a --pp plan's stage*.ir) every step runs them one after another, each
  /// stage's sends passed to the next (ir::interpret_stages); `graph` is then unused. The KV
  /// pools hold `kv_blocks` and `window_blocks` blocks; 0: max_batch sequences of max_seq
  /// positions as far as 256 MiB of host memory go (at least one), and the null block.
  CpuModel(const std::filesystem::path& model_dir, int64_t max_batch, int64_t max_seq,
           const ir::Graph* graph = nullptr, std::vector<ir::Graph> stages = {},
           int64_t kv_blocks = 0, int64_t window_blocks = 0);

  const models::ModelConfig& config() const override { return ckpt_.config(); }
  int64_t max_batch() const override { return max_batch_; }
  int64_t max_seq() const override { return max_seq_; }
  const models::KvGeometry& kv_geometry() const override { return kv_; }
  std::string backend() const override { return "cpu"; }
  std::vector<std::vector<float>> step(const models::StepInput& in) override;
  /// A graph without the logits' row selection (--all-logits) and no pipeline stages.
  bool all_rows() const override { return all_rows_; }
  std::vector<std::vector<float>> step_all(const models::StepInput& in) override;
  void reset() override { env_.state.clear(); }
  /// Runs `g` (a pipeline stage) on `params` with this engine's weights and KV caches.
  std::vector<ir::Tensor> run_graph(const ir::Graph& g, std::map<std::string, ir::Tensor> params);

private:
  /// Checks the step, makes its block copies and runs the graph (or the stages) over it.
  std::vector<ir::Tensor> run_step(const models::StepInput& in);
  /// The step's block copies, in the caches of each copy's pool.
  void copy_blocks(const std::vector<models::StepInput::BlockCopy>& copies);

  models::Checkpoint ckpt_;
  ir::Graph graph_;
  std::vector<ir::Graph> stages_;
  int64_t max_batch_, max_seq_;
  models::KvGeometry kv_;
  ir::InterpretEnv env_;
  std::map<std::string, bool> window_cache_; ///< cache name: pages from the window pool
  bool all_rows_ = false;
};

/// One row of `logits` per sequence: row b, or row logit_rows[b] when the graph returned every
/// token's logits (--all-logits).
std::vector<std::vector<float>> sequence_logits(const ir::Tensor& logits, size_t seqs,
                                                const ir::Tensor& logit_rows);

} // namespace xserv::engine
