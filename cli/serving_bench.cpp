// The serving benchmark: workloads, the in-process and HTTP drivers, and the report.
#include "cli/serving_bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <queue>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/bench_report.h"

namespace xserv::cli {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int64_t draw_len(std::mt19937_64& rng, int64_t len, double range) {
  if (range <= 0)
    return len;
  const auto lo = std::max<int64_t>(1, int64_t(std::floor(double(len) * (1 - range))));
  const auto hi = std::max<int64_t>(lo, int64_t(std::ceil(double(len) * (1 + range))));
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

ServingReport::Dist dist(std::vector<double> ms) {
  ServingReport::Dist d;
  if (ms.empty())
    return d;
  d.mean = mean(ms);
  d.median = quantile(ms, 0.5);
  d.p99 = quantile(ms, 0.99);
  return d;
}

} // namespace

Workload make_workload(const ServingOptions& o) {
  if (o.vocab <= 0)
    throw UsageError("the serving benchmark needs the model's vocabulary size");
  Workload w;
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(o.vocab - 1));
  std::exponential_distribution<double> gap(o.rate > 0 ? o.rate : 1.0);
  double t = 0;
  for (int64_t i = 0; i < o.requests; ++i) {
    std::vector<int32_t> p(static_cast<size_t>(draw_len(rng, o.input_len, o.len_range)));
    for (int32_t& x : p)
      x = id(rng);
    w.prompts.push_back(std::move(p));
    w.output_lens.push_back(draw_len(rng, o.output_len, o.len_range));
    if (o.rate > 0 && i > 0)
      t += gap(rng);
    w.arrivals.push_back(t);
  }
  // Drawn after the rest, so a workload's prompts do not depend on `disconnect`.
  std::uniform_real_distribution<double> u(0, 1);
  for (int64_t i = 0; i < o.requests; ++i) {
    const int64_t half = std::max<int64_t>(1, w.output_lens[size_t(i)] / 2);
    w.hang_up_after.push_back(
        u(rng) < o.disconnect ? std::uniform_int_distribution<int64_t>(1, half)(rng) : 0);
  }
  return w;
}

std::vector<RequestRecord> run_engine_load(Model& model, const Workload& w, const ServingOptions& o,
                                           const engine::EngineOptions& eo,
                                           engine::EngineStats* stats, double* duration_s) {
  engine::EngineOptions opts = eo;
  opts.max_queue = std::max<int64_t>(opts.max_queue, o.requests);
  engine::Engine e(model, opts);
  const size_t n = w.prompts.size();
  std::vector<RequestRecord> rec(n);
  engine::RequestId first = 0;
  // The client's semaphore: when each of its `concurrency` slots came free (a request is sent
  // at max(its arrival, the earliest free slot), as a client blocked on the semaphore would).
  std::priority_queue<double, std::vector<double>, std::greater<>> free_at;
  for (int64_t c = 0; c < o.concurrency; ++c)
    free_at.push(0.0);
  size_t sent = 0, done = 0;
  int64_t in_flight = 0;
  const auto t0 = Clock::now();
  while (done < n) {
    // The client: every request that has arrived, while fewer than `concurrency` are in flight.
    const double now = seconds_since(t0);
    while (sent < n && in_flight < o.concurrency && w.arrivals[sent] <= now) {
      engine::Request r;
      r.prompt = w.prompts[sent];
      r.max_tokens = w.output_lens[sent];
      const engine::RequestId id = e.add(std::move(r));
      if (sent == 0)
        first = id;
      rec[sent].sent = std::max(w.arrivals[sent], free_at.top());
      free_at.pop();
      rec[sent].prompt_tokens = static_cast<int64_t>(w.prompts[sent].size());
      ++sent;
      ++in_flight;
    }
    if (e.idle()) { // nothing to run until the next arrival
      if (sent < n)
        std::this_thread::sleep_for(std::chrono::duration<double>(
            std::max(0.0, std::min(w.arrivals[sent] - seconds_since(t0), 0.01))));
      continue;
    }
    const std::vector<engine::Event> events = e.step();
    const double t = seconds_since(t0);
    for (const engine::Event& ev : events) {
      RequestRecord& r = rec[size_t(ev.id - first)];
      if (ev.token >= 0) {
        if (r.token_times.empty())
          r.first_token = t;
        r.token_times.push_back(t);
        r.output_tokens = ev.generated_tokens;
      }
      if (ev.finish != engine::FinishReason::None) {
        r.end = t;
        r.ok = ev.finish == engine::FinishReason::Length;
        if (!r.ok)
          r.error = ev.error.empty()
                        ? fmt::format("finished with '{}'", engine::finish_name(ev.finish))
                        : ev.error;
        ++done;
        --in_flight;
        free_at.push(t);
      }
    }
  }
  if (duration_s)
    *duration_s = seconds_since(t0);
  if (stats)
    *stats = e.stats();
  return rec;
}

