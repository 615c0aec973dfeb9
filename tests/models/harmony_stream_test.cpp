// The streaming harmony parser at its edges: a header cut before <|message|>, a UTF-8 character
// split across stream deltas, an empty final message.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "base/error.h"
#include "models/harmony.h"
#include "tests/test_util.h"

namespace {

using namespace xserv::models;

const Tokenizer& tokenizer(const std::filesystem::path& data) {
  static const Tokenizer tok = Tokenizer::load(data / "o200k_base.tiktoken");
  return tok;
}

std::vector<TokenId> special(const Tokenizer& tok, const std::string& text) {
  return tok.encode(text, AllowedSpecial::all());
}

/// True when `s` is well-formed UTF-8 (no truncated or stray continuation bytes).
bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80           ? 1
                     : (c >> 5) == 0x6  ? 2
                     : (c >> 4) == 0xE  ? 3
                     : (c >> 3) == 0x1E ? 4
                                        : 0;
    if (n == 0 || i + n > s.size())
      return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2)
        return false;
    i += n;
  }
  return true;
}

} // namespace

TEST_CASE("harmony stream: a header cut before <|message|> ends the message, strict refuses") {
  XSERV_REQUIRE_DATA(data);
  const Tokenizer& tok = tokenizer(data);
  // The stream stops inside the header (no <|message|> yet).
  const auto cut = special(tok, "<|channel|>final");
  StreamParser lenient(tok);
  for (TokenId id : cut)
    CHECK(lenient.push(id).empty()); // header ids add no content
  CHECK(lenient.state() == StreamParser::State::Header);
  CHECK(lenient.messages().empty());
  lenient.finish();
  REQUIRE(lenient.messages().size() == 1);
  CHECK(lenient.messages()[0].channel == "final");
  CHECK(lenient.messages()[0].content.empty());
  CHECK(lenient.messages()[0].role == Role::Assistant);
  StreamParser strict(tok, Role::Assistant, true);
  for (TokenId id : cut)
    strict.push(id);
  CHECK_THROWS_WITH_AS(strict.finish(), doctest::Contains("stream ended inside the header"),
                       xserv::Error);
  // <|end|> inside the header: completed empty when lenient, refused when strict.
  const auto ended = special(tok, "<|channel|>analysis<|end|>");
  auto msgs = parse_completion(tok, ended);
  REQUIRE(msgs.size() == 1);
  CHECK(msgs[0].channel == "analysis");
  CHECK(msgs[0].content.empty());
  CHECK_THROWS_WITH_AS(parse_completion(tok, ended, Role::Assistant, true),
                       doctest::Contains("message ended inside its header"), xserv::Error);
}

TEST_CASE("harmony stream: a UTF-8 character split over several ids streams whole") {
  XSERV_REQUIRE_DATA(data);
  const Tokenizer& tok = tokenizer(data);
  const std::string emoji = "\xF0\x9F\x98\x80", e_acute = "\xC3\xA9"; // U+1F600, U+00E9
  std::vector<TokenId> ids = special(tok, "<|channel|>final<|message|>");
  const std::string text = "a" + emoji + "b" + e_acute;
  // One id per byte, so every multi-byte character is split across deltas.
  for (char c : text) {
    const auto id = tok.token_to_id(std::string(1, c));
    REQUIRE(id.has_value());
    ids.push_back(*id);
  }
  ids.push_back(tok.special_id("<|return|>"));
  StreamParser parser(tok);
  std::vector<std::string> deltas;
  for (TokenId id : ids)
    deltas.push_back(parser.push(id));
  std::string streamed;
  for (const std::string& d : deltas) {
    CHECK(valid_utf8(d)); // never half a character
    streamed += d;
  }
  CHECK(streamed == text);
  // The emoji's first three bytes add nothing; its fourth adds all of it.
  const size_t head = ids.size() - text.size() - 1, at = head + 1; // deltas[at]: emoji byte 1
  CHECK(deltas[at].empty());
  CHECK(deltas[at + 1].empty());
  CHECK(deltas[at + 2].empty());
  CHECK(deltas[at + 3] == emoji);
  CHECK(parser.stopped());
  REQUIRE(parser.messages().size() == 1);
  CHECK(parser.messages()[0].content == text);
  CHECK(final_text(parser.messages()) == text);
}

TEST_CASE("harmony stream: an empty final message is a final with no text") {
  XSERV_REQUIRE_DATA(data);
  const Tokenizer& tok = tokenizer(data);
  const auto ids =
      special(tok, "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final"
                   "<|message|><|return|>");
  StreamParser parser(tok);
  std::string streamed;
  for (TokenId id : ids) {
    REQUIRE_FALSE(parser.stopped());
    const std::string d = parser.push(id);
    if (parser.current_channel() == "final")
      streamed += d;
  }
  CHECK(parser.stopped());
  CHECK(streamed.empty());
  const auto& msgs = parser.messages();
  REQUIRE(msgs.size() == 2);
  CHECK(msgs[0].channel == "analysis");
  CHECK(msgs[0].content == "Think.");
  CHECK(msgs[1].channel == "final");
  CHECK(msgs[1].content.empty());
  // The analysis is not taken for the answer.
  CHECK(final_text(msgs).empty());
}
