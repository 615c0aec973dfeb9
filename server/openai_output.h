// Generated harmony ids -> an OpenAI chat message (content, reasoning, tool_calls), tolerantly.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "models/tokenizer.h"

namespace xserv::server::openai {

/// One function call the model made (a commentary message to functions.NAME).
struct ToolCall {
  std::string id; ///< "call_..."
  std::string name;
  std::string arguments; ///< JSON text as the model wrote it
};

/// A piece of output as a stream delivers it.
struct OutputPiece {
  enum class Kind { Content, Reasoning, ToolStart, ToolArguments };
  Kind kind = Kind::Content;
  std::string text;    ///< the new text (ToolStart: empty)
  int tool_index = -1; ///< ToolStart / ToolArguments: the call's position in tool_calls()
};

/// Turns the ids generated after a prompt that ends in `<|start|>assistant` into message
/// fields. Channels: final and commentary without recipient -> content, analysis -> reasoning,
/// a message to functions.NAME -> a tool call. Malformed output never throws: a header that
/// never reaches <|message|> (within 64 ids, or before the output ends) or has no channel
/// markup turns into content text, special ids that do not belong in text are dropped, and a
/// <|start|> or <|channel|> inside a message begins the next one.
class HarmonyOutput {
public:
  /// `call_id_prefix` is put before each tool call's index to make its id.
  explicit HarmonyOutput(models::Tokenizer tok, std::string call_id_prefix = "call_");

  /// Consumes one generated id; returns what it added (possibly nothing).
  std::vector<OutputPiece> push(models::TokenId id);
  /// Ends the output: a message or header still open is completed with what it has.
  std::vector<OutputPiece> finish();

  /// Everything so far, as the non-streaming response reports it.
  const std::string& content() const { return content_; }
  const std::string& reasoning() const { return reasoning_; }
  const std::vector<ToolCall>& tool_calls() const { return tool_calls_; }
  /// Inside an analysis message's text (after its <|message|>, before its end).
  bool in_reasoning() const { return state_ == State::Content && target_ == Target::Reasoning; }

private:
  enum class State { Header, Content, BetweenMessages };
  enum class Target { Content, Reasoning, Tool, Drop };
  void open_message(std::vector<OutputPiece>& out);
  void degrade_header(std::vector<OutputPiece>& out);
  void emit(std::vector<OutputPiece>& out, std::string text);
  void close_message(std::vector<OutputPiece>& out);

  models::Tokenizer tok_;
  models::StreamDecoder decoder_;
  std::string call_id_prefix_;
  models::TokenId start_, message_, end_, channel_, constrain_, return_, call_;
  State state_ = State::Header;
  Target target_ = Target::Content;
  std::vector<models::TokenId> header_;
  std::string content_, reasoning_;
  std::vector<ToolCall> tool_calls_;
};

/// Finds stop strings in streamed text: holds back a tail that could begin a stop string so
/// that no part of one is ever sent.
class StopMatcher {
public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  /// Appends `text`; returns what is safe to send now. After a match, returns the text before
  /// it and matched() is true (later calls return "").
  std::string push(std::string_view text);
  /// The held-back tail at the end of the stream (empty after a match).
  std::string flush();
  bool matched() const { return matched_; }

private:
  std::vector<std::string> stops_;
  std::string held_;
  bool matched_ = false;
};

} // namespace xserv::server::openai
