// `xserv run`: generate from token ids or from text (harmony chat format), streaming the answer.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/float_file.h"
#include "cli/model_source.h"
#include "cli/output_constraint.h"
#include "engine/constraint.h"
#include "models/harmony.h"

namespace xserv::cli {
namespace {

/// The prompt's rate, then the decode rate of the tokens after the first: the first token comes
/// with the prompt's last step, so counting it with the decode would charge the prompt to it.
void print_stats(const engine::GenerateStats& st, const engine::Model& e) {
  const int64_t after_first = std::max<int64_t>(st.generated_tokens - 1, 0);
  std::fprintf(stderr,
               "[run] %s: prompt %lld tokens in %.1f ms (%.1f tok/s, first token included), "
               "then %lld tokens in %.1f ms (%.2f tok/s)\n",
               e.backend().c_str(), static_cast<long long>(st.prompt_tokens), st.prompt_ms,
               double(st.prompt_tokens) / std::max(st.prompt_ms, 1e-9) * 1e3,
               static_cast<long long>(after_first), st.decode_ms,
               double(after_first) / std::max(st.decode_ms, 1e-9) * 1e3);
}

/// Says on stderr when a generation stopped because its sequence filled the plan's max-seq.
void note_max_seq(const engine::Generation& g, int64_t max_seq) {
  if (g.hit_max_seq)
    std::fprintf(stderr,
                 "[run] stopped after %zu tokens: the sequence reached the maximum length of %lld "
                 "(compile with a larger --max-seq)\n",
                 g.tokens.size(), static_cast<long long>(max_seq));
}

} // namespace

std::vector<int32_t> parse_prompt_ids(const ParsedArgs& args) {
  std::vector<int32_t> ids;
  for (const std::string& s : args.list("--prompt-ids")) {
    char* end = nullptr;
    long v = std::strtol(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || v < 0 || v > INT32_MAX)
      throw UsageError(fmt::format("--prompt-ids: '{}' is not a token id", s));
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty())
    throw UsageError("--prompt-ids needs at least one id");
  return ids;
}

/// An engine check's message as the flag's: "top_p nan is outside (0, 1]" -> "--top-p nan is
/// outside (0, 1]", "logit_bias: id 7 ..." -> "--logit-bias: id 7 ...".
UsageError as_flag_error(const Error& e) {
  std::string what = e.what();
  std::replace(what.begin(), what.begin() + std::ptrdiff_t(std::min(what.find_first_of(" :"),
                                                                      what.size())),
               '_', '-');
  return UsageError("--" + what);
}

runtime::SamplerOptions sampling_options(const ParsedArgs& args) {
  runtime::SamplerOptions s;
  s.temperature = static_cast<float>(args.get_double("--temperature", 0.0));
  s.top_p = static_cast<float>(args.get_double("--top-p", 1.0));
  s.min_p = static_cast<float>(args.get_double("--min-p", 0.0));
  s.top_k = static_cast<int>(args.get_int("--top-k", 0, 0, 1 << 20));
  s.seed = static_cast<uint64_t>(args.get_int("--seed", 0, 0, INT64_MAX));
  try {
    runtime::validate(s);
  } catch (const Error& e) {
    throw as_flag_error(e);
  }
  return s;
}

/// --logit-bias ID:B,..., --presence-penalty, --frequency-penalty, --repetition-penalty; the
/// engine's range checks name the flag.
engine::LogitAdjustments logit_adjustments(const ParsedArgs& args, int64_t vocab) {
  engine::LogitAdjustments a;
  for (const std::string& item : args.list("--logit-bias")) {
    const size_t colon = item.find(':');
    char* end = nullptr;
    const long id = colon == std::string::npos ? -1 : std::strtol(item.c_str(), &end, 10);
    const double bias = colon == std::string::npos ? 0 : std::strtod(item.c_str() + colon + 1, nullptr);
    if (colon == std::string::npos || end != item.c_str() + colon || id < 0 || id > INT32_MAX)
      throw UsageError(fmt::format("--logit-bias: '{}' is not ID:BIAS", item));
    a.bias.emplace_back(int32_t(id), float(bias));
  }
  a.presence_penalty = float(args.get_double("--presence-penalty", 0.0));
  a.frequency_penalty = float(args.get_double("--frequency-penalty", 0.0));
  a.repetition_penalty = float(args.get_double("--repetition-penalty", 1.0));
  try {
    engine::check_adjustments(a, vocab);
  } catch (const Error& e) {
    throw as_flag_error(e);
  }
  return a;
}

int cmd_run(const ParsedArgs& args) {
  const bool ids_mode = args.has("--prompt-ids"), text_mode = args.has("--prompt");
  if (ids_mode == text_mode)
    throw UsageError("give exactly one of --prompt-ids 1,2,3 or --prompt \"text\"");
  // These shape the harmony chat prompt --prompt renders: with ids or raw text they would be
  // ignored, which a caller asking for them should hear about.
  if (ids_mode || args.has("--raw"))
    for (const char* flag : {"--system", "--reasoning", "--date", "--show-reasoning"})
      if (args.has(flag))
        throw UsageError(fmt::format("{} shapes the chat prompt of --prompt; with {} it would be "
                                     "ignored",
                                     flag, ids_mode ? "--prompt-ids" : "--prompt --raw"));
  const std::optional<engine::GrammarSpec> grammar = output_grammar(args);
  if (grammar && ids_mode)
    throw UsageError(fmt::format("{} goes with --prompt (the output is decoded as text)",
                                 grammar->field));
  if (args.has("--stop-at-eos") && !ids_mode)
    throw UsageError("--stop-at-eos goes with --prompt-ids (a chat prompt stops at harmony's "
                     "stop tokens)");
  // Checked before loading anything.
  const std::string date = parse_date(args.get("--date"), "--date");
  models::ReasoningEffort effort = models::ReasoningEffort::Medium;
  try {
    effort = models::parse_reasoning_effort(args.get("--reasoning", "medium"));
  } catch (const Error& e) {
    throw UsageError(fmt::format("--reasoning: {}", e.what()));
  }
  // A plan runs with the batch it was compiled for (its launch table is for that many rows);
  // a checkpoint directory needs one row.
  ModelSource src = resolve_source(args.positional()[0], args);
  if (!args.has("--max-batch") && !src.plan)
    src.max_batch = 1;
  engine::Request req;
  req.max_tokens = args.get_int("--max-tokens", 128, 1, 1 << 24);
  req.sampling = sampling_options(args);

  if (ids_mode) {
    req.prompt = parse_prompt_ids(args);
    auto model = make_model(src, args);
    req.adjust = logit_adjustments(args, model->config().vocab_size);
    if (args.has("--stop-at-eos"))
      req.stop_ids = model->config().eos_ids();
    engine::GenerateStats st;
    engine::EventCallback on_event;
    std::optional<FloatFile> logits_file;
    size_t rows = 0;
    const std::string logits_path = args.get("--logits-out", "");
    if (!logits_path.empty()) {
      logits_file.emplace(logits_path, "--logits-out: ");
      req.return_logits = true;
      on_event = [&](size_t, const engine::Event& ev) {
        if (!ev.logits.empty()) {
          logits_file->write(ev.logits.data(), ev.logits.size());
          ++rows;
        }
        return true;
      };
    }
    const std::vector<engine::Generation> out = engine::generate(*model, {req}, on_event, {}, &st);
    engine::throw_if_failed(out); // before the logits file is committed
    if (logits_file) {
      logits_file->commit();
      std::fprintf(stderr, "[run] %zu logits rows of %lld float32 values in %s\n", rows,
                   static_cast<long long>(model->config().vocab_size), logits_path.c_str());
    }
    std::string line;
    for (size_t i = 0; i < out[0].tokens.size(); ++i) {
      line += i ? "," : "";
      line += std::to_string(out[0].tokens[i]);
    }
    std::cout << line << std::endl;
    note_max_seq(out[0], model->max_seq());
    print_stats(st, *model);
    return 0;
  }

  if (args.has("--logits-out"))
    throw UsageError("--logits-out goes with --prompt-ids");
  models::Tokenizer tok = load_tokenizer(src, args);
  const bool raw = args.has("--raw"), show_reasoning = args.has("--show-reasoning");
  if (raw) {
    auto ids = tok.encode(args.get("--prompt"));
    req.prompt.assign(ids.begin(), ids.end());
  } else {
    models::ChatPrompt chat;
    chat.user = args.get("--prompt");
    chat.instructions = args.get("--system");
    chat.effort = effort;
    chat.current_date = date;
    auto msgs = models::make_chat(chat);
    if (grammar && grammar->kind == engine::GrammarSpec::Kind::JsonSchema) {
      // The schema goes to the developer message too, where gpt-oss reads it.
      auto dev = std::find_if(msgs.begin(), msgs.end(), [](auto& m) { return m.developer; });
      if (dev == msgs.end())
        dev = msgs.insert(msgs.begin() + 1, models::Message::make_developer({}));
      dev->developer->response_formats.push_back({"answer", "", grammar->text});
    }
    auto ids = models::render_for_completion(tok, msgs);
    req.prompt.assign(ids.begin(), ids.end());
    req.stop_ids = models::stop_token_ids();
  }
  auto model = make_model(src, args);
  req.adjust = logit_adjustments(args, model->config().vocab_size);
  if (grammar) {
    req.constraint = compile_output(*grammar, tok, *model, !raw);
    if (raw) // the grammar ends at an eos id: generation stops there
      req.stop_ids = model->config().eos_ids();
  }
  models::StreamParser parser(tok);
  models::StreamDecoder decoder(tok);
  ChannelEcho echo(show_reasoning);
  engine::GenerateStats st;
  const std::vector<engine::Generation> out = engine::generate(
      *model, {req},
      [&](size_t, const engine::Event& ev) {
        if (ev.token < 0)
          return true;
        const int32_t id = ev.token;
        if (raw) {
          if (ev.finish != engine::FinishReason::Stop) // a stop id is not part of the text
            std::cout << decoder.push(static_cast<models::TokenId>(id)) << std::flush;
          return true;
        }
        const std::string text = parser.push(static_cast<models::TokenId>(id));
        echo.print(parser.current_channel(), text);
        return !parser.stopped();
      },
      {}, &st);
  if (raw)
    std::cout << decoder.flush();
  std::cout << std::endl;
  engine::throw_if_failed(out);
  note_max_seq(out[0], model->max_seq());
  print_stats(st, *model);
  return 0;
}

} // namespace xserv::cli
