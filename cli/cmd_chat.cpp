// `xserv chat`: an interactive multi-turn conversation on stdin, replies streamed as generated.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>
#include <unistd.h>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/model_source.h"
#include "models/harmony.h"

namespace xserv::cli {
namespace {

constexpr const char* kHelp =
    "commands: /reset (forget the conversation), /stats (tokens and speed), /set KEY=VALUE\n"
    "          (reasoning=low|medium|high, temperature=T, top_p=P, seed=S, max_tokens=N),\n"
    "          /quit (or end of input)\n";

/// Token counts and time of a turn, or summed over turns.
struct TurnStats {
  int64_t turns = 0, prompt_tokens = 0, generated_tokens = 0;
  double seconds = 0;
  void add(const TurnStats& t) {
    turns += t.turns;
    prompt_tokens += t.prompt_tokens;
    generated_tokens += t.generated_tokens;
    seconds += t.seconds;
  }
  std::string describe() const {
    return fmt::format("{} prompt + {} generated tokens in {:.2f} s ({:.1f} tok/s generated)",
                       prompt_tokens, generated_tokens, seconds,
                       static_cast<double>(generated_tokens) / std::max(seconds, 1e-9));
  }
};

/// Everything a conversation needs across turns.
struct ChatSession {
  ChatSession(models::Tokenizer t, engine::Model& m) : tok(std::move(t)), model(m) {}

  models::Tokenizer tok;
  engine::Model& model;
  std::string instructions, date;
  models::ReasoningEffort effort = models::ReasoningEffort::Medium;
  runtime::SamplerOptions sampling;
  engine::LogitAdjustments adjust;
  int64_t max_tokens = 1024;
  bool show_reasoning = false;
  std::vector<models::Message> conversation; // user and assistant messages, oldest first
  TurnStats last, total;

  /// The conversation after the system (and developer) messages that the settings give.
  std::vector<models::Message> full_conversation() const {
    models::SystemContent sys;
    sys.reasoning_effort = effort;
    sys.current_date = date;
    std::vector<models::Message> msgs = {models::Message::make_system(sys)};
    if (!instructions.empty())
      msgs.push_back(models::Message::make_developer({.instructions = instructions, .tools = {}}));
    msgs.insert(msgs.end(), conversation.begin(), conversation.end());
    return msgs;
  }

  /// Generates the reply to `text`, streaming it to stdout, and keeps both in the conversation.
  /// The engine has no prefix cache yet, so every turn re-runs the whole conversation through
  /// prefill; a cache keyed by the rendered prefix would make a turn cost only its new tokens.
  void turn(const std::string& text) {
    conversation.push_back(models::Message::user(text));
    engine::Request req;
    auto ids = models::render_for_completion(tok, full_conversation());
    req.prompt.assign(ids.begin(), ids.end());
    req.max_tokens = max_tokens;
    req.sampling = sampling;
    req.sampling.seed = sampling.seed + static_cast<uint64_t>(total.turns);
    req.adjust = adjust;
    req.stop_ids = models::stop_token_ids();
    models::StreamParser parser(tok);
    ChannelEcho echo(show_reasoning);
    engine::GenerateStats st;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      const std::vector<engine::Generation> gens = engine::generate(
          model, {req},
          [&](size_t, const engine::Event& ev) {
            if (ev.token < 0)
              return true;
            const int32_t id = ev.token;
            const std::string piece = parser.push(static_cast<models::TokenId>(id));
            echo.print(parser.current_channel(), piece);
            return !parser.stopped();
          },
          {}, &st);
      engine::throw_if_failed(gens);
    } catch (const Error& e) {
      conversation.pop_back();
      std::cout << std::endl;
      std::fprintf(stderr, "error: %s (/reset starts a new conversation)\n", e.what());
      return;
    }
    parser.finish();
    if (!echo.printed()) // e.g. random weights, or max_tokens spent on the analysis
      std::cout << fmt::format("(no reply text in {} generated tokens)", st.generated_tokens);
    std::cout << std::endl;
    // Harmony drops the analysis of earlier turns when re-rendering (auto_drop_analysis).
    for (const models::Message& m : parser.messages())
      conversation.push_back(m);
    last = {1, st.prompt_tokens, st.generated_tokens,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
    total.add(last);
  }

