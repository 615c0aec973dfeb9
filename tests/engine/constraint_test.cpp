// Structured output (engine/constraint.h): token masks against a brute force over the whole
// o200k vocabulary with an independent oracle (PCRE2's partial matching of a regular expression
// that spells the same language), schema keywords refused by name, forks, and the harmony
// binding (free headers and analysis, a bound final message, a bound strict tool call).
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/constraint.h"
#include "models/harmony.h"
#include "tests/test_util.h"

using namespace xserv;
using engine::ConstraintRequest;
using engine::ConstraintState;
using engine::GrammarSpec;

namespace {

constexpr int64_t kVocab = 201088;
const std::vector<int32_t> kEos = {200002, 199999, 200012};

const models::Tokenizer& tokenizer() {
  static const models::Tokenizer tok =
      models::Tokenizer::load(*testing::data_dir() / "o200k_base.tiktoken");
  return tok;
}

const engine::ConstraintCompiler& compiler() {
  static const engine::ConstraintCompiler c(tokenizer(), kVocab, kEos);
  return c;
}

/// An anchored PCRE2 pattern: whether a byte string is a whole match, or a prefix of one.
class Oracle {
public:
  explicit Oracle(const std::string& pattern) {
    int err = 0;
    PCRE2_SIZE off = 0;
    const std::string anchored = "(?:" + pattern + ")\\z";
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(anchored.c_str()), anchored.size(),
                          PCRE2_ANCHORED, &err, &off, nullptr);
    REQUIRE_MESSAGE(code_ != nullptr, "oracle pattern " << pattern << " error " << err);
    data_ = pcre2_match_data_create_from_pattern(code_, nullptr);
  }
  ~Oracle() {
    pcre2_match_data_free(data_);
    pcre2_code_free(code_);
  }
  Oracle(const Oracle&) = delete;
  Oracle& operator=(const Oracle&) = delete;
  bool whole(const std::string& s) const { return run(s, 0) >= 0; }
  bool prefix(const std::string& s) const {
    const int rc = run(s, PCRE2_PARTIAL_HARD);
    return rc >= 0 || rc == PCRE2_ERROR_PARTIAL;
  }

private:
  int run(const std::string& s, uint32_t opts) const {
    return pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, opts, data_,
                       nullptr);
  }
  pcre2_code* code_ = nullptr;
  pcre2_match_data* data_ = nullptr;
};

bool allowed(const std::vector<uint32_t>& words, int64_t t) {
  return (words[size_t(t / 32)] >> (t % 32)) & 1u;
}

/// Walks a whole-output constraint for `steps` tokens (or to its stop token), drawing each next
/// token at random among those the mask allows, and compares every mask with the oracle's
/// brute force over the vocabulary: an ordinary token allowed iff output + its bytes is a
/// prefix of a match; a stop id iff the output is a whole match; no other special ever.
int walk(const GrammarSpec& spec, const std::string& oracle_pattern, uint64_t seed, int steps) {
  CAPTURE(spec.text);
  const Oracle oracle(oracle_pattern);
  ConstraintRequest req;
  req.output = spec;
  ConstraintState state(compiler().compile(req));
  const models::Tokenizer& tok = tokenizer();
  std::mt19937_64 rng(seed);
  std::string out;
  std::vector<uint32_t> mask(ConstraintState::mask_words(kVocab));
  for (int step = 0; step < steps; ++step) {
    CAPTURE(out);
    std::fill(mask.begin(), mask.end(), 0u);
    REQUIRE(state.bound());
    state.fill_mask(mask);
    std::vector<int32_t> allowed_ids;
    int mismatches = 0;
    for (int64_t t = 0; t < kVocab; ++t) {
      bool want;
      if (t >= int64_t(tok.vocab_size()) || tok.is_special(models::TokenId(t)))
        want = std::count(kEos.begin(), kEos.end(), int32_t(t)) && oracle.whole(out);
      else
        want = oracle.prefix(out + std::string(tok.id_to_token(models::TokenId(t))));
      const bool got = allowed(mask, t);
      if (got != want && ++mismatches <= 3)
        FAIL_CHECK("token " << t << " '" << (t < 199998 ? tok.id_to_token(models::TokenId(t)) : "")
                            << "': mask " << got << ", oracle " << want);
      if (got)
        allowed_ids.push_back(int32_t(t));
    }
    REQUIRE(mismatches == 0);
    REQUIRE(!allowed_ids.empty());
    const int32_t pick = allowed_ids[rng() % allowed_ids.size()];
    REQUIRE(state.accept(pick));
    if (std::count(kEos.begin(), kEos.end(), pick)) {
      CHECK(oracle.whole(out));
      CHECK(!state.bound()); // ended: nothing binds any more
      return step + 1;
    }
    out += tok.id_to_token(models::TokenId(pick));
  }
  return steps;
}

} // namespace

