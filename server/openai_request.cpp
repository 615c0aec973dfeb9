// Parsing of OpenAI chat and text completion bodies: every field typed, ranged and known.
#include "server/openai_request.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>

#include <fmt/format.h>

#include "models/json_error.h"
#include "server/openai_fields.h"

namespace xserv::server::openai {
namespace {

void parse_stop(Fields& f, GenParams& p) {
  if (const Json* v = f.get("stop")) {
    auto add = [&](const Json& s) {
      if (!s.is_string())
        bad("stop", "must be a string or an array of strings, not " + type_name(s));
      if (s.get<std::string>().empty())
        bad("stop", "must not hold an empty string");
      p.stop.push_back(s.get<std::string>());
    };
    if (v->is_array()) {
      if (v->size() > 16)
        bad("stop", fmt::format("holds {} strings, at most 16", v->size()));
      for (const Json& s : *v)
        add(s);
    } else {
      add(*v);
    }
  }
  if (const Json* v = f.get("stop_token_ids")) {
    if (!v->is_array())
      bad("stop_token_ids", "must be an array of token ids, not " + type_name(*v));
    for (const Json& id : *v) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
        bad("stop_token_ids", "must hold token ids (integers >= 0), not " + id.dump());
      p.stop_token_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  }
}

/// The fields chat and text completions share.
void parse_common(Fields& f, GenParams& p, std::string& model) {
  model = f.string("model").value_or("");
  p.sampling.temperature = static_cast<float>(f.number("temperature", 0, 2).value_or(1.0));
  p.sampling.top_p = static_cast<float>(f.number("top_p", 0, 1).value_or(1.0));
  if (p.sampling.top_p <= 0)
    bad("top_p", "must be in (0, 1], not 0");
  if (auto k = f.integer("top_k", -1, 1 << 20))
    p.sampling.top_k = *k < 0 ? 0 : static_cast<int>(*k);
  p.sampling.min_p = static_cast<float>(f.number("min_p", 0, 1).value_or(0.0));
  // Without a seed every request draws its own stream (OpenAI's behaviour): two identical
  // requests at temperature 1 must not return the same text.
  if (auto s = f.integer("seed", INT64_MIN, INT64_MAX))
    p.sampling.seed = static_cast<uint64_t>(*s);
  else
    p.sampling.seed = std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32);
  if (auto n = f.integer("max_tokens", 0, INT32_MAX)) // 0: completions' echo alone (below)
    p.max_tokens = *n;
  if (auto n = f.integer("max_completion_tokens", 1, INT32_MAX)) {
    if (p.max_tokens && *p.max_tokens != *n)
      bad("max_completion_tokens", "differs from max_tokens; give one of them");
    p.max_tokens = *n;
  }
  if (auto n = f.integer("n", 1, engine::kMaxChoices))
    p.n = static_cast<int>(*n);
  p.adjust.presence_penalty = float(f.number("presence_penalty", -2, 2).value_or(0.0));
  p.adjust.frequency_penalty = float(f.number("frequency_penalty", -2, 2).value_or(0.0));
  if (auto r = f.number("repetition_penalty", 0, 10)) {
    if (*r <= 0)
      bad("repetition_penalty", "must be above 0");
    p.adjust.repetition_penalty = float(*r);
  }
  if (const Json* lb = f.get("logit_bias")) {
    // {"token id": bias}, as OpenAI takes it: ids as decimal strings, biases in [-100, 100].
    if (!lb->is_object() || lb->size() > 1024)
      bad("logit_bias", "must be an object of at most 1,024 \"token id\": bias entries");
    for (const auto& [key, value] : lb->items()) {
      const std::string field = "logit_bias." + key;
      int64_t id = -1;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      if (ec != std::errc() || end != key.data() + key.size() || id < 0 || id > INT32_MAX)
        bad(field, "is not a token id (a non-negative integer)");
      if (!value.is_number() || !(value.get<double>() >= -100 && value.get<double>() <= 100))
        bad(field, "must be a number in [-100, 100]");
      p.adjust.bias.emplace_back(int32_t(id), value.get<float>());
    }
    std::sort(p.adjust.bias.begin(), p.adjust.bias.end()); // by id, whatever the key order
    for (size_t i = 1; i < p.adjust.bias.size(); ++i)
      if (p.adjust.bias[i].first == p.adjust.bias[i - 1].first) // "5" and "05"
        bad("logit_bias", fmt::format("token id {} is given twice", p.adjust.bias[i].first));
  }
  parse_stop(f, p);
  p.ignore_eos = f.boolean("ignore_eos").value_or(false);
  p.stream = f.boolean("stream").value_or(false);
  if (const Json* so = f.get("stream_options")) {
    Fields s(*so, "stream_options");
    p.include_usage = s.boolean("include_usage").value_or(false);
    s.boolean("continuous_usage_stats"); // accepted, not acted on
    s.reject_unknown();
    if (!p.stream)
      bad("stream_options", "is only allowed when stream is true");
  }
  f.string("user"); // accepted and ignored, as by OpenAI for abuse tracking
}

/// Text of a message `content`: a string, or an array of {"type": "text", "text": ...} parts.
std::string content_text(const Json& v, const std::string& param) {
  if (v.is_null())
    return "";
  return text_of_parts(v, param, [](Fields& part) {
    if (part.string("type") != "text")
      bad(part.path("type"), "must be \"text\" (only text content is supported)");
    auto text = part.string("text");
    if (!text)
      bad(part.path("text"), "is missing");
    return *text;
  });
}

models::ToolDescription parse_tool(const Json& t, const std::string& param) {
  Fields f(t, param);
  if (f.string("type") != "function")
    bad(f.path("type"), "must be \"function\"");
  const Json* fn = f.get("function");
  if (!fn)
    bad(f.path("function"), "is missing");
  f.reject_unknown();
  Fields g(*fn, f.path("function"));
  models::ToolDescription d;
  auto name = g.string("name");
  if (!name || name->empty())
    bad(g.path("name"), "is missing");
  // OpenAI's rule; a recipient of other characters would not read back from the model's header.
  if (name->size() > 64 || !std::all_of(name->begin(), name->end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
      }))
    bad(g.path("name"), "must be 1 to 64 letters, digits, underscores or dashes");
  d.name = *name;
  d.description = g.string("description").value_or("");
  if (const Json* params = g.get("parameters")) {
    if (!params->is_object())
      bad(g.path("parameters"), "must be a JSON schema object, not " + type_name(*params));
    if (!params->empty())
      d.parameters = params->dump();
  }
  d.strict = g.boolean("strict").value_or(false);
  if (d.strict && d.parameters.empty())
    d.parameters = R"({"type":"object","properties":{}})";
  g.reject_unknown();
  return d;
}

