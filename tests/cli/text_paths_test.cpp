// The text paths of the real binary: `xserv tokenize` against the library's tokenizer, and
// `xserv run --raw / --prompt / --show-reasoning` against the ids `run --prompt-ids` generates
// for the same prompt, decoded and parsed here (the random tiny model, greedy, on the CPU).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "models/harmony.h"
#include "models/tokenizer.h"
#include "tests/run_xserv.h"
#include "tests/test_util.h"

using xserv::testing::run_xserv;
using xserv::testing::RunResult;
namespace fs = std::filesystem;
namespace models = xserv::models;

namespace {

const fs::path& scratch() {
  static const xserv::testing::TempDir dir("text_paths"); // removed when the binary exits
  return dir.path;
}

/// The tiny random-weight model with the real vocabulary, synthesized once per run.
const fs::path& tiny_model() {
  static const fs::path model = [] {
    const fs::path dir = scratch() / "tiny";
    const RunResult r = run_xserv(
        "synth --config " + (xserv::testing::source_dir() / "examples/tiny/config.json").string() +
        " -o " + dir.string() + " --seed 5");
    INFO(r.out);
    REQUIRE(r.code == 0);
    return dir;
  }();
  return model;
}

std::string join(const std::vector<models::TokenId>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i)
      s += ',';
    s += std::to_string(ids[i]);
  }
  return s;
}

std::vector<models::TokenId> split_ids(const std::string& line) {
  std::vector<models::TokenId> ids;
  size_t at = 0;
  while (at < line.size() && line[at] != '\n') {
    size_t end = line.find_first_of(",\n", at);
    ids.push_back(std::stoi(line.substr(at, end - at)));
    at = end == std::string::npos ? line.size() : end + (line[end] == ',' ? 1 : 0);
  }
  return ids;
}

/// `xserv run MODEL` on the CPU, greedy, 12 tokens; stdout only (stats go to stderr).
RunResult run_cpu(const fs::path& tokenizer, const std::string& args) {
  return run_xserv("run " + tiny_model().string() + " --backend cpu --max-tokens 12 --tokenizer " +
                       tokenizer.string() + " " + args,
                   "", /*split_stderr=*/true);
}

} // namespace

TEST_CASE("xserv tokenize prints the library's ids and --decode inverts them") {
  XSERV_REQUIRE_DATA(data);
  const fs::path ranks = data / "o200k_base.tiktoken";
  const models::Tokenizer tok = models::Tokenizer::load(ranks);
  const std::string text = "Hello world, caf\xC3\xA9 42!";
  const RunResult r = run_xserv("tokenize " + ranks.string() + " '" + text + "'", "", true);
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto ids = tok.encode(text);
  REQUIRE(ids.size() > 3);
  CHECK(r.out == join(ids) + "\n");
  const RunResult back = run_xserv("tokenize " + ranks.string() + " --decode " + join(ids));
  CHECK(back.code == 0);
  CHECK(back.out == text + "\n");
  // Special tokens only with --allow-special: otherwise "<|start|>" is plain text.
  const RunResult plain = run_xserv("tokenize " + ranks.string() + " '<|start|>'", "", true);
  const RunResult special =
      run_xserv("tokenize " + ranks.string() + " '<|start|>' --allow-special", "", true);
  CHECK(special.out == std::to_string(tok.special_id("<|start|>")) + "\n");
  CHECK(plain.out != special.out);
  CHECK(run_xserv("tokenize " + ranks.string() + " --decode 1,x").code == 2);
}

TEST_CASE("xserv run --raw streams the decoded text of the ids --prompt-ids generates") {
  XSERV_REQUIRE_DATA(data);
  const fs::path ranks = data / "o200k_base.tiktoken";
  const models::Tokenizer tok = models::Tokenizer::load(ranks);
  const std::string prompt = "Once upon a time";
  const RunResult ids_run = run_cpu(ranks, "--prompt-ids " + join(tok.encode(prompt)));
  INFO(ids_run.err);
  REQUIRE(ids_run.code == 0);
  const std::vector<models::TokenId> generated = split_ids(ids_run.out);
  REQUIRE(generated.size() == 12);
  const RunResult raw = run_cpu(ranks, "--raw --prompt '" + prompt + "'");
  INFO(raw.err);
  REQUIRE(raw.code == 0);
  CHECK(raw.out == tok.decode(generated) + "\n");
  // --raw feeds the plain encoding, no harmony around it.
  CHECK(raw.err.find(fmt::format("prompt {} tokens in", tok.encode(prompt).size())) !=
        std::string::npos);
}