TEST_CASE("constraint masks equal a brute force over the vocabulary (PCRE2 oracle)") {
  XSERV_REQUIRE_DATA(data);
  using K = GrammarSpec::Kind;
  // Regular expressions, and JSON schemas with the regular expression of their compact form
  // (separators ", " and ": ", no other whitespace).
  const struct {
    GrammarSpec spec;
    std::string oracle;
  } cases[] = {
      {{K::Regex, "[0-9]{3}-[a-z]{2,4}", "regex"}, "[0-9]{3}-[a-z]{2,4}"},
      {{K::Regex, "(yes|no|maybe)( really)?", "regex"}, "(yes|no|maybe)( really)?"},
      {{K::JsonSchema, R"({"type": "object", "properties": {"k": {"enum": ["ab", "c"]}},
                           "required": ["k"]})",
        "json_schema"},
       R"(\{"k": ("ab"|"c")\})"},
      {{K::JsonSchema, R"({"type": "object", "properties": {"n": {"type": "boolean"},
                           "m": {"const": 7}}, "required": ["n", "m"]})",
        "json_schema"},
       R"(\{"n": (true|false), "m": 7\})"},
      {{K::JsonSchema, R"({"type": "array", "items": {"type": "boolean"}, "minItems": 1,
                           "maxItems": 3})",
        "json_schema"},
       R"(\[(true|false)(, (true|false)){0,2}\])"},
  };
  uint64_t seed = 1;
  int checked = 0;
  for (const auto& c : cases)
    for (int r = 0; r < 3; ++r) // three random walks each, every step checked
      checked += walk(c.spec, c.oracle, ++seed, 40);
  MESSAGE(checked << " masks checked against the oracle, " << kVocab << " tokens each");
  CHECK(checked >= 60);
}

