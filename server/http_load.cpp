// run_http_load(): the workload as streaming POST /v1/completions.
#include "server/http_load.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "server/http_client.h"

namespace xserv::server {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

} // namespace

std::vector<engine::RequestRecord> run_http_load(const Endpoint& ep, const engine::Workload& w,
                                                 const engine::ServingOptions& o,
                                                 double* duration_s) {
  const size_t n = w.prompts.size();
  std::vector<engine::RequestRecord> rec(n);
  std::atomic<size_t> next{0};
  // A conversation's next turn goes once its last is done (Workload::after).
  std::mutex done_mu;
  std::condition_variable done_cv;
  std::vector<char> done(n, 0);
  const HttpBase base = parse_http_base(ep.url);
  std::vector<std::pair<std::string, std::string>> headers;
  if (!ep.api_key.empty())
    headers.emplace_back("Authorization", "Bearer " + ep.api_key);
  const auto t0 = Clock::now();
  auto worker = [&] {
    HttpClient client(base, std::chrono::seconds(600));
    for (size_t i = next++; i < n; i = next++) {
      const double wait = w.arrivals[i] - seconds_since(t0);
      if (wait > 0)
        std::this_thread::sleep_for(std::chrono::duration<double>(wait));
      if (!w.after.empty() && w.after[i] >= 0) {
        std::unique_lock lock(done_mu);
        done_cv.wait(lock, [&] { return done[size_t(w.after[i])] != 0; });
      }
      engine::RequestRecord& r = rec[i];
      auto finish = [&] {
        {
          std::lock_guard lock(done_mu);
          done[i] = 1;
        }
        done_cv.notify_all();
      };
      nlohmann::json body = {{"model", ep.model},
                             {"prompt", w.prompts[i]},
                             {"max_tokens", w.output_lens[i]},
                             {"ignore_eos", true},
                             {"temperature", 0},
                             {"stream", true},
                             {"stream_options", {{"include_usage", true}}}};
      std::string buffer;
      int64_t chunks = 0, usage = -1;
      auto sink = [&](std::string_view data) {
        buffer.append(data);
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
              return false; // hang up: the client closes the connection
            }
          }
        }
        return true;
      };
      r.sent = seconds_since(t0);
      r.prompt_tokens = static_cast<int64_t>(w.prompts[i].size());
      const HttpReply res = client.request("POST", "/v1/completions", body.dump(), headers, sink);
      r.end = seconds_since(t0);
      r.output_tokens = usage >= 0 ? usage : chunks;
      finish();
      if (r.disconnected)
        continue;
      if (!res.error.empty())
        r.error = "HTTP error: " + res.error;
      else if (res.status != 200)
        r.error = fmt::format("HTTP {}: {}", res.status, res.body.substr(0, 200));
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

} // namespace xserv::server
