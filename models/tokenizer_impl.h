// Internal state of Tokenizer, shared by the encoder (tokenizer.cpp) and loaders
// (tokenizer_load.cpp).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "models/tokenizer.h"

namespace xserv::models {

/// 64-bit hash for short byte strings (tokens average ~6 bytes): 8-byte words, multiply-mix.
inline uint64_t hash_bytes(const char* p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    h = (h ^ v) * 0xbf58476d1ce4e5b9ull;
    h ^= h >> 31;
    p += 8;
    n -= 8;
  }
  uint64_t v = 0;
  std::memcpy(&v, p, n);
  h = (h ^ v) * 0x94d049bb133111ebull;
  return h ^ (h >> 29);
}

/// The ids of ordinary tokens keyed by their bytes. Open addressing with linear probing over a
/// power-of-two table holding ids; bytes live once in Impl::blob, so lookups never allocate.
struct Tokenizer::Impl {
  static constexpr uint32_t kEmpty = 0xffffffffu;
  static constexpr uint32_t kNoRank = 0xffffffffu;

  std::string blob;                                     // bytes of every id, back to back
  std::vector<uint32_t> offsets;                        // id -> start in blob; size vocab+1
  size_t num_ordinary = 0;                              // ids [0, num_ordinary) are BPE tokens
  std::vector<uint32_t> slots;                          // hash table of ordinary ids
  uint64_t mask = 0;                                    // slots.size() - 1
  std::unordered_map<std::string, TokenId> special_ids; // name -> id (names and aliases)
  size_t max_special_len = 0;
  std::shared_ptr<pcre2_code> regex; // the o200k pre-tokenizer, JIT-compiled

  std::string_view bytes(TokenId id) const {
    return std::string_view(blob.data() + offsets[id], offsets[id + 1] - offsets[id]);
  }

  /// The rank (= id) of an ordinary token with exactly these bytes, or kNoRank.
  uint32_t rank(const char* p, size_t n) const {
    for (uint64_t i = hash_bytes(p, n) & mask;; i = (i + 1) & mask) {
      uint32_t id = slots[i];
      if (id == kEmpty)
        return kNoRank;
      if (offsets[id + 1] - offsets[id] == n && std::memcmp(blob.data() + offsets[id], p, n) == 0)
        return id;
    }
  }
};

/// Builds the immutable Impl from what a loader read; `source` names the file for errors.
struct TokenizerBuilder {
  /// `ordinary[i]` are the bytes of id i; `specials` are (id, name) with ids >= ordinary.size().
  /// Ids in [ordinary.size(), vocab_size) without a special get the name <|reserved_N|>.
  static Tokenizer build(std::vector<std::string> ordinary,
                         std::vector<std::pair<TokenId, std::string>> specials, size_t vocab_size,
                         const std::string& source);
};

} // namespace xserv::models
