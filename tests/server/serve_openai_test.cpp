// The server's protocol layer without HTTP: request validation, chat -> harmony, and harmony
// output -> message on hand-written token sequences (the tiny model only writes garbage).
#include <doctest/doctest.h>

#include <string>

#include "server/openai_output.h"
#include "server/openai_request.h"
#include "server/openai_responses.h"
#include "server/session.h"
#include "tests/test_util.h"

using namespace xserv::server;
using namespace xserv::server::openai;
using xserv::models::Tokenizer;

namespace {

const Tokenizer& tokenizer() {
  static const Tokenizer tok = [] {
    auto dir = xserv::testing::data_dir();
    REQUIRE(dir.has_value());
    return Tokenizer::load(*dir / "o200k_base.tiktoken");
  }();
  return tok;
}

std::vector<xserv::models::TokenId> ids(const std::string& text) {
  return tokenizer().encode(text, xserv::models::AllowedSpecial::all());
}

/// Parses `text` (with specials) through a HarmonyOutput; returns it finished.
HarmonyOutput parse_output(const std::string& text) {
  HarmonyOutput out(tokenizer(), "call_t_");
  for (auto id : ids(text))
    out.push(id);
  out.finish();
  return out;
}

/// The status, param and message of the ApiError `f` throws (status 0 when none).
template <class F> ApiError caught(F f) {
  try {
    f();
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(0, "no error");
}

} // namespace

TEST_CASE("serve: request validation names the field") {
  auto chat = [](const std::string& body) {
    return caught([&] { parse_chat_request(parse_body(body)); });
  };
  const std::string msgs = R"("messages": [{"role": "user", "content": "hi"}])";
  CHECK(chat("{" + msgs + "}").status == 0);
  CHECK(chat("{" + msgs + R"(, "bogus": 1})").param == "bogus");
  CHECK(chat("{" + msgs + R"(, "temperature": 2.5})").param == "temperature");
  CHECK(chat("{" + msgs + R"(, "temperature": "hot"})").param == "temperature");
  CHECK(chat("{" + msgs + R"(, "top_p": 0})").param == "top_p");
  CHECK(chat("{" + msgs + R"(, "top_p": 1.5})").param == "top_p");
  CHECK(chat("{" + msgs + R"(, "top_k": -2})").param == "top_k"); // -1 and 0 are off
  CHECK(chat("{" + msgs + R"(, "top_k": 2.5})").param == "top_k");
  CHECK(chat("{" + msgs + R"(, "min_p": 1.5})").param == "min_p");
  CHECK(chat("{" + msgs + R"(, "min_p": -0.1})").param == "min_p");
  CHECK(chat("{" + msgs + R"(, "max_tokens": 0})").param == "max_tokens");
  CHECK(chat("{" + msgs + R"(, "max_tokens": 1.5})").param == "max_tokens");
  CHECK(chat("{" + msgs + R"(, "n": 0})").param == "n");
  CHECK(chat("{" + msgs + R"(, "n": 129})").param == "n");
  CHECK(parse_chat_request(parse_body("{" + msgs + R"(, "n": 3})")).params.n == 3);
  CHECK(chat("{" + msgs + R"(, "top_logprobs": 3})").param == "top_logprobs");
  CHECK(chat("{" + msgs + R"(, "logprobs": true, "top_logprobs": 21})").param == "top_logprobs");
  CHECK(chat("{" + msgs + R"(, "reasoning_effort": "max"})").param == "reasoning_effort");
  CHECK(chat("{" + msgs + R"(, "stop": [""]})").param == "stop");
  CHECK(chat("{" + msgs + R"(, "presence_penalty": 2.5})").param == "presence_penalty");
  CHECK(chat("{" + msgs + R"(, "frequency_penalty": -3})").param == "frequency_penalty");
  CHECK(chat("{" + msgs + R"(, "repetition_penalty": 0})").param == "repetition_penalty");
  CHECK(chat("{" + msgs + R"(, "logit_bias": {"12": 101}})").param == "logit_bias.12");
  CHECK(chat("{" + msgs + R"(, "logit_bias": {"-1": 5}})").param == "logit_bias.-1");
  CHECK(chat("{" + msgs + R"(, "logit_bias": {"7x": 5}})").param == "logit_bias.7x");
  CHECK(chat("{" + msgs + R"(, "logit_bias": [1]})").param == "logit_bias");
  CHECK(chat("{" + msgs + R"(, "logit_bias": {"5": 1, "05": 2}})").param == "logit_bias");
  const std::string tool = R"(, "tools": [{"type": "function", "function": {"name": ")";
  CHECK(chat("{" + msgs + tool + R"(get weather"}}]})").param == "tools[0].function.name");
  CHECK(chat("{" + msgs + tool + R"(get_weather-2"}}]})").status == 0);
  // A guided_json schema reaches the developer message's "# Response Formats" as
  // response_format's does, where gpt-oss reads it; a regex does not.
  const ChatRequest guided = parse_chat_request(
      parse_body("{" + msgs + R"(, "guided_json": {"type": "object"}})"));
  REQUIRE(guided.messages.size() >= 2);
  REQUIRE(guided.messages[1].developer);
  REQUIRE(guided.messages[1].developer->response_formats.size() == 1);
  CHECK(guided.messages[1].developer->response_formats[0].schema == R"({"type":"object"})");
  const ChatRequest regex =
      parse_chat_request(parse_body("{" + msgs + R"(, "guided_regex": "a+"})"));
  CHECK(std::none_of(regex.messages.begin(), regex.messages.end(),
                     [](const auto& m) { return m.developer.has_value(); }));
  const GenParams adjusted = parse_chat_request(parse_body("{" + msgs + R"(,
      "presence_penalty": 0.5, "frequency_penalty": -0.25, "repetition_penalty": 1.2,
      "logit_bias": {"200002": -100, "17": 3.5}})")).params;
  CHECK(adjusted.adjust.presence_penalty == 0.5f);
  CHECK(adjusted.adjust.frequency_penalty == -0.25f);
  CHECK(adjusted.adjust.repetition_penalty == doctest::Approx(1.2));
  REQUIRE(adjusted.adjust.bias.size() == 2);
  CHECK(adjusted.adjust.bias[0].first == 17);
  CHECK(adjusted.adjust.bias[0].second == 3.5f);
  CHECK(adjusted.adjust.bias[1].first == 200002);
  CHECK(adjusted.adjust.bias[1].second == -100.0f);
  CHECK(caught([&] { check_stop_token_ids(adjusted, 1000); }).param == "logit_bias.200002");
  CHECK(chat("{" + msgs + R"(, "stream_options": {"include_usage": true}})").param ==
        "stream_options");
  CHECK(chat(R"({"messages": []})").param == "messages");
  CHECK(chat(R"({"messages": [{"role": "robot", "content": "x"}]})").param == "messages[0].role");
  CHECK(chat(R"({"messages": [{"role": "user", "content": "x", "extra": 1}]})").param ==
        "messages[0].extra");
  CHECK(chat(R"({"messages": [{"role": "tool", "tool_call_id": "nope", "content": "x"}]})").param ==
        "messages[0].tool_call_id");
  CHECK(caught([] { parse_body("{not json"); }).status == 400);
  // The parser's position, without the JSON library's "[json.exception...]" tag.
  const std::string why = caught([] { parse_body("{not json"); }).what();
  CHECK(why.rfind("the request body is not valid JSON: parse error at line 1, column 3", 0) == 0);
  CHECK(caught([] { parse_body("[1]"); }).status == 400);
  // A number no double holds is a bad body too, not an internal error (found by fuzzing).
  CHECK(caught([] { parse_body(R"({"max_tokens": 1e400})"); }).status == 400);

  ChatRequest r = parse_chat_request(parse_body(
      "{" + msgs + R"(, "temperature": 0.5, "top_k": -1, "seed": 7, "max_completion_tokens": 9,
      "stop": "END", "logprobs": true, "top_logprobs": 2, "stream": true,
      "stream_options": {"include_usage": true}})"));
  CHECK(r.params.sampling.temperature == doctest::Approx(0.5));
  CHECK(r.params.sampling.top_k == 0);
  CHECK(r.params.sampling.seed == 7);
  CHECK(*r.params.max_tokens == 9);
  CHECK(r.params.stop == std::vector<std::string>{"END"});
  CHECK(r.params.top_logprobs == 2);
  CHECK(r.params.include_usage);

  auto comp = [](const std::string& body) {
    return caught([&] { parse_completion_request(parse_body(body)); });
  };
  CHECK(comp(R"({"prompt": "hi"})").status == 0);
  CHECK(comp(R"({"prompt": [1, 2, 3]})").status == 0);
  CHECK(comp(R"({"prompt": ["a", "b"]})").param == "prompt");
  CHECK(comp(R"({"prompt": [1, -2]})").param == "prompt");
  CHECK(comp(R"({})").param == "prompt");
  CHECK(comp(R"({"prompt": "x", "logprobs": 21})").param == "logprobs");
}

