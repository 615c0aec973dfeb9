// The evaluation tasks: data files, prompts, answers and scores.
#include "models/eval_tasks.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "models/answers.h"

namespace xserv::eval {
namespace {

/// The reference answer of one record, or a reason why it has none.
std::string reference_of(EvalTask task, const nlohmann::json& rec, std::string& why) {
  if (!rec.contains("answer")) {
    why = "missing field \"answer\"";
    return "";
  }
  const nlohmann::json& a = rec["answer"];
  std::optional<std::string> ref;
  if (task == EvalTask::Gsm8k) {
    if (!a.is_string()) {
      why = "\"answer\" is not a string";
      return "";
    }
    ref = parse_gsm8k_reference(a.get<std::string>());
    if (!ref)
      why = "\"answer\" has no \"#### N\" line with a number";
  } else {
    if (!a.is_string() && !a.is_number()) {
      why = "\"answer\" is neither a number nor a string";
      return "";
    }
    const std::string text = a.is_string()           ? a.get<std::string>()
                             : a.is_number_integer() ? a.dump()
                                                     : fmt::format("{}", a.get<double>());
    ref = parse_aime_reference(text);
    if (!ref)
      why = fmt::format("\"answer\" {} is not an integer", text);
  }
  return ref.value_or("");
}

} // namespace

std::string_view eval_task_name(EvalTask task) {
  return task == EvalTask::Gsm8k ? "gsm8k" : "aime25";
}

EvalTask parse_eval_task(std::string_view name) {
  if (name == "gsm8k")
    return EvalTask::Gsm8k;
  if (name == "aime25")
    return EvalTask::Aime25;
  throw UsageError(fmt::format("unknown task '{}' (expected gsm8k or aime25)", name));
}

std::vector<EvalProblem> read_eval_problems(const std::filesystem::path& path, EvalTask task,
                                            int64_t limit) {
  std::ifstream in(path);
  if (!in)
    throw UsageError(fmt::format("cannot open data file '{}'", path.string()));
  std::vector<EvalProblem> problems;
  std::string line;
  for (size_t line_no = 1; std::getline(in, line); ++line_no) {
    if (limit > 0 && static_cast<int64_t>(problems.size()) >= limit)
      break;
    if (line.find_first_not_of(" \t\r") == std::string::npos)
      continue;
    auto fail = [&](const std::string& why) {
      return Error(fmt::format("{}:{}: {}", path.string(), line_no, why));
    };
    nlohmann::json rec = nlohmann::json::parse(line, nullptr, false);
    if (rec.is_discarded() || !rec.is_object())
      throw fail("not a JSON object");
    if (!rec.contains("question") || !rec["question"].is_string())
      throw fail("missing string field \"question\"");
    EvalProblem p;
    p.question = rec["question"].get<std::string>();
    std::string why;
    p.reference = reference_of(task, rec, why);
    if (!why.empty())
      throw fail(why);
    if (rec.contains("id") && rec["id"].is_string())
      p.id = rec["id"].get<std::string>();
    else if (rec.contains("id") && rec["id"].is_number())
      p.id = rec["id"].dump();
    else
      p.id = std::to_string(problems.size());
    problems.push_back(std::move(p));
  }
  return problems;
}

std::string eval_user_prompt(EvalTask task, std::string_view question) {
  return task == EvalTask::Gsm8k ? gsm8k_prompt(question) : aime_prompt(question);
}

std::optional<std::string> extract_eval_answer(EvalTask task, std::string_view final_text) {
  return task == EvalTask::Gsm8k ? eval::extract_gsm8k_answer(final_text)
                                 : eval::extract_aime_answer(final_text);
}

EvalSummary summarize(const std::vector<SampleScore>& scores) {
  EvalSummary s;
  std::map<size_t, std::pair<size_t, size_t>> per_problem; // problem -> (correct, samples)
  for (const SampleScore& sc : scores) {
    auto& [c, n] = per_problem[sc.problem];
    c += sc.correct;
    n += 1;
    s.correct += sc.correct;
    s.answered += sc.answered;
    s.tokens += sc.tokens;
  }
  s.samples = scores.size();
  s.problems = per_problem.size();
  if (s.samples == 0)
    return s;
  s.accuracy = static_cast<double>(s.correct) / static_cast<double>(s.samples);
  for (const auto& [problem, cn] : per_problem) {
    s.max_samples = std::max(s.max_samples, cn.second);
    s.pass_at_1 += static_cast<double>(cn.first) / static_cast<double>(cn.second);
    s.pass_at_k += cn.first > 0 ? 1.0 : 0.0;
  }
  s.pass_at_1 /= static_cast<double>(s.problems);
  s.pass_at_k /= static_cast<double>(s.problems);
  return s;
}

std::string format_summary(EvalTask task, const EvalSummary& s, double wall_seconds) {
  std::string out = fmt::format("[eval] {} summary\n", eval_task_name(task));
  out += fmt::format("  problems    {}\n", s.problems);
  out += fmt::format("  samples     {} ({} per problem)\n", s.samples, s.max_samples);
  out += fmt::format("  accuracy    {:.2f}% ({}/{} samples correct, {} without an answer)\n",
                     100 * s.accuracy, s.correct, s.samples, s.samples - s.answered);
  out += fmt::format("  pass@1      {:.2f}% (mean over problems of correct/samples)\n",
                     100 * s.pass_at_1);
  if (s.max_samples > 1)
    out += fmt::format("  {:<12}{:.2f}% (problems with a correct sample)\n",
                       fmt::format("pass@{}", s.max_samples), 100 * s.pass_at_k);
  out += fmt::format("  tokens      {} generated, {:.1f} tok/s\n", s.tokens,
                     static_cast<double>(s.tokens) / std::max(wall_seconds, 1e-9));
  out += fmt::format("  wall time   {:.1f} s\n", wall_seconds);
  return out;
}

} // namespace xserv::eval