/// `response_format` (chat, completions): text (none), json_object, or json_schema {name,
/// schema, strict, description}; a json_schema's schema also goes to `format` for the prompt.
std::optional<engine::GrammarSpec> parse_response_format(const Json& rf,
                                                         models::ResponseFormat* format) {
  Fields g(rf, "response_format");
  const auto type = g.string("type");
  std::optional<engine::GrammarSpec> out;
  if (!type)
    bad("response_format.type", "is missing");
  if (*type == "json_object") {
    out = engine::GrammarSpec{engine::GrammarSpec::Kind::Json, "", "response_format"};
  } else if (*type == "json_schema") {
    const Json* js = g.get("json_schema");
    if (!js)
      bad("response_format.json_schema", "is missing");
    Fields h(*js, "response_format.json_schema");
    auto name = h.string("name");
    if (!name || name->empty())
      bad(h.path("name"), "is missing");
    const Json* schema = h.get("schema");
    if (!schema || !(schema->is_object() || schema->is_boolean()))
      bad(h.path("schema"), "must be a JSON schema object");
    h.boolean("strict"); // the schema is enforced either way
    const std::string description = h.string("description").value_or("");
    h.reject_unknown();
    out = engine::GrammarSpec{engine::GrammarSpec::Kind::JsonSchema, schema->dump(),
                              "response_format.json_schema.schema"};
    if (format)
      *format = {*name, description, schema->dump()};
  } else if (*type != "text") {
    bad("response_format.type",
        fmt::format("must be text, json_object or json_schema, not '{}'", *type));
  }
  g.reject_unknown();
  return out;
}