TEST_CASE("serve: chat messages render as harmony, tools and a tool round trip included") {
  XSERV_REQUIRE_DATA(data);
  const Json body = parse_body(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
      {"role": "assistant", "reasoning_content": "Need the tool.", "content": null,
       "tool_calls": [{"id": "c1", "type": "function",
                       "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 20}"}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
    "reasoning_effort": "high"})");
  ChatRequest r = parse_chat_request(body);
  const auto prompt = xserv::models::render_for_completion(tokenizer(), r.messages);
  const std::string text = tokenizer().decode(prompt);
  CHECK(text.find("Reasoning: high") != std::string::npos);
  CHECK(text.find("# Instructions\n\nBe brief.") != std::string::npos);
  CHECK(text.find("namespace functions") != std::string::npos);
  CHECK(text.find("type get_weather = (_: {") != std::string::npos);
  CHECK(text.find("<|start|>assistant<|channel|>analysis<|message|>Need the tool.<|end|>") !=
        std::string::npos);
  CHECK(text.find("<|start|>assistant to=functions.get_weather<|channel|>commentary "
                  "<|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>") != std::string::npos);
  CHECK(text.find("<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
                  "{\"temp\": 20}<|end|>") != std::string::npos);
  CHECK(text.ends_with("<|start|>assistant"));
}

TEST_CASE("serve: chat history keeps only the open turn's reasoning") {
  // Two finished turns, each with its reasoning, then a third that made a call and has its
  // result: the finished turns' analysis goes (both, not only the first's), the open turn's
  // stays in front of its call.
  XSERV_REQUIRE_DATA(data);
  const Json body = parse_body(R"({
    "messages": [
      {"role": "user", "content": "One?"},
      {"role": "assistant", "reasoning": "THINK-ONE", "content": "1"},
      {"role": "user", "content": "Two?"},
      {"role": "assistant", "reasoning_content": "THINK-TWO", "content": "2"},
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "reasoning": "THINK-THREE", "content": null,
       "tool_calls": [{"id": "c1", "type": "function",
                       "function": {"name": "get_weather", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather"}}]})");
  const std::string text = tokenizer().decode(
      xserv::models::render_for_completion(tokenizer(), parse_chat_request(body).messages));
  CHECK(text.find("THINK-ONE") == std::string::npos);
  CHECK(text.find("THINK-TWO") == std::string::npos);
  CHECK(text.find("<|start|>assistant<|channel|>final<|message|>1<|end|>") != std::string::npos);
  CHECK(text.find("<|start|>assistant<|channel|>final<|message|>2<|end|>") != std::string::npos);
  CHECK(text.find("<|start|>assistant<|channel|>analysis<|message|>THINK-THREE<|end|>"
                  "<|start|>assistant to=functions.get_weather") != std::string::npos);
  // Without a final message yet, nothing is dropped.
  const Json open = parse_body(R"({"messages": [
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "reasoning": "THINK-A", "content": null,
       "tool_calls": [{"id": "c1", "type": "function",
                       "function": {"name": "get_weather", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
    "tools": [{"type": "function", "function": {"name": "get_weather"}}]})");
  CHECK(tokenizer()
            .decode(xserv::models::render_for_completion(tokenizer(),
                                                         parse_chat_request(open).messages))
            .find("THINK-A") != std::string::npos);
}

TEST_CASE("serve: harmony output becomes content, reasoning and tool calls") {
  XSERV_REQUIRE_DATA(data);
  HarmonyOutput a = parse_output("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant"
                                 "<|channel|>final<|message|>Hello!<|return|>");
  CHECK(a.reasoning() == "Think.");
  CHECK(a.content() == "Hello!");
  CHECK(a.tool_calls().empty());

  // Two calls in one turn, a preamble on commentary.
  HarmonyOutput t = parse_output(
      "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant to=functions.a"
      "<|channel|>commentary <|constrain|>json<|message|>{\"x\":1}<|call|><|start|>assistant"
      "<|channel|>commentary to=functions.b <|constrain|>json<|message|>{}<|call|>");
  CHECK(t.content() == "Checking.");
  REQUIRE(t.tool_calls().size() == 2);
  CHECK(t.tool_calls()[0].name == "a");
  CHECK(t.tool_calls()[0].arguments == "{\"x\":1}");
  CHECK(t.tool_calls()[0].id == "call_t_0");
  CHECK(t.tool_calls()[1].name == "b");
  CHECK(t.tool_calls()[1].arguments == "{}");
}

TEST_CASE("serve: malformed harmony output degrades to content, never throws") {
  XSERV_REQUIRE_DATA(data);
  // Text without any channel markup.
  CHECK(parse_output("Just some text.").content() == "Just some text.");
  // A header with no channel before <|message|>.
  CHECK(parse_output("oops<|message|>rest<|end|>").content() == "oopsrest");
  // A broken channel header (nothing after the marker) still yields the text.
  CHECK(parse_output("<|channel|><|message|>body<|return|>").content() == "body");
  // A header that never ends: after 64 ids its text is content.
  std::string long_text;
  for (int i = 0; i < 100; ++i)
    long_text += " word";
  CHECK(parse_output("<|channel|>" + long_text).content().find("word word") != std::string::npos);
  // Specials inside a message are not leaked; <|channel|> mid-message starts a new one.
  HarmonyOutput m = parse_output("<|channel|>analysis<|message|>a<|constrain|>b<|channel|>final"
                                 "<|message|>c");
  CHECK(m.reasoning() == "ab");
  CHECK(m.content() == "c");
  // Cut by max_tokens inside analysis: the reasoning so far, no content.
  HarmonyOutput cut = parse_output("<|channel|>analysis<|message|>Let me think about");
  CHECK(cut.reasoning() == "Let me think about");
  CHECK(cut.content().empty());
  // Cut inside a header: nothing invented.
  HarmonyOutput h = parse_output("<|channel|>analysis<|message|>x<|end|><|start|>assistant"
                                 "<|channel|>fin");
  CHECK(h.reasoning() == "x");
  CHECK(h.content().empty());
}

TEST_CASE("serve: stop strings are held back until they cannot match") {
  StopMatcher m({"STOP", "xyz"});
  CHECK(m.push("hello ST") == "hello ");
  CHECK(m.push("O") == "");
  CHECK(m.push("x") == "STO"); // "x" may begin "xyz"
  CHECK(m.push("yzabc") == "");
  CHECK(m.matched());
  CHECK(m.push("more") == "");
  StopMatcher n({"END"});
  CHECK(n.push("abcE") == "abc");
  CHECK(n.flush() == "E");
  CHECK(!n.matched());
}

TEST_CASE("serve: chat session finish reasons, stop strings and usage") {
  XSERV_REQUIRE_DATA(data);
  using xserv::engine::Event;
  using xserv::engine::FinishReason;
  auto run = [](const std::string& text, FinishReason finish, GenParams p = {}) {
    auto session = std::make_unique<ChatSession>(tokenizer(), p, "chatcmpl-0123456789abcdef");
    auto toks = ids(text);
    Json lp = Json::array();
    for (size_t i = 0; i < toks.size(); ++i) {
      Event ev;
      ev.token = int32_t(toks[i]);
      ev.finish = i + 1 == toks.size() ? finish : FinishReason::None;
      session->on_event(ev, lp);
    }
    return session;
  };
  auto call = run("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>",
                  FinishReason::Stop);
  CHECK(call->finish_reason() == "tool_calls");
  Json m = call->message();
  CHECK(m["content"].is_null());
  CHECK(m["tool_calls"][0]["function"]["name"] == "f");
  CHECK(m["tool_calls"][0]["type"] == "function");

  // A request with tools does not stop at <|call|>: a second call follows <|start|>, and the
  // first id after a call that is not <|start|> ends the turn (stop_hit: the server aborts).
  {
    auto session = std::make_unique<ChatSession>(tokenizer(), GenParams{}, "chatcmpl-0123");
    const auto toks = ids("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}"
                          "<|call|><|start|>assistant<|channel|>commentary to=functions.g "
                          "<|constrain|>json<|message|>{\"a\":1}<|call|>Hello");
    Json lp = Json::array();
    for (size_t i = 0; i < toks.size(); ++i) {
      Event ev;
      ev.token = int32_t(toks[i]);
      session->on_event(ev, lp);
      CHECK(session->stop_hit() == (i + 1 == toks.size()));
    }
    Event end; // the abort the server asked for
    end.finish = FinishReason::Abort;
    session->on_event(end, lp);
    CHECK(session->finish_reason() == "tool_calls");
    const Json m2 = session->message();
    REQUIRE(m2["tool_calls"].size() == 2);
    CHECK(m2["tool_calls"][0]["function"]["name"] == "f");
    CHECK(m2["tool_calls"][1]["function"]["name"] == "g");
    CHECK(m2["tool_calls"][1]["function"]["arguments"] == "{\"a\":1}");
    CHECK(m2["content"].is_null());
  }

  // After a call only the assistant's next call goes on. A message the model writes in the
  // tool's name (its made-up result), a final answer without the result, or an output that
  // ends inside the header ends the turn where that header began: nothing of it reaches the
  // client, as text or in a delta, and the turn's one call stands.
  {
    const std::string first = "<|channel|>commentary to=functions.get_weather <|constrain|>json"
                              "<|message|>{\"city\":\"Paris\"}<|call|>";
    struct Case {
      std::string after;
      bool another;                             // the assistant's next call
      FinishReason finish = FinishReason::Stop; // unless the server aborts first
    };
    const Case cases[] = {
        {"<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
         "{\"celsius\":21}<|end|><|start|>assistant<|channel|>final<|message|>It is 21 C.",
         false},
        {"<|start|>assistant<|channel|>final<|message|>It is 21 C.", false},
        {"<|start|>assistant<|channel|>analysis<|message|>The tool said 21.", false},
        {"<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{}"
         "<|call|>",
         true},
        {"<|start|>assistant<|channel|>commentary to=functions", false, FinishReason::Length}};
    for (const Case& c : cases) {
      CAPTURE(c.after);
      auto session = std::make_unique<ChatSession>(tokenizer(), GenParams{}, "chatcmpl-0123");
      const auto toks = ids(first + c.after);
      const auto message = tokenizer().special_id("<|message|>");
      Json lp = Json::array();
      std::string streamed;
      int calls_started = 0;
      bool ended = false;
      for (size_t i = 0; i < toks.size() && !ended; ++i) {
        Event ev;
        ev.token = int32_t(toks[i]);
        for (const Json& d : session->on_event(ev, lp)) {
          if (d.contains("content"))
            streamed += d["content"].get<std::string>();
          if (d.contains("reasoning"))
            streamed += d["reasoning"].get<std::string>();
          if (d.contains("tool_calls") && d["tool_calls"][0].contains("id"))
            ++calls_started;
        }
        if (session->stop_hit()) { // the server aborts: no more ids come
          CHECK_FALSE(c.another);
          CHECK(toks[i] == message); // decided at the header's end, not before
          ended = true;
        }
      }
      Event end;
      end.finish = ended ? FinishReason::Abort : c.finish;
      session->on_event(end, lp);
      CHECK(session->finish_reason() == "tool_calls");
      const Json m = session->message();
      CHECK(streamed == "");
      CHECK(m["content"].is_null());
      CHECK_FALSE(m.contains("reasoning"));
      REQUIRE(m["tool_calls"].size() == (c.another ? 2u : 1u));
      CHECK(calls_started == int(m["tool_calls"].size()));
      CHECK(m["tool_calls"][0]["function"]["arguments"] == "{\"city\":\"Paris\"}");
      if (c.another)
        CHECK(m["tool_calls"][1]["function"]["name"] == "get_time");
    }
  }

  auto length = run("<|channel|>analysis<|message|>thinking hard", FinishReason::Length);
  CHECK(length->finish_reason() == "length");
  CHECK(length->message()["reasoning"] == "thinking hard");
  CHECK(length->message()["content"] == "");

  GenParams p;
  p.stop = {" world"};
  auto stopped = run("<|channel|>final<|message|>hello world and more", FinishReason::Length, p);
  CHECK(stopped->stop_hit());
  CHECK(stopped->finish_reason() == "stop");
  CHECK(stopped->message()["content"] == "hello");
}

TEST_CASE("responses: input items render as the chat request that means the same") {
  XSERV_REQUIRE_DATA(data);
  auto prompt_of_chat = [](const std::string& body) {
    return xserv::models::render_for_completion(tokenizer(),
                                                parse_chat_request(parse_body(body)).messages);
  };
  auto prompt_of_responses = [](const std::string& body) {
    return xserv::models::render_for_completion(
        tokenizer(), parse_responses_chat(parse_responses_request(parse_body(body))).messages);
  };
  // A string input is one user message.
  CHECK(prompt_of_responses(R"({"input": "Hi"})") ==
        prompt_of_chat(R"({"messages": [{"role": "user", "content": "Hi"}]})"));
  // Instructions, text parts, effort, tools, and a tool round trip with reasoning before it.
  const std::string responses = R"({
    "instructions": "Be brief.",
    "reasoning": {"effort": "high"},
    "input": [
      {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [],
       "content": [{"type": "reasoning_text", "text": "Need the tool."}]},
      {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "get_weather",
       "arguments": "{\"city\":\"Paris\"}", "status": "completed"},
      {"type": "function_call_output", "call_id": "c1", "output": "{\"temp\": 20}"},
      {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
       "content": [{"type": "output_text", "text": "20 C.", "annotations": []}]},
      {"role": "user", "content": "Thanks"}],
    "tools": [{"type": "function", "name": "get_weather", "description": "Weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]})";
  const std::string chat = R"({
    "reasoning_effort": "high",
    "messages": [
      {"role": "developer", "content": "Be brief."},
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "reasoning": "Need the tool.", "content": null,
       "tool_calls": [{"id": "c1", "type": "function",
                       "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 20}"},
      {"role": "assistant", "content": "20 C."},
      {"role": "user", "content": "Thanks"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]})";
  const auto want = prompt_of_chat(chat);
  CHECK(prompt_of_responses(responses) == want);
  const std::string text = tokenizer().decode(want);
  CHECK(text.find("Reasoning: high") != std::string::npos);
  CHECK(text.find("functions.get_weather") != std::string::npos);

  const ResponsesRequest r = parse_responses_request(parse_body(
      R"({"input": "x", "max_output_tokens": 7, "temperature": 0.5, "stream": true,
          "instructions": "I", "metadata": {"k": "v"}, "store": true})"));
  CHECK(r.stream);
  CHECK(r.chat["max_tokens"] == 7);
  CHECK(r.echo["max_output_tokens"] == 7);
  CHECK(r.echo["temperature"] == 0.5);
  CHECK(r.echo["instructions"] == "I");
  CHECK(r.echo["metadata"]["k"] == "v");
  CHECK(parse_responses_chat(r).params.max_tokens == 7);
}

TEST_CASE("responses: validation names the field as the client wrote it") {
  auto param = [](const std::string& body) {
    return caught([&] { parse_responses_chat(parse_responses_request(parse_body(body))); }).param;
  };
  CHECK(param(R"({"input": "hi"})").empty());
  CHECK(param(R"({})") == "input");
  CHECK(param(R"({"input": ""})") == "input");
  CHECK(param(R"({"input": []})") == "input");
  CHECK(param(R"({"input": "hi", "frob": 1})") == "frob");
  CHECK(param(R"({"input": "hi", "max_output_tokens": 0})") == "max_output_tokens");
  CHECK(param(R"({"input": "hi", "temperature": 3})") == "temperature");
  CHECK(param(R"({"input": "hi", "previous_response_id": "resp_1"})") == "previous_response_id");
  CHECK(param(R"({"input": "hi", "reasoning": {"effort": "minimal"}})") == "reasoning.effort");
  CHECK(param(R"({"input": "hi", "reasoning": {"summary": "auto"}})") == "reasoning.summary");
  CHECK(param(R"({"input": "hi", "tools": [{"type": "web_search"}]})") == "tools[0].type");
  CHECK(param(R"({"input": "hi", "tools": [{"type": "function"}]})") == "tools[0].name");
  CHECK(param(R"({"input": "hi", "include": ["reasoning.encrypted_content"]})") == "include");
  CHECK(param(R"({"input": "hi", "text": {"format": {"type": "json_schema"}}})") ==
        "text.format.name");
  CHECK(param(R"({"input": "hi", "text": {"format": {"type": "json_schema", "name": "n"}}})") ==
        "text.format.schema");
  CHECK(param(R"({"input": "hi", "text": {"format": {"type": "xml"}}})") == "text.format.type");
  CHECK(param(R"({"input": "hi", "truncation": "auto"})") == "truncation");
  CHECK(param(R"({"input": [{"role": "user", "content": [{"type": "input_image"}]}]})") ==
        "input[0].content[0].type");
  CHECK(param(R"({"input": [{"role": "robot", "content": "x"}]})") == "input[0].role");
  CHECK(param(R"({"input": [{"type": "function_call_output", "call_id": "c9", "output": "x"}]})") ==
        "input[0].call_id");
  CHECK(param(R"({"input": [{"type": "function_call", "call_id": "c1", "name": "f"}]})") ==
        "input[0].arguments");
  CHECK(param(R"({"input": [{"type": "item_reference", "id": "x"}]})") == "input[0].type");
  CHECK(param(R"({"input": [{"role": "user", "content": "x", "extra": 1}]})") == "input[0].extra");
}

TEST_CASE("responses: chat deltas become output items and the stream's events") {
  ResponsesOutput out("abc");
  std::vector<std::string> types;
  auto feed = [&](std::vector<Json> events) {
    for (const Json& e : events)
      types.push_back(e["type"]);
    return events;
  };
  feed(out.push({{"reasoning", "Think"}}));
  feed(out.push({{"reasoning", " more."}}));
  auto text = feed(out.push({{"content", "Hi"}}));
  CHECK(text.back()["delta"] == "Hi");
  CHECK(text.back()["output_index"] == 1);
  CHECK(text.back()["item_id"] == "msg_abc_1");
  feed(out.push(
      {{"tool_calls", Json::array({{{"index", 0},
                                    {"id", "call_x_0"},
                                    {"type", "function"},
                                    {"function", {{"name", "f"}, {"arguments", ""}}}}})}}));
  auto args = feed(out.push(
      {{"tool_calls", Json::array({{{"index", 0}, {"function", {{"arguments", "{\"a\":"}}}}})}}));
  CHECK(args.back()["type"] == "response.function_call_arguments.delta");
  CHECK(args.back()["item_id"] == "fc_abc_2");
  feed(out.push(
      {{"tool_calls", Json::array({{{"index", 0}, {"function", {{"arguments", "1}"}}}}})}}));
  feed(out.finish(true));
  const std::vector<std::string> want = {"response.output_item.added",
                                         "response.content_part.added",
                                         "response.reasoning_text.delta",
                                         "response.reasoning_text.delta",
                                         "response.reasoning_text.done",
                                         "response.content_part.done",
                                         "response.output_item.done",
                                         "response.output_item.added",
                                         "response.content_part.added",
                                         "response.output_text.delta",
                                         "response.output_text.done",
                                         "response.content_part.done",
                                         "response.output_item.done",
                                         "response.output_item.added",
                                         "response.function_call_arguments.delta",
                                         "response.function_call_arguments.delta",
                                         "response.function_call_arguments.done",
                                         "response.output_item.done"};
  CHECK(types == want);
  const Json& o = out.output();
  REQUIRE(o.size() == 3);
  CHECK(o[0]["type"] == "reasoning");
  CHECK(o[0]["content"][0]["text"] == "Think more.");
  CHECK(o[0]["status"] == "completed");
  CHECK(o[1]["type"] == "message");
  CHECK(o[1]["content"][0]["text"] == "Hi");
  CHECK(o[2]["type"] == "function_call");
  CHECK(o[2]["call_id"] == "call_x_0");
  CHECK(o[2]["name"] == "f");
  CHECK(o[2]["arguments"] == "{\"a\":1}");
  CHECK(out.output_text() == "Hi");

  // Cut by the token limit: the open item is incomplete; an empty output still has a message.
  ResponsesOutput cut("d");
  cut.push({{"content", "abc"}});
  cut.finish(false);
  CHECK(cut.output()[0]["status"] == "incomplete");
  ResponsesOutput empty("e");
  std::vector<Json> ev = empty.finish(true);
  REQUIRE(empty.output().size() == 1);
  CHECK(empty.output()[0]["type"] == "message");
  CHECK(empty.output()[0]["content"][0]["text"] == "");
  CHECK(ev.back()["type"] == "response.output_item.done");

  const Json r = response_object("resp_1", 5, "m",
                                 parse_responses_request(parse_body(R"({"input": "x"})")).echo,
                                 "incomplete", out.output(), 10, 4, 2);
  CHECK(r["incomplete_details"]["reason"] == "max_output_tokens");
  CHECK(r["usage"]["total_tokens"] == 14);
  CHECK(r["usage"]["output_tokens_details"]["reasoning_tokens"] == 2);
  CHECK(responses_status("length") == "incomplete");
  CHECK(responses_status("tool_calls") == "completed");
  CHECK(responses_status("abort") == "cancelled");
}

TEST_CASE("serve: the chat session counts the ids of analysis messages") {
  XSERV_REQUIRE_DATA(data);
  using xserv::engine::Event;
  using xserv::engine::FinishReason;
  ChatSession session(tokenizer(), GenParams{}, "resp_0123456789abcdef");
  const auto analysis = ids("<|channel|>analysis<|message|>Let me think.<|end|>");
  const auto final_part = ids("<|start|>assistant<|channel|>final<|message|>Hi.");
  std::vector<xserv::models::TokenId> all = analysis;
  all.insert(all.end(), final_part.begin(), final_part.end());
  Json lp = Json::array();
  for (size_t i = 0; i < all.size(); ++i) {
    Event ev;
    ev.token = int32_t(all[i]);
    ev.finish = i + 1 == all.size() ? FinishReason::Length : FinishReason::None;
    session.on_event(ev, lp);
  }
  // From <|message|> to <|end|>: the analysis ids less <|channel|> and "analysis".
  const auto header = ids("<|channel|>analysis");
  CHECK(session.reasoning_tokens() == int64_t(analysis.size() - header.size()));
  CHECK(session.message()["reasoning"] == "Let me think.");
  CHECK(session.message()["content"] == "Hi.");
}
