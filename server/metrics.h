// Prometheus metrics of `xserv serve`: latency histograms, token counters, finish reasons.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace xserv::server {

/// A cumulative histogram with fixed upper bounds, as Prometheus exposes it.
class Histogram {
public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  /// `name_bucket{le="..."}`, `name_sum` and `name_count` lines (with HELP and TYPE).
  std::string render(const std::string& name, const std::string& help) const;
  uint64_t count() const { return count_; }

private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_; ///< per bucket, not cumulative; last: +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

/// What one finished request contributes to the metrics.
struct RequestRecord {
  double ttft_s = -1;        ///< time to first token; < 0 when none came
  double queue_s = -1;       ///< time queued before a step first took it; < 0 when unknown
  std::vector<double> itl_s; ///< gaps between consecutive tokens
  double e2e_s = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0;
  std::string finish; ///< stop, length, tool_calls, abort, error
};

/// Thread-safe request metrics plus the engine's gauges at render time.
class ServeMetrics {
public:
  ServeMetrics();
  void record(const RequestRecord& r);
  /// A client went away before its request finished (the request was aborted).
  void count_disconnect();
  /// The Prometheus text exposition (version 0.0.4): xserv:time_to_first_token_seconds,
  /// xserv:inter_token_latency_seconds, xserv:e2e_request_latency_seconds,
  /// xserv:request_queue_time_seconds,
  /// xserv:num_requests_running / _waiting, the KV pools (xserv:kv_blocks_total /
  /// _in_use, the window pool's, cached free blocks, xserv:kv_cache_usage_perc), the prefix
  /// cache (xserv:prefix_cache_queries_total / _hits_total / _evictions_total),
  /// xserv:num_preemptions_total,
  /// xserv:prompt_tokens_total, xserv:generation_tokens_total,
  /// xserv:request_success_total{finished_reason} and xserv:client_disconnects_total.
  std::string render(const engine::EngineStats& stats) const;

private:
  mutable std::mutex mu_;
  Histogram ttft_, itl_, e2e_, queue_;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0;
  std::map<std::string, int64_t> finished_;
  int64_t disconnects_ = 0;
};

} // namespace xserv::server
