// Per-request conversion of engine events into OpenAI chat / text completion JSON.
#pragma once

#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/openai_output.h"
#include "server/openai_request.h"

namespace xserv::server {

/// Turns one chat request's events into message deltas (streaming) and the final message.
/// Stop strings apply to the content (final channel) text; when one matches, the caller is
/// told to abort the request (stop_hit()) and later text is dropped.
class ChatSession {
public:
  ChatSession(models::Tokenizer tok, const openai::GenParams& params, const std::string& id);
  /// The deltas ({"content": ...}, {"reasoning": ...}, {"tool_calls": [...]}) an event adds;
  /// `logprobs` receives its logprobs entries ({"token", "logprob", "bytes", "top_logprobs"}).
  std::vector<openai::Json> on_event(const engine::Event& ev, openai::Json& logprobs);
  /// A stop string matched, or the model made its last tool call: abort the engine request.
  bool stop_hit() const { return stop_.matched() || calls_done_; }
  /// The reason for the client: stop, length, tool_calls or abort (after the finish event).
  const std::string& finish_reason() const { return finish_; }
  /// The assistant message of the non-streaming response.
  openai::Json message() const;
  /// Generated ids that belong to analysis messages (from their <|message|> to their end).
  int64_t reasoning_tokens() const { return reasoning_tokens_; }

private:
  void add_pieces(std::vector<openai::OutputPiece> pieces, std::vector<openai::Json>& deltas);
  /// One generated id into the message: its logprobs entry, its deltas.
  void take(const engine::Event& ev, std::vector<openai::Json>& deltas, openai::Json& logprobs);
  /// pending_ holds a whole header: the assistant's message to functions.NAME.
  bool next_call_header() const;
  models::Tokenizer tok_;
  openai::HarmonyOutput out_;
  openai::StopMatcher stop_;
  int top_logprobs_;
  std::string content_, finish_;
  // Several tool calls in one turn: when <|call|> is not a stop id (a request with tools), a
  // <|call|> closes one call; a <|start|> right after it may begin another. Its header is held
  // back (pending_) until its <|message|>: the assistant's message to functions.NAME goes on
  // as the next call; any other message (a tool's reply or a final answer the model wrote
  // without the call's result), another id after <|call|>, a header longer than
  // kMaxCallHeader ids or the output's end ends the turn (calls_done_: what was held back is
  // dropped and the request is aborted).
  static constexpr size_t kMaxCallHeader = 64;
  models::TokenId call_id_, start_id_, message_id_;
  bool after_call_ = false, calls_done_ = false;
  std::vector<engine::Event> pending_;
  int64_t reasoning_tokens_ = 0;
};

/// The same for a text completion: generated text without specials, stop strings applied.
/// With `echo` (the prompt's ids) the first event's text starts with the prompt's, and with
/// logprobs its tokens lead the arrays: the first with a null log-probability, the others with
/// those of the event's Event::prompt_logprobs (null where it has none); a stop id then has
/// its entry too (no text).
class CompletionSession {
public:
  CompletionSession(models::Tokenizer tok, const openai::GenParams& params,
                    std::vector<int32_t> echo = {});
  /// The text an event adds; `logprobs` (legacy completions format, an object of arrays)
  /// receives its tokens.
  std::string on_event(const engine::Event& ev, openai::Json& logprobs);
  bool stop_hit() const { return stop_.matched(); }
  const std::string& finish_reason() const { return finish_; }
  const std::string& text() const { return text_; }

private:
  models::Tokenizer tok_;
  models::StreamDecoder decoder_;
  openai::StopMatcher stop_;
  int top_logprobs_;
  std::string text_, finish_;
  std::vector<int32_t> echo_; ///< the prompt still to echo (emptied by the first event)
  bool echoed_;               ///< an echoed completion
};

/// OpenAI's name for an engine finish: "stop", "length", "abort".
std::string finish_reason_name(engine::FinishReason r);

/// {"prompt_tokens", "completion_tokens", "total_tokens"}.
openai::Json usage_json(int64_t prompt, int64_t completion);

} // namespace xserv::server
