// render_serving(): the serving report in md, json or csv.
#include "cli/serving_report.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/args.h"

namespace xserv::cli {

std::string render_serving(const engine::ServingReport& r, const engine::ServingOptions& o,
                           const std::string& target,
                           const std::vector<std::pair<std::string, std::string>>& extra,
                           const std::string& format) {
  std::vector<std::pair<std::string, std::string>> rows = {
      {"target", target},
      {"requests", std::to_string(r.requests)},
      {"concurrency", std::to_string(o.concurrency)},
      {"request rate (req/s)", o.rate > 0 ? fmt::format("{:g}", o.rate) : "inf"},
      {"input / output tokens",
       fmt::format("{} / {}{}", o.input_len, o.output_len,
                   o.len_range > 0 ? fmt::format(" (+-{:g}%)", 100 * o.len_range) : "")},
      {"shared prompt prefix (tokens)", std::to_string(o.shared_prefix)},
      {"turns per conversation", std::to_string(o.turns)},
      {"completed / failed", fmt::format("{} / {}", r.completed, r.failed)},
      {"disconnected on purpose", std::to_string(r.disconnected)},
      {"duration (s)", fmt::format("{:.2f}", r.duration_s)},
      {"request throughput (req/s)", fmt::format("{:.2f}", r.request_rate)},
      {"output token throughput (tok/s)", fmt::format("{:.1f}", r.output_tps)},
      {"total token throughput (tok/s)", fmt::format("{:.1f}", r.total_tps)}};
  auto add_dist = [&](const std::string& name, const engine::ServingReport::Dist& d) {
    rows.push_back({name + " mean (ms)", fmt::format("{:.2f}", d.mean)});
    rows.push_back({name + " median (ms)", fmt::format("{:.2f}", d.median)});
    rows.push_back({name + " p99 (ms)", fmt::format("{:.2f}", d.p99)});
  };
  add_dist("TTFT", r.ttft);
  add_dist("TPOT", r.tpot);
  add_dist("ITL", r.itl);
  add_dist("E2E", r.e2e);
  for (size_t t = 0; t < r.ttft_by_turn.size(); ++t)
    rows.push_back(
        {fmt::format("TTFT of turn {} median / p99 (ms)", t + 1),
         fmt::format("{:.2f} / {:.2f}", r.ttft_by_turn[t].median, r.ttft_by_turn[t].p99)});
  rows.insert(rows.end(), extra.begin(), extra.end());
  if (!r.first_error.empty())
    rows.push_back({"first error", r.first_error});
  if (format == "md") {
    std::string s = "| metric | value |\n| --- | ---: |\n";
    for (const auto& [k, v] : rows)
      s += fmt::format("| {} | {} |\n", k, v);
    return s;
  }
  if (format == "csv") {
    std::string s = "metric,value\n";
    for (const auto& [k, v] : rows)
      s += fmt::format("\"{}\",\"{}\"\n", k, v);
    return s;
  }
  if (format == "json") {
    nlohmann::ordered_json j;
    j["target"] = target;
    j["requests"] = r.requests;
    j["concurrency"] = o.concurrency;
    j["request_rate"] = o.rate;
    j["input_len"] = o.input_len;
    j["output_len"] = o.output_len;
    j["len_range"] = o.len_range;
    j["shared_prefix"] = o.shared_prefix;
    j["turns"] = o.turns;
    j["completed"] = r.completed;
    j["failed"] = r.failed;
    j["disconnected"] = r.disconnected;
    j["duration_s"] = r.duration_s;
    j["request_throughput"] = r.request_rate;
    j["output_throughput"] = r.output_tps;
    j["total_token_throughput"] = r.total_tps;
    for (const auto& [name, d] : {std::pair{"ttft", r.ttft}, std::pair{"tpot", r.tpot},
                                  std::pair{"itl", r.itl}, std::pair{"e2e", r.e2e}}) {
      j[std::string("mean_") + name + "_ms"] = d.mean;
      j[std::string("median_") + name + "_ms"] = d.median;
      j[std::string("p99_") + name + "_ms"] = d.p99;
    }
    nlohmann::ordered_json turns = nlohmann::ordered_json::array();
    for (const auto& d : r.ttft_by_turn)
      turns.push_back({{"median_ttft_ms", d.median}, {"p99_ttft_ms", d.p99}});
    if (!turns.empty())
      j["ttft_by_turn"] = std::move(turns);
    for (const auto& [k, v] : extra)
      j[k] = v;
    if (!r.first_error.empty())
      j["first_error"] = r.first_error;
    return j.dump(2) + "\n";
  }
  throw UsageError(fmt::format("-o must be md, json or csv, got '{}'", format));
}

} // namespace xserv::cli
