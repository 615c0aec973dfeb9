// The serving workload of engine/serving_load.h run against an OpenAI-compatible server over
// HTTP (`xserv bench --endpoint`): streaming completions, one client thread per concurrent
// request, token arrival times from the event stream.
#pragma once

#include <string>
#include <vector>

#include "engine/serving_load.h"

namespace xserv::server {

/// An OpenAI-compatible endpoint: base URL ("http://127.0.0.1:8000"), model name, API key.
struct Endpoint {
  std::string url, model, api_key;
};

/// Runs the workload against `ep` over HTTP: streaming POST /v1/completions with the prompt as
/// token ids, max_tokens and ignore_eos, one client thread per concurrent request. A request's
/// output tokens are the usage the server reports (stream_options.include_usage), else its
/// chunks.
std::vector<engine::RequestRecord> run_http_load(const Endpoint& ep, const engine::Workload& w,
                                                 const engine::ServingOptions& o,
                                                 double* duration_s);

} // namespace xserv::server
