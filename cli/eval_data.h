// The pieces of `xserv eval` that need no model: reading GSM8K/AIME data, scoring, the summary.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cli/args.h"
#include "engine/engine.h"
#include "models/eval_tasks.h"
#include "models/harmony.h"

namespace xserv::cli {

using eval::EvalProblem;
using eval::EvalTask;
using eval::SampleScore;

/// What `xserv eval` runs, with a plan or against --endpoint: --task, --data (its problems, up
/// to --limit), --samples, --max-tokens, --reasoning and the sampling flags.
struct EvalOptions {
  EvalTask task = EvalTask::Gsm8k;
  std::filesystem::path data;
  std::vector<EvalProblem> problems;
  size_t samples_per_problem = 1;
  int64_t max_tokens = 2048;
  models::ReasoningEffort effort = models::ReasoningEffort::Medium;
  engine::SamplerOptions sampling;
};

/// Reads and checks those options and the problems, so every usage mistake surfaces before a
/// model loads or a server is called: UsageError for a missing or bad flag, xserv::Error for a
/// data file without problems.
EvalOptions read_eval_options(const ParsedArgs& args);

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
