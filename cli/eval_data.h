// The pieces of `xserv eval` that need no model: reading GSM8K/AIME data, scoring, the summary.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cli/args.h"
#include "models/harmony.h"
#include "runtime/sampler.h"

namespace xserv::cli {

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

/// What `xserv eval` runs, with a plan or against --endpoint: --task, --data (its problems, up
/// to --limit), --samples, --max-tokens, --reasoning and the sampling flags.
struct EvalOptions {
  EvalTask task = EvalTask::Gsm8k;
  std::filesystem::path data;
  std::vector<EvalProblem> problems;
  size_t samples_per_problem = 1;
  int64_t max_tokens = 2048;
  models::ReasoningEffort effort = models::ReasoningEffort::Medium;
  runtime::SamplerOptions sampling;
};

/// Reads and checks those options and the problems, so every usage mistake surfaces before a
/// model loads or a server is called: UsageError for a missing or bad flag, xserv::Error for a
/// data file without problems.
EvalOptions read_eval_options(const ParsedArgs& args);

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

/// The progress line on stderr: a redrawn bar on a terminal, otherwise a plain line at every
/// tenth of the problems (and the last).
class EvalProgressBar {
public:
  EvalProgressBar(size_t problems, bool tty) : problems_(problems), tty_(tty) {}
  /// Reports `done` completed problems and the running totals.
  void update(size_t done, size_t correct, size_t samples, int64_t tokens, double seconds);
  /// Ends the redrawn line on a terminal.
  void finish();

private:
  size_t problems_;
  bool tty_;
  size_t last_printed_ = 0;
  bool drawn_ = false;
};

} // namespace xserv::cli
