// Structured output over xgrammar's C++ core: the o200k vocabulary handed over as raw bytes
// (specials as empty strings, which xgrammar never allows inside a grammar), grammars compiled
// and cached by its GrammarCompiler, one GrammarMatcher a constrained message, and the harmony
// binding that decides which message a grammar binds (models::StreamParser reads the headers).
#include "engine/constraint.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <thread>
#include <utility>

#include <dlpack/dlpack.h>
#include <fmt/format.h>
#include <xgrammar/xgrammar.h>

#include "models/harmony.h"

namespace xserv::engine {

namespace {

/// Fills `words` (one bit an id) with the ids `m` allows next; false when it allows every id.
bool fill_bitmask(xgrammar::GrammarMatcher& m, std::span<uint32_t> words) {
  int64_t shape[1] = {int64_t(words.size())};
  DLTensor t{};
  t.data = words.data();
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = xgrammar::GetBitmaskDLType();
  t.shape = shape;
  return m.FillNextTokenBitmask(&t);
}

/// A grammar compiled for the vocabulary, with the ids that end its message.
struct Bound {
  xgrammar::CompiledGrammar grammar;
  std::vector<int> stops;
};

/// The token sequences a forced stretch of the output may take (tool_choice: the headers), as a
/// trie; node 0 is the root, a node without children the end of a sequence.
struct TokenTrie {
  std::vector<std::vector<std::pair<int32_t, int>>> next{{}};
  void add(const std::vector<int32_t>& ids) {
    int node = 0;
    for (int32_t id : ids) {
      int child = find(node, id);
      if (child < 0) {
        child = int(next.size());
        next[size_t(node)].emplace_back(id, child);
        next.emplace_back();
      }
      node = child;
    }
  }
  int find(int node, int32_t id) const {
    for (const auto& [t, child] : next[size_t(node)])
      if (t == id)
        return child;
    return -1;
  }
  bool leaf(int node) const { return next[size_t(node)].empty(); }
};

} // namespace

class Constraint {
public:
  std::optional<Bound> output;
  std::vector<std::pair<std::string, Bound>> tools; ///< "functions.NAME" -> its arguments
  bool harmony = false;
  models::Tokenizer tokenizer;
  int64_t vocab = 0;
  /// tool_choice required: the headers a message may open with, at the output's start (after
  /// the prompt's `<|start|>assistant`) and after a message's <|end|> (from `<|start|>`); any
  /// JSON object for a forced call to a tool that is not strict; the ids an analysis message
  /// may not write (those that would stop the output before the call).
  bool forced = false;
  TokenTrie first_header, next_header;
  std::optional<Bound> any_arguments;
  std::vector<int32_t> analysis_forbidden;

  Constraint(models::Tokenizer tok, int64_t v) : tokenizer(std::move(tok)), vocab(v) {}
  const Bound* tool(const std::string& recipient) const {
    for (const auto& [name, b] : tools)
      if (name == recipient)
        return &b;
    return nullptr;
  }
};

struct ConstraintCompiler::Impl {
  models::Tokenizer tokenizer;
  int64_t vocab;
  std::vector<int32_t> stop_ids;
  xgrammar::TokenizerInfo info;
  mutable xgrammar::GrammarCompiler compiler;
  int32_t return_id, call_id;

  static xgrammar::TokenizerInfo make_info(const models::Tokenizer& tok, int64_t vocab,
                                           const std::vector<int32_t>& stops) {
    std::vector<std::string> encoded;
    const auto n = int64_t(std::min<size_t>(tok.vocab_size(), size_t(vocab)));
    encoded.reserve(size_t(n));
    for (int64_t id = 0; id < n; ++id)
      encoded.emplace_back(tok.is_special(models::TokenId(id))
                               ? std::string_view()
                               : tok.id_to_token(models::TokenId(id)));
    return xgrammar::TokenizerInfo(encoded, xgrammar::VocabType::RAW, int(vocab), stops);
  }

