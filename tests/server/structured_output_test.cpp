// Structured output through `xserv serve` on the tiny model's random weights, where only the
// constraint can make an output valid: completions with json_schema, response_format, regex and
// an EBNF grammar, greedy, sampled and with n choices; refusals naming the field and keyword.
#include <doctest/doctest.h>

#include <algorithm>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "tests/server/tiny_server.h"

using namespace xserv;
using namespace xserv::testing;
using Json = nlohmann::json;

namespace {

/// The texts and finish reasons of a completion's choices.
std::vector<std::pair<std::string, std::string>> choices(const HttpResponse& r) {
  REQUIRE_MESSAGE(r.status == 200, r.body);
  std::vector<std::pair<std::string, std::string>> out;
  const Json body = Json::parse(r.body);
  for (const Json& c : body["choices"])
    out.emplace_back(c["text"].get<std::string>(), c["finish_reason"].get<std::string>());
  return out;
}

std::string completion(const Json& extra) {
  Json body = {{"prompt", "The answer:"}, {"max_tokens", 120}};
  body.update(extra);
  return body.dump();
}

} // namespace

TEST_CASE("structured output: completions follow a JSON schema on random weights") {
  XSERV_REQUIRE_DATA(data);
  TinyServer s({}, 4, 256);
  s.model.set_open(true);
  const Json schema = Json::parse(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "enum": ["ada", "bo", "cy"]},
      "age": {"type": "integer", "minimum": 0, "maximum": 120},
      "tags": {"type": "array", "items": {"type": "string", "enum": ["x", "y"]}, "maxItems": 3},
      "ok": {"type": "boolean"}
    },
    "required": ["name", "age", "ok"], "additionalProperties": false})");
  auto check = [&](const std::string& text, const std::string& finish) {
    CAPTURE(text);
    CHECK(finish == "stop"); // the schema is finite: it ends by itself
    const Json v = Json::parse(text); // throws (fails the test) when it does not parse
    REQUIRE(v.is_object());
    CHECK(std::set<std::string>{"ada", "bo", "cy"}.count(v["name"].get<std::string>()));
    CHECK(v["age"].is_number_integer());
    CHECK(v["age"].get<int>() >= 0);
    CHECK(v["age"].get<int>() <= 120);
    CHECK(v["ok"].is_boolean());
    for (auto it = v.begin(); it != v.end(); ++it)
      CHECK(std::set<std::string>{"name", "age", "tags", "ok"}.count(it.key()));
    if (v.contains("tags"))
      CHECK(v["tags"].size() <= 3);
  };
  for (const auto& [text, finish] :
       choices(s.post("/v1/completions", completion({{"json_schema", schema},
                                                      {"temperature", 0}}))))
    check(text, finish);
  // Sampled, several choices of one request (each with its own state), and response_format.
  for (const auto& [text, finish] : choices(s.post(
           "/v1/completions",
           completion({{"response_format",
                        {{"type", "json_schema"}, {"json_schema", {{"name", "p"}, {"schema", schema}}}}},
                       {"temperature", 1},
                       {"seed", 5},
                       {"n", 3}}))))
    check(text, finish);
  // json_object: any object.
  for (const auto& [text, finish] : choices(s.post(
           "/v1/completions", completion({{"response_format", {{"type", "json_object"}}},
                                          {"temperature", 1},
                                          {"seed", 9},
                                          {"max_tokens", 200}})))) {
    CAPTURE(text);
    if (finish == "stop")
      CHECK(Json::parse(text).is_object());
    else // an object may go on past max_tokens; what there is is still its start
      CHECK(text.starts_with("{"));
  }
}

