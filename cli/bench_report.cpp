// Statistics and rendering of benchmark rows, in the shape llama-bench prints them.
#include "cli/bench_report.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "models/checkpoint.h"

namespace xserv::cli {

BenchModel describe_model(const models::ModelConfig& cfg, const std::string& backend,
                          double expert_dtype_bytes) {
  BenchModel m;
  m.backend = backend;
  double params = 0, bytes = 0;
  for (const auto& t : models::expected_tensors(cfg)) {
    double n = 1;
    for (int64_t d : t.shape)
      n *= static_cast<double>(d);
    if (t.name.ends_with("_blocks")) { // 16 bytes hold 32 expert values
      params += n * 2;
      bytes += n * 2 * expert_dtype_bytes;
    } else if (t.name.ends_with("_scales")) {
      continue;
    } else {
      params += n;
      bytes += n * 2;
    }
  }
  m.params_b = params / 1e9;
  m.size_gib = bytes / (1024.0 * 1024 * 1024);
  const double b = m.params_b;
  m.name = fmt::format("gpt-oss {}",
                       b >= 1 ? fmt::format("{:.0f}B", b) : fmt::format("{:.0f}M", b * 1e3));
  return m;
}

namespace {

std::string md(const BenchModel& m, const std::vector<BenchRow>& rows) {
  const bool batched =
      std::any_of(rows.begin(), rows.end(), [](const BenchRow& r) { return r.batch > 1; });
  std::string out = fmt::format("| {:<14} | {:>10} | {:>8} | {:<7} | {:>18} | {:>18} | {:>9} |",
                                "model", "size", "params", "backend", "test", "t/s", "peak mem");
  if (batched)
    out += fmt::format(" {:>10} | {:>10} | {:>10} |", "TTFT ms", "TPOT ms", "TPOT p99");
  out += "\n|" + std::string(16, '-') + "|" + std::string(11, '-') + ":|" + std::string(9, '-') +
         ":|" + std::string(9, '-') + "|" + std::string(19, '-') + ":|" + std::string(19, '-') +
         ":|" + std::string(10, '-') + ":|";
  if (batched)
    out += std::string(11, '-') + ":|" + std::string(11, '-') + ":|" + std::string(11, '-') + ":|";
  out += "\n";
  for (const auto& r : rows) {
    std::string mem = r.peak_memory_gib < 0 ? "-" : fmt::format("{:.2f} GiB", r.peak_memory_gib);
    out += fmt::format("| {:<14} | {:>6.2f} GiB | {:>7.2f}B | {:<7} | {:>18} | {:>18} | {:>9} |",
                       m.name, m.size_gib, m.params_b, m.backend, r.test,
                       fmt::format("{:.2f} ± {:.2f}", mean(r.tokens_per_s), stddev(r.tokens_per_s)),
                       mem);
    if (batched) {
      if (r.batch > 1)
        out += fmt::format(" {:>10.2f} | {:>10.2f} | {:>10.2f} |", r.ttft_ms_median,
                           r.tpot_ms_median, r.tpot_ms_p99);
      else
        out += fmt::format(" {:>10} | {:>10} | {:>10} |", "-", "-", "-");
    }
    out += "\n";
  }
  return out;
}

} // namespace

std::string render_bench(const BenchModel& m, const std::vector<BenchRow>& rows,
                         const std::string& format) {
  if (format == "md")
    return md(m, rows);
  if (format == "json") {
    nlohmann::json doc = {{"model", m.name},
                          {"size_gib", m.size_gib},
                          {"params_b", m.params_b},
                          {"backend", m.backend},
                          {"results", nlohmann::json::array()}};
    for (const auto& r : rows)
      doc["results"].push_back({{"test", r.test},
                                {"n_prompt", r.prompt},
                                {"n_gen", r.gen},
                                {"n_depth", r.depth},
                                {"n_batch", r.batch},
                                {"samples_ts", r.tokens_per_s},
                                {"avg_ts", mean(r.tokens_per_s)},
                                {"stddev_ts", stddev(r.tokens_per_s)},
                                {"ttft_ms_median", r.ttft_ms_median},
                                {"tpot_ms_median", r.tpot_ms_median},
                                {"tpot_ms_p99", r.tpot_ms_p99},
                                {"peak_memory_gib", r.peak_memory_gib}});
    return doc.dump(2) + "\n";
  }
  if (format == "csv") {
    std::string out = "model,size_gib,params_b,backend,test,n_prompt,n_gen,n_depth,n_batch,"
                      "avg_ts,stddev_ts,ttft_ms_median,tpot_ms_median,tpot_ms_p99,"
                      "peak_memory_gib\n";
    for (const auto& r : rows)
      out += fmt::format(
          "{},{:.4f},{:.4f},{},{},{},{},{},{},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f}\n", m.name,
          m.size_gib, m.params_b, m.backend, r.test, r.prompt, r.gen, r.depth, r.batch,
          mean(r.tokens_per_s), stddev(r.tokens_per_s), r.ttft_ms_median, r.tpot_ms_median,
          r.tpot_ms_p99, r.peak_memory_gib);
    return out;
  }
  throw UsageError(fmt::format("-o must be md, json or csv, got '{}'", format));
}

} // namespace xserv::cli