std::vector<RequestRecord> run_http_load(const Endpoint& ep, const Workload& w,
                                         const ServingOptions& o, double* duration_s) {
  const size_t n = w.prompts.size();
  std::vector<RequestRecord> rec(n);
  std::atomic<size_t> next{0};
  const auto t0 = Clock::now();
  auto worker = [&] {
    httplib::Client client(ep.url);
    client.set_read_timeout(600, 0);
    client.set_connection_timeout(10, 0);
    for (size_t i = next++; i < n; i = next++) {
      const double wait = w.arrivals[i] - seconds_since(t0);
      if (wait > 0)
        std::this_thread::sleep_for(std::chrono::duration<double>(wait));
      RequestRecord& r = rec[i];
      nlohmann::json body = {{"model", ep.model},
                             {"prompt", w.prompts[i]},
                             {"max_tokens", w.output_lens[i]},
                             {"ignore_eos", true},
                             {"temperature", 0},
                             {"stream", true},
                             {"stream_options", {{"include_usage", true}}}};
      httplib::Request req;
      req.method = "POST";
      req.path = "/v1/completions";
      req.body = body.dump();
      req.set_header("Content-Type", "application/json");
      if (!ep.api_key.empty())
        req.set_header("Authorization", "Bearer " + ep.api_key);
      std::string buffer;
      int64_t chunks = 0, usage = -1;
      req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
        buffer.append(data, len);
        if (buffer.size() > (1 << 20)) { // not a stream of events: keep the start for the error
          r.error = "the server sent no event stream: " + buffer.substr(0, 200);
          return false;
        }
        for (size_t nl; (nl = buffer.find('\n')) != std::string::npos; buffer.erase(0, nl + 1)) {
          const std::string line = buffer.substr(0, nl);
          if (line.rfind("data: ", 0) != 0 || line == "data: [DONE]")
            continue;
          const nlohmann::json j = nlohmann::json::parse(line.substr(6), nullptr, false);
          if (j.is_discarded())
            continue;
          if (j.contains("error")) {
            r.error = j["error"].dump();
            continue;
          }
          if (j.contains("usage") && j["usage"].is_object())
            usage = j["usage"].value("completion_tokens", int64_t(-1));
          // Every chunk with a choice is a token (or tokens) arriving, even one whose text is
          // empty (a special token, a partial UTF-8 character), as vllm bench serve counts.
          const bool text =
              j.contains("choices") && j["choices"].is_array() && !j["choices"].empty();
          if (text) {
            const double t = seconds_since(t0);
            if (r.token_times.empty())
              r.first_token = t;
            r.token_times.push_back(t);
            ++chunks;
            if (w.hang_up_after[i] > 0 && chunks >= w.hang_up_after[i]) {
              r.disconnected = true;
              return false; // hang up: httplib closes the connection
            }
          }
        }
        return true;
      };
      r.sent = seconds_since(t0);
      r.prompt_tokens = static_cast<int64_t>(w.prompts[i].size());
      const httplib::Result res = client.send(req);
      r.end = seconds_since(t0);
      r.output_tokens = usage >= 0 ? usage : chunks;
      if (r.disconnected)
        continue;
      if (!res)
        r.error = "HTTP error: " + httplib::to_string(res.error());
      else if (res->status != 200) // the body went to the receiver: what is left of it
        r.error = fmt::format("HTTP {}: {}", res->status,
                              (res->body.empty() ? buffer : res->body).substr(0, 200));
      r.ok = r.error.empty() && !r.token_times.empty();
      if (r.error.empty() && r.token_times.empty())
        r.error = "no tokens in the stream";
    }
  };
  std::vector<std::thread> threads;
  for (int64_t c = 0; c < std::min<int64_t>(o.concurrency, int64_t(n)); ++c)
    threads.emplace_back(worker);
  for (std::thread& t : threads)
    t.join();
  if (duration_s)
    *duration_s = seconds_since(t0);
  return rec;
}

