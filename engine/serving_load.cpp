// The serving workload, its in-process driver and its report.
#include "engine/serving_load.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <queue>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "base/error.h"
#include "base/stats.h"

namespace xserv::engine {

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
    throw Error("the serving benchmark needs the model's vocabulary size");
  if (o.turns < 1 || o.shared_prefix < 0)
    throw Error(fmt::format("a workload of {} turns and a shared prefix of {} tokens", o.turns,
                            o.shared_prefix));
  Workload w;
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(o.vocab - 1));
  std::exponential_distribution<double> gap(o.rate > 0 ? o.rate : 1.0);
  auto draw_ids = [&](int64_t n, std::vector<int32_t>& out) {
    for (int64_t k = 0; k < n; ++k)
      out.push_back(id(rng));
  };
  std::vector<int32_t> shared;
  draw_ids(o.shared_prefix, shared);
  // Conversations: request i is turn i / conversations of conversation i % conversations.
  const int64_t conversations = std::max<int64_t>(1, (o.requests + o.turns - 1) / o.turns);
  std::vector<std::vector<int32_t>> history(size_t(conversations), shared);
  double t = 0;
  for (int64_t i = 0; i < o.requests; ++i) {
    const int64_t conv = i % conversations, turn = i / conversations;
    std::vector<int32_t>& h = history[size_t(conv)];
    draw_ids(draw_len(rng, o.input_len, o.len_range), h);
    w.prompts.push_back(h);
    w.output_lens.push_back(draw_len(rng, o.output_len, o.len_range));
    draw_ids(w.output_lens.back(), h); // the reply the next turn's prompt carries
    w.turn.push_back(turn);
    w.after.push_back(turn > 0 ? i - conversations : -1);
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
                                           const EngineOptions& eo, EngineStats* stats,
                                           double* duration_s,
                                           std::shared_ptr<const Constraint> constraint) {
  EngineOptions opts = eo;
  opts.max_queue = std::max<int64_t>(opts.max_queue, o.requests);
  Engine e(model, opts);
  const size_t n = w.prompts.size();
  std::vector<RequestRecord> rec(n);
  RequestId first = 0;
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
    while (sent < n && in_flight < o.concurrency && w.arrivals[sent] <= now &&
           (w.after.empty() || w.after[sent] < 0 || rec[size_t(w.after[sent])].end > 0)) {
      Request r;
      r.prompt = w.prompts[sent];
      r.max_tokens = w.output_lens[sent];
      if (constraint) {
        r.constraint = constraint;
        r.stop_ids = model.config().eos_ids(); // where the grammar may end
      }
      const RequestId id = e.add(std::move(r));
      if (sent == 0)
        first = id;
      rec[sent].sent = std::max(w.arrivals[sent], free_at.top());
      if (!w.after.empty() && w.after[sent] >= 0) // a next turn goes once the last is done
        rec[sent].sent = std::max(rec[sent].sent, rec[size_t(w.after[sent])].end);
      free_at.pop();
      rec[sent].prompt_tokens = static_cast<int64_t>(w.prompts[sent].size());
      ++sent;
      ++in_flight;
    }
    if (e.idle()) { // nothing to run until the next arrival (a next turn's is never idle)
      if (sent < n)
        std::this_thread::sleep_for(std::chrono::duration<double>(
            std::max(0.0, std::min(w.arrivals[sent] - seconds_since(t0), 0.01))));
      continue;
    }
    const std::vector<Event> events = e.step();
    const double t = seconds_since(t0);
    for (const Event& ev : events) {
      RequestRecord& r = rec[size_t(ev.id - first)];
      if (ev.token >= 0) {
        if (r.token_times.empty())
          r.first_token = t;
        r.token_times.push_back(t);
        r.output_tokens = ev.generated_tokens;
      }
      if (ev.finish != FinishReason::None) {
        r.end = t;
        r.ok = ev.finish == FinishReason::Length ||
               (constraint && ev.finish == FinishReason::Stop);
        if (!r.ok)
          r.error = ev.error.empty() ? fmt::format("finished with '{}'", finish_name(ev.finish))
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

ServingReport summarize(const std::vector<RequestRecord>& records, double duration_s,
                        const std::vector<int64_t>& turns) {
  ServingReport r;
  r.requests = static_cast<int64_t>(records.size());
  r.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2e;
  std::vector<std::vector<double>> by_turn;
  for (size_t i = 0; i < records.size(); ++i) {
    const RequestRecord& q = records[i];
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
    if (i < turns.size()) {
      by_turn.resize(std::max(by_turn.size(), size_t(turns[i] + 1)));
      by_turn[size_t(turns[i])].push_back(ttft.back());
    }
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
  if (by_turn.size() > 1)
    for (auto& v : by_turn)
      r.ttft_by_turn.push_back(dist(std::move(v)));
  return r;
}

} // namespace xserv::engine
