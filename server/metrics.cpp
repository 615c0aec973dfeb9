// Prometheus text exposition of the server's histograms, counters and engine gauges.
#include "server/metrics.h"

#include <fmt/format.h>

namespace xserv::server {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i])
    ++i;
  ++counts_[i];
  sum_ += value;
  ++count_;
}

std::string Histogram::render(const std::string& name, const std::string& help) const {
  std::string out = fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cum);
  }
  cum += counts_.back();
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, cum, name, sum_,
                     name, count_);
  return out;
}

ServeMetrics::ServeMetrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,  0.75,
             1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0}),
      itl_({0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
            0.1,   0.15,   0.2,   0.3,  0.4,   0.5,  0.75,  1.0,  2.5,  5.0}),
      e2e_({0.3,  0.5,  0.8,  1.0,  1.5,  2.0,   2.5,   5.0,   10.0,  15.0,
            20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0}),
      queue_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,  0.75,
              1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0}) {
  for (const char* r : {"stop", "length", "tool_calls", "abort", "error"})
    finished_[r] = 0;
}

void ServeMetrics::record(const RequestRecord& r) {
  std::lock_guard<std::mutex> lock(mu_);
  if (r.ttft_s >= 0)
    ttft_.observe(r.ttft_s);
  if (r.queue_s >= 0)
    queue_.observe(r.queue_s);
  for (double x : r.itl_s)
    itl_.observe(x);
  e2e_.observe(r.e2e_s);
  prompt_tokens_ += r.prompt_tokens;
  generation_tokens_ += r.generated_tokens;
  ++finished_[r.finish];
}

void ServeMetrics::count_disconnect() {
  std::lock_guard<std::mutex> lock(mu_);
  ++disconnects_;
}

std::string ServeMetrics::render(const engine::EngineStats& st) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  auto gauge = [&](const char* name, const char* help, double v) {
    out += fmt::format("# HELP xserv:{} {}\n# TYPE xserv:{} gauge\nxserv:{} {}\n", name, help, name,
                       name, v);
  };
  auto counter = [&](const char* name, const char* help, double v) {
    out += fmt::format("# HELP xserv:{} {}\n# TYPE xserv:{} counter\nxserv:{} {}\n", name, help,
                       name, name, v);
  };
  gauge("num_requests_running", "Sequences holding KV blocks (prefill or decode).",
        double(st.running));
  gauge("num_requests_waiting", "Sequences queued, or preempted and waiting to be recomputed.",
        double(st.waiting));
  gauge("kv_block_size", "Positions per KV block.", double(st.kv_block_size));
  gauge("kv_blocks_total", "Blocks of the full-attention KV pool.", double(st.kv_blocks));
  gauge("kv_blocks_in_use", "Full-attention KV blocks held by running sequences.",
        double(st.kv_blocks_used));
  gauge("kv_window_blocks_total", "Blocks of the sliding-window KV pool.",
        double(st.kv_window_blocks));
  gauge("kv_window_blocks_in_use", "Sliding-window KV blocks held by running sequences.",
        double(st.kv_window_blocks_used));
  gauge("kv_cached_blocks_free", "Free blocks still holding a cached prefix (evictable).",
        double(st.kv_cached_free));
  gauge("kv_cache_usage_perc", "Fraction of the full-attention KV pool in use.",
        st.kv_blocks ? double(st.kv_blocks_used) / double(st.kv_blocks) : 0.0);
  counter("prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
          double(st.prefix_queries));
  counter("prefix_cache_hits_total", "Prompt tokens found in the prefix cache (not computed).",
          double(st.prefix_hits));
  counter("prefix_cache_evictions_total", "Cached prefix blocks evicted for new ones.",
          double(st.prefix_evictions));
  counter("num_preemptions_total", "Sequences preempted when KV blocks ran out (recomputed).",
          double(st.preemptions));
  out += fmt::format("# HELP xserv:prompt_tokens_total Prompt tokens of finished requests.\n"
                     "# TYPE xserv:prompt_tokens_total counter\nxserv:prompt_tokens_total {}\n",
                     prompt_tokens_);
  out += fmt::format(
      "# HELP xserv:generation_tokens_total Tokens generated for finished requests.\n"
      "# TYPE xserv:generation_tokens_total counter\nxserv:generation_tokens_total {}\n",
      generation_tokens_);
  out += "# HELP xserv:request_success_total Finished requests by finish reason.\n"
         "# TYPE xserv:request_success_total counter\n";
  for (const auto& [reason, n] : finished_)
    out += fmt::format("xserv:request_success_total{{finished_reason=\"{}\"}} {}\n", reason, n);
  out += fmt::format("# HELP xserv:client_disconnects_total Requests aborted because their "
                     "client went away.\n# TYPE xserv:client_disconnects_total counter\n"
                     "xserv:client_disconnects_total {}\n",
                     disconnects_);
  out += ttft_.render("xserv:time_to_first_token_seconds", "Time to first token.");
  out += itl_.render("xserv:inter_token_latency_seconds", "Time between consecutive tokens.");
  out += e2e_.render("xserv:e2e_request_latency_seconds", "Request latency, arrival to end.");
  out += queue_.render("xserv:request_queue_time_seconds",
                       "Time a request waited before a step first took it.");
  return out;
}

} // namespace xserv::server
