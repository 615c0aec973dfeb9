// Tests of harmony chat rendering (against openai/harmony's vectors) and of the streaming parser.
#include <doctest/doctest.h>

#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "models/harmony.h"
#include "tests/models/harmony_vectors.h"
#include "tests/test_util.h"

namespace {

using namespace xserv::models;

std::map<std::string, std::vector<TokenId>> vector_ids(const std::filesystem::path& data) {
  return xserv::testing::harmony_vector_ids(data);
}

const Tokenizer& tokenizer(const std::filesystem::path& data) {
  static const Tokenizer tok = Tokenizer::load(data / "o200k_base.tiktoken");
  return tok;
}

Message system_message(ReasoningEffort effort, std::string date = "",
                       std::vector<std::string> channels = {"analysis", "commentary", "final"}) {
  SystemContent sys;
  sys.reasoning_effort = effort;
  sys.current_date = std::move(date);
  sys.valid_channels = std::move(channels);
  return Message::make_system(std::move(sys));
}

Message with_header(Message m, std::string recipient, std::string content_type) {
  m.recipient = std::move(recipient);
  m.content_type = std::move(content_type);
  return m;
}

const std::string kCapital = "What is the capital of the largest country in the world?";
const std::string kRobot = "Answer the user's questions like a robot.";

} // namespace

TEST_CASE("plain chat render vectors are reproduced from structured messages") {
  XSERV_REQUIRE_DATA(data);
  const Tokenizer& tok = tokenizer(data);
  auto ids = vector_ids(data);
  using E = ReasoningEffort;
  const Message user22 = Message::user("What is 2 + 2?");
  const std::map<std::string, std::vector<Message>> prompts = {
      {"test_no_tools", {system_message(E::Medium, "2025-06-28")}},
      {"test_simple_convo", {system_message(E::Medium), user22}},
      {"test_simple_convo_high_effort",
       {system_message(E::High), Message::make_developer({kRobot, {}}), Message::user(kCapital)}},
      {"test_simple_convo_medium_effort",
       {system_message(E::Medium), Message::make_developer({kRobot, {}}), Message::user(kCapital)}},
      {"test_simple_convo_low_effort",
       {system_message(E::Low), Message::make_developer({kRobot, {}}), Message::user(kCapital)}},
      {"test_simple_convo_high_effort_no_instruction",
       {system_message(E::High), Message::user(kCapital)}},
      {"test_simple_convo_medium_effort_no_instruction",
       {system_message(E::Medium), Message::user(kCapital)}},
      {"test_simple_convo_low_effort_no_instruction",
       {system_message(E::Low), Message::user(kCapital)}},
      {"test_reasoning_system_message",
       {system_message(E::Medium, "", {"analysis", "final"}), user22}},
      {"test_reasoning_system_message_no_instruction",
       {system_message(E::High, "", {"analysis", "final"}),
        Message::user("What is the best place to eat candy in the world?")}},
      {"test_reasoning_system_message_with_dates",
       {[] {
          SystemContent s;
          s.knowledge_cutoff = "2021-01";
          s.current_date = "2021-01-01";
          s.valid_channels = {"analysis", "final"};
          return Message::make_system(s);
        }(),
        Message::user("What is 42 * pi?")}},
      {"hf_chat_template_style_prompt_with_date",
       {system_message(E::Medium, "2025-08-05"), user22}},
      {"test_dropping_cot_by_default",
       {user22,
        Message::assistant("User asks a simple question: \"What is 2 + 2?\" The answer: 4.",
                           "analysis"),
        Message::assistant("2 + 2 equals 4."), Message::user("What about 9 / 2?")}},
      {"test_does_not_drop_if_ongoing_analysis",
       {Message::user("What is the weather in SF?"),
        Message::assistant(
            "User asks: “What is the weather in SF?” We need to use lookup_weather tool.",
            "analysis"),
        with_header(Message::assistant("{\"location\": \"San Francisco\"}", "commentary"),
                    "functions.lookup_weather", "<|constrain|>json"),
        Message::tool("functions.lookup_weather",
                      "{\"temperature\": 20, \"description\": \"sunny\"}")}},
  };
  for (const auto& [name, messages] : prompts) {
    INFO("vector: " << name);
    REQUIRE(ids.count(name));
    CHECK(render_for_completion(tok, messages) == ids[name]);
  }

  // GSM8K test[0] through the convenience used by the evals.
  std::ifstream gsm(data / "gsm8k_test.jsonl");
  std::string first;
  std::getline(gsm, first);
  auto question = nlohmann::json::parse(first)["question"].get<std::string>();
  ChatPrompt chat;
  chat.user = question;
  CHECK(render_for_completion(tok, make_chat(chat)) == ids["gsm8k_test_0_prompt_medium"]);
  chat.user = "What is 2 + 2?";
  chat.current_date = "2025-08-05";
  CHECK(render_for_completion(tok, make_chat(chat)) ==
        ids["hf_chat_template_style_prompt_with_date"]);
}

