// Harmony rendering (messages -> ids) and streaming parsing (generated ids -> messages).
//
// Rendering follows openai/harmony (src/encoding.rs) piece by piece: every text fragment of a
// header is encoded on its own, as harmony does, because BPE over the joined string could merge
// across the fragment boundaries and give different ids.
#include "models/harmony.h"

#include <fmt/format.h>

#include "base/error.h"

namespace xserv::models {
namespace {

constexpr TokenId kReturn = 200002, kCall = 200012;

/// The ids of the formatting specials, looked up once per use so any vocabulary works.
struct Specials {
  explicit Specials(const Tokenizer& tok)
      : start(tok.special_id("<|start|>")), message(tok.special_id("<|message|>")),
        end(tok.special_id("<|end|>")), ret(tok.special_id("<|return|>")),
        call(tok.special_id("<|call|>")), channel(tok.special_id("<|channel|>")),
        constrain(tok.special_id("<|constrain|>")) {}
  TokenId start, message, end, ret, call, channel, constrain;
};

std::string system_text(const SystemContent& sys, bool has_function_tools) {
  std::vector<std::string> sections;
  std::string top = sys.model_identity;
  auto add_line = [&](const std::string& line) { top += (top.empty() ? "" : "\n") + line; };
  if (!sys.knowledge_cutoff.empty())
    add_line("Knowledge cutoff: " + sys.knowledge_cutoff);
  if (!sys.current_date.empty())
    add_line("Current date: " + sys.current_date);
  if (!top.empty())
    sections.push_back(top);
  if (sys.reasoning_effort)
    sections.push_back("Reasoning: " + std::string(effort_name(*sys.reasoning_effort)));
  if (!sys.tools.empty())
    sections.push_back(render_tools_section(sys.tools));
  if (!sys.valid_channels.empty()) {
    std::string channels = "# Valid channels: ";
    for (size_t i = 0; i < sys.valid_channels.size(); ++i)
      channels += (i ? ", " : "") + sys.valid_channels[i];
    channels += ".";
    if (sys.channel_required)
      channels += " Channel must be included for every message.";
    if (has_function_tools)
      channels += "\nCalls to these tools must go to the commentary channel: 'functions'.";
    sections.push_back(channels);
  }
  std::string out;
  for (size_t i = 0; i < sections.size(); ++i)
    out += (i ? "\n\n" : "") + sections[i];
  return out;
}

std::string developer_text(const DeveloperContent& dev) {
  std::string out;
  if (!dev.instructions.empty())
    out = "# Instructions\n\n" + dev.instructions;
  if (!dev.response_formats.empty()) {
    out += (out.empty() ? "" : "\n\n") + std::string("# Response Formats");
    for (const ResponseFormat& f : dev.response_formats) {
      out += "\n\n## " + f.name + "\n\n";
      if (!f.description.empty())
        out += "// " + f.description + "\n";
      out += f.schema;
    }
  }
  if (!dev.tools.empty())
    out += (out.empty() ? "" : "\n\n") + render_tools_section(dev.tools);
  return out;
}

bool has_function_tools(std::span<const Message> messages) {
  for (const auto& m : messages)
    if (m.developer)
      for (const auto& ns : m.developer->tools)
        if (ns.name == "functions" && !ns.tools.empty())
          return true;
  return false;
}

void render_message(const Tokenizer& tok, const Specials& sp, const Message& m, bool function_tools,
                    std::vector<TokenId>& out) {
  out.push_back(sp.start);
  if (m.role == Role::Tool) {
    if (m.name.empty())
      throw Error("harmony: a tool message needs the tool's name (e.g. functions.get_weather)");
    tok.encode_ordinary_into(m.name, out);
  } else {
    tok.encode_ordinary_into(role_name(m.role), out);
    if (!m.name.empty())
      tok.encode_ordinary_into(":" + m.name, out);
  }
  const bool to_tool = !m.recipient.empty() && m.recipient != "all";
  if (to_tool)
    tok.encode_ordinary_into(" to=" + m.recipient, out);
  if (!m.channel.empty()) {
    out.push_back(sp.channel);
    tok.encode_ordinary_into(m.channel, out);
  }
  if (!m.content_type.empty()) {
    constexpr std::string_view kConstrain = "<|constrain|>";
    if (m.content_type.starts_with(kConstrain)) {
      tok.encode_ordinary_into(" ", out);
      out.push_back(sp.constrain);
      tok.encode_ordinary_into(std::string_view(m.content_type).substr(kConstrain.size()), out);
    } else {
      tok.encode_ordinary_into(" " + m.content_type, out);
    }
  }
  out.push_back(sp.message);
  if (m.system) {
    if (m.role != Role::System)
      throw Error("harmony: SystemContent is only allowed in a system message");
    tok.encode_ordinary_into(system_text(*m.system, function_tools), out);
  } else if (m.developer) {
    if (m.role != Role::Developer)
      throw Error("harmony: DeveloperContent is only allowed in a developer message");
    tok.encode_ordinary_into(developer_text(*m.developer), out);
  } else {
    tok.encode_ordinary_into(m.content, out);
  }
  out.push_back(m.role == Role::Assistant && to_tool ? sp.call : sp.end);
}

} // namespace

std::string_view role_name(Role role) {
  switch (role) {
  case Role::System:
    return "system";
  case Role::Developer:
    return "developer";
  case Role::User:
    return "user";
  case Role::Assistant:
    return "assistant";
  case Role::Tool:
    return "tool";
  }
  return "?";
}

std::string_view effort_name(ReasoningEffort effort) {
  switch (effort) {
  case ReasoningEffort::Low:
    return "low";
  case ReasoningEffort::Medium:
    return "medium";
  case ReasoningEffort::High:
    return "high";
  }
  return "?";
}

ReasoningEffort parse_reasoning_effort(std::string_view name) {
  for (auto e : {ReasoningEffort::Low, ReasoningEffort::Medium, ReasoningEffort::High})
    if (effort_name(e) == name)
      return e;
  throw Error(fmt::format("reasoning effort must be low, medium or high, not '{}'", name));
}

Message Message::make_system(SystemContent content) {
  Message m;
  m.role = Role::System;
  m.system = std::move(content);
  return m;
}

Message Message::make_developer(DeveloperContent content) {
  Message m;
  m.role = Role::Developer;
  m.developer = std::move(content);
  return m;
}

Message Message::user(std::string text) {
  Message m;
  m.role = Role::User;
  m.content = std::move(text);
  return m;
}

Message Message::assistant(std::string text, std::string channel) {
  Message m;
  m.role = Role::Assistant;
  m.channel = std::move(channel);
  m.content = std::move(text);
  return m;
}

Message Message::tool(std::string tool_name, std::string text, std::string channel) {
  Message m;
  m.role = Role::Tool;
  m.name = std::move(tool_name);
  m.channel = std::move(channel);
  m.content = std::move(text);
  return m;
}

std::vector<TokenId> render_conversation(const Tokenizer& tok, std::span<const Message> messages,
                                         const RenderOptions& options) {
  const Specials sp(tok);
  bool last_assistant_is_final = false;
  for (auto it = messages.rbegin(); it != messages.rend(); ++it)
    if (it->role == Role::Assistant) {
      last_assistant_is_final = it->channel == "final";
      break;
    }
  size_t first_final = messages.size();
  for (size_t i = 0; i < messages.size(); ++i)
    if (messages[i].channel == "final") {
      first_final = i;
      break;
    }
  const bool drop = options.auto_drop_analysis && last_assistant_is_final;
  const bool function_tools = has_function_tools(messages);
  std::vector<TokenId> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (drop && i < first_final && messages[i].channel == "analysis")
      continue;
    render_message(tok, sp, messages[i], function_tools, out);
  }
  return out;
}

