// libFuzzer target for the tokenizer. The first byte picks what the rest is:
//   0: a tiktoken ranks file, 1: an HF tokenizer.json (both loaded or refused with xserv::Error),
//   2: text: encoded and decoded back to the same bytes (specials recognised or not), or
//      refused as invalid UTF-8,
//   3: ids (4 bytes each): decoded, and streamed through StreamDecoder, or refused as out of
//      range.
// The vocabulary for 2 and 3 is o200k_base ($XSERV_DATA or the shared data directory) when
// present, else a small byte-level one with a few merges and the harmony specials' names.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "models/tokenizer.h"
#include "models/tokenizer_impl.h"

namespace {

using xserv::models::TokenId;
using xserv::models::Tokenizer;

Tokenizer make_vocabulary() {
  namespace fs = std::filesystem;
  std::vector<fs::path> dirs;
  if (const char* d = std::getenv("XSERV_DATA"); d && *d)
    dirs.emplace_back(d);
#ifdef XSERV_DATA_DEFAULT
  dirs.emplace_back(XSERV_DATA_DEFAULT);
#endif
  for (const fs::path& d : dirs)
    if (fs::exists(d / "o200k_base.tiktoken"))
      return Tokenizer::load(d / "o200k_base.tiktoken");
  std::vector<std::string> ordinary;
  for (int b = 0; b < 256; ++b)
    ordinary.emplace_back(1, static_cast<char>(b));
  for (const char* m : {"th", "he", "the", " t", " the", "in", "er", "an", "ing", "  ", "    ",
                        "\n\n", "\xc3\xa9", "\xe2\x80", "\xe2\x80\x99", "12", "123"})
    ordinary.emplace_back(m);
  const auto n = static_cast<TokenId>(ordinary.size());
  return xserv::models::TokenizerBuilder::build(
      std::move(ordinary), {{n, "<|start|>"}, {n + 1, "<|end|>"}, {n + 2, "<|message|>"}}, n + 8,
      "fuzz vocabulary");
}

const Tokenizer& vocabulary() {
  static const Tokenizer t = make_vocabulary();
  return t;
}

void round_trip(std::string_view text, const xserv::models::AllowedSpecial& allowed) {
  std::vector<TokenId> ids;
  try {
    ids = vocabulary().encode(text, allowed);
  } catch (const xserv::Error&) {
    return; // invalid UTF-8
  }
  if (vocabulary().decode(ids) != text)
    std::abort();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0)
    return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    switch (data[0] % 4) {
    case 0:
      (void)Tokenizer::from_tiktoken_text(rest, "fuzz.tiktoken");
      break;
    case 1:
      (void)Tokenizer::from_hf_json_text(rest, "fuzz/tokenizer.json");
      break;
    case 2:
      round_trip(rest, xserv::models::AllowedSpecial::none());
      round_trip(rest, xserv::models::AllowedSpecial::all());
      break;
    default: {
      std::vector<TokenId> ids(rest.size() / 4);
      if (!ids.empty())
        std::memcpy(ids.data(), rest.data(), ids.size() * 4);
      std::string whole;
      try {
        whole = vocabulary().decode(ids);
      } catch (const xserv::Error&) {
        whole.clear(); // an id out of range: the stream must refuse it too
      }
      xserv::models::StreamDecoder stream(vocabulary());
      std::string streamed;
      for (TokenId id : ids)
        streamed += stream.push(id);
      streamed += stream.flush();
      if (streamed != whole) // every byte comes out, only once, in order
        std::abort();
    }
    }
  } catch (const xserv::Error&) {
    // Refused: a bad vocabulary file, an id out of range.
  }
  return 0;
}
