// OpenAI-compatible request bodies: typed, range-checked parsing and chat messages -> harmony.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/constraint.h"
#include "engine/engine.h"
#include "models/harmony.h"
#include "server/api_error.h"

namespace xserv::server::openai {

/// Generation parameters shared by chat and text completions.
struct GenParams {
  engine::SamplerOptions sampling;
  std::optional<int64_t> max_tokens; ///< unset: up to the model's max_seq
  std::vector<std::string> stop;     ///< stop strings (never empty strings)
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false; ///< do not stop at the model's end-of-sequence ids
  int top_logprobs = -1;   ///< -1: no logprobs; 0..20: logprobs with that many alternatives
  bool stream = false;
  bool include_usage = false; ///< stream_options.include_usage
  int n = 1;                  ///< choices (1..engine::kMaxChoices; the engine may cap it lower)
  /// Structured output asked for (response_format, strict tools, completions' json_schema /
  /// regex / grammar); compiled by the server against the vocabulary.
  engine::ConstraintRequest constraint;
  /// logit_bias, presence / frequency / repetition penalties.
  engine::LogitAdjustments adjust;
};

/// A parsed /v1/chat/completions request.
struct ChatRequest {
  std::string model;
  std::vector<models::Message> messages; ///< harmony: system, developer, then the turns
  GenParams params;
};

/// A parsed /v1/completions request: a prompt as text or as token ids, without a template.
struct CompletionRequest {
  std::string model;
  std::optional<std::string> prompt_text;
  std::vector<int32_t> prompt_ids; ///< when the prompt was given as ids
  GenParams params;
  /// The prompt's text leads the completion's; with logprobs, its tokens' log-probabilities
  /// lead theirs (the first null).
  bool echo = false;
};

/// Parses and validates a chat completion body. Every field is typed and range-checked; fields
/// unknown to the schema, wrong types, out-of-range values and unsupported options
/// (penalties other than 0, ...) throw ApiError 400 naming the field in `param`.
ChatRequest parse_chat_request(const Json& body);

/// The same for a text completion body (`prompt`: a string, an array of one string, or an
/// array of token ids).
CompletionRequest parse_completion_request(const Json& body);

/// Throws ApiError 400 naming stop_token_ids or logit_bias when one of `p`'s ids lies outside
/// [0, vocab).
void check_stop_token_ids(const GenParams& p, int64_t vocab);

/// The harmony conversation of OpenAI chat `messages` (an array) with `tools` (null or an array
/// of function tools): a system message with the reasoning effort, a developer message with the
/// system/developer texts as instructions and the tools as the functions namespace, then the
/// turns. Assistant `reasoning`/`reasoning_content` become analysis messages, `tool_calls`
/// commentary messages to functions.NAME, and tool messages are attributed by tool_call_id.
std::vector<models::Message> chat_to_harmony(const Json& messages, const Json& tools,
                                             models::ReasoningEffort effort);

} // namespace xserv::server::openai