TEST_CASE("analysis is dropped once a final reply exists, unless disabled or between finals") {
  XSERV_REQUIRE_DATA(data);
  const Tokenizer& tok = tokenizer(data);
  auto ids = vector_ids(data);
  std::vector<Message> convo = {
      Message::user("What is 2 + 2?"),
      Message::assistant("User asks a simple question: \"What is 2 + 2?\" The answer: 4.",
                         "analysis"),
      Message::assistant("2 + 2 equals 4."), Message::user("What about 9 / 2?")};
  CHECK(render_for_completion(tok, convo, Role::Assistant, {.auto_drop_analysis = false}) ==
        ids["test_preserve_cot"]);
  auto dropped = render_for_completion(tok, convo);
  CHECK(dropped == ids["test_dropping_cot_by_default"]);
  CHECK(tok.decode(dropped).find("User asks a simple") == std::string::npos);

  std::vector<Message> finals = {
      Message::user("What is 2 + 2?"), Message::assistant("4"), Message::user("What is 3 + 5?"),
      Message::assistant("thinking 3+5", "analysis"), Message::assistant("8")};
  CHECK(render_conversation(tok, finals) == ids["test_keep_analysis_between_finals"]);
}

TEST_CASE("a parsed reply goes back into the conversation ending with <|end|>") {
  XSERV_REQUIRE_DATA(data);
  const Tokenizer& tok = tokenizer(data);
  auto ids = vector_ids(data);
  // The model's answer to test_simple_convo, as generated (ending with <|return|>).
  const auto& generated = ids["docs_format_md_streamable_parser_tokens"];
  REQUIRE(generated.back() == 200002);
  std::vector<Message> convo = {system_message(ReasoningEffort::Medium),
                                Message::user("What is 2 + 2?")};
  for (auto& m : parse_completion(tok, generated))
    convo.push_back(m);
  convo.push_back(Message::user("And 3 + 3?"));
  auto text = tok.decode(render_for_completion(tok, convo));
  CHECK(text.find("Simple arithmetic") == std::string::npos); // analysis dropped
  CHECK(text.find("<|channel|>final<|message|>2 + 2 = 4.<|end|><|start|>user<|message|>And 3 + "
                  "3?<|end|><|start|>assistant") != std::string::npos);
  CHECK(text.find("<|return|>") == std::string::npos);
}

TEST_CASE("streaming parser: analysis then final, channel per token, stop on <|return|>") {
  XSERV_REQUIRE_DATA(data);
  const Tokenizer& tok = tokenizer(data);
  auto ids = vector_ids(data);
  StreamParser parser(tok);
  std::string analysis, final_streamed;
  for (TokenId id : ids["docs_format_md_streamable_parser_tokens"]) {
    REQUIRE_FALSE(parser.stopped());
    std::string delta = parser.push(id);
    if (parser.state() == StreamParser::State::Content) {
      CHECK(parser.current_role() == Role::Assistant);
      (parser.current_channel() == "final" ? final_streamed : analysis) += delta;
    }
  }
  CHECK(parser.stopped());
  CHECK(final_streamed == "2 + 2 = 4.");
  CHECK(analysis == "User asks: \"What is 2 + 2?\" Simple arithmetic. Provide answer.");
  const auto& msgs = parser.messages();
  REQUIRE(msgs.size() == 2);
  CHECK(msgs[0].channel == "analysis");
  CHECK(msgs[1].channel == "final");
  CHECK(msgs[1].content == "2 + 2 = 4.");
  CHECK(final_text(msgs) == "2 + 2 = 4.");
  CHECK(is_stop_token(200002));
  CHECK(is_stop_token(200012));
  CHECK_FALSE(is_stop_token(200007));
}

