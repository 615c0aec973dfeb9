// Benchmark results and their llama-bench-shaped rendering as a Markdown table, JSON or CSV.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/stats.h"
#include "models/config.h"

namespace xserv::cli {

/// One measured test ("pp512", "tg128 @ d4096", "tg128 x B64").
struct BenchRow {
  std::string test;
  int64_t prompt = 0, gen = 0, depth = 0, batch = 1;
  std::vector<double> tokens_per_s; ///< one entry per timed repeat
  // Batched decode only: time to first token and time per output token, in ms.
  double ttft_ms_median = 0, tpot_ms_median = 0, tpot_ms_p99 = 0;
  double peak_memory_gib = -1; ///< -1 when the backend cannot tell
};

struct BenchModel {
  std::string name;    ///< "gpt-oss 20B"
  double size_gib = 0; ///< weights as the backend holds them
  double params_b = 0; ///< parameters, in billions
  std::string backend;
};

/// Describes a model from its config: name from layers/experts, parameter count and size of the
/// weights with experts held as `expert_dtype_bytes` bytes per value (2 for BF16).
BenchModel describe_model(const models::ModelConfig& cfg, const std::string& backend,
                          double expert_dtype_bytes);

/// Renders rows as "md" (llama-bench's table), "json" or "csv". Throws UsageError for others.
std::string render_bench(const BenchModel& model, const std::vector<BenchRow>& rows,
                         const std::string& format);

} // namespace xserv::cli
