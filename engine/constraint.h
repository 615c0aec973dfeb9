// Structured output: what a request's generated tokens must match (a JSON schema, any JSON, a
// regular expression or an EBNF grammar), compiled against the model's vocabulary by xgrammar's
// C++ core, and the per-sequence state that gives each next token's mask. With the harmony
// binding (chat), a constraint binds only the final channel's message and the arguments of
// strict function calls; the analysis channel and the message headers stay free, unless the
// request's tool_choice requires a call (then the headers are forced to one).
//
// xgrammar's types stay inside engine/constraint.cpp: this header is all the engine and the
// server see.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/error.h"
#include "models/tokenizer.h"

namespace xserv::engine {

/// A constraint the engine cannot enforce (a schema keyword xgrammar would ignore, a malformed
/// schema, regex or grammar). `field` names the request field, the message the keyword.
class ConstraintError : public Error {
public:
  ConstraintError(std::string field, const std::string& what)
      : Error(field + ": " + what), field_(std::move(field)) {}
  const std::string& field() const { return field_; }

private:
  std::string field_;
};

/// One grammar as the API gives it.
struct GrammarSpec {
  enum class Kind {
    Json,       ///< any JSON value of object type (response_format json_object)
    JsonSchema, ///< `text` is a JSON schema
    Regex,      ///< `text` is a regular expression the whole output matches
    Ebnf,       ///< `text` is an EBNF grammar (xgrammar's GBNF dialect) with a rule `root`
  };
  Kind kind = Kind::Json;
  std::string text;
  /// The request field it came from, for errors (e.g. "response_format.json_schema.schema").
  std::string field;
};

/// What a request asks to be enforced.
struct ConstraintRequest {
  /// The output: with `harmony`, the final channel's message; else every generated token.
  std::optional<GrammarSpec> output;
  /// Strict function tools (harmony only): the arguments of a call to "functions.NAME" match
  /// the tool's parameter schema.
  struct Tool {
    std::string name;
    GrammarSpec arguments;
  };
  std::vector<Tool> tools;
  /// tool_choice (harmony only). Auto: the model decides. Required: it must call one of
  /// `callable` (function names): until a call is made, every message header it writes is an
  /// analysis one or such a call's (`<|channel|>commentary to=functions.NAME <|constrain|>json
  /// <|message|>`), an analysis message cannot write <|return|> or <|call|> (the request's own
  /// stop strings and ids still end the output), and a call's arguments are a JSON object (its
  /// tool's schema when the tool is strict); after the call nothing more is forced.
  enum class ToolChoice { Auto, Required };
  ToolChoice tool_choice = ToolChoice::Auto;
  std::vector<std::string> callable;
  /// Bind to harmony's messages (chat and Responses) rather than to the raw output.
  bool harmony = false;
  bool empty() const {
    return !output && tools.empty() && tool_choice == ToolChoice::Auto;
  }
};

/// The most bytes of a schema, regex or grammar a request may carry.
inline constexpr size_t kMaxGrammarBytes = size_t{1} << 20;

class Constraint;

/// Compiles constraints against one tokenizer's vocabulary. Thread-safe; compiled grammars are
/// cached by their text, so repeated schemas cost a lookup.
class ConstraintCompiler {
public:
  /// `vocab_size`: the model's logits width (ids past the tokenizer's are never allowed);
  /// `stop_ids`: the ids that end a whole-output constraint (the model's eos ids); `threads`:
  /// how many compile a grammar's token masks (0: the machine's cores, at most 16; a
  /// 1,000-property schema takes 1.58 s on one core, 0.97 on two).
  ConstraintCompiler(models::Tokenizer tokenizer, int64_t vocab_size,
                     std::vector<int32_t> stop_ids, int threads = 0);
  ~ConstraintCompiler();
  ConstraintCompiler(const ConstraintCompiler&) = delete;
  ConstraintCompiler& operator=(const ConstraintCompiler&) = delete;

  /// Throws ConstraintError naming the field and keyword of anything it cannot enforce.
  std::shared_ptr<const Constraint> compile(const ConstraintRequest& request) const;

  int64_t vocab_size() const;

  struct Impl;

private:
  std::unique_ptr<Impl> impl_;
};

/// A sequence's place in its constraint: feed it each generated token, ask it for the next
/// token's mask. Copying is forbidden; fork() gives an independent copy (n choices).
class ConstraintState {
public:
  explicit ConstraintState(std::shared_ptr<const Constraint> constraint);
  ~ConstraintState();
  ConstraintState(ConstraintState&&) noexcept;
  ConstraintState& operator=(ConstraintState&&) noexcept;

  /// Words of a mask over `vocab` ids: bit t % 32 of word t / 32 allows token t.
  static size_t mask_words(int64_t vocab) { return size_t((vocab + 31) / 32); }
  /// The next token's mask into `words` (mask_words(vocab) of them). False when no mask applies
  /// (every token allowed: outside a bound message); `words` is then left as it was.
  bool fill_mask(std::span<uint32_t> words);
  /// Takes the generated token. False when the constraint did not allow it (the caller's
  /// mask was not applied): the state is unchanged then.
  bool accept(int32_t token);
  /// True while a grammar binds the next token.
  bool bound() const;
  ConstraintState fork() const;

  struct Impl;

private:
  explicit ConstraintState(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// The allowed id with the largest logit (the lowest such id on ties, as argmax), or -1 when the
/// mask allows none: only the mask's set bits are visited.
int32_t masked_argmax(std::span<const float> logits, std::span<const uint32_t> words);

/// Sets every logit whose token the mask forbids to -infinity. Returns the number of allowed
/// tokens (0: the mask allows nothing).
int64_t apply_mask(std::span<float> logits, std::span<const uint32_t> words);

/// The keywords of a JSON schema that the grammar engine enforces; anything else is refused
/// (ConstraintError naming the keyword and where it stands), never ignored. Also refuses
/// references outside the document and nesting past `max_depth`. Returns the schema to compile:
/// `schema_json`, or a rewrite where the engine's own rule for a format is looser than the
/// standard's ("format": "ipv4" as a pattern of dotted quads without leading zeros).
std::string check_schema_keywords(const std::string& schema_json, const std::string& field,
                                  int max_depth = 64);

} // namespace xserv::engine
