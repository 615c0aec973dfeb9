// Loading the o200k_harmony vocabulary from an HF tokenizer.json or a tiktoken ranks file.
#include <array>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "models/json_error.h"
#include "models/tokenizer_impl.h"

namespace xserv::models {
namespace {

// o200k_harmony has 201088 ids; the model's logits cover all of them.
constexpr size_t kHarmonyVocab = 201088;

// o200k_base's ordinary tokens: 199998 ranks, and a digest of their bytes (rank_digest) that
// both tiktoken's o200k_base.tiktoken and gpt-oss's tokenizer.json give. A truncated, edited or
// other vocabulary would tokenize differently without any other sign, so it is refused. The
// digest is FNV-1a 64, which catches accidents and edits; it is no defence against a file
// crafted to collide.
constexpr size_t kO200kRanks = 199998;
constexpr uint64_t kO200kDigest = 0xd987f19f1f0fd7d3ull;

/// FNV-1a 64 over (length, bytes) of every rank in order.
uint64_t rank_digest(const std::vector<std::string>& by_rank) {
  uint64_t h = 0xCBF29CE484222325ull;
  auto feed = [&](unsigned char c) { h = (h ^ c) * 0x100000001B3ull; };
  for (const std::string& r : by_rank) {
    for (int k = 0; k < 4; ++k)
      feed(static_cast<unsigned char>(r.size() >> (8 * k)));
    for (char c : r)
      feed(static_cast<unsigned char>(c));
  }
  return h;
}

/// Throws unless `by_rank` is o200k_base's vocabulary, naming `source`.
void check_o200k(const std::vector<std::string>& by_rank, const std::string& source) {
  if (by_rank.size() != kO200kRanks)
    throw Error(fmt::format("{}: {} ranks, but o200k_base has {}: a truncated or other "
                            "vocabulary, which gpt-oss cannot use",
                            source, by_rank.size(), kO200kRanks));
  if (const uint64_t d = rank_digest(by_rank); d != kO200kDigest)
    throw Error(fmt::format("{}: the ranks' digest is {:016x}, not o200k_base's {:016x}: an edited "
                            "or other vocabulary, which gpt-oss cannot use",
                            source, d, kO200kDigest));
}

// The named harmony specials (MODEL.md); 200018 is <|endofprompt|> as in o200k_base and the HF
// tokenizer.json (it also answers to <|reserved_200018|>).
const std::vector<std::pair<TokenId, std::string>>& harmony_specials() {
  static const std::vector<std::pair<TokenId, std::string>> specials = {
      {199998, "<|startoftext|>"}, {199999, "<|endoftext|>"}, {200002, "<|return|>"},
      {200003, "<|constrain|>"},   {200005, "<|channel|>"},   {200006, "<|start|>"},
      {200007, "<|end|>"},         {200008, "<|message|>"},   {200012, "<|call|>"},
      {200018, "<|endofprompt|>"}};
  return specials;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Error(fmt::format("tokenizer: cannot open {}", path.string()));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool base64_decode(std::string_view in, std::string& out) {
  static const std::array<int8_t, 256> table = [] {
    std::array<int8_t, 256> t{};
    t.fill(-1);
    const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i)
      t[static_cast<unsigned char>(alphabet[i])] = static_cast<int8_t>(i);
    return t;
  }();
  out.clear();
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=')
      break;
    int v = table[static_cast<unsigned char>(c)];
    if (v < 0)
      return false;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  return !out.empty();
}

/// GPT-2's byte-to-unicode table inverted: code point -> byte, -1 where none.
std::array<int, 324> unicode_to_byte() {
  std::array<int, 324> map{};
  map.fill(-1);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    map[printable ? b : 256 + extra++] = b;
  }
  return map;
}

/// Maps one vocab key (UTF-8 of byte-to-unicode code points) back to raw bytes.
bool unmap_bytes(std::string_view key, const std::array<int, 324>& map, std::string& out) {
  out.clear();
  for (size_t i = 0; i < key.size();) {
    auto c = static_cast<unsigned char>(key[i]);
    uint32_t cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < key.size()) {
      cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(key[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return false; // every mapped code point is below U+0800
    }
    if (cp >= map.size() || map[cp] < 0)
      return false;
    out.push_back(static_cast<char>(map[cp]));
  }
  return !out.empty();
}

} // namespace

Tokenizer Tokenizer::from_tiktoken(const std::filesystem::path& path) {
  return from_tiktoken_text(read_file(path), path.string());
}

Tokenizer Tokenizer::from_tiktoken_text(std::string_view text, const std::string& source) {
  std::vector<std::string> by_rank;
  std::string bytes;
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos)
      eol = text.size();
    std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r')
      line.remove_suffix(1);
    if (line.empty())
      continue;
    size_t sp = line.find(' ');
    uint64_t rank = 0;
    bool ok = sp != std::string_view::npos && sp + 1 < line.size() &&
              base64_decode(line.substr(0, sp), bytes);
    for (size_t k = sp + 1; ok && k < line.size(); ++k) {
      ok = line[k] >= '0' && line[k] <= '9' && rank < kHarmonyVocab;
      rank = rank * 10 + static_cast<uint64_t>(line[k] - '0');
    }
    if (!ok || rank >= kHarmonyVocab)
      throw Error(fmt::format("{}:{}: expected \"base64(bytes) rank\"", source, line_no));
    if (rank >= by_rank.size())
      by_rank.resize(rank + 1);
    if (!by_rank[rank].empty())
      throw Error(fmt::format("{}:{}: rank {} appears twice", source, line_no, rank));
    by_rank[rank] = bytes;
  }
  for (size_t r = 0; r < by_rank.size(); ++r)
    if (by_rank[r].empty())
      throw Error(fmt::format("{}: rank {} is missing (ranks must be 0..{})", source, r,
                              by_rank.size() - 1));
  if (by_rank.size() > harmony_specials().front().first)
    throw Error(fmt::format("{}: {} ranks overlap the harmony special ids (from {})", source,
                            by_rank.size(), harmony_specials().front().first));
  check_o200k(by_rank, source);
  return TokenizerBuilder::build(std::move(by_rank), harmony_specials(), kHarmonyVocab, source);
}