/// An EBNF string literal (xgrammar's dialect) holding `text` exactly.
std::string ebnf_literal(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    // xgrammar reads \x with every hex digit after it: control bytes as \n, \r, \t or exactly
    // four-digit \u escapes, so that a hex digit after one stays a character of its own.
    if (c == '"' || c == '\\')
      out += std::string("\\") + c;
    else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (u < 0x20 || u == 0x7f)
      out += fmt::format("\\u{:04x}", u);
    else
      out += c;
  }
  return out + "\"";
}

/// vLLM's forms of a constraint: `structured_outputs` {json | json_object | regex | grammar |
/// choice}, and the older guided_json, guided_regex, guided_grammar, guided_choice, so that
/// requests written for vLLM run unchanged. At most one a request; nullopt when none is given.
std::optional<engine::GrammarSpec> parse_vllm_constraint(Fields& f) {
  using Kind = engine::GrammarSpec::Kind;
  std::optional<engine::GrammarSpec> out;
  auto take = [&](const Json& v, const std::string& field, const std::string& kind) {
    if (out)
      bad(field, fmt::format("cannot be combined with {} (one constraint a request)", out->field));
    if (kind == "json") {
      Json schema = v;
      if (v.is_string()) { // vLLM takes the schema as a JSON text too
        // Depth first: printing or copying a value recurses, and a body's depth check does not
        // look inside its strings.
        const std::string& text = v.get_ref<const std::string&>();
        if (json_too_deep_at(text, kMaxJsonDepth) != std::string_view::npos)
          bad(field, fmt::format("nests deeper than {} levels", kMaxJsonDepth));
        schema = Json::parse(text, nullptr, /*allow_exceptions=*/false);
        if (schema.is_discarded())
          bad(field, "is a string that is not a JSON schema");
      }
      if (!schema.is_object() && !schema.is_boolean())
        bad(field, "must be a JSON schema object");
      out = engine::GrammarSpec{Kind::JsonSchema, schema.dump(), field};
    } else if (kind == "json_object") {
      if (!v.is_boolean())
        bad(field, "must be true or false");
      if (v.get<bool>())
        out = engine::GrammarSpec{Kind::Json, "", field};
    } else if (kind == "choice") {
      if (!v.is_array() || v.empty() || v.size() > 1024)
        bad(field, "must be a list of 1 to 1024 strings");
      std::string grammar = "root ::= ";
      for (size_t i = 0; i < v.size(); ++i) {
        if (!v[i].is_string() || v[i].get<std::string>().empty())
          bad(fmt::format("{}[{}]", field, i), "must be a non-empty string");
        grammar += (i ? " | " : "") + ebnf_literal(v[i].get<std::string>());
      }
      out = engine::GrammarSpec{Kind::Ebnf, grammar, field};
    } else {
      if (!v.is_string())
        bad(field, "must be a string");
      out = engine::GrammarSpec{kind == "regex" ? Kind::Regex : Kind::Ebnf, v.get<std::string>(),
                                field};
    }
  };
  if (const Json* so = f.get("structured_outputs")) {
    Fields g(*so, "structured_outputs");
    for (const char* kind : {"json", "json_object", "regex", "grammar", "choice"})
      if (const Json* v = g.get(kind))
        take(*v, g.path(kind), kind);
    g.reject_unknown();
  }
  for (const char* kind : {"json", "regex", "grammar", "choice"})
    if (const Json* v = f.get(std::string("guided_") + kind))
      take(*v, std::string("guided_") + kind, kind);
  return out;
}

} // namespace

void check_stop_token_ids(const GenParams& p, int64_t vocab) {
  for (int32_t id : p.stop_token_ids)
    if (id >= vocab)
      bad("stop_token_ids",
          fmt::format("holds {}, outside the model's vocabulary [0, {})", id, vocab));
  for (const auto& [id, bias] : p.adjust.bias)
    if (id >= vocab)
      bad(fmt::format("logit_bias.{}", id),
          fmt::format("is outside the model's vocabulary [0, {})", vocab));
}

