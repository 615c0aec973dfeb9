// The harmony chat format of gpt-oss: rendering conversations to ids and parsing generated ids.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "models/tokenizer.h"

namespace xserv::models {

enum class Role { System, Developer, User, Assistant, Tool };

/// "system", "developer", "user", "assistant", "tool".
std::string_view role_name(Role role);

enum class ReasoningEffort { Low, Medium, High };

/// "low", "medium", "high"; parse_reasoning_effort throws xserv::Error on anything else.
std::string_view effort_name(ReasoningEffort effort);
ReasoningEffort parse_reasoning_effort(std::string_view name);

/// One tool (function) the model may call.
struct ToolDescription {
  std::string name;
  std::string description;
  /// JSON schema of the arguments as JSON text, key order kept; empty for a tool without
  /// arguments. Rendered as a TypeScript type, as harmony does.
  std::string parameters;
  /// The client asked for its arguments to match `parameters` exactly (enforced by the server's
  /// structured output; rendering is the same).
  bool strict = false;
};

/// A response format of the developer message ("# Response Formats"): the JSON schema the
/// final answer follows, under its name.
struct ResponseFormat {
  std::string name;
  std::string description; ///< rendered as a "// " line above the schema; empty omits it
  std::string schema;      ///< JSON text
};

/// A namespace of tools: "functions" (developer message) or builtins like "browser", "python"
/// (system message). A namespace without tools renders its description as plain text.
struct ToolNamespace {
  std::string name;
  std::string description;
  std::vector<ToolDescription> tools;
};

/// The "# Tools" section for these namespaces, in name order (harmony keeps them in a sorted map).
std::string render_tools_section(std::span<const ToolNamespace> namespaces);

/// The structured system message. Defaults give the standard gpt-oss system prompt.
struct SystemContent {
  std::string model_identity = "You are ChatGPT, a large language model trained by OpenAI.";
  std::string knowledge_cutoff = "2024-06";
  std::string current_date; ///< "YYYY-MM-DD"; empty omits the line
  std::optional<ReasoningEffort> reasoning_effort = ReasoningEffort::Medium;
  std::vector<std::string> valid_channels = {"analysis", "commentary", "final"};
  bool channel_required = true;
  std::vector<ToolNamespace> tools; ///< builtin tools (browser, python)
};

/// The structured developer message: the user's system prompt and the function tools.
struct DeveloperContent {
  std::string instructions; ///< rendered as "# Instructions\n\n{instructions}"; empty omits it
  std::vector<ToolNamespace> tools;
  /// Rendered after the instructions as "# Response Formats\n\n## {name}\n\n{schema}".
  std::vector<ResponseFormat> response_formats = {};
};

/// One message. For system and developer messages `system` / `developer` are rendered when set,
/// otherwise `content` is used as is.
struct Message {
  Role role = Role::User;
  std::string name;         ///< tool messages: the tool, e.g. "functions.lookup_weather"
  std::string recipient;    ///< e.g. "functions.lookup_weather"; empty means everyone
  std::string channel;      ///< "analysis", "commentary", "final"; empty for none
  std::string content_type; ///< e.g. "<|constrain|>json" or "code"; empty for none
  std::string content;
  std::optional<SystemContent> system;
  std::optional<DeveloperContent> developer;

  static Message make_system(SystemContent content);
  static Message make_developer(DeveloperContent content);
  static Message user(std::string text);
  static Message assistant(std::string text, std::string channel = "final");
  /// A tool's answer to the assistant, e.g. tool("functions.lookup_weather", "{...}").
  static Message tool(std::string tool_name, std::string text, std::string channel = "");
};

struct RenderOptions {
  /// Harmony's rule: when the last assistant message is on the final channel, analysis messages
  /// before the first final message are dropped (their reasoning is spent).
  bool auto_drop_analysis = true;
};

/// The ids of `messages`, each `<|start|>{header}<|message|>{content}<|end|>` (or <|call|> for an
/// assistant message with a recipient). A stored final reply thus ends with <|end|>.
std::vector<TokenId> render_conversation(const Tokenizer& tok, std::span<const Message> messages,
                                         const RenderOptions& options = {});

/// render_conversation followed by `<|start|>{next_role}`: the prompt a model completes.
std::vector<TokenId> render_for_completion(const Tokenizer& tok, std::span<const Message> messages,
                                           Role next_role = Role::Assistant,
                                           const RenderOptions& options = {});

/// The usual single-turn chat: default system message (effort, optional date), a developer
/// message when `instructions` is non-empty, the user's text.
struct ChatPrompt {
  std::string user;
  std::string instructions;
  ReasoningEffort effort = ReasoningEffort::Medium;
  std::string current_date;
};
std::vector<Message> make_chat(const ChatPrompt& prompt);

/// Ids that end generation: <|return|> (200002) and <|call|> (200012).
bool is_stop_token(TokenId id);
/// The same ids as a list, for a generation request's stop ids.
std::vector<int32_t> stop_token_ids();

/// Incremental parser of generated ids (what follows the prompt's `<|start|>assistant`). After
/// each push() the caller knows which message and channel the id belongs to and what text it
/// added, so a CLI can stream only the final channel.
class StreamParser {
public:
  enum class State { ExpectStart, Header, Content };

  /// `role`: the role already opened by the prompt (Assistant); nullopt when the ids begin with
  /// <|start|>. `strict`: throw xserv::Error on malformed sequences instead of recovering.
  explicit StreamParser(Tokenizer tok, std::optional<Role> role = Role::Assistant,
                        bool strict = false);

  /// Consumes one id. Returns the text it added to the current message's content (empty for
  /// header and control ids, or while a split UTF-8 character is held back).
  std::string push(TokenId id);
  /// Ends the stream: a message still open is completed with what it has.
  void finish();

  State state() const { return state_; }
  /// True once <|return|> or <|call|> was pushed: generation should stop.
  bool stopped() const { return stopped_; }
  /// Channel of the message being read ("" before its header is complete or when it has none).
  const std::string& current_channel() const { return current_.channel; }
  std::optional<Role> current_role() const;
  const std::string& current_recipient() const { return current_.recipient; }
  /// Completed messages, in order.
  const std::vector<Message>& messages() const { return messages_; }

private:
  void parse_header();
  void complete_message();
  [[noreturn]] void fail(const std::string& why) const;

  Tokenizer tok_;
  TokenId start_, message_, end_, channel_; // looked up once: push() runs per generated token
  StreamDecoder decoder_;
  bool strict_;
  State state_;
  bool stopped_ = false;
  std::optional<Role> next_role_;
  std::vector<TokenId> header_;
  Message current_;
  std::vector<Message> messages_;
};

/// Parses a whole completion: push() of every id then finish().
std::vector<Message> parse_completion(const Tokenizer& tok, std::span<const TokenId> ids,
                                      std::optional<Role> role = Role::Assistant,
                                      bool strict = false);

/// The text of the last final-channel message (the answer shown to users), or "" when none.
std::string final_text(std::span<const Message> messages);

} // namespace xserv::models