TEST_CASE("structured output: completions follow a regex and an EBNF grammar") {
  XSERV_REQUIRE_DATA(data);
  TinyServer s({}, 4, 256);
  s.model.set_open(true);
  for (int seed : {1, 2, 3}) {
    const auto regex = choices(s.post(
        "/v1/completions", completion({{"regex", "[0-9]{3}-(red|green|blue)"},
                                       {"temperature", 1},
                                       {"seed", seed}})));
    REQUIRE(regex.size() == 1);
    CHECK_MESSAGE(std::regex_match(regex[0].first, std::regex("[0-9]{3}-(red|green|blue)")),
                  regex[0].first);
    CHECK(regex[0].second == "stop");
    const auto ebnf = choices(s.post(
        "/v1/completions",
        completion({{"grammar", R"g(root ::= "(" item ("," item){0,3} ")"
item ::= [a-c] | "zz")g"},
                    {"temperature", 1},
                    {"seed", seed}})));
    REQUIRE(ebnf.size() == 1);
    CHECK_MESSAGE(std::regex_match(ebnf[0].first, std::regex(R"(\(([a-c]|zz)(,([a-c]|zz)){0,3}\))")),
                  ebnf[0].first);
    CHECK(ebnf[0].second == "stop");
  }
}

TEST_CASE("structured output: vLLM's structured_outputs and guided_* forms, choices escaped") {
  XSERV_REQUIRE_DATA(data);
  TinyServer s({}, 4, 256);
  s.model.set_open(true);
  // Quotes, a backslash, a newline and a non-ASCII letter: the choices are literal strings.
  // A newline before hex digits ("1\nab"): escaped so that they stay letters of their own.
  const std::vector<std::string> options = {"say \"yes\"", "a\\b", "1\nab", "ünï", "tab\tdeaf"};
  const Json list = options;
  for (int seed : {1, 2, 3, 4}) {
    for (const Json& extra : {Json{{"structured_outputs", {{"choice", list}}}},
                              Json{{"guided_choice", list}}}) {
      Json body = extra;
      body.update({{"temperature", 1}, {"seed", seed}});
      const auto c = choices(s.post("/v1/completions", completion(body)));
      REQUIRE(c.size() == 1);
      CHECK_MESSAGE(std::find(options.begin(), options.end(), c[0].first) != options.end(),
                    c[0].first);
      CHECK(c[0].second == "stop");
    }
  }
  const auto re = choices(s.post(
      "/v1/completions", completion({{"structured_outputs", {{"regex", "[xy]{2}[0-9]"}}}})));
  CHECK_MESSAGE(std::regex_match(re[0].first, std::regex("[xy]{2}[0-9]")), re[0].first);
  // guided_json takes the schema as an object or as its JSON text.
  for (const Json& schema :
       {Json{{"type", "object"}, {"properties", {{"k", {{"enum", {1, 2}}}}}}, {"required", {"k"}}},
        Json(R"({"type": "object", "properties": {"k": {"enum": [1, 2]}}, "required": ["k"]})")}) {
    const auto j = choices(s.post("/v1/completions", completion({{"guided_json", schema}})));
    const Json v = Json::parse(j[0].first);
    CHECK((v["k"] == 1 || v["k"] == 2));
  }
  auto refused = [&](const std::string& path, const Json& body, const std::string& param,
                     const std::string& word) {
    CAPTURE(body.dump());
    const HttpResponse r = s.post(path, body.dump());
    CHECK(r.status == 400);
    CHECK(error_of(r)["param"] == param);
    CHECK_MESSAGE(error_of(r)["message"].get<std::string>().find(word) != std::string::npos,
                  error_of(r)["message"]);
  };
  refused("/v1/completions", {{"prompt", "x"}, {"guided_choice", Json::array()}}, "guided_choice",
          "list of 1 to 1024");
  refused("/v1/completions", {{"prompt", "x"}, {"regex", "a"}, {"guided_regex", "b"}},
          "guided_regex", "cannot be combined with regex");
  refused("/v1/completions",
          {{"prompt", "x"}, {"structured_outputs", {{"regex", "a"}, {"choice", {"b"}}}}},
          "structured_outputs.choice", "cannot be combined");
  refused("/v1/completions",
          {{"prompt", "x"}, {"structured_outputs", {{"whitespace_pattern", " "}}}},
          "structured_outputs.whitespace_pattern", "");
  refused("/v1/completions", {{"prompt", "x"}, {"guided_json", "{not json"}}, "guided_json",
          "not a JSON schema");
  // A schema as text is checked for depth before it is parsed (printing a value recurses).
  refused("/v1/completions",
          {{"prompt", "x"},
           {"guided_json", "{\"a\": " + std::string(100000, '[') + std::string(100000, ']') + "}"}},
          "guided_json", "deeper than 64");
  refused("/v1/chat/completions",
          {{"messages", {{{"role", "user"}, {"content", "x"}}}},
           {"response_format", {{"type", "json_object"}}},
           {"guided_regex", "a"}},
          "guided_regex", "response_format");
  // A chat request binds its final channel with them as with response_format.
  const HttpResponse chat = s.post(
      "/v1/chat/completions", Json{{"messages", {{{"role", "user"}, {"content", "x"}}}},
                                   {"max_tokens", 4},
                                   {"structured_outputs", {{"choice", {"a", "b"}}}}}
                                  .dump());
  CHECK_MESSAGE(chat.status == 200, chat.body);
}