std::vector<models::Message> chat_to_harmony(const Json& messages, const Json& tools,
                                             models::ReasoningEffort effort) {
  using models::Message;
  if (!messages.is_array() || messages.empty())
    bad("messages", "must be a non-empty array of messages");
  models::SystemContent sys;
  sys.reasoning_effort = effort;
  models::DeveloperContent dev;
  if (!tools.is_null()) {
    if (!tools.is_array())
      bad("tools", "must be an array of function tools, not " + type_name(tools));
    models::ToolNamespace ns{"functions", "", {}};
    for (size_t i = 0; i < tools.size(); ++i)
      ns.tools.push_back(parse_tool(tools[i], fmt::format("tools[{}]", i)));
    if (!ns.tools.empty())
      dev.tools.push_back(std::move(ns));
  }
  std::vector<Message> turns;
  std::map<std::string, std::string> call_names; // tool_call_id -> function name
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string at = fmt::format("messages[{}]", i);
    Fields f(messages[i], at);
    auto role = f.string("role");
    if (!role)
      bad(f.path("role"), "is missing");
    const Json* content = f.get("content");
    const std::string text = content ? content_text(*content, f.path("content")) : "";
    f.string("name");
    if (*role == "system" || *role == "developer") {
      dev.instructions += (dev.instructions.empty() ? "" : "\n\n") + text;
    } else if (*role == "user") {
      turns.push_back(Message::user(text));
    } else if (*role == "assistant") {
      auto reasoning = f.string("reasoning");
      if (auto rc = f.string("reasoning_content"); rc && !reasoning)
        reasoning = rc;
      f.get("refusal");
      if (reasoning && !reasoning->empty())
        turns.push_back(Message::assistant(*reasoning, "analysis"));
      const Json* calls = f.get("tool_calls");
      if (calls && !calls->is_array())
        bad(f.path("tool_calls"), "must be an array, not " + type_name(*calls));
      const bool has_calls = calls && !calls->empty();
      if (!text.empty() || (!has_calls && !(reasoning && !reasoning->empty())))
        turns.push_back(Message::assistant(text, has_calls ? "commentary" : "final"));
      for (size_t c = 0; has_calls && c < calls->size(); ++c) {
        Fields tc((*calls)[c], fmt::format("{}.tool_calls[{}]", at, c));
        auto id = tc.string("id").value_or("");
        if (auto type = tc.string("type"); type && *type != "function")
          bad(tc.path("type"), "must be \"function\"");
        const Json* fn = tc.get("function");
        if (!fn)
          bad(tc.path("function"), "is missing");
        tc.reject_unknown();
        Fields g(*fn, tc.path("function"));
        auto name = g.string("name");
        if (!name || name->empty())
          bad(g.path("name"), "is missing");
        auto args = g.string("arguments").value_or("{}");
        g.reject_unknown();
        Message m = Message::assistant(args, "commentary");
        m.recipient = "functions." + *name;
        m.content_type = "<|constrain|>json";
        turns.push_back(std::move(m));
        if (!id.empty())
          call_names[id] = *name;
      }
    } else if (*role == "tool") {
      auto id = f.string("tool_call_id");
      if (!id)
        bad(f.path("tool_call_id"), "is missing");
      auto it = call_names.find(*id);
      if (it == call_names.end())
        bad(f.path("tool_call_id"),
            fmt::format("'{}' matches no tool call of an earlier assistant message", *id));
      Message m = Message::tool("functions." + it->second, text, "commentary");
      m.recipient = "assistant";
      turns.push_back(std::move(m));
    } else {
      bad(f.path("role"), fmt::format("must be system, developer, user, assistant or tool, not "
                                      "'{}'",
                                      *role));
    }
    f.reject_unknown();
  }
  // Harmony keeps the chain of thought only across the tool calls of the turn still open: the
  // analysis of every turn that ended with a final message goes (the renderer alone drops it
  // only before the first final, so a second finished turn's would stay).
  size_t last_final = 0;
  for (size_t i = 0; i < turns.size(); ++i)
    if (turns[i].role == models::Role::Assistant && turns[i].channel == "final")
      last_final = i + 1;
  std::vector<Message> out;
  out.push_back(Message::make_system(std::move(sys)));
  if (!dev.instructions.empty() || !dev.tools.empty())
    out.push_back(Message::make_developer(std::move(dev)));
  for (size_t i = 0; i < turns.size(); ++i)
    if (i + 1 >= last_final || turns[i].role != models::Role::Assistant ||
        turns[i].channel != "analysis")
      out.push_back(std::move(turns[i]));
  return out;
}

