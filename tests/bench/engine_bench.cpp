// The engine's host cost per step at scale, without a GPU: a serving workload (as `xserv bench
// --requests` makes it) through the Engine over a model that computes nothing, so every
// millisecond is the scheduler's, the KV pool's and the step input's. The model can also build
// what the CUDA model builds on the host before it launches a step (validate_step, the graph
// params of every sub-step), which the GPU then waits for.
//
//   build/tests/engine_bench [REQUESTS [CONCURRENCY [INPUT OUTPUT [MAX_SEQ [PREP]]]]]
//
// defaults 1024 256 512 256 8192 1: the c256 serving row's workload over a 20b-sized pool
// (72,715 blocks of 16 positions, a 128-position window).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/serving_load.h"
#include "engine/step_split.h"
#include "models/step.h"

using namespace xserv;

namespace {

class NullModel : public engine::Model {
public:
  NullModel(int64_t max_batch, int64_t max_seq, bool prep) : batch_(max_batch), seq_(max_seq),
                                                              prep_(prep) {
    config_.vocab_size = 201088;
    kv_.block_size = 16;
    kv_.table_blocks = kv_.blocks_for(max_seq);
    kv_.window = 128;
    kv_.blocks = 72715;
    kv_.window_blocks = 2 * max_batch * kv_.ring_blocks() + 2048 / 16 + 1;
  }
  const models::ModelConfig& config() const override { return config_; }
  int64_t max_batch() const override { return batch_; }
  int64_t max_seq() const override { return seq_; }
  const models::KvGeometry& kv_geometry() const override { return kv_; }
  std::string backend() const override { return "null"; }
  void reset() override {}
  std::vector<std::vector<float>> step(const models::StepInput& in) override {
    return std::vector<std::vector<float>>(in.tokens.size(),
                                           std::vector<float>(size_t(config_.vocab_size)));
  }
  std::vector<int32_t> step_greedy(const models::StepInput& in) override {
    const auto t0 = std::chrono::steady_clock::now();
    if (prep_) { // the CUDA model's host work before a launch (sub-steps of up to 2048 tokens)
      engine::validate_step(in, batch_, seq_, config_.vocab_size, kv_);
      for (const auto& pieces : engine::split_step(in, 2048))
        sink_ += models::step_params(engine::piece_step(in, pieces)).size();
    }
    prep_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count();
    std::vector<int32_t> ids;
    for (size_t b = 0; b < in.tokens.size(); ++b)
      ids.push_back(int32_t((in.ctx_lens[b] + int32_t(in.tokens[b].size())) % 1000 + 1000));
    return ids;
  }
  double prep_ms_ = 0;
  size_t sink_ = 0;

private:
  int64_t batch_, seq_;
  bool prep_;
  models::ModelConfig config_;
  models::KvGeometry kv_;
};

long arg(int argc, char** argv, int i, long fallback) {
  return argc > i ? std::strtol(argv[i], nullptr, 10) : fallback;
}

} // namespace

int main(int argc, char** argv) {
  engine::ServingOptions o;
  o.requests = arg(argc, argv, 1, 1024);
  o.concurrency = arg(argc, argv, 2, 256);
  o.input_len = arg(argc, argv, 3, 512);
  o.output_len = arg(argc, argv, 4, 256);
  const int64_t max_seq = arg(argc, argv, 5, 8192);
  const bool prep = arg(argc, argv, 6, 1) != 0;
  NullModel model(o.concurrency, max_seq, prep);
  o.vocab = 199998;
  engine::EngineOptions eo;
  eo.max_tokens_per_step = 8192;
  const engine::Workload w = engine::make_workload(o);
  engine::EngineStats st;
  double seconds = 0;
  engine::run_engine_load(model, w, o, eo, &st, &seconds);
  const double steps = double(std::max<int64_t>(st.steps, 1));
  std::printf("%lld requests of %lld + %lld at concurrency %lld, max_seq %lld: %lld steps in "
              "%.2f s\n",
              (long long)o.requests, (long long)o.input_len, (long long)o.output_len,
              (long long)o.concurrency, (long long)max_seq, (long long)st.steps, seconds);
  std::printf("engine host time per step: %.3f ms (scheduler, KV pool, tokens and events)\n",
              st.schedule_ms / steps);
  std::printf("model host time per step:  %.3f ms (%s)\n", st.model_ms / steps,
              prep ? "validate_step and the graph params, as the CUDA model builds them"
                   : "nothing");
  std::printf("of which step preparation: %.3f ms\n", model.prep_ms_ / steps);
  return model.sink_ == 0 && prep ? 1 : 0;
}
