// make_local_cuda_pipeline(): CudaModel::step_stage_device chained through device copies, one
// boundary value per stage.
#include "engine/pipeline/local.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/error.h"
#include "engine/cuda_model.h"
#include "runtime/device_queue.h"

namespace xserv::engine::pipeline {
namespace {

class LocalCudaPipeline : public Model {
public:
  LocalCudaPipeline(const std::filesystem::path& model_dir,
                    std::vector<runtime::StageProgram> stages, const CudaModelOptions& options) {
    if (stages.empty())
      throw Error("a pipeline needs at least one stage");
    const size_t n = stages.size();
    std::string sent; // the name stage s - 1 sends on
    for (size_t s = 0; s < n; ++s) {
      runtime::StageProgram& p = stages[s];
      std::vector<std::string> received;
      for (const runtime::PlanTransfer& r : p.recvs)
        received.push_back(r.name);
      if (s == 0 ? !received.empty() : received != std::vector<std::string>{sent})
        throw Error(fmt::format("pipeline stage {} receives {} value(s) ({}) where the previous "
                                "stage sends '{}'; the same-device transport passes exactly one",
                                s, received.size(), fmt::join(received, ", "), sent));
      if (s + 1 < n) {
        if (p.sends.size() != 1 || !p.layout.output.sends)
          throw Error(fmt::format("pipeline stage {} sends {} values; the same-device transport "
                                  "passes exactly one",
                                  s, p.sends.size()));
        sent = p.sends[0].name;
      }
      std::fprintf(stderr, "[pipeline] stage %zu of %zu on this GPU\n", s, n);
      engines_.push_back(std::make_unique<CudaModel>(model_dir, std::move(p), options));
    }
    hops_ = std::vector<runtime::DeviceQueue>(n - 1);
  }

  const models::ModelConfig& config() const override { return engines_[0]->config(); }
  int64_t max_batch() const override { return engines_[0]->max_batch(); }
  int64_t max_seq() const override { return engines_[0]->max_seq(); }
  const models::KvGeometry& kv_geometry() const override { return engines_[0]->kv_geometry(); }
  std::string backend() const override { return "cuda"; }

  std::vector<std::vector<float>> step(const models::StepInput& in) override {
    run_sending_stages(in);
    return engines_.back()->step_stage_device(in, transport(engines_.size() - 1));
  }
  std::vector<int32_t> step_greedy(const models::StepInput& in) override {
    if (!engines_.back()->picks_greedy()) // e.g. a plan of every token's logits: pick on the host
      return Model::step_greedy(in);
    run_sending_stages(in);
    std::vector<int32_t> ids;
    engines_.back()->step_stage_device(in, transport(engines_.size() - 1), &ids);
    return ids;
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
    for (const runtime::DeviceQueue& q :
         hops_) // the staging buffers, grown to the largest sub-steps
      total += double(q.capacity()) / double(1ull << 30);
    return total;
  }

private:
  /// Stages 0 .. n-2 of one step, in order: each leaves its send value in hop s's queue.
  void run_sending_stages(const models::StepInput& in) {
    for (runtime::DeviceQueue& q : hops_)
      q.start_step();
    for (size_t s = 0; s + 1 < engines_.size(); ++s)
      engines_[s]->step_stage_device(in, transport(s));
  }
  /// Stage s receives from hop s - 1 and sends into hop s; wait() synchronises the stage's
  /// stream, so the next stage reads finished copies.
  StageTransport transport(size_t s) {
    StageTransport t;
    // The constructor checked that stage 0 receives nothing and the last stage sends nothing.
    t.receive = [this, s](const std::string&, void* dst, size_t bytes, Stream stream) {
      hops_[s - 1].pop(dst, bytes, stream);
    };
    t.send = [this, s](const void* src, size_t bytes, Stream stream) {
      hops_[s].push(src, bytes, stream);
    };
    t.wait = [](Stream stream) {
      runtime::synchronize_stream(stream, "finishing a pipeline stage's sub-step");
    };
    return t;
  }

  std::vector<std::unique_ptr<CudaModel>> engines_;
  std::vector<runtime::DeviceQueue> hops_; ///< hop s: stage s -> s + 1
};

} // namespace

std::unique_ptr<Model> make_local_cuda_pipeline(const std::filesystem::path& model_dir,
                                                std::vector<runtime::StageProgram> stages,
                                                const CudaModelOptions& options) {
  return std::make_unique<LocalCudaPipeline>(model_dir, std::move(stages), options);
}

} // namespace xserv::engine::pipeline