TEST_CASE("constraint: a length-bounded JSON string admits no raw control character") {
  // JSON strings carry U+0000..U+001F only escaped (RFC 8259); a bounded string is its own
  // grammar rule in xgrammar (scripts/xgrammar-0.2.8-string-controls.patch), so every token
  // with such a byte must be masked out inside one, as in an unbounded string.
  XSERV_REQUIRE_DATA(data);
  const models::Tokenizer& tok = tokenizer();
  for (const char* string_schema :
       {R"({"type": "string", "maxLength": 5})",
        R"({"type": "string", "minLength": 1, "maxLength": 40})", R"({"type": "string"})"}) {
    CAPTURE(string_schema);
    ConstraintRequest req;
    req.output = {GrammarSpec::Kind::JsonSchema,
                  std::string(R"({"type": "object", "properties": {"s": )") + string_schema +
                      R"(}, "required": ["s"], "additionalProperties": false})",
                  "json_schema"};
    ConstraintState state(compiler().compile(req));
    for (models::TokenId id : tok.encode(R"({"s": ")"))
      REQUIRE(state.accept(int32_t(id)));
    std::vector<uint32_t> mask(ConstraintState::mask_words(kVocab));
    REQUIRE(state.fill_mask(mask));
    int controls = 0, plain = 0;
    for (int64_t t = 0; t < int64_t(tok.vocab_size()); ++t) {
      if (tok.is_special(models::TokenId(t)))
        continue;
      const std::string_view bytes = tok.id_to_token(models::TokenId(t));
      const bool control = std::any_of(bytes.begin(), bytes.end(),
                                       [](char c) { return static_cast<unsigned char>(c) < 0x20; });
      if (control) {
        ++controls;
        if (allowed(mask, t))
          FAIL_CHECK("token " << t << " with a control byte is allowed in the string");
      } else if (bytes == "ab" || bytes == "hello") {
        ++plain;
        CHECK(allowed(mask, t));
      }
    }
    CHECK(controls > 100); // tabs, newlines and the rest exist as tokens
    CHECK(plain == 2);
  }
}

TEST_CASE("constraint: schema keywords the engine cannot enforce are refused by name") {
  XSERV_REQUIRE_DATA(data);
  auto refuse = [](const std::string& schema, const std::string& word) {
    CAPTURE(schema);
    ConstraintRequest req;
    req.output = GrammarSpec{GrammarSpec::Kind::JsonSchema, schema, "response_format.schema"};
    try {
      compiler().compile(req);
      FAIL("accepted");
    } catch (const engine::ConstraintError& e) {
      CHECK(e.field() == "response_format.schema");
      CHECK_MESSAGE(std::string(e.what()).find(word) != std::string::npos, e.what());
      CHECK_MESSAGE(std::string(e.what()).find(".cc:") == std::string::npos, e.what());
    }
  };
  refuse(R"({"type": "array", "uniqueItems": true})", "uniqueItems");
  refuse(R"({"not": {"type": "string"}})", "not");
  refuse(R"({"if": {}, "then": {}})", "if");
  refuse(R"({"type": "object", "properties": {"a": {"type": "array", "contains": {}}}})",
         "#/properties/a/contains");
  refuse(R"({"type": "number", "multipleOf": 0.5})", "multipleOf");
  refuse(R"({"type": "string", "pattern": "a+", "maxLength": 3})", "maxLength");
  refuse(R"({"type": "string", "format": "credit-card"})", "credit-card");
  refuse(R"({"oneOf": [{"type": "string"}, {"type": "integer"}]})", "anyOf");
  refuse(R"({"allOf": [{"type": "string"}, {"maxLength": 2}]})", "allOf");
  refuse(R"({"$ref": "http://example.com/s.json"})", "$ref");
  refuse(R"({"type": "object", "dependentRequired": {"a": ["b"]}})", "dependentRequired");
  refuse("{\"type\": ", "is not JSON");
  // References: a cycle with no value at its end admits no output; a missing one is named.
  refuse(R"({"$ref": "#"})", "admits no output");
  refuse(R"({"$defs": {"x": {"$ref": "#/$defs/y"}, "y": {"$ref": "#/$defs/x"}},
             "$ref": "#/$defs/x"})",
         "admits no output");
  refuse(R"({"$ref": "#/$defs/missing"})", "Cannot find field $defs");
  refuse(R"({"type": "string", "minLength": 1000000})", "from 0 to 100000");
  refuse(R"({"type": "array", "maxItems": -1})", "#/maxItems");
  // Deep nesting is bounded before the tree is built.
  std::string deep;
  for (int i = 0; i < 100000; ++i)
    deep += "{\"items\": ";
  refuse(deep, "nests deeper");
  // Malformed regexes and grammars are refused too.
  ConstraintRequest bad;
  bad.output = GrammarSpec{GrammarSpec::Kind::Regex, "[a-", "regex"};
  CHECK_THROWS_AS(compiler().compile(bad), engine::ConstraintError);
  bad.output = GrammarSpec{GrammarSpec::Kind::Ebnf, "root ::= undefined_rule", "grammar"};
  CHECK_THROWS_AS(compiler().compile(bad), engine::ConstraintError);
  // What is enforced compiles: a recursive schema through $defs, formats, bounds.
  ConstraintRequest ok;
  ok.output = GrammarSpec{GrammarSpec::Kind::JsonSchema, R"({
    "$defs": {"node": {"type": "object", "properties": {
      "v": {"type": "integer", "minimum": -5, "maximum": 5},
      "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
      "required": ["v"]}},
    "type": "object", "properties": {"root": {"$ref": "#/$defs/node"},
      "when": {"type": "string", "format": "date"},
      "tag": {"type": "string", "minLength": 1, "maxLength": 4}},
    "required": ["root", "when"], "additionalProperties": false})",
                          "json_schema"};
  CHECK(compiler().compile(ok) != nullptr);
}

TEST_CASE("constraint: a fork goes its own way, and a rejected token leaves the state as it was") {
  XSERV_REQUIRE_DATA(data);
  const models::Tokenizer& tok = tokenizer();
  ConstraintRequest req;
  req.output = GrammarSpec{GrammarSpec::Kind::Regex, "(ab|cd)e", "regex"};
  ConstraintState a(compiler().compile(req));
  const auto id = [&](const char* s) { return int32_t(*tok.token_to_id(s)); };
  REQUIRE(a.accept(id("a")));
  ConstraintState b = a.fork();
  CHECK(!a.accept(id("d"))); // not allowed after "a": refused, state unchanged
  CHECK(a.accept(id("b")));
  CHECK(b.accept(id("b")));
  CHECK(b.accept(id("e")));
  CHECK(b.accept(kEos[0])); // b ends
  CHECK(!b.bound());
  CHECK(a.bound()); // a, at "ab", still needs its "e"
  std::vector<uint32_t> mask(ConstraintState::mask_words(kVocab), 0);
  a.fill_mask(mask);
  CHECK(allowed(mask, id("e")));
  CHECK(!allowed(mask, kEos[0]));
  std::vector<float> logits(kVocab, 1.0f);
  logits[size_t(id("a"))] = 9.0f; // the best logit, but not allowed
  CHECK(engine::masked_argmax(logits, mask) == id("e"));
  CHECK(engine::masked_argmax(logits, std::vector<uint32_t>(mask.size(), 0u)) == -1);
  CHECK(engine::apply_mask(logits, mask) >= 1);
  CHECK(logits[size_t(id("e"))] == 1.0f);
  CHECK(std::isinf(logits[size_t(id("a"))]));
}

TEST_CASE("constraint: the harmony binding leaves headers and analysis free, binds the final "
          "message and a strict tool's arguments") {
  XSERV_REQUIRE_DATA(data);
  const models::Tokenizer& tok = tokenizer();
  ConstraintRequest req;
  req.harmony = true;
  req.output = GrammarSpec{GrammarSpec::Kind::JsonSchema,
                           R"({"type": "object", "properties": {"ok": {"type": "boolean"}},
                               "required": ["ok"]})",
                           "response_format"};
  req.tools.push_back({"lookup",
                       {GrammarSpec::Kind::JsonSchema,
                        R"({"type": "object", "properties": {"q": {"enum": ["x"]}},
                                      "required": ["q"]})",
                        "tools[0].function.parameters"}});
  const auto constraint = compiler().compile(req);
  auto ids = [&](const std::string& text) {
    std::vector<int32_t> out;
    for (models::TokenId t : tok.encode(text, models::AllowedSpecial::all()))
      out.push_back(int32_t(t));
    return out;
  };
  std::vector<uint32_t> mask(ConstraintState::mask_words(kVocab));
  // Analysis: free; then the final message: only what the schema allows, then <|return|>.
  ConstraintState s(constraint);
  for (int32_t t : ids("<|channel|>analysis<|message|>Anything at all, {not json<|end|>"
                       "<|start|>assistant<|channel|>final<|message|>")) {
    CHECK(!s.bound());
    CHECK(!s.fill_mask(mask));
    REQUIRE(s.accept(t));
  }
  CHECK(s.bound());
  REQUIRE(s.fill_mask(mask));
  CHECK(allowed(mask, ids("{\"")[0]));
  CHECK(!allowed(mask, ids("Hello")[0]));
  CHECK(!allowed(mask, ids("<|return|>")[0]));
  for (int32_t t : ids("{\"ok\": true}"))
    REQUIRE(s.accept(t));
  s.fill_mask(mask);
  CHECK(allowed(mask, ids("<|return|>")[0]));
  CHECK(!allowed(mask, ids("<|end|>")[0]));
  CHECK(s.accept(ids("<|return|>")[0]));
  CHECK(!s.bound());
  // A strict tool's call: bound from its <|message|>, ended by <|call|>; other tools stay free.
  ConstraintState t(constraint);
  for (int32_t id : ids("<|channel|>commentary to=functions.lookup <|constrain|>json<|message|>"))
    REQUIRE(t.accept(id));
  CHECK(t.bound());
  for (int32_t id : ids("{\"q\": \""))
    REQUIRE(t.accept(id));
  CHECK(!t.accept(ids("y")[0])); // not a value the enum allows
  for (int32_t id : ids("x\"}"))
    REQUIRE(t.accept(id));
  t.fill_mask(mask);
  CHECK(allowed(mask, ids("<|call|>")[0]));
  CHECK(!allowed(mask, ids("<|return|>")[0]));
  ConstraintState u(constraint);
  for (int32_t id : ids("<|channel|>commentary to=functions.other <|constrain|>json<|message|>"))
    REQUIRE(u.accept(id));
  CHECK(!u.bound());
}