ServingReport summarize(const std::vector<RequestRecord>& records, double duration_s) {
  ServingReport r;
  r.requests = static_cast<int64_t>(records.size());
  r.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2e;
  for (const RequestRecord& q : records) {
    if (q.disconnected) {
      ++r.disconnected;
      continue;
    }
    if (!q.ok) {
      ++r.failed;
      if (r.first_error.empty())
        r.first_error = q.error;
      continue;
    }
    ++r.completed;
    r.prompt_tokens += q.prompt_tokens;
    r.output_tokens += q.output_tokens;
    ttft.push_back(1e3 * (q.first_token - q.sent));
    e2e.push_back(1e3 * (q.end - q.sent));
    if (q.output_tokens > 1) // TPOT leaves out the first token, as vllm bench serve does
      tpot.push_back(1e3 * (q.end - q.first_token) / double(q.output_tokens - 1));
    for (size_t i = 1; i < q.token_times.size(); ++i)
      itl.push_back(1e3 * (q.token_times[i] - q.token_times[i - 1]));
  }
  const double d = std::max(duration_s, 1e-9);
  r.request_rate = double(r.completed) / d;
  r.output_tps = double(r.output_tokens) / d;
  r.total_tps = double(r.prompt_tokens + r.output_tokens) / d;
  r.ttft = dist(ttft);
  r.tpot = dist(tpot);
  r.itl = dist(itl);
  r.e2e = dist(e2e);
  return r;
}

std::string render_serving(const ServingReport& r, const ServingOptions& o,
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
      {"completed / failed", fmt::format("{} / {}", r.completed, r.failed)},
      {"disconnected on purpose", std::to_string(r.disconnected)},
      {"duration (s)", fmt::format("{:.2f}", r.duration_s)},
      {"request throughput (req/s)", fmt::format("{:.2f}", r.request_rate)},
      {"output token throughput (tok/s)", fmt::format("{:.1f}", r.output_tps)},
      {"total token throughput (tok/s)", fmt::format("{:.1f}", r.total_tps)}};
  auto add_dist = [&](const std::string& name, const ServingReport::Dist& d) {
    rows.push_back({name + " mean (ms)", fmt::format("{:.2f}", d.mean)});
    rows.push_back({name + " median (ms)", fmt::format("{:.2f}", d.median)});
    rows.push_back({name + " p99 (ms)", fmt::format("{:.2f}", d.p99)});
  };
  add_dist("TTFT", r.ttft);
  add_dist("TPOT", r.tpot);
  add_dist("ITL", r.itl);
  add_dist("E2E", r.e2e);
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
    for (const auto& [k, v] : extra)
      j[k] = v;
    if (!r.first_error.empty())
      j["first_error"] = r.first_error;
    return j.dump(2) + "\n";
  }
  throw UsageError(fmt::format("-o must be md, json or csv, got '{}'", format));
}

} // namespace xserv::cli
