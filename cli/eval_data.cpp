// The options and progress line of `xserv eval` (the tasks themselves: models/eval_tasks.h).
#include "cli/eval_data.h"

#include <cstdio>

#include <fmt/format.h>

#include "cli/commands.h"

namespace xserv::cli {

void EvalProgressBar::update(size_t done, size_t correct, size_t samples, int64_t tokens,
                             double seconds) {
  const double acc = samples ? 100.0 * static_cast<double>(correct) / samples : 0.0;
  const double tps = static_cast<double>(tokens) / std::max(seconds, 1e-9);
  if (tty_) {
    constexpr size_t kWidth = 30;
    const size_t filled = problems_ ? done * kWidth / problems_ : kWidth;
    std::string bar(filled, '#');
    bar.append(kWidth - filled, '.');
    std::string text =
        fmt::format("\r[eval] [{}] {}/{}  acc {:.1f}% ({}/{})  {:.1f} tok/s  {:.0f} s", bar, done,
                    problems_, acc, correct, samples, tps, seconds);
    std::fputs(text.c_str(), stderr);
    std::fflush(stderr);
    drawn_ = true;
    return;
  }
  const size_t step = std::max<size_t>(1, problems_ / 10);
  if (done == last_printed_ || (done % step != 0 && done != problems_))
    return;
  last_printed_ = done;
  std::string text = fmt::format(
      "[eval] {}/{} problems, accuracy {:.1f}% ({}/{} samples), {:.1f} tok/s, {:.1f} s\n", done,
      problems_, acc, correct, samples, tps, seconds);
  std::fputs(text.c_str(), stderr);
}

void EvalProgressBar::finish() {
  if (drawn_)
    std::fputs("\n", stderr);
  drawn_ = false;
}

EvalOptions read_eval_options(const ParsedArgs& args) {
  EvalOptions o;
  if (!args.has("--task"))
    throw UsageError("missing --task gsm8k|aime25");
  o.task = eval::parse_eval_task(args.get("--task"));
  if (!args.has("--data"))
    throw UsageError("missing --data FILE (a JSONL file of problems)");
  o.data = args.get("--data");
  if (!std::filesystem::is_regular_file(o.data))
    throw UsageError(fmt::format("data file '{}' does not exist", o.data.string()));
  const int64_t limit = args.get_int("--limit", 0, 1, INT32_MAX);
  o.samples_per_problem = static_cast<size_t>(args.get_int("--samples", 1, 1, 1 << 16));
  o.max_tokens = args.get_int("--max-tokens", 2048, 1, 1 << 24);
  try {
    o.effort = models::parse_reasoning_effort(args.get("--reasoning", "medium"));
  } catch (const Error& e) {
    throw UsageError(fmt::format("--reasoning: {}", e.what()));
  }
  o.sampling = sampling_options(args);
  o.problems = eval::read_eval_problems(o.data, o.task, limit);
  if (o.problems.empty())
    throw Error(fmt::format("{}: no problems in the file", o.data.string()));
  return o;
}

} // namespace xserv::cli