TEST_CASE("structured output: what cannot be enforced is refused, naming the field") {
  XSERV_REQUIRE_DATA(data);
  TinyServer s;
  auto refusal = [&](const std::string& path, const Json& body, const std::string& param,
                     const std::string& word) {
    CAPTURE(body.dump());
    const HttpResponse r = s.post(path, body.dump());
    CHECK(r.status == 400);
    const Json e = error_of(r);
    CHECK(e["param"] == param);
    CHECK_MESSAGE(e["message"].get<std::string>().find(word) != std::string::npos, e["message"]);
  };
  const Json unique = {{"type", "array"}, {"uniqueItems", true}};
  refusal("/v1/completions", {{"prompt", "x"}, {"json_schema", unique}}, "json_schema",
          "uniqueItems");
  refusal("/v1/chat/completions",
          {{"messages", {{{"role", "user"}, {"content", "x"}}}},
           {"response_format",
            {{"type", "json_schema"}, {"json_schema", {{"name", "n"}, {"schema", unique}}}}}},
          "response_format.json_schema.schema", "uniqueItems");
  refusal("/v1/chat/completions",
          {{"messages", {{{"role", "user"}, {"content", "x"}}}},
           {"response_format", {{"type", "xml"}}}},
          "response_format.type", "json_schema");
  refusal("/v1/chat/completions",
          {{"messages", {{{"role", "user"}, {"content", "x"}}}},
           {"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", unique}}}}}},
          "response_format.json_schema.name", "missing");
  refusal("/v1/completions", {{"prompt", "x"}, {"regex", "[a-"}}, "regex", "cannot be enforced");
  refusal("/v1/completions", {{"prompt", "x"}, {"regex", "a"}, {"grammar", "root ::= \"a\""}},
          "grammar", "cannot be combined");
  refusal("/v1/chat/completions",
          {{"messages", {{{"role", "user"}, {"content", "x"}}}},
           {"tools",
            {{{"type", "function"},
              {"function",
               {{"name", "f"},
                {"strict", true},
                {"parameters", {{"type", "object"}, {"not", {{"type", "object"}}}}}}}}}}},
          "tools[0].function.parameters", "not");
  refusal("/v1/responses",
          {{"input", "x"},
           {"text", {{"format", {{"type", "json_schema"}, {"name", "n"}, {"schema", unique}}}}}},
          "text.format.schema", "uniqueItems");
  // tool_choice: required or named needs tools, and a named tool must be one of them.
  const Json weather_tool = {{"type", "function"},
                             {"function", {{"name", "weather"}, {"parameters", {{"type", "object"}}}}}};
  const Json user = {{{"role", "user"}, {"content", "x"}}};
  refusal("/v1/chat/completions", {{"messages", user}, {"tool_choice", "required"}}, "tool_choice",
          "no tools");
  refusal("/v1/chat/completions",
          {{"messages", user},
           {"tools", {weather_tool}},
           {"tool_choice", {{"type", "function"}, {"function", {{"name", "news"}}}}}},
          "tool_choice.function.name", "'news' is not among");
  refusal("/v1/chat/completions",
          {{"messages", user}, {"tools", {weather_tool}}, {"tool_choice", "always"}},
          "tool_choice", "\"required\"");
  refusal("/v1/chat/completions",
          {{"messages", user}, {"tools", {weather_tool}}, {"tool_choice", {{"type", "function"}}}},
          "tool_choice.function", "missing");
  const HttpResponse resp = s.post(
      "/v1/responses", Json{{"input", "x"},
                            {"max_output_tokens", 4},
                            {"text", {{"format", {{"type", "json_schema"},
                                                  {"name", "n"},
                                                  {"schema", {{"type", "object"}}}}}}}}
                           .dump());
  CHECK_MESSAGE(resp.status == 200, resp.body);
  // A chat request with a format is served (the format binds only the final channel).
  const HttpResponse ok = s.post(
      "/v1/chat/completions",
      Json{{"messages", {{{"role", "user"}, {"content", "x"}}}},
           {"max_tokens", 4},
           {"response_format", {{"type", "json_object"}}}}
          .dump());
  CHECK(ok.status == 200);
}

