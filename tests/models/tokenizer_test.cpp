// Tests of the o200k_harmony tokenizer against tiktoken's vectors, with both loaders.
#include <doctest/doctest.h>

#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "models/tokenizer.h"
#include "tests/test_util.h"

namespace {

using xserv::models::AllowedSpecial;
using xserv::models::StreamDecoder;
using xserv::models::TokenId;
using xserv::models::Tokenizer;

struct Vector {
  std::string name, text;
  std::vector<TokenId> ids;
};

std::vector<Vector> read_vectors(const std::filesystem::path& file) {
  std::ifstream in(file);
  REQUIRE_MESSAGE(in, "cannot open " << file);
  std::vector<Vector> out;
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    out.push_back({j.value("name", std::string()), j["text"].get<std::string>(),
                   j["ids"].get<std::vector<TokenId>>()});
  }
  return out;
}

// Loading tokenizer.json takes about a second; share one of each kind across test cases.
const Tokenizer& tiktoken_tok(const std::filesystem::path& data) {
  static const Tokenizer tok = Tokenizer::from_tiktoken(data / "o200k_base.tiktoken");
  return tok;
}
const Tokenizer& hf_tok(const std::filesystem::path& data) {
  static const Tokenizer tok = Tokenizer::load(data / "gpt-oss-20b");
  return tok;
}

} // namespace

TEST_CASE("o200k_base vectors encode exactly with both loaders, and decode back") {
  XSERV_REQUIRE_DATA(data);
  auto vectors = read_vectors(data / "o200k_base_vectors.jsonl");
  CHECK(vectors.size() == 263);
  for (const Tokenizer* tok : {&tiktoken_tok(data), &hf_tok(data)}) {
    for (const auto& v : vectors) {
      INFO("text: " << v.text);
      CHECK(tok->encode(v.text) == v.ids);
      CHECK(tok->decode(v.ids) == v.text);
    }
  }
}

TEST_CASE("both loaders agree on every id, name and special") {
  XSERV_REQUIRE_DATA(data);
  const Tokenizer& a = tiktoken_tok(data);
  const Tokenizer& b = hf_tok(data);
  REQUIRE(a.vocab_size() == 201088);
  REQUIRE(b.vocab_size() == 201088);
  CHECK(a.num_ordinary() == 199998);
  CHECK(b.num_ordinary() == 199998);
  size_t mismatches = 0;
  for (TokenId id = 0; id < a.vocab_size(); ++id)
    mismatches += a.id_to_token(id) != b.id_to_token(id) || a.is_special(id) != b.is_special(id);
  CHECK(mismatches == 0);
}

TEST_CASE("harmony render vectors: text encoded with all specials gives their ids") {
  XSERV_REQUIRE_DATA(data);
  auto vectors = read_vectors(data / "harmony_render_vectors.jsonl");
  CHECK(vectors.size() == 27);
  for (const Tokenizer* tok : {&tiktoken_tok(data), &hf_tok(data)}) {
    for (const auto& v : vectors) {
      INFO("vector: " << v.name);
      CHECK(tok->encode(v.text, AllowedSpecial::all()) == v.ids);
      CHECK(tok->decode(v.ids) == v.text);
    }
  }
}

TEST_CASE("special tokens are recognised only when allowed") {
  XSERV_REQUIRE_DATA(data);
  const Tokenizer& tok = tiktoken_tok(data);
  const std::string text = "<|start|>user<|message|>hi<|end|>";
  auto all = tok.encode(text, AllowedSpecial::all());
  CHECK(all == std::vector<TokenId>{200006, 1428, 200008, 3686, 200007});
  auto none = tok.encode(text);
  CHECK(none.size() > 5);
  for (TokenId id : none)
    CHECK_FALSE(tok.is_special(id));
  CHECK(tok.decode(none) == text);
  auto some = tok.encode(text, AllowedSpecial{"<|end|>"});
  CHECK(some.back() == 200007);
  CHECK(std::count_if(some.begin(), some.end(), [&](TokenId i) { return tok.is_special(i); }) == 1);
  // A special that starts inside a non-special "<|...|>" candidate is still found.
  CHECK(tok.encode("<|<|end|>", AllowedSpecial::all()).back() == 200007);
}

TEST_CASE("special token names and ids") {
  XSERV_REQUIRE_DATA(data);
  const Tokenizer& tok = hf_tok(data);
  const std::map<std::string, TokenId> expected = {
      {"<|startoftext|>", 199998}, {"<|endoftext|>", 199999}, {"<|return|>", 200002},
      {"<|constrain|>", 200003},   {"<|channel|>", 200005},   {"<|start|>", 200006},
      {"<|end|>", 200007},         {"<|message|>", 200008},   {"<|call|>", 200012}};
  for (const auto& [name, id] : expected) {
    CHECK(tok.special_id(name) == id);
    CHECK(tok.token_to_id(name) == id);
    CHECK(tok.id_to_token(id) == name);
    CHECK(tok.is_special(id));
  }
  CHECK(tok.id_to_token(200004) == "<|reserved_200004|>");
  CHECK(tok.id_to_token(201087) == "<|reserved_201087|>");
  CHECK(tok.token_to_id("<|reserved_200018|>") == 200018u);
  CHECK(tok.token_to_id(" hello") == 40617u);
  CHECK_FALSE(tok.token_to_id("<|nonsense|>").has_value());
  CHECK_FALSE(tok.is_special(0));
  CHECK_THROWS_AS(tok.id_to_token(201088), xserv::Error);
  CHECK_THROWS_AS(tok.special_id("<|nonsense|>"), xserv::Error);
}

