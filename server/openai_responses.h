// The OpenAI Responses API (/v1/responses) on top of chat completions: a request becomes the
// equivalent chat body (the same validation, the same harmony prompt), and chat deltas become
// output items (reasoning, message, function_call) and the API's typed stream events.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "server/openai_request.h"

namespace xserv::server::openai {

/// A /v1/responses body, translated.
struct ResponsesRequest {
  /// The chat completions body with the same meaning (parse_chat_request takes it): `input`
  /// as messages (instructions first, as a developer message), function tools in chat form,
  /// max_output_tokens as max_tokens, reasoning.effort as reasoning_effort.
  Json chat;
  /// What the response object echoes: instructions, max_output_tokens, temperature, top_p,
  /// tool_choice, tools (as given), parallel_tool_calls, reasoning, metadata (nulls where absent).
  Json echo;
  bool stream = false;
};

/// Translates and validates a Responses body. Fields unknown to the API, of the wrong type, or
/// options this server does not provide (previous_response_id: it keeps no responses; built-in
/// tools; non-text input parts; include; reasoning summaries) throw ApiError 400 naming the
/// field as the client wrote it ("input[2].call_id", "max_output_tokens"). The body's large
/// values (metadata, tools) move into the echo rather than being copied.
ResponsesRequest parse_responses_request(Json body);

/// parse_chat_request on a translated body, with any error's field named as the Responses
/// request names it (max_tokens -> max_output_tokens, messages -> input).
/// A chat request's error as the Responses request's fields name it (max_output_tokens, input,
/// text.format).
ApiError as_responses_error(const ApiError& e);

ChatRequest parse_responses_chat(const ResponsesRequest& r);

/// Chat deltas ({"content"}, {"reasoning"}, {"tool_calls": [...]}, as ChatSession gives them)
/// -> the Responses output: items in the order the model produced them (a new item whenever the
/// kind changes) and, for streams, the events that build them (each {"type", ...}, without
/// sequence_number: the sender numbers them).
class ResponsesOutput {
public:
  /// `suffix` makes the items' ids unique to the response (rs_, msg_, fc_ + suffix + index).
  explicit ResponsesOutput(std::string suffix) : suffix_(std::move(suffix)) {}
  /// The events one delta adds.
  std::vector<Json> push(const Json& delta);
  /// Closes the open item (`complete`: its status is "completed", else "incomplete"); an
  /// output with no item at all gets an empty message, so output[0] always exists.
  std::vector<Json> finish(bool complete);
  /// The output items so far (each in its final form once closed).
  const Json& output() const { return output_; }
  /// The text of the message items.
  std::string output_text() const;

private:
  enum class Open { None, Reasoning, Message, Call };
  std::vector<Json> open(Open kind, const Json& call);
  std::vector<Json> close(bool complete);
  std::string suffix_;
  Json output_ = Json::array();
  Open open_ = Open::None;
  std::string text_; ///< the open item's text (reasoning, message text, call arguments)
};

/// The response object: `status` completed, incomplete (with incomplete_details
/// {"reason": "max_output_tokens"}), cancelled or in_progress; usage with input, output and
/// reasoning tokens.
Json response_object(const std::string& id, int64_t created_at, const std::string& model,
                     const Json& echo, const std::string& status, const Json& output,
                     int64_t input_tokens, int64_t output_tokens, int64_t reasoning_tokens);

/// The Responses status of a chat finish reason: stop, tool_calls -> completed; length ->
/// incomplete; abort -> cancelled.
std::string responses_status(const std::string& finish_reason);

/// The stream's error event: {"type": "error", "code", "message", "param"}.
Json responses_error_event(const ApiError& e);

} // namespace xserv::server::openai