ChatRequest parse_chat_request(const Json& body) {
  Fields f(body, "");
  ChatRequest r;
  parse_common(f, r.params, r.model);
  if (r.params.max_tokens == 0)
    bad("max_tokens", "must be at least 1 (0 is for an echoed completion that scores its prompt)");
  if (auto lp = f.boolean("logprobs"); lp && *lp)
    r.params.top_logprobs = 0;
  if (auto k = f.integer("top_logprobs", 0, 20)) {
    if (r.params.top_logprobs < 0)
      bad("top_logprobs", "needs logprobs: true");
    r.params.top_logprobs = static_cast<int>(*k);
  }
  auto effort = models::ReasoningEffort::Medium;
  if (auto e = f.string("reasoning_effort")) {
    if (*e != "low" && *e != "medium" && *e != "high")
      bad("reasoning_effort", fmt::format("must be low, medium or high, not '{}'", *e));
    effort = models::parse_reasoning_effort(*e);
  }
  Json tools = nullptr;
  if (const Json* t = f.get("tools"))
    tools = *t;
  // tool_choice: "auto" (the model decides), "none" (no tools shown), "required" (a call to
  // one of them) or {"type": "function", "function": {"name": N}} (a call to N), the last two
  // enforced by the constraint's forced headers.
  std::optional<std::string> named_tool;
  bool call_required = false;
  if (const Json* tc = f.get("tool_choice")) {
    if (tc->is_object()) {
      Fields g(*tc, "tool_choice");
      if (g.string("type") != "function")
        bad(g.path("type"), "must be \"function\"");
      const Json* fn = g.get("function");
      if (!fn)
        bad(g.path("function"), "is missing");
      g.reject_unknown();
      Fields h(*fn, g.path("function"));
      named_tool = h.string("name");
      if (!named_tool || named_tool->empty())
        bad(h.path("name"), "is missing");
      h.reject_unknown();
      call_required = true;
    } else if (tc->is_string() && *tc == "required") {
      call_required = true;
    } else if (!tc->is_string() || (*tc != "auto" && *tc != "none")) {
      bad("tool_choice", "must be \"auto\", \"none\", \"required\" or {\"type\": "
                         "\"function\", \"function\": {\"name\": ...}}");
    } else if (*tc == "none") {
      tools = nullptr;
    }
  }
  f.boolean("parallel_tool_calls");
  models::ResponseFormat format;
  if (const Json* rf = f.get("response_format"))
    r.params.constraint.output = parse_response_format(*rf, &format);
  if (auto vllm = parse_vllm_constraint(f)) {
    if (r.params.constraint.output)
      bad(vllm->field, "cannot be combined with response_format (one constraint a request)");
    if (vllm->kind == engine::GrammarSpec::Kind::JsonSchema) // the model reads it, as above
      format = {"structured_output", "", vllm->text};
    r.params.constraint.output = std::move(vllm);
  }
  f.get("metadata");
  f.boolean("store");
  const Json* messages = f.get("messages");
  if (!messages)
    bad("messages", "is missing");
  f.reject_unknown();
  r.messages = chat_to_harmony(*messages, tools, effort);
  // Harmony binding: the format binds the final channel's message, strict tools their calls'
  // arguments; the schema also goes to the developer message, where the model reads it.
  r.params.constraint.harmony = true;
  auto developer = std::find_if(r.messages.begin(), r.messages.end(),
                                [](const models::Message& m) { return m.developer.has_value(); });
  if (!format.name.empty()) {
    if (developer == r.messages.end())
      developer = r.messages.insert(r.messages.begin() + 1,
                                    models::Message::make_developer(models::DeveloperContent{}));
    developer->developer->response_formats.push_back(format);
  }
  std::vector<std::string> functions;
  if (developer != r.messages.end())
    for (const models::ToolNamespace& ns : developer->developer->tools)
      for (size_t i = 0; i < ns.tools.size(); ++i) {
        if (ns.name == "functions")
          functions.push_back(ns.tools[i].name);
        if (ns.tools[i].strict)
          r.params.constraint.tools.push_back(
              {ns.tools[i].name,
               {engine::GrammarSpec::Kind::JsonSchema, ns.tools[i].parameters,
                fmt::format("tools[{}].function.parameters", i)}});
      }
  if (call_required) {
    if (functions.empty())
      bad("tool_choice", "requires a tool call, but the request has no tools");
    if (named_tool &&
        std::find(functions.begin(), functions.end(), *named_tool) == functions.end())
      bad("tool_choice.function.name",
          fmt::format("'{}' is not among the request's tools", *named_tool));
    r.params.constraint.tool_choice = engine::ConstraintRequest::ToolChoice::Required;
    r.params.constraint.callable =
        named_tool ? std::vector<std::string>{*named_tool} : std::move(functions);
  }
  return r;
}