TEST_CASE("structured output: tool_choice required or named forces a call on random weights") {
  XSERV_REQUIRE_DATA(data);
  TinyServer s({}, 2, 256);
  s.model.set_open(true);
  const Json tool = {
      {"type", "function"},
      {"function",
       {{"name", "weather"},
        {"strict", true},
        {"parameters",
         {{"type", "object"},
          {"properties", {{"city", {{"enum", {"Oslo", "Lima"}}}}}},
          {"required", {"city"}}}}}}};
  for (const Json& choice : {Json("required"),
                             Json{{"type", "function"}, {"function", {{"name", "weather"}}}}}) {
    CAPTURE(choice.dump());
    const HttpResponse r = s.post("/v1/chat/completions",
                                  Json{{"messages", {{{"role", "user"}, {"content", "x"}}}},
                                       {"tools", {tool}},
                                       {"tool_choice", choice},
                                       {"max_tokens", 120}}
                                      .dump());
    REQUIRE_MESSAGE(r.status == 200, r.body);
    const Json c = Json::parse(r.body)["choices"][0];
    CAPTURE(c.dump());
    // Random weights may reason (analysis) until max_tokens; they can never answer instead.
    const Json content = c["message"].value("content", Json());
    CHECK((content.is_null() || content == ""));
    if (c["finish_reason"] == "tool_calls") {
      const Json& call = c["message"]["tool_calls"][0]["function"];
      CHECK(call["name"] == "weather");
      const Json args = Json::parse(call["arguments"].get<std::string>());
      CHECK((args["city"] == "Oslo" || args["city"] == "Lima"));
    } else {
      CHECK(c["finish_reason"] == "length");
    }
  }
  // The Responses API names the function at the top of tool_choice, and echoes it as given.
  const Json named = {{"type", "function"}, {"name", "weather"}};
  const HttpResponse r = s.post(
      "/v1/responses", Json{{"input", "x"},
                            {"tools", {{{"type", "function"},
                                        {"name", "weather"},
                                        {"parameters", {{"type", "object"}}}}}},
                            {"tool_choice", named},
                            {"max_output_tokens", 8}}
                           .dump());
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(Json::parse(r.body)["tool_choice"] == named);
  // Its refusals name the fields as a Responses client wrote them.
  for (const auto& [choice, param] :
       {std::pair{Json{{"type", "function"}}, "tool_choice.name"},
        std::pair{Json{{"type", "file_search"}, {"name", "weather"}}, "tool_choice.type"},
        std::pair{Json{{"type", "function"}, {"name", "news"}}, "tool_choice.name"}}) {
    CAPTURE(choice.dump());
    const HttpResponse bad = s.post(
        "/v1/responses", Json{{"input", "x"},
                              {"tools", {{{"type", "function"}, {"name", "weather"}}}},
                              {"tool_choice", choice}}
                             .dump());
    CHECK(bad.status == 400);
    CHECK(error_of(bad)["param"] == param);
  }
}
