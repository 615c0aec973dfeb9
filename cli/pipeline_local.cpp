// make_local_cuda_pipeline(): CudaEngine::step_stage chained, one boundary value per stage.
#include "cli/pipeline_local.h"

#include <fmt/format.h>

#include "cli/cuda_engine.h"
#include "ir/error.h"

namespace xserv::cli {
namespace {

class LocalCudaPipeline : public Engine {
public:
  LocalCudaPipeline(const std::filesystem::path& model_dir, int64_t max_batch, int64_t max_seq,
                    const std::vector<ir::Graph>& stages) {
    if (stages.empty())
      throw Error("a pipeline needs at least one stage");
    for (size_t s = 0; s < stages.size(); ++s) {
      const ir::Graph& g = stages[s];
      if (s + 1 < stages.size()) {
        if (g.outputs.size() != 1 || g.node(g.outputs[0]).op != ir::Op::Send)
          throw Error(fmt::format("pipeline stage {} sends {} values; the same-device transport "
                                  "passes exactly one",
                                  s, g.outputs.size()));
        sends_.push_back(g.node(g.outputs[0]).attr_str("name"));
      }
      std::fprintf(stderr, "[pipeline] stage %zu of %zu on this GPU\n", s, stages.size());
      engines_.push_back(
          std::make_unique<CudaEngine>(model_dir, max_batch, max_seq, &g, CudaEngineOptions{}));
    }
  }

  const models::ModelConfig& config() const override { return engines_[0]->config(); }
  int64_t max_batch() const override { return engines_[0]->max_batch(); }
  int64_t max_seq() const override { return engines_[0]->max_seq(); }
  std::string backend() const override { return "cuda"; }

  std::vector<std::vector<float>> step(const models::StepInput& in) override {
    StageInputs inputs;
    for (size_t s = 0; s + 1 < engines_.size(); ++s) {
      std::vector<std::vector<float>> rows = engines_[s]->step_stage(in, inputs);
      inputs.clear();
      inputs[sends_[s]] = std::move(rows);
    }
    return engines_.back()->step_stage(in, inputs);
  }

  void reset() override {
    for (auto& e : engines_)
      e->reset();
  }
  void synchronize() override {
    for (auto& e : engines_)
      e->synchronize();
  }
  double peak_memory_gib() const override {
    double total = 0;
    for (const auto& e : engines_)
      total += e->peak_memory_gib();
    return total;
  }

private:
  std::vector<std::unique_ptr<CudaEngine>> engines_;
  std::vector<std::string> sends_; ///< what stage s sends on
};

} // namespace

std::unique_ptr<Engine> make_local_cuda_pipeline(const std::filesystem::path& model_dir,
                                                 int64_t max_batch, int64_t max_seq,
                                                 const std::vector<ir::Graph>& stages) {
  return std::make_unique<LocalCudaPipeline>(model_dir, max_batch, max_seq, stages);
}

} // namespace xserv::cli
