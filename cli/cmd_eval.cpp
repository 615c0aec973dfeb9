// `xserv eval`: GSM8K or AIME accuracy of a model, generated in batches, scored per sample.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/eval_data.h"
#include "cli/model_source.h"
#include "models/harmony.h"

namespace xserv::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// What one request produced, scored as soon as its last token arrives.
struct SampleRecord {
  std::vector<models::TokenId> ids;
  bool done = false;
  Clock::time_point first_token;
  double seconds = 0; ///< from the first generated token to the last
};

/// The options (cli/eval_data.h) and the requests of one run.
struct EvalRun : EvalOptions {
  std::vector<std::string> user_prompts;
  std::vector<engine::Request> requests; // problem p, sample k at p * K + k
};

EvalRun read_run(const ParsedArgs& args) {
  EvalRun run;
  static_cast<EvalOptions&>(run) = read_eval_options(args);
  return run;
}

/// One request per sample: the problem's harmony prompt, sample k seeded with --seed + k.
void add_requests(EvalRun& run, const models::Tokenizer& tok) {
  const runtime::SamplerOptions& sampling = run.sampling;
  for (size_t p = 0; p < run.problems.size(); ++p) {
    models::ChatPrompt chat;
    chat.user = eval_user_prompt(run.task, run.problems[p].question);
    chat.effort = run.effort;
    run.user_prompts.push_back(chat.user);
    auto ids = models::render_for_completion(tok, models::make_chat(chat));
    for (size_t k = 0; k < run.samples_per_problem; ++k) {
      engine::Request req;
      req.prompt.assign(ids.begin(), ids.end());
      req.max_tokens = run.max_tokens;
      req.sampling = sampling;
      if (sampling.temperature > 0)
        req.sampling.seed = sampling.seed + k;
      req.stop_ids = models::stop_token_ids();
      run.requests.push_back(std::move(req));
    }
  }
}

/// Fits the model's limits to the run (every prompt plus --max-tokens; a plan keeps its own) and
/// returns how many requests run at once (--batch, at most the plan's max batch).
int64_t size_source(ModelSource& src, const ParsedArgs& args, const EvalRun& run) {
  size_t longest = 0;
  for (const engine::Request& r : run.requests)
    longest = std::max(longest, r.prompt.size());
  if (!src.plan && !args.has("--max-seq"))
    src.max_seq = static_cast<int64_t>(longest) + run.max_tokens;
  const int64_t plan_batch = !src.plan ? 4096 : src.max_batch;
  int64_t batch = args.get_int("--batch", !src.plan ? 8 : src.max_batch, 1, 1 << 16);
  if (batch > plan_batch)
    throw UsageError(
        fmt::format("--batch {} exceeds the plan's maximum batch of {}", batch, plan_batch));
  batch = std::min<int64_t>(batch, static_cast<int64_t>(run.requests.size()));
  if (!src.plan)
    src.max_batch = batch;
  return batch;
}

} // namespace

int cmd_eval(const ParsedArgs& args) {
  if (args.has("--endpoint"))
    return eval_endpoint(args); // cli/eval_endpoint.cpp
  if (args.positional().empty())
    throw UsageError("give a PLAN_OR_MODEL, or --endpoint URL of an OpenAI-compatible server");
  EvalRun run = read_run(args);
  ModelSource src = resolve_source(args.positional()[0], args);
  const models::Tokenizer tok = load_tokenizer(src, args);
  add_requests(run, tok);
  const int64_t running = size_source(src, args, run);
  std::ofstream out;
  if (args.has("--out")) {
    out.open(args.get("--out"));
    if (!out)
      throw UsageError(fmt::format("cannot write --out file '{}'", args.get("--out")));
  }
  auto model = make_model(src, args);
  const size_t n_req = run.requests.size(), k_samples = run.samples_per_problem;
  std::fprintf(stderr, "[eval] %s: %zu problems x %zu samples, batch %lld, max %lld tokens, %s\n",
               std::string(eval_task_name(run.task)).c_str(), run.problems.size(), k_samples,
               static_cast<long long>(running), static_cast<long long>(run.max_tokens),
               model->backend().c_str());
  if (k_samples > 1 && run.sampling.temperature == 0)
    std::fputs("[eval] note: greedy decoding makes the samples of a problem identical; give "
               "--temperature for distinct ones\n",
               stderr);
  const size_t batch = static_cast<size_t>(running);
  std::vector<SampleRecord> records(n_req);
  std::vector<SampleScore> scores;
  std::vector<size_t> samples_done(run.problems.size(), 0);
  size_t problems_done = 0, correct = 0;
  int64_t tokens = 0;
  EvalProgressBar bar(run.problems.size(), isatty(STDERR_FILENO) != 0);
  const auto t0 = Clock::now();

  // Scores request i, writes its line and advances the progress bar.
  auto complete = [&](size_t i) {
    SampleRecord& rec = records[i];
    rec.done = true;
    rec.seconds = seconds_since(rec.first_token);
    const size_t p = i / k_samples;
    const EvalProblem& prob = run.problems[p];
    auto msgs = models::parse_completion(tok, rec.ids);
    const std::string final_text = models::final_text(msgs);
    const auto answer = extract_eval_answer(run.task, final_text);
    SampleScore sc{p, answer && *answer == prob.reference, answer.has_value(),
                   static_cast<int64_t>(rec.ids.size())};
    scores.push_back(sc);
    correct += sc.correct;
    tokens += sc.tokens;
    if (out.is_open()) {
      nlohmann::ordered_json j = {
          {"task", eval_task_name(run.task)},
          {"id", prob.id},
          {"sample", i % k_samples},
          {"prompt", run.user_prompts[p]},
          {"output", final_text},
          {"completion", tok.decode(rec.ids)},
          {"extracted", answer ? nlohmann::ordered_json(*answer) : nlohmann::ordered_json()},
          {"reference", prob.reference},
          {"correct", sc.correct},
          {"tokens", sc.tokens},
          {"seconds", rec.seconds}};
      // Random or cut-off output may end inside a UTF-8 character: replace, never throw.
      out << j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << '\n'
          << std::flush;
    }
    if (++samples_done[p] == k_samples)
      bar.update(++problems_done, correct, scores.size(), tokens, seconds_since(t0));
  };

  // Every request is queued at once; the engine runs up to --batch of them at a time and
  // starts the next as soon as one ends.
  engine::EngineOptions eo;
  eo.max_running = static_cast<int64_t>(batch);
  engine_kv_options(args, eo);
  const std::vector<engine::Generation> gens = engine::generate(
      *model, run.requests,
      [&](size_t i, const engine::Event& ev) {
        SampleRecord& rec = records[i];
        if (ev.token >= 0) {
          if (rec.ids.empty())
            rec.first_token = Clock::now();
          rec.ids.push_back(static_cast<models::TokenId>(ev.token));
        }
        if (ev.finish != engine::FinishReason::None)
          complete(i);
        return true;
      },
      eo);
  bar.finish();
  engine::throw_if_failed(gens); // a model that broke down scores nothing

  const double wall = seconds_since(t0);
  std::cout << format_summary(run.task, summarize(scores), wall) << std::flush;
  if (out.is_open())
    std::fprintf(stderr, "[eval] wrote %zu samples to %s\n", n_req, args.get("--out").c_str());
  return 0;
}

} // namespace xserv::cli