CompletionRequest parse_completion_request(const Json& body) {
  Fields f(body, "");
  CompletionRequest r;
  parse_common(f, r.params, r.model);
  if (auto k = f.integer("logprobs", 0, 20))
    r.params.top_logprobs = static_cast<int>(*k);
  if (auto echo = f.boolean("echo"))
    r.echo = *echo;
  if (r.params.max_tokens == 0 && !(r.echo && r.params.top_logprobs >= 0))
    bad("max_tokens", "0 needs echo and logprobs: it scores the prompt and generates nothing");
  f.integer("best_of", 1, 1);
  if (auto suffix = f.string("suffix"); suffix && !suffix->empty())
    bad("suffix", "is not supported");
  if (const Json* rf = f.get("response_format"))
    r.params.constraint.output = parse_response_format(*rf, nullptr);
  // The grammar forms other servers take beside response_format (vLLM's guided_* and
  // structured_outputs use the same three): one constraint a request.
  using Kind = engine::GrammarSpec::Kind;
  for (const auto& [key, kind] : {std::pair{"json_schema", Kind::JsonSchema},
                                  std::pair{"regex", Kind::Regex},
                                  std::pair{"grammar", Kind::Ebnf}}) {
    const Json* v = f.get(key);
    if (!v)
      continue;
    if (r.params.constraint.output)
      bad(key, "cannot be combined with another constraint (response_format, json_schema, "
               "regex, grammar)");
    if (kind == Kind::JsonSchema ? !(v->is_object() || v->is_boolean()) : !v->is_string())
      bad(key, kind == Kind::JsonSchema ? "must be a JSON schema object" : "must be a string");
    r.params.constraint.output =
        engine::GrammarSpec{kind, v->is_string() ? v->get<std::string>() : v->dump(), key};
  }
  if (auto vllm = parse_vllm_constraint(f)) {
    if (r.params.constraint.output)
      bad(vllm->field, fmt::format("cannot be combined with {} (one constraint a request)",
                                   r.params.constraint.output->field));
    r.params.constraint.output = std::move(vllm);
  }
  const Json* prompt = f.get("prompt");
  if (!prompt)
    bad("prompt", "is missing");
  f.reject_unknown();
  const Json* p = prompt;
  if (p->is_array() && p->size() == 1 && (*p)[0].is_string())
    p = &(*p)[0];
  if (p->is_string()) {
    if (p->get<std::string>().empty())
      bad("prompt", "must not be empty");
    r.prompt_text = p->get<std::string>();
  } else if (p->is_array() && !p->empty()) {
    for (const Json& id : *p) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
        bad("prompt", "must be a string or an array of token ids (one prompt per request), "
                      "not " +
                          id.dump());
      r.prompt_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  } else {
    bad("prompt", "must be a non-empty string or array of token ids, not " + type_name(*p));
  }
  return r;
}

} // namespace xserv::server::openai