Tokenizer Tokenizer::from_hf_json(const std::filesystem::path& path) {
  return from_hf_json_text(read_file(path), path.string());
}

Tokenizer Tokenizer::from_hf_json_text(std::string_view text, const std::string& source) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: not valid JSON: {}", source, json_error_text(e.what())));
  }
  const auto* model = doc.is_object() && doc.contains("model") ? &doc["model"] : nullptr;
  if (!model || !model->is_object() || model->value("type", std::string()) != "BPE" ||
      !model->contains("vocab") || !(*model)["vocab"].is_object())
    throw Error(fmt::format("{}: expected a BPE tokenizer with an object model.vocab", source));
  const auto& vocab = (*model)["vocab"];
  std::vector<std::string> ordinary(vocab.size());
  const auto map = unicode_to_byte();
  std::string bytes;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it->is_number_unsigned() || it->get<uint64_t>() >= ordinary.size())
      throw Error(fmt::format("{}: model.vocab[\"{}\"] must be an id below {} (ids are ranks)",
                              source, it.key(), ordinary.size()));
    size_t id = it->get<size_t>();
    if (!unmap_bytes(it.key(), map, bytes))
      throw Error(fmt::format("{}: model.vocab key \"{}\" is not byte-level (GPT-2 byte map)",
                              source, it.key()));
    if (!ordinary[id].empty())
      throw Error(fmt::format("{}: model.vocab id {} appears twice", source, id));
    ordinary[id] = bytes;
  }
  std::vector<std::pair<TokenId, std::string>> specials;
  if (doc.contains("added_tokens")) {
    const auto& added = doc["added_tokens"];
    if (!added.is_array())
      throw Error(fmt::format("{}: added_tokens must be an array", source));
    for (const auto& t : added) {
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_unsigned() ||
          !t.contains("content") || !t["content"].is_string())
        throw Error(fmt::format("{}: each added_tokens entry needs an id and a content", source));
      auto id = t["id"].get<uint64_t>();
      auto content = t["content"].get<std::string>();
      if (id < ordinary.size()) {
        if (ordinary[id] != content)
          throw Error(fmt::format("{}: added token {} reuses vocab id {}", source, content, id));
        continue;
      }
      if (id >= (uint64_t{1} << 31))
        throw Error(fmt::format("{}: added token {} has an absurd id {}", source, content, id));
      specials.emplace_back(static_cast<TokenId>(id), content);
    }
  }
  check_o200k(ordinary, source);
  return TokenizerBuilder::build(std::move(ordinary), std::move(specials), kHarmonyVocab, source);
}

Tokenizer Tokenizer::load(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  if (fs::is_directory(path)) {
    if (fs::exists(path / "tokenizer.json"))
      return from_hf_json(path / "tokenizer.json");
    if (fs::exists(path / "o200k_base.tiktoken"))
      return from_tiktoken(path / "o200k_base.tiktoken");
    throw Error(fmt::format("tokenizer: {} has neither tokenizer.json nor o200k_base.tiktoken",
                            path.string()));
  }
  if (!fs::exists(path))
    throw Error(fmt::format("tokenizer: {} does not exist", path.string()));
  if (path.extension() == ".json")
    return from_hf_json(path);
  return from_tiktoken(path);
}

} // namespace xserv::models