  Impl(models::Tokenizer tok, int64_t v, std::vector<int32_t> stops, int threads)
      : tokenizer(std::move(tok)), vocab(v), stop_ids(std::move(stops)),
        info(make_info(tokenizer, vocab, stop_ids)),
        compiler(info,
                 threads > 0 ? threads
                             : int(std::clamp(std::thread::hardware_concurrency(), 1u, 16u)),
                 /*cache_enabled=*/true,
                 /*max_memory_bytes=*/int64_t{512} << 20),
        return_id(int32_t(tokenizer.special_id("<|return|>"))),
        call_id(int32_t(tokenizer.special_id("<|call|>"))) {}

  /// `compiled` unless it admits no output at all (a reference cycle with nothing at its end,
  /// an unsatisfiable schema): such a request would fail at its first token.
  xgrammar::CompiledGrammar admits_output(xgrammar::CompiledGrammar compiled,
                                          const GrammarSpec& g) const {
    xgrammar::GrammarMatcher m(compiled, std::vector<int>{int(return_id)});
    std::vector<uint32_t> words(ConstraintState::mask_words(vocab), 0);
    fill_bitmask(m, words);
    if (std::all_of(words.begin(), words.end(), [](uint32_t w) { return w == 0; }))
      throw ConstraintError(g.field, "admits no output at all (a reference cycle with no value "
                                     "at its end, or an unsatisfiable schema)");
    return compiled;
  }

  xgrammar::CompiledGrammar compile_one(const GrammarSpec& g) const {
    return admits_output(compile_grammar(g), g);
  }

  xgrammar::CompiledGrammar compile_grammar(const GrammarSpec& g) const {
    if (g.text.size() > kMaxGrammarBytes)
      throw ConstraintError(g.field, fmt::format("{} bytes, more than the {} a request may carry",
                                                 g.text.size(), kMaxGrammarBytes));
    try {
      switch (g.kind) {
      case GrammarSpec::Kind::Json:
        // Any object, compact: any_whitespace would let a model pad for ever.
        return compiler.CompileJSONSchema(R"({"type": "object"})", /*any_whitespace=*/false,
                                          std::nullopt, std::nullopt, /*strict_mode=*/false);
      case GrammarSpec::Kind::JsonSchema:
        // strict_mode: no property or item the schema does not name (OpenAI's strict schemas).
        return compiler.CompileJSONSchema(check_schema_keywords(g.text, g.field),
                                          /*any_whitespace=*/false, std::nullopt, std::nullopt,
                                          /*strict_mode=*/true);
      case GrammarSpec::Kind::Regex:
        return compiler.CompileRegex(g.text);
      case GrammarSpec::Kind::Ebnf:
        return compiler.CompileGrammar(g.text, "root");
      }
    } catch (const ConstraintError&) {
      throw;
    } catch (const std::exception& e) {
      std::string what = e.what();
      // xgrammar's messages may carry a time, its source location and a trailing newline.
      if (const size_t at = what.find(".cc:"); at != std::string::npos)
        if (const size_t colon = what.find(": ", at); colon != std::string::npos)
          what = what.substr(colon + 2);
      while (!what.empty() && (what.back() == '\n' || what.back() == ' '))
        what.pop_back();
      throw ConstraintError(g.field, "cannot be enforced: " + what);
    }
    throw ConstraintError(g.field, "unknown grammar kind");
  }
};

ConstraintCompiler::ConstraintCompiler(models::Tokenizer tokenizer, int64_t vocab_size,
                                       std::vector<int32_t> stop_ids, int threads)
    : impl_(std::make_unique<Impl>(std::move(tokenizer), vocab_size, std::move(stop_ids),
                                   threads)) {}

ConstraintCompiler::~ConstraintCompiler() = default;

int64_t ConstraintCompiler::vocab_size() const { return impl_->vocab; }

std::shared_ptr<const Constraint>
ConstraintCompiler::compile(const ConstraintRequest& request) const {
  auto c = std::make_shared<Constraint>(impl_->tokenizer, impl_->vocab);
  c->harmony = request.harmony;
  if (request.output) {
    std::vector<int> stops = request.harmony
                                 ? std::vector<int>{impl_->return_id}
                                 : std::vector<int>(impl_->stop_ids.begin(), impl_->stop_ids.end());
    c->output = Bound{impl_->compile_one(*request.output), std::move(stops)};
  }
  for (const ConstraintRequest::Tool& t : request.tools) {
    if (!request.harmony)
      throw ConstraintError(t.arguments.field, "strict tools need the chat format");
    c->tools.emplace_back("functions." + t.name,
                          Bound{impl_->compile_one(t.arguments), {impl_->call_id}});
  }
  if (request.tool_choice == ConstraintRequest::ToolChoice::Required) {
    if (!request.harmony)
      throw ConstraintError("tool_choice", "a required tool call needs the chat format");
    if (request.callable.empty())
      throw ConstraintError("tool_choice", "a tool call is required, but there are no tools");
    const models::Tokenizer& tok = impl_->tokenizer;
    const auto special = [&](const char* name) { return int32_t(tok.special_id(name)); };
    const auto text = [&](std::string_view t) {
      std::vector<models::TokenId> ids;
      tok.encode_ordinary_into(t, ids);
      return std::vector<int32_t>(ids.begin(), ids.end());
    };
    const auto cat = [](std::vector<std::vector<int32_t>> parts) {
      std::vector<int32_t> out;
      for (const auto& p : parts)
        out.insert(out.end(), p.begin(), p.end());
      return out;
    };
    // The headers as gpt-oss writes them: an analysis message, or a call with JSON arguments.
    std::vector<std::vector<int32_t>> headers = {
        cat({{special("<|channel|>")}, text("analysis"), {special("<|message|>")}})};
    for (const std::string& name : request.callable)
      headers.push_back(cat({{special("<|channel|>")}, text("commentary to=functions." + name + " "),
                             {special("<|constrain|>")}, text("json"),
                             {special("<|message|>")}}));
    const std::vector<int32_t> reopen = cat({{special("<|start|>")}, text("assistant")});
    c->forced = true;
    for (const auto& h : headers) {
      c->first_header.add(h);
      c->next_header.add(cat({reopen, h}));
    }
    c->any_arguments = Bound{impl_->compile_one({GrammarSpec::Kind::Json, "", "tool_choice"}),
                             {impl_->call_id}};
    c->analysis_forbidden = {impl_->return_id, impl_->call_id};
  }
  return c;
}

// ---- the per-sequence state -----------------------------------------------------------------

struct ConstraintState::Impl {
  std::shared_ptr<const Constraint> c;
  std::optional<xgrammar::GrammarMatcher> matcher; ///< the bound message's, if any
  std::optional<models::StreamParser> parser;      ///< harmony: where the output stands
  int32_t message_id = -1, end_id = -1;
  /// tool_choice required: the forced header's trie and the node reached (-1: none forced), and
  /// whether an analysis message is open (it may not stop the output).
  const TokenTrie* trie = nullptr;
  int node = -1;
  bool in_analysis = false;
  /// The bound message is a call; a call was made (the requirement is met: nothing is forced
  /// after it, the model may call again or answer).
  bool bound_call = false, called = false;
  bool forcing() const { return c->forced && !called; }

