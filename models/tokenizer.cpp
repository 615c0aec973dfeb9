// o200k encoding and decoding: pre-tokenizer regex (PCRE2 JIT), tiktoken rank merging, specials.
//
// Encoding, per run of text between allowed special tokens:
//  1. split into pre-tokens with the o200k regex (MODEL.md), scanning with PCRE2's JIT;
//  2. a pre-token that is itself a token is emitted directly (most English words);
//  3. otherwise its bytes are merged as tiktoken does: repeatedly merge the adjacent pair whose
//     concatenation has the lowest rank (leftmost on ties) until no pair is a token; results
//     are cached per call because pre-tokens repeat.
#include "models/tokenizer_impl.h"

#include <algorithm>
#include <queue>

#include <fmt/format.h>

#include "base/error.h"

namespace xserv::models {
namespace {

// Unicode White_Space, spelled out: PCRE2's UCP \s also matches U+180E (not White_Space since
// Unicode 6.3), which tiktoken's Rust regex does not.
#define XSERV_WS                                                                                   \
  R"(\t-\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})"
#define XSERV_UPPER R"([\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])"
#define XSERV_LOWER R"([\p{Ll}\p{Lm}\p{Lo}\p{M}])"
#define XSERV_SUFFIX R"((?i:'s|'t|'re|'ve|'m|'ll|'d)?)"

// The o200k pattern of MODEL.md with \s -> [WS] and \S -> [^WS].
constexpr const char* kPattern =
    R"([^\r\n\p{L}\p{N}]?)" XSERV_UPPER "*" XSERV_LOWER "+" XSERV_SUFFIX
    R"(|[^\r\n\p{L}\p{N}]?)" XSERV_UPPER "+" XSERV_LOWER "*" XSERV_SUFFIX R"(|\p{N}{1,3})"
    R"(| ?[^)" XSERV_WS R"(\p{L}\p{N}]+[\r\n/]*)"
    R"(|[)" XSERV_WS R"(]*[\r\n]+)"
    R"(|[)" XSERV_WS R"(]+(?![^)" XSERV_WS R"(]))"
    R"(|[)" XSERV_WS R"(]+)";

#undef XSERV_WS
#undef XSERV_UPPER
#undef XSERV_LOWER
#undef XSERV_SUFFIX

std::shared_ptr<pcre2_code> compile_pattern() {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    XSERV_CHECK(false, fmt::format("o200k regex does not compile at {}: {}", err_off,
                                   reinterpret_cast<const char*>(msg)));
  }
  // Without JIT (unsupported CPU) matching is slower but still correct.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::shared_ptr<pcre2_code>(code, pcre2_code_free);
}

/// Offset of the first byte that breaks UTF-8, or text.size() when valid.
size_t utf8_error_offset(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  size_t n = text.size(), i = 0;
  while (i < n) {
    if (i + 8 <= n) { // ASCII fast path
      uint64_t v;
      std::memcpy(&v, s + i, 8);
      if ((v & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
    if (len == 0 || c > 0xF4 || i + len > n)
      return i;
    uint32_t cp = c & (0x7F >> len);
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80)
        return i;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    // Reject overlongs, surrogates and values past U+10FFFF.
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return i;
    i += len;
  }
  return n;
}

struct Part {
  uint32_t start;
  uint32_t rank;
};

/// tiktoken's byte_pair_merge over one pre-token; appends the resulting ids.
void bpe_merge(const Tokenizer::Impl& im, std::string_view piece, std::vector<Part>& parts,
               std::vector<TokenId>& out) {
  const char* p = piece.data();
  const uint32_t n = static_cast<uint32_t>(piece.size());
  parts.clear();
  for (uint32_t i = 0; i + 1 < n; ++i)
    parts.push_back({i, im.rank(p + i, 2)});
  parts.push_back({n - 1, Tokenizer::Impl::kNoRank});
  parts.push_back({n, Tokenizer::Impl::kNoRank});
  // Rank of parts[i] merged with the next two parts' span, i.e. after removing parts[i+1].
  auto rank_after_merge = [&](size_t i) {
    if (i + 3 < parts.size())
      return im.rank(p + parts[i].start, parts[i + 3].start - parts[i].start);
    return Tokenizer::Impl::kNoRank;
  };
  while (parts.size() > 2) {
    uint32_t best = Tokenizer::Impl::kNoRank;
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i)
      if (parts[i].rank < best) {
        best = parts[i].rank;
        at = i;
      }
    if (best == Tokenizer::Impl::kNoRank)
      break;
    if (at > 0)
      parts[at - 1].rank = rank_after_merge(at - 1);
    parts[at].rank = rank_after_merge(at);
    parts.erase(parts.begin() + static_cast<ptrdiff_t>(at) + 1);
  }
  for (size_t i = 0; i + 1 < parts.size(); ++i)
    out.push_back(im.rank(p + parts[i].start, parts[i + 1].start - parts[i].start));
}

/// The same merge order as bpe_merge (lowest rank, leftmost on ties) in O(n log n) for long
/// pieces (runs of spaces, long words of one letter), where the O(n^2) scan of tiktoken would
/// let a hostile prompt stall the encoder. Parts form a linked list over the piece's bytes;
/// heap entries whose part has since changed are skipped when popped.
void bpe_merge_long(const Tokenizer::Impl& im, std::string_view piece, std::vector<TokenId>& out) {
  constexpr uint32_t kNoRank = Tokenizer::Impl::kNoRank;
  const char* p = piece.data();
  const uint32_t n = static_cast<uint32_t>(piece.size());
  std::vector<uint32_t> next(n), prev(n), rank(n, kNoRank); // part i spans [i, next[i])
  std::vector<char> alive(n, 1);
  using Entry = std::pair<uint32_t, uint32_t>; // (rank, start): min rank, then leftmost
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  for (uint32_t i = 0; i < n; ++i) {
    next[i] = i + 1;
    prev[i] = i - 1;
  }
  auto update = [&](uint32_t i) { // rank of part i merged with its successor
    uint32_t j = next[i];
    rank[i] = j < n ? im.rank(p + i, next[j] - i) : kNoRank;
    if (rank[i] != kNoRank)
      heap.push({rank[i], i});
  };
  for (uint32_t i = 0; i < n; ++i)
    update(i);
  while (!heap.empty()) {
    auto [r, i] = heap.top();
    heap.pop();
    if (!alive[i] || rank[i] != r)
      continue; // stale: ranks are unique per byte string, so a changed span has a new rank
    uint32_t j = next[i];
    alive[j] = 0;
    next[i] = next[j];
    if (next[j] < n)
      prev[next[j]] = i;
    update(i);
    if (i > 0)
      update(prev[i]);
  }
  for (uint32_t i = 0; i < n; i = next[i])
    out.push_back(im.rank(p + i, next[i] - i));
}

// Above this length a pre-token is merged with the heap; below, the plain scan is faster.
constexpr size_t kLongPiece = 64;

struct ViewHash {
  size_t operator()(std::string_view s) const { return hash_bytes(s.data(), s.size()); }
};

} // namespace

AllowedSpecial::AllowedSpecial(std::initializer_list<std::string_view> names) {
  for (auto n : names)
    names_.emplace(n);
}

bool AllowedSpecial::allows(std::string_view name) const {
  return all_ || names_.count(std::string(name)) > 0;
}

Tokenizer TokenizerBuilder::build(std::vector<std::string> ordinary,
                                  std::vector<std::pair<TokenId, std::string>> specials,
                                  size_t vocab_size, const std::string& source) {
  auto im = std::make_shared<Tokenizer::Impl>();
  im->num_ordinary = ordinary.size();
  if (vocab_size < ordinary.size())
    vocab_size = ordinary.size();
  for (auto& [id, name] : specials) {
    if (id < ordinary.size())
      throw Error(fmt::format("{}: special token {} has id {}, which is an ordinary token id",
                              source, name, id));
    vocab_size = std::max<size_t>(vocab_size, size_t(id) + 1);
  }
  std::vector<std::string> names(vocab_size - ordinary.size());
  for (auto& [id, name] : specials)
    names[id - ordinary.size()] = name;
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i].empty())
      names[i] = fmt::format("<|reserved_{}|>", ordinary.size() + i);

  im->offsets.reserve(vocab_size + 1);
  for (const auto& t : ordinary) {
    if (t.empty())
      throw Error(fmt::format("{}: token {} is empty", source, im->offsets.size()));
    im->offsets.push_back(static_cast<uint32_t>(im->blob.size()));
    im->blob += t;
  }
  for (size_t i = 0; i < names.size(); ++i) {
    TokenId id = static_cast<TokenId>(ordinary.size() + i);
    im->offsets.push_back(static_cast<uint32_t>(im->blob.size()));
    im->blob += names[i];
    im->special_ids.emplace(names[i], id);
    im->special_ids.emplace(fmt::format("<|reserved_{}|>", id), id); // alias, e.g. 200018
    im->max_special_len = std::max(im->max_special_len, names[i].size());
  }
  im->offsets.push_back(static_cast<uint32_t>(im->blob.size()));

  size_t cap = 1;
  while (cap < ordinary.size() * 2)
    cap <<= 1;
  im->slots.assign(cap, Tokenizer::Impl::kEmpty);
  im->mask = cap - 1;
  for (TokenId id = 0; id < ordinary.size(); ++id) {
    std::string_view b = im->bytes(id);
    uint64_t i = hash_bytes(b.data(), b.size()) & im->mask;
    for (; im->slots[i] != Tokenizer::Impl::kEmpty; i = (i + 1) & im->mask)
      if (im->bytes(im->slots[i]) == b)
        throw Error(
            fmt::format("{}: tokens {} and {} have the same bytes", source, im->slots[i], id));
    im->slots[i] = id;
  }
  for (int b = 0; b < 256; ++b) {
    char c = static_cast<char>(b);
    if (im->rank(&c, 1) == Tokenizer::Impl::kNoRank)
      throw Error(fmt::format("{}: no token for the single byte 0x{:02x}; byte-level BPE needs "
                              "all 256",
                              source, b));
  }
  im->regex = compile_pattern();
  return Tokenizer(std::move(im));
}

