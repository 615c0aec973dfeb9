// /v1/responses bodies -> chat bodies, and chat deltas -> Responses output items and events.
#include "server/openai_responses.h"

#include <set>

#include <fmt/format.h>

#include "server/openai_fields.h"

namespace xserv::server::openai {
namespace {

/// The text of an input item's `content`: a string, or an array of text parts (input_text,
/// output_text or text; refusals carry their text too).
std::string input_text(const Json& v, const std::string& param) {
  return text_of_parts(v, param, [](Fields& part) {
    const auto type = part.string("type");
    const bool text = type == "input_text" || type == "output_text" || type == "text";
    if (!text && type != "refusal")
      bad(part.path("type"), fmt::format("must be input_text or output_text (only text input is "
                                         "served), not '{}'",
                                         type.value_or("")));
    auto t = part.string(text ? "text" : "refusal");
    if (!t)
      bad(part.path(text ? "text" : "refusal"), "is missing");
    part.get("annotations");
    part.get("logprobs");
    return *t;
  });
}

/// The reasoning text of a reasoning input item: its reasoning_text content, else its summary.
std::string reasoning_text(Fields& f) {
  std::string out;
  auto join = [&](const Json* parts, const char* field, const char* want) {
    if (!parts)
      return;
    if (!parts->is_array())
      bad(f.path(field), "must be an array, not " + type_name(*parts));
    for (size_t i = 0; i < parts->size(); ++i) {
      Fields p((*parts)[i], fmt::format("{}[{}]", f.path(field), i));
      if (p.string("type") != want)
        bad(p.path("type"), fmt::format("must be \"{}\"", want));
      auto t = p.string("text");
      if (!t)
        bad(p.path("text"), "is missing");
      p.reject_unknown();
      out += (out.empty() ? "" : "\n") + *t;
    }
  };
  const Json* content = f.get("content");
  const Json* summary = f.get("summary");
  join(content, "content", "reasoning_text");
  if (out.empty())
    join(summary, "summary", "summary_text");
  else if (summary && !summary->is_array())
    bad(f.path("summary"), "must be an array, not " + type_name(*summary));
  if (f.get("encrypted_content"))
    bad(f.path("encrypted_content"), "is not supported (this server encrypts no reasoning)");
  return out;
}

/// Builds the chat messages of `input` (an array of items), one assistant message for each run
/// of reasoning, assistant text and function calls.
Json input_messages(const Json& input) {
  Json messages = Json::array();
  Json pending = nullptr; // the assistant message being assembled
  auto flush = [&] {
    if (!pending.is_null())
      messages.push_back(std::move(pending));
    pending = nullptr;
  };
  auto assistant = [&]() -> Json& {
    if (pending.is_null())
      pending = {{"role", "assistant"}};
    return pending;
  };
  std::set<std::string> call_ids;
  for (size_t i = 0; i < input.size(); ++i) {
    Fields f(input[i], fmt::format("input[{}]", i));
    const std::string type = f.string("type").value_or("message");
    f.get("id");
    f.get("status");
    if (type == "message") {
      auto role = f.string("role");
      if (!role)
        bad(f.path("role"), "is missing");
      const Json* content = f.get("content");
      if (!content)
        bad(f.path("content"), "is missing");
      std::string text = input_text(*content, f.path("content"));
      f.get("phase");
      if (*role == "assistant") {
        if (pending.contains("content") || pending.contains("tool_calls"))
          flush();
        assistant()["content"] = std::move(text);
      } else if (*role == "user" || *role == "system" || *role == "developer") {
        flush();
        messages.push_back({{"role", *role}, {"content", std::move(text)}});
      } else {
        bad(f.path("role"),
            fmt::format("must be user, system, developer or assistant, not '{}'", *role));
      }
    } else if (type == "function_call") {
      auto call_id = f.string("call_id"), name = f.string("name"), args = f.string("arguments");
      if (!call_id || call_id->empty())
        bad(f.path("call_id"), "is missing");
      if (!name || name->empty())
        bad(f.path("name"), "is missing");
      if (!args)
        bad(f.path("arguments"), "is missing");
      f.get("namespace");
      Json& m = assistant();
      if (!m.contains("tool_calls"))
        m["tool_calls"] = Json::array();
      m["tool_calls"].push_back({{"id", *call_id},
                                 {"type", "function"},
                                 {"function", {{"name", *name}, {"arguments", *args}}}});
      call_ids.insert(*call_id);
    } else if (type == "function_call_output") {
      auto call_id = f.string("call_id");
      if (!call_id)
        bad(f.path("call_id"), "is missing");
      if (!call_ids.count(*call_id))
        bad(f.path("call_id"),
            fmt::format("'{}' matches no function_call item before it", *call_id));
      const Json* output = f.get("output");
      if (!output)
        bad(f.path("output"), "is missing");
      std::string text = input_text(*output, f.path("output"));
      flush();
      messages.push_back(
          {{"role", "tool"}, {"tool_call_id", *call_id}, {"content", std::move(text)}});
    } else if (type == "reasoning") {
      std::string text = reasoning_text(f);
      if (pending.contains("content") || pending.contains("tool_calls"))
        flush();
      Json& m = assistant();
      const std::string before = m.value("reasoning", "");
      m["reasoning"] = before.empty() ? text : before + "\n" + text;
    } else {
      bad(f.path("type"),
          fmt::format("must be message, function_call, function_call_output or reasoning, not "
                      "'{}'",
                      type));
    }
    f.reject_unknown();
  }
  flush();
  return messages;
}

/// A Responses function tool ({"type", "name", "description", "parameters", "strict"}) in chat
/// form ({"type", "function": {...}}).
Json chat_tool(const Json& t, const std::string& param) {
  Fields f(t, param);
  const auto type = f.string("type");
  if (type != "function")
    bad(f.path("type"), fmt::format("must be \"function\" (built-in tools are not served), not "
                                    "'{}'",
                                    type.value_or("")));
  if (const Json* name = f.get("name"); !name || !name->is_string() || name->empty())
    bad(f.path("name"), "must be the function's name");
  Json fn = Json::object();
  for (const char* k : {"name", "description", "parameters", "strict"})
    if (const Json* v = f.get(k))
      fn[k] = *v;
  f.reject_unknown();
  return {{"type", "function"}, {"function", std::move(fn)}};
}

/// The content part of a reasoning item (reasoning_text) or a message (output_text).
Json text_part(bool reasoning, const std::string& text) {
  if (reasoning)
    return {{"type", "reasoning_text"}, {"text", text}};
  return {{"type", "output_text"},
          {"text", text},
          {"annotations", Json::array()},
          {"logprobs", Json::array()}};
}

/// `s` with every whole occurrence of `from` replaced.
std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

} // namespace

ResponsesRequest parse_responses_request(Json body) {
  Fields f(body, "");
  ResponsesRequest r;
  Json chat = Json::object();
  // Passed through as chat takes them (its checks name the same fields): scalars and strings.
  for (const char* k : {"model", "temperature", "top_p", "top_k", "min_p", "seed", "stream",
                        "parallel_tool_calls", "tool_choice", "user", "ignore_eos"})
    if (const Json* v = f.get(k))
      chat[k] = *v;
  // Responses names a forced function at the top of tool_choice; chat inside "function".
  const Json tool_choice = chat.value("tool_choice", Json("auto")); // echoed as given
  if (auto tc = chat.find("tool_choice"); tc != chat.end() && tc->is_object()) {
    Fields g(*tc, "tool_choice"); // its fields named as the client wrote them
    if (g.string("type") != "function")
      bad(g.path("type"), "must be \"function\"");
    const auto name = g.string("name");
    if (!name || name->empty())
      bad(g.path("name"), "is missing");
    g.reject_unknown();
    *tc = {{"type", "function"}, {"function", {{"name", *name}}}};
  }
  Json metadata = Json::object(); // any JSON, echoed as given: moved, never copied
  if (f.get("metadata"))
    metadata = std::move(body["metadata"]);
  r.stream = chat.contains("stream") && chat["stream"].is_boolean() && chat["stream"].get<bool>();
  Json echo = {{"instructions", nullptr},
               {"max_output_tokens", nullptr},
               {"temperature", chat.value("temperature", Json(1.0))},
               {"top_p", chat.value("top_p", Json(1.0))},
               {"tool_choice", tool_choice},
               {"tools", Json::array()},
               {"parallel_tool_calls", chat.value("parallel_tool_calls", Json(true))},
               {"reasoning", {{"effort", "medium"}, {"summary", nullptr}}},
               {"metadata", std::move(metadata)}};
  if (auto n = f.integer("max_output_tokens", 1, INT32_MAX)) {
    chat["max_tokens"] = *n;
    echo["max_output_tokens"] = *n;
  }
  if (const Json* rs = f.get("reasoning")) {
    Fields g(*rs, "reasoning");
    if (auto e = g.string("effort")) {
      if (*e != "low" && *e != "medium" && *e != "high")
        bad(g.path("effort"), fmt::format("must be low, medium or high, not '{}'", *e));
      chat["reasoning_effort"] = *e;
      echo["reasoning"]["effort"] = *e;
    }
    if (g.get("summary"))
      bad(g.path("summary"), "is not supported (the reasoning item carries the whole text)");
    g.reject_unknown();
  }
  if (const Json* tx = f.get("text")) {
    Fields g(*tx, "text");
    if (const Json* fmt_ = g.get("format")) {
      // Structured output: the chat request's response_format that means the same.
      Fields h(*fmt_, "text.format");
      const auto type = h.string("type").value_or("");
      if (type == "json_object") {
        chat["response_format"] = {{"type", "json_object"}};
      } else if (type == "json_schema") {
        Json js = Json::object();
        for (const char* k : {"name", "schema", "strict", "description"})
          if (const Json* v = h.get(k))
            js[k] = *v;
        if (!js.contains("name") || !js.contains("schema"))
          bad(h.path(js.contains("name") ? "schema" : "name"), "is missing");
        chat["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(js)}};
      } else if (type != "text") {
        bad(h.path("type"), fmt::format("must be text, json_object or json_schema, not '{}'",
                                        type));
      }
      h.reject_unknown();
    }
    g.reject_unknown();
  }
  if (auto t = f.string("truncation"); t && *t != "disabled")
    bad("truncation", "only \"disabled\" is supported (a prompt past the plan's max-seq is "
                      "refused)");
  if (f.get("previous_response_id"))
    bad("previous_response_id", "is not supported: this server keeps no responses; send the "
                                "whole conversation as input");
  if (const Json* inc = f.get("include"); inc && !(inc->is_array() && inc->empty()))
    bad("include", "is not supported");
  if (auto b = f.boolean("background"); b && *b)
    bad("background", "is not supported");
  f.boolean("store"); // accepted; nothing is stored (echoed as false)
  if (const Json* so = f.get("stream_options")) {
    Fields g(*so, "stream_options");
    g.boolean("include_obfuscation"); // accepted: events carry no obfuscation padding
    g.reject_unknown();
  }
  Json messages = Json::array();
  if (auto ins = f.string("instructions")) {
    echo["instructions"] = *ins;
    if (!ins->empty())
      messages.push_back({{"role", "developer"}, {"content", *ins}});
  }
  const Json* input = f.get("input");
  if (!input)
    bad("input", "is missing");
  if (input->is_string()) {
    if (input->get<std::string>().empty())
      bad("input", "must not be empty");
    messages.push_back({{"role", "user"}, {"content", *input}});
  } else if (input->is_array() && !input->empty()) {
    for (Json& m : input_messages(*input))
      messages.push_back(std::move(m));
  } else {
    bad("input", "must be a non-empty string or array of input items, not " + type_name(*input));
  }
  if (const Json* tools = f.get("tools")) {
    if (!tools->is_array())
      bad("tools", "must be an array of function tools, not " + type_name(*tools));
    Json list = Json::array();
    for (size_t i = 0; i < tools->size(); ++i)
      list.push_back(chat_tool((*tools)[i], fmt::format("tools[{}]", i)));
    if (!list.empty())
      chat["tools"] = std::move(list);
    echo["tools"] = std::move(body["tools"]); // as given; chat's copy holds the parameters
  }
  f.reject_unknown();
  chat["messages"] = std::move(messages);
  r.chat = std::move(chat);
  r.echo = std::move(echo);
  return r;
}

ApiError as_responses_error(const ApiError& e) {
  auto rename = [](std::string s) {
    s = replace_all(std::move(s), "max_tokens", "max_output_tokens");
    s = replace_all(std::move(s), "response_format.json_schema", "text.format");
    s = replace_all(std::move(s), "response_format", "text.format");
    s = replace_all(std::move(s), "tool_choice.function.name", "tool_choice.name");
    return replace_all(std::move(s), "messages", "input");
  };
  ApiError out(e.status, rename(e.what()), rename(e.param), e.type, e.code);
  out.details = e.details;
  return out;
}

ChatRequest parse_responses_chat(const ResponsesRequest& r) {
  try {
    return parse_chat_request(r.chat);
  } catch (const ApiError& e) {
    throw as_responses_error(e);
  }
}

std::vector<Json> ResponsesOutput::open(Open kind, const Json& call) {
  std::vector<Json> events = close(true);
  const int index = static_cast<int>(output_.size());
  Json item;
  if (kind == Open::Reasoning)
    item = {{"type", "reasoning"},
            {"id", fmt::format("rs_{}_{}", suffix_, index)},
            {"summary", Json::array()},
            {"content", Json::array()},
            {"status", "in_progress"}};
  else if (kind == Open::Message)
    item = {{"type", "message"},
            {"id", fmt::format("msg_{}_{}", suffix_, index)},
            {"status", "in_progress"},
            {"role", "assistant"},
            {"content", Json::array()}};
  else
    item = {{"type", "function_call"},
            {"id", fmt::format("fc_{}_{}", suffix_, index)},
            {"call_id", call.value("id", "")},
            {"name", call["function"].value("name", "")},
            {"arguments", ""},
            {"status", "in_progress"}};
  output_.push_back(item);
  open_ = kind;
  text_.clear();
  events.push_back(
      {{"type", "response.output_item.added"}, {"output_index", index}, {"item", item}});
  if (kind != Open::Call) {
    Json part = text_part(kind == Open::Reasoning, "");
    events.push_back({{"type", "response.content_part.added"},
                      {"item_id", item["id"]},
                      {"output_index", index},
                      {"content_index", 0},
                      {"part", std::move(part)}});
  }
  return events;
}

std::vector<Json> ResponsesOutput::close(bool complete) {
  std::vector<Json> events;
  if (open_ == Open::None)
    return events;
  const int index = static_cast<int>(output_.size()) - 1;
  Json& item = output_.back();
  const Json id = item["id"];
  item["status"] = complete ? "completed" : "incomplete";
  if (open_ != Open::Call) {
    const bool reasoning = open_ == Open::Reasoning;
    Json part = text_part(reasoning, text_);
    Json done = {{"type", reasoning ? "response.reasoning_text.done" : "response.output_text.done"},
                 {"item_id", id},
                 {"output_index", index},
                 {"content_index", 0},
                 {"text", text_}};
    if (!reasoning)
      done["logprobs"] = Json::array();
    events.push_back(std::move(done));
    events.push_back({{"type", "response.content_part.done"},
                      {"item_id", id},
                      {"output_index", index},
                      {"content_index", 0},
                      {"part", part}});
    item["content"] = Json::array({part});
  } else {
    item["arguments"] = text_;
    events.push_back({{"type", "response.function_call_arguments.done"},
                      {"item_id", id},
                      {"output_index", index},
                      {"name", item["name"]},
                      {"arguments", text_}});
  }
  events.push_back(
      {{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}});
  open_ = Open::None;
  text_.clear();
  return events;
}

std::vector<Json> ResponsesOutput::push(const Json& delta) {
  std::vector<Json> events;
  auto append = [&](std::vector<Json> more) {
    for (Json& e : more)
      events.push_back(std::move(e));
  };
  auto text_delta = [&](Open kind, const char* type, const std::string& text) {
    if (open_ != kind)
      append(open(kind, nullptr));
    text_ += text;
    const int index = static_cast<int>(output_.size()) - 1;
    Json e = {{"type", type}, {"item_id", output_.back()["id"]}, {"output_index", index}};
    if (kind != Open::Call)
      e["content_index"] = 0;
    e["delta"] = text;
    if (kind == Open::Message)
      e["logprobs"] = Json::array();
    events.push_back(std::move(e));
  };
  if (delta.contains("reasoning"))
    text_delta(Open::Reasoning, "response.reasoning_text.delta", delta["reasoning"]);
  if (delta.contains("content") && delta["content"].is_string())
    text_delta(Open::Message, "response.output_text.delta", delta["content"]);
  if (delta.contains("tool_calls"))
    for (const Json& tc : delta["tool_calls"]) {
      if (tc.contains("id")) // the call's first delta: a new item
        append(open(Open::Call, tc));
      const std::string args = tc["function"].value("arguments", "");
      if (!args.empty() && open_ == Open::Call)
        text_delta(Open::Call, "response.function_call_arguments.delta", args);
    }
  return events;
}

std::vector<Json> ResponsesOutput::finish(bool complete) {
  std::vector<Json> events;
  if (output_.empty())
    events = open(Open::Message, nullptr);
  for (Json& e : close(complete))
    events.push_back(std::move(e));
  return events;
}

std::string ResponsesOutput::output_text() const {
  std::string out;
  for (const Json& item : output_)
    if (item["type"] == "message")
      for (const Json& part : item["content"])
        out += part.value("text", "");
  return out;
}

Json response_object(const std::string& id, int64_t created_at, const std::string& model,
                     const Json& echo, const std::string& status, const Json& output,
                     int64_t input_tokens, int64_t output_tokens, int64_t reasoning_tokens) {
  Json r = {{"id", id},         {"object", "response"}, {"created_at", created_at},
            {"status", status}, {"error", nullptr},     {"incomplete_details", nullptr}};
  if (status == "incomplete")
    r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  for (auto it = echo.begin(); it != echo.end(); ++it)
    r[it.key()] = it.value();
  r["model"] = model;
  r["output"] = output;
  r["previous_response_id"] = nullptr;
  r["store"] = false;
  r["text"] = {{"format", {{"type", "text"}}}};
  r["truncation"] = "disabled";
  r["usage"] = {{"input_tokens", input_tokens},
                {"input_tokens_details", {{"cached_tokens", 0}}},
                {"output_tokens", output_tokens},
                {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens}}},
                {"total_tokens", input_tokens + output_tokens}};
  return r;
}

std::string responses_status(const std::string& finish_reason) {
  if (finish_reason == "length")
    return "incomplete";
  if (finish_reason == "abort")
    return "cancelled";
  return "completed";
}

Json responses_error_event(const ApiError& e) {
  return {{"type", "error"},
          {"code", e.code.empty() ? Json(nullptr) : Json(e.code)},
          {"message", e.what()},
          {"param", e.param.empty() ? Json(nullptr) : Json(e.param)}};
}

} // namespace xserv::server::openai