  explicit Impl(std::shared_ptr<const Constraint> constraint) : c(std::move(constraint)) {
    if (c->harmony) {
      parser.emplace(c->tokenizer, models::Role::Assistant, /*strict=*/false);
      message_id = int32_t(c->tokenizer.special_id("<|message|>"));
      end_id = int32_t(c->tokenizer.special_id("<|end|>"));
      if (c->forced) { // the prompt opened the assistant's message: its header comes first
        trie = &c->first_header;
        node = 0;
      }
    } else if (c->output) {
      matcher.emplace(c->output->grammar, c->output->stops);
    }
  }
  Impl(const Impl& o)
      : c(o.c), parser(o.parser), message_id(o.message_id), end_id(o.end_id), trie(o.trie),
        node(o.node), in_analysis(o.in_analysis), bound_call(o.bound_call), called(o.called) {
    if (o.matcher)
      matcher.emplace(o.matcher->Fork());
  }

  /// After <|message|>: the grammar, if any, that binds the message whose header was read.
  void bind_message() {
    const Bound* b = nullptr;
    const std::string& recipient = parser->current_recipient();
    if (!recipient.empty()) {
      b = c->tool(recipient);
      if (!b && forcing()) // a required call to a tool that is not strict: any JSON object
        b = &*c->any_arguments;
    } else if (parser->current_channel() == "final" && c->output) {
      b = &*c->output;
    }
    in_analysis = forcing() && !b && parser->current_channel() == "analysis";
    bound_call = b && !recipient.empty();
    if (b)
      matcher.emplace(b->grammar, b->stops);
  }
};

ConstraintState::ConstraintState(std::shared_ptr<const Constraint> constraint)
    : impl_(std::make_unique<Impl>(std::move(constraint))) {}
ConstraintState::ConstraintState(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ConstraintState::~ConstraintState() = default;
ConstraintState::ConstraintState(ConstraintState&&) noexcept = default;
ConstraintState& ConstraintState::operator=(ConstraintState&&) noexcept = default;

bool ConstraintState::bound() const {
  return (impl_->matcher && !impl_->matcher->IsTerminated()) || impl_->node >= 0 ||
         impl_->in_analysis;
}

bool ConstraintState::fill_mask(std::span<uint32_t> words) {
  if (!bound())
    return false;
  const Impl& s = *impl_;
  XSERV_CHECK(words.size() == mask_words(s.c->vocab), "a token mask of the wrong size");
  const auto set = [&](int32_t id, bool on) {
    if (on)
      words[size_t(id) / 32] |= 1u << (id % 32);
    else
      words[size_t(id) / 32] &= ~(1u << (id % 32));
  };
  if (s.node >= 0) { // a forced header: its next ids only
    std::fill(words.begin(), words.end(), 0u);
    for (const auto& [id, child] : s.trie->next[size_t(s.node)])
      set(id, true);
    return true;
  }
  if (s.in_analysis && !(s.matcher && !s.matcher->IsTerminated())) {
    std::fill(words.begin(), words.end(), ~0u);
    for (int32_t id : s.c->analysis_forbidden)
      set(id, false);
    return true;
  }
  // False when every token is allowed: the buffer is written either way.
  return fill_bitmask(*impl_->matcher, words);
}

bool ConstraintState::accept(int32_t token) {
  Impl& s = *impl_;
  if (s.matcher && !s.matcher->IsTerminated()) {
    if (!s.matcher->AcceptToken(token))
      return false;
    if (s.parser)
      s.parser->push(models::TokenId(token));
    if (s.parser && s.matcher->IsTerminated()) {
      s.matcher.reset(); // the message ended: what follows is free again
      s.called = s.called || s.bound_call;
    }
    return true;
  }
  if (!s.parser)
    return true; // a whole-output constraint that ended: the engine stops at its stop id
  if (s.node >= 0) { // a forced header
    const int child = s.trie->find(s.node, token);
    if (child < 0)
      return false;
    s.node = s.trie->leaf(child) ? -1 : child;
  } else if (s.in_analysis && std::find(s.c->analysis_forbidden.begin(),
                                        s.c->analysis_forbidden.end(),
                                        token) != s.c->analysis_forbidden.end()) {
    return false;
  }
  s.parser->push(models::TokenId(token));
  if (token == s.message_id && s.parser->state() == models::StreamParser::State::Content)
    s.bind_message();
  if (token == s.end_id && s.forcing()) { // the analysis ended: the next header is forced too
    s.in_analysis = false;
    s.trie = &s.c->next_header;
    s.node = 0;
  }
  return true;
}

ConstraintState ConstraintState::fork() const {
  return ConstraintState(std::make_unique<Impl>(*impl_));
}

int32_t masked_argmax(std::span<const float> logits, std::span<const uint32_t> words) {
  int32_t best = -1;
  for (size_t w = 0; w < words.size(); ++w)
    for (uint32_t bits = words[w]; bits != 0; bits &= bits - 1) {
      const size_t t = w * 32 + size_t(std::countr_zero(bits));
      if (t >= logits.size())
        return best;
      if (best < 0 || logits[t] > logits[size_t(best)])
        best = int32_t(t);
    }
  return best;
}

int64_t apply_mask(std::span<float> logits, std::span<const uint32_t> words) {
  int64_t allowed = 0;
  const float ninf = -std::numeric_limits<float>::infinity();
  for (size_t t = 0; t < logits.size(); ++t) {
    const size_t w = t / 32;
    const bool ok = w < words.size() && (words[w] >> (t % 32) & 1u);
    if (ok)
      ++allowed;
    else
      logits[t] = ninf;
  }
  return allowed;
}

} // namespace xserv::engine
