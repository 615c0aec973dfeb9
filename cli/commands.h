// The xserv subcommands: each takes its arguments (after the command name) and returns an exit
// code.
#pragma once

#include <string>
#include <vector>

#include "base/progress.h"
#include "cli/args.h"
#include "engine/logit_adjust.h"
#include "runtime/sampler.h"

namespace xserv::cli {

struct Command {
  CommandSpec spec;
  int (*run)(const ParsedArgs& args);
};

/// Every command, in the order `xserv --help` lists them.
const std::vector<Command>& commands();

int cmd_bench(const ParsedArgs& args);
int cmd_chat(const ParsedArgs& args);
int cmd_compile(const ParsedArgs& args);
int cmd_eval(const ParsedArgs& args);
int cmd_inspect(const ParsedArgs& args);
int cmd_worker(const ParsedArgs& args);
int cmd_run(const ParsedArgs& args);
int cmd_serve(const ParsedArgs& args);
/// `xserv eval --endpoint URL`: the evaluation through an OpenAI-compatible chat endpoint.
int eval_endpoint(const ParsedArgs& args);
int cmd_synth(const ParsedArgs& args);
int cmd_tokenize(const ParsedArgs& args);
int cmd_trace(const ParsedArgs& args);

/// Sampling from --temperature (0: greedy), --top-p, --top-k and --seed, for commands that
/// declare them. Throws UsageError on a negative temperature or a top-p outside (0, 1].
runtime::SamplerOptions sampling_options(const ParsedArgs& args);
/// --logit-bias ID:B,..., --presence-penalty, --frequency-penalty and --repetition-penalty, for
/// commands that declare them (run, chat): UsageError naming the flag for a
/// value out of range or an id outside [0, vocab).
engine::LogitAdjustments logit_adjustments(const ParsedArgs& args, int64_t vocab);
/// The ids of --prompt-ids (comma-separated, each in [0, 2^31)); a usage error otherwise.
std::vector<int32_t> parse_prompt_ids(const ParsedArgs& args);

/// A harmony reply streamed to stdout as it is parsed: the final channel's text, and with
/// show_reasoning every channel's, each new channel tagged "[name] " on a line of its own.
class ChannelEcho {
public:
  explicit ChannelEcho(bool show_reasoning) : show_(show_reasoning) {}
  /// Prints `text`, which the parser produced while in `channel` ("" before the first).
  void print(const std::string& channel, const std::string& text);
  /// Whether anything has been printed.
  bool printed() const { return !last_.empty(); }

private:
  bool show_;
  std::string last_; // the channel of the last text printed
};

} // namespace xserv::cli