  /// Applies one "/set key=value"; returns an error message, empty on success.
  std::string set(const std::string& kv) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos)
      return fmt::format("/set expects KEY=VALUE, got '{}'", kv);
    const std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
    char* end = nullptr;
    const double num = std::strtod(value.c_str(), &end);
    const bool is_num = !value.empty() && *end == '\0';
    if (key == "reasoning") {
      try {
        effort = models::parse_reasoning_effort(value);
      } catch (const Error&) {
        return fmt::format("reasoning must be low, medium or high, got '{}'", value);
      }
    } else if (key == "temperature" && is_num && num >= 0) {
      sampling.temperature = static_cast<float>(num);
    } else if (key == "top_p" && is_num && num > 0 && num <= 1) {
      sampling.top_p = static_cast<float>(num);
    } else if (key == "seed" && is_num && num >= 0 && num == static_cast<uint64_t>(num)) {
      sampling.seed = static_cast<uint64_t>(num);
    } else if (key == "max_tokens" && is_num && num >= 1 && num == static_cast<int64_t>(num)) {
      max_tokens = static_cast<int64_t>(num);
    } else if (key == "reasoning" || key == "temperature" || key == "top_p" || key == "seed" ||
               key == "max_tokens") {
      return fmt::format("bad value '{}' for {}", value, key);
    } else {
      return fmt::format("unknown setting '{}' (reasoning, temperature, top_p, seed, max_tokens)",
                         key);
    }
    return "";
  }

  /// Runs one slash command; returns false on /quit.
  bool command(const std::string& line) {
    std::istringstream in(line);
    std::string cmd, arg;
    in >> cmd;
    if (cmd == "/quit" || cmd == "/exit")
      return false;
    if (cmd == "/reset") {
      conversation.clear();
      std::cout << "(conversation cleared)" << std::endl;
    } else if (cmd == "/stats") {
      std::cout << "last turn: " << (last.turns ? last.describe() : "none") << "\n"
                << "total (" << total.turns << " turns): " << total.describe() << "\n"
                << "conversation: " << conversation.size() << " messages, reasoning "
                << models::effort_name(effort) << ", temperature " << sampling.temperature
                << ", max_tokens " << max_tokens << std::endl;
    } else if (cmd == "/set") {
      bool any = false;
      while (in >> arg) {
        any = true;
        if (std::string err = set(arg); !err.empty())
          std::cout << "error: " << err << std::endl;
      }
      if (!any)
        std::cout << "error: /set expects KEY=VALUE" << std::endl;
    } else if (cmd == "/help") {
      std::cout << kHelp << std::flush;
    } else {
      std::cout << "unknown command '" << cmd << "'\n" << kHelp << std::flush;
    }
    return true;
  }
};

} // namespace

int cmd_chat(const ParsedArgs& args) {
  // The flags are checked before loading anything.
  const std::string date = parse_date(args.get("--date"), "--date");
  models::ReasoningEffort effort = models::ReasoningEffort::Medium;
  try {
    effort = models::parse_reasoning_effort(args.get("--reasoning", "medium"));
  } catch (const Error& e) {
    throw UsageError(fmt::format("--reasoning: {}", e.what()));
  }
  ModelSource src = resolve_source(args.positional()[0], args);
  if (!src.plan) // a plan keeps the batch its launch table was compiled for
    src.max_batch = 1;
  std::unique_ptr<engine::Model> model = make_model(src, args);
  ChatSession chat(load_tokenizer(src, args), *model);
  chat.instructions = args.get("--system");
  chat.date = date;
  chat.effort = effort;
  chat.sampling = sampling_options(args);
  chat.adjust = logit_adjustments(args, model->config().vocab_size);
  chat.max_tokens = args.get_int("--max-tokens", 1024, 1, 1 << 24);
  chat.show_reasoning = args.has("--show-reasoning");

  const bool tty = isatty(STDIN_FILENO) != 0;
  if (tty)
    std::cout << "xserv chat (" << model->backend() << "): /help for commands, /quit to leave\n";
  std::string line;
  while (true) {
    if (tty)
      std::cout << "> " << std::flush;
    if (!std::getline(std::cin, line)) {
      if (tty)
        std::cout << std::endl;
      break;
    }
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos)
      continue;
    line = line.substr(first, line.find_last_not_of(" \t\r") - first + 1);
    if (line[0] == '/') {
      if (!chat.command(line))
        break;
      continue;
    }
    chat.turn(line);
  }
  return 0;
}

} // namespace xserv::cli