std::vector<TokenId> render_for_completion(const Tokenizer& tok, std::span<const Message> messages,
                                           Role next_role, const RenderOptions& options) {
  std::vector<TokenId> out = render_conversation(tok, messages, options);
  out.push_back(tok.special_id("<|start|>"));
  tok.encode_ordinary_into(role_name(next_role), out);
  return out;
}

std::vector<Message> make_chat(const ChatPrompt& prompt) {
  SystemContent sys;
  sys.reasoning_effort = prompt.effort;
  sys.current_date = prompt.current_date;
  std::vector<Message> messages = {Message::make_system(std::move(sys))};
  if (!prompt.instructions.empty())
    messages.push_back(Message::make_developer({prompt.instructions, {}}));
  messages.push_back(Message::user(prompt.user));
  return messages;
}

bool is_stop_token(TokenId id) {
  return id == kReturn || id == kCall;
}

std::vector<int32_t> stop_token_ids() {
  return {static_cast<int32_t>(kReturn), static_cast<int32_t>(kCall)};
}

std::string final_text(std::span<const Message> messages) {
  for (auto it = messages.rbegin(); it != messages.rend(); ++it)
    if (it->role == Role::Assistant && it->channel == "final")
      return it->content;
  return "";
}

} // namespace xserv::models