void Tokenizer::encode_ordinary_into(std::string_view text, std::vector<TokenId>& out) const {
  const Impl& im = *impl_;
  if (size_t bad = utf8_error_offset(text); bad != text.size())
    throw Error(
        fmt::format("tokenizer: input text is not valid UTF-8 (byte {} of {})", bad, text.size()));
  if (text.empty())
    return;
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(
      pcre2_match_data_create_from_pattern(im.regex.get(), nullptr), pcre2_match_data_free);
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // Merged pre-tokens of this call: piece -> (first index in out, count).
  std::unordered_map<std::string_view, std::pair<uint32_t, uint32_t>, ViewHash> cache;
  std::vector<Part> parts;
  size_t pos = 0;
  while (pos < text.size()) {
    int rc = pcre2_match(im.regex.get(), subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md.get(),
                         nullptr);
    if (rc == PCRE2_ERROR_NOMATCH)
      break;
    XSERV_CHECK(rc > 0, fmt::format("pcre2_match failed with code {}", rc));
    size_t s = ov[0], e = ov[1];
    if (e == s) { // the pattern cannot match empty; guard against looping anyway
      ++pos;
      continue;
    }
    pos = e;
    std::string_view piece = text.substr(s, e - s);
    if (uint32_t r = im.rank(piece.data(), piece.size()); r != Impl::kNoRank) {
      out.push_back(r);
      continue;
    }
    if (auto it = cache.find(piece); it != cache.end()) {
      auto [first, count] = it->second;
      for (uint32_t k = 0; k < count; ++k)
        out.push_back(out[first + k]);
      continue;
    }
    size_t first = out.size();
    if (piece.size() > kLongPiece)
      bpe_merge_long(im, piece, out);
    else
      bpe_merge(im, piece, parts, out);
    cache.emplace(piece, std::pair<uint32_t, uint32_t>(static_cast<uint32_t>(first),
                                                       static_cast<uint32_t>(out.size() - first)));
  }
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, const AllowedSpecial& allowed) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 4 + 4);
  if (!allowed.any()) {
    encode_ordinary_into(text, out);
    return out;
  }
  const Impl& im = *impl_;
  size_t start = 0, pos = 0;
  while ((pos = text.find("<|", pos)) != std::string_view::npos) {
    size_t end = text.find("|>", pos + 2);
    if (end == std::string_view::npos)
      break;
    std::string_view name = text.substr(pos, end + 2 - pos);
    if (name.size() <= im.max_special_len) {
      auto it = im.special_ids.find(std::string(name));
      if (it != im.special_ids.end() && allowed.allows(name)) {
        encode_ordinary_into(text.substr(start, pos - start), out);
        out.push_back(it->second);
        start = pos = end + 2;
        continue;
      }
    }
    ++pos; // "<|<|end|>": the special may start inside this candidate
  }
  encode_ordinary_into(text.substr(start), out);
  return out;
}

