// The engine's host cost per step at scale, without a GPU: a serving workload (as `xserv bench
// --requests` makes it) through the Engine over a model that computes nothing, so every
// millisecond is the scheduler's, the KV pool's and the step input's. The model can also build
// what the CUDA model builds on the host before it launches a step (validate_step, the graph
// params of every sub-step), which the GPU then waits for.
//
//   build/tests/engine_bench [REQUESTS [CONCURRENCY [INPUT OUTPUT [MAX_SEQ [PREP]]]]]
//                            [--modeled] [--itl-factor F] [--itl-target MS] [--itl-tail Q]
//                            [--prefill-budget N] [--backlog-steps N]
//
// defaults 1024 256 512 256 8192 1: the c256 serving row's workload over a 20b-sized pool
// (72,715 blocks of 16 positions, a 128-position window).
//
// --modeled: each step also lasts what the synthetic 20b's step of its shape takes on an H100
// (kModeled below, from `xserv bench` rows), so that the serving report (TTFT, ITL, tok/s) shows
// what a scheduling policy does to the latencies without a GPU: the scheduler's flags as
// `serve` takes them. The model's figures are the GPU's; check a policy there before relying
// on it.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "engine/serving_load.h"
#include "engine/step_split.h"
#include "models/step.h"

using namespace xserv;

namespace {

/// The synthetic 20b's step times on an H100 (2026-12-06, `xserv bench` on the default plan):
/// decode steps of B sequences at depth 512 (tg128, and tg32 @ d512 x B for the rest; log2
/// interpolation between), a prompt alone 3.7 + 0.0231 ms a token (pp512 33.0k, pp2048 43.3k
/// tok/s), and a prompt beside decodes 0.63 + 0.0195 ms a token more (B64 + p64 11.46 ms,
/// B64 + p512 20.2 against B64 9.6).
struct StepCost {
  static constexpr double kDecode[][2] = {{1, 1.90},  {7, 4.89},    {8, 5.11},
                                          {64, 9.60}, {128, 11.10}, {256, 14.30}};
  static double decode_ms(double b) {
    constexpr size_t n = sizeof(kDecode) / sizeof(kDecode[0]);
    if (b <= kDecode[0][0])
      return kDecode[0][1];
    for (size_t i = 1; i < n; ++i)
      if (b <= kDecode[i][0]) {
        const double t =
            std::log2(b / kDecode[i - 1][0]) / std::log2(kDecode[i][0] / kDecode[i - 1][0]);
        return kDecode[i - 1][1] + t * (kDecode[i][1] - kDecode[i - 1][1]);
      }
    return kDecode[n - 1][1] * b / kDecode[n - 1][0];
  }
  static double ms(int64_t decodes, int64_t prompt) {
    if (decodes == 0)
      return prompt > 0 ? 3.7 + 0.0231 * double(prompt) : 0.0;
    return decode_ms(double(decodes)) + (prompt > 0 ? 0.63 + 0.0195 * double(prompt) : 0.0);
  }
};

class NullModel : public engine::Model {
public:
  NullModel(int64_t max_batch, int64_t max_seq, bool prep, bool modeled)
      : batch_(max_batch), seq_(max_seq), prep_(prep), modeled_(modeled) {
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
    prep_ms_ +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (modeled_) { // the step lasts what the GPU's would
      int64_t decodes = 0, prompt = 0;
      for (const auto& t : in.tokens)
        (t.size() == 1 ? decodes : prompt) += int64_t(t.size());
      std::this_thread::sleep_until(
          t0 + std::chrono::duration<double, std::milli>(StepCost::ms(decodes, prompt)));
    }
    std::vector<int32_t> ids;
    for (size_t b = 0; b < in.tokens.size(); ++b)
      ids.push_back(int32_t((in.ctx_lens[b] + int32_t(in.tokens[b].size())) % 1000 + 1000));
    return ids;
  }
  double prep_ms_ = 0;
  size_t sink_ = 0;

private:
  int64_t batch_, seq_;
  bool prep_, modeled_;
  models::ModelConfig config_;
  models::KvGeometry kv_;
};

/// The positional arguments and the named flags, apart.
struct Args {
  std::vector<const char*> pos;
  bool modeled = false;
  engine::EngineOptions eo;
};

Args parse(int argc, char** argv) {
  Args a;
  a.eo.max_tokens_per_step = 8192;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    const bool value = i + 1 < argc;
    if (f == "--modeled")
      a.modeled = true;
    else if (f == "--itl-factor" && value)
      a.eo.itl_factor = std::strtod(argv[++i], nullptr);
    else if (f == "--itl-tail" && value)
      a.eo.itl_tail = std::strtod(argv[++i], nullptr);
    else if (f == "--itl-target" && value)
      a.eo.itl_target_ms = std::strtod(argv[++i], nullptr);
    else if (f == "--prefill-budget" && value)
      a.eo.prefill_budget = std::strtol(argv[++i], nullptr, 10);
    else if (f == "--backlog-steps" && value)
      a.eo.backlog_steps = std::strtol(argv[++i], nullptr, 10);
    else
      a.pos.push_back(argv[i]);
  }
  return a;
}

long arg(const Args& a, size_t i, long fallback) {
  return a.pos.size() > i ? std::strtol(a.pos[i], nullptr, 10) : fallback;
}

} // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  engine::ServingOptions o;
  o.requests = arg(a, 0, 1024);
  o.concurrency = arg(a, 1, 256);
  o.input_len = arg(a, 2, 512);
  o.output_len = arg(a, 3, 256);
  const int64_t max_seq = arg(a, 4, 8192);
  const bool prep = arg(a, 5, 1) != 0;
  NullModel model(o.concurrency, max_seq, prep, a.modeled);
  o.vocab = 199998;
  const engine::Workload w = engine::make_workload(o);
  engine::EngineStats st;
  double seconds = 0;
  const std::vector<engine::RequestRecord> rec =
      engine::run_engine_load(model, w, o, a.eo, &st, &seconds);
  const double steps = double(std::max<int64_t>(st.steps, 1));
  std::printf("%lld requests of %lld + %lld at concurrency %lld, max_seq %lld: %lld steps in "
              "%.2f s\n",
              (long long)o.requests, (long long)o.input_len, (long long)o.output_len,
              (long long)o.concurrency, (long long)max_seq, (long long)st.steps, seconds);
  std::printf("engine host time per step: %.3f ms (scheduler, KV pool, tokens and events)\n",
              st.schedule_ms / steps);
  std::printf("model host time per step:  %.3f ms (%s)\n", st.model_ms / steps,
              a.modeled ? "the modeled GPU time"
              : prep    ? "validate_step and the graph params, as the CUDA model builds them"
                        : "nothing");
  std::printf("of which step preparation: %.3f ms\n", model.prep_ms_ / steps);
  if (a.modeled) {
    const engine::ServingReport r = engine::summarize(rec, seconds);
    std::printf("modeled H100: %.0f output tok/s, TTFT median / p99 %.0f / %.0f ms, ITL median / "
                "p99 %.2f / %.2f ms, %lld of %lld completed\n",
                r.output_tps, r.ttft.median, r.ttft.p99, r.itl.median, r.itl.p99,
                (long long)r.completed, (long long)r.requests);
  }
  return model.sink_ == 0 && prep ? 1 : 0;
}