TEST_CASE("streaming decode holds back a character split across tokens") {
  XSERV_REQUIRE_DATA(data);
  const Tokenizer& tok = tiktoken_tok(data);
  const std::string text = "日本語 😀 naïve 👨\u200d👩\u200d👧 ok";
  auto ids = tok.encode(text);
  StreamDecoder dec(tok);
  std::string streamed;
  bool held_back = false;
  for (TokenId id : ids) {
    std::string piece = dec.push(id);
    held_back |= piece.size() != tok.id_to_token(id).size();
    // Every emitted piece ends on a character boundary.
    if (!piece.empty())
      CHECK((static_cast<unsigned char>(piece.back()) & 0xC0) != 0xC0);
    streamed += piece;
  }
  streamed += dec.flush();
  CHECK(held_back); // the emoji are split across byte tokens
  CHECK(streamed == text);

  // "😀" as its four single-byte tokens: nothing comes out until the last one.
  StreamDecoder bytes(tok);
  std::string emoji = "😀";
  for (size_t i = 0; i < 3; ++i)
    CHECK(bytes.push(*tok.token_to_id(emoji.substr(i, 1))) == "");
  CHECK(bytes.push(*tok.token_to_id(emoji.substr(3, 1))) == emoji);
  CHECK(bytes.push(*tok.token_to_id("\xF0")) == "");
  CHECK(bytes.flush() == "\xF0");
}

TEST_CASE("bad input gives a clear error") {
  CHECK_THROWS_WITH_AS(Tokenizer::load("/nonexistent/tokenizer.json"),
                       doctest::Contains("/nonexistent/tokenizer.json"), xserv::Error);
  xserv::testing::TempDir tmp("tokenizer");
  const auto& dir = tmp.path;
  {
    std::ofstream(dir / "bad.json") << "{\"model\": {\"type\": \"BPE\", \"vocab\": [1]}}";
    std::ofstream(dir / "bad.tiktoken") << "IQ== 0\nnot-base64! x\n";
  }
  CHECK_THROWS_WITH_AS(Tokenizer::load(dir / "bad.json"), doctest::Contains("bad.json"),
                       xserv::Error);
  CHECK_THROWS_WITH_AS(Tokenizer::load(dir / "bad.tiktoken"), doctest::Contains("bad.tiktoken:2"),
                       xserv::Error);
  std::ofstream(dir / "cut.json") << "{\"model\": ";
  const std::string cut = (dir / "cut.json").string() +
                          ": not valid JSON: parse error at line 1, column 11: syntax error";
  CHECK_THROWS_WITH_AS(Tokenizer::load(dir / "cut.json"), doctest::Contains(cut.c_str()),
                       xserv::Error);
}

// Apart from the case above: a skip marks the whole ctest entry skipped, failures before it too.
TEST_CASE("text that is not UTF-8 is refused") {
  XSERV_REQUIRE_DATA(data);
  CHECK_THROWS_AS(tiktoken_tok(data).encode("ab\xFF"), xserv::Error);
}

TEST_CASE("long pre-tokens merge like tiktoken, a 200 KB one round-trips") {
  XSERV_REQUIRE_DATA(data);
  const Tokenizer& tok = tiktoken_tok(data);
  // Expected ids from tiktoken 0.14 (Rust) on these strings; all are longer than the length at
  // which the encoder switches from the scanning merge to the heap merge.
  CHECK(tok.encode(std::string(65, 'a')) ==
        std::vector<TokenId>{117525, 117525, 117525, 117525, 117525, 117525, 117525, 117525, 64});
  CHECK(tok.encode(std::string(70, '=')) == std::vector<TokenId>{17686, 89250});
  std::string abab;
  for (int i = 0; i < 40; ++i)
    abab += "ab";
  CHECK(tok.encode(abab) == std::vector<TokenId>(20, 68822));
  std::string emoji;
  for (int i = 0; i < 20; ++i)
    emoji += "😀";
  CHECK(tok.encode(emoji) == std::vector<TokenId>(20, 84083));
  // A hostile prompt (one 200 KB pre-token) goes through the heap merge intact; its speed is
  // measured by tests/bench/tokenizer_bench.cpp, not asserted here.
  for (char c : {' ', 'a', '='}) {
    std::string big(200000, c);
    CHECK(tok.decode(tok.encode(big)) == big);
  }
}

TEST_CASE("a tiktoken file that is not o200k_base (cut short, or a rank edited) is refused") {
  XSERV_REQUIRE_DATA(data);
  xserv::testing::TempDir dir;
  std::ifstream in(data / "o200k_base.tiktoken");
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);)
    lines.push_back(l);
  REQUIRE(lines.size() == 199998);
  auto write = [&](const std::filesystem::path& p, size_t n) {
    std::ofstream out(p);
    for (size_t i = 0; i < n; ++i)
      out << lines[i] << "\n";
  };
  write(dir.path / "short.tiktoken", 1000);
  const std::string want =
      (dir.path / "short.tiktoken").string() +
      ": 1000 ranks, but o200k_base has 199998: a truncated or other vocabulary";
  CHECK_THROWS_WITH_AS(Tokenizer::load(dir.path / "short.tiktoken"),
                       doctest::Contains(want.c_str()), xserv::Error);
  // Rank 1000 given another token's bytes ("IQ==" is "!", rank 0's): same count, other digest.
  lines[1000] = "IQ== 1000";
  write(dir.path / "edited.tiktoken", lines.size());
  CHECK_THROWS_WITH_AS(Tokenizer::load(dir.path / "edited.tiktoken"),
                       doctest::Contains("not o200k_base's d987f19f1f0fd7d3: an edited"),
                       xserv::Error);
}