std::string_view Tokenizer::id_to_token(TokenId id) const {
  if (id >= vocab_size())
    throw Error(fmt::format("tokenizer: token id {} is out of range (vocabulary size {})", id,
                            vocab_size()));
  return impl_->bytes(id);
}

std::string Tokenizer::decode(std::span<const TokenId> ids) const {
  std::string out;
  for (TokenId id : ids)
    out += id_to_token(id);
  return out;
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  if (uint32_t r = impl_->rank(token.data(), token.size()); r != Impl::kNoRank)
    return r;
  if (auto it = impl_->special_ids.find(std::string(token)); it != impl_->special_ids.end())
    return it->second;
  return std::nullopt;
}

TokenId Tokenizer::special_id(std::string_view name) const {
  auto it = impl_->special_ids.find(std::string(name));
  if (it == impl_->special_ids.end())
    throw Error(fmt::format("tokenizer: the vocabulary has no special token {}", name));
  return it->second;
}

size_t Tokenizer::vocab_size() const {
  return impl_->offsets.size() - 1;
}
size_t Tokenizer::num_ordinary() const {
  return impl_->num_ordinary;
}
bool Tokenizer::is_special(TokenId id) const {
  return id >= impl_->num_ordinary && id < vocab_size();
}

std::string StreamDecoder::push(TokenId id) {
  pending_ += tokenizer_.id_to_token(id);
  // Find the start of the last character; hold it back if its bytes are not all here yet.
  size_t n = pending_.size(), cut = n;
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    auto c = static_cast<unsigned char>(pending_[n - back]);
    if ((c & 0xC0) == 0x80)
      continue; // continuation byte: keep looking for the lead byte
    size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (c < 0xF8 && need > back)
      cut = n - back;
    break;
  }
  std::string ready = pending_.substr(0, cut);
  pending_.erase(0, cut);
  return ready;
}

std::string StreamDecoder::flush() {
  std::string rest = std::move(pending_);
  pending_.clear();
  return rest;
}

} // namespace xserv::models