TEST_CASE("xserv run --prompt renders harmony and shows what the parser reads as final") {
  XSERV_REQUIRE_DATA(data);
  const fs::path ranks = data / "o200k_base.tiktoken";
  const models::Tokenizer tok = models::Tokenizer::load(ranks);
  // The conversation run --prompt renders (reasoning low, no date), generated as ids.
  models::ChatPrompt chat;
  chat.user = "What is 17 * 3?";
  chat.effort = models::ReasoningEffort::Low;
  const auto prompt_ids = models::render_for_completion(tok, models::make_chat(chat));
  const RunResult ids_run = run_cpu(ranks, "--prompt-ids " + join(prompt_ids));
  INFO(ids_run.err);
  REQUIRE(ids_run.code == 0);
  const std::vector<models::TokenId> generated = split_ids(ids_run.out);
  REQUIRE(!generated.empty());
  // What the parser streams of them: the final channel, and with --show-reasoning every channel.
  models::StreamParser parser(tok);
  std::string final_text, all_text, last;
  for (models::TokenId id : generated) {
    const std::string d = parser.push(id);
    const std::string& ch = parser.current_channel();
    if (ch == "final")
      final_text += d;
    if (!ch.empty()) {
      if (ch != last)
        all_text += std::string(last.empty() ? "" : "\n") + "[" + ch + "] ";
      last = ch;
      all_text += d;
    }
    if (parser.stopped())
      break;
  }
  const RunResult text = run_cpu(ranks, "--prompt 'What is 17 * 3?' --reasoning low");
  INFO(text.err);
  REQUIRE(text.code == 0);
  CHECK(text.out == final_text + "\n");
  const RunResult reasoning =
      run_cpu(ranks, "--prompt 'What is 17 * 3?' --reasoning low --show-reasoning");
  REQUIRE(reasoning.code == 0);
  CHECK(reasoning.out == all_text + "\n");
  // The prompt run --prompt fed the model is the harmony rendering, token for token in number
  // (the stats line on stderr; --prompt-ids above used exactly those ids).
  CHECK(text.err.find(fmt::format("prompt {} tokens in", prompt_ids.size())) != std::string::npos);
}

TEST_CASE("xserv run --json-schema / --regex / --grammar: the random model's text follows them") {
  XSERV_REQUIRE_DATA(data);
  const fs::path ranks = data / "o200k_base.tiktoken";
  auto run = [&](const std::string& args) {
    return run_xserv("run " + tiny_model().string() + " --backend cpu --tokenizer " +
                         ranks.string() + " --raw --prompt x --max-tokens 80 " + args,
                     "", /*split_stderr=*/true);
  };
  auto write = [](const fs::path& p, const std::string& text) { std::ofstream(p) << text; };
  const fs::path schema = scratch() / "schema.json", grammar = scratch() / "grammar.ebnf";
  write(schema, R"({"type": "object", "properties": {
      "n": {"type": "integer", "minimum": 0, "maximum": 99}, "c": {"enum": ["ab", "cd"]}},
      "required": ["n", "c"]})");
  write(grammar, "root ::= \"<\" [a-c]{1,3} \">\"");
  const RunResult json = run("--json-schema " + schema.string());
  INFO(json.err);
  REQUIRE(json.code == 0);
  const auto v = nlohmann::json::parse(json.out); // the whole text, the stop id left out
  CHECK(v["n"].get<int>() >= 0);
  CHECK(v["n"].get<int>() <= 99);
  CHECK((v["c"] == "ab" || v["c"] == "cd"));
  const RunResult re = run("--temperature 1 --seed 3 --regex '[0-9]{2}-[xy]'");
  REQUIRE(re.code == 0);
  CHECK_MESSAGE(std::regex_match(re.out, std::regex("[0-9]{2}-[xy]\n")), re.out);
  const RunResult g = run("--grammar " + grammar.string());
  REQUIRE(g.code == 0);
  CHECK_MESSAGE(std::regex_match(g.out, std::regex("<[a-c]{1,3}>\n")), g.out);
  // A keyword that cannot be enforced is bad input (exit 1) naming the flag; two constraints,
  // or one with --prompt-ids, are usage mistakes (exit 2).
  write(schema, R"({"type": "array", "uniqueItems": true})");
  const RunResult bad = run("--json-schema " + schema.string());
  CHECK(bad.code == 1);
  CHECK_MESSAGE(bad.err.find("--json-schema: #/uniqueItems") != std::string::npos, bad.err);
  CHECK(run("--json --regex a").code == 2);
  CHECK(run_xserv("run " + tiny_model().string() + " --backend cpu --prompt-ids 1,2 --json")
            .code == 2);
}

