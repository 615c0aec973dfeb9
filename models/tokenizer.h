// The o200k_harmony tokenizer of gpt-oss: byte-level BPE (tiktoken rank merging) plus specials.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

namespace xserv::models {

/// A token id; for ordinary tokens it is also the BPE merge rank (lower merges first).
using TokenId = uint32_t;

/// Which special tokens encode() recognises in its input. Specials that are not allowed are
/// encoded as the plain text they spell, so untrusted text can never inject a <|start|>.
class AllowedSpecial {
public:
  /// No special token is recognised (the default: text stays text).
  static AllowedSpecial none() { return AllowedSpecial(); }
  /// Every special token of the vocabulary is recognised.
  static AllowedSpecial all() {
    AllowedSpecial a;
    a.all_ = true;
    return a;
  }
  /// Exactly the named specials, e.g. {"<|start|>", "<|end|>"}.
  AllowedSpecial(std::initializer_list<std::string_view> names);
  explicit AllowedSpecial(std::unordered_set<std::string> names) : names_(std::move(names)) {}

  bool allows(std::string_view name) const;
  /// False when no special can match, letting encode() skip the scan for "<|".
  bool any() const { return all_ || !names_.empty(); }

private:
  AllowedSpecial() = default;
  bool all_ = false;
  std::unordered_set<std::string> names_;
};

/// An immutable, cheaply copyable tokenizer; all methods are thread-safe.
class Tokenizer {
public:
  /// Loads from a checkpoint directory (its tokenizer.json, else o200k_base.tiktoken) or from
  /// either file given directly. Throws xserv::Error naming the file on any problem.
  static Tokenizer load(const std::filesystem::path& path);
  /// Loads an HF tokenizer.json: model.vocab (GPT-2 byte-to-unicode strings; ids are ranks) and
  /// added_tokens; ids in [vocab, 201088) without an added token become <|reserved_N|>.
  static Tokenizer from_hf_json(const std::filesystem::path& path);
  /// Loads a tiktoken ranks file ("base64(bytes) rank" per line) and adds the harmony specials.
  static Tokenizer from_tiktoken(const std::filesystem::path& path);
  /// from_tiktoken and from_hf_json over a file's contents; `source` names it in errors.
  static Tokenizer from_tiktoken_text(std::string_view text, const std::string& source);
  static Tokenizer from_hf_json_text(std::string_view text, const std::string& source);

  /// Encodes UTF-8 text. Specials named by `allowed` become their single ids; everything else is
  /// split by the o200k pre-tokenizer and BPE-merged. Throws xserv::Error on invalid UTF-8.
  std::vector<TokenId> encode(std::string_view text,
                              const AllowedSpecial& allowed = AllowedSpecial::none()) const;
  /// Appends the ids of `text` (no specials recognised) to `out`.
  void encode_ordinary_into(std::string_view text, std::vector<TokenId>& out) const;

  /// The bytes the ids spell (specials as their names). Throws xserv::Error on an id out of range.
  /// The result need not be valid UTF-8 when a multi-byte character is cut.
  std::string decode(std::span<const TokenId> ids) const;

  /// The bytes of one token (a special's name for a special). Throws on an id out of range.
  std::string_view id_to_token(TokenId id) const;
  /// The id whose bytes (or special name) are exactly `token`, if any.
  std::optional<TokenId> token_to_id(std::string_view token) const;
  /// The id of a special token by name; throws xserv::Error when the vocabulary lacks it.
  TokenId special_id(std::string_view name) const;

  /// Total ids including specials and reserved ids (201088 for o200k_harmony).
  size_t vocab_size() const;
  /// Number of ordinary (BPE) tokens; ids below it are ordinary (199998 for o200k).
  size_t num_ordinary() const;
  bool is_special(TokenId id) const;

  struct Impl;

private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
  friend struct TokenizerBuilder;
};

/// Turns a stream of ids into text while emitting only complete UTF-8 characters: bytes of a
/// character split across tokens are held back until the character is complete.
class StreamDecoder {
public:
  explicit StreamDecoder(Tokenizer tokenizer) : tokenizer_(std::move(tokenizer)) {}
  /// The newly completed text after appending `id` (possibly empty).
  std::string push(TokenId id);
  /// Whatever is still held back (an unfinished character at end of stream), then resets.
  std::string flush();

private:
  Tokenizer tokenizer_;
  std::string pending_;
};

} // namespace xserv::models
