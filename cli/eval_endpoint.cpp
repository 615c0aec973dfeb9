// `xserv eval --endpoint URL`: GSM8K / AIME through any OpenAI-compatible chat endpoint (xserv
// serve, llama-server, vLLM), scored as the in-process eval scores.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <thread>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/eval_data.h"
#include "models/harmony.h"
#include "server/openai_client.h"

namespace xserv::cli {
namespace {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

} // namespace

int eval_endpoint(const ParsedArgs& args) {
  if (!args.positional().empty())
    throw UsageError("give a PLAN or --endpoint URL, not both");
  const std::string url = args.get("--endpoint");
  const std::string api_key = args.get("--api-key", "");
  server::OpenAIClient probe(url, api_key);
  const std::string& base = probe.base();
  const EvalOptions opts = read_eval_options(args);
  const EvalTask task = opts.task;
  const std::vector<EvalProblem>& problems = opts.problems;
  const size_t k_samples = opts.samples_per_problem;
  const int64_t max_tokens = opts.max_tokens;
  const std::string effort(models::effort_name(opts.effort));
  const engine::SamplerOptions& sampling = opts.sampling;
  const size_t concurrency = static_cast<size_t>(args.get_int("--batch", 8, 1, 4096));
  std::ofstream out;
  if (args.has("--out")) {
    out.open(args.get("--out"));
    if (!out)
      throw UsageError(fmt::format("cannot write --out file '{}'", args.get("--out")));
  }
  std::string model = args.get("--model");
  if (model.empty()) // the server's first model
    model = probe.first_model();
  const size_t n_req = problems.size() * k_samples;
  std::fprintf(stderr,
               "[eval] %s: %zu problems x %zu samples against %s (model %s), %zu at a "
               "time, max %lld tokens\n",
               std::string(eval_task_name(task)).c_str(), problems.size(), k_samples, base.c_str(),
               model.c_str(), concurrency, static_cast<long long>(max_tokens));

  std::mutex mu; // guards everything below that the workers share
  std::vector<SampleScore> scores;
  std::vector<size_t> samples_done(problems.size(), 0);
  size_t problems_done = 0, correct = 0, errors = 0;
  int64_t tokens = 0;
  EvalProgressBar bar(problems.size(), isatty(STDERR_FILENO) != 0);
  const auto t0 = Clock::now();
  std::atomic<size_t> next{0};
  auto worker = [&] {
    server::OpenAIClient client(url, api_key);
    for (size_t i = next++; i < n_req; i = next++) {
      const size_t p = i / k_samples, k = i % k_samples;
      const std::string user = eval_user_prompt(task, problems[p].question);
      Json body = {{"model", model},
                   {"messages", Json::array({{{"role", "user"}, {"content", user}}})},
                   {"max_tokens", max_tokens},
                   {"temperature", sampling.temperature},
                   {"top_p", sampling.top_p},
                   {"seed", sampling.seed + (sampling.temperature > 0 ? k : 0)},
                   {"reasoning_effort", effort}};
      if (sampling.top_k > 0) // not OpenAI's, but vLLM, SGLang and llama-server take them
        body["top_k"] = sampling.top_k;
      if (sampling.min_p > 0)
        body["min_p"] = sampling.min_p;
      const server::ChatReply s = client.chat(body);
      const auto answer = extract_eval_answer(task, s.content);
      SampleScore sc{p, answer && *answer == problems[p].reference, answer.has_value(),
                     s.completion_tokens};
      std::lock_guard<std::mutex> lock(mu);
      scores.push_back(sc);
      correct += sc.correct;
      tokens += sc.tokens;
      errors += !s.error.empty();
      if (!s.error.empty() && errors <= 3)
        std::fprintf(stderr, "[eval] problem %s sample %zu: %s\n", problems[p].id.c_str(), k,
                     s.error.c_str());
      if (out.is_open()) {
        Json j = {{"task", eval_task_name(task)},
                  {"id", problems[p].id},
                  {"sample", k},
                  {"prompt", user},
                  {"output", s.content},
                  {"reasoning", s.reasoning},
                  {"extracted", answer ? Json(*answer) : Json()},
                  {"reference", problems[p].reference},
                  {"correct", sc.correct},
                  {"tokens", sc.tokens},
                  {"seconds", s.seconds}};
        if (!s.error.empty())
          j["error"] = s.error;
        out << j.dump(-1, ' ', false, Json::error_handler_t::replace) << '\n' << std::flush;
      }
      if (++samples_done[p] == k_samples)
        bar.update(++problems_done, correct, scores.size(), tokens,
                   std::chrono::duration<double>(Clock::now() - t0).count());
    }
  };
  std::vector<std::thread> pool;
  for (size_t w = 0; w < std::min(concurrency, n_req); ++w)
    pool.emplace_back(worker);
  for (auto& t : pool)
    t.join();
  bar.finish();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  std::cout << format_summary(task, summarize(scores), wall) << std::flush;
  if (errors)
    std::fprintf(stderr, "[eval] %zu of %zu requests failed (scored as unanswered)\n", errors,
                 n_req);
  if (out.is_open())
    std::fprintf(stderr, "[eval] wrote %zu samples to %s\n", n_req, args.get("--out").c_str());
  return errors == n_req ? 1 : 0;
}

} // namespace xserv::cli