TEST_CASE("parser: tool calls, recipients, content types and tool replies") {
  XSERV_REQUIRE_DATA(data);
  const Tokenizer& tok = tokenizer(data);
  auto ids = vector_ids(data);

  auto call = parse_completion(tok, ids["test_simple_tool_call"], Role::Assistant, true);
  REQUIRE(call.size() == 2);
  CHECK(call[0].channel == "analysis");
  CHECK(call[1].recipient == "lookup_weather");
  CHECK(call[1].channel == "analysis");
  CHECK(call[1].content_type == "code");
  CHECK(call[1].content == "{\"location\": \"Tokyo\"}");

  StreamParser parser(tok, Role::Assistant, true);
  for (TokenId id : ids["test_streamable_parser"]) {
    parser.push(id);
    if (id == 200012) {
      CHECK(parser.stopped()); // <|call|>: the caller runs the tool now
      CHECK(parser.messages().back().recipient == "browser.search");
    }
  }
  parser.finish();
  const auto& msgs = parser.messages();
  REQUIRE(msgs.size() == 3);
  CHECK(msgs[1].role == Role::Assistant);
  CHECK(msgs[1].channel == "commentary");
  CHECK(msgs[1].recipient == "browser.search");
  CHECK(msgs[1].content_type == "code");
  CHECK(msgs[2].role == Role::Tool);
  CHECK(msgs[2].name == "browser.search");
  CHECK(msgs[2].recipient == "assistant");
  CHECK(msgs[2].content == "{\"result\": \"https://openai.com/\"}");

  auto reply = parse_completion(tok, ids["test_tool_response_parsing"], std::nullopt, true);
  REQUIRE(reply.size() == 1);
  CHECK(reply[0].name == "browser.search");
  CHECK(reply[0].channel == "commentary");

  // Round trip: the rendered tool call parses back to the same header.
  Message m = with_header(Message::assistant("{\"x\": 1}", "commentary"), "functions.f",
                          "<|constrain|>json");
  auto rendered = render_conversation(tok, std::vector<Message>{m});
  auto back = parse_completion(tok, rendered, std::nullopt, true);
  REQUIRE(back.size() == 1);
  CHECK(back[0].recipient == "functions.f");
  CHECK(back[0].content_type == "<|constrain|>json");
  CHECK(back[0].content == "{\"x\": 1}");
}

TEST_CASE("parser: malformed sequences throw when strict and are recovered otherwise") {
  XSERV_REQUIRE_DATA(data);
  const Tokenizer& tok = tokenizer(data);
  auto text = tok.encode("Hello there");
  CHECK_THROWS_AS(parse_completion(tok, text, std::nullopt, true), xserv::Error);
  auto lenient = parse_completion(tok, text, std::nullopt, false);
  REQUIRE(lenient.size() == 1);
  CHECK(lenient[0].content == "Hello there");
  // Truncated generation: the open message is kept with what it has.
  auto ids = tok.encode("<|channel|>analysis<|message|>Let me think", AllowedSpecial::all());
  auto cut = parse_completion(tok, ids);
  REQUIRE(cut.size() == 1);
  CHECK(cut[0].channel == "analysis");
  CHECK(cut[0].content == "Let me think");
  CHECK(final_text(cut).empty());
  CHECK_THROWS_AS(parse_reasoning_effort("extreme"), xserv::Error);
  CHECK(parse_reasoning_effort("low") == ReasoningEffort::Low);
}

TEST_CASE("the developer message carries response formats after the instructions") {
  XSERV_REQUIRE_DATA(data);
  const Tokenizer& tok = tokenizer(data);
  DeveloperContent dev;
  dev.instructions = "Be brief.";
  dev.response_formats.push_back({"answer", "", R"({"type":"object"})"});
  dev.response_formats.push_back({"other", "the second", "{}"});
  const std::vector<Message> convo = {Message::make_developer(dev), Message::user("Hi")};
  CHECK(tok.decode(render_conversation(tok, convo)) ==
        "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Response Formats\n\n"
        "## answer\n\n{\"type\":\"object\"}\n\n## other\n\n// the second\n{}<|end|>"
        "<|start|>user<|message|>Hi<|end|>");
}
