// The evaluation tasks of `xserv eval` (GSM8K, AIME 2025): their data files, the user prompt of
// a problem, the answer extracted from a reply, and the scores and summary of a run. No model:
// tests check them alone.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace xserv::eval {

enum class EvalTask { Gsm8k, Aime25 };

/// "gsm8k" or "aime25"; parse_eval_task throws UsageError on anything else.
std::string_view eval_task_name(EvalTask task);
EvalTask parse_eval_task(std::string_view name);

/// One problem of an evaluation data set.
struct EvalProblem {
  std::string id;        ///< the record's "id", else its 0-based index in the file
  std::string question;  ///< the record's "question"
  std::string reference; ///< canonical reference answer ("18", "70")
};

/// Reads up to `limit` problems (0: all) from a JSONL file: GSM8K records are {question, answer
/// ending in "#### N"}, AIME records {id, question, answer} with a number or numeric string.
/// Blank lines are skipped. Throws xserv::Error naming the file and 1-based line number of the
/// first malformed record, and UsageError when the file cannot be opened.
std::vector<EvalProblem> read_eval_problems(const std::filesystem::path& path, EvalTask task,
                                            int64_t limit = 0);

/// The user message of a problem (eval::gsm8k_prompt or eval::aime_prompt).
std::string eval_user_prompt(EvalTask task, std::string_view question);

/// The model's answer extracted from its final-channel text, nullopt when it gave none.
std::optional<std::string> extract_eval_answer(EvalTask task, std::string_view final_text);

/// The score of one generated sample.
struct SampleScore {
  size_t problem = 0; ///< index of its problem
  bool correct = false;
  bool answered = false; ///< an answer could be extracted
  int64_t tokens = 0;    ///< generated tokens
};

/// Totals over every sample of a run.
struct EvalSummary {
  size_t problems = 0, samples = 0, correct = 0, answered = 0;
  size_t max_samples = 0; ///< most samples of one problem (K)
  int64_t tokens = 0;
  double accuracy = 0;  ///< correct / samples
  double pass_at_1 = 0; ///< mean over problems of (correct samples / samples)
  double pass_at_k = 0; ///< fraction of problems with at least one correct sample
};

/// Aggregates `scores`; problems without any sample are not counted.
EvalSummary summarize(const std::vector<SampleScore>& scores);

/// The multi-line summary printed at the end of a run.
std::string format_summary(EvalTask task, const EvalSummary& s, double wall_seconds);

} // namespace xserv::eval
