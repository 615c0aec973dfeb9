// Tests of harmony tool sections (builtin browser/python, developer functions) against vectors.
#include <doctest/doctest.h>

#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "models/harmony.h"
#include "tests/models/harmony_vectors.h"
#include "tests/test_util.h"

namespace {

using namespace xserv::models;

std::map<std::string, std::vector<TokenId>> vector_ids(const std::filesystem::path& data) {
  return xserv::testing::harmony_vector_ids(data);
}

// The browser tool as openai/harmony describes it to gpt-oss.
ToolNamespace browser() {
  return {
      "browser",
      "Tool for browsing.\n"
      "The `cursor` appears in brackets before each browsing display: `[{cursor}]`.\n"
      "Cite information from the tool using the following format:\n"
      "`【{cursor}†L{line_start}(-L{line_end})?】`, for example: `【6†L9-L11】` or `【8†L3】`.\n"
      "Do not quote more than 10 words directly from the tool output.\n"
      "sources=web (default: web)",
      {{"search", "Searches for information related to `query` and displays `topn` results.",
        R"({"type": "object", "properties": {"query": {"type": "string"},
                "topn": {"type": "number", "default": 10}, "source": {"type": "string"}},
                "required": ["query"]})"},
       {"open",
        "Opens the link `id` from the page indicated by `cursor` starting at line number "
        "`loc`, showing `num_lines` lines.\n"
        "Valid link ids are displayed with the formatting: `【{id}†.*】`.\n"
        "If `cursor` is not provided, the most recent page is implied.\n"
        "If `id` is a string, it is treated as a fully qualified URL associated with "
        "`source`.\n"
        "If `loc` is not provided, the viewport will be positioned at the beginning of the "
        "document or centered on the most relevant passage, if available.\n"
        "Use this function without `id` to scroll to a new location of an opened page.",
        R"({"type": "object", "properties": {
                "id": {"type": ["number", "string"], "default": -1},
                "cursor": {"type": "number", "default": -1},
                "loc": {"type": "number", "default": -1},
                "num_lines": {"type": "number", "default": -1},
                "view_source": {"type": "boolean", "default": false},
                "source": {"type": "string"}}})"},
       {"find",
        "Finds exact matches of `pattern` in the current page, or the page given by "
        "`cursor`.",
        R"({"type": "object", "properties": {"pattern": {"type": "string"},
                "cursor": {"type": "number", "default": -1}}, "required": ["pattern"]})"}}};
}

ToolNamespace python() {
  return {"python",
          "Use this tool to execute Python code in your chain of thought. The code will not be "
          "shown to the user. This tool should be used for internal reasoning, but not for code "
          "that is intended to be visible to the user (e.g. when creating plots, tables, or "
          "files).\n\n"
          "When you send a message containing Python code to python, it will be executed in a "
          "stateful Jupyter notebook environment. python will respond with the output of the "
          "execution or time out after 120.0 seconds. The drive at '/mnt/data' can be used to "
          "save and persist user files. Internet access for this session is UNKNOWN. Depends on "
          "the cluster.",
          {}};
}

const char* kFormat =
    R"({"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"})";

ToolNamespace weather_functions() {
  return {"functions",
          "",
          {{"get_location", "Gets the location of the user.", ""},
           {"get_current_weather", "Gets the current weather in the provided location.",
            std::string(R"({"type": "object", "properties": {"location": {"type": "string",
                "description": "The city and state, e.g. San Francisco, CA"}, "format": )") +
                kFormat + R"(}, "required": ["location"]})"},
           {"get_multiple_weathers", "Gets the current weather in the provided list of locations.",
            std::string(R"({"type": "object", "properties": {"locations": {"type": "array",
                "items": {"type": "string"}, "description":
                "List of city and state, e.g. [\"San Francisco, CA\", \"New York, NY\"]"},
                "format": )") +
                kFormat + R"(}, "required": ["locations"]})"},
           {"kitchensink", "A function with various complex schemas.",
            R"({"description": "params object", "type": "object", "properties": {
                "string": {"type": "string", "title": "STRING", "description": "A string",
                           "examples": ["hello", "world"]},
                "string_nullable": {"type": "string", "nullable": true,
                                    "description": "A nullable string", "default": "the default"},
                "string_enum": {"type": "string", "enum": ["a", "b", "c"]},
                "oneof_string_or_number": {"oneOf": [
                    {"type": "string", "default": "default_string_in_oneof"},
                    {"type": "number", "description": "numbers can happen too"}],
                    "description": "a oneof", "default": 20}}})"}}};
}

ToolNamespace lookup_weather() {
  return {"functions",
          "",
          {{"lookup_weather",
            "Use this tool to lookup the weather in a given location. Call it with the parameter "
            "'location', can be any textual description of a location.",
            R"({"type": "object", "properties": {"location": {"type": "string"}},
                "required": ["location"]})"}}};
}

Message system_with_tools(ReasoningEffort effort, std::vector<ToolNamespace> tools) {
  SystemContent sys;
  sys.reasoning_effort = effort;
  sys.current_date = "2025-06-28";
  sys.tools = std::move(tools);
  return Message::make_system(std::move(sys));
}

} // namespace

TEST_CASE("tool sections: builtin browser/python and developer functions match harmony") {
  XSERV_REQUIRE_DATA(data);
  const Tokenizer tok = Tokenizer::load(data / "o200k_base.tiktoken");
  auto ids = vector_ids(data);
  using E = ReasoningEffort;
  const std::map<std::string, std::vector<Message>> prompts = {
      {"test_browser_tool_only", {system_with_tools(E::Medium, {browser()})}},
      // Namespaces render sorted by name whatever order they are given in.
      {"test_browser_and_python_tool", {system_with_tools(E::Medium, {python(), browser()})}},
      {"test_browser_and_function_tool",
       {system_with_tools(E::Medium, {browser()}),
        Message::make_developer({"", {lookup_weather()}})}},
      {"test_render_functions_with_parameters",
       {system_with_tools(E::High, {}),
        Message::make_developer({"Always respond in riddles", {weather_functions()}}),
        Message::user("What is the weather like in SF?")}},
  };
  for (const auto& [name, messages] : prompts) {
    INFO("vector: " << name);
    REQUIRE(ids.count(name));
    auto got = render_for_completion(tok, messages);
    INFO("rendered:\n" << tok.decode(got));
    CHECK(got == ids[name]);
  }
}

TEST_CASE("tool parameters that are not JSON are reported with the tool's name") {
  ToolNamespace ns{"functions", "", {{"broken", "A tool.", "{not json"}}};
  CHECK_THROWS_WITH(render_tools_section(std::vector<ToolNamespace>{ns}),
                    doctest::Contains("functions.broken"));
  ToolNamespace ok{"functions", "", {{"f", "Does f.", ""}}};
  CHECK(render_tools_section(std::vector<ToolNamespace>{ok}) ==
        "# Tools\n\n## functions\n\nnamespace functions {\n\n// Does f.\ntype f = () => any;\n\n"
        "} // namespace functions");
}
