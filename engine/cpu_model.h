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
  /// stage's sends passed to the next (ir::interpret_stages); `graph` is then unused.
  CpuModel(const std::filesystem::path& model_dir, int64_t max_batch, int64_t max_seq,
           const ir::Graph* graph = nullptr, std::vector<ir::Graph> stages = {});

  const models::ModelConfig& config() const override { return ckpt_.config(); }
  int64_t max_batch() const override { return max_batch_; }
  int64_t max_seq() const override { return max_seq_; }
  std::string backend() const override { return "cpu"; }
  std::vector<std::vector<float>> step(const models::StepInput& in) override;
  void reset() override { env_.state.clear(); }
  /// Runs `g` (a pipeline stage) on `params` with this engine's weights and KV caches.
  std::vector<ir::Tensor> run_graph(const ir::Graph& g, std::map<std::string, ir::Tensor> params);

private:
  models::Checkpoint ckpt_;
  ir::Graph graph_;
  std::vector<ir::Graph> stages_;
  int64_t max_batch_, max_seq_;
  ir::InterpretEnv env_;
};

/// One row of `logits` per sequence: row b, or row logit_rows[b] when the graph returned every
/// token's logits (--all-logits).
std::vector<std::vector<float>> sequence_logits(const ir::Tensor& logits, size_t seqs,
                                                const ir::Tensor& logit_rows);

} // namespace xserv::engine
