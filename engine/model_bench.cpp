// ModelBench: the timed steps of `xserv bench`.
#include "engine/model_bench.h"

#include <algorithm>
#include <numeric>

namespace xserv::engine {

ModelBench::ModelBench(Model& m, uint64_t seed) : e_(m), rng_(seed), each_(m.stopwatch()) {}

ModelBench::~ModelBench() = default;

std::vector<int32_t> ModelBench::random_ids(int64_t n) {
  std::uniform_int_distribution<int32_t> u(0, static_cast<int32_t>(e_.config().vocab_size - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids)
    id = u(rng_);
  return ids;
}

models::StepInput ModelBench::fill(int64_t depth, int64_t batch, int64_t positions) {
  e_.reset();
  // Sequence b owns row b of the pools, as many blocks as its positions need
  // (models::row_tables): the depth, the tokens of the test and the one after.
  std::vector<int32_t> rows(static_cast<size_t>(batch));
  std::iota(rows.begin(), rows.end(), 0);
  const int64_t row_blocks = e_.kv_geometry().blocks_for(depth + positions);
  models::StepInput next;
  for (int64_t b = 0; b < batch; ++b) {
    next.tokens.push_back(random_ids(1));
    next.ctx_lens.push_back(static_cast<int32_t>(depth));
  }
  models::assign_rows(next, rows, e_.kv_geometry(), row_blocks);
  if (depth > 0) {
    models::StepInput pre;
    for (int64_t b = 0; b < batch; ++b) {
      pre.tokens.push_back(random_ids(depth));
      pre.ctx_lens.push_back(0);
    }
    pre.block_tables = next.block_tables;
    pre.window_tables = next.window_tables;
    e_.step_greedy(pre);
    e_.synchronize();
  }
  return next;
}

double ModelBench::prefill(int64_t p, int64_t depth) {
  models::StepInput in = fill(depth, 1, p);
  in.tokens[0] = random_ids(p);
  each_->start();
  e_.step_greedy(in);
  return static_cast<double>(p) / each_->stop() * 1e3;
}

double ModelBench::decode(int64_t n, int64_t depth, int64_t batch, std::vector<double>& step_ms,
                          double& ttft_ms) {
  models::StepInput in = fill(depth, batch, n + 1);
  if (depth == 0) { // the first token of each sequence is a 1-token prefill: that is TTFT
    each_->start();
    e_.step_greedy(in);
    ttft_ms = each_->stop();
    for (auto& c : in.ctx_lens)
      c += 1;
  }
  double total_ms = 0;
  for (int64_t i = 0; i < n; ++i) {
    each_->start();
    e_.step_greedy(in);
    const double step = each_->stop();
    step_ms.push_back(step);
    total_ms += step;
    // The next inputs are made between the timed steps.
    for (size_t b = 0; b < in.tokens.size(); ++b) {
      in.tokens[b] = random_ids(1);
      in.ctx_lens[b] += 1;
    }
  }
  return static_cast<double>(n * batch) / total_ms * 1e3;
}

double ModelBench::mixed(int64_t n, int64_t depth, int64_t batch, int64_t prompt,
                         std::vector<double>& step_ms) {
  // Sequence `batch` is the prompt's: blocks for its chunk after its own depth.
  models::StepInput in = fill(depth, batch + 1, std::max(n + 1, prompt));
  const size_t pb = static_cast<size_t>(batch);
  double total_ms = 0;
  for (int64_t i = 0; i < n; ++i) {
    in.tokens[pb] = random_ids(prompt);
    in.ctx_lens[pb] = static_cast<int32_t>(depth);
    each_->start();
    e_.step_greedy(in);
    const double step = each_->stop();
    step_ms.push_back(step);
    total_ms += step;
    for (size_t b = 0; b < pb; ++b) {
      in.tokens[b] = random_ids(1);
      in.ctx_lens[b] += 1;
    }
  }
  return static_cast<double>(n * batch) / total_ms * 1e3;
}

} // namespace xserv::engine
