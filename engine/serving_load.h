// A serving workload (random requests at a concurrency and rate, as `vllm bench serve` makes
// them), run through an Engine in this process, and its report: request/s, token/s, TTFT, TPOT,
// ITL and end-to-end latency. server/http_load.h runs the same workload over HTTP.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace xserv::engine {

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
  /// Every prompt starts with the same this many tokens (a system prompt), then input_len of
  /// its own.
  int64_t shared_prefix = 0;
  /// Requests are conversations of this many turns: turn t's prompt is turn t - 1's, a reply of
  /// output_len ids standing for the answer, and input_len new ones; it is sent once turn t - 1
  /// is done. Requests go turn by turn (all conversations' first turns, then their seconds).
  int64_t turns = 1;
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
  std::vector<int64_t> after;         ///< the request that must finish first; -1: none
  std::vector<int64_t> turn;          ///< of its conversation, from 0
};
Workload make_workload(const ServingOptions& o);

/// Runs the workload through an Engine over `model` (its options as given; every request
/// ignores end-of-sequence ids and generates exactly its output length). With `constraint`,
/// every request's whole output follows it (structured output) and ends at an end-of-sequence
/// id where the constraint allows one, or at its output length. Returns one record per
/// request; `stats` gets the engine's counters at the end.
std::vector<RequestRecord> run_engine_load(Model& model, const Workload& w, const ServingOptions& o,
                                           const EngineOptions& eo, EngineStats* stats,
                                           double* duration_s,
                                           std::shared_ptr<const Constraint> constraint = nullptr);

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
  std::vector<Dist> ttft_by_turn; ///< with conversations of several turns
  std::string first_error;
};
/// `turns` (the workload's turn of each request) splits TTFT by turn when given.
ServingReport summarize(const std::vector<RequestRecord>& records, double duration_s,
                        const std::vector<int64_t>& turns = {});

} // namespace xserv::engine