TEST_CASE("xserv bench --requests --regex --itl-target: every request of the serving run is "
          "constrained, and the engine takes an inter-token latency target") {
  XSERV_REQUIRE_DATA(data);
  const std::string common = "bench " + tiny_model().string() + " --backend cpu --tokenizer " +
                             (data / "o200k_base.tiktoken").string() +
                             " --requests 6 --concurrency 3 --input-len 5 --output-len 9 -o json ";
  const RunResult r =
      run_xserv(common + "--regex '[a-z]+' --itl-target 5", "", /*split_stderr=*/true);
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto doc = nlohmann::json::parse(r.out);
  CHECK(doc.dump().find("every output follows --regex [a-z]+; masks picked on the host") !=
        std::string::npos);
  CHECK(doc.dump().find("\"failed\":0") != std::string::npos);
  CHECK(doc.dump().find("\"inter-token latency target (ms)\":\"5\"") != std::string::npos);
  CHECK(run_xserv(common + "--itl-target -3").code == 2);
  // A factor with a tail of steps allowed past it.
  const RunResult tail = run_xserv(common + "--itl-factor 2 --itl-tail 0.01", "", true);
  INFO(tail.err);
  REQUIRE(tail.code == 0);
  const auto tdoc = nlohmann::json::parse(tail.out);
  CHECK(tdoc.dump().find("\"failed\":0") != std::string::npos);
  CHECK(tdoc.dump().find("\"steps past that target allowed (share of decodes)\":\"0.01\"") !=
        std::string::npos);
  CHECK(run_xserv(common + "--itl-factor 2 --itl-tail 0.7").code == 2);
  // Over HTTP the requests carry their own response_format: a usage mistake.
  CHECK(run_xserv(common + "--endpoint http://127.0.0.1:9 --regex a").code == 2);
}

TEST_CASE("xserv run and chat --logit-bias and the penalties: a forced token, ranges named by flag") {
  const std::string run = "run " + tiny_model().string() + " --backend cpu --prompt-ids 1,2,3 " +
                          "--max-tokens 4 ";
  const RunResult forced = run_xserv(run + "--logit-bias 42:100,7:-5", "", /*split_stderr=*/true);
  INFO(forced.err);
  REQUIRE(forced.code == 0);
  CHECK(forced.out == "42,42,42,42\n");
  // +3 makes 42 this model's first pick; once generated, the penalties (2, and 2 a use) leave
  // it 1 below where it started, and it does not come again.
  const RunResult once = run_xserv(
      run + "--logit-bias 42:3 --presence-penalty 2 --frequency-penalty 2", "", true);
  REQUIRE(once.code == 0);
  CHECK(once.out.rfind("42,", 0) == 0);
  CHECK(once.out.find(",42") == std::string::npos);
  const RunResult bad = run_xserv(run + "--presence-penalty 3", "", true);
  CHECK(bad.code == 2);
  CHECK(bad.err.find("--presence-penalty 3 is outside [-2, 2]") != std::string::npos);
  CHECK(run_xserv(run + "--logit-bias 42", "", true).code == 2);
  // chat takes them too.
  XSERV_REQUIRE_DATA(data);
  const std::string chat = "chat " + tiny_model().string() + " --backend cpu --tokenizer " +
                           (data / "o200k_base.tiktoken").string() + " --max-tokens 4 ";
  const RunResult chat_bad = run_xserv(chat + "--repetition-penalty 11", "hello\n", true);
  CHECK(chat_bad.code == 2);
  CHECK(chat_bad.err.find("--repetition-penalty 11 is outside (0, 10]") != std::string::npos);
  CHECK(run_xserv(chat + "--logit-bias 42:100", "hello\n", true).code == 0);
}
