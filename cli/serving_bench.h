// The serving benchmark of `xserv bench --requests`: random requests at a concurrency and rate,
// through the Engine in this process or an OpenAI-compatible server over HTTP, reported as
// `vllm bench serve` reports (request/s, token/s, TTFT, TPOT, ITL, end-to-end latency).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/engine.h"

namespace xserv::cli {

/// The workload.
struct ServingOptions {
  int64_t requests = 256;
  int64_t concurrency = 64; ///< requests in flight at most (the client's semaphore)
  double rate = 0;          ///< Poisson arrivals per second; 0: all requests at once
  int64_t input_len = 512, output_len = 256;
  /// Lengths drawn uniformly from [len * (1 - range), len * (1 + range)]; 0: fixed.
  double len_range = 0;
  uint64_t seed = 1;
  int64_t vocab = 0; ///< prompt ids are uniform in [0, vocab)
  /// HTTP only: this fraction of the requests (drawn from the seed) hang up mid-stream, after a
  /// random number of tokens in [1, output_len / 2], as impatient clients do.
  double disconnect = 0;
};

/// One request as the client saw it; times in seconds since the run began.
struct RequestRecord {
  double sent = 0, first_token = 0, end = 0;
  std::vector<double> token_times; ///< arrival of each output token (or of each chunk)
  int64_t prompt_tokens = 0, output_tokens = 0;
  bool ok = false;
  bool disconnected = false; ///< the client hung up on purpose (ServingOptions::disconnect)
  std::string error;
};

/// The prompts and arrival times of a workload, made from its seed.
struct Workload {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int64_t> output_lens;
  std::vector<double> arrivals;       ///< seconds since the start, non-decreasing
  std::vector<int64_t> hang_up_after; ///< tokens before the client hangs up; 0: never
};
Workload make_workload(const ServingOptions& o);

/// Runs the workload through an Engine over `model` (its options as given; every request
/// ignores end-of-sequence ids and generates exactly its output length). Returns one record per
/// request; `stats` gets the engine's counters at the end.
std::vector<RequestRecord> run_engine_load(Model& model, const Workload& w, const ServingOptions& o,
                                           const engine::EngineOptions& eo,
                                           engine::EngineStats* stats, double* duration_s);

/// An OpenAI-compatible endpoint: base URL ("http://127.0.0.1:8000"), model name, API key.
struct Endpoint {
  std::string url, model, api_key;
};

/// Runs the workload against `ep` over HTTP: streaming POST /v1/completions with the prompt as
/// token ids, max_tokens and ignore_eos, one client thread per concurrent request. A request's
/// output tokens are the usage the server reports (stream_options.include_usage), else its
/// chunks.
std::vector<RequestRecord> run_http_load(const Endpoint& ep, const Workload& w,
                                         const ServingOptions& o, double* duration_s);

/// The report's figures.
struct ServingReport {
  int64_t requests = 0, completed = 0, failed = 0, disconnected = 0;
  double duration_s = 0;
  int64_t prompt_tokens = 0, output_tokens = 0;
  double request_rate = 0, output_tps = 0, total_tps = 0;
  /// mean, median, p99 in milliseconds.
  struct Dist {
    double mean = 0, median = 0, p99 = 0;
  };
  Dist ttft, tpot, itl, e2e;
  std::string first_error;
};
ServingReport summarize(const std::vector<RequestRecord>& records, double duration_s);

/// Renders the report as "md", "json" or "csv", headed by the workload and where it ran;
/// `extra` rows (name, value) follow the figures (engine counters).
std::string render_serving(const ServingReport& r, const ServingOptions& o,
                           const std::string& target,
                           const std::vector<std::pair<std::string, std::string>>& extra,
                           const std::string& format);

} // namespace xserv::cli
