// `xserv run`: generate from token ids or from text (harmony chat format), streaming the answer.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/float_file.h"
#include "cli/model_source.h"
#include "models/harmony.h"

namespace xserv::cli {
namespace {

void print_stats(const GenStats& st, const Engine& e) {
  std::fprintf(stderr,
               "[run] %s: prompt %lld tokens in %.1f ms (%.1f tok/s), generated %lld tokens in "
               "%.1f ms (%.2f tok/s)\n",
               e.backend().c_str(), static_cast<long long>(st.prompt_tokens), st.prefill_ms,
               st.prompt_tokens / std::max(st.prefill_ms, 1e-9) * 1e3,
               static_cast<long long>(st.generated_tokens), st.prefill_ms + st.decode_ms,
               st.generated_tokens / std::max(st.prefill_ms + st.decode_ms, 1e-9) * 1e3);
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

runtime::SamplerOptions sampling_options(const ParsedArgs& args) {
  runtime::SamplerOptions s;
  s.temperature = static_cast<float>(args.get_double("--temperature", 0.0));
  s.top_p = static_cast<float>(args.get_double("--top-p", 1.0));
  s.top_k = static_cast<int>(args.get_int("--top-k", 0, 0, 1 << 20));
  s.seed = static_cast<uint64_t>(args.get_int("--seed", 0, 0, INT64_MAX));
  if (s.temperature < 0 || s.top_p <= 0 || s.top_p > 1)
    throw UsageError("--temperature must be >= 0 and --top-p in (0, 1]");
  return s;
}

int cmd_run(const ParsedArgs& args) {
  const bool ids_mode = args.has("--prompt-ids"), text_mode = args.has("--prompt");
  if (ids_mode == text_mode)
    throw UsageError("give exactly one of --prompt-ids 1,2,3 or --prompt \"text\"");
  ModelSource src = resolve_source(args.positional()[0], args);
  if (!args.has("--max-batch"))
    src.max_batch = 1;
  GenRequest req;
  req.max_tokens = args.get_int("--max-tokens", 128, 1, 1 << 24);
  req.sampling = sampling_options(args);

  if (ids_mode) {
    req.prompt = parse_prompt_ids(args);
    auto engine = make_engine(src, args);
    for (int64_t id : engine->config().eos_token_ids)
      if (args.has("--stop-at-eos"))
        req.stop_ids.push_back(static_cast<int32_t>(id));
    GenStats st;
    LogitsCallback on_logits;
    std::optional<FloatFile> logits_file;
    size_t rows = 0;
    const std::string logits_path = args.get("--logits-out", "");
    if (!logits_path.empty()) {
      logits_file.emplace(logits_path, "--logits-out: ");
      on_logits = [&](size_t, const std::vector<float>& row) {
        logits_file->write(row.data(), row.size());
        ++rows;
      };
    }
    const std::vector<GenResult> out = generate(*engine, {req}, {}, &st, on_logits);
    if (logits_file) {
      logits_file->commit();
      std::fprintf(stderr, "[run] %zu logits rows of %lld float32 values in %s\n", rows,
                   static_cast<long long>(engine->config().vocab_size), logits_path.c_str());
    }
    std::string line;
    for (size_t i = 0; i < out[0].tokens.size(); ++i) {
      line += i ? "," : "";
      line += std::to_string(out[0].tokens[i]);
    }
    std::cout << line << std::endl;
    print_stats(st, *engine);
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
    chat.effort = models::parse_reasoning_effort(args.get("--reasoning", "medium"));
    chat.current_date = args.get("--date");
    auto msgs = models::make_chat(chat);
    auto ids = models::render_for_completion(tok, msgs);
    req.prompt.assign(ids.begin(), ids.end());
    req.stop_ids = {200002, 200012};
  }
  auto engine = make_engine(src, args);
  models::StreamParser parser(tok);
  models::StreamDecoder decoder(tok);
  std::string last_channel;
  GenStats st;
  generate(
      *engine, {req},
      [&](size_t, int32_t id) {
        if (raw) {
          std::cout << decoder.push(static_cast<models::TokenId>(id)) << std::flush;
          return true;
        }
        std::string text = parser.push(static_cast<models::TokenId>(id));
        const std::string& ch = parser.current_channel();
        if (ch == "final" || (show_reasoning && !ch.empty())) {
          if (show_reasoning && ch != last_channel)
            std::cout << (last_channel.empty() ? "" : "\n") << "[" << ch << "] ";
          last_channel = ch;
          std::cout << text << std::flush;
        }
        return !parser.stopped();
      },
      &st);
  if (raw)
    std::cout << decoder.flush();
  std::cout << std::endl;
  print_stats(st, *engine);
  return 0;
}

} // namespace xserv::cli
